//! `xwen pull` against a mock Hugging Face hub on 127.0.0.1 (this machine cannot reach the
//! real one): cold download into the HF cache layout, cache hits with the server gone, resume
//! after a dropped connection and from an earlier run's partial file, a server that ignores
//! Range, sha256 mismatch, 404/401 messages, and the offline advice.
//!
//! The mock speaks what huggingface_hub relies on: HEAD/GET `/{repo}/resolve/main/{file}` with
//! X-Repo-Commit and X-Linked-Etag/X-Linked-Size on a 302 to `/blob/...` (as the real hub
//! redirects to its CDN), Range → 206, X-Error-Code on refusals, and `/api/models/{repo}`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf");

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

fn demo_bytes() -> Vec<u8> {
    std::fs::read(DEMO).expect("models/demo/tiny-qwen35-q4_k_m.gguf is part of the repo")
}

struct Served {
    data: Vec<u8>,
    /// What the hub claims the blob is: its sha256, or a lie for the mismatch test.
    etag: String,
}

#[derive(Default)]
struct State {
    files: BTreeMap<String, Served>, // "owner/name/file"
    redirect: bool,
    ignore_range: bool,
    /// Cut this many body responses short, after `drop_after` bytes each.
    drops_left: u32,
    drop_after: usize,
    /// Repos answering 401 GatedRepo unless the request carries this token.
    gated: Option<(String, String)>,
    log: Vec<String>,
}

