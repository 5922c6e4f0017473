//! MODEL names → files, cache first. A MODEL is one of
//!
//! - a path to a .gguf file, used as is;
//! - an official checkpoint by its exact full name (`Qwen3.6-35B-A3B`): ggml-org's Q4_K_M file;
//! - `owner/repo:FILE.gguf`, one file of a Hugging Face repo;
//! - `owner/repo:QUANT` (`:Q8_0`), the repo's single `*-QUANT.gguf` model file;
//! - `owner/repo`, the same with QUANT = Q4_K_M.
//!
//! Repo files resolve through the Hugging Face cache (HF_HUB_CACHE > HF_HOME/hub >
//! ~/.cache/huggingface/hub) at refs/main and are downloaded into it on a miss (download.rs).
//! Offline (HF_HUB_OFFLINE, or the hub unreachable) a miss names the exact URL to fetch and the
//! exact cache path to put the file at.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

use crate::download::{is_unreachable, Hub};

/// Official checkpoints by exact full name → (repo, file) of the ggml-org Q4_K_M GGUF.
pub const OFFICIAL: &[(&str, &str, &str)] = &[
    ("Qwen3.6-27B", "ggml-org/Qwen3.6-27B-GGUF", "Qwen3.6-27B-Q4_K_M.gguf"),
    (
        "Qwen3.6-35B-A3B",
        "ggml-org/Qwen3.6-35B-A3B-GGUF",
        "Qwen3.6-35B-A3B-Q4_K_M.gguf",
    ),
    ("Qwen3.8-27B", "ggml-org/Qwen3.8-27B-GGUF", "Qwen3.8-27B-Q4_K_M.gguf"),
];

pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// Sidecars that share a repo (and a quant suffix) with the model: vision towers and draft
/// heads. A quant pick must never land on one of them.
const SIDECAR_PREFIXES: &[&str] = &["mmproj", "mtp-", "dflash-"];

#[derive(Debug, PartialEq)]
pub enum Want {
    File(String),
    Quant(String),
}

#[derive(Debug, PartialEq)]
pub enum Spec {
    Path(PathBuf),
    Repo { repo: String, want: Want },
}

pub fn hub_cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p).join("hub"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
}

pub fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// Snapshot folders to look in, in order: the one refs/main names, then `main` itself —
/// where huggingface_hub also looks when there is no ref, so a hand-placed file works.
fn snapshot_dirs(cache: &Path, repo: &str) -> Vec<PathBuf> {
    let dir = repo_dir(cache, repo);
    let mut out = Vec::new();
    if let Ok(rev) = std::fs::read_to_string(dir.join("refs/main")) {
        // A trailing newline in a hand-edited ref must not cost a re-download.
        let rev = rev.trim();
        if !rev.is_empty() && !rev.contains(['/', '\\']) && rev != ".." {
            out.push(dir.join("snapshots").join(rev));
        }
    }
    let main = dir.join("snapshots/main");
    if !out.contains(&main) {
        out.push(main);
    }
    out
}

/// The file of `repo` at refs/main in the HF cache layout, if present.
pub fn cached_file(cache: &Path, repo: &str, file: &str) -> Option<PathBuf> {
    snapshot_dirs(cache, repo)
        .into_iter()
        .map(|d| d.join(file))
        .find(|p| p.is_file())
}

/// Cached files of `repo` (first snapshot folder that has any) whose name picks `quant`.
fn cached_quant(cache: &Path, repo: &str, quant: &str) -> Vec<PathBuf> {
    for dir in snapshot_dirs(cache, repo) {
        let mut files = Vec::new();
        list_files(&dir, "", 3, &mut files);
        let hits: Vec<PathBuf> = files
            .iter()
            .filter(|f| quant_matches(f, quant))
            .map(|f| dir.join(f))
            .filter(|p| p.is_file())
            .collect();
        if !hits.is_empty() {
            return hits;
        }
    }
    Vec::new()
}

fn list_files(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let path = e.path();
        if path.is_dir() {
            if depth > 1 {
                list_files(&path, &rel, depth - 1, out);
            }
        } else {
            out.push(rel);
        }
    }
}

/// `…-Q4_K_M.gguf` or `….Q4_K_M.gguf` (case-insensitive), not a sidecar.
pub fn quant_matches(file: &str, quant: &str) -> bool {
    let base = file.rsplit('/').next().unwrap_or(file).to_ascii_lowercase();
    let q = quant.to_ascii_lowercase();
    !SIDECAR_PREFIXES.iter().any(|p| base.starts_with(p))
        && (base.ends_with(&format!("-{q}.gguf")) || base.ends_with(&format!(".{q}.gguf")))
}

