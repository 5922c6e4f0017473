//! `xwen logits -m MODEL --ids 1,2,3 --out FILE.npy [--dump-routes FILE.jsonl]`: float32
//! logits of every position, shape [n_ids, n_vocab] — the interface the parity tooling relies
//! on — and, for a MoE model, every routing decision (one JSON line per position and layer:
//! pos, layer, experts, weights, margin), which tools/oracle/route_diff.py compares.

use crate::args::Args;
use crate::{model_arg, npy};
use anyhow::{bail, Context, Result};
use xwen_engine::LogitsMode;

pub fn run(argv: &[String]) -> Result<()> {
    let mut a = Args::new(argv);
    let model = a.value(&["-m", "--model"])?;
    let ids = a.value(&["--ids"])?.context("--ids is required")?;
    let out = a.value(&["--out", "-o"])?.context("--out FILE.npy is required")?;
    let routes_out = a.value(&["--dump-routes"])?;
    let mut cfg = model_arg::engine_config(&mut a)?;
    cfg.record_routes = routes_out.is_some();
    let rest = a.finish()?;
    if !rest.is_empty() {
        bail!("unexpected argument `{}`", rest[0]);
    }
    let ids = model_arg::parse_ids(&ids)?;
    if ids.is_empty() {
        bail!("--ids is empty");
    }
    let loaded = model_arg::load(model.as_deref(), &cfg, false)?;
    let mut st = loaded.model.new_state();
    let logits = loaded.model.forward(&mut st, &ids, LogitsMode::All)?;
    npy::write_f32(std::path::Path::new(&out), &[ids.len(), loaded.model.n_vocab()], &logits)
        .with_context(|| format!("writing {out}"))?;
    if let Some(path) = routes_out {
        let mut text = String::new();
        for r in loaded.model.take_routes() {
            text += &serde_json::json!({"pos": r.pos, "layer": r.layer, "experts": r.experts, "weights": r.weights, "margin": r.margin}).to_string();
            text.push('\n');
        }
        std::fs::write(&path, text).with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}
