//! The MTP draft head against llama.cpp (tools/oracle/llama_mtp.cpp on the random qwen35
//! fixture, whose GGUF carries a nextn block): the trunk's hidden rows after output_norm, the
//! head's logits over a prompt in the drafting pairing (token k with the trunk's hidden k−1,
//! zeros for the first), and a 4-step greedy draft chain (each step fed the head's own hidden)
//! — all bit for bit, with the fixtures' settings (f32 KV cache, flash attention off).

use std::path::{Path, PathBuf};
use xwen_engine::{EngineConfig, LogitsMode, Model, SeqStep};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel)
}

/// A float32 .npy as llama_mtp writes it (v1 header, C order): (rows, cols, data).
fn npy(path: &Path) -> (usize, usize, Vec<f32>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..6], b"\x93NUMPY", "{}", path.display());
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(header.contains("'<f4'"), "{header}");
    let s = header.find("'shape': (").unwrap() + 10;
    let e = s + header[s..].find(')').unwrap();
    let dims: Vec<usize> = header[s..e].split(',').map(str::trim).filter(|t| !t.is_empty()).map(|t| t.parse().unwrap()).collect();
    let data: Vec<f32> = b[10 + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(data.len(), dims[0] * dims[1]);
    (dims[0], dims[1], data)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn first_diff(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(a.len(), b.len(), "xwen gave {} values, llama.cpp {}", a.len(), b.len());
    assert!(!a.is_empty());
    a.iter().zip(b).enumerate().find(|(_, (x, y))| x.to_bits() != y.to_bits()).map(|(i, (x, y))| (i, *x, *y))
}

/// The committed references come from an AVX2 llama.cpp build: on an AVX-512 CPU xwen runs
/// that build's float orders (as the parity suite does).
fn reproduce_the_fixtures_build() {
    use xwen_kernels::dispatch::{self, Isa};
    if dispatch::detected() == Isa::Avx512 {
        dispatch::set_max_isa(Some(Isa::Avx2));
    }
}

#[test]
fn mtp_head_is_bit_identical_to_llama_cpp() {
    reproduce_the_fixtures_build();
    // dense: the file's own nextn block
    check("mtp/rand-qwen35", "parity/rand/qwen3_5/model-q8_0.gguf", None, None);
    // MoE (routed experts, gated shared expert): a sidecar with only the head
    // (tools/oracle/add_nextn.py --sidecar), mapped and with the trunk's experts streamed
    let moe = "parity/cond/qwen3_5_moe/model-q8_0.gguf";
    check("mtp/cond-qwen35moe", moe, Some("mtp/cond-qwen35moe/mtp-q8_0.gguf"), None);
    check("mtp/cond-qwen35moe", moe, Some("mtp/cond-qwen35moe/mtp-q8_0.gguf"), Some(200 << 20));
}

/// qwen4exp's head reads (and chains) the trunk's hc-wide residual before the final mixer, and
/// runs a QSA layer with hyper-connections and MoE: a sidecar converted by llama.cpp's converter
/// from an MTP block added to cond/qwen4exp's checkpoint (tools/oracle/qwen4exp_mtp.py), beside
/// the committed trunk, mapped and with the trunk's experts and PLE rows streamed. The 64-token
/// prompt makes the head's own QSA select.
#[test]
fn qwen4exp_mtp_head_is_bit_identical_to_llama_cpp() {
    reproduce_the_fixtures_build();
    let trunk = "parity/cond/qwen4exp/model-q8_0.gguf";
    let sidecar = Some("mtp/cond-qwen4exp/mtp-q8_0.gguf");
    check("mtp/cond-qwen4exp", trunk, sidecar, None);
    check("mtp/cond-qwen4exp", trunk, sidecar, Some(200 << 20));
    // the same head inside a full file (trunk + nextn block; 9 MB, not committed): the same records
    let cache = std::env::var_os("XWEN_CACHE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/xwen"));
    let full = cache.join("oracle/cond/qwen4exp/full-q8_0.gguf");
    if full.exists() {
        check("mtp/cond-qwen4exp", full.to_str().unwrap(), None, None);
    } else {
        eprintln!("SKIP the in-file qwen4exp head: {} is missing (tools/oracle/qwen4exp_mtp.py --full makes it)", full.display());
    }
}