struct MockHub {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MockHub {
    fn start(state: State) -> MockHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(state));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(c) = conn {
                    let _ = handle(c, addr, &st);
                }
            }
        });
        MockHub {
            addr,
            state,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }

    /// Closes the port: any later request is refused.
    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for MockHub {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn handle(mut c: TcpStream, addr: SocketAddr, state: &Mutex<State>) -> std::io::Result<()> {
    let mut r = BufReader::new(c.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let range = headers.get("range").cloned();
    let mut st = state.lock().unwrap();
    st.log
        .push(format!("{method} {path} range={}", range.as_deref().unwrap_or("-")));
    let head = method == "HEAD";

    if let Some(repo) = path.strip_prefix("/api/models/") {
        let prefix = format!("{repo}/");
        let names: Vec<String> = st
            .files
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .map(|f| format!("{{\"rfilename\":\"{f}\"}}"))
            .collect();
        if names.is_empty() {
            return respond(
                &mut c,
                "404 Not Found",
                &[("X-Error-Code", "RepoNotFound".into())],
                b"",
                head,
            );
        }
        let body = format!("{{\"id\":\"{repo}\",\"siblings\":[{}]}}", names.join(","));
        return respond(
            &mut c,
            "200 OK",
            &[("Content-Type", "application/json".into())],
            body.as_bytes(),
            head,
        );
    }
    let (key, from_hub) = if let Some(k) = path.strip_prefix("/blob/") {
        (k.to_string(), false)
    } else if let Some((repo, file)) = path.trim_start_matches('/').split_once("/resolve/main/") {
        (format!("{repo}/{file}"), true)
    } else {
        return respond(&mut c, "404 Not Found", &[], b"", head);
    };
    if let Some((repo, token)) = &st.gated {
        let authorized = headers.get("authorization") == Some(&format!("Bearer {token}"));
        if key.starts_with(&format!("{repo}/")) && !authorized {
            return respond(
                &mut c,
                "401 Unauthorized",
                &[("X-Error-Code", "GatedRepo".into())],
                b"",
                head,
            );
        }
    }
    let Some(f) = st.files.get(&key) else {
        let repo: String = key.splitn(3, '/').take(2).collect::<Vec<_>>().join("/");
        let repo_known = st.files.keys().any(|k| k.starts_with(&format!("{repo}/")));
        let code = if repo_known { "EntryNotFound" } else { "RepoNotFound" };
        return respond(&mut c, "404 Not Found", &[("X-Error-Code", code.into())], b"", head);
    };
    let len = f.data.len();
    let etag = format!("\"{}\"", f.etag);
    if from_hub && st.redirect {
        let loc = format!("http://{addr}/blob/{key}");
        let hdrs = [
            ("Location", loc),
            ("X-Repo-Commit", COMMIT.into()),
            ("X-Linked-Etag", etag),
            ("X-Linked-Size", len.to_string()),
            ("ETag", "\"pointer-file-git-sha\"".into()),
        ];
        return respond(&mut c, "302 Found", &hdrs, b"", head);
    }
    let mut hdrs: Vec<(&str, String)> = Vec::new();
    if from_hub {
        hdrs.push(("X-Repo-Commit", COMMIT.into()));
        hdrs.push(("ETag", etag));
    }
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok())
        .filter(|_| !st.ignore_range && !head);
    let (status, body) = match start {
        Some(s) if s >= len => {
            hdrs.push(("Content-Range", format!("bytes */{len}")));
            ("416 Range Not Satisfiable", &f.data[..0])
        }
        Some(s) => {
            hdrs.push(("Content-Range", format!("bytes {s}-{}/{len}", len - 1)));
            ("206 Partial Content", &f.data[s..])
        }
        None => ("200 OK", &f.data[..]),
    };
    let body = body.to_vec();
    if !head && st.drops_left > 0 {
        st.drops_left -= 1;
        let cut = st.drop_after.min(body.len());
        drop(st);
        write_head(&mut c, status, &hdrs, body.len())?;
        c.write_all(&body[..cut])?;
        c.flush()?;
        return c.shutdown(Shutdown::Both);
    }
    drop(st);
    respond(&mut c, status, &hdrs, &body, head)
}

fn write_head(c: &mut TcpStream, status: &str, hdrs: &[(&str, String)], len: usize) -> std::io::Result<()> {
    let mut s = format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\nConnection: close\r\n");
    for (k, v) in hdrs {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    s.push_str("\r\n");
    c.write_all(s.as_bytes())
}

fn respond(c: &mut TcpStream, status: &str, hdrs: &[(&str, String)], body: &[u8], head: bool) -> std::io::Result<()> {
    write_head(c, status, hdrs, body.len())?;
    if !head {
        c.write_all(body)?;
    }
    c.flush()?;
    c.shutdown(Shutdown::Both)
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "xwen-hub-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn xwen(args: &[&str], cache: &Path, endpoint: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xwen"));
    cmd.args(args).env("HF_HUB_CACHE", cache).env("HF_ENDPOINT", endpoint);
    for v in [
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "HF_HOME",
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ] {
        cmd.env_remove(v);
    }
    // Isolate from a `huggingface-cli login` token on this machine.
    cmd.env("HF_TOKEN_PATH", cache.join("no-token-here"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn pull(model: &str, cache: &Path, endpoint: &str) -> Output {
    xwen(&["pull", model], cache, endpoint, &[])
}

fn ok_path(out: &Output) -> PathBuf {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "xwen pull failed: {err}");
    PathBuf::from(String::from_utf8(out.stdout.clone()).unwrap().trim())
}

fn stderr(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected failure, got stdout {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn one_file(repo_file: &str, data: Vec<u8>) -> State {
    let etag = sha256_hex(&data);
    let mut st = State {
        redirect: true,
        ..State::default()
    };
    st.files.insert(repo_file.into(), Served { data, etag });
    st
}

const OFFICIAL_KEY: &str = "ggml-org/Qwen3.6-35B-A3B-GGUF/Qwen3.6-35B-A3B-Q4_K_M.gguf";
const OFFICIAL_REPO_DIR: &str = "models--ggml-org--Qwen3.6-35B-A3B-GGUF";

#[test]
fn cold_download_lays_out_hf_cache_then_hits_without_network() {
    let data = demo_bytes();
    let sha = sha256_hex(&data);
    let mut hub = MockHub::start(one_file(OFFICIAL_KEY, data.clone()));
    let tmp = TempDir::new("cold");
    let path = ok_path(&pull("Qwen3.6-35B-A3B", &tmp.0, &hub.url()));

    let repo = tmp.0.join(OFFICIAL_REPO_DIR);
    assert_eq!(
        path,
        repo.join("snapshots").join(COMMIT).join("Qwen3.6-35B-A3B-Q4_K_M.gguf")
    );
    assert_eq!(std::fs::read(&path).unwrap(), data);
    #[cfg(unix)]
    assert_eq!(
        std::fs::read_link(&path).unwrap(),
        PathBuf::from(format!("../../blobs/{sha}"))
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT,
        "refs/main: the commit, no newline"
    );
    assert!(repo.join("blobs").join(&sha).is_file());
    assert!(!repo.join("blobs").join(format!("{sha}.incomplete")).exists());
    let log = hub.log();
    assert!(
        log.iter()
            .any(|l| l.starts_with("HEAD /ggml-org/Qwen3.6-35B-A3B-GGUF/resolve/main/")),
        "{log:?}"
    );
    assert!(log.iter().any(|l| l.starts_with("GET /blob/")), "{log:?}");

    // The symlinked snapshot opens as the GGUF it is.
    let inspect = xwen(&["inspect", path.to_str().unwrap(), "--json"], &tmp.0, &hub.url(), &[]);
    assert!(inspect.status.success(), "{}", String::from_utf8_lossy(&inspect.stderr));
    assert!(String::from_utf8_lossy(&inspect.stdout).contains("\"architecture\""));

    // The port is closed now: a second resolve must come from the cache alone.
    hub.shutdown();
    assert_eq!(ok_path(&pull("Qwen3.6-35B-A3B", &tmp.0, &hub.url())), path);
    assert_eq!(
        ok_path(&xwen(
            &["pull", "Qwen3.6-35B-A3B"],
            &tmp.0,
            &hub.url(),
            &[("HF_HUB_OFFLINE", "1")]
        )),
        path
    );
}

#[test]
fn quant_names_pick_the_single_matching_file() {
    let data = demo_bytes();
    let mut st = one_file("acme/tiny-GGUF/tiny-Q4_K_M.gguf", data.clone());
    let q8 = data[..1000].to_vec();
    for (f, d) in [
        ("tiny-Q8_0.gguf", q8.clone()),
        ("mmproj-tiny-Q8_0.gguf", vec![7; 10]),
        ("README.md", vec![b'x']),
    ] {
        st.files.insert(
            format!("acme/tiny-GGUF/{f}"),
            Served {
                etag: sha256_hex(&d),
                data: d,
            },
        );
    }
    st.files.insert(
        "acme/two/a-Q8_0.gguf".into(),
        Served {
            data: vec![1],
            etag: sha256_hex(&[1]),
        },
    );
    st.files.insert(
        "acme/two/b-Q8_0.gguf".into(),
        Served {
            data: vec![2],
            etag: sha256_hex(&[2]),
        },
    );
    let mut hub = MockHub::start(st);
    let tmp = TempDir::new("quant");

    let p = ok_path(&pull("acme/tiny-GGUF", &tmp.0, &hub.url()));
    assert!(p.ends_with("tiny-Q4_K_M.gguf"), "{p:?}");
    assert_eq!(std::fs::read(&p).unwrap(), data);
    let p8 = ok_path(&pull("acme/tiny-GGUF:Q8_0", &tmp.0, &hub.url()));
    assert!(
        p8.ends_with("tiny-Q8_0.gguf"),
        "the mmproj sidecar must not be picked: {p8:?}"
    );
    assert_eq!(std::fs::read(&p8).unwrap(), q8);
    let e = stderr(&pull("acme/two:Q8_0", &tmp.0, &hub.url()));
    assert!(
        e.contains("a-Q8_0.gguf") && e.contains("b-Q8_0.gguf") && e.contains("several"),
        "{e}"
    );
    let e = stderr(&pull("acme/tiny-GGUF:IQ2_XS", &tmp.0, &hub.url()));
    assert!(e.contains("no single `*-IQ2_XS.gguf`"), "{e}");

    // Cached quants resolve from the snapshot folder with the hub gone.
    hub.shutdown();
    assert_eq!(ok_path(&pull("acme/tiny-GGUF:q8_0", &tmp.0, &hub.url())), p8);
}

#[test]
fn resumes_after_a_dropped_connection() {
    let data = demo_bytes();
    let half = data.len() / 2;
    let mut st = one_file("acme/r/m.gguf", data.clone());
    st.drops_left = 1;
    st.drop_after = half;
    let hub = MockHub::start(st);
    let tmp = TempDir::new("drop");
    let p = ok_path(&pull("acme/r:m.gguf", &tmp.0, &hub.url()));
    assert_eq!(std::fs::read(&p).unwrap(), data);
    let log = hub.log();
    let gets: Vec<_> = log.iter().filter(|l| l.starts_with("GET /blob/")).collect();
    assert_eq!(gets.len(), 2, "{log:?}");
    assert!(gets[1].ends_with(&format!("range=bytes={half}-")), "{log:?}");
}

#[test]
fn resumes_an_earlier_runs_partial_file() {
    let data = demo_bytes();
    let sha = sha256_hex(&data);
    let k = 123_457;
    let hub = MockHub::start(one_file("acme/r/m.gguf", data.clone()));
    let tmp = TempDir::new("partial");
    let blobs = tmp.0.join("models--acme--r/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{sha}.incomplete")), &data[..k]).unwrap();
    let p = ok_path(&pull("acme/r:m.gguf", &tmp.0, &hub.url()));
    assert_eq!(std::fs::read(&p).unwrap(), data);
    let log = hub.log();
    assert!(
        log.iter()
            .any(|l| l.starts_with("GET /blob/") && l.ends_with(&format!("range=bytes={k}-"))),
        "{log:?}"
    );
    assert!(
        !log.iter()
            .any(|l| l.starts_with("GET /blob/") && l.ends_with("range=-")),
        "no full restart: {log:?}"
    );
}

#[test]
fn restarts_when_the_server_ignores_range() {
    let data = demo_bytes();
    let sha = sha256_hex(&data);
    let mut st = one_file("acme/r/m.gguf", data.clone());
    st.ignore_range = true;
    let hub = MockHub::start(st);
    let tmp = TempDir::new("norange");
    let blobs = tmp.0.join("models--acme--r/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    // Wrong bytes in the partial file: kept, they would fail the sha256 check.
    std::fs::write(blobs.join(format!("{sha}.incomplete")), vec![0xAB; 5000]).unwrap();
    let out = pull("acme/r:m.gguf", &tmp.0, &hub.url());
    let p = ok_path(&out);
    assert_eq!(std::fs::read(&p).unwrap(), data);
    assert!(String::from_utf8_lossy(&out.stderr).contains("ignored the Range"));
}

#[test]
fn a_transfer_that_keeps_dying_is_a_clear_error_and_keeps_the_partial() {
    let data = demo_bytes();
    let sha = sha256_hex(&data);
    let mut st = one_file("acme/r/m.gguf", data.clone());
    st.drops_left = 1000;
    st.drop_after = 0;
    let hub = MockHub::start(st);
    let tmp = TempDir::new("trunc");
    let e = stderr(&pull("acme/r:m.gguf", &tmp.0, &hub.url()));
    assert!(e.contains("truncated") && e.contains("run again to resume"), "{e}");
    assert!(tmp.0.join(format!("models--acme--r/blobs/{sha}.incomplete")).exists());
    assert!(!tmp.0.join("models--acme--r/snapshots").exists());
}

#[test]
fn sha256_mismatch_fails_loudly_and_drops_only_the_bad_partial() {
    let data = demo_bytes();
    let claimed = sha256_hex(b"some other file");
    let mut st = State {
        redirect: true,
        ..State::default()
    };
    st.files.insert(
        "acme/r/m.gguf".into(),
        Served {
            data,
            etag: claimed.clone(),
        },
    );
    let hub = MockHub::start(st);
    let tmp = TempDir::new("sha");
    let e = stderr(&pull("acme/r:m.gguf", &tmp.0, &hub.url()));
    assert!(e.contains("sha256 mismatch") && e.contains(&claimed), "{e}");
    let blobs = tmp.0.join("models--acme--r/blobs");
    assert!(blobs.is_dir(), "the cache folders stay");
    assert_eq!(std::fs::read_dir(&blobs).unwrap().count(), 0, "no blob, no partial");
    assert!(!tmp.0.join("models--acme--r/snapshots").exists());
    assert!(!tmp.0.join("models--acme--r/refs").exists());
}

#[test]
fn not_found_and_gated_messages() {
    let data = demo_bytes();
    let mut st = one_file("acme/r/m.gguf", data.clone());
    st.files.insert(
        "acme/gated/m.gguf".into(),
        Served {
            etag: sha256_hex(&data),
            data: data.clone(),
        },
    );
    st.gated = Some(("acme/gated".into(), "hf_secret".into()));
    let hub = MockHub::start(st);
    let tmp = TempDir::new("404");
    let e = stderr(&pull("acme/r:nope.gguf", &tmp.0, &hub.url()));
    assert!(e.contains("acme/r has no file `nope.gguf`") && e.contains("404"), "{e}");
    let e = stderr(&pull("acme/missing:m.gguf", &tmp.0, &hub.url()));
    assert!(e.contains("no such repo: acme/missing"), "{e}");
    let e = stderr(&pull("acme/missing", &tmp.0, &hub.url()));
    assert!(e.contains("no such repo: acme/missing"), "{e}");
    let e = stderr(&pull("acme/gated:m.gguf", &tmp.0, &hub.url()));
    assert!(e.contains("gated") && e.contains("HF_TOKEN"), "{e}");
    let out = xwen(
        &["pull", "acme/gated:m.gguf"],
        &tmp.0,
        &hub.url(),
        &[("HF_TOKEN", "hf_secret")],
    );
    assert_eq!(std::fs::read(ok_path(&out)).unwrap(), data);
}

#[test]
fn offline_and_uncached_says_what_to_fetch_and_where() {
    let data = demo_bytes();
    let mut hub = MockHub::start(one_file(OFFICIAL_KEY, data.clone()));
    let endpoint = hub.url();
    let tmp = TempDir::new("offline");
    let url = format!("{endpoint}/ggml-org/Qwen3.6-35B-A3B-GGUF/resolve/main/Qwen3.6-35B-A3B-Q4_K_M.gguf");
    let place = tmp
        .0
        .join(OFFICIAL_REPO_DIR)
        .join("snapshots/main/Qwen3.6-35B-A3B-Q4_K_M.gguf");

    let out = xwen(
        &["pull", "Qwen3.6-35B-A3B"],
        &tmp.0,
        &endpoint,
        &[("HF_HUB_OFFLINE", "1")],
    );
    let e = stderr(&out);
    assert!(
        e.contains(&url) && e.contains(&place.display().to_string()) && e.contains("HF_HUB_OFFLINE"),
        "{e}"
    );
    assert!(
        hub.log().is_empty(),
        "offline must not touch the network: {:?}",
        hub.log()
    );

    // Unreachable reads the same, with the cause.
    hub.shutdown();
    let e = stderr(&pull("Qwen3.6-35B-A3B", &tmp.0, &endpoint));
    assert!(
        e.contains(&url) && e.contains(&place.display().to_string()) && e.contains("unreachable"),
        "{e}"
    );

    // And the advice works: a file put exactly there resolves, offline.
    std::fs::create_dir_all(place.parent().unwrap()).unwrap();
    std::fs::write(&place, &data).unwrap();
    let out = xwen(
        &["pull", "Qwen3.6-35B-A3B"],
        &tmp.0,
        &endpoint,
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert_eq!(ok_path(&out), place);
}

#[test]
fn exact_full_names_only() {
    let tmp = TempDir::new("names");
    let out = xwen(
        &["pull", "qwen3.6-35b-a3b"],
        &tmp.0,
        "http://127.0.0.1:9",
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert!(stderr(&out).contains("did you mean `Qwen3.6-35B-A3B`"));
}

#[test]
fn plain_files_without_redirect_are_named_by_their_git_etag() {
    // The hub answers non-LFS files directly (200, ETag = git blob sha1): no sha256 to check.
    let data = b"{\"architectures\": [\"Qwen3_5ForCausalLM\"]}".to_vec();
    let git_sha = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c";
    let mut st = State::default();
    st.files.insert(
        "acme/r/config.gguf".into(),
        Served {
            data: data.clone(),
            etag: git_sha.into(),
        },
    );
    let hub = MockHub::start(st);
    let tmp = TempDir::new("plain");
    let p = ok_path(&pull("acme/r:config.gguf", &tmp.0, &hub.url()));
    assert_eq!(std::fs::read(&p).unwrap(), data);
    assert!(tmp.0.join("models--acme--r/blobs").join(git_sha).is_file());
    assert!(!hub.log().iter().any(|l| l.contains("/blob/")), "{:?}", hub.log());
}

#[test]
fn a_download_in_progress_elsewhere_is_not_joined() {
    let data = demo_bytes();
    let sha = sha256_hex(&data);
    let hub = MockHub::start(one_file("acme/r/m.gguf", data));
    let tmp = TempDir::new("lock");
    let blobs = tmp.0.join("models--acme--r/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let partial = std::fs::File::create(blobs.join(format!("{sha}.incomplete"))).unwrap();
    partial.try_lock().expect("this filesystem locks files");
    let e = stderr(&pull("acme/r:m.gguf", &tmp.0, &hub.url()));
    assert!(e.contains("another process is downloading m.gguf"), "{e}");
    drop(partial);
    ok_path(&pull("acme/r:m.gguf", &tmp.0, &hub.url()));
}
