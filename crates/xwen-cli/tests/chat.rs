//! `xwen chat` on piped input: commands, a line that is not UTF-8, a full context and `/exit`
//! leave the chat running (or end it) with a message, never a panic or a lost conversation.

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

/// Turn N's reply equals a fresh greedy `xwen run` of the transcript rendered up to it: the
/// chat's state holds exactly the transcript's tokens (the last token of every reply included),
/// for replies that end by length and by the end-of-turn token, thinking on and off. The
/// conversation is read back with /save. Both sides run the scalar reference kernels, whose
/// rows do not depend on how many share a forward step: the SIMD kernels follow llama.cpp's
/// orders, which differ between a lone decode row and a prefill's row groups, so a state built
/// turn by turn and a fresh prefill may round differently and flip a greedy near-tie — as in
/// llama.cpp (docs/decisions.md "Chat state and span sizes").
#[test]
fn every_turn_equals_a_fresh_run_of_the_transcript() {
    use xwen_chat::{encode_segments, ChatMessage, ChatTemplate, RenderOptions, Tokenizer};
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf");
    let file = xwen_gguf::GgufFile::open(std::path::Path::new(demo)).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let template = ChatTemplate::from_gguf(&file).unwrap().unwrap();
    let dir = std::env::temp_dir().join(format!("xwen-chat-exact-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut stop_ends = 0;
    let mut length_ends = 0;
    for (think, n) in [(true, "24"), (false, "24"), (true, "200"), (false, "200")] {
        let saved = dir.join(format!("c-{think}-{n}.json"));
        let input = format!("def add(a, b):\nimport sys\nclass Stack:\n/save {}\n", saved.display());
        let mut extra = vec!["-n", n, "--reference-kernels"];
        if !think {
            extra.push("--no-think");
        }
        let (_, err, code) = chat(input.as_bytes(), &extra);
        assert_eq!(code, Some(0), "{err}");
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
        for turn in 0..3 {
            let ids = encode_segments(&tok, &template.render(&msgs[..2 * turn + 1], &opts).unwrap());
            let ids_arg = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let out = Command::new(env!("CARGO_BIN_EXE_xwen"))
                .args(["run", "-m", demo, "--ids", &ids_arg, "-n", n, "--temp", "0", "-t", "1", "--json", "-q", "--reference-kernels"])
                .args(if think { &[][..] } else { &["--no-think"][..] })
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let fresh: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let want = fresh["text"].as_str().unwrap();
            assert_eq!(msgs[2 * turn + 1].content, want, "think {think}, -n {n}, turn {turn}: the chat's reply differs from a fresh run");
            match fresh["stop"].as_str() {
                Some("eos") => stop_ends += 1,
                Some("length") => length_ends += 1,
                other => panic!("stop {other:?}"),
            }
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
