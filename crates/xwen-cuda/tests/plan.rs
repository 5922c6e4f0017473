//! What the CUDA backend would hold on a device, by part, read off a file with no device: the
//! parts add up to what `load` allocates, a MoE model's routed experts are apart from its
//! trunk, and a VRAM budget is checked against them (everything resident, or the routed
//! experts in a VRAM cache of as many slots a layer as the budget holds; under the floor
//! refused with the parts named). Runs everywhere, GPU or not.

use std::path::PathBuf;
use xwen_cuda::{device_bytes_needed, device_plan, CudaOptions};
use xwen_gguf::GgufFile;

fn fixture(rel: &str) -> GgufFile {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond").join(rel);
    GgufFile::open(&p).unwrap_or_else(|e| panic!("committed fixture {}: {e}", p.display()))
}

#[test]
fn the_device_plan_adds_up_and_checks_a_vram_budget() {
    let opts = CudaOptions { n_ctx: 1024, ..Default::default() };
    let moe = fixture("qwen3_5_moe/model-q4_k_m.gguf");
    let p = device_plan(&moe, &opts).unwrap();
    assert_eq!(p.total(), device_bytes_needed(&moe, &opts).unwrap(), "the parts are what load allocates");
    // the device layout pads Q8_0 (34 → 36 bytes a block) and Q6_K (210 → 224)
    let dev = |t: &xwen_gguf::TensorInfo| match t.ty {
        xwen_gguf::GgmlType::Q8_0 => t.n_bytes / 34 * 36,
        xwen_gguf::GgmlType::Q6_K => t.n_bytes / 210 * 224,
        _ => t.n_bytes,
    };
    let exps: u64 = moe.tensors().iter().filter(|t| t.name.contains("_exps.")).map(dev).sum();
    assert_eq!(p.expert_bytes, exps, "the routed experts are the *_exps tensors");
    assert!(p.n_used > 0 && p.one_expert_bytes > 0 && p.one_expert_bytes * p.n_used as u64 <= p.expert_bytes);
    // a slot in every layer, times the experts, is all of them (each matrix 256-byte aligned in a slot)
    let layers = moe.tensors().iter().filter(|t| t.name.contains("ffn_gate_exps.")).count() as u64;
    let all = p.expert_slot_bytes * p.n_expert as u64;
    assert!(all >= p.expert_bytes && all - p.expert_bytes < 3 * 256 * p.n_expert as u64 * layers, "{all} against {}", p.expert_bytes);
    assert!(p.floor() > p.resident_bytes() && p.floor() < p.total());
    assert_eq!(p.check_budget(p.total()), Ok(()));
    assert_eq!((p.expert_slots(None), p.expert_slots(Some(p.total())), p.held_bytes(Some(p.total()))), (p.n_expert, p.n_expert, p.total()));
    let under = p.check_budget(p.floor() - 1).unwrap_err();
    assert!(under.contains("below the floor") && under.contains("trunk") && under.contains("scratch"), "{under}");
    // from the floor up: a cache of as many slots a layer as the budget holds, never more bytes
    assert_eq!(p.check_budget(p.floor()), Ok(()));
    assert_eq!(p.expert_slots(Some(p.floor())), p.n_used);
    for b in [p.floor(), (p.floor() + p.total()) / 2, p.total() - 1] {
        let slots = p.expert_slots(Some(b));
        assert!(slots >= p.n_used && slots < p.n_expert && p.held_bytes(Some(b)) <= b, "budget {b}: {slots} slots, {} held", p.held_bytes(Some(b)));
        assert!(p.tiers(Some(b)).contains(&format!("{slots} of {} experts", p.n_expert)), "{}", p.tiers(Some(b)));
    }

    // a dense model: nothing routed, so its floor is all of it
    let dense = device_plan(&fixture("qwen3_5/model-q4_k_m.gguf"), &opts).unwrap();
    assert_eq!((dense.expert_bytes, dense.floor()), (0, dense.total()));
    assert!(dense.check_budget(dense.total() - 1).unwrap_err().contains("below the floor"));

    // another architecture: the backend says it does not run it
    let err = device_plan(&fixture("kimi_linear/model-q8_0.gguf"), &opts).unwrap_err().to_string();
    assert!(err.contains("qwen35"), "{err}");
}

