//! Engine configuration: the one place where run-time knobs live. The library never reads
//! environment variables; hosts (CLI, server) build this struct.

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Worker threads for matrix work (0 = all available cores).
    pub threads: usize,
    /// Force the scalar reference kernels everywhere (bisecting numeric differences).
    pub force_reference: bool,
    /// Maximum positions a sequence may hold (sizes nothing up front; KV grows on demand).
    pub max_ctx: usize,
    /// DeltaNet prefill form: the chunked (WY) form or the token-by-token recurrence that
    /// llama.cpp's CPU backend runs. They agree to f32 round-off; only the recurrence is
    /// bit-identical to llama.cpp (see docs/decisions.md "DeltaNet prefill").
    pub chunked_prefill: bool,
    /// Accumulate per-op wall time (see `Model::profile_report`).
    pub profile: bool,
    /// Page size asked for the weights' mapping (2 MiB by default; see `xwen_gguf::MapPages`).
    pub map_pages: xwen_gguf::MapPages,
    /// Drop the file from the page cache before mapping it, so it is read back from disk in
    /// 2 MiB pages (`xwen_gguf::evict_from_page_cache`); for a cache another program filled.
    pub reread_huge_pages: bool,
    /// A hard ceiling on the RAM the engine holds, in bytes: None = every weight mapped from
    /// the file (the page cache decides); Some(0) = 3/4 of the machine's RAM; Some(n) = n. With
    /// a budget, a MoE model's routed experts stream from disk into a cache of what the trunk,
    /// state and scratch leave (`memory_plan`), and a budget under the floor is refused.
    pub ram_budget: Option<u64>,
    /// Sequences held at once (batched decode, a server's slots): a RAM plan reserves the state
    /// of this many at `max_ctx` positions, and under a budget `Model::max_sequences` says so.
    pub n_seq: usize,
    /// Record every MoE routing decision (`Model::take_routes`), to compare two runs' routes.
    pub record_routes: bool,
    /// Cap the kernel set (`xwen_kernels::dispatch::set_max_isa`): `Some(Avx2)` on an AVX-512
    /// CPU reproduces an AVX2 llama.cpp build's float orders. Process-wide, like the
    /// reference-kernel switch.
    pub max_isa: Option<xwen_kernels::dispatch::Isa>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { threads: 0, force_reference: false, max_ctx: 32768, chunked_prefill: false, profile: false, map_pages: xwen_gguf::MapPages::Huge, reread_huge_pages: false, ram_budget: None, n_seq: 1, record_routes: false, max_isa: None }
    }
}

impl EngineConfig {
    pub fn resolved_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        }
    }
}
