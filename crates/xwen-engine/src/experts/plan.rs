//! The RAM plan of a model under a budget (`EngineConfig::ram_budget`): what must stay resident
//! (the trunk: every tensor but the routed experts, mapped from the file), one sequence's state
//! at `max_ctx`, scratch for a prompt batch, the experts a layer holds while it computes, and
//! what is left for the expert cache. A budget under the floor is refused before anything is
//! allocated, with the parts named (DESIGN.md "Expert streaming").
//!
//! The plan bounds what the engine itself holds: the states of `n_seq` sequences
//! (`EngineConfig::n_seq`; each further `SeqState` would add `state_bytes / n_seq`).

use crate::error::{EngineError, Result};
use crate::experts::streamed::StreamedExperts;
use crate::weights::Mat;
use xwen_gguf::GgufFile;

/// Tokens per forward pass when a budget is in force: a longer prompt runs in batches of this
/// many (llama.cpp's default micro-batch too), which bounds the scratch the plan counts.
pub const PREFILL_BATCH: usize = 512;

/// Experts a streamed prefill reads ahead of the ones it computes (`moe::forward`): a batch of
/// them is read while the previous batch computes, so two batches are in flight.
pub const PREFILL_READ_AHEAD: usize = 8;

/// Allocator slack, thread stacks and small buffers the per-op estimate does not name.
pub const SCRATCH_SLACK: u64 = 64 << 20;

/// Share of the machine's RAM an automatic budget (`ram_budget: Some(0)`) takes.
const AUTO_SHARE: (u64, u64) = (3, 4);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The ceiling in force (bytes).
    pub budget: u64,
    /// Whether `budget` was chosen by the engine (a share of the machine's RAM).
    pub auto: bool,
    /// For an automatic budget, the machine's RAM it was taken from (0 otherwise).
    pub machine_ram: u64,
    /// Resident weights: every tensor except the routed experts.
    pub trunk_bytes: u64,
    /// `n_seq` sequences' KV caches at `max_ctx` positions plus their recurrent states.
    pub state_bytes: u64,
    pub max_ctx: usize,
    /// Sequences whose state the plan holds.
    pub n_seq: usize,
    /// Activations and work buffers of a `PREFILL_BATCH`-token forward pass (an estimate).
    pub scratch_bytes: u64,
    /// RAM one cached expert takes (gate + up + down; the largest over layers), 0 for a dense
    /// model.
    pub record_bytes: u64,
    /// Experts held outside the cache while a layer computes (decode's selection, or a streamed
    /// prefill's two read-ahead batches).
    pub in_flight_bytes: u64,
    /// The smallest useful cache: one token's experts of one layer.
    pub min_cache_bytes: u64,
    /// What the cache gets: the budget less everything above, capped at all experts.
    pub cache_bytes: u64,
    /// Bytes of all routed experts in the file (as cached records).
    pub all_experts_bytes: u64,
    /// One token's working set across layers (n_used experts × MoE layers): a cache below it
    /// serves decode almost no hits.
    pub token_set_bytes: u64,
}

impl MemoryPlan {
    /// Everything but the cache, plus the smallest cache: a budget under this is refused.
    pub fn floor(&self) -> u64 {
        self.fixed_bytes().saturating_add(self.min_cache_bytes)
    }

    fn fixed_bytes(&self) -> u64 {
        self.trunk_bytes.saturating_add(self.state_bytes).saturating_add(self.scratch_bytes).saturating_add(self.in_flight_bytes)
    }

    /// The most cache the model can use: every expert (at least the smallest cache).
    fn usable_cache_bytes(&self) -> u64 {
        self.all_experts_bytes.max(self.min_cache_bytes)
    }

