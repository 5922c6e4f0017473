//! Fetching one file of a Hugging Face repo into the hub cache, laid out exactly as
//! huggingface_hub lays it out so that its users, llama.cpp's and ours share one copy:
//!
//! ```text
//! models--{owner}--{name}/blobs/{etag}                      the bytes (sha256 for LFS files)
//! models--{owner}--{name}/blobs/{etag}.incomplete           a download in progress (resumable)
//! models--{owner}--{name}/snapshots/{commit}/{file}         → ../../blobs/{etag} (relative symlink)
//! models--{owner}--{name}/refs/main                         {commit}, no trailing newline
//! ```
//!
//! The protocol is huggingface_hub's: HEAD `{endpoint}/{repo}/resolve/main/{file}` without
//! following absolute redirects, because the hub puts `X-Repo-Commit`, `X-Linked-Etag` and
//! `X-Linked-Size` on its 302 to the CDN and the CDN's answer carries none of them; then GET the
//! redirect target with `Range` to resume.
//!
//! Progress goes to stderr (download/progress.rs).

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;
use ureq::http::Response;
use ureq::Body;

mod progress;

use progress::{human_bytes, Progress};

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Transport failures in a row, with no byte gained, before a download gives up.
const MAX_STALLED_ATTEMPTS: u32 = 4;
const MAX_REDIRECTS: usize = 10;

/// The hub could not be reached at all (offline, DNS, refused, TLS). Callers turn it into
/// "fetch this URL and put it there" advice instead of a bare network error.
#[derive(Debug)]
pub struct Unreachable {
    pub url: String,
    pub cause: String,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.url, self.cause)
    }
}
impl std::error::Error for Unreachable {}

pub fn is_unreachable(e: &anyhow::Error) -> Option<&Unreachable> {
    e.downcast_ref::<Unreachable>()
}

pub struct Hub {
    agent: ureq::Agent,
    pub endpoint: String,
    token: Option<String>,
}

/// What the hub says about one file before any byte of it moves.
#[derive(Debug)]
struct FileMeta {
    commit: String,
    etag: String,
    size: Option<u64>,
    /// Where the bytes are: the CDN for LFS files, the resolve URL itself otherwise.
    location: String,
}

impl Hub {
    pub fn from_env() -> Hub {
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = token();
        let agent = ureq::Agent::config_builder()
            // Statuses and redirects are ours to interpret: the metadata lives on the 302.
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // A stalled CDN connection must fail (and resume) rather than hang forever.
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("xwen/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Hub {
            agent,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
        }
    }

    pub fn file_url(&self, repo: &str, file: &str) -> String {
        format!("{}/{repo}/resolve/main/{}", self.endpoint, encode_path(file))
    }

    pub fn api_url(&self, repo: &str) -> String {
        format!("{}/api/models/{repo}", self.endpoint)
    }

