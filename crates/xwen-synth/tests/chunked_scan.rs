//! The chunked (WY) form of the delta rule (`EngineConfig::chunked_prefill`, `--scan chunked`)
//! against the token-by-token recurrence that llama.cpp's CPU build runs, through whole f32
//! models of random geometry (`xwen synth --random`): Gated DeltaNet's scalar decay (qwen35,
//! qwen35moe, qwen3next) and KDA's per-channel decay (kimi-linear). The chunked form
//! reassociates the sums, so the logits agree to float rounding (rel-L2 6e-6 to 3e-5 measured;
//! a MoE router near-tie moves the most), not bit for bit — in f32, where
//! no activation quantizer amplifies an ulp into a rounding flip (a Q8_0 file gives ~2e-3).

use xwen_engine::{EngineConfig, LogitsMode, Model};
use xwen_synth::{describe, random_geometry, write_geometry, Family, Mix};

fn logits(path: &std::path::Path, chunked: bool, tokens: &[u32]) -> Vec<f32> {
    let cfg = EngineConfig { threads: 2, max_ctx: 512, chunked_prefill: chunked, ..Default::default() };
    let m = Model::load(path, &cfg).unwrap();
    let mut st = m.new_state();
    let mut out = m.forward(&mut st, tokens, LogitsMode::All).unwrap();
    // a decode step after the prefill: the state the chunked form left must be the recurrence's
    out.extend(m.forward(&mut st, &tokens[..1], LogitsMode::Last).unwrap());
    out
}

#[test]
fn chunked_prefill_equals_the_recurrence() {
    let dir = std::env::temp_dir().join(format!("xwen-chunked-scan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for family in Family::ALL {
        for seed in [0u64, 1] {
            let g = random_geometry(family, seed);
            let path = dir.join(format!("{family}-{seed}.gguf"));
            write_geometry(&g, "chunked", Mix::parse("f32", seed).unwrap(), &path, None, seed + 1, &mut |_| {}).unwrap();
            // 150 tokens: two whole chunks of 64 and a partial one
            let vocab = 200u32;
            let tokens: Vec<u32> = (0..150u32).map(|i| (i * 7919 + 13 + seed as u32) % vocab + 1).collect();
            let a = logits(&path, false, &tokens);
            let b = logits(&path, true, &tokens);
            assert_ne!(a, b, "{family} {seed}: the chunked form did not run (identical bits)");
            let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
            let rel = (num / den).sqrt();
            eprintln!("{family} {seed}: rel-L2 {rel:.2e} ({})", describe(&g));
            assert!(rel < 1e-4, "{family} {seed}: chunked vs recurrent rel-L2 {rel:.3e} ({})", describe(&g));
            std::fs::remove_file(&path).ok();
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
