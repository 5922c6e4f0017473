//! Batch invariance on geometries and weight types nobody chose: for freshly drawn random
//! geometries of every family (`random_geometry`), with every weight type xwen has kernels for
//! (`Mix::Random` and each type alone), sequences run together in one batched forward get the
//! logits each gets alone — bit for bit — with sequences joining and leaving, prefill chunks
//! beside decode rows, and up to 9 decode rows at once (every token-lane kernel's threshold).
//! The committed fixtures (crates/xwen-engine/tests/batch_invariance.rs) cover Q4_K_M, Q8_0 and
//! F32; a type whose several-row product parted from its one-token product would show here.

use xwen_engine::{EngineConfig, LogitsMode, Model, SeqStep};
use xwen_synth::{describe, random_geometry, write_geometry, Family, Mix};

/// Sequence `s`'s chunks: (batch step, tokens, logits mode). Joins at `join`, its prompt in
/// `prompt_chunks` on consecutive steps, then `decode` one-token steps.
fn plan(
    s: usize,
    join: usize,
    prompt_chunks: &[usize],
    decode: usize,
    vocab: usize,
) -> Vec<(usize, Vec<u32>, LogitsMode)> {
    let tok = |i: usize| ((s * 7919 + i * 104_729 + 17) % vocab) as u32;
    let mut chunks = Vec::new();
    let (mut step, mut i) = (join, 0);
    for (c, &len) in prompt_chunks.iter().enumerate() {
        let mode = if s == 1 && c == 0 {
            LogitsMode::All
        } else {
            LogitsMode::Last
        };
        chunks.push((step, (0..len).map(|k| tok(i + k)).collect(), mode));
        i += len;
        step += 1;
    }
    for _ in 0..decode {
        chunks.push((step, vec![tok(i)], LogitsMode::Last));
        i += 1;
        step += 1;
    }
    chunks
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every feed alone, then all together step by step; the first chunk whose logits differ.
fn first_difference(m: &Model) -> Option<String> {
    let v = m.n_vocab();
    let feeds = [
        plan(0, 0, &[9], 8, v),
        plan(1, 1, &[5, 3], 4, v),
        plan(2, 2, &[1, 17], 4, v),
        plan(3, 3, &[2], 6, v),
        plan(4, 5, &[11, 4], 3, v),
        plan(5, 2, &[3], 7, v),
        plan(6, 2, &[1], 7, v),
        plan(7, 3, &[6], 6, v),
        plan(8, 3, &[2], 6, v),
    ];
    let alone: Vec<Vec<Vec<f32>>> = feeds
        .iter()
        .map(|f| {
            let mut st = m.new_state();
            f.iter()
                .map(|(_, toks, mode)| m.forward(&mut st, toks, *mode).unwrap())
                .collect()
        })
        .collect();
    let mut states: Vec<_> = feeds.iter().map(|_| m.new_state()).collect();
    let last = feeds
        .iter()
        .flat_map(|f| f.iter().map(|c| c.0))
        .max()
        .unwrap();
    let mut widest = 0;
    for step in 0..=last {
        let mut who = Vec::new();
        let mut steps = Vec::new();
        for (s, (f, st)) in feeds.iter().zip(states.iter_mut()).enumerate() {
            if let Some(c) = f.iter().position(|c| c.0 == step) {
                who.push((s, c));
                steps.push(SeqStep::new(st, &f[c].1, f[c].2));
            }
        }
        widest = widest.max(steps.iter().filter(|s| s.tokens.len() == 1).count());
        let got = m.forward_batch(&mut steps).unwrap();
        for ((s, c), g) in who.into_iter().zip(got) {
            if bits(&g) != bits(&alone[s][c]) {
                return Some(format!(
                    "sequence {s}, chunk {c} ({} tokens) at step {step}",
                    feeds[s][c].1.len()
                ));
            }
        }
    }
    assert!(
        widest >= 8,
        "the schedule decodes at least 8 sequences at once"
    );
    None
}

#[test]
fn random_geometries_and_every_weight_type_are_batch_invariant() {
    use xwen_kernels::dispatch::{detected, Isa};
    let dir = std::env::temp_dir().join(format!("xwen-batch-random-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mixes = [
        "random", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k", "q4_k", "q5_k",
        "q6_k", "iq4_xs",
    ];
    // every kernel set this CPU runs, lowest first (the cap is process-wide, set at each load)
    let isas: Vec<Isa> = match detected() {
        Isa::Avx512 => vec![Isa::Scalar, Isa::Avx2, Isa::Avx512],
        Isa::Scalar => vec![Isa::Scalar],
        other => vec![Isa::Scalar, other],
    };
    let top = *isas.last().unwrap();
    let mut fails = Vec::new();
    let mut n = 0;
    for &isa in &isas {
        for (fi, family) in Family::ALL.into_iter().enumerate() {
            for (i, mix_name) in mixes.iter().enumerate() {
                // the lower kernel sets take every other type, alternating by family (CI time)
                if isa != top && (i + fi) % 2 == 1 {
                    continue;
                }
                // a different geometry per (family, type): many shapes for one run each
                let seed = 500 + 17 * i as u64;
                let g = random_geometry(family, seed);
                let path = dir.join(format!("{family}-{seed}-{mix_name}.gguf"));
                let mix = Mix::parse(mix_name, seed + 1).unwrap();
                write_geometry(&g, &format!("random-{family}-{seed}"), mix, &path, None, seed + 1, &mut |_| {}).unwrap();
                let cfg = EngineConfig { threads: 2, max_ctx: 256, max_isa: Some(isa), ..Default::default() };
                let m = Model::load(&path, &cfg).unwrap();
                if let Some(d) = first_difference(&m) {
                    fails.push(format!("{isa:?}: {family} seed {seed} {mix_name} ({}): {d}", describe(&g)));
                }
                n += 1;
                std::fs::remove_file(&path).ok();
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(fails.is_empty(), "{} of {n} models: batched logits differ from each sequence alone:\n{}", fails.len(), fails.join("\n"));
}