    /// Every file name in `repo` at main (`siblings[].rfilename` of the model API).
    pub fn list_files(&self, repo: &str) -> Result<Vec<String>> {
        let url = self.api_url(repo);
        let mut resp = self.follow(&url, Method::Get, None, true)?;
        check_status(&resp, repo, None, &url, self.token.is_some())?;
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| anyhow!("reading {url}: {e}"))?;
        let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{url}: not JSON"))?;
        let siblings = v["siblings"]
            .as_array()
            .ok_or_else(|| anyhow!("{url}: no `siblings` file list in the answer"))?;
        Ok(siblings
            .iter()
            .filter_map(|s| s["rfilename"].as_str().map(str::to_string))
            .collect())
    }

    /// `file` of `repo` at main, downloaded into the cache folder `repo_dir` of that repo
    /// (`hub::repo_dir`: the cache layout is the hub's) unless its blob is already there.
    /// Returns the snapshot path.
    pub fn download(&self, repo_dir: &Path, repo: &str, file: &str) -> Result<PathBuf> {
        let url = self.file_url(repo, file);
        let meta = self.metadata(repo, file, &url)?;
        let blobs = repo_dir.join("blobs");
        fs::create_dir_all(&blobs).with_context(|| format!("creating {}", blobs.display()))?;
        let blob = blobs.join(&meta.etag);
        if blob.is_file() {
            // Shared with an earlier revision (or a huggingface_hub download): no bytes to move.
            let have = fs::metadata(&blob)?.len();
            if let Some(size) = meta.size.filter(|&s| s != have) {
                bail!(
                    "cached blob {} has {have} bytes but the hub says {size}; delete it and run again",
                    blob.display()
                );
            }
        } else {
            self.fetch(&meta, file, &blob)?;
        }
        let snap = link_snapshot(repo_dir, &meta.commit, file, &meta.etag)?;
        write_ref(repo_dir, &meta.commit)?;
        Ok(snap)
    }

    fn metadata(&self, repo: &str, file: &str, url: &str) -> Result<FileMeta> {
        let resp = self.follow(url, Method::Head, None, false)?;
        let status = resp.status().as_u16();
        if !(200..400).contains(&status) {
            check_status(&resp, repo, Some(file), url, self.token.is_some())?;
        }
        let commit = header(&resp, "x-repo-commit").ok_or_else(|| {
            anyhow!("{url} answered without X-Repo-Commit (HTTP {status}): is HF_ENDPOINT a Hugging Face hub?")
        })?;
        let etag = header(&resp, "x-linked-etag")
            .or_else(|| header(&resp, "etag"))
            .map(|e| normalize_etag(&e))
            .filter(|e| !e.is_empty())
            .ok_or_else(|| anyhow!("{url} answered without an ETag: cannot name the blob"))?;
        if !is_safe_name(&etag) || !is_safe_name(&commit) {
            bail!("{url}: odd commit `{commit}` or etag `{etag}` in the hub's answer");
        }
        let size = header(&resp, "x-linked-size")
            // A redirect's Content-Length is its own body's, not the file's.
            .or_else(|| header(&resp, "content-length").filter(|_| status == 200))
            .and_then(|s| s.parse().ok());
        let location = match header(&resp, "location") {
            Some(loc) if (300..400).contains(&status) => join_url(url, &loc),
            _ => url.to_string(),
        };
        Ok(FileMeta {
            commit,
            etag,
            size,
            location,
        })
    }

    /// One request, following redirects by hand. With `to_end` false it stops at the first
    /// answer carrying X-Repo-Commit (the hub's own), and follows only relative redirects
    /// before that (renamed repos), as huggingface_hub does.
    fn follow(&self, url: &str, m: Method, from: Option<u64>, to_end: bool) -> Result<Response<Body>> {
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let resp = self.send(&url, m, from)?;
            let status = resp.status().as_u16();
            let loc = header(&resp, "location");
            let redirect = (300..400).contains(&status) && loc.is_some();
            let stop = !redirect
                || (!to_end
                    && (header(&resp, "x-repo-commit").is_some() || !loc.as_deref().unwrap_or("").starts_with('/')));
            if stop {
                return Ok(resp);
            }
            url = join_url(&url, &loc.unwrap_or_default());
        }
        bail!("too many redirects from {url}")
    }

    fn send(&self, url: &str, m: Method, from: Option<u64>) -> Result<Response<Body>> {
        // The token goes to the hub only, never to the CDN its redirects point at.
        let auth = self.token.as_ref().filter(|_| same_origin(url, &self.endpoint));
        let result = match m {
            Method::Head => {
                let mut r = self.agent.head(url).header("Accept-Encoding", "identity");
                if let Some(t) = auth {
                    r = r.header("Authorization", format!("Bearer {t}"));
                }
                r.call()
            }
            Method::Get => {
                let mut r = self.agent.get(url).header("Accept-Encoding", "identity");
                if let Some(t) = auth {
                    r = r.header("Authorization", format!("Bearer {t}"));
                }
                if let Some(n) = from.filter(|&n| n > 0) {
                    r = r.header("Range", format!("bytes={n}-"));
                }
                r.call()
            }
        };
        result.map_err(|e| match e {
            ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
            | ureq::Error::Tls(_)
            | ureq::Error::Rustls(_)
            | ureq::Error::ConnectProxyFailed(_) => anyhow::Error::new(Unreachable {
                url: url.to_string(),
                cause: e.to_string(),
            }),
            e => anyhow!("{url}: {e}"),
        })
    }

    /// Moves the bytes into `{blob}.incomplete`, resuming what is there, retrying dropped
    /// connections, verifying size and (for LFS files) sha256, then renames it to `blob`.
    fn fetch(&self, meta: &FileMeta, file: &str, blob: &Path) -> Result<()> {
        let incomplete = &blob.with_file_name(format!("{}.incomplete", meta.etag));
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(incomplete)
            .with_context(|| format!("opening {}", incomplete.display()))?;
        // Two xwen (or a huggingface_hub) runs appending to one partial file would corrupt it.
        // The lock lives until the rename below; where the filesystem cannot lock, go on.
        if let Err(fs::TryLockError::WouldBlock) = f.try_lock() {
            bail!(
                "another process is downloading {file} into {}; wait for it to finish or stop it",
                incomplete.display()
            );
        }
        if blob.is_file() {
            // It finished while we opened: drop the empty partial our open may have created.
            if f.metadata()?.len() == 0 {
                let _ = fs::remove_file(incomplete);
            }
            return Ok(());
        }
        let want_sha = is_sha256(&meta.etag).then(|| meta.etag.clone());
        let mut total = meta.size;
        let mut have = f.metadata()?.len();
        if total.is_some_and(|t| have > t) {
            have = restart(&mut f)?;
        }
        let mut hasher = match &want_sha {
            Some(_) => Some(hash_prefix(&mut f, have)?),
            None => None,
        };
        let name = file.rsplit('/').next().unwrap_or(file);
        let mut bar = Progress::new(name, total, have);
        if have > 0 {
            bar.note(&format!("resuming {name} at {}", human_bytes(have)));
        }
        let mut stalled = 0u32;
        let mut last_err = String::new();
        while total != Some(have) {
            let before = have;
            match self.attempt(meta, &mut f, &mut have, &mut total, &mut hasher, &mut bar) {
                Ok(()) => {}
                Err(AttemptError::Fatal(e)) => {
                    bar.clear();
                    return Err(e);
                }
                Err(AttemptError::Retry(msg)) => last_err = msg,
            }
            if last_err.is_empty() && total.is_some_and(|t| have < t) {
                last_err = "connection closed early".into();
            }
            if total == Some(have) {
                break;
            }
            if total.is_none() && last_err.is_empty() {
                break; // no length known and the server closed cleanly: that is the end
            }
            stalled = if have > before { 0 } else { stalled + 1 };
            if stalled >= MAX_STALLED_ATTEMPTS {
                bar.clear();
                bail!(
                    "download of {name} truncated: got {} of {} from {} ({last_err}); the partial file {} is kept — run again to resume",
                    human_bytes(have),
                    total.map(human_bytes).unwrap_or_else(|| "?".into()),
                    meta.location,
                    incomplete.display()
                );
            }
            if stalled > 0 {
                std::thread::sleep(Duration::from_millis(250 << stalled));
            }
            last_err.clear();
        }
        bar.finish(have);
        f.sync_all()
            .with_context(|| format!("flushing {}", incomplete.display()))?;
        let on_disk = f.metadata()?.len();
        if let Some(t) = total.filter(|&t| t != on_disk) {
            bail!(
                "download of {name}: {} holds {on_disk} bytes, expected {t}",
                incomplete.display()
            );
        }
        if let (Some(want), Some(h)) = (want_sha, hasher) {
            let got = hex(&h.finalize());
            if got != want {
                // Only the bad .incomplete goes: a later run must not resume from corrupt bytes.
                let _ = fs::remove_file(incomplete);
                bail!(
                    "sha256 mismatch for {name} from {}: expected {want}, got {got}. The corrupt download \
                     was deleted; run again, and if it repeats something between you and the hub alters the file",
                    meta.location
                );
            }
        }
        fs::rename(incomplete, blob).with_context(|| format!("moving {} into place", incomplete.display()))
    }

    /// One GET from `*have` onwards. Transport trouble is `Retry`; an answer that more
    /// attempts cannot change (HTTP 4xx, a full disk) is `Fatal`.
    fn attempt(
        &self,
        meta: &FileMeta,
        f: &mut File,
        have: &mut u64,
        total: &mut Option<u64>,
        hasher: &mut Option<Sha256>,
        bar: &mut Progress,
    ) -> Result<(), AttemptError> {
        let mut resp = match self.follow(&meta.location, Method::Get, Some(*have), true) {
            Ok(r) => r,
            Err(e) => return Err(AttemptError::Retry(format!("{e:#}"))),
        };
        let status = resp.status().as_u16();
        match status {
            206 => {
                let (start, len) = header(&resp, "content-range")
                    .and_then(|cr| parse_content_range(&cr))
                    .ok_or_else(|| AttemptError::Retry("206 without a usable Content-Range".into()))?;
                if start != *have {
                    // Never splice bytes at the wrong offset: start over.
                    let msg = format!("server resumed at byte {start}, not {}", *have);
                    *have = restart(f).map_err(AttemptError::Fatal)?;
                    reset_hash(hasher);
                    return Err(AttemptError::Retry(msg));
                }
                if let Some(len) = len {
                    *total = Some(len);
                }
            }
            200 => {
                if *have > 0 {
                    bar.note("server ignored the Range request; restarting from byte 0");
                    *have = restart(f).map_err(AttemptError::Fatal)?;
                    reset_hash(hasher);
                }
                if let Some(len) = header(&resp, "content-length").and_then(|s| s.parse().ok()) {
                    *total = Some(len);
                }
            }
            416 if total.is_some_and(|t| t == *have) => return Ok(()),
            416 => {
                *have = restart(f).map_err(AttemptError::Fatal)?;
                reset_hash(hasher);
                return Err(AttemptError::Retry("HTTP 416 for a resume".into()));
            }
            s if s >= 500 || s == 429 => return Err(AttemptError::Retry(format!("HTTP {s} from {}", meta.location))),
            _ => {
                let e = check_status(&resp, "", None, &meta.location, self.token.is_some())
                    .err()
                    .unwrap_or_else(|| anyhow!("unexpected HTTP {status} from {}", meta.location));
                return Err(AttemptError::Fatal(e));
            }
        }
        bar.set_total(*total);
        f.seek(SeekFrom::Start(*have))
            .map_err(|e| AttemptError::Fatal(e.into()))?;
        let mut reader = resp.body_mut().with_config().reader();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(AttemptError::Retry(e.to_string())),
            };
            let n = n.min(total.map_or(n as u64, |t| t.saturating_sub(*have)) as usize);
            if n == 0 {
                return Ok(()); // more bytes than announced: the size check reports it
            }
            if let Err(e) = f.write_all(&buf[..n]) {
                return Err(AttemptError::Fatal(write_error(e, *have, *total)));
            }
            if let Some(h) = hasher.as_mut() {
                h.update(&buf[..n]);
            }
            *have += n as u64;
            bar.update(*have);
        }
    }
}

