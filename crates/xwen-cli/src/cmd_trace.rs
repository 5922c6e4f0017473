//! `xwen trace -m MODEL -p PROMPT [-n N] -o TRACE.jsonl`: a greedy run whose every MoE routing
//! decision is written down — a header line (the model's expert geometry), then one line per
//! position and layer with the chosen experts in selection order — for `xwen replay` and
//! `xwen plan --trace`.

use crate::cli::TraceArgs;
use crate::model_arg;
use anyhow::{bail, Context, Result};
use xwen_engine::LogitsMode;

pub fn run(a: TraceArgs) -> Result<()> {
    a.engine.cpu_only("trace");
    let mut cfg = a.engine.engine_config()?;
    cfg.record_routes = true;
    let loaded = model_arg::load(a.model.as_deref(), cfg, &a.engine)?;
    let model = &loaded.model;
    let Some((n_expert, n_used, moe_layers)) = model.moe_geometry() else {
        bail!("{} has no routed experts: nothing to trace", model.architecture());
    };
    let text = match (&a.prompt, &a.file) {
        (_, Some(f)) => String::from_utf8_lossy(&crate::opts::read_input(f)?).into_owned(),
        (Some(p), None) => p.clone(),
        (None, None) => bail!("give a prompt: -p TEXT or -f FILE"),
    };
    let mut ids = loaded.tokenizer.encode(&text);
    if ids.is_empty() {
        bail!("the prompt has no tokens");
    }
    let mut st = model.new_state();
    let mut logits = model.forward(&mut st, &ids, LogitsMode::Last)?;
    for _ in 0..a.n_predict {
        if st.pos >= model.max_context() {
            break;
        }
        let next = xwen_engine::sampler::argmax(&logits);
        ids.push(next);
        logits = model.forward(&mut st, &[next], LogitsMode::Last)?;
    }
    let routes = model.take_routes();
    let mut out = serde_json::json!({
        "xwen_trace": 1,
        "architecture": model.architecture(),
        "n_expert": n_expert,
        "n_used": n_used,
        "moe_layers": moe_layers,
        "positions": st.pos,
    })
    .to_string();
    out.push('\n');
    for r in &routes {
        let mut line = serde_json::json!({"pos": r.pos, "layer": r.layer, "experts": r.experts});
        if let Some((nl, g)) = &r.next_guess {
            // what a streamed decode prefetches for the next MoE layer from this one's input
            line["guess"] = serde_json::json!({"layer": nl, "experts": g});
        }
        out += &line.to_string();
        out.push('\n');
    }
    std::fs::write(&a.out, out).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("xwen trace: {} positions, {} routing decisions -> {}", st.pos, routes.len(), a.out.display());
    Ok(())
}

/// Reads a trace file written by `run`.
pub fn read(path: &std::path::Path) -> Result<xwen_engine::experts::replay::Trace> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let head: serde_json::Value = serde_json::from_str(lines.next().unwrap_or("")).with_context(|| format!("{}: not an xwen trace (no header line)", path.display()))?;
    if head.get("xwen_trace").and_then(|v| v.as_u64()) != Some(1) {
        bail!("{}: not an xwen trace (its first line has no \"xwen_trace\": 1)", path.display());
    }
    let field = |k: &str| head.get(k).and_then(|v| v.as_u64()).map(|v| v as usize).with_context(|| format!("{}: header without {k}", path.display()));
    let (n_expert, n_used, moe_layers) = (field("n_expert")?, field("n_used")?, field("moe_layers")?);
    let mut routes = Vec::new();
    for (i, l) in lines.enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).with_context(|| format!("{}: line {} is not JSON", path.display(), i + 2))?;
        let get = |k: &str| v.get(k).and_then(|x| x.as_u64()).map(|x| x as usize);
        let (Some(pos), Some(layer), Some(experts)) = (get("pos"), get("layer"), v.get("experts").and_then(|e| e.as_array())) else {
            bail!("{}: line {} lacks pos, layer or experts", path.display(), i + 2);
        };
        let experts: Vec<usize> = experts.iter().filter_map(|e| e.as_u64()).map(|e| e as usize).collect();
        if experts.iter().any(|&e| e >= n_expert) {
            bail!("{}: line {} names an expert beyond the header's {n_expert}", path.display(), i + 2);
        }
        let next_guess = match v.get("guess") {
            None => None,
            Some(g) => {
                let (Some(gl), Some(ge)) = (g.get("layer").and_then(|x| x.as_u64()), g.get("experts").and_then(|e| e.as_array())) else {
                    bail!("{}: line {}'s guess lacks layer or experts", path.display(), i + 2);
                };
                let ge: Vec<usize> = ge.iter().filter_map(|e| e.as_u64()).map(|e| e as usize).collect();
                if ge.iter().any(|&e| e >= n_expert) {
                    bail!("{}: line {}'s guess names an expert beyond the header's {n_expert}", path.display(), i + 2);
                }
                Some((gl as usize, ge))
            }
        };
        routes.push(xwen_engine::Route { seq: 0, pos, layer, experts, weights: Vec::new(), margin: 0.0, next_guess });
    }
    Ok(xwen_engine::experts::replay::Trace::from_routes(&routes, n_expert, n_used, moe_layers))
}
