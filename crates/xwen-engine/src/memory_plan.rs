//! The RAM plan of a model under a budget (`EngineConfig::ram_budget`): what must stay resident
//! (the trunk: every tensor but the routed experts and the streamed lookup tables, mapped from
//! the file), one sequence's state at `max_ctx`, scratch for a prompt batch, the experts a
//! layer holds while it computes and the table rows a step reads, and what is left for the
//! expert cache and the row cache. A budget under the floor is refused before anything is
//! allocated, with the parts named (docs/architecture.md "A streamed expert's path").
//!
//! The plan bounds what the engine itself holds: the states of `n_seq` sequences
//! (`EngineConfig::n_seq`; each further `SeqState` would add `state_bytes / n_seq`).

use crate::error::{EngineError, Result};
use crate::experts::rows::{self, RowTable};
use crate::experts::streamed::StreamedExperts;
use crate::weights::Mat;
use xwen_gguf::GgufFile;

/// Tokens per forward pass when a budget is in force: a longer prompt runs in batches of this
/// many (llama.cpp's default micro-batch too), which bounds the scratch the plan counts.
pub const PREFILL_BATCH: usize = 512;

/// Batches one streamed prefill wave holds at most: a long prompt passes each layer
/// `PREFILL_WAVE_BATCHES` batches at a time, so an expert is read once for all of them
/// instead of once per batch (llama.cpp's default logical batch, 2048 tokens, over its 512-token
/// micro-batch).
pub const PREFILL_WAVE_BATCHES: usize = 4;

/// A wave's extra scratch may take at most this share of the expert cache the budget leaves
/// (1 / n): decode's speed is the cache's, a long prompt's the wave's.
const WAVE_CACHE_SHARE: u64 = 8;

/// The row cache's share (1 / n) of what the budget leaves for the caches, where the model has
/// experts too: a token reads a few dozen table rows (16 × 4 KiB blocks on qwen4exp, read at
/// once) against hundreds of MB of experts (10 of 512 per layer × 48 layers at full size), so
/// a byte of expert cache saves far more disk than a byte of row cache.
const ROW_CACHE_SHARE: u64 = 64;

/// Experts a streamed prefill reads ahead of the ones it computes (`moe::forward`): a batch of
/// them is read while the previous batch computes, so two batches are in flight.
pub const PREFILL_READ_AHEAD: usize = 8;

/// Expert records a streamed store holds outside its cache at most: a decode step its
/// selection (a streamed prefill two read-ahead batches) and the prefetch readers one expert
/// each while its read is in flight. The memory plan counts them; the store keeps as many
/// finished reads' buffers for reuse (`direct_read::Recycler`).
pub fn in_flight_records(n_used: usize, n_expert: usize) -> usize {
    n_used.max(2 * PREFILL_READ_AHEAD).min(n_expert) + crate::experts::prefetch::PREFETCH_READERS
}

/// The span of the largest page a file mapping maps at once: a 2 MiB folio of the page cache
/// (ext4 and xfs fill the cache with them; Linux maps one with a 2 MiB entry where the
/// mapping asks for huge pages, and since 6.18 a fault maps a whole folio even with 4 KiB
/// entries).
pub const MAPPED_PAGE: u64 = 2 << 20;

/// What the mapped trunk keeps resident: the file's header (metadata, the tokenizer) and every
/// tensor but the routed experts and the streamed tables, as the 2 MiB pages they fall in. A page a trunk tensor
/// shares with a routed expert maps that expert's bytes too: measured on the synthetic
/// 35B-A3B, 2.13 GiB of trunk tensors kept 2.37 GiB of the file resident (both ends of each
/// of the 120 expert stacks), which the plan must count for peak RSS to stay under the budget.
pub fn resident_trunk_bytes(file: &GgufFile, experts: &[Option<[Mat; 3]>], tables: &[RowTable]) -> u64 {
    let is_expert: std::collections::HashSet<&str> = experts.iter().flatten().flat_map(|m| m.iter()).chain(tables.iter().map(|t| &t.mat)).map(|m| m.info.name.as_str()).collect();
    let base = file.data_offset();
    let mut ranges: Vec<(u64, u64)> = vec![(0, base)];
    ranges.extend(
        file.tensors()
            .iter()
            .filter(|t| t.n_bytes > 0 && !is_expert.contains(t.name.as_str()))
            .map(|t| (base.saturating_add(t.offset), base.saturating_add(t.offset).saturating_add(t.n_bytes))),
    );
    pages_covering(&ranges, MAPPED_PAGE).min(file.file_len())
}