#[derive(Clone, Copy)]
enum Method {
    Head,
    Get,
}

enum AttemptError {
    Retry(String),
    Fatal(anyhow::Error),
}

fn restart(f: &mut File) -> Result<u64> {
    f.set_len(0)?;
    f.seek(SeekFrom::Start(0))?;
    Ok(0)
}

fn reset_hash(h: &mut Option<Sha256>) {
    if let Some(h) = h.as_mut() {
        *h = Sha256::new();
    }
}

/// The hash state of a partial file left by an earlier run, so resuming costs one read of
/// what is there rather than a second full pass at the end.
fn hash_prefix(f: &mut File, len: u64) -> Result<Sha256> {
    let mut h = Sha256::new();
    f.seek(SeekFrom::Start(0))?;
    let mut r = (&mut *f).take(len);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h)
}

fn write_error(e: io::Error, have: u64, total: Option<u64>) -> anyhow::Error {
    // ENOSPC is 28 on Linux and macOS alike.
    if e.kind() == io::ErrorKind::StorageFull || e.raw_os_error() == Some(28) {
        let need = total
            .map(|t| format!(": free at least {} more", human_bytes(t.saturating_sub(have))))
            .unwrap_or_default();
        anyhow!(
            "disk full after {} of the download{need}, then run again — the partial file is kept and the download resumes",
            human_bytes(have)
        )
    } else {
        anyhow!("writing the download: {e}")
    }
}

