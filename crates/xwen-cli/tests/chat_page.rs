//! `xwen serve`'s chat page (`GET /`) in headless Chromium (Debian's `chromium` package, or
//! the browser XWEN_CHROMIUM names): the page loads, a message sent from it (`/?q=`) gets a
//! reply streamed from the demo model, the conversation is there when the page is opened again,
//! and a screenshot of it is kept in target/chat-page.png.
//! Without a Chromium cargo lists the browser test as ignored (crates/prereqs.rs); `.ci/run`
//! installs one.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// `xwen serve` on a free port with the demo model; killed when dropped.
struct Server(Child, String);

impl Server {
    fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_xwen"))
            .args(["serve", "--port", "0", "-t", "1", "--chat-template-file"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/templates/Qwen3.5-4B.jinja"))
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let l = lines.next().expect("the server ended before it listened").unwrap();
            if let Some(rest) = l.split("serving on http://").nth(1) {
                break rest.split_whitespace().next().unwrap().to_string();
            }
        };
        std::thread::spawn(move || lines.for_each(drop));
        Server(child, addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The page is one file with no fetch outside this server: no URL of another host in a
/// `src`, `href` or `fetch(`, no `import`.
#[test]
fn the_page_is_served_whole_and_fetches_nothing_from_elsewhere() {
    let s = Server::start();
    let r = get(&s.1, "/");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.to_ascii_lowercase().contains("content-type: text/html"), "{r}");
    let body = r.split("\r\n\r\n").nth(1).unwrap();
    assert!(body.contains("<textarea id=\"input\"") && body.contains("v1/chat/completions"), "{body}");
    for bad in ["src=\"http", "href=\"http", "fetch(\"http", "fetch('http", "import ", "<link rel=\"stylesheet\""] {
        assert!(!body.contains(bad), "the page reaches elsewhere: `{bad}`");
    }
}

fn chromium() -> PathBuf {
    std::env::var_os("XWEN_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

/// Headless Chromium: `args` then the URL; its stdout.
fn browse(profile: &Path, args: &[&str], url: &str) -> String {
    let out = Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage", "--virtual-time-budget=60000"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stderr(Stdio::null())
        .output()
        .expect("running chromium");
    assert!(out.status.success(), "chromium {args:?} {url}: {:?}", out.status);
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
#[cfg_attr(xwen_no_chromium, ignore = "needs Chromium: Debian's chromium package, or XWEN_CHROMIUM (README.md, \"Tests\")")]
fn a_message_from_the_page_gets_a_streamed_reply() {
    let s = Server::start();
    let profile = std::env::temp_dir().join(format!("xwen-chat-page-{}", std::process::id()));
    // greedy and short, so the reply is done before Chromium dumps the page (it does not wait
    // for a stream's end; a slow machine gets two more tries)
    let url = format!("http://{}/?q=def%20fibonacci(n)%3A&max_tokens=24&temperature=0", s.1);
    let mut dom = String::new();
    for attempt in 0..3 {
        let _ = std::fs::remove_dir_all(&profile);
        dom = browse(&profile, &["--dump-dom"], &url);
        if dom.contains("data-done=\"1\"") {
            break;
        }
        eprintln!("attempt {attempt}: the reply was not done when the page was dumped");
    }
    assert!(dom.contains("<h1>xwen</h1>"), "{dom}");
    assert!(dom.contains("class=\"msg user\">def fibonacci(n):</div>"), "{dom}");
    // the reply: finished, not an error, with text from the model and its stats line
    let reply = dom.split("class=\"msg assistant\"").nth(1).unwrap_or_else(|| panic!("no reply in {dom}"));
    assert!(reply.contains("data-done=\"1\""), "{reply}");
    assert!(!dom.contains("msg assistant error"), "{dom}");
    let content = reply.split("<div class=\"content\">").nth(1).unwrap().split("<div class=\"stats\">").next().unwrap();
    assert!(content.len() > "<p></p></div>".len(), "an empty reply: {reply}");
    assert!(reply.contains("tokens, "), "{reply}");
    // the conversation stays in the browser: opened again, the page shows it
    let home = format!("http://{}/", s.1);
    let again = browse(&profile, &["--dump-dom"], &home);
    assert!(again.contains("class=\"msg user\">def fibonacci(n):</div>") && again.contains("tokens, "), "{again}");
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/chat-page.png");
    let _ = std::fs::create_dir_all(shot.parent().unwrap());
    let _ = std::fs::remove_file(&shot);
    browse(&profile, &[&format!("--screenshot={}", shot.display()), "--window-size=900,700"], &home);
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{} bytes", png.len());
    // with thinking on, the reasoning arrives in its own collapsed block (the Qwen3.5 template
    // opens <think>, and the demo model never closes it)
    let _ = std::fs::remove_dir_all(&profile);
    let thinking = browse(&profile, &["--dump-dom"], &format!("http://{}/?q=hello&max_tokens=16&temperature=0&thinking=1", s.1));
    assert!(thinking.contains("<details class=\"reasoning\"><summary>Reasoning</summary><div>"), "{thinking}");
    let _ = std::fs::remove_dir_all(&profile);
}