/// Bytes of the `page`-sized, `page`-aligned pages that the byte ranges `[start, end)` touch,
/// each page counted once however many ranges share it.
fn pages_covering(ranges: &[(u64, u64)], page: u64) -> u64 {
    let mut pages: Vec<(u64, u64)> = ranges.iter().filter(|(s, e)| e > s).map(|&(s, e)| (s / page, (e - 1) / page)).collect();
    pages.sort_unstable();
    let mut total = 0u64;
    let mut covered_to: Option<u64> = None; // the last page counted so far
    for (first, last) in pages {
        let first = match covered_to {
            Some(c) if first <= c => c + 1,
            _ => first,
        };
        if last >= first {
            total += last - first + 1;
        }
        covered_to = Some(covered_to.map_or(last, |c| c.max(last)));
    }
    total.saturating_mul(page)
}

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
    /// For an automatic budget, the RAM this process may use that it was taken from (0
    /// otherwise), and where that figure came from (`ram_limit`).
    pub machine_ram: u64,
    pub ram_source: &'static str,
    /// Resident weights: the header and every tensor except the routed experts, as the 2 MiB
    /// pages of the mapping they fall in (`resident_trunk_bytes`).
    pub trunk_bytes: u64,
    /// `n_seq` sequences' KV caches at `max_ctx` positions plus their recurrent states.
    pub state_bytes: u64,
    pub max_ctx: usize,
    /// Sequences whose state the plan holds.
    pub n_seq: usize,
    /// Activations and work buffers of a `PREFILL_BATCH`-token forward pass (an estimate).
    pub scratch_bytes: u64,
    /// Rows a streamed prefill wave holds (a multiple of `PREFILL_BATCH`; `PREFILL_BATCH`: no
    /// wave) and what its rows beyond one batch take (`wave_bytes`, inside the budget).
    pub wave_rows: usize,
    pub wave_bytes: u64,
    /// What each wave row beyond the first batch takes (`PlanFigures::wave_row_bytes`).
    pub wave_row_bytes: u64,
    /// RAM the caller keeps inside the budget for itself (`EngineConfig::reserved_ram`: a
    /// server's prefix cache of conversation states).
    pub reserved_bytes: u64,
    /// RAM a drafter beside the model takes: a draft model run mapped with its states, an MTP
    /// sidecar's weights, an MTP head's KV (`EngineConfig::draft_ram`, the head's own figure).
    pub draft_bytes: u64,
    /// RAM one cached expert takes (gate + up + down; the largest over layers), 0 for a dense
    /// model.
    pub record_bytes: u64,
    /// Experts held outside the cache while a layer computes (decode's selection, or a streamed
    /// prefill's two read-ahead batches) and the prefetch readers' reads in flight.
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
    /// Bytes of the lookup tables whose rows stream (qwen4exp's PLE table; 0: none), their
    /// rows, and the rows one token reads from them.
    pub table_bytes: u64,
    pub table_rows: u64,
    pub rows_per_token: usize,
    /// RAM one cached row takes (the largest table's row and its slot's overhead).
    pub row_slot_bytes: u64,
    /// The buffers a step's row reads hold at once (`experts::rows::in_flight_bytes`).
    pub row_in_flight_bytes: u64,
    /// The smallest row cache: one token's rows.
    pub min_row_cache_bytes: u64,
    /// What the row cache gets: its share of what the budget leaves (`ROW_CACHE_SHARE`), and
    /// what the expert cache cannot use, capped at every row.
    pub row_cache_bytes: u64,
}

impl MemoryPlan {
    /// Everything but the cache, plus the smallest cache: a budget under this is refused.
    pub fn floor(&self) -> u64 {
        self.fixed_bytes().saturating_add(self.min_cache_bytes).saturating_add(self.min_row_cache_bytes)
    }

