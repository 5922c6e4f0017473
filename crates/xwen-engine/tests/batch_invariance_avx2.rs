//! Batch invariance in the AVX2 kernel set on any x86 CPU: the AVX2-only machines this runs
//! on in CI take other kernels for decode rows (no VNNI lanes, no padded Q8_0 group) than an
//! AVX-512 one, so on an AVX-512 CPU this binary caps the set (process-wide: its only test) and
//! holds several sequences decoded together to each decoded alone, bit for bit.

use std::path::{Path, PathBuf};
use xwen_engine::{EngineConfig, LogitsMode, Model, SeqStep};
use xwen_kernels::dispatch::{self, Isa};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity").join(rel)
}

#[test]
fn sequences_batched_equal_each_alone_in_the_avx2_set() {
    if !dispatch::supported(Isa::Avx2) {
        eprintln!("SKIP: this CPU has no AVX2 — NOT a pass");
        return;
    }
    dispatch::set_max_isa(Some(Isa::Avx2));
    let cfg = EngineConfig { threads: 2, max_ctx: 256, ..Default::default() };
    for rel in ["cond/qwen3_5/model-q4_k_m.gguf", "cond/qwen3_5/model-q8_0.gguf", "cond/qwen3_5_moe/model-q4_k_m.gguf"] {
        let m = Model::load(&fixture(rel), &cfg).unwrap();
        assert_eq!(dispatch::active(), Isa::Avx2);
        let v = m.n_vocab() as u32;
        // 9 sequences: prompts of 1..9 tokens, then 6 decode steps all together
        let prompts: Vec<Vec<u32>> = (0..9u32).map(|s| (0..=s).map(|i| (s * 131 + i * 17 + 3) % v).collect()).collect();
        let next = |s: usize, step: usize| ((s * 977 + step * 31 + 7) as u32) % v;
        let alone: Vec<Vec<Vec<u32>>> = prompts
            .iter()
            .enumerate()
            .map(|(s, p)| {
                let mut st = m.new_state();
                let mut out = vec![bits(&m.forward(&mut st, p, LogitsMode::Last).unwrap())];
                for step in 0..6 {
                    out.push(bits(&m.forward(&mut st, &[next(s, step)], LogitsMode::Last).unwrap()));
                }
                out
            })
            .collect();
        let mut states: Vec<_> = prompts.iter().map(|_| m.new_state()).collect();
        let mut steps: Vec<SeqStep> = states.iter_mut().zip(&prompts).map(|(st, p)| SeqStep::new(st, p, LogitsMode::Last)).collect();
        let first = m.forward_batch(&mut steps).unwrap();
        for (s, l) in first.iter().enumerate() {
            assert_eq!(bits(l), alone[s][0], "{rel}: sequence {s}'s prompt");
        }
        for step in 0..6 {
            let ids: Vec<[u32; 1]> = (0..9).map(|s| [next(s, step)]).collect();
            let mut steps: Vec<SeqStep> = states.iter_mut().zip(&ids).map(|(st, t)| SeqStep::new(st, t, LogitsMode::Last)).collect();
            for (s, l) in m.forward_batch(&mut steps).unwrap().iter().enumerate() {
                assert_eq!(bits(l), alone[s][step + 1], "{rel}: sequence {s}, decode step {step}");
            }
        }
    }
    dispatch::set_max_isa(None);
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
