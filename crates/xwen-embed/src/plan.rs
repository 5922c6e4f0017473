//! The RAM plan without running anything (`xwen plan`): trunk, state, scratch, the floor a
//! budget must reach, and the expert cache the rest buys.

use crate::error::{Error, Result};
use crate::load::{open_file, settle_context, LoadOptions};
use serde_json::{json, Value};
use xwen_engine::memory_plan::ram_limit;
use xwen_engine::{EngineConfig, MemoryPlan, Reserved};
use xwen_gguf::GgufFile;

/// The plan `path_or_name` (None: the demo model) would run under with `opts`; the file is
/// read, not run. Without a budget the plan is under no ceiling: it still states the floor.
/// A budget under the floor is an error naming the parts.
pub fn plan(path_or_name: Option<&str>, opts: &LoadOptions) -> Result<MemoryPlan> {
    let mut cfg = opts.engine_config()?;
    let (file, _) = open_file(path_or_name, &cfg, false)?;
    settle_context(&mut cfg, opts.ctx_size, &file);
    plan_of(&file, &cfg)
}

pub(crate) fn plan_of(file: &GgufFile, cfg: &EngineConfig) -> Result<MemoryPlan> {
    let loaded = xwen_engine::models::load(file).map_err(|e| Error::Load(e.to_string()))?;
    let figures = loaded.net.plan_figures(cfg.max_ctx, cfg.effective_kv_types());
    let budget = cfg.ram_budget.unwrap_or(u64::MAX);
    let reserved = Reserved { prefix_cache: cfg.reserved_ram, draft: cfg.draft_ram };
    MemoryPlan::new(file, &figures, &loaded.experts, &loaded.net.row_tables(), cfg.max_ctx, cfg.n_seq, budget, reserved, ram_limit())
        .map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// The plan as JSON (bytes; the names `xwen plan --json` uses), for the bindings.
pub fn plan_json(p: &MemoryPlan) -> Value {
    let budget = (p.budget != u64::MAX).then_some(p.budget);
    json!({
        "max_ctx": p.max_ctx,
        "sequences": p.n_seq,
        "floor_bytes": p.floor(),
        "trunk_bytes": p.trunk_bytes,
        "state_bytes": p.state_bytes,
        "scratch_bytes": p.scratch_bytes,
        "in_flight_bytes": p.in_flight_bytes,
        "prefill_wave_tokens": p.wave_rows,
        "prefill_wave_bytes": p.wave_bytes,
        "reserved_bytes": p.reserved_bytes,
        "draft_bytes": p.draft_bytes,
        "budget_bytes": budget,
        "budget_auto": p.auto,
        "expert_cache_bytes": p.cache_bytes,
        "expert_record_bytes": p.record_bytes,
        "all_experts_bytes": p.all_experts_bytes,
        "token_set_bytes": p.token_set_bytes,
        "table_bytes": p.table_bytes,
        "table_rows": p.table_rows,
        "table_rows_per_token": p.rows_per_token,
        "row_slot_bytes": p.row_slot_bytes,
        "row_in_flight_bytes": p.row_in_flight_bytes,
        "row_cache_bytes": p.row_cache_bytes,
        "row_cache_rows": p.row_cache_rows(),
        "summary": budget.map(|_| p.summary()),
    })
}