/// The MTP head a run drafts with counts on the device as its block, what it does not share
/// with the trunk, and its KV rows for each sequence (`mtp_plan_bytes`, what `xwen plan -ngl 99
/// --draft mtp:HEAD` shows and the head's upload checks against the card).
#[test]
fn an_mtp_heads_device_share_is_its_block_and_its_kv() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let trunk_path = root.join("../shared/models/gguf/tiny-qwen35moe-q4_k_m.gguf");
    if !trunk_path.exists() {
        eprintln!("SKIPPED: {} is not beside the repository", trunk_path.display());
        return;
    }
    let trunk = std::sync::Arc::new(GgufFile::open(&trunk_path).unwrap());
    let sidecar = root.join("tests/fixtures/mtp/trained/mtp-tiny-qwen35moe-q8_0.gguf");
    let cfg = xwen_engine::EngineConfig { mtp_sidecar: Some(sidecar.clone()), ..Default::default() };
    let head = xwen_engine::mtp_head_for_plan(&trunk, &cfg).unwrap().expect("the sidecar's head");
    let at = |n_seq: usize| xwen_cuda::mtp_plan_bytes(&head, &trunk, &CudaOptions { n_ctx: 1024, n_seq, ..Default::default() }).unwrap();
    // one sequence's KV rows: 1024 positions of 2 KV heads of 64, f16 K and V
    let kv = 1024 * 2 * 64 * 4;
    assert_eq!(at(2) - at(1), kv, "a sequence more is its KV rows");
    let weights = at(1) - kv;
    let file_bytes: u64 = GgufFile::open(&sidecar).unwrap().tensors().iter().map(|t| t.n_bytes).sum();
    // the block's Q8_0 padded on the device (34 → 36 bytes a block); the sidecar's copies of the
    // trunk's embedding and output are shared, not counted again
    assert!(weights > 0 && weights <= file_bytes * 36 / 34, "{weights} of the sidecar's {file_bytes}");
}

/// A file with its own MTP (nextn) block: the block is not the trunk's (the model goes up
/// without it), and is the head's share when a run drafts with it.
#[test]
fn a_files_own_mtp_block_counts_with_the_head_not_the_trunk() {
    let file = std::sync::Arc::new(fixture("../rand/qwen3_5/model-q8_0.gguf"));
    let opts = CudaOptions { n_ctx: 256, ..Default::default() };
    let plan = device_plan(&file, &opts).unwrap();
    let dev = |t: &xwen_gguf::TensorInfo| match t.ty {
        xwen_gguf::GgmlType::Q8_0 => t.n_bytes / 34 * 36,
        xwen_gguf::GgmlType::Q6_K => t.n_bytes / 210 * 224,
        _ => t.n_bytes,
    };
    // block_count 5 with one nextn layer: blk.4 is the head's
    let (head_block, all): (u64, u64) = file.tensors().iter().fold((0, 0), |(h, a), t| (h + if t.name.starts_with("blk.4.") { dev(t) } else { 0 }, a + dev(t)));
    assert!(head_block > 0, "the fixture carries its head's block");
    assert_eq!(plan.trunk_bytes + plan.expert_bytes, all - head_block, "the trunk without the head's block");
    let cfg = xwen_engine::EngineConfig::default();
    let head = xwen_engine::mtp_head_for_plan(&file, &cfg).unwrap().expect("the file's own head");
    let kv = 256 * file.get_u64("qwen35.attention.head_count_kv").unwrap() * file.get_u64("qwen35.attention.key_length").unwrap() * 4;
    // the head's block (its embedding and output are the trunk's own tensors: not counted again)
    assert_eq!(xwen_cuda::mtp_plan_bytes(&head, &file, &opts).unwrap(), head_block + kv);
}
