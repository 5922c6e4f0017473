//! `xwen replay TRACE.jsonl [--cache 25,50,75]`: the expert-cache hit rate of LRU, of the
//! shipped policy, of the static top-k (the run's most used records, known in advance) and of
//! Belady's optimum on one routing trace, at each share of the model's experts cached
//! (`xwen_engine::experts::replay`).

use crate::cli::ReplayArgs;
use anyhow::{bail, Result};
use xwen_engine::experts::replay::Policy;

pub fn run(a: ReplayArgs) -> Result<()> {
    let trace = crate::cmd_trace::read(&a.trace)?;
    if trace.lookups.is_empty() {
        bail!("{}: the trace holds no routing decisions", a.trace.display());
    }
    let shares: Vec<f64> = a.cache.0.iter().map(|&p| p as f64 / 100.0).collect();
    let rows: Vec<(usize, Vec<f64>)> = a.cache.0.iter().zip(&shares).map(|(&pct, &s)| (pct, Policy::ALL.iter().map(|&p| trace.hit_rate(p, s)).collect())).collect();
    if a.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(pct, r)| serde_json::json!({"cached_percent": pct, "lru": r[0], "shipped": r[1], "static_top_k": r[2], "belady": r[3]}))
            .collect();
        println!("{}", serde_json::json!({"lookups": trace.lookups.len(), "records": trace.all_records(), "rates": v}));
        return Ok(());
    }
    println!(
        "{} lookups over {} MoE layers × {} experts ({} used per token)",
        trace.lookups.len(),
        trace.moe_layers,
        trace.n_expert,
        trace.n_used
    );
    println!("| cached | LRU | shipped | static top-k | Belady | shipped − static | shipped − Belady |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (pct, r) in rows {
        println!(
            "| {pct}% | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:+.1} points | {:+.1} points |",
            100.0 * r[0],
            100.0 * r[1],
            100.0 * r[2],
            100.0 * r[3],
            100.0 * (r[1] - r[2]),
            100.0 * (r[1] - r[3])
        );
    }
    Ok(())
}