    /// Plans `cfg` under `budget` bytes (0 = automatic: a share of `machine_ram`, which must
    /// then be known) for sequences up to `max_ctx` positions.
    pub fn new(
        file: &GgufFile,
        figures: &PlanFigures,
        experts: &[Option<[Mat; 3]>],
        max_ctx: usize,
        n_seq: usize,
        budget: u64,
        machine_ram: Option<u64>,
    ) -> Result<MemoryPlan> {
        let n_seq = n_seq.max(1);
        let expert_tensor_bytes: u64 = experts.iter().flatten().flat_map(|m| m.iter()).map(|m| m.info.n_bytes).sum();
        let trunk_bytes = file.tensor_bytes().saturating_sub(expert_tensor_bytes);
        let state_bytes = figures.state_bytes.saturating_mul(n_seq as u64);
        let scratch_bytes = figures.scratch_bytes;
        // layers may quantize their experts differently (Q4_K_M gives some down stacks Q6_K):
        // the largest record bounds what one slot holds, the per-layer sum what all of them do
        let records: Vec<u64> = experts.iter().flatten().map(StreamedExperts::record_bytes).collect();
        let record_bytes = records.iter().copied().max().unwrap_or(0);
        let per_layer_sum: u64 = records.iter().sum();
        let (n_expert, n_used) = (figures.n_expert as u64, figures.n_used as u64);
        // decode holds its selection; a streamed prefill two read-ahead batches
        let in_flight_bytes = record_bytes * n_used.max(2 * PREFILL_READ_AHEAD as u64).min(n_expert);
        let min_cache_bytes = record_bytes * n_used;
        let all_experts_bytes = per_layer_sum * n_expert;
        let token_set_bytes = per_layer_sum * n_used;
        let mut plan = MemoryPlan {
            budget,
            auto: budget == 0,
            machine_ram: 0,
            trunk_bytes,
            state_bytes,
            max_ctx,
            n_seq,
            scratch_bytes,
            record_bytes,
            in_flight_bytes,
            min_cache_bytes,
            cache_bytes: 0,
            all_experts_bytes,
            token_set_bytes,
        };
        if plan.auto {
            let ram = machine_ram.ok_or_else(|| {
                EngineError::RamBudget("an automatic budget needs the machine's RAM, which this system does not report; give the budget in bytes".into())
            })?;
            plan.machine_ram = ram;
            plan.budget = ram / AUTO_SHARE.1 * AUTO_SHARE.0;
            // no more than the model can use
            plan.budget = plan.budget.min(plan.fixed_bytes().saturating_add(plan.usable_cache_bytes()));
        }
        if plan.budget < plan.floor() {
            return Err(EngineError::RamBudget(format!(
                "{} is under this model's floor of {}: trunk {} + state of {} at {max_ctx} positions (-c) {} + scratch {} + experts in flight {} + smallest expert cache {}{}",
                human_bytes(plan.budget),
                human_bytes(plan.floor()),
                human_bytes(plan.trunk_bytes),
                sequences(n_seq),
                human_bytes(plan.state_bytes),
                human_bytes(plan.scratch_bytes),
                human_bytes(plan.in_flight_bytes),
                human_bytes(plan.min_cache_bytes),
                if plan.auto { " (the automatic budget is 3/4 of this machine's RAM)" } else { "" }
            )));
        }
        plan.cache_bytes = (plan.budget - plan.fixed_bytes()).min(plan.usable_cache_bytes());
        Ok(plan)
    }

    /// One line for a log: the budget and where it goes.
    /// How an automatic budget was chosen, naming its cap; empty for a given one.
    fn auto_text(&self) -> String {
        if !self.auto {
            return String::new();
        }
        let share = self.machine_ram / AUTO_SHARE.1 * AUTO_SHARE.0;
        if self.budget < share {
            format!(" (automatic: all this model can use, under the cap of 3/4 of this machine's {} RAM)", human_bytes(self.machine_ram))
        } else {
            format!(" (automatic: the cap of 3/4 of this machine's {} RAM)", human_bytes(self.machine_ram))
        }
    }

    pub fn summary(&self) -> String {
        let mut s = format!(
            "RAM budget {}{}: trunk {} + state {} ({} at {} positions: -c) + scratch {} + in flight {}",
            human_bytes(self.budget),
            self.auto_text(),
            human_bytes(self.trunk_bytes),
            human_bytes(self.state_bytes),
            sequences(self.n_seq),
            self.max_ctx,
            human_bytes(self.scratch_bytes),
            human_bytes(self.in_flight_bytes)
        );
        if self.record_bytes > 0 {
            s += &format!(
                "; expert cache {} of {} of experts ({:.0}%)",
                human_bytes(self.cache_bytes),
                human_bytes(self.all_experts_bytes),
                100.0 * self.cache_bytes as f64 / self.all_experts_bytes.max(1) as f64
            );
            if self.cache_bytes < self.token_set_bytes {
                s += &format!(", under one token's working set ({}): decode will read most experts from disk", human_bytes(self.token_set_bytes));
            }
        }
        s
    }
}

/// What the memory plan needs of an architecture (`MemoryPlan::new`), from `models::Network::plan_figures`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanFigures {
    /// One sequence's state at the plan's `max_ctx` positions (KV at its maximum + recurrent).
    pub state_bytes: u64,
    /// Scratch of one forward pass of `memory_plan::PREFILL_BATCH` rows.
    pub scratch_bytes: u64,
    /// Routed experts per MoE layer and how many a token uses (0, 0 for a dense model).
    pub n_expert: usize,
    pub n_used: usize,
}

fn sequences(n: usize) -> String {
    if n == 1 {
        "one sequence".into()
    } else {
        format!("{n} sequences")
    }
}

/// Total RAM of this machine (Linux `MemTotal`); None where not known.
pub fn machine_ram() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes in binary units with two decimals (`13.90 MiB`, `2.13 GiB`), for messages; also
/// `xwen inspect`'s format.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
