//! `xwen plan -m MODEL [--ram-budget X] [-c N] [--parallel N] [--trace T]`: the RAM plan the
//! engine would run under — floor, trunk, state, scratch, experts in flight, the expert cache
//! (bytes, records, per layer), a streamed table's rows in flight and row cache (qwen4exp's
//! PLE table) — and, given a routing trace, the hit rate to expect from it.
//! Nothing is computed: the file is read, not run.

use crate::cli::PlanArgs;
use anyhow::{anyhow, Context, Result};
use xwen_engine::experts::replay::Policy;
use xwen_engine::memory_plan::{human_bytes, ram_limit};
use xwen_engine::MemoryPlan;
use xwen_gguf::GgufFile;

pub fn run(a: PlanArgs) -> Result<()> {
    let mut cfg = a.engine.engine_config()?;
    cfg.reserved_ram = a.cache_ram.saturating_mul(1 << 20);
    let path = a.model.as_deref().map(xwen_hub::hub::resolve).transpose()?;
    let file = match &path {
        None => GgufFile::from_bytes(crate::model_arg::DEMO_GGUF.to_vec()).context("embedded demo model")?,
        Some(p) => GgufFile::open(p).map_err(|e| anyhow!("{}: {e}", p.display()))?,
    };
    let loaded = xwen_engine::models::load(&file)?;
    let kv = cfg.effective_kv_types();
    let n_seq = a.parallel as usize;
    // the drafter's share, as a run or a server with these flags would count it
    cfg.n_seq = n_seq;
    let prepared = crate::draft_arg::prepare(&a.draft, &mut cfg, n_seq)?;
    let file = std::sync::Arc::new(file);
    let head_bytes = xwen_engine::mtp_plan_bytes(&file, &cfg)?;
    drop(prepared);
    let figures = loaded.net.plan_figures(cfg.max_ctx, kv);
    // without a budget: the plan under no ceiling, which states the floor and the sizes
    let budget = cfg.ram_budget.unwrap_or(u64::MAX);
    let mut plan = MemoryPlan::new(
        &file,
        &figures,
        &loaded.experts,
        &loaded.net.row_tables(),
        cfg.max_ctx,
        n_seq,
        budget,
        xwen_engine::Reserved { prefix_cache: cfg.reserved_ram, draft: cfg.draft_ram.saturating_add(head_bytes) },
        ram_limit(),
    )?;
    if let Some(w) = cfg.prefill_wave {
        plan.set_wave_batches(w)?;
    }
    let moe_layers = loaded.experts.iter().filter(|e| e.is_some()).count();
    let all_records = (figures.n_expert * moe_layers) as u64;
    // records differ in size between layers (Q4_K_M's Q6_K down stacks): the share of the
    // experts' bytes the cache holds, as records
    let share = if plan.all_experts_bytes > 0 { (plan.cache_bytes as f64 / plan.all_experts_bytes as f64).min(1.0) } else { 0.0 };
    let records = (share * all_records as f64).floor() as u64;
    let trace = a.trace.as_deref().map(crate::cmd_trace::read).transpose()?;
    if let Some(t) = &trace {
        if (t.n_expert, t.moe_layers) != (figures.n_expert, moe_layers) {
            anyhow::bail!("the trace is of a model with {} MoE layers × {} experts, this one has {} × {}", t.moe_layers, t.n_expert, moe_layers, figures.n_expert);
        }
    }
    // the prefetching decode's figure only where the trace holds the guesses it reads ahead
    let rates: Option<Vec<(Policy, f64)>> =
        trace.as_ref().map(|t| Policy::ALL.iter().filter(|&&p| p != Policy::ShippedPrefetch || t.has_guesses()).map(|&p| (p, t.hit_rate(p, share))).collect());
    let given = cfg.ram_budget.is_some();
    // -ngl 99: the GPU's share, as the CUDA backend would hold it
    let n_layer = file.architecture().and_then(|ar| file.get_u64(&format!("{ar}.block_count"))).unwrap_or(0) as usize;
    let vram = match crate::gpu::placement(a.engine.n_gpu_layers.as_deref(), a.engine.device.as_deref(), n_layer)? {
        crate::gpu::Placement::Cuda(ordinal) => {
            // the MTP head a run with these flags drafts with goes onto the device too
            let head = xwen_engine::mtp_head_for_plan(&file, &cfg)?;
            Some(crate::gpu::vram_plan(&file, ordinal, cfg.max_ctx, a.engine.prefill_chunk(), head.as_ref(), n_seq)?)
        }
        crate::gpu::Placement::Cpu => None,
    };
    if let (Some(v), false) = (&vram, a.json) {
        match &v.device {
            Ok((name, free)) => println!("VRAM (-ngl 99): {} on {name}, {} free{}", human_bytes(v.bytes), human_bytes(*free), if v.bytes > *free { " — does not fit" } else { "" }),
            Err(why) => println!("VRAM (-ngl 99): {} (weights, KV and state at -c {}, scratch); {why}", human_bytes(v.bytes), cfg.max_ctx),
        }
        #[cfg(feature = "cuda")]
        {
            let p = &v.parts;
            println!(
                "  trunk {} + routed experts {} + KV and state {} + scratch {}; the floor with the experts in a VRAM cache: {}",
                human_bytes(p.trunk_bytes),
                human_bytes(p.expert_bytes),
                human_bytes(p.state_bytes),
                human_bytes(p.scratch_bytes),
                human_bytes(p.floor())
            );
            if v.mtp_bytes > 0 {
                println!("  the MTP head it drafts with (its block, what it does not share with the trunk, its KV): {} more", human_bytes(v.mtp_bytes));
            }
            if let Ok((_, free)) = &v.device {
                let room = xwen_cuda::DevicePlan::checkpoint_room(*free, p.held_bytes(a.engine.vram_budget), a.engine.vram_budget);
                if room > 0 {
                    println!("  checkpoints kept on the card (a server's, one a prompt): up to {}", human_bytes(room));
                }
            }
            if let Some(b) = a.engine.vram_budget {
                match p.check_budget(b) {
                    Ok(()) => println!("  --vram-budget {}: {} on the device; {}", human_bytes(b), human_bytes(p.held_bytes(Some(b))), p.tiers(Some(b))),
                    Err(why) => println!("  {why}"),
                }
            }
        }
    }
    let gpus = a.engine.gpus.as_ref().map(|g| gpus_plan(&file, g.0.len(), &cfg, a.engine.prefill_chunk(), a.engine.vram_budget)).transpose()?;
    if let (Some(g), false) = (&gpus, a.json) {
        g.print();
    }
    if a.engine.vram_budget.is_some() && vram.is_none() && gpus.is_none() {
        anyhow::bail!("--vram-budget is a ceiling on the GPU's share: give it with -ngl 99 (or --device cuda)");
    }
    if a.json {
        let mut j = serde_json::json!({
            "architecture": loaded.net.arch(),
            "max_ctx": cfg.max_ctx,
            "sequences": n_seq,
            "kv_types": [kv.0.name(), kv.1.name()],
            "floor_bytes": plan.floor(),
            "trunk_bytes": plan.trunk_bytes,
            "state_bytes": plan.state_bytes,
            "scratch_bytes": plan.scratch_bytes,
            "in_flight_bytes": plan.in_flight_bytes,
            "prefill_wave_tokens": plan.wave_rows,
            "prefill_wave_bytes": plan.wave_bytes,
            "reserved_bytes": plan.reserved_bytes,
            "draft_bytes": plan.draft_bytes,
            "budget_bytes": given.then_some(plan.budget),
            "vram_bytes": vram.as_ref().map(|v| v.bytes),
            "vram_mtp_bytes": vram.as_ref().map(|v| v.mtp_bytes),
            "vram_budget_bytes": a.engine.vram_budget,
            "budget_auto": plan.auto,
            "expert_cache_bytes": plan.cache_bytes,
            "expert_record_bytes": plan.record_bytes,
            "all_experts_bytes": plan.all_experts_bytes,
            "cache_records": records,
            "cache_records_per_layer": if moe_layers > 0 { records as f64 / moe_layers as f64 } else { 0.0 },
            "cached_share": share,
            "token_set_bytes": plan.token_set_bytes,
            "table_bytes": plan.table_bytes,
            "table_rows": plan.table_rows,
            "table_rows_per_token": plan.rows_per_token,
            "row_slot_bytes": plan.row_slot_bytes,
            "row_in_flight_bytes": plan.row_in_flight_bytes,
            "row_cache_bytes": plan.row_cache_bytes,
            "row_cache_rows": plan.row_cache_rows(),
        });
        #[cfg(feature = "cuda")]
        if let Some(v) = &vram {
            let b = a.engine.vram_budget;
            j["vram_floor_bytes"] = serde_json::json!(v.parts.floor());
            j["vram_held_bytes"] = serde_json::json!(v.parts.held_bytes(b));
            j["vram_expert_slots"] = serde_json::json!(v.parts.expert_slots(b));
            j["vram_experts_per_layer"] = serde_json::json!(v.parts.n_expert);
            j["vram_budget_ok"] = serde_json::json!(b.map_or(true, |b| v.parts.check_budget(b).is_ok()));
        }
        if let Some(g) = &gpus {
            j["gpus"] = serde_json::json!(g.plan.ranks);
            j["gpu_rank_bytes"] = serde_json::json!((0..g.plan.ranks).map(|r| g.plan.rank_bytes(r)).collect::<Vec<_>>());
            j["gpu_rank_experts"] = serde_json::json!((0..g.plan.ranks).map(|r| { let b = g.plan.partition.block(r); [b.start, b.end] }).collect::<Vec<_>>());
            j["gpu_card_bytes"] = serde_json::json!(g.card);
            j["gpu_fits"] = serde_json::json!(g.card.map(|c| g.plan.check_fits(c).is_ok()));
        }
        if let Some(r) = &rates {
            j["trace_hit_rates"] = r.iter().map(|(p, v)| (p.key().to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>().into();
        }
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    println!("{} at {} positions (-c), {} sequence(s), KV {}/{}", loaded.net.arch(), cfg.max_ctx, n_seq, kv.0.name(), kv.1.name());
    println!("  trunk            {}", human_bytes(plan.trunk_bytes));
    println!("  state            {}", human_bytes(plan.state_bytes));
    println!("  scratch          {}", human_bytes(plan.scratch_bytes));
    if plan.reserved_bytes > 0 {
        println!("  prefix cache     {} (--cache-ram, inside the budget)", human_bytes(plan.reserved_bytes));
    }
    if plan.draft_bytes > 0 {
        println!("  draft            {} (the drafter: a draft model mapped with its states, or an MTP head's KV and sidecar)", human_bytes(plan.draft_bytes));
    }
    if plan.record_bytes == 0 {
        println!("  a dense model: everything is resident; a --ram-budget streams nothing (its floor: {})", human_bytes(plan.floor()));
        return Ok(());
    }
    println!("  experts in flight {}", human_bytes(plan.in_flight_bytes));
    if plan.table_bytes > 0 {
        println!("  table rows in flight {} (the reads of one step's rows)", human_bytes(plan.row_in_flight_bytes));
    }
    println!(
        "  floor            {} (the smallest --ram-budget: all of the above + one token's experts of one layer{})",
        human_bytes(plan.floor()),
        if plan.table_bytes > 0 { " + one token's table rows" } else { "" }
    );
    if plan.wave_rows > xwen_engine::memory_plan::PREFILL_BATCH {
        println!("  prefill wave     {} (a long prompt passes each layer {} tokens at a time: an expert read once for them all)", human_bytes(plan.wave_bytes), plan.wave_rows);
    }
    println!(
        "  routed experts   {} in {} records of {} ({} MoE layers × {} experts, {} used per token); one token's set {}",
        human_bytes(plan.all_experts_bytes),
        all_records,
        human_bytes(plan.record_bytes),
        moe_layers,
        figures.n_expert,
        figures.n_used,
        human_bytes(plan.token_set_bytes)
    );
    if plan.table_bytes > 0 {
        println!(
            "  streamed table   {} in {} rows; a token reads {} of them (deduplicated per step, each one read of {:.2} blocks of 4 KiB on average), a cached row takes {}",
            human_bytes(plan.table_bytes),
            plan.table_rows,
            plan.rows_per_token,
            loaded.net.row_tables().iter().map(|t| xwen_engine::experts::rows::blocks_per_row(&t.mat, file.data_offset())).fold(0.0, f64::max),
            human_bytes(plan.row_slot_bytes)
        );
    }
    if let Some(p) = &path {
        let side = xwen_engine::experts::pack::sidecar_path(p);
        if side.exists() {
            match xwen_engine::experts::pack::Pack::open(&side, &file, &loaded.experts) {
                Ok(_) => println!("  pack             {} matches: a streamed expert is one read", side.display()),
                Err(e) => println!("  pack             not used: {e}"),
            }
        } else {
            println!("  pack             none (`xwen pack` makes one: one read per streamed expert instead of three)");
        }
    }
    if given {
        println!("  {}", plan.summary());
        println!(
            "  expert cache     {} = {} records, {:.1} per layer ({:.0}% of the experts)",
            human_bytes(plan.cache_bytes),
            records,
            records as f64 / moe_layers.max(1) as f64,
            100.0 * share
        );
        if plan.table_bytes > 0 {
            println!(
                "  row cache        {} = {} rows ({:.2}% of the table)",
                human_bytes(plan.row_cache_bytes),
                plan.row_cache_rows(),
                100.0 * plan.row_cache_rows() as f64 / plan.table_rows.max(1) as f64
            );
        }
    } else {
        println!("  no --ram-budget: the experts stay mapped (the page cache decides); with one, the cache gets the budget less the fixed parts above");
    }
    if let Some(r) = rates {
        let parts: Vec<String> = r.iter().map(|(p, v)| format!("{} {:.1}%", p.name(), 100.0 * v)).collect();
        println!("  expected hit rate at {:.0}% cached, from the trace: {}", 100.0 * share, parts.join(", "));
    }
    Ok(())
}

/// `--gpus N`: the model's placement over N GPUs and the card it is checked against.
struct GpusPlan {
    plan: xwen_engine::shard::ShardPlan,
    /// Bytes a card has for it: --vram-budget, else the first device's free memory; None: unknown.
    card: Option<u64>,
    /// What the bytes count.
    counted: String,
    device: Option<String>,
}

impl GpusPlan {
    fn print(&self) {
        println!("{} GPU(s), expert parallel: each GPU holds the trunk and a block of every MoE layer's routed experts ({})", self.plan.ranks, self.counted);
        for l in self.plan.lines() {
            println!("  {l}");
        }
        match (self.card, &self.device) {
            (Some(c), _) => match self.plan.check_fits(c) {
                Ok(()) => println!("  fits {} a card{}", human_bytes(c), self.device.as_deref().map(|d| format!(" ({d})")).unwrap_or_default()),
                Err(why) => println!("  {why}"),
            },
            (None, Some(why)) => println!("  no card to check against: {why} (give --vram-budget, per card)"),
            (None, None) => {}
        }
    }
}

/// The placement of `file` over `n` GPUs: in the CUDA backend's layout with KV, state and scratch
/// where it is built in, else the weights as stored.
fn gpus_plan(file: &GgufFile, n: usize, cfg: &xwen_engine::EngineConfig, ubatch: usize, budget: Option<u64>) -> Result<GpusPlan> {
    #[cfg(feature = "cuda")]
    {
        // (an MTP head does not run on a model split over GPUs)
        let v = crate::gpu::vram_plan(file, 0, cfg.max_ctx, ubatch, None, 1)?;
        let p = &v.parts;
        let plan = xwen_engine::shard::ShardPlan::new(n, p.n_expert, p.trunk_bytes, p.expert_bytes, p.state_bytes + p.scratch_bytes)?;
        let (card, device) = match (budget, v.device) {
            (Some(b), _) => (Some(b), None),
            (None, Ok((name, free))) => (Some(free), Some(format!("{name}, free now"))),
            (None, Err(why)) => (None, Some(why)),
        };
        Ok(GpusPlan { plan, card, counted: format!("the CUDA backend's layout; KV and state at -c {}, scratch", cfg.max_ctx), device })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (cfg, ubatch);
        let plan = xwen_engine::shard::ShardPlan::of_file(file, n)?;
        Ok(GpusPlan { plan, card: budget, counted: "weights as stored; this xwen was built without CUDA, so KV, state and scratch are not counted".into(), device: budget.is_none().then(|| "this xwen was built without CUDA".to_string()) })
    }
}
