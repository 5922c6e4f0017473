//! What a new user ran into in a first hour (issue 52), each held here: escapes in `-p` and
//! `--stop`, `-f -`, `tokenize` without `-m` and with `--show-pieces`, `--out` onto what is not
//! a regular file, the usage line after an error, the notes a plain run prints, the rate of one
//! token, `--ram-budget 0`, `--isa neon` on x86, the default context, a closed pipe, and the
//! server's startup lines, access log, 413 and 429.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn demo() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf").to_string()
}

fn xwen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).env("HF_HUB_OFFLINE", "1").output().unwrap()
}

fn ok(args: &[&str]) -> (String, String) {
    let o = xwen(args);
    let (out, err) = (String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string());
    assert!(o.status.success(), "{args:?}: {err}");
    (out, err)
}

fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(ok(args).0.trim()).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xwen-rough-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `--stop "\n"` as the README writes it is a newline (llama.cpp's `-e`, on by default), and
/// `--no-escape` keeps the backslash.
#[test]
fn escapes_in_prompt_and_stop_are_processed_unless_no_escape() {
    let d = demo();
    let base = ["run", "-m", &d, "-p", "def fibonacci(n):", "-n", "48", "--temp", "0", "--json", "-q"];
    let free = json(&base);
    assert!(free["text"].as_str().unwrap().contains('\n'), "{free}");
    let stopped = json(&[&base[..], &["--stop", "\\n"]].concat());
    assert_eq!(stopped["stop"], "stop_string", "{stopped}");
    assert!(!stopped["text"].as_str().unwrap().contains('\n'), "{stopped}");
    let literal = json(&[&base[..], &["--stop", "\\n", "--no-escape"]].concat());
    assert_eq!(literal["stop"], "length", "{literal}");
    // -p: `\t` is a tab and `\x41` an A, as the real characters give; --no-escape keeps the
    // backslashes (more prompt tokens, another continuation)
    let p = |args: &[&str]| {
        let j = json(&[&["run", "-m", &d, "-n", "6", "--temp", "0", "--json", "-q"], args].concat());
        (j["prompt_tokens"].clone(), j["ids"].clone())
    };
    assert_eq!(p(&["-p", "def f():\\n\\treturn \\x41"]), p(&["-p", "def f():\n\treturn A", "--no-escape"]));
    let (escaped, literal) = (p(&["-p", "x\\n\\n\\n\\n"]), p(&["-p", "x\\n\\n\\n\\n", "--no-escape"]));
    assert!(escaped.0.as_u64() < literal.0.as_u64(), "{escaped:?} {literal:?}");
}

/// `-f -` reads the prompt from standard input.
#[test]
fn a_prompt_file_of_dash_is_standard_input() {
    let d = demo();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xwen"))
        .args(["run", "-m", &d, "-f", "-", "-n", "8", "--temp", "0", "--json", "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"import os\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let want = json(&["run", "-m", &d, "-p", "import os\n", "-n", "8", "--temp", "0", "--json", "-q", "--no-escape"]);
    assert_eq!(got["ids"], want["ids"]);
    assert_eq!(got["prompt_tokens"], want["prompt_tokens"]);
}

/// `xwen tokenize` takes the demo model's tokenizer without `-m`, reads `-f -`, and shows the
/// pieces one a line with `--show-pieces`.
#[test]
fn tokenize_defaults_to_the_demo_model_and_shows_pieces() {
    let d = demo();
    let (with_m, _) = ok(&["tokenize", "-m", &d, "def add(a, b):"]);
    let (without, _) = ok(&["tokenize", "def add(a, b):"]);
    assert_eq!(with_m, without);
    let ids: Vec<&str> = without.split_whitespace().collect();
    assert!(ids.len() > 2, "{without}");
    let (pieces, _) = ok(&["tokenize", "--show-pieces", "def add(a, b):"]);
    let lines: Vec<&str> = pieces.lines().collect();
    assert_eq!(lines.len(), ids.len(), "{pieces}");
    let mut text = String::new();
    for (line, id) in lines.iter().zip(&ids) {
        let (n, piece) = line.split_once(" -> ").unwrap_or_else(|| panic!("{line}"));
        assert_eq!(n.trim(), *id);
        text.push_str(piece.strip_prefix('\'').and_then(|p| p.strip_suffix('\'')).unwrap());
    }
    assert_eq!(text, "def add(a, b):");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xwen")).args(["tokenize", "-f", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"def add(a, b):").unwrap();
    assert_eq!(String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap(), without);
}

/// A reader that has gone before `tokenize` writes: exit 0, quietly, every time (the write's
/// EPIPE, not a SIGPIPE that kills the process in some runs only).
#[cfg(target_os = "linux")]
#[test]
fn tokenize_into_a_closed_pipe_exits_0() {
    use std::os::fd::FromRawFd;
    for _ in 0..3 {
        let mut fds = [0; 2];
        // SAFETY: a fresh pipe; its read end is closed at once, its write end handed to the child.
        let write_end = unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            libc::close(fds[0]);
            std::os::fd::OwnedFd::from_raw_fd(fds[1])
        };
        let o = Command::new(env!("CARGO_BIN_EXE_xwen")).args(["tokenize", "-m", &demo(), "def f(x): return x"]).stdout(Stdio::from(write_end)).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{:?}: {}", o.status, String::from_utf8_lossy(&o.stderr));
        assert!(o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// `--out` of `synth` and `pack` replaces the path with a new file: a symbolic link, a FIFO or
/// a directory there is refused, and left as it was.
#[cfg(unix)]
#[test]
fn out_refuses_what_is_not_a_regular_file() {
    let dir = scratch("out");
    let target = dir.join("precious.txt");
    std::fs::write(&target, b"keep me").unwrap();
    let link = dir.join("link.gguf");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let fifo = dir.join("fifo.gguf");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a path we own, in our scratch folder.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let moe = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/parity/cond/qwen3_5_moe/model-q8_0.gguf");
    for (path, what) in [(&link, "symbolic link"), (&fifo, "not a regular file"), (&dir, "directory")] {
        let p = path.to_str().unwrap();
        for args in [vec!["synth", "--preset", "qwen35-tiny", "--out", p], vec!["pack", moe, "--out", p]] {
            let o = xwen(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
            assert!(err.contains("--out") && err.contains(what), "{args:?}: {err}");
        }
    }
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    // a regular file is still written (replaced)
    let fine = dir.join("fine.gguf");
    std::fs::write(&fine, b"old").unwrap();
    ok(&["synth", "--preset", "qwen35-tiny", "--out", fine.to_str().unwrap()]);
    assert!(std::fs::metadata(&fine).unwrap().len() > 1000);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The usage line after an error is the command's (`xwen run [OPTIONS]`), not the flags given
/// dressed as required ones (`xwen run --model <MODEL>`).
#[test]
fn the_usage_line_after_an_error_does_not_require_what_was_given() {
    let d = demo();
    for args in [vec!["run", "-m", &d, "--bogus"], vec!["run", "-m", &d, "-p", "x", "--ids", "1"]] {
        let o = xwen(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("usage: xwen run [OPTIONS]") && !err.contains("--model <MODEL>"), "{args:?}: {err}");
    }
}

/// A plain run of a GGUF that is no official checkpoint says so only with -v; one generated
/// token has no decode rate (n/a, not 0.0 tok/s); the default context stops at the trained one.
#[test]
fn a_plain_run_prints_what_matters() {
    let d = demo();
    let (_, err) = ok(&["run", "-m", &d, "-p", "x", "-n", "1", "--temp", "0"]);
    assert!(!err.contains("not an official checkpoint"), "{err}");
    assert!(err.contains("decode 1 tok at n/a") && !err.contains("0.0 tok/s"), "{err}");
    let (_, err) = ok(&["run", "-m", &d, "-p", "x", "-n", "1", "--temp", "0", "-v"]);
    assert!(err.contains("not an official checkpoint"), "{err}");
    // tiny-qwen35 was trained on 4096 positions: the default -c stops there; -c goes past it
    assert!(err.contains("context 4096 positions"), "{err}");
    let (_, err) = ok(&["run", "-m", &d, "-p", "x", "-n", "1", "--temp", "0", "-v", "-c", "8192"]);
    assert!(err.contains("context 8192 positions") && err.contains("beyond the 4096 positions"), "{err}");
}

/// `--ram-budget 0` is refused (it used to mean `auto`); `--isa neon` on x86 says what runs.
#[test]
fn a_zero_budget_is_refused_and_a_foreign_isa_is_named() {
    let d = demo();
    let o = xwen(&["run", "-m", &d, "-p", "x", "--ram-budget", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--ram-budget") && err.contains("auto"), "{err}");
    ok(&["run", "-m", &d, "-p", "x", "-n", "1", "--ram-budget", "auto", "-q"]);
    if cfg!(target_arch = "x86_64") {
        let (_, err) = ok(&["run", "-m", &d, "-p", "x", "-n", "1", "--isa", "neon"]);
        assert!(err.contains("--isa neon") && err.contains("no NEON"), "{err}");
    }
}

/// A running `xwen serve` and its stderr, read line by line; killed when dropped.
struct Server {
    child: std::process::Child,
    addr: String,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_xwen"))
            .args(["serve", "--port", "0", "-t", "1", "--chat-template-file"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/templates/Qwen3.5-4B.jinja"))
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let mut s = Server { child, addr: String::new(), lines, seen: Vec::new() };
        let line = s.wait_for("serving on http://");
        s.addr = line.split("http://").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
        s
    }

    /// The first stderr line (seen before or arriving within 60 s) containing `text`.
    fn wait_for(&mut self, text: &str) -> String {
        if let Some(l) = self.seen.iter().find(|l| l.contains(text)) {
            return l.clone();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while let Ok(l) = self.lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            self.seen.push(l.clone());
            if l.contains(text) {
                return l;
            }
        }
        panic!("no stderr line with `{text}`; saw:\n{}", self.seen.join("\n"));
    }

    /// One HTTP/1.1 request; the response's head and as much of its body as comes in `read`.
    fn request(&self, method: &str, path: &str, body: &[u8]) -> String {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        let head = format!("{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).unwrap();
        let _ = s.write_all(body);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The startup lines name the endpoints; `-v` logs each request; a body over `--max-body` gets
/// a 413 that names the limit and the flag.
#[test]
fn serve_lists_its_endpoints_logs_requests_and_names_the_body_limit() {
    let mut s = Server::start(&["--max-body", "1K", "-v"]);
    let endpoints = s.wait_for("endpoints:");
    for e in ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/models", "/health"] {
        assert!(endpoints.contains(e), "{endpoints}");
    }
    let big = format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}", "a".repeat(4000));
    let r = s.request("POST", "/v1/chat/completions", big.as_bytes());
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
    assert!(r.contains("1K") && r.contains("--max-body"), "{r}");
    let line = s.wait_for("POST /v1/chat/completions 413");
    assert!(line.contains("127.0.0.1") && line.contains(" ms"), "{line}");
    let r = s.request("GET", "/health", b"");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    s.wait_for("GET /health 200");
}

/// Without -v, no access log; binding beyond loopback without `--api-key` is warned about.
#[test]
fn serve_warns_of_an_open_port_without_a_key() {
    let mut s = Server::start(&["--host", "0.0.0.0"]);
    let w = s.wait_for("warning:");
    assert!(w.contains("--api-key") && w.contains("0.0.0.0"), "{w}");
    s.addr = s.addr.replace("0.0.0.0", "127.0.0.1");
    let r = s.request("GET", "/health", b"");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    drop(s);
    let mut quiet = Server::start(&["--api-key", "k"]);
    quiet.request("GET", "/health", b"");
    let _ = quiet.child.kill();
    let _ = quiet.child.wait();
    std::thread::sleep(std::time::Duration::from_millis(200));
    while let Ok(l) = quiet.lines.try_recv() {
        quiet.seen.push(l);
    }
    assert!(!quiet.seen.iter().any(|l| l.contains("warning:") || l.contains("GET /health")), "{:?}", quiet.seen);
}

/// A 429 (the queue full) says when to come back: `Retry-After`.
#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let s = Server::start(&["-np", "1", "--queue", "0"]);
    // one long reply holds the only slot while a second request comes
    let body = br#"{"prompt": "def f(", "max_tokens": 4000, "ignore_eos": true, "stream": true}"#;
    let mut first = TcpStream::connect(&s.addr).unwrap();
    let head = format!("POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
    first.write_all(head.as_bytes()).unwrap();
    first.write_all(body).unwrap();
    let mut buf = [0u8; 256];
    let n = first.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    let r = s.request("POST", "/v1/completions", br#"{"prompt": "x", "max_tokens": 2}"#);
    assert!(r.starts_with("HTTP/1.1 429"), "{r}");
    assert!(r.to_ascii_lowercase().contains("\r\nretry-after: "), "{r}");
}