    fn fixed_bytes(&self) -> u64 {
        self.trunk_bytes
            .saturating_add(self.state_bytes)
            .saturating_add(self.scratch_bytes)
            .saturating_add(self.in_flight_bytes)
            .saturating_add(self.reserved_bytes)
            .saturating_add(self.draft_bytes)
            .saturating_add(self.row_in_flight_bytes)
    }

    /// The most row cache the model can use: every row (at least the smallest cache).
    fn usable_row_cache_bytes(&self) -> u64 {
        self.table_rows.saturating_mul(self.row_slot_bytes).max(self.min_row_cache_bytes)
    }

    /// `avail` bytes split between the expert cache and the row cache: the rows their share
    /// (at least their smallest cache, leaving the experts at least theirs), the experts the
    /// rest they can use, the rows what is still left; each capped at all it could hold.
    fn split_caches(&self, avail: u64) -> (u64, u64) {
        let usable_rows = self.usable_row_cache_bytes();
        let share = if self.record_bytes > 0 { avail / ROW_CACHE_SHARE } else { avail };
        let rows = share.clamp(self.min_row_cache_bytes, usable_rows).min(avail.saturating_sub(self.min_cache_bytes));
        let experts = (avail - rows).min(self.usable_cache_bytes());
        (experts, (avail - experts).min(usable_rows))
    }

    /// The most cache the model can use: every expert (at least the smallest cache).
    fn usable_cache_bytes(&self) -> u64 {
        self.all_experts_bytes.max(self.min_cache_bytes)
    }

    /// Plans `cfg` under `budget` bytes (0 = automatic: a share of `machine_ram`, which must
    /// then be known) for `n_seq` sequences up to `max_ctx` positions, `reserved` bytes of it
    /// kept for the caller.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        file: &GgufFile,
        figures: &PlanFigures,
        experts: &[Option<[Mat; 3]>],
        tables: &[RowTable],
        max_ctx: usize,
        n_seq: usize,
        budget: u64,
        reserved: Reserved,
        machine_ram: Option<(u64, &'static str)>,
    ) -> Result<MemoryPlan> {
        let n_seq = n_seq.max(1);
        let trunk_bytes = resident_trunk_bytes(file, experts, tables);
        let state_bytes = figures.state_bytes.saturating_mul(n_seq as u64);
        let scratch_bytes = figures.scratch_bytes;
        // layers may quantize their experts differently (Q4_K_M gives some down stacks Q6_K):
        // the largest record bounds what one slot holds, the per-layer sum what all of them do
        let records: Vec<u64> = experts.iter().flatten().map(StreamedExperts::record_bytes).collect();
        let record_bytes = records.iter().copied().max().unwrap_or(0);
        let per_layer_sum: u64 = records.iter().sum();
        let (n_expert, n_used) = (figures.n_expert as u64, figures.n_used as u64);
        let in_flight_bytes = record_bytes * in_flight_records(n_used as usize, n_expert as usize) as u64;
        let min_cache_bytes = record_bytes * n_used;
        let all_experts_bytes = per_layer_sum * n_expert;
        let token_set_bytes = per_layer_sum * n_used;
        let row_slot_bytes = rows::slot_bytes(tables);
        let rows_per_token: usize = tables.iter().map(|t| t.per_token).sum();
        let mut plan = MemoryPlan {
            budget,
            auto: budget == 0,
            machine_ram: 0,
            ram_source: "",
            trunk_bytes,
            state_bytes,
            max_ctx,
            n_seq,
            scratch_bytes,
            reserved_bytes: reserved.prefix_cache,
            draft_bytes: reserved.draft,
            record_bytes,
            in_flight_bytes,
            min_cache_bytes,
            wave_rows: PREFILL_BATCH,
            wave_bytes: 0,
            wave_row_bytes: figures.wave_row_bytes,
            cache_bytes: 0,
            all_experts_bytes,
            token_set_bytes,
            table_bytes: tables.iter().map(|t| t.mat.info.n_bytes).sum(),
            table_rows: tables.iter().map(|t| t.mat.rows as u64).sum(),
            rows_per_token,
            row_slot_bytes,
            row_in_flight_bytes: rows::in_flight_bytes(tables),
            min_row_cache_bytes: row_slot_bytes * rows_per_token as u64,
            row_cache_bytes: 0,
        };
        if plan.auto {
            let (ram, source) = machine_ram
                .ok_or_else(|| EngineError::RamBudget("an automatic budget needs the machine's RAM, which this system does not report; give the budget in bytes".into()))?;
            plan.machine_ram = ram;
            plan.ram_source = source;
            plan.budget = ram / AUTO_SHARE.1 * AUTO_SHARE.0;
            // no more than the model can use
            plan.budget = plan.budget.min(plan.fixed_bytes().saturating_add(plan.usable_cache_bytes()).saturating_add(plan.usable_row_cache_bytes()));
        }
        if plan.budget < plan.floor() {
            return Err(EngineError::RamBudget(format!(
                "{} is under this model's floor of {}: trunk {} + state of {} at {max_ctx} positions (-c) {} + scratch {} + experts in flight {}{} + smallest expert cache {}{}{}",
                human_bytes(plan.budget),
                human_bytes(plan.floor()),
                human_bytes(plan.trunk_bytes),
                sequences(n_seq),
                human_bytes(plan.state_bytes),
                human_bytes(plan.scratch_bytes),
                human_bytes(plan.in_flight_bytes),
                plan.reserved_text(),
                human_bytes(plan.min_cache_bytes),
                plan.rows_text(),
                if plan.auto { format!(" (the automatic budget is 3/4 of {}, {})", human_bytes(plan.machine_ram), plan.ram_source) } else { String::new() }
            )));
        }
        // the cache without a wave (the floor leaves it at least its smallest size), then the
        // widest wave whose extra rows cost it at most its share (nothing where the budget
        // holds more than every expert)
        plan.set_wave_batches(1)?;
        let no_wave = plan.cache_bytes;
        let affords = |batches: usize| {
            let mut p = plan.clone();
            p.set_wave_batches(batches).is_ok() && (no_wave - p.cache_bytes).saturating_mul(WAVE_CACHE_SHARE) <= p.cache_bytes
        };
        if plan.record_bytes > 0 {
            if let Some(batches) = (2..=PREFILL_WAVE_BATCHES).rev().find(|&b| affords(b)) {
                plan.set_wave_batches(batches)?;
            }
        }
        Ok(plan)
    }