/// HF_TOKEN, else the file `huggingface-cli login` writes (HF_TOKEN_PATH > HF_HOME/token >
/// ~/.cache/huggingface/token), as huggingface_hub looks them up.
fn token() -> Option<String> {
    let from_env = std::env::var("HF_TOKEN").ok();
    let path = std::env::var_os("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
        let home = std::env::var_os("HF_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface")));
        home.map(|h| h.join("token"))
    });
    let from_file = || path.and_then(|p| fs::read_to_string(p).ok());
    from_env
        .or_else(from_file)
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// A clear message for a hub refusal, using the hub's X-Error-Code where it sends one.
fn check_status(resp: &Response<Body>, repo: &str, file: Option<&str>, url: &str, token: bool) -> Result<()> {
    let status = resp.status().as_u16();
    if (200..300).contains(&status) {
        return Ok(());
    }
    let code = header(resp, "x-error-code").unwrap_or_default();
    let hub_msg = header(resp, "x-error-message")
        .map(|m| format!(" (hub: {m})"))
        .unwrap_or_default();
    let token_hint = if token {
        "your token (HF_TOKEN or huggingface-cli login) does not grant access to it"
    } else {
        "set HF_TOKEN to a token of an account that has access"
    };
    let what = match file {
        Some(f) => format!("{repo}/{f}"),
        None if repo.is_empty() => url.to_string(),
        None => repo.to_string(),
    };
    match (status, code.as_str()) {
        (_, "GatedRepo") => {
            bail!("{repo} is gated (HTTP {status}){hub_msg}: accept its terms on the repo page, then {token_hint}")
        }
        (_, "RepoNotFound") => {
            bail!("no such repo: {repo} (HTTP {status}, {url}){hub_msg}; private repos need HF_TOKEN")
        }
        (_, "EntryNotFound") => bail!(
            "{repo} has no file `{}` (HTTP {status}, {url}){hub_msg}",
            file.unwrap_or("?")
        ),
        (_, "RevisionNotFound") => bail!("{repo} has no revision `main` (HTTP {status}){hub_msg}"),
        (401 | 403, _) => {
            bail!("access to {what} denied (HTTP {status}){hub_msg}: the repo is gated or private — {token_hint}")
        }
        (404, _) => bail!("not found: {what} (HTTP 404, {url}){hub_msg}: no such repo or file"),
        _ => bail!("the hub answered HTTP {status} for {url}{hub_msg}"),
    }
}

