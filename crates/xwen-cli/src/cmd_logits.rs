//! `xwen logits -m MODEL --ids 1,2,3 --out FILE.npy [--dump-routes FILE.jsonl]`: float32
//! logits of every position, shape [n_ids, n_vocab] — the interface the parity tooling relies
//! on — and, for a MoE model, every routing decision (one JSON line per position and layer:
//! pos, layer, experts, weights, margin), which tools/oracle/route_diff.py compares. With
//! `-ngl 99` the logits are the GPU's (the routes and tensors are recorded on the CPU only).

use crate::cli::LogitsArgs;
use crate::{model_arg, npy};
use anyhow::{bail, Context, Result};
use xwen_engine::LogitsMode;

pub fn run(a: LogitsArgs) -> Result<()> {
    let mut cfg = a.engine.engine_config()?;
    cfg.record_routes = a.dump_routes.is_some();
    cfg.record_taps = a.dump_tensors.is_some();
    let (model, ids, out, routes_out) = (a.model.clone(), a.ids.clone(), a.out.clone(), a.dump_routes.clone());
    let ids = model_arg::parse_ids(&ids)?;
    if ids.is_empty() {
        bail!("--ids is empty");
    }
    let mut loaded = model_arg::load(model.as_deref(), cfg, &a.engine)?;
    crate::gpu::place(&a.engine, &mut loaded.model)?;
    if loaded.model.device().is_some() && (routes_out.is_some() || a.dump_tensors.is_some()) {
        bail!("--dump-routes and --dump-tensors record the CPU's passes: run them with -ngl 0");
    }
    let mut st = loaded.model.new_state();
    let logits = loaded.model.forward(&mut st, &ids, LogitsMode::All)?;
    npy::write_f32(&out, &[ids.len(), loaded.model.n_vocab()], &logits)
        .with_context(|| format!("writing {}", out.display()))?;
    if let Some(path) = routes_out {
        let mut text = String::new();
        for r in loaded.model.take_routes() {
            text += &serde_json::json!({"pos": r.pos, "layer": r.layer, "experts": r.experts, "weights": r.weights, "margin": r.margin}).to_string();
            text.push('\n');
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dir) = &a.dump_tensors {
        let filters: Vec<&str> = a.dump_filter.as_deref().map(|f| f.split(',').filter(|s| !s.is_empty()).collect()).unwrap_or_default();
        write_taps(dir, &loaded.model.take_taps(), &filters).with_context(|| format!("writing {}", dir.display()))?;
    }
    Ok(())
}

/// DIR/NAME.bin (raw little-endian float32) per tap and DIR/index.txt in computation order, as
/// tools/oracle/llama_dump.cpp writes llama.cpp's; a name recorded twice keeps its last value.
fn write_taps(dir: &std::path::Path, taps: &[xwen_engine::ctx::Tap], filters: &[&str]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut index = String::new();
    let mut seen = std::collections::HashSet::new();
    for t in taps.iter().filter(|t| filters.is_empty() || filters.iter().any(|f| t.name.contains(f))) {
        let bytes: Vec<u8> = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dir.join(format!("{}.bin", t.name)), bytes)?;
        if seen.insert(t.name.clone()) {
            index += &format!("{} {} {} 1 1\n", t.name, t.width, t.data.len() / t.width.max(1));
        }
    }
    std::fs::write(dir.join("index.txt"), index)?;
    Ok(())
}