    /// Sets a streamed prefill's wave to `batches` batches of `PREFILL_BATCH` (1: none), its
    /// extra rows taken from the expert cache; refused where the cache would fall under its
    /// smallest size.
    pub fn set_wave_batches(&mut self, batches: usize) -> Result<()> {
        let batches = batches.max(1);
        let extra = self.wave_row_bytes.saturating_mul(((batches - 1) * PREFILL_BATCH) as u64);
        let free = self.budget.saturating_sub(self.fixed_bytes());
        let min_caches = self.min_cache_bytes.saturating_add(self.min_row_cache_bytes);
        if free < extra.saturating_add(min_caches) {
            return Err(EngineError::RamBudget(format!(
                "a prefill wave of {batches} batches needs {} beside the smallest caches ({}); {} is left of {}",
                human_bytes(extra),
                human_bytes(min_caches),
                human_bytes(free),
                human_bytes(self.budget)
            )));
        }
        self.wave_rows = batches * PREFILL_BATCH;
        self.wave_bytes = extra;
        (self.cache_bytes, self.row_cache_bytes) = self.split_caches(free - extra);
        Ok(())
    }

    /// " + table rows in flight X + smallest row cache Y" where the model streams a table;
    /// empty otherwise.
    fn rows_text(&self) -> String {
        if self.table_bytes == 0 {
            return String::new();
        }
        format!(
            " + table rows in flight {} + smallest row cache {} ({} rows: one token's)",
            human_bytes(self.row_in_flight_bytes),
            human_bytes(self.min_row_cache_bytes),
            self.rows_per_token
        )
    }

    /// Rows the row cache holds when full.
    pub fn row_cache_rows(&self) -> u64 {
        self.row_cache_bytes.checked_div(self.row_slot_bytes).unwrap_or(0)
    }

    /// " + prefix cache X" and " + draft Y" where the budget holds them; empty otherwise.
    fn reserved_text(&self) -> String {
        let mut s = String::new();
        if self.reserved_bytes > 0 {
            s += &format!(" + prefix cache {} (--cache-ram)", human_bytes(self.reserved_bytes));
        }
        if self.draft_bytes > 0 {
            s += &format!(" + draft {}", human_bytes(self.draft_bytes));
        }
        s
    }

