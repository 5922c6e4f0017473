//! `xwen replay TRACE.jsonl [--cache 25,50,75] [--vram 5,10]`: the expert-cache hit rate of LRU,
//! of the shipped policy, of the static top-k (the run's most used records, known in advance)
//! and of Belady's optimum on one routing trace, at each share of the model's experts cached;
//! with `--vram`, a GPU run's two tiers — a VRAM cache above the RAM cache — and where each
//! lookup was served (`xwen_engine::experts::replay`).

use crate::cli::ReplayArgs;
use anyhow::{bail, Result};
use xwen_engine::experts::replay::{Policy, TwoTier};

pub fn run(a: ReplayArgs) -> Result<()> {
    let trace = crate::cmd_trace::read(&a.trace)?;
    if trace.lookups.is_empty() {
        bail!("{}: the trace holds no routing decisions", a.trace.display());
    }
    let shares: Vec<f64> = a.cache.0.iter().map(|&p| p as f64 / 100.0).collect();
    // Policy::ALL's order: LRU, shipped, static top-k, Belady, shipped + prefetch
    let rows: Vec<(usize, Vec<f64>)> = a.cache.0.iter().zip(&shares).map(|(&pct, &s)| (pct, Policy::ALL.iter().map(|&p| trace.hit_rate(p, s)).collect())).collect();
    let guesses = trace.has_guesses();
    // per share: (records read per lookup, prefetched records never asked for per lookup)
    let reads: Vec<(f64, f64)> = shares
        .iter()
        .map(|&s| {
            let r = trace.prefetch_replay((s * trace.all_records() as f64).round() as usize);
            let n = trace.lookups.len() as f64;
            (r.reads as f64 / n, r.wasted as f64 / n)
        })
        .collect();
    // a GPU run's two tiers: (VRAM %, RAM %, what served the lookups)
    let tiers: Vec<(usize, usize, TwoTier)> = a
        .vram
        .as_ref()
        .map(|v| {
            let slots = |pct: usize| (pct as f64 / 100.0 * trace.all_records() as f64).round() as usize;
            v.0.iter().flat_map(|&vp| a.cache.0.iter().map(move |&rp| (vp, rp))).map(|(vp, rp)| (vp, rp, trace.two_tier(slots(vp), slots(rp)))).collect()
        })
        .unwrap_or_default();
    if a.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .zip(&reads)
            .map(|((pct, r), &(reads, wasted))| {
                let mut j = serde_json::json!({"cached_percent": pct});
                for (p, v) in Policy::ALL.iter().zip(r) {
                    if *p != Policy::ShippedPrefetch || guesses {
                        j[p.key()] = serde_json::json!(v);
                    }
                }
                if guesses {
                    j["prefetch_reads_per_lookup"] = serde_json::json!(reads);
                    j["prefetch_wasted_per_lookup"] = serde_json::json!(wasted);
                }
                j
            })
            .collect();
        let n = trace.lookups.len().max(1) as f64;
        let t: Vec<serde_json::Value> = tiers
            .iter()
            .map(|(vp, rp, t)| {
                serde_json::json!({"vram_percent": vp, "ram_percent": rp, "vram_hit": t.vram_hits as f64 / n, "ram_hit": t.ram_hits as f64 / n,
                    "disk": t.disk_reads as f64 / n, "belady_vram": t.belady_vram as f64 / n, "belady_both": t.belady_both as f64 / n})
            })
            .collect();
        println!("{}", serde_json::json!({"lookups": trace.lookups.len(), "records": trace.all_records(), "guesses": guesses, "rates": v, "two_tier": t}));
        return Ok(());
    }
    println!(
        "{} lookups over {} MoE layers × {} experts ({} used per token)",
        trace.lookups.len(),
        trace.moe_layers,
        trace.n_expert,
        trace.n_used
    );
    if guesses {
        println!("| cached | LRU | shipped | static top-k | Belady | shipped − Belady | shipped + prefetch (in RAM when asked) | − Belady | reads per lookup | wasted |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    } else {
        println!("| cached | LRU | shipped | static top-k | Belady | shipped − static | shipped − Belady |");
        println!("|---:|---:|---:|---:|---:|---:|---:|");
    }
    for ((pct, r), (reads, wasted)) in rows.into_iter().zip(reads) {
        let pt = |v: f64| format!("{:.1}%", 100.0 * v);
        let gap = |v: f64| format!("{:+.1} points", 100.0 * v);
        let mut cells = vec![format!("{pct}%"), pt(r[0]), pt(r[1]), pt(r[2]), pt(r[3])];
        if guesses {
            cells.extend([gap(r[1] - r[3]), pt(r[4]), gap(r[4] - r[3]), format!("{reads:.3}"), format!("{wasted:.3}")]);
        } else {
            cells.extend([gap(r[1] - r[2]), gap(r[1] - r[3])]);
        }
        println!("| {} |", cells.join(" | "));
    }
    if !guesses {
        println!("(this trace holds no next-layer guesses: write it again with this xwen's `xwen trace` for the prefetching decode's figures)");
    }
    if !tiers.is_empty() {
        let n = trace.lookups.len().max(1) as f64;
        let pt = |v: u64| format!("{:.1}%", 100.0 * v as f64 / n);
        println!();
        println!("Two tiers (a GPU run larger than its card): where each lookup was served, the shipped policy in both caches");
        println!("| VRAM cache | RAM cache | VRAM hit | RAM hit (copied up) | disk | Belady, VRAM alone | Belady, both tiers' room | VRAM − Belady |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (vp, rp, t) in &tiers {
            let gap = 100.0 * (t.vram_hits as f64 - t.belady_vram as f64) / n;
            println!("| {vp}% | {rp}% | {} | {} | {} | {} | {} | {gap:+.1} points |", pt(t.vram_hits), pt(t.ram_hits), pt(t.disk_reads), pt(t.belady_vram), pt(t.belady_both));
        }
    }
    Ok(())
}
