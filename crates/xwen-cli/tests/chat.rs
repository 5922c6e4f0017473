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