    /// One line for a log: the budget and where it goes.
    /// How an automatic budget was chosen, naming its cap; empty for a given one.
    fn auto_text(&self) -> String {
        if !self.auto {
            return String::new();
        }
        let share = self.machine_ram / AUTO_SHARE.1 * AUTO_SHARE.0;
        if self.budget < share {
            format!(" (automatic: all this model can use, under the cap of 3/4 of {} — {})", human_bytes(self.machine_ram), self.ram_source)
        } else {
            format!(" (automatic: the cap of 3/4 of {} — {})", human_bytes(self.machine_ram), self.ram_source)
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
        if self.wave_rows > PREFILL_BATCH {
            s += &format!(" + prefill wave {} ({} tokens)", human_bytes(self.wave_bytes), self.wave_rows);
        }
        s += &self.reserved_text();
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
        if self.table_bytes > 0 {
            s += &format!(
                "; table rows in flight {}; row cache {} = {} of {} rows ({:.2}%) of a {} table",
                human_bytes(self.row_in_flight_bytes),
                human_bytes(self.row_cache_bytes),
                self.row_cache_rows(),
                self.table_rows,
                100.0 * self.row_cache_rows() as f64 / self.table_rows.max(1) as f64,
                human_bytes(self.table_bytes)
            );
        }
        s
    }
}

/// RAM inside the budget that is neither the model's weights, states nor scratch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reserved {
    /// What the caller keeps for itself (`EngineConfig::reserved_ram`: a prefix cache).
    pub prefix_cache: u64,
    /// The drafter's (`MemoryPlan::draft_bytes`).
    pub draft: u64,
}

/// What the memory plan needs of an architecture (`MemoryPlan::new`), from `models::Network::plan_figures`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanFigures {
    /// One sequence's state at the plan's `max_ctx` positions (KV at its maximum + recurrent).
    pub state_bytes: u64,
    /// Scratch of one forward pass of `memory_plan::PREFILL_BATCH` rows.
    pub scratch_bytes: u64,
    /// What each row of a prefill wave beyond its first batch adds (its residual stream and
    /// the FFN's per-row buffers: the wave's rows pass the FFN together).
    pub wave_row_bytes: u64,
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
    meminfo("MemTotal:")
}

/// RAM available now (Linux `MemAvailable`); None where not known.
pub fn mem_available() -> Option<u64> {
    meminfo("MemAvailable:")
}

