//! Input that once panicked the CLI ends with a clear message or quietly, never a
//! panic: an argument that is not UTF-8, a reader that closes the pipe early, a thread count
//! no machine has (capped, with a note).

use std::io::Read;
use std::process::{Command, Stdio};

fn xwen() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xwen"))
}

fn demo() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf").to_string()
}

#[cfg(unix)]
#[test]
fn a_non_utf8_argument_is_named_not_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"def \xff");
    let out = xwen().args(["run", "-n", "2", "-p"]).arg(bad).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not valid UTF-8") && !err.contains("panicked"), "{err}");
}

/// The reader takes a few bytes and closes its end: the process ends by SIGPIPE (or an error
/// exit), never with a panic message.
#[cfg(unix)]
#[test]
fn a_closed_output_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    for args in [vec!["inspect".to_string(), demo(), "--json".into()], vec!["--help".into()], vec!["run".into(), "-n".into(), "400".into(), "--temp".into(), "0".into()]] {
        let mut child = xwen().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut head = [0u8; 8];
        let mut stdout = child.stdout.take().unwrap();
        stdout.read_exact(&mut head).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.status.signal() == Some(libc::SIGPIPE) || out.status.success(), "{args:?}: {:?} {err}", out.status);
    }
}

#[test]
fn an_absurd_thread_count_is_capped_with_a_note() {
    let out = xwen().args(["run", "-m", &demo(), "-t", "50000", "-n", "2", "-p", "def f("]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("-t 50000: this machine has") && !err.contains("panicked"), "{err}");
}
