//! `xwen synth`: write a synthetic GGUF with a real checkpoint's geometry and random weights,
//! for benchmarks (docs/bench.md "Synthetic models").

use crate::cli::SynthArgs;
use anyhow::{Context, Result};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;
use xwen_synth::{self as synth, SynthProgress};
use xwen_gguf::GgufFile;

/// The Qwen3.5 vocabulary fixture, looked for relative to the working directory (the repo root).
const DEFAULT_VOCAB: &str = "tests/fixtures/vocab/ggml-vocab-qwen35.gguf";

pub fn run(a: SynthArgs) -> Result<()> {
    let (out, vocab_arg, seed) = (a.out, a.vocab, a.seed);
    crate::opts::refuse_non_regular_out(&out)?;
    let mix = synth::Mix::parse(&a.mix, seed)?;
    // a preset's geometry, or one drawn at random (tiny: its synthetic vocabulary)
    let (g, name, tiny) = match (a.preset, a.random) {
        (Some(p), _) => (p.geometry(), p.name().to_string(), p.is_tiny()),
        (None, Some(r)) => {
            let g = synth::random_geometry(a.family, r);
            eprintln!("xwen synth: random {} geometry {r}: {}", a.family, synth::describe(&g));
            (g, format!("random-{}-{r}", a.family), true)
        }
        (None, None) => anyhow::bail!("give --preset NAME or --random SEED"),
    };
    let mut g = g;
    g.nextn |= a.mtp;
    for kv in &a.set {
        synth::set_field(&mut g, kv).map_err(anyhow::Error::msg)?;
    }
    if !a.set.is_empty() {
        eprintln!("xwen synth: with {}: {}", a.set.join(" "), synth::describe(&g));
    }
    // The Qwen3.5 vocabulary serves a preset whose embedding has room for it (not qwen3next's
    // 151,936 or kimi-linear's 163,840 rows: those take the synthetic one unless --vocab says)
    let default_fits = || {
        GgufFile::open(Path::new(DEFAULT_VOCAB))
            .ok()
            .and_then(|f| f.get_array("tokenizer.ggml.tokens").map(|t| t.len()))
            .is_some_and(|n| n <= g.n_vocab)
    };
    let vocab_path = match vocab_arg {
        Some(v) => Some(v),
        None if !tiny && Path::new(DEFAULT_VOCAB).is_file() && default_fits() => Some(PathBuf::from(DEFAULT_VOCAB)),
        None => None,
    };
    let vocab = match &vocab_path {
        Some(p) => Some(GgufFile::open(p).with_context(|| format!("vocabulary {}", p.display()))?),
        None => None,
    };
    match &vocab_path {
        Some(p) => eprintln!("xwen synth: tokenizer from {}", p.display()),
        None if tiny => eprintln!("xwen synth: synthetic byte-level vocabulary"),
        None => eprintln!(
            "xwen synth: no {DEFAULT_VOCAB} here and no --vocab: using a synthetic byte-level vocabulary \
             (llama.cpp's models/ggml-vocab-qwen35.gguf is the real one)"
        ),
    }

    eprintln!(
        "xwen synth: {name}: {} {} layers, hidden {}, vocab {} -> {}",
        g.arch,
        g.n_layer,
        g.n_embd,
        g.n_vocab,
        out.display()
    );
    let t0 = Instant::now();
    // A live line on a terminal; a line per 10% in logs.
    let live = std::io::stderr().is_terminal();
    let step = if live { 0.01 } else { 0.1 };
    let mut next_report = step;
    let mut report = |p: &SynthProgress<'_>| {
        let frac = p.bytes_done as f64 / p.bytes_total.max(1) as f64;
        if frac >= next_report || p.tensors_done == p.n_tensors {
            eprint!(
                "{}xwen synth: {:5.1}%  {:.2} / {:.2} GB  {:>4}/{} tensors  {:.0} s{}",
                if live { "\r" } else { "" },
                100.0 * frac,
                p.bytes_done as f64 / 1e9,
                p.bytes_total as f64 / 1e9,
                p.tensors_done,
                p.n_tensors,
                t0.elapsed().as_secs_f64(),
                if live { "  " } else { "\n" }
            );
            let _ = std::io::stderr().flush();
            while next_report <= frac {
                next_report += step;
            }
        }
    };
    let rep = synth::write_geometry(&g, &name, mix, &out, vocab.as_ref(), seed, &mut report)
        .with_context(|| format!("writing {}", out.display()))?;
    if live {
        eprintln!();
    }
    println!(
        "wrote {}: {:.2} GB ({} bytes, {:.2} GiB), {} tensors, {:.3} B params, in {:.1} s",
        rep.path.display(),
        rep.file_bytes as f64 / 1e9,
        rep.file_bytes,
        rep.file_bytes as f64 / (1u64 << 30) as f64,
        rep.n_tensors,
        rep.n_params as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
