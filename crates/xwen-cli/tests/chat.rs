//! `xwen chat` on piped input (and on a pty, for Ctrl-C at the prompt): commands, a line that is
//! not UTF-8, a full context, Ctrl-C and `/exit` leave the chat running (or end it) with a
//! message, never a panic or a lost conversation.

use std::io::Write;
use std::process::{Command, Stdio};

fn chat(input: &[u8], extra: &[&str]) -> (String, String, Option<i32>) {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xwen"))
        .args(["chat", "-m", demo, "--temp", "0", "-t", "1"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    (String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into(), out.status.code())
}

#[test]
fn commands_bad_lines_and_exit() {
    let (out, err, code) = chat(b"def add(a, b):\n/system You write Python.\n/bogus\n\xff\xfe\n/reset\nimport os\n/exit\nnever sent\n", &["-n", "6"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("system prompt set") && err.contains("unknown command `/bogus`"), "{err}");
    assert!(err.contains("not valid UTF-8") && err.contains("conversation cleared"), "{err}");
    // two replies (before and after the reset), then /exit: the last line is never answered
    assert_eq!(err.matches(" tok/s]").count(), 2, "{err}");
    assert!(out.matches("> ").count() >= 6, "{out}");
}

#[test]
fn a_full_context_ends_the_reply_and_says_so() {
    let (_, err, code) = chat(b"def add(a, b):\ndef sub(a, b):\n", &["-n", "64", "-c", "24"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("end of the context") || err.contains("fills the context"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Every turn's state holds exactly the tokens of the rendered transcript: the prompt of turn
/// N + 1 reuses all of turn N's prompt and every reply token but the last (which generation
/// does not feed: it is fed with the next prompt), and computes the rest — with `-v`, chat
/// prints both counts. Replies ending by length and by the end-of-turn token, thinking on and
/// off. The conversation read back with /save renders to the prompt lengths chat reports.
///
/// (A reply is not compared with a fresh run's text: the kernels follow llama.cpp's orders,
/// which differ between a lone decode row and a prefill's rows, so a state built turn by turn
/// rounds differently from one prefilled at once — docs/decisions.md "Chat state and span
/// sizes". The library's Session test holds turns against fresh runs of the same spans.)
#[test]
fn every_turn_holds_exactly_the_transcript() {
    use xwen_chat::{encode_segments, ChatMessage, ChatTemplate, RenderOptions, Tokenizer};
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf");
    let file = xwen_gguf::GgufFile::open(std::path::Path::new(demo)).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let template = ChatTemplate::from_gguf(&file).unwrap().unwrap();
    let dir = std::env::temp_dir().join(format!("xwen-chat-exact-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut stop_ends, mut length_ends) = (0, 0);
    for (think, n) in [(true, "24"), (false, "24"), (true, "200"), (false, "200")] {
        let saved = dir.join(format!("c-{think}-{n}.json"));
        let input = format!("def add(a, b):\nimport sys\nclass Stack:\n/save {}\n", saved.display());
        let mut extra = vec!["-n", n, "-v"];
        if !think {
            extra.push("--no-think");
        }
        let (_, err, code) = chat(input.as_bytes(), &extra);
        assert_eq!(code, Some(0), "{err}");
        // per turn: (prompt tokens, reused, computed, restored) and the reply's token count
        let turns: Vec<(usize, usize, usize, bool)> = err
            .lines()
            .filter_map(|l| l.strip_prefix("xwen: prompt "))
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let computed_at = w.iter().position(|x| *x == "computed").unwrap() - 1;
                (w[0].parse().unwrap(), w[2].parse().unwrap(), w[computed_at].parse().unwrap(), l.contains("restoring"))
            })
            .collect();
        let replies: Vec<usize> = err.lines().filter_map(|l| l.strip_prefix('[')).map(|l| l.split_whitespace().next().unwrap().parse().unwrap()).collect();
        assert_eq!((turns.len(), replies.len()), (3, 3), "{err}");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
        let msgs: Vec<ChatMessage> = v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage {
                role: m["role"].as_str().unwrap().into(),
                content: m["content"].as_str().unwrap().into(),
                reasoning_content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
            })
            .collect();
        assert_eq!(msgs.len(), 6, "three turns: {v}");
        let opts = RenderOptions { add_generation_prompt: true, enable_thinking: think, ..Default::default() };
        for (t, &(prompt, reused, computed, restored)) in turns.iter().enumerate() {
            let ids = encode_segments(&tok, &template.render(&msgs[..2 * t + 1], &opts).unwrap());
            assert_eq!(prompt, ids.len(), "think {think} -n {n} turn {t}: the prompt chat ran is the rendered transcript");
            assert_eq!(reused + computed, prompt, "turn {t}: {err}");
            if t == 0 {
                assert_eq!(reused, 0);
            } else if !restored {
                // the state held the last prompt and every reply token but the last: all reused
                assert_eq!(reused, turns[t - 1].0 + replies[t - 1] - 1, "think {think} -n {n} turn {t}: {err}");
            }
        }
        for (r, m) in replies.iter().zip(msgs.iter().skip(1).step_by(2)) {
            let ended_by_stop = *r < n.parse::<usize>().unwrap();
            if ended_by_stop {
                stop_ends += 1;
            } else {
                length_ends += 1;
            }
            assert!(!m.content.contains("<|im_end|>"), "the stop token is not part of the reply text");
        }
    }
    assert!(stop_ends > 0 && length_ends > 0, "replies ending by stop token {stop_ends}, by length {length_ends}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Ctrl-C while a reply is being written stops that reply; the chat goes on and answers the
/// next line.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_reply_and_keeps_the_chat() {
    use std::io::Read;
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf");
    // greedy, the demo model answers `def add(a, b):` with thousands of tokens and `def main():`
    // with a few hundred
    let mut child = Command::new(env!("CARGO_BIN_EXE_xwen"))
        .args(["chat", "-m", demo, "--temp", "0", "-t", "1", "-n", "3000", "-c", "100000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdin.write_all(b"def add(a, b):\n").unwrap();
    stdin.flush().unwrap();
    // wait for the reply to be under way
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while seen.len() < 200 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "the chat ended before the reply: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    stdin.write_all(b"def main():\n/exit\n").unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("reply stopped (Ctrl-C)"), "{err}");
    // both lines were answered: two replies' rate lines
    assert_eq!(err.matches(" tok/s]").count(), 2, "{err}");
}

/// Ctrl-C at the prompt, on a terminal (a pty here), drops the half-typed message and prompts
/// again; the chat goes on, and Ctrl-D (end of input) leaves it with exit 0.
#[cfg(target_os = "linux")]
#[test]
fn ctrl_c_at_the_prompt_clears_the_line_and_keeps_the_chat() {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf");
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two descriptors we own from here on.
    unsafe {
        assert_eq!(libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()), 0);
    }
    // SAFETY: each dup is a new descriptor handed to the child as one of its standard streams.
    let end = || unsafe { Stdio::from(OwnedFd::from_raw_fd(libc::dup(slave))) };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xwen"));
    cmd.args(["chat", "-m", demo, "--temp", "0", "-t", "1", "-n", "8"]).stdin(end()).stdout(end()).stderr(end());
    // SAFETY: between fork and exec, only async-signal-safe calls: a new session whose
    // controlling terminal is the pty, so the terminal's Ctrl-C reaches the chat as SIGINT.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            libc::ioctl(0, libc::TIOCSCTTY, 0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    // SAFETY: the parent's copies: the slave closed, the master kept as one file.
    let mut term = unsafe {
        libc::close(slave);
        std::fs::File::from_raw_fd(master)
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut reader = term.try_clone().unwrap();
    let s = seen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            s.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let wait_for = |count: usize, what: &str| {
        let t0 = Instant::now();
        while String::from_utf8_lossy(&seen.lock().unwrap()).matches(what).count() < count {
            assert!(t0.elapsed() < Duration::from_secs(60), "no {count}× `{what}` in: {}", String::from_utf8_lossy(&seen.lock().unwrap()));
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(1, "> ");
    // a message half typed, then Ctrl-C: the chat is still there and prompts again
    term.write_all(b"def half_typed").unwrap();
    wait_for(1, "half_typed");
    term.write_all(b"\x03").unwrap();
    wait_for(2, "> ");
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.try_wait().unwrap().is_none(), "the chat ended at Ctrl-C: {}", String::from_utf8_lossy(&seen.lock().unwrap()));
    // the next message is answered, and only it (a reply's rate line, no error)
    term.write_all(b"def add(a, b):\n").unwrap();
    wait_for(3, "> ");
    term.write_all(b"\x04").unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "Ctrl-D did not end the chat");
        std::thread::sleep(Duration::from_millis(20));
    };
    let all = String::from_utf8_lossy(&seen.lock().unwrap()).to_string();
    assert_eq!(status.code(), Some(0), "{all}");
    assert_eq!(all.matches(" tok, ").count(), 1, "one reply, to the message after Ctrl-C: {all}");
}
