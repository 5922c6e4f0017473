//! Real files written by llama.cpp's converter and quantizer: they parse, every tensor range is
//! served, and rewriting them with `GgufWriter` reproduces them byte for byte (so the writer's
//! layout is llama.cpp's).

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{repo_root, shared_models_dir};
use xwen_gguf::{GgufFile, GgufWriter};

fn gguf_files_in(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(prefix) && name.ends_with(".gguf")
        })
        .collect();
    v.sort();
    v
}

/// Rewrites `f` (metadata and tensors, in file order) and compares with the original bytes.
fn assert_rewrite_identical(f: &GgufFile, path: &Path) {
    let mut w = GgufWriter::with_alignment(f.alignment());
    for (k, v) in f.metadata() {
        w.add_kv(k, v.clone());
    }
    for t in f.tensors() {
        w.add_tensor(&t.name, t.ty, &t.dims, f.tensor_data(t).to_vec())
            .unwrap();
    }
    let mut ours = w.to_bytes();
    let theirs = std::fs::read(path).unwrap();
    // The writer always writes v3; v2 files differ only in that field.
    if f.version() == 2 {
        ours[4..8].copy_from_slice(&2u32.to_le_bytes());
    }
    let first_diff = ours.iter().zip(&theirs).position(|(a, b)| a != b);
    assert!(
        first_diff.is_none() && ours.len() == theirs.len(),
        "{}: rewrite differs (first differing byte {first_diff:?}, lengths {} vs {})",
        path.display(),
        ours.len(),
        theirs.len()
    );
}

fn open_timed(path: &Path) -> (GgufFile, f64) {
    let t0 = Instant::now();
    let f = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (f, t0.elapsed().as_secs_f64())
}

#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn tiny_qwen35_models() {
    let files = gguf_files_in(&shared_models_dir(), "tiny-qwen35");
    assert!(!files.is_empty(), "no tiny-qwen35 GGUFs in {}", shared_models_dir().display());
    for path in &files {
        let (f, secs) = open_timed(path);
        let arch = f.architecture().unwrap().to_string();
        assert!(arch == "qwen35" || arch == "qwen35moe", "{arch}");
        assert_eq!(f.version(), 3);
        // From the models' README: 6 layers, hidden 256, vocab 4096.
        assert_eq!(f.get_u32(&f.arch_key("block_count")), Some(6));
        assert_eq!(f.get_u32(&f.arch_key("embedding_length")), Some(256));
        assert_eq!(
            f.get_array("tokenizer.ggml.tokens").map(|a| a.len()),
            Some(4096)
        );
        let embd = f.tensor("token_embd.weight").expect("token_embd.weight");
        assert_eq!(embd.dims, [256, 4096]);
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        }
        let last_end = f
            .tensors()
            .iter()
            .map(|t| f.data_offset() + t.offset + t.n_bytes)
            .max()
            .unwrap();
        assert!(last_end <= f.file_len() && f.file_len() - last_end < f.alignment());
        eprintln!(
            "{}: {} tensors, {} keys, parsed in {:.1} ms",
            path.file_name().unwrap().to_string_lossy(),
            f.tensors().len(),
            f.metadata().len(),
            secs * 1e3
        );
        assert_rewrite_identical(&f, path);
    }
}

/// llama.cpp's vocab files that the tokenizer tests already commit (tests/fixtures/vocab).
#[test]
fn committed_vocab_fixtures() {
    let dir = repo_root().join("tests/fixtures/vocab");
    let expect = [
        ("ggml-vocab-deepseek-coder.gguf", "llama", 32256, 31757),
        ("ggml-vocab-gpt-2.gguf", "gpt2", 50257, 50000),
        ("ggml-vocab-qwen35.gguf", "qwen2", 151936, 151387),
    ];
    let mut seen = 0;
    for (name, arch, n_tokens, n_merges) in expect {
        let path = dir.join(name);
        if !path.exists() {
            eprintln!("SKIP committed_vocab_fixtures: {} is missing", path.display());
            continue;
        }
        seen += 1;
        let (f, _) = open_timed(&path);
        assert_eq!(f.architecture(), Some(arch));
        assert_eq!(f.get_array("tokenizer.ggml.tokens").map(|a| a.len()), Some(n_tokens));
        assert_eq!(f.get_array("tokenizer.ggml.token_type").map(|a| a.len()), Some(n_tokens));
        assert_eq!(f.get_array("tokenizer.ggml.merges").map(|a| a.len()), Some(n_merges));
        assert!(f.tensors().is_empty());
        assert_rewrite_identical(&f, &path);
    }
    assert!(seen > 0, "no vocab fixture found in {}", dir.display());
}

/// All of llama.cpp's vocab files, including the 248k-token Qwen3.5 one (the size of a real
/// Qwen3.5/3.6 vocabulary): set XWEN_LLAMA_CPP_DIR to a llama.cpp source tree.
#[test]
#[cfg_attr(xwen_no_llama_cpp, ignore = "set XWEN_LLAMA_CPP_DIR to a llama.cpp source tree (README.md, \"Tests\")")]
fn llama_cpp_vocab_files() {
    let root = std::env::var_os("XWEN_LLAMA_CPP_DIR").expect("XWEN_LLAMA_CPP_DIR");
    let files = gguf_files_in(&Path::new(&root).join("models"), "ggml-vocab-");
    assert!(
        !files.is_empty(),
        "no models/ggml-vocab-*.gguf under XWEN_LLAMA_CPP_DIR"
    );
    for path in &files {
        let (f, secs) = open_timed(path);
        let n = f.get_array("tokenizer.ggml.tokens").map_or(0, |a| a.len());
        eprintln!(
            "{}: {n} tokens, parsed in {:.1} ms",
            path.file_name().unwrap().to_string_lossy(),
            secs * 1e3
        );
        if n > 200_000 && !cfg!(debug_assertions) {
            assert!(secs < 0.5, "{}: {secs:.3} s to parse", path.display());
        }
        assert_rewrite_identical(&f, path);
    }
}
