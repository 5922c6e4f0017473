//! Qwen3-Next GGUFs come in two DeltaNet layouts: today's converter writes `attn_qkv` (q, k, v of
//! every head) and `attn_gate` (z); the first conversions wrote one fused `ssm_in` per layer in the
//! checkpoint's own order, per K-head [q | k | v·r | z·r]. llama.cpp b11434 loads both
//! (qwen3next.cpp `build_qkvz`) and, on the oracle's fixtures, gives the same logits bit for bit
//! from both (tools/oracle/arch_refs.sh checks it). This test builds the legacy file from the
//! committed Q8_0 fixture — its matrices' rows permuted as bytes, which a row-wise quantization
//! allows exactly — and holds xwen's logits on it to the current layout's, bit for bit.

use std::path::{Path, PathBuf};
use xwen_engine::{EngineConfig, LogitsMode, Model};
use xwen_gguf::{GgufFile, GgufWriter};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond/qwen3_next")
}

/// The prompts of a fixture's cases.txt.
fn prompts(dir: &Path) -> Vec<Vec<u32>> {
    std::fs::read_to_string(dir.join("cases.txt"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("prompt "))
        .map(|l| l.split_whitespace().skip(2).map(|x| x.parse().unwrap()).collect())
        .collect()
}

/// `f` rewritten with each DeltaNet layer's attn_qkv + attn_gate fused into the legacy ssm_in.
fn legacy_layout(f: &GgufFile) -> Vec<u8> {
    let arch = f.architecture().unwrap().to_string();
    let u = |k: &str| f.get_u64(&format!("{arch}.{k}")).unwrap() as usize;
    let (hk, nk, nv) = (u("ssm.state_size"), u("ssm.group_count"), u("ssm.time_step_rank"));
    let hv = u("ssm.inner_size") / nv;
    let r = nv / nk;
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add_kv(k, v.clone());
    }
    let mut fused = 0;
    for t in f.tensors() {
        if t.name.ends_with(".attn_gate.weight") {
            continue;
        }
        let data = f.tensor_data(t);
        let Some(gate) = t.name.strip_suffix(".attn_qkv.weight").and_then(|b| f.tensor(&format!("{b}.attn_gate.weight"))) else {
            w.add_tensor(&t.name, t.ty, &t.dims, data.to_vec()).unwrap();
            continue;
        };
        assert_eq!(t.ty, gate.ty, "{}: attn_qkv and attn_gate of one type", t.name);
        let rb = t.ty.row_bytes(t.dims[0]).unwrap() as usize;
        let (qkv, z) = (data, f.tensor_data(gate));
        let rows = |src: &[u8], from: usize, n: usize| src[from * rb..(from + n) * rb].to_vec();
        let mut out = Vec::with_capacity(qkv.len() + z.len());
        for kh in 0..nk {
            out.extend(rows(qkv, kh * hk, hk)); // q
            out.extend(rows(qkv, nk * hk + kh * hk, hk)); // k
            out.extend(rows(qkv, 2 * nk * hk + kh * r * hv, r * hv)); // v of its r V-heads
            out.extend(rows(z, kh * r * hv, r * hv)); // z of its r V-heads
        }
        let n_rows = t.dims[1] + gate.dims[1];
        w.add_tensor(&t.name.replace("attn_qkv", "ssm_in"), t.ty, &[t.dims[0], n_rows], out).unwrap();
        fused += 1;
    }
    assert!(fused > 0, "no DeltaNet layer in the fixture");
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    bytes
}

#[test]
fn the_legacy_ssm_in_layout_gives_the_current_layouts_logits() {
    let dir = fixture();
    let current = dir.join("model-q8_0.gguf");
    let f = GgufFile::open(&current).unwrap();
    let legacy = std::env::temp_dir().join(format!("xwen-qwen3next-legacy-{}.gguf", std::process::id()));
    std::fs::write(&legacy, legacy_layout(&f)).unwrap();
    assert!(GgufFile::open(&legacy).unwrap().tensors().iter().any(|t| t.name.ends_with(".ssm_in.weight")));

    let cfg = EngineConfig { threads: 2, max_ctx: 512, ..EngineConfig::default() };
    let (a, b) = (Model::load(&current, &cfg).unwrap(), Model::load(&legacy, &cfg).unwrap());
    for (i, p) in prompts(&dir).iter().enumerate() {
        let (mut sa, mut sb) = (a.new_state(), b.new_state());
        let la = a.forward(&mut sa, p, LogitsMode::All).unwrap();
        let lb = b.forward(&mut sb, p, LogitsMode::All).unwrap();
        assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()), "prompt {i}: prefill logits differ");
        // and decode rows (the one-token kernels)
        for step in 0..4u32 {
            let t = [(step * 37 + 5) % a.n_vocab() as u32];
            let (da, db) = (a.forward(&mut sa, &t, LogitsMode::Last).unwrap(), b.forward(&mut sb, &t, LogitsMode::Last).unwrap());
            assert!(da.iter().zip(&db).all(|(x, y)| x.to_bits() == y.to_bits()), "prompt {i}: decode step {step} differs");
        }
    }
    let _ = std::fs::remove_file(&legacy);
}