fn meminfo(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// What this process may use, and where that figure comes from: the memory cgroup's limit
/// (v2 `memory.max`, v1 `memory.limit_in_bytes`) where one is set, else the RAM available now
/// (`MemAvailable`), else the machine's RAM. An automatic budget is a share of it.
pub fn ram_limit() -> Option<(u64, &'static str)> {
    ram_limit_from(|p| std::fs::read_to_string(p).ok(), mem_available(), machine_ram())
}

/// `ram_limit` over a file reader (tests give it a fake /sys).
fn ram_limit_from(read: impl Fn(&str) -> Option<String>, available: Option<u64>, total: Option<u64>) -> Option<(u64, &'static str)> {
    let parse = |t: Option<String>| t.and_then(|t| t.trim().parse::<u64>().ok());
    // a v1 "no limit" is a page-rounded i64::MAX; anything beyond the machine is no limit
    let real = |v: u64| v > 0 && total.is_none_or(|t| v < t);
    // the tightest limit on the process's own cgroup or any cgroup above it (a limit binds
    // every cgroup below it), under the mount `root`; `/` alone where the path is unknown
    let tightest = |root: &str, file: &str, path: Option<&str>| -> Option<u64> {
        let mut at = path.unwrap_or("/").trim_end_matches('/').to_string();
        let mut best: Option<u64> = None;
        loop {
            if let Some(v) = parse(read(&format!("{root}{at}/{file}"))).filter(|&v| real(v)) {
                best = Some(best.map_or(v, |b| b.min(v)));
            }
            match at.rfind('/') {
                Some(i) => at.truncate(i),
                None => break,
            }
        }
        best
    };
    let own = read("/proc/self/cgroup").unwrap_or_default();
    // v2: the unified hierarchy's "0::/path"
    let v2_path = own.lines().find_map(|l| l.strip_prefix("0::")).map(str::trim);
    if let Some(v) = tightest("/sys/fs/cgroup", "memory.max", v2_path) {
        return Some((v, "the cgroup's memory.max"));
    }
    // v1: the memory controller's "N:memory:/path" (controllers may share a line: "cpu,memory")
    let v1_path = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        ctl.split(',').any(|c| c == "memory").then(|| path.trim())
    });
    if let Some(v) = tightest("/sys/fs/cgroup/memory", "memory.limit_in_bytes", v1_path) {
        return Some((v, "the cgroup's memory.limit_in_bytes"));
    }
    match (available, total) {
        (Some(a), _) => Some((a, "MemAvailable")),
        (None, Some(t)) => Some((t, "MemTotal")),
        (None, None) => None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(files: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |p| files.iter().find(|(k, _)| *k == p).map(|(_, v)| v.to_string())
    }

    #[test]
    fn pages_shared_by_ranges_count_once() {
        let p = 100;
        assert_eq!(pages_covering(&[], p), 0);
        assert_eq!(pages_covering(&[(0, 1)], p), 100);
        // the same page from two ranges; a range ending on a boundary stays in its page
        assert_eq!(pages_covering(&[(10, 20), (30, 100)], p), 100);
        // straddling ranges, out of order, one inside another, an empty one
        assert_eq!(pages_covering(&[(250, 420), (90, 110), (260, 270), (500, 500)], p), 500);
        assert_eq!(pages_covering(&[(0, 1000), (150, 160)], p), 1000);
    }

    #[test]
    fn the_automatic_budget_follows_the_cgroup_limit() {
        let gib = 1u64 << 30;
        // v2, the process's own cgroup
        let v2 = fake(&[("/proc/self/cgroup", "0::/user.slice/x\n"), ("/sys/fs/cgroup/user.slice/x/memory.max", "8589934592\n")]);
        assert_eq!(ram_limit_from(v2, Some(20 * gib), Some(24 * gib)), Some((8 * gib, "the cgroup's memory.max")));
        // v2 without a limit ("max"), then v1 with one
        let v1 = fake(&[("/proc/self/cgroup", "0::/\n"), ("/sys/fs/cgroup/memory.max", "max\n"), ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "4294967296\n")]);
        assert_eq!(ram_limit_from(v1, Some(20 * gib), Some(24 * gib)), Some((4 * gib, "the cgroup's memory.limit_in_bytes")));
        // v1's "no limit" (i64::MAX rounded to a page) is not a limit
        let none = fake(&[("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")]);
        assert_eq!(ram_limit_from(none, Some(20 * gib), Some(24 * gib)), Some((20 * gib, "MemAvailable")));
        assert_eq!(ram_limit_from(fake(&[]), None, Some(24 * gib)), Some((24 * gib, "MemTotal")));
        assert_eq!(ram_limit_from(fake(&[]), None, None), None);
        // v1, the process's own memory cgroup (a bench or container puts it there), not the root
        let own_v1 = fake(&[
            ("/proc/self/cgroup", "5:devices:/\n4:memory:/process_api/run7\n0::/\n"),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("/sys/fs/cgroup/memory/process_api/run7/memory.limit_in_bytes", "4294967296\n"),
        ]);
        assert_eq!(ram_limit_from(own_v1, Some(20 * gib), Some(24 * gib)), Some((4 * gib, "the cgroup's memory.limit_in_bytes")));
        // a tighter limit above the process's cgroup binds it too; controllers sharing a line
        let nested = fake(&[
            ("/proc/self/cgroup", "3:cpu,memory:/a/b\n"),
            ("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", "2147483648\n"),
            ("/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", "4294967296\n"),
        ]);
        assert_eq!(ram_limit_from(nested, Some(20 * gib), Some(24 * gib)), Some((2 * gib, "the cgroup's memory.limit_in_bytes")));
        let nested_v2 = fake(&[("/proc/self/cgroup", "0::/x/y\n"), ("/sys/fs/cgroup/x/memory.max", "3221225472\n"), ("/sys/fs/cgroup/x/y/memory.max", "max\n")]);
        assert_eq!(ram_limit_from(nested_v2, Some(20 * gib), Some(24 * gib)), Some((3 * gib, "the cgroup's memory.max")));
    }
}
