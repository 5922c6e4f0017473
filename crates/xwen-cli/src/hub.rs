//! MODEL names → files. A path is used as is; an official checkpoint name resolves through the
//! Hugging Face cache layout (HF_HUB_CACHE > HF_HOME/hub > ~/.cache/huggingface/hub).

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// Official checkpoints by exact full name → (repo, file) of the ggml-org Q4_K_M GGUF (seed 000).
pub const OFFICIAL: &[(&str, &str, &str)] = &[
    ("Qwen3.6-27B", "ggml-org/Qwen3.6-27B-GGUF", "Qwen3.6-27B-Q4_K_M.gguf"),
    ("Qwen3.6-35B-A3B", "ggml-org/Qwen3.6-35B-A3B-GGUF", "Qwen3.6-35B-A3B-Q4_K_M.gguf"),
    ("Qwen3.8-27B", "ggml-org/Qwen3.8-27B-GGUF", "Qwen3.8-27B-Q4_K_M.gguf"),
];

pub fn hub_cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return Some(PathBuf::from(p).join("hub"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/hub"))
}

/// The file of `repo` at refs/main in the HF cache layout, if present.
pub fn cached_file(cache: &Path, repo: &str, file: &str) -> Option<PathBuf> {
    let dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    let rev = std::fs::read_to_string(dir.join("refs/main")).ok()?;
    // A trailing newline in a hand-edited ref must not cost a re-download.
    let p = dir.join("snapshots").join(rev.trim()).join(file);
    p.is_file().then_some(p)
}

pub fn resolve(model: &str) -> Result<PathBuf> {
    let p = Path::new(model);
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    let official = OFFICIAL.iter().find(|(name, _, _)| name.eq_ignore_ascii_case(model));
    let (repo, file) = match official {
        Some((_, repo, file)) => (repo.to_string(), file.to_string()),
        None => match model.split_once(':') {
            // `owner/repo:file.gguf`
            Some((repo, file)) if repo.contains('/') => (repo.to_string(), file.to_string()),
            _ => bail!(
                "model `{model}` is neither a file nor a known checkpoint (known: {}; or use owner/repo:file.gguf)",
                OFFICIAL.iter().map(|o| o.0).collect::<Vec<_>>().join(", ")
            ),
        },
    };
    if let Some(cache) = hub_cache_dir() {
        if let Some(p) = cached_file(&cache, &repo, &file) {
            return Ok(p);
        }
    }
    bail!(
        "`{model}` is not cached and this build cannot download it here. Fetch https://huggingface.co/{repo}/resolve/main/{file} \
         (e.g. `huggingface-cli download {repo} {file}`) into the Hugging Face cache, or pass the .gguf path with -m"
    )
}