/// The one model file of `files` for `quant`; anything else is an error listing candidates.
pub fn pick_quant(repo: &str, quant: &str, files: &[String]) -> Result<String> {
    let hits: Vec<&String> = files.iter().filter(|f| quant_matches(f, quant)).collect();
    if let [one] = hits.as_slice() {
        return Ok(one.to_string());
    }
    let q = quant.to_ascii_lowercase();
    let ggufs: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    let related: Vec<&String> = ggufs
        .iter()
        .copied()
        .filter(|f| f.to_ascii_lowercase().contains(&q))
        .collect();
    let shown = if related.is_empty() { &ggufs } else { &related };
    let list = if shown.is_empty() {
        "(the repo has no .gguf files)".to_string()
    } else {
        shown.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(", ")
    };
    if hits.is_empty() {
        let split = related.iter().any(|f| f.contains("-of-"));
        let hint = if split {
            " (split GGUFs are not supported: merge the parts with llama-gguf-split --merge)"
        } else {
            ""
        };
        bail!("{repo} has no single `*-{quant}.gguf` file{hint}; candidates: {list}. Name one with -m {repo}:FILE.gguf")
    }
    bail!("{repo}: `{quant}` matches several files: {list}. Name one with -m {repo}:FILE.gguf")
}

/// `owner/name` with the hub's characters only.
fn is_repo_id(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty() && p != "." && p != ".." && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    matches!(s.split_once('/'), Some((o, n)) if ok(o) && ok(n))
}

/// A repo file name that is safe to join under a snapshot folder.
fn is_repo_file(f: &str) -> bool {
    !f.is_empty()
        && !f.starts_with('/')
        && !f.contains('\\')
        && f.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// The one model GGUF in `dir` (multimodal projectors, `mmproj*`, aside; a split model by its
/// first part); several or none is an error that lists what is there.
fn one_gguf_in(dir: &Path) -> Result<PathBuf> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    let mut found: Vec<PathBuf> = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_ascii_lowercase();
        let is_part = name.contains("-of-") && !name.contains("-00001-of-");
        if name.ends_with(".gguf") && !name.starts_with("mmproj") && !is_part && e.path().is_file() {
            found.push(e.path());
        }
    }
    found.sort();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("{} holds no .gguf file", dir.display()),
        many => bail!(
            "{} holds {} GGUF files ({}): give one with -m DIR/FILE.gguf",
            dir.display(),
            many.len(),
            many.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy()).collect::<Vec<_>>().join(", ")
        ),
    }
}

pub fn parse(model: &str) -> Result<Spec> {
    let p = Path::new(model);
    if p.is_file() {
        return Ok(Spec::Path(p.to_path_buf()));
    }
    // a local directory is never a repo id, even when its name looks like one (`models/x`)
    if p.is_dir() {
        return one_gguf_in(p).map(Spec::Path);
    }
    if let Some((_, repo, file)) = OFFICIAL.iter().find(|(name, _, _)| *name == model) {
        return Ok(Spec::Repo {
            repo: repo.to_string(),
            want: Want::File(file.to_string()),
        });
    }
    // Full names are exact: `qwen3.6-27b` is a typo for an official name, not a path.
    if let Some((name, _, _)) = OFFICIAL.iter().find(|(name, _, _)| name.eq_ignore_ascii_case(model)) {
        bail!("no such file or checkpoint `{model}`; did you mean `{name}`? (checkpoint names are case-sensitive)");
    }
    let (repo, spec) = match model.split_once(':') {
        Some((r, s)) => (r, Some(s)),
        None => (model, None),
    };
    let path_like = model.to_ascii_lowercase().ends_with(".gguf") && spec.is_none();
    if path_like || !is_repo_id(repo) {
        if p.exists() {
            bail!("{model} is not a file");
        }
        bail!(
            "no such file: `{model}` (a MODEL is a .gguf path, one of {}, owner/repo, owner/repo:QUANT or owner/repo:FILE.gguf)",
            OFFICIAL.iter().map(|o| o.0).collect::<Vec<_>>().join(", ")
        );
    }
    let want = match spec {
        None => Want::Quant(DEFAULT_QUANT.to_string()),
        Some(s) if s.to_ascii_lowercase().ends_with(".gguf") => {
            if !is_repo_file(s) {
                bail!("`{s}` is not a file name inside a repo");
            }
            Want::File(s.to_string())
        }
        Some(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b)) => {
            Want::Quant(s.to_string())
        }
        Some(s) => bail!("`{model}`: after the colon goes a quant (Q4_K_M) or a FILE.gguf, not `{s}`"),
    };
    Ok(Spec::Repo {
        repo: repo.to_string(),
        want,
    })
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true"))
        .unwrap_or(false)
}

