//! Engine configuration: the one place where run-time knobs live. The library never reads
//! environment variables; hosts (CLI, server) build this struct.

/// Element type of the KV cache (llama.cpp's `-ctk` / `-ctv`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    F32,
    /// llama.cpp's default: K and V rounded to f16 (nearest even) as they are written.
    #[default]
    F16,
    /// Blocks of 32: an f16 scale and 32 int8 (ggml's Q8_0), quantized as they are written.
    Q8_0,
}

impl KvType {
    /// A block-quantized type (ggml_is_quantized): q8_0.
    pub fn is_quantized(self) -> bool {
        matches!(self, KvType::Q8_0)
    }

    /// Bytes of `n` elements (`n` a multiple of 32 for Q8_0).
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            KvType::F32 => 4 * n,
            KvType::F16 => 2 * n,
            KvType::Q8_0 => n / 32 * 34,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            other => Err(format!("`{other}` is not a KV cache type xwen has (f32, f16, q8_0)")),
        }
    }
}

/// Flash attention (llama.cpp's `-fa`): `Auto` is on wherever the CPU path exists — every
/// model xwen runs — as llama.cpp resolves it on the CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlashAttn {
    #[default]
    Auto,
    On,
    Off,
}

impl FlashAttn {
    pub fn enabled(self) -> bool {
        !matches!(self, FlashAttn::Off)
    }
}

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
    /// the file (the page cache decides); Some(0) = 3/4 of what this process may use (`memory_plan::ram_limit`: the cgroup's limit, else MemAvailable); Some(n) = n. With
    /// a budget, a MoE model's routed experts stream from disk into a cache of what the trunk,
    /// state and scratch leave (`memory_plan`), and a budget under the floor is refused.
    pub ram_budget: Option<u64>,
    /// With streamed experts, read the next MoE layer's likely experts (its router on this
    /// layer's input) while a decode step's layer computes (`ExpertStore::prefetch`).
    pub expert_prefetch: bool,
    /// Bytes of the budget the caller keeps for itself (a server's prefix cache of conversation
    /// states, `xwen serve --cache-ram`): the plan counts them before it sizes the expert cache,
    /// and a budget that cannot hold them too is refused. Ignored without a budget.
    pub reserved_ram: u64,
    /// Bytes of the budget a drafter beside the model takes — a draft model run mapped with
    /// its states (`Model::ram_needed`) — counted like `reserved_ram`. Ignored without a budget.
    pub draft_ram: u64,
    /// Batches of 512 tokens a streamed prefill wave holds under a budget (each layer passes
    /// them together, reading an expert once for all of them): None = the plan's choice (up to
    /// 4 where the cache gives up at most an eighth), Some(1) = batch by batch.
    pub prefill_wave: Option<usize>,
    /// The deepest speculative verify the caller will run, in drafted tokens (0: no drafting).
    /// Under a budget the plan counts the recurrent states such a verify keeps for its rollback
    /// — twice the depth per sequence at the peak (`SeqState::history_bytes`) — where a drafter
    /// will run: an external one (`load_mtp` off), or the MTP head the file carries.
    pub draft_depth: usize,
    /// An MTP-only sidecar GGUF (`convert_hf_to_gguf.py --mtp`) or another "-MTP" file of this
    /// model whose draft head replaces the file's own (`Model::attach_mtp`); under a budget its
    /// weights count in the plan.
    pub mtp_sidecar: Option<std::path::PathBuf>,
    /// A DFlash drafter's sidecar GGUF to attach at load (`--draft dflash:FILE`): under a RAM
    /// budget the plan counts its weights and every sequence's drafter cache at `max_ctx`.
    /// Without a budget `Model::attach_dflash` after load does the same.
    pub dflash_sidecar: Option<std::path::PathBuf>,
    /// Load the file's own MTP head where it has one (llama.cpp's `load_mtp`); off when
    /// nothing will draft with it, so a budget does not pay for its KV.
    pub load_mtp: bool,
    /// Sequences held at once (batched decode, a server's slots): a RAM plan reserves the state
    /// of this many at `max_ctx` positions, and under a budget `Model::max_sequences` says so.
    pub n_seq: usize,
    /// Record every MoE routing decision (`Model::take_routes`), to compare two runs' routes.
    pub record_routes: bool,
    /// Record named intermediate tensors (`Model::take_taps`, `xwen logits --dump-tensors`), in
    /// llama.cpp's names, to bisect a difference against tools/oracle/llama_dump.cpp.
    pub record_taps: bool,
    /// Cap the kernel set (`xwen_kernels::dispatch::set_max_isa`): `Some(Avx2)` on an AVX-512
    /// CPU reproduces an AVX2 llama.cpp build's float orders. Process-wide, like the
    /// reference-kernel switch.
    pub max_isa: Option<xwen_kernels::dispatch::Isa>,
    /// KV cache element types (K, V). llama.cpp's default is f16 for both.
    pub kv_types: (KvType, KvType),
    /// Flash attention: on reproduces llama.cpp's CPU flash-attention path, off its plain
    /// kq / softmax / kqv path (which xwen has for an f32 cache only).
    pub flash_attn: FlashAttn,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { threads: 0, force_reference: false, max_ctx: 32768, chunked_prefill: false, profile: false, map_pages: xwen_gguf::MapPages::Huge, reread_huge_pages: false, ram_budget: None, expert_prefetch: true, reserved_ram: 0, draft_ram: 0, draft_depth: 0, prefill_wave: None, mtp_sidecar: None, dflash_sidecar: None, load_mtp: true, n_seq: 1, record_routes: false, record_taps: false, max_isa: None, kv_types: (KvType::F16, KvType::F16), flash_attn: FlashAttn::Auto }
    }
}

impl EngineConfig {
    /// The KV types the cache holds: with flash attention llama.cpp casts an f32 K or V to f16
    /// before the op (llama-graph.cpp `build_attn_mha`), so an f32 cache computes exactly as an
    /// f16 one — xwen stores it as f16 then, which also halves its memory. f16 and q8_0 stay.
    pub fn effective_kv_types(&self) -> (KvType, KvType) {
        let cast = |t: KvType| if t == KvType::F32 { KvType::F16 } else { t };
        if self.flash_attn.enabled() {
            (cast(self.kv_types.0), cast(self.kv_types.1))
        } else {
            self.kv_types
        }
    }

    /// The oracle's settings the committed parity fixtures were recorded under: an f32 KV
    /// cache, flash attention off.
    pub fn with_f32_cache_no_flash(mut self) -> Self {
        self.kv_types = (KvType::F32, KvType::F32);
        self.flash_attn = FlashAttn::Off;
        self
    }

    pub fn resolved_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        }
    }
}