fn header(resp: &Response<Body>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
}

/// `W/"abc"` → `abc`, as huggingface_hub normalizes.
pub fn normalize_etag(e: &str) -> String {
    e.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Hub-provided names become path components: no separators, no `..`.
fn is_safe_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `bytes START-END/TOTAL` → (START, TOTAL); TOTAL may be `*`.
fn parse_content_range(s: &str) -> Option<(u64, Option<u64>)> {
    let rest = s.trim().strip_prefix("bytes")?.trim();
    let (range, total) = rest.split_once('/')?;
    let start = range.split_once('-')?.0.trim().parse().ok()?;
    Some((start, total.trim().parse().ok()))
}

/// Percent-encodes a repo file path, keeping `/` (huggingface_hub's `quote(filename)`).
fn encode_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for b in p.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

fn same_origin(a: &str, b: &str) -> bool {
    origin(a).eq_ignore_ascii_case(origin(b))
}

fn join_url(base: &str, loc: &str) -> String {
    if loc.contains("://") {
        loc.to_string()
    } else if loc.starts_with('/') {
        format!("{}{loc}", origin(base))
    } else {
        let dir = base.rsplit_once('/').map_or(base, |(d, _)| d);
        format!("{dir}/{loc}")
    }
}

/// `snapshots/{commit}/{file}` pointing at the blob: a relative symlink on Unix (what
/// huggingface_hub makes), a copy elsewhere.
fn link_snapshot(repo_dir: &Path, commit: &str, file: &str, etag: &str) -> Result<PathBuf> {
    let snap = repo_dir.join("snapshots").join(commit).join(file);
    if let Some(parent) = snap.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    if fs::symlink_metadata(&snap).is_ok() {
        fs::remove_file(&snap).with_context(|| format!("replacing {}", snap.display()))?;
    }
    let depth = file.split('/').count() + 1; // up from the file's folder to the repo dir
    let target = format!("{}blobs/{etag}", "../".repeat(depth));
    #[cfg(unix)]
    std::os::unix::fs::symlink(&target, &snap).with_context(|| format!("linking {}", snap.display()))?;
    #[cfg(not(unix))]
    fs::copy(repo_dir.join("blobs").join(etag), &snap).with_context(|| format!("copying to {}", snap.display()))?;
    Ok(snap)
}

fn write_ref(repo_dir: &Path, commit: &str) -> Result<()> {
    let refs = repo_dir.join("refs");
    fs::create_dir_all(&refs)?;
    let main = refs.join("main");
    if fs::read_to_string(&main).ok().as_deref() != Some(commit) {
        // No trailing newline: hf-hub readers compare the ref verbatim.
        fs::write(&main, commit).with_context(|| format!("writing {}", main.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_and_ranges() {
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(parse_content_range("bytes 100-199/200"), Some((100, Some(200))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("items 5-9/10"), None);
        assert!(is_sha256(&"a".repeat(64)) && !is_sha256(&"a".repeat(40)));
    }

    #[test]
    fn urls() {
        assert_eq!(encode_path("sub dir/a+b.gguf"), "sub%20dir/a%2Bb.gguf");
        assert_eq!(join_url("https://h.co/a/b?x=1", "/c/d"), "https://h.co/c/d");
        assert_eq!(join_url("https://h.co/a/b", "https://cdn.x/y"), "https://cdn.x/y");
        assert!(same_origin("https://huggingface.co/x/y", "https://huggingface.co"));
        assert!(!same_origin("https://cdn.hf.co/x", "https://huggingface.co"));
    }
}