pub fn resolve(model: &str) -> Result<PathBuf> {
    let (repo, want) = match parse(model)? {
        Spec::Path(p) => return Ok(p),
        Spec::Repo { repo, want } => (repo, want),
    };
    let cache = hub_cache_dir().context("no Hugging Face cache folder: set HF_HUB_CACHE or HF_HOME")?;
    match &want {
        Want::File(f) => {
            if let Some(p) = cached_file(&cache, &repo, f) {
                return Ok(p);
            }
        }
        Want::Quant(q) => {
            if let [one] = cached_quant(&cache, &repo, q).as_slice() {
                return Ok(one.clone());
            }
        }
    }
    let hub = Hub::from_env();
    if offline() {
        bail!(not_cached(model, &repo, &want, &cache, &hub, "HF_HUB_OFFLINE is set"));
    }
    let unreachable = |e: anyhow::Error| match is_unreachable(&e) {
        Some(u) => anyhow::anyhow!(not_cached(
            model,
            &repo,
            &want,
            &cache,
            &hub,
            &format!("the hub is unreachable: {}", u.cause)
        )),
        None => e,
    };
    let file = match &want {
        Want::File(f) => f.clone(),
        Want::Quant(q) => {
            let files = hub.list_files(&repo).map_err(unreachable)?;
            let f = pick_quant(&repo, q, &files)?;
            if !is_repo_file(&f) {
                bail!("{repo} lists an unusable file name `{f}`");
            }
            if let Some(p) = cached_file(&cache, &repo, &f) {
                return Ok(p);
            }
            f
        }
    };
    hub.download(&repo_dir(&cache, &repo), &repo, &file).map_err(unreachable)
}

/// The offline miss: exactly which URL to fetch and where the file goes so that the next run
/// (and huggingface_hub) finds it.
fn not_cached(model: &str, repo: &str, want: &Want, cache: &Path, hub: &Hub, why: &str) -> String {
    let snap = repo_dir(cache, repo).join("snapshots").join("main");
    match want {
        Want::File(file) => format!(
            "`{model}` is not in the Hugging Face cache and cannot be downloaded now ({why}). Fetch {} \
             (e.g. `huggingface-cli download {repo} {file}` on a connected machine) and put it at {} — \
             or pass any .gguf path with -m",
            hub.file_url(repo, file),
            snap.join(file).display()
        ),
        Want::Quant(q) => format!(
            "`{model}` ({q} of {repo}) is not in the Hugging Face cache and cannot be downloaded now ({why}). \
             Fetch the repo's `*-{q}.gguf` file from {}/{repo}/resolve/main/FILE (the file list is at {}) and put it in {}/ — \
             or pass any .gguf path with -m",
            hub.endpoint,
            hub.api_url(repo),
            snap.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(r: &str, w: Want) -> Spec {
        Spec::Repo {
            repo: r.into(),
            want: w,
        }
    }

    #[test]
    fn parses_model_forms() {
        assert_eq!(
            parse("Qwen3.6-35B-A3B").unwrap(),
            repo(
                "ggml-org/Qwen3.6-35B-A3B-GGUF",
                Want::File("Qwen3.6-35B-A3B-Q4_K_M.gguf".into())
            )
        );
        assert!(parse("qwen3.6-35b-a3b")
            .unwrap_err()
            .to_string()
            .contains("did you mean `Qwen3.6-35B-A3B`"));
        assert_eq!(
            parse("o/r:X-Q8_0.gguf").unwrap(),
            repo("o/r", Want::File("X-Q8_0.gguf".into()))
        );
        assert_eq!(parse("o/r:Q8_0").unwrap(), repo("o/r", Want::Quant("Q8_0".into())));
        assert_eq!(parse("o/r").unwrap(), repo("o/r", Want::Quant("Q4_K_M".into())));
        assert!(parse("models/missing.gguf")
            .unwrap_err()
            .to_string()
            .contains("no such file"));
        assert!(parse("a/b/c").is_err());
        assert!(parse("o/r:../x.gguf").is_err());
        assert!(parse("o/r:a b").is_err());
    }

    #[test]
    fn picks_quants() {
        let files: Vec<String> = [
            "README.md",
            "Qwen3.8-27B-Q4_K_M.gguf",
            "Qwen3.8-27B-Q8_0.gguf",
            "mtp-Qwen3.8-27B-Q8_0.gguf",
            "mmproj-Qwen3.8-27B-Q8_0.gguf",
            "big-Q2_K-00001-of-00002.gguf",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(pick_quant("o/r", "Q8_0", &files).unwrap(), "Qwen3.8-27B-Q8_0.gguf");
        assert_eq!(pick_quant("o/r", "q4_k_m", &files).unwrap(), "Qwen3.8-27B-Q4_K_M.gguf");
        let e = pick_quant("o/r", "Q2_K", &files).unwrap_err().to_string();
        assert!(e.contains("split") && e.contains("big-Q2_K-00001-of-00002.gguf"), "{e}");
        let two = vec!["a-Q8_0.gguf".to_string(), "b-Q8_0.gguf".to_string()];
        let e = pick_quant("o/r", "Q8_0", &two).unwrap_err().to_string();
        assert!(
            e.contains("several") && e.contains("a-Q8_0.gguf") && e.contains("b-Q8_0.gguf"),
            "{e}"
        );
    }
}
