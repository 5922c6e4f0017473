//! End to end on real trained weights: `xwen run` greedy output on the tiny trained models
//! equals llama.cpp's `llama-completion --temp 0 -n 64` output recorded in
//! ../shared/models/llama_completions.txt (12 runs: 2 models × 3 quant types × 2 prompts).

use std::path::{Path, PathBuf};
use std::process::Command;

fn shared() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models");
    p.join("llama_completions.txt").is_file().then_some(p)
}

/// (model, quant, prompt, expected full text) from the completions file.
fn cases(dir: &Path) -> Vec<(String, String, String, String)> {
    let text = std::fs::read_to_string(dir.join("llama_completions.txt")).unwrap();
    let mut out = Vec::new();
    for block in text.split("=== ").filter(|b| !b.is_empty()) {
        let (head, body) = block.split_once('\n').unwrap();
        let mut it = head.split(' ');
        let (model, quant) = (it.next().unwrap().to_string(), it.next().unwrap().to_string());
        let prompt = head.split_once("prompt=").unwrap().1.replace("\\n", "\n");
        out.push((model, quant, prompt, body.to_string()));
    }
    out
}

#[test]
fn greedy_completions_equal_llama_cpp() {
    let Some(dir) = shared() else {
        eprintln!("SKIP greedy_completions_equal_llama_cpp: ../shared/models is not beside this checkout");
        return;
    };
    let mut failures = Vec::new();
    let mut ran = 0;
    for (model, quant, prompt, want) in cases(&dir) {
        let gguf = dir.join(format!("gguf/{model}-{quant}.gguf"));
        if !gguf.is_file() {
            eprintln!("SKIP {model} {quant}: {} not shipped", gguf.file_name().unwrap().to_string_lossy());
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_xwen"))
            .args(["run", "-q", "--temp", "0", "-n", "64", "-t", "2", "-p", &prompt, "-m"])
            .arg(&gguf)
            .output()
            .unwrap();
        assert!(out.status.success(), "{model} {quant}: {}", String::from_utf8_lossy(&out.stderr));
        let got = String::from_utf8_lossy(&out.stdout).to_string();
        ran += 1;
        let (g, w) = (got.trim_end_matches('\n'), want.trim_end_matches('\n'));
        if g != w {
            let common = g.chars().zip(w.chars()).take_while(|(a, b)| a == b).count();
            failures.push(format!("{model} {quant} {prompt:?}: diverges after {common} chars\n  got:  {g:?}\n  want: {w:?}"));
        } else {
            eprintln!("ok {model} {quant} {prompt:?}");
        }
    }
    assert!(ran > 0, "no case ran");
    assert!(failures.is_empty(), "{} of {ran} differ:\n{}", failures.len(), failures.join("\n"));
}