#[test]
fn bad_sidecars_are_refused_and_leave_the_model_as_it_was() {
    let cfg = EngineConfig { threads: 1, max_ctx: 64, ..Default::default() };
    let mut dense = Model::load(&repo("parity/cond/qwen3_5/model-q8_0.gguf"), &cfg).unwrap();
    assert!(!dense.has_mtp());
    // a file without a nextn block
    let e = dense.attach_mtp(&repo("parity/cond/qwen3_5/model-q8_0.gguf")).unwrap_err().to_string();
    assert!(e.contains("no MTP"), "{e}");
    // not a GGUF at all
    let e = dense.attach_mtp(&repo("mtp/rand-qwen35/prompts.txt")).unwrap_err().to_string();
    assert!(!e.is_empty());
    assert!(!dense.has_mtp(), "a refused sidecar leaves the model as it was");
    // a head of another vocabulary: the demo model (4096 tokens) and the random fixture's (512)
    let mut demo = Model::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo/tiny-qwen35-q4_k_m.gguf"), &cfg).unwrap();
    let e = demo.attach_mtp(&repo("parity/rand/qwen3_5/model-q8_0.gguf")).unwrap_err().to_string();
    assert!(e.contains("vocabulary"), "{e}");
    assert!(!demo.has_mtp());
    // the MoE head attaches to a model of its geometry (width and vocabulary match here too)
    dense.attach_mtp(&repo("mtp/cond-qwen35moe/mtp-q8_0.gguf")).unwrap();
    assert!(dense.has_mtp());
    // under a budget a sidecar comes with the load (the plan counts it), never after
    let moe = repo("parity/cond/qwen3_5_moe/model-q8_0.gguf");
    let mut budgeted = Model::load(&moe, &EngineConfig { ram_budget: Some(200 << 20), ..cfg.clone() }).unwrap();
    let e = budgeted.attach_mtp(&repo("mtp/cond-qwen35moe/mtp-q8_0.gguf")).unwrap_err().to_string();
    assert!(e.contains("RAM budget"), "{e}");
    let bad = EngineConfig { ram_budget: Some(200 << 20), mtp_sidecar: Some(repo("parity/cond/qwen3_5/model-q8_0.gguf")), ..cfg };
    let e = Model::load(&moe, &bad).err().expect("a sidecar without a head is refused at load").to_string();
    assert!(e.contains("no MTP"), "{e}");
}

fn check(dir: &str, model: &str, sidecar: Option<&str>, budget: Option<u64>) {
    let dir = repo(dir);
    let cfg = EngineConfig { threads: 2, max_ctx: 256, ram_budget: budget, ..EngineConfig::default().with_f32_cache_no_flash() };
    let model = Model::load(&repo(model), &EngineConfig { mtp_sidecar: sidecar.map(repo), ..cfg }).unwrap();
    assert_eq!(model.streams_experts(), budget.is_some());
    assert!(model.has_mtp(), "the fixture's nextn block was not loaded");
    let h = model.hidden_width();
    let prompts = std::fs::read_to_string(dir.join("prompts.txt")).unwrap();
    let drafts_ref = std::fs::read_to_string(dir.join("drafts.txt")).unwrap();
    for (p, line) in prompts.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let ids: Vec<u32> = line.split_whitespace().map(|t| t.parse().unwrap()).collect();
        let n = ids.len();
        // the trunk's hidden rows, every row, and its last logits
        let mut st = model.new_state();
        let out = {
            let mut step = [SeqStep { state: &mut st, tokens: &ids, logits: LogitsMode::Last, decode_order: false, hidden: true, banned: &[] }];
            model.forward_batch_out(&mut step).unwrap().pop().unwrap()
        };
        let (rows, cols, href) = npy(&dir.join(format!("p{p}.h.npy")));
        assert_eq!((rows, cols), (n, h));
        assert_eq!(first_diff(&out.hidden, &href), None, "p{p}: trunk hidden (index, xwen, llama.cpp)");

        // the head over the prompt: token k with hidden k-1, zeros first
        let mut h_in = vec![0.0f32; h];
        h_in.extend_from_slice(&out.hidden[..(n - 1) * h]);
        let mut ms = model.new_mtp_state().unwrap();
        let m = model.mtp_forward(&mut ms, &ids, &h_in, 0..n).unwrap();
        let (_, _, mref) = npy(&dir.join(format!("p{p}.mtp.npy")));
        assert_eq!(first_diff(&m.logits, &mref), None, "p{p}: MTP logits over the prompt");

        // the draft chain from the prompt's end
        let (d, v, dref) = npy(&dir.join(format!("p{p}.draft.npy")));
        let mut tok = argmax(&out.logits);
        let mut hp = out.hidden[(n - 1) * h..].to_vec();
        let mut drafts = Vec::new();
        for s in 0..d {
            let o = model.mtp_forward(&mut ms, &[tok], &hp, 0..1).unwrap();
            assert_eq!(first_diff(&o.logits, &dref[s * v..(s + 1) * v]), None, "p{p}: draft step {s}");
            tok = argmax(&o.logits);
            drafts.push(tok.to_string());
            hp = o.hidden;
        }
        let want = drafts_ref.lines().find_map(|l| l.strip_prefix(&format!("p{p} drafts: "))).unwrap();
        assert_eq!(drafts.join(" "), want, "p{p}: drafted tokens");

        // the same chain from a head that wrote only the prompt's KV rows (a drafter catching
        // up on kept rows skips their attention, FFN and logits): the same bits
        let mut kv_only = model.new_mtp_state().unwrap();
        model.mtp_write_kv(&mut kv_only, &ids[..n - 1], &h_in[..(n - 1) * h]).unwrap();
        // the prompt's last row in full, as the chain's first step would follow it
        let last = model.mtp_forward(&mut kv_only, &ids[n - 1..], &h_in[(n - 1) * h..], 0..1).unwrap();
        assert_eq!(first_diff(&last.logits, &mref[(n - 1) * v..]), None, "p{p}: the last prompt row after a KV-only catch-up");
        let (mut tok, mut hp) = (argmax(&out.logits), out.hidden[(n - 1) * h..].to_vec());
        for s in 0..d {
            let o = model.mtp_forward(&mut kv_only, &[tok], &hp, 0..1).unwrap();
            assert_eq!(first_diff(&o.logits, &dref[s * v..(s + 1) * v]), None, "p{p}: draft step {s} after a KV-only catch-up");
            tok = argmax(&o.logits);
            hp = o.hidden;
        }
    }
}
