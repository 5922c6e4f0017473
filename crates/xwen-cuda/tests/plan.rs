//! What the CUDA backend would hold on a device, by part, read off a file with no device: the
//! parts add up to what `load` allocates, a MoE model's routed experts are apart from its
//! trunk, and a VRAM budget is checked against them (everything resident today; under the
//! floor and in between refused, each with its parts named). Runs everywhere, GPU or not.

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
    let exps: u64 = moe.tensors().iter().filter(|t| t.name.contains("_exps.")).map(|t| t.n_bytes).sum();
    assert_eq!(p.expert_bytes, exps, "the routed experts are the *_exps tensors");
    assert!(p.n_used > 0 && p.one_expert_bytes > 0 && p.one_expert_bytes * p.n_used as u64 <= p.expert_bytes);
    assert!(p.floor() > p.resident_bytes() && p.floor() < p.total());
    assert_eq!(p.check_budget(p.total()), Ok(()));
    let under = p.check_budget(p.floor() - 1).unwrap_err();
    assert!(under.contains("below the floor") && under.contains("trunk") && under.contains("scratch"), "{under}");
    let between = p.check_budget(p.floor()).unwrap_err();
    assert!(between.contains("not built yet") && between.contains("-ngl 0"), "{between}");

    // a dense model: nothing routed, so its floor is all of it
    let dense = device_plan(&fixture("qwen3_5/model-q4_k_m.gguf"), &opts).unwrap();
    assert_eq!((dense.expert_bytes, dense.floor()), (0, dense.total()));
    assert!(dense.check_budget(dense.total() - 1).unwrap_err().contains("below the floor"));

    // another architecture: the backend says it does not run it
    let err = device_plan(&fixture("kimi_linear/model-q8_0.gguf"), &opts).unwrap_err().to_string();
    assert!(err.contains("qwen35"), "{err}");
}
