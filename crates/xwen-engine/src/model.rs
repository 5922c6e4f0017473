//! The public model handle: load a GGUF, create sequence states, run forward passes.

use crate::backend::cpu::Cpu;
use crate::backend::Backend;
use crate::config::EngineConfig;
use crate::ctx::Ctx;
use crate::error::{EngineError, Result};
use crate::experts::replay::Route;
use crate::experts::store::{ExpertStore, ResidentExperts};
use crate::experts::streamed::{ExpertCacheStats, StreamedExperts};
use crate::memory_plan::{MemoryPlan, PREFILL_BATCH};
use crate::models::{self, Network};
use crate::profile::Profiler;
use crate::state::SeqState;
use std::path::Path;
use std::sync::{Arc, Mutex};
use xwen_gguf::GgufFile;
use xwen_kernels::Pool;

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsMode {
    /// Every position: n_tokens × n_vocab.
    All,
    /// The last position only: n_vocab.
    Last,
    /// Only the argmax of the last position (a pure-greedy decode: `Sampler::is_greedy` and
    /// nothing that reads the logits). The CPU returns the last row's logits as for `Last`; a
    /// device may pick the token itself and return it in `SpanOut::argmax` with no logits,
    /// sparing the copy of a vocabulary's logits a token.
    LastArgmax,
    /// Every row's argmax only (a greedy speculative verify, or its one-row step: nothing
    /// reads the logits). The CPU returns every row's logits as for `All`; a device may pick
    /// each row's token itself, skipping the step's `banned`, and return them in
    /// `SpanOut::picks` with no logits, sparing a vocabulary's logits a row.
    AllArgmax,
    /// None (prefill that only advances the state).
    None,
}

impl LogitsMode {
    /// The rows of an `n`-row span whose logits this mode returns.
    pub(crate) fn rows(self, n: usize) -> std::ops::Range<usize> {
        match self {
            LogitsMode::All | LogitsMode::AllArgmax => 0..n,
            LogitsMode::Last | LogitsMode::LastArgmax => n.saturating_sub(1)..n,
            LogitsMode::None => n..n,
        }
    }

    /// This mode for one piece of an input fed in pieces: `All` for every piece, `Last` for the
    /// piece that holds the last token (`last`), `None` for the rest.
    fn for_piece(self, last: bool) -> LogitsMode {
        match self {
            LogitsMode::All | LogitsMode::AllArgmax => LogitsMode::All,
            LogitsMode::Last if last => LogitsMode::Last,
            LogitsMode::LastArgmax if last => LogitsMode::LastArgmax,
            _ => LogitsMode::None,
        }
    }
}

/// More worker threads than any machine xwen runs on has cores is a mistake, not a request.
pub const MAX_THREADS: usize = 1024;

/// One sequence's part of a batched forward step (`Model::forward_batch`); over a group of
/// ranks, `S` is the sequence's `GroupState` (`runtime::ranks::GroupStep`).
pub struct SeqStep<'a, S = SeqState> {
    pub state: &'a mut S,
    /// The tokens this step feeds, at `state.pos` onwards.
    pub tokens: &'a [u32],
    pub logits: LogitsMode,
    /// Compute every row in the one-token (decode) order, as if the tokens were decoded one by
    /// one: a speculative verify's rows then carry exactly plain decode's logits.
    pub decode_order: bool,
    /// Also return every row's final hidden (after output_norm: what an MTP head reads;
    /// `forward_batch_out`).
    pub hidden: bool,
    /// With `LastArgmax`: tokens the argmax skips (a greedy sampler's bans, e.g. the
    /// end-of-generation tokens under `ignore_eos`); a model that returns logits instead leaves
    /// them to the sampler.
    pub banned: &'a [u32],
}

impl<'a, S> SeqStep<'a, S> {
    /// A step in the span's own order (a prefill chunk, or one decode token).
    pub fn new(state: &'a mut S, tokens: &'a [u32], logits: LogitsMode) -> SeqStep<'a, S> {
        SeqStep { state, tokens, logits, decode_order: false, hidden: false, banned: &[] }
    }
}

/// Architectures xwen runs (the registry's, `models::REGISTRY`) and those it recognizes but
/// does not run yet.
pub use crate::models::KNOWN_UNIMPLEMENTED as KNOWN_UNIMPLEMENTED_ARCHS;
pub fn supported_archs() -> Vec<&'static str> {
    models::supported().collect()
}

impl Drop for Model {
    fn drop(&mut self) {
        self.read_in_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The MTP head a model of `file` drafts with under `cfg`: the sidecar's where one is given,
/// else the file's own nextn block (unless `cfg.load_mtp` is off).
fn load_mtp(file: &Arc<GgufFile>, net: &dyn models::Network, cfg: &EngineConfig) -> Result<Option<models::mtp::MtpHead>> {
    if let Some(p) = &cfg.mtp_sidecar {
        return Ok(Some(load_mtp_sidecar(p, net.hidden(), net.n_vocab())?));
    }
    Ok(match file.architecture() {
        Some("qwen35" | "qwen35moe" | "qwen4exp") if cfg.load_mtp => models::mtp::MtpHead::load_any(file)?,
        _ => None,
    })
}

/// What a RAM plan counts for the MTP head: its KV for every sequence at `max_ctx`, and a
/// sidecar's weights (the file's own head is in the trunk already) — mapped, all of it touched.
fn mtp_reserve(head: Option<&models::mtp::MtpHead>, cfg: &EngineConfig) -> u64 {
    head.map_or(0, |h| {
        let weights = if cfg.mtp_sidecar.is_some() { h.file().tensor_bytes() } else { 0 };
        weights.saturating_add(h.state_bytes(cfg.max_ctx, cfg.effective_kv_types()).saturating_mul(cfg.n_seq.max(1) as u64))
    })
}

/// The DFlash sidecar at `path` for the trunk of `target` (`net`): the head, and the bytes of
/// its weights.
fn load_dflash(path: &Path, target: &GgufFile, net: &dyn Network) -> Result<(models::dflash::DflashHead, u64)> {
    let at = |e: EngineError| match e {
        EngineError::Config(m) => EngineError::Config(format!("{}: {m}", path.display())),
        e => EngineError::Config(format!("{}: {e}", path.display())),
    };
    let arch = net.arch().to_string();
    if !matches!(arch.as_str(), "qwen35" | "qwen35moe" | "qwen3next") {
        return Err(EngineError::Config(format!("{}: DFlash drafting taps a qwen35 / qwen35moe / qwen3next trunk, not {arch}", path.display())));
    }
    let n_layer = target.get_u64(&format!("{arch}.block_count")).unwrap_or(0).saturating_sub(target.get_u64(&format!("{arch}.nextn_predict_layers")).unwrap_or(0)) as usize;
    let f = Arc::new(GgufFile::open(path).map_err(|e| at(e.into()))?);
    let weights = f.tensor_bytes();
    let head = models::dflash::DflashHead::load(&f, target, net.hidden(), n_layer, net.n_vocab()).map_err(at)?;
    Ok((head, weights))
}

/// The recurrent states verifies of up to `cfg.draft_depth` tokens keep for their rollbacks,
/// every sequence: twice the depth at the peak (the kept states and the spare ones the next
/// verify reuses, `DeltaState::recycle`) — 2 · 8 · 63 MiB a sequence on the 35B-A3B at the
/// default depth. Counted only where a drafter will run: an external one (`load_mtp` off) or
/// the file's MTP head (`has_head`).
fn verify_history_reserve(net: &dyn Network, has_head: bool, cfg: &EngineConfig) -> u64 {
    if cfg.draft_depth == 0 || (cfg.load_mtp && !has_head) {
        return 0;
    }
    // one sequence's recurrent state: its state at no positions (KV empty)
    let recurrent = net.plan_figures(0, cfg.effective_kv_types()).state_bytes;
    recurrent.saturating_mul(2 * cfg.draft_depth as u64).saturating_mul(cfg.n_seq.max(1) as u64)
}

/// The bytes a RAM plan for `file` under `cfg` counts for drafting beside a draft model's own
/// (`EngineConfig::draft_ram`): the MTP head and the verify's kept states (`xwen plan`, which
/// plans without loading the model) — what `Model::load` would count.
pub fn mtp_plan_bytes(file: &Arc<GgufFile>, cfg: &EngineConfig) -> Result<u64> {
    let net = models::load(file)?.net;
    let head = load_mtp(file, &*net, cfg)?;
    Ok(mtp_reserve(head.as_ref(), cfg).saturating_add(verify_history_reserve(&*net, head.is_some(), cfg)))
}

/// The MTP head a run of `file` under `cfg` would draft with — the sidecar's, or the file's own
/// nextn block — read without loading the model (`xwen plan -ngl 99` sizes its device copy).
pub fn mtp_head_for_plan(file: &Arc<GgufFile>, cfg: &EngineConfig) -> Result<Option<models::mtp::MtpHead>> {
    let net = models::load(file)?.net;
    load_mtp(file, &*net, cfg)
}

/// The MTP head of the GGUF at `path` for a trunk of width `hidden` and vocabulary `n_vocab`.
fn load_mtp_sidecar(path: &Path, hidden: usize, n_vocab: usize) -> Result<models::mtp::MtpHead> {
    let f = Arc::new(GgufFile::open(path)?);
    let head = models::mtp::MtpHead::load_any(&f)
        .map_err(|e| EngineError::Config(format!("{}: {e}", path.display())))?
        .ok_or_else(|| EngineError::Config(format!("{}: no MTP (nextn) block in this file", path.display())))?;
    if !head.fits(hidden, n_vocab) {
        return Err(EngineError::Config(format!(
            "{}: an MTP head of width {} and vocabulary {} for a model of {hidden} and {n_vocab}",
            path.display(),
            head.hidden(),
            head.n_vocab()
        )));
    }
    Ok(head)
}

pub struct Model {
    file: Arc<GgufFile>,
    net: Box<dyn Network>,
    store: Arc<dyn ExpertStore>,
    /// The lookup tables whose rows stream from disk (a budgeted qwen4exp's PLE table); None:
    /// every table is mapped.
    rows: Option<crate::experts::rows::StreamedRows>,
    /// Stops the background read-in of a cache that holds every expert (set on drop).
    read_in_stop: Arc<std::sync::atomic::AtomicBool>,
    /// What the forward passes compute on (its worker pool runs one parallel job at a time).
    backend: Cpu,
    /// Concurrent forwards take turns on the backend.
    pool_lock: Mutex<()>,
    cfg: EngineConfig,
    prof: Profiler,
    /// The RAM plan in force (`EngineConfig::ram_budget`); None = everything mapped.
    plan: Option<MemoryPlan>,
    /// Routing decisions recorded since the last `take_routes` (`EngineConfig::record_routes`).
    routes: Mutex<Vec<Route>>,
    /// Named intermediate tensors recorded since the last `take_taps` (`EngineConfig::record_taps`).
    taps: Mutex<Vec<crate::ctx::Tap>>,
    /// The MTP draft head: the model file's own nextn block, or a sidecar GGUF's
    /// (`attach_mtp`), which replaces it.
    mtp: Option<models::mtp::MtpHead>,
    /// The DFlash block drafter (`attach_dflash`); while it is attached, a step's hidden rows
    /// are its features (the tapped layers' inputs) instead of the final hidden.
    dflash: Option<models::dflash::DflashHead>,
    /// The device that computes the passes (`attach_device`); None: this process's CPUs.
    device: Option<Arc<dyn crate::device::DeviceModel>>,
    /// With a device: a state's layer shapes with no contents, what `new_state` copies.
    device_shape: Option<SeqState>,
    /// This model's rank of a sharded model (`join_shard`); None: the whole model.
    shard: Option<crate::shard::Shard>,
}

impl Model {
    pub fn load(path: &Path, cfg: &EngineConfig) -> Result<Model> {
        Model::from_gguf_at(Arc::new(Model::open_file(path, cfg)?), Some(path), cfg)
    }

    /// Opens a GGUF the way `load` does: the page cache dropped first when
    /// `cfg.reread_huge_pages`, the mapping asking for `cfg.map_pages`.
    pub fn open_file(path: &Path, cfg: &EngineConfig) -> Result<GgufFile> {
        if cfg.reread_huge_pages {
            // only a hint to the kernel: a failure leaves the cache as it was (the load line's
            // count of 2 MiB pages shows the outcome)
            let _ = xwen_gguf::evict_from_page_cache(path);
        }
        Ok(GgufFile::open_with(path, cfg.map_pages)?)
    }

    /// A model over an opened file. With a RAM budget, a MoE model's experts are streamed
    /// from the file, whose path this form does not know: use `from_gguf_at` or `load`.
    pub fn from_gguf(file: Arc<GgufFile>, cfg: &EngineConfig) -> Result<Model> {
        Model::from_gguf_at(file, None, cfg)
    }

    /// `from_gguf` for the file at `path` (which `file` was opened from): the path is where a
    /// budgeted MoE model streams its experts from.
    pub fn from_gguf_at(file: Arc<GgufFile>, path: Option<&Path>, cfg: &EngineConfig) -> Result<Model> {
        xwen_kernels::dispatch::set_force_reference(cfg.force_reference);
        if cfg.max_isa.is_some() {
            xwen_kernels::dispatch::set_max_isa(cfg.max_isa);
        }
        let head_dim = file.architecture().and_then(|a| file.get_u64(&format!("{a}.attention.key_length"))).unwrap_or(0);
        if [cfg.kv_types.0, cfg.kv_types.1].contains(&crate::config::KvType::Q8_0) && !head_dim.is_multiple_of(32) {
            return Err(EngineError::Config(format!("a q8_0 KV cache needs a head size that is a multiple of 32, not {head_dim}")));
        }
        if !cfg.flash_attn.enabled() && cfg.kv_types != (crate::config::KvType::F32, crate::config::KvType::F32) {
            return Err(EngineError::Config(format!(
                "flash attention off needs an f32 KV cache (-ctk f32 -ctv f32), not {}/{}: xwen reproduces llama.cpp's plain attention path on an f32 cache only",
                cfg.kv_types.0.name(),
                cfg.kv_types.1.name()
            )));
        }
        let models::Loaded { net, experts } = models::load(&file)?;
        let threads = cfg.resolved_threads();
        let figures = net.plan_figures(cfg.max_ctx, cfg.effective_kv_types());
        let tables = net.row_tables();
        let mtp = load_mtp(&file, &*net, cfg)?;
        let dflash = cfg.dflash_sidecar.as_deref().map(|p| load_dflash(p, &file, &*net)).transpose()?;
        // its weights and every sequence's drafter cache at the context
        let dflash_reserve = dflash.as_ref().map_or(0, |(h, weights)| weights.saturating_add(h.state_bytes(cfg.max_ctx).saturating_mul(cfg.n_seq.max(1) as u64)));
        let plan = match cfg.ram_budget {
            None => None,
            Some(b) => {
                let draft = cfg
                    .draft_ram
                    .saturating_add(mtp_reserve(mtp.as_ref(), cfg))
                    .saturating_add(dflash_reserve)
                    .saturating_add(verify_history_reserve(&*net, mtp.is_some() || dflash.is_some(), cfg));
                let reserved = crate::memory_plan::Reserved { prefix_cache: cfg.reserved_ram, draft };
                let mut plan = MemoryPlan::new(&file, &figures, &experts, &tables, cfg.max_ctx, cfg.n_seq, b, reserved, crate::memory_plan::ram_limit())?;
                if let Some(w) = cfg.prefill_wave {
                    plan.set_wave_batches(w)?;
                }
                Some(plan)
            }
        };
        let has_experts = experts.iter().any(|e| e.is_some());
        let store: Arc<dyn ExpertStore> = match (&plan, has_experts) {
            (Some(p), true) => {
                let path = path.ok_or_else(|| EngineError::RamBudget("streaming experts needs the model file's path (this model was opened from memory)".into()))?;
                {
                    // as many finished reads' buffers kept for reuse as the plan counts in flight
                    let n_expert = experts.iter().flatten().map(|m| m[0].n_mats).max().unwrap_or(0);
                    let recycled = crate::memory_plan::in_flight_records(figures.n_used.max(1), n_expert);
                    Arc::new(StreamedExperts::open(path, &file, experts, figures.n_used.max(1), p.cache_bytes, cfg.expert_prefetch, recycled)?)
                }
            }
            _ => Arc::new(ResidentExperts::new(file.clone(), experts)),
        };
        let rows = match (&plan, tables.is_empty()) {
            (Some(p), false) => {
                let path = path.ok_or_else(|| EngineError::RamBudget("streaming table rows needs the model file's path (this model was opened from memory)".into()))?;
                Some(crate::experts::rows::StreamedRows::open(path, &file, &tables, p.row_cache_bytes)?)
            }
            _ => None,
        };
        // a cache that holds every expert: read them all in once, in the background, so decode
        // stops going to the disk after its first pass instead of after every expert's first use
        let read_in_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        if let Some(p) = &plan {
            if store.streams() && p.cache_bytes >= p.all_experts_bytes && p.all_experts_bytes > 0 {
                let (s, stop) = (Arc::clone(&store), Arc::clone(&read_in_stop));
                let _ = std::thread::Builder::new().name("xwen-expert-read-in".into()).spawn(move || {
                    // a failed read here is not an error of any request: the expert is read
                    // again, on demand, when a forward pass needs it
                    let _ = s.read_in_all(&|| stop.load(std::sync::atomic::Ordering::Relaxed));
                });
            }
        }
        if threads > MAX_THREADS {
            return Err(EngineError::Threads(format!("{threads} threads asked for; at most {MAX_THREADS}")));
        }
        let pool = Pool::try_new(threads).map_err(|e| EngineError::Threads(format!("the system refused to start {threads} threads: {e}")))?;
        let prof = Profiler::new(cfg.profile);
        Ok(Model {
            file,
            net,
            store,
            rows,
            read_in_stop,
            backend: Cpu::new(pool),
            pool_lock: Mutex::new(()),
            cfg: cfg.clone(),
            prof,
            plan,
            routes: Mutex::new(Vec::new()),
            taps: Mutex::new(Vec::new()),
            mtp,
            dflash: dflash.map(|(h, _)| h),
            device: None,
            device_shape: None,
            shard: None,
        })
    }

    /// The RAM plan in force, if a budget was given.
    pub fn memory_plan(&self) -> Option<&MemoryPlan> {
        self.plan.as_ref()
    }

    /// Whether routed experts stream from disk (a MoE model under a RAM budget).
    pub fn streams_experts(&self) -> bool {
        self.store.streams()
    }

    /// The routed experts' store (resident, or streamed from disk into a bounded RAM cache):
    /// what a device that keeps its own expert cache reads from.
    pub fn expert_store(&self) -> Arc<dyn ExpertStore> {
        Arc::clone(&self.store)
    }

    /// Hit/miss counters of the expert cache (None unless experts stream).
    pub fn expert_cache_stats(&self) -> Option<ExpertCacheStats> {
        self.store.cache_stats()
    }

    /// The expert-packed sidecar the streamed store reads (`experts::pack`), and why one
    /// beside the model is not used.
    pub fn expert_pack_status(&self) -> (Option<std::path::PathBuf>, Option<String>) {
        self.store.pack_status()
    }

    pub fn reset_expert_cache_stats(&self) {
        self.store.reset_cache_stats()
    }

    /// Counters of the row cache (None unless a table streams: a budgeted qwen4exp's PLE table).
    pub fn row_cache_stats(&self) -> Option<crate::experts::rows::RowCacheStats> {
        self.rows.as_ref().map(|r| r.stats())
    }

    pub fn reset_row_cache_stats(&self) {
        if let Some(r) = &self.rows {
            r.reset_stats()
        }
    }

    /// The lookup tables a token reads a few rows of (`Network::row_tables`), which a budgeted
    /// model streams.
    pub fn row_tables(&self) -> Vec<crate::experts::rows::RowTable> {
        self.net.row_tables()
    }

    /// Whether the tensor `name` is read from disk on demand, never through the mapping: a
    /// routed expert stack while experts stream, a streamed table.
    pub fn streams_tensor(&self, name: &str) -> bool {
        (self.streams_experts() && is_routed_expert(name)) || self.rows.as_ref().is_some_and(|r| r.streams(name))
    }

    pub fn architecture(&self) -> &str {
        self.net.arch()
    }

    /// `general.name` as the file states it.
    pub fn name(&self) -> Option<&str> {
        self.file.get_str("general.name")
    }

    /// The official checkpoint this file is, by `general.name` then `file_name` (see
    /// [`crate::checkpoint`]); `None` = run as its architecture.
    pub fn checkpoint(&self, file_name: Option<&str>) -> Option<crate::Checkpoint> {
        crate::release::identify(self.name(), file_name)
    }

    /// Touch every page of the mapped weights (the trunk only, when experts and tables stream) so the
    /// first tokens do not pay for page faults; `progress(done, total)` is called every ~1%
    /// (load progress for large files).
    pub fn prefault(&self, progress: &mut dyn FnMut(u64, u64)) -> u64 {
        let total: u64 = self.mapped_weight_bytes();
        let mut done = 0u64;
        let mut next_report = 0u64;
        let mut sink = 0u8;
        for t in self.file.tensors().iter().filter(|t| !self.streams_tensor(&t.name)) {
            let data = self.file.tensor_data(t);
            for chunk in data.chunks(4096) {
                sink ^= chunk[0];
            }
            done += data.len() as u64;
            if done >= next_report {
                progress(done, total);
                next_report = done + total / 100;
            }
        }
        std::hint::black_box(sink);
        progress(total, total);
        total
    }

    pub fn n_vocab(&self) -> usize {
        self.net.n_vocab()
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.file
    }

    /// (experts per MoE layer, experts each token uses, MoE layers); None for a dense model.
    pub fn moe_geometry(&self) -> Option<(usize, usize, usize)> {
        let f = self.net.plan_figures(1, (crate::config::KvType::F16, crate::config::KvType::F16));
        let layers = self.file.tensors().iter().filter(|t| t.name.ends_with(".ffn_gate_exps.weight")).count();
        (f.n_expert > 0 && layers > 0).then_some((f.n_expert, f.n_used, layers))
    }

    pub fn threads(&self) -> usize {
        self.backend.threads()
    }

    pub fn is_supported(&self) -> bool {
        true
    }

    /// Identifies what a saved sequence state belongs to: the GGUF's tensor table (names, types,
    /// shapes, offsets) and a sample of its bytes, and the cache types in force — a state saved
    /// under any other is refused (`state::codec`, `PrefixCache`).
    pub fn state_fingerprint(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |b: &[u8]| {
            for &x in b {
                h = (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3);
            }
        };
        eat(self.net.arch().as_bytes());
        for t in self.file.tensors() {
            eat(t.name.as_bytes());
            eat(&(t.ty as u32).to_le_bytes());
            for d in &t.dims {
                eat(&d.to_le_bytes());
            }
            eat(&t.offset.to_le_bytes());
        }
        for t in self.file.tensors().iter().take(4) {
            let data = self.file.tensor_data(t);
            eat(&data[..data.len().min(256)]);
        }
        let (k, v) = self.cfg.effective_kv_types();
        eat(&[k as u8, v as u8]);
        h
    }

    /// An empty sequence state, its KV caches of the configured types (`EngineConfig::kv_types`).
    pub fn new_state(&self) -> SeqState {
        if let Some(shape) = &self.device_shape {
            // its contents are made on the device at the first pass (empty recurrent states
            // are its zero states): no host copy of a state the device will hold
            return shape.empty_like();
        }
        self.new_host_state()
    }

    /// An empty sequence state in host memory, its recurrent states zeroed at their sizes,
    /// whether or not a device computes the passes (the template a state read from disk fills).
    pub fn new_host_state(&self) -> SeqState {
        let mut st = self.net.new_state();
        st.set_kv_types(self.cfg.effective_kv_types());
        st.set_kv_rows(self.max_context());
        st
    }

    /// Advance `state` over `tokens` and return the requested logits.
    pub fn forward(&self, state: &mut SeqState, tokens: &[u32], mode: LogitsMode) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        // one step; under a budget `forward_chunks` caps the chunk at the batch the plan's
        // scratch covers, and streams a long prompt in waves of such batches
        self.forward_chunks(state, tokens, tokens.len(), mode)
    }

    /// Advance `state` over `tokens` fed in chunks of `chunk` tokens (llama.cpp's micro-batch),
    /// each chunk its own span: every chunk's logits are the bits feeding the chunks one by one
    /// gives. Where the model streams its experts, up to `wave_tokens(chunk)` of them pass each
    /// layer together as a prefill wave, so an expert is read once for the whole wave. Returns
    /// the requested logits (`All`: every token's, back to back).
    pub fn forward_chunks(&self, state: &mut SeqState, tokens: &[u32], chunk: usize, mode: LogitsMode) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        let n = tokens.len();
        self.check_context(state, n)?;
        let chunk = chunk.clamp(1, self.max_batch_rows());
        let per_wave = self.wave_tokens(chunk);
        let mut out = Vec::new();
        let mut at = 0;
        while at < n {
            let end = (at + per_wave).min(n);
            if end - at > chunk {
                if let Some(l) = self.forward_wave(state, &tokens[at..end], chunk, mode.for_piece(end == n))? {
                    out.extend(l);
                    at = end;
                    continue;
                }
            }
            // chunk by chunk: no wave here, or one chunk
            while at < end {
                let stop = (at + chunk).min(end);
                let mut step = [SeqStep::new(&mut *state, &tokens[at..stop], mode.for_piece(stop == n))];
                out.extend(self.forward_batch(&mut step)?.pop().unwrap_or_default());
                at = stop;
            }
        }
        Ok(out)
    }

    /// Prompt tokens one prefill wave of `chunk`-token chunks holds (`forward_chunks`): as many
    /// whole chunks as the plan's wave rows take where the model streams its experts, else one
    /// chunk. A caller feeding a prompt piece by piece hands over this many at a time.
    pub fn wave_tokens(&self, chunk: usize) -> usize {
        let chunk = chunk.clamp(1, self.max_batch_rows());
        let rows = self.wave_rows();
        if rows > PREFILL_BATCH {
            chunk * (rows / chunk).max(1)
        } else {
            chunk
        }
    }

    /// Positions one sequence may hold (`EngineConfig::max_ctx`, `-c`).
    pub fn max_context(&self) -> usize {
        self.cfg.max_ctx
    }

    /// Sequences the RAM plan holds state for (`EngineConfig::n_seq`); unbounded without a
    /// budget. The scheduler admits no more.
    pub fn max_sequences(&self) -> usize {
        self.plan.as_ref().map_or(usize::MAX, |p| p.n_seq)
    }

    /// Rows one batch may hold: a budgeted model's scratch covers `PREFILL_BATCH` rows; a
    /// mapped one has no limit of its own.
    pub fn max_batch_rows(&self) -> usize {
        if self.plan.is_some() {
            PREFILL_BATCH
        } else {
            usize::MAX
        }
    }

    /// One forward step over several sequences at once — any mix of decode rows (one token)
    /// and prefill chunks, each sequence at its own position in its own state. Weights are read
    /// once per step for all decode rows. Returns each step's requested logits, in order.
    ///
    /// Batch invariance: a sequence's logits are the bits it gets when run alone with the same
    /// span sizes (`forward` with these tokens), whatever else shares the batch.
    pub fn forward_batch(&self, steps: &mut [SeqStep]) -> Result<Vec<Vec<f32>>> {
        Ok(self.forward_batch_out(steps)?.into_iter().map(|o| o.logits).collect())
    }

    /// `forward_batch` returning each step's logits and, for steps that ask (`SeqStep::hidden`),
    /// every row's final hidden.
    pub fn forward_batch_out(&self, steps: &mut [SeqStep]) -> Result<Vec<models::SpanOut>> {
        self.forward_batch_each(steps)?.into_iter().collect()
    }

    /// `forward_batch_out` that fails only the sequences an expert read failed for: each
    /// step's output, or the read error its rows met (its state is then past repair — end
    /// that sequence). The other steps' outputs are the bits they get without the fault. An
    /// error of the batch as a whole (a bad token, a full context, too many rows) is the
    /// outer error.
    pub fn forward_batch_each(&self, steps: &mut [SeqStep]) -> Result<Vec<Result<models::SpanOut>>> {
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        let mut rows = 0usize;
        for (i, s) in steps.iter().enumerate() {
            self.check_feed(s.state, s.tokens)?;
            if steps[..i].iter().any(|o| std::ptr::eq(&*o.state, &*s.state)) {
                return Err(EngineError::State(format!("sequence {i} appears twice in one batch")));
            }
            rows += s.tokens.len();
        }
        if steps.len() > self.max_sequences() {
            return Err(EngineError::State(format!(
                "a batch of {} sequences exceeds the {} whose state the RAM plan holds (EngineConfig::n_seq)",
                steps.len(),
                self.max_sequences()
            )));
        }
        if rows > self.max_batch_rows() {
            return Err(EngineError::State(format!("a batch of {rows} rows exceeds the {} rows the RAM plan's scratch holds: split the prompt", self.max_batch_rows())));
        }
        if let Some(dev) = &self.device {
            return self.forward_on_device(dev.as_ref(), steps);
        }
        let spans: Vec<models::SpanIn> =
            steps.iter().map(|s| models::SpanIn { tokens: s.tokens, logits: s.logits.rows(s.tokens.len()), decode_order: s.decode_order, hidden: s.hidden }).collect();
        let mut states: Vec<&mut SeqState> = steps.iter_mut().map(|s| &mut *s.state).collect();
        let _guard = self.pool_lock.lock().unwrap_or_else(|p| p.into_inner());
        let sink = Mutex::new(Vec::new());
        let faults = Mutex::new(Vec::new());
        let ctx = self.ctx(&sink, &faults);
        // each sequence's first batch row, row count and position before the step, to place
        // the recorded rows (only when recording)
        let starts: Vec<(usize, usize, usize)> = if self.cfg.record_routes {
            let mut row = 0;
            states
                .iter()
                .zip(&spans)
                .map(|(st, sp)| {
                    let r = (row, sp.tokens.len(), st.pos);
                    row += sp.tokens.len();
                    r
                })
                .collect()
        } else {
            Vec::new()
        };
        let out = self.net.forward(&ctx, self.store.as_ref(), &mut states, &spans);
        self.keep_routes(sink, &starts);
        let out = out?;
        // each failed read fails the steps whose rows needed it; the first error a step met is
        // its error
        let mut failed: Vec<Option<EngineError>> = (0..spans.len()).map(|_| None).collect();
        let ends: Vec<usize> = spans
            .iter()
            .scan(0, |row, sp| {
                *row += sp.tokens.len();
                Some(*row)
            })
            .collect();
        for f in faults.into_inner().unwrap_or_else(|p| p.into_inner()) {
            let mut hit: Vec<usize> = f.rows.iter().map(|&r| ends.partition_point(|&e| e <= r)).collect();
            hit.sort_unstable();
            hit.dedup();
            let mut error = Some(f.error);
            for (n, &i) in hit.iter().enumerate() {
                if failed[i].is_none() {
                    let e = if n + 1 == hit.len() { error.take() } else { error.as_ref().map(EngineError::duplicate) };
                    failed[i] = e;
                }
            }
        }
        Ok(out
            .into_iter()
            .zip(failed)
            .map(|(o, f)| match f {
                Some(e) => Err(e),
                None => Ok(o),
            })
            .collect())
    }

    /// `forward_batch_each` on the attached device: a verify's span (decode order) on its own,
    /// the prompt spans together (`DeviceModel::forward_prompts`), then the one-token steps
    /// (decode rows) as decode batches of up to the device's `max_rows`; a sequence's bits
    /// depend only on its own spans, as on the CPU. A host state (a fresh one, a prefix-cache
    /// hit) moves onto the device at its first pass.
    fn forward_on_device(&self, dev: &dyn crate::device::DeviceModel, steps: &mut [SeqStep]) -> Result<Vec<Result<models::SpanOut>>> {
        use crate::device::{DevicePrompt, DeviceRow, PromptOut};
        // the device orders its own passes: nothing here runs on the CPU pool
        let mut out: Vec<Option<Result<models::SpanOut>>> = (0..steps.len()).map(|_| None).collect();
        let mut is_row = vec![false; steps.len()];
        let mut is_prompt = vec![false; steps.len()];
        for (i, s) in steps.iter_mut().enumerate() {
            let st = &mut *s.state;
            if !st.is_on_device() {
                match dev.upload(&st.layers, st.pos) {
                    Ok(seq) => st.put_on_device(seq),
                    Err(e) => {
                        out[i] = Some(Err(e));
                        continue;
                    }
                }
            }
            // an MTP drafter reads the step's final hidden rows: the device collects them
            let collects = st.device_mut().map(|seq| seq.collect_hidden(s.hidden));
            if s.hidden && !matches!(collects, Ok(true)) {
                out[i] = Some(Err(EngineError::Config(format!("sequence {i} asks for its hidden rows, which {} does not return", dev.describe()))));
                continue;
            }
            if s.tokens.len() == 1 {
                is_row[i] = true;
                continue;
            }
            if !s.decode_order {
                is_prompt[i] = true;
                continue;
            }
            // a verify's span, each row in the one-token order: a pass of its own (a greedy
            // one's rows picked on the device)
            let one = (|| {
                let pos = st.pos;
                let seq = st.device_mut()?;
                let out = if s.logits == LogitsMode::AllArgmax {
                    models::SpanOut { picks: dev.forward_verify_argmax(seq, pos, s.tokens, s.banned)?, ..Default::default() }
                } else {
                    models::SpanOut { logits: dev.forward(seq, pos, s.tokens, s.logits.rows(s.tokens.len()), true)?, ..Default::default() }
                };
                st.pos += s.tokens.len();
                Ok(out)
            })();
            out[i] = Some(one);
        }
        let mut spans: Vec<DevicePrompt<'_>> = Vec::new();
        let mut members = Vec::new();
        for (i, s) in steps.iter_mut().enumerate().filter(|(i, _)| is_prompt[*i]) {
            let (pos, tokens, banned, mode) = (s.state.pos, s.tokens, s.banned, s.logits);
            match s.state.device_mut() {
                Ok(seq) => {
                    let want = if mode == LogitsMode::LastArgmax { PromptOut::Argmax(banned) } else { PromptOut::Logits(mode.rows(tokens.len())) };
                    spans.push(DevicePrompt { seq, pos, tokens, want });
                    members.push(i);
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let results = if spans.is_empty() { Vec::new() } else { dev.forward_prompts(&mut spans) };
        drop(spans);
        if results.len() != members.len() {
            let e = EngineError::Device(format!("a step's {} prompt spans gave {} outputs", members.len(), results.len()));
            for &i in &members {
                out[i] = Some(Err(e.duplicate()));
            }
        } else {
            for (&i, r) in members.iter().zip(results) {
                out[i] = Some(r.map(span_out));
                if matches!(out[i], Some(Ok(_))) {
                    steps[i].state.pos += steps[i].tokens.len();
                }
            }
        }
        let mut rows: Vec<(usize, &mut SeqStep)> = steps.iter_mut().enumerate().filter(|(i, _)| is_row[*i]).collect();
        for group in rows.chunks_mut(dev.max_rows().max(1)) {
            let mut batch: Vec<DeviceRow<'_>> = Vec::with_capacity(group.len());
            let mut modes = Vec::with_capacity(group.len());
            let mut members = Vec::with_capacity(group.len());
            for (i, s) in group.iter_mut() {
                let i = *i;
                let pos = s.state.pos;
                match s.state.device_mut() {
                    Ok(seq) => {
                        batch.push(DeviceRow { seq, pos, token: s.tokens[0], logits: !matches!(s.logits, LogitsMode::LastArgmax | LogitsMode::AllArgmax | LogitsMode::None), banned: s.banned });
                        modes.push(s.logits);
                        members.push(i);
                    }
                    Err(e) => out[i] = Some(Err(e)),
                }
            }
            match dev.forward_rows(&mut batch) {
                Ok(res) if res.len() == members.len() => {
                    for ((&i, mode), r) in members.iter().zip(modes).zip(res) {
                        out[i] = Some(Ok(match (mode, r) {
                            (LogitsMode::None, _) => models::SpanOut::default(),
                            (LogitsMode::AllArgmax, crate::device::RowOut::Argmax(t)) => models::SpanOut { picks: vec![t], argmax: Some(t), ..Default::default() },
                            (_, r) => span_out(r),
                        }));
                    }
                }
                Ok(res) => {
                    let e = EngineError::Device(format!("a decode batch of {} rows gave {} outputs", members.len(), res.len()));
                    for &i in &members {
                        out[i] = Some(Err(e.duplicate()));
                    }
                }
                Err(e) => {
                    for &i in &members {
                        out[i] = Some(Err(e.duplicate()));
                    }
                }
            }
            for (i, s) in group.iter_mut() {
                if matches!(out[*i], Some(Ok(_))) {
                    s.state.pos += 1;
                }
            }
        }
        for (s, o) in steps.iter_mut().zip(out.iter_mut()) {
            if let (true, Some(Ok(span)), Ok(seq)) = (s.hidden, o.as_mut(), s.state.device_mut()) {
                span.hidden = seq.take_hidden();
            }
        }
        Ok(out.into_iter().map(|o| o.unwrap_or_else(|| Err(EngineError::State("a step the device left unanswered".into())))).collect())
    }

    /// Puts the passes on `dev` (a GPU), which computes them from now on; sequence states move
    /// there at their first pass. Refused where the model carries what the device does not
    /// compute: a RAM plan (experts streamed from disk), a draft head, a KV cache other than f16.
    pub fn attach_device(&mut self, dev: Arc<dyn crate::device::DeviceModel>) -> Result<()> {
        if self.shard.is_some() {
            return Err(EngineError::Config(format!("{}: a rank of a sharded model computes on this process's CPUs", dev.describe())));
        }
        if self.plan.is_some() && !dev.takes_streamed_experts() {
            return Err(EngineError::Config(format!(
                "{}: --ram-budget streams experts to this machine's CPUs; on the device the whole model is resident (its budget is --vram-budget)",
                dev.describe()
            )));
        }
        if self.dflash.is_some() {
            return Err(EngineError::Config(format!("{}: a DFlash drafter is not on the device yet", dev.describe())));
        }
        if self.cfg.mtp_sidecar.is_some() && !dev.has_mtp() {
            return Err(EngineError::Config(format!("{}: the MTP sidecar's head is not on this device", dev.describe())));
        }
        let kv = self.cfg.effective_kv_types();
        if kv != (crate::config::KvType::F16, crate::config::KvType::F16) {
            return Err(EngineError::Config(format!("{}: the device keeps an f16 KV cache, not {}/{} (-ctk/-ctv)", dev.describe(), kv.0.name(), kv.1.name())));
        }
        self.mtp = None;
        let shape = self.new_host_state().empty_like();
        self.device = Some(dev);
        self.device_shape = Some(shape);
        Ok(())
    }

    /// Makes this model rank `shard.comm.rank()` of a sharded model (`crate::shard`): its MoE
    /// layers compute the picks of `shard.experts` only and meet the other ranks in one
    /// reduction a layer, so every pass must run on every rank of the group, in the same order
    /// (`runtime::ranks::ShardGroup` drives them). A draft head's experts stay whole on every rank.
    pub fn join_shard(&mut self, shard: crate::shard::Shard) -> Result<()> {
        if self.device.is_some() {
            return Err(EngineError::Config("a model on a device cannot join a CPU shard group".into()));
        }
        let n_expert = self.moe_geometry().map_or(0, |g| g.0);
        if shard.experts.is_empty() || shard.experts.end > n_expert {
            return Err(EngineError::Config(format!("experts {}..{} of a rank: the model has {n_expert} a layer", shard.experts.start, shard.experts.end)));
        }
        self.shard = Some(shard);
        Ok(())
    }

    /// The configuration the model was loaded with.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The device that computes the passes, in words (None: the CPU).
    pub fn device(&self) -> Option<String> {
        self.device.as_ref().map(|d| d.describe())
    }

    /// Makes the device ready for decode batches of up to `rows` sequences
    /// (`DeviceModel::prepare_rows`: a GPU captures each batch size's step now instead of at its
    /// first use, mid-request). Nothing on the CPU.
    pub fn prepare_decode_batches(&self, rows: usize) -> Result<()> {
        match &self.device {
            Some(d) => d.prepare_rows(rows.min(d.max_rows())),
            None => Ok(()),
        }
    }

    /// A working copy of a host state kept elsewhere (a prefix cache's entry): on the device
    /// where one is attached (uploaded from `src`, no host copy made), else a host clone.
    /// Where the upload fails the host clone is returned (its first pass tries again, and fails
    /// there with the device's error).
    pub fn working_copy(&self, src: &SeqState) -> SeqState {
        if let (Some(d), false) = (&self.device, src.is_on_device()) {
            if let Ok(seq) = d.upload(&src.layers, src.pos) {
                return SeqState::uploaded_from(src, seq);
            }
        }
        src.clone()
    }

    /// Makes the device ready for speculative verifies of up to `rows` rows
    /// (`DeviceModel::prepare_verifies`). Nothing on the CPU.
    pub fn prepare_verifies(&self, rows: usize) -> Result<()> {
        match &self.device {
            Some(d) => d.prepare_verifies(rows.min(d.max_rows())),
            None => Ok(()),
        }
    }

    /// The context a forward runs in, recording its routes into `sink` (where the config asks)
    /// and its failed expert reads into `faults`.
    fn ctx<'s>(&'s self, sink: &'s Mutex<Vec<crate::ctx::RouteRecord>>, faults: &'s Mutex<Vec<crate::ctx::ReadFault>>) -> Ctx<'s> {
        Ctx {
            backend: &self.backend,
            file: &self.file,
            prof: &self.prof,
            chunked_scan: self.cfg.chunked_prefill,
            routes: self.cfg.record_routes.then_some(sink),
            attn: crate::backend::AttnMode { flash: self.cfg.flash_attn.enabled(), threads: self.backend.threads(), n_ctx: self.cfg.max_ctx },
            taps: self.cfg.record_taps.then_some(&self.taps),
            faults: Some(faults),
            rows: self.rows.as_ref(),
            layer_inputs: self.dflash.as_ref().map_or(&[], |d| &d.cfg.taps),
            shard: self.shard.as_ref(),
        }
    }

    /// A forward's routing decisions into the model's record (where the config asks), each
    /// batch row placed by `starts`: every sequence's (first row, rows, position before).
    fn keep_routes(&self, sink: Mutex<Vec<crate::ctx::RouteRecord>>, starts: &[(usize, usize, usize)]) {
        if !self.cfg.record_routes {
            return;
        }
        let mut recs = sink.into_inner().unwrap_or_else(|p| p.into_inner());
        recs.sort_by_key(|r| (r.row, r.layer));
        let mut all = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        for r in recs {
            let seq = starts.iter().position(|&(s, n, _)| r.row >= s && r.row < s + n).expect("a row of the batch");
            let (s0, _, p0) = starts[seq];
            all.push(Route { seq, pos: p0 + r.row - s0, layer: r.layer, experts: r.experts, weights: r.weights, margin: r.margin, next_guess: r.next_guess });
        }
    }

    /// Rows a streamed prefill wave holds (`forward`): the plan's `wave_rows` where the
    /// model streams its experts and records no taps (a wave passes the layers in another
    /// order than the taps' chunk by chunk), else one batch.
    fn wave_rows(&self) -> usize {
        match &self.plan {
            Some(p) if self.store.streams() && !self.cfg.record_taps => p.wave_rows.max(PREFILL_BATCH),
            _ => PREFILL_BATCH,
        }
    }

    /// One sequence's `tokens` (at most `wave_rows`) as a prefill wave of `chunk`-token
    /// chunks (`Network::forward_wave`): each chunk's logits the bits feeding the chunks one by
    /// one gives, each expert read at most once per layer. None where the architecture has no
    /// wave. The requested logits of every chunk, back to back.
    fn forward_wave(&self, state: &mut SeqState, tokens: &[u32], chunk: usize, mode: LogitsMode) -> Result<Option<Vec<f32>>> {
        let n = tokens.len();
        let chunks: Vec<models::SpanIn> = tokens
            .chunks(chunk)
            .enumerate()
            .map(|(i, c)| {
                let logits = mode.for_piece((i + 1) * chunk >= n).rows(c.len());
                models::SpanIn { tokens: c, logits, decode_order: false, hidden: false }
            })
            .collect();
        let _guard = self.pool_lock.lock().unwrap_or_else(|p| p.into_inner());
        let sink = Mutex::new(Vec::new());
        let faults = Mutex::new(Vec::new());
        let ctx = self.ctx(&sink, &faults);
        let p0 = state.pos;
        let out = self.net.forward_wave(&ctx, self.store.as_ref(), state, &chunks);
        self.keep_routes(sink, &[(0, n, p0)]);
        let Some(out) = out? else { return Ok(None) };
        // a failed expert read fails the sequence (its state is past repair), as in forward_batch
        if let Some(f) = faults.into_inner().unwrap_or_else(|p| p.into_inner()).into_iter().next() {
            return Err(f.error);
        }
        Ok(Some(out.into_iter().flat_map(|o| o.logits).collect()))
    }

    /// Loads the MTP draft head of an MTP-only sidecar GGUF (`convert_hf_to_gguf.py --mtp`) or
    /// of another "-MTP" file of this model; it replaces the model file's own head.
    /// Under a RAM budget the plan was made without it: give the sidecar in
    /// `EngineConfig::mtp_sidecar` instead, so its weights are counted (an error here).
    pub fn attach_mtp(&mut self, path: &Path) -> Result<()> {
        if let Some(d) = &self.device {
            return Err(EngineError::Config(format!(
                "{}: the device takes an MTP head when the model goes onto it: give the sidecar when the model loads (EngineConfig::mtp_sidecar, -md)",
                d.describe()
            )));
        }
        if self.plan.is_some() {
            return Err(EngineError::RamBudget(format!(
                "{}: under a RAM budget an MTP sidecar is given when the model loads (EngineConfig::mtp_sidecar), so the plan counts it",
                path.display()
            )));
        }
        self.mtp = Some(load_mtp_sidecar(path, self.hidden_width(), self.n_vocab())?);
        Ok(())
    }

    /// Loads the DFlash block drafter of a DFlash sidecar GGUF (llama.cpp arch `dflash`). From
    /// then on a step's hidden rows (`SeqStep::hidden`) are the drafter's features, so an MTP
    /// drafter cannot run beside it. Under a RAM budget the plan was made without it: an error.
    pub fn attach_dflash(&mut self, path: &Path) -> Result<()> {
        if let Some(d) = &self.device {
            return Err(EngineError::Config(format!("{}: a DFlash drafter is not on the device yet", d.describe())));
        }
        if self.dflash.is_some() && self.cfg.dflash_sidecar.as_deref() == Some(path) {
            // attached at load (and counted by the plan, where there is one)
            return Ok(());
        }
        if self.plan.is_some() {
            return Err(EngineError::RamBudget(format!(
                "{}: under a RAM budget a DFlash sidecar is given when the model loads (EngineConfig::dflash_sidecar), so the plan counts it",
                path.display()
            )));
        }
        self.dflash = Some(load_dflash(path, &self.file, &*self.net)?.0);
        Ok(())
    }

    /// The DFlash drafter's settings, where one is attached.
    pub fn dflash_config(&self) -> Option<&models::dflash::DflashConfig> {
        self.dflash.as_ref().map(|d| &d.cfg)
    }

    /// A fresh DFlash cache (no positions).
    pub fn new_dflash_cache(&self) -> Result<models::dflash::DflashCache> {
        Ok(self.dflash_head()?.new_cache())
    }

    /// The width of a DFlash feature row: the tapped layers' inputs side by side.
    pub fn dflash_feature_width(&self) -> usize {
        self.dflash.as_ref().map_or(0, |d| d.feature_width())
    }

    fn dflash_head(&self) -> Result<&models::dflash::DflashHead> {
        self.dflash.as_ref().ok_or_else(|| EngineError::Config("this model has no DFlash drafter attached".into()))
    }

    /// Injects `n` feature rows into `cache` at its next positions (`DflashHead::inject`).
    pub fn dflash_inject(&self, cache: &mut models::dflash::DflashCache, feats: &[f32], n: usize) -> Result<()> {
        let head = self.dflash_head()?;
        if cache.len + n > self.cfg.max_ctx {
            return Err(EngineError::ContextFull { need: cache.len + n, max: self.cfg.max_ctx });
        }
        let _guard = self.pool_lock.lock().unwrap_or_else(|p| p.into_inner());
        head.inject(&self.head_ctx(head.file()), cache, feats, n)
    }

    /// One denoising forward of the block `tokens` at the cache's next positions: every row's logits.
    pub fn dflash_block(&self, cache: &models::dflash::DflashCache, tokens: &[u32]) -> Result<Vec<f32>> {
        let head = self.dflash_head()?;
        if cache.len + tokens.len() > self.cfg.max_ctx {
            return Err(EngineError::ContextFull { need: cache.len + tokens.len(), max: self.cfg.max_ctx });
        }
        let _guard = self.pool_lock.lock().unwrap_or_else(|p| p.into_inner());
        head.block(&self.head_ctx(head.file()), &self.file, cache, tokens)
    }

    /// The MTP head on the CPU, or the error of a model without one.
    fn mtp_head(&self) -> Result<&models::mtp::MtpHead> {
        self.mtp.as_ref().ok_or_else(|| EngineError::Config("this model has no MTP head".into()))
    }

    /// The device, where it holds the model's MTP head (then the head's passes run there).
    fn device_mtp(&self) -> Option<&dyn crate::device::DeviceModel> {
        self.device.as_deref().filter(|d| d.has_mtp())
    }

    /// The MTP draft head as loaded on the CPU (the file's own nextn block or a sidecar's),
    /// before a device takes it: what a device uploads (`attach_device` lets the CPU's go).
    pub fn mtp(&self) -> Option<&models::mtp::MtpHead> {
        self.mtp.as_ref()
    }

    /// Whether an MTP draft head is loaded (the file's own nextn block or `attach_mtp`'s), on
    /// the CPU or on the device.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some() || self.device_mtp().is_some()
    }

    /// RAM this model takes run without a budget, every tensor mapped and touched, with `n_seq`
    /// states at its context size and a batch's scratch: what a draft model beside a budgeted
    /// target adds to that target's plan (`EngineConfig::draft_ram`).
    pub fn ram_needed(&self, n_seq: usize) -> u64 {
        let f = self.net.plan_figures(self.cfg.max_ctx, self.cfg.effective_kv_types());
        self.file.tensor_bytes().saturating_add(f.state_bytes.saturating_mul(n_seq.max(1) as u64)).saturating_add(f.scratch_bytes)
    }

    /// The width of the final hidden (`SeqStep::hidden` rows without a DFlash drafter).
    pub fn hidden_width(&self) -> usize {
        self.net.hidden()
    }

    /// The width of a step's hidden rows (`SeqStep::hidden`): the DFlash drafter's features
    /// where one is attached, else the final hidden.
    pub fn step_hidden_width(&self) -> usize {
        match &self.dflash {
            Some(d) => d.feature_width(),
            None => self.hidden_width(),
        }
    }

    /// A fresh state of the MTP head (its KV cache of the configured types).
    pub fn new_mtp_state(&self) -> Result<SeqState> {
        if let Some(d) = self.device_mtp() {
            // the head's one attention layer, its rows on the device
            let mut st = SeqState::new(vec![crate::state::LayerState::Attn(crate::state::KvCache::new(self.cfg.effective_kv_types()))]);
            st.put_on_device(d.mtp_new_seq()?);
            return Ok(st);
        }
        let head = self.mtp_head()?;
        let mut st = head.new_state(self.cfg.effective_kv_types());
        st.set_kv_rows(self.max_context());
        Ok(st)
    }

    /// One step of the MTP head (`models::mtp`): `tokens` at `state.pos`.., token k paired
    /// with hidden row k of `h_in`; the logits of rows `logits` and every row's own hidden.
    pub fn mtp_forward(&self, state: &mut SeqState, tokens: &[u32], h_in: &[f32], logits: std::ops::Range<usize>) -> Result<models::SpanOut> {
        let head = self.mtp_head()?;
        self.check_context(state, tokens.len())?;
        let _guard = self.pool_lock.lock().unwrap_or_else(|p| p.into_inner());
        head.forward(&self.head_ctx(head.file()), state, tokens, h_in, logits)
    }

    /// One draft step of the MTP head: `token` at `state.pos` paired with the hidden row `h`;
    /// the token the head proposes next, the probability it gives it and its own hidden row
    /// (what the next step chains from) — on the device where the head is there (one token
    /// and a hidden row copied back, not a vocabulary's logits).
    pub fn mtp_draft(&self, state: &mut SeqState, token: u32, h: &[f32]) -> Result<crate::device::MtpDraft> {
        if let Some(d) = self.device_mtp() {
            self.check_context(state, 1)?;
            let pos = state.pos;
            let out = d.mtp_forward(state.device_mut()?, pos, &[token], h, true)?;
            state.pos += 1;
            return out.ok_or_else(|| EngineError::Device(format!("{}: an MTP draft step gave no draft", d.describe())));
        }
        let o = self.mtp_forward(state, &[token], h, 0..1)?;
        let (token, prob) = crate::ops::top(&o.logits);
        Ok(crate::device::MtpDraft { token, prob, hidden: o.hidden })
    }

    /// Up to `max` drafts of the MTP head chained from `token` with the hidden row `h` (each
    /// step fed the last's draft and hidden row), stopping before the first whose probability
    /// is below `p_min` — after the head catches up on `lead` (tokens from `state.pos`, token k
    /// with hidden row k of `lead_h`: the rows kept since its last draft), so `token` sits at
    /// `state.pos + lead.len()`. On the device the catch-up and the chain run there as one pass
    /// (one copy back; the steps past a stop run too, and `state` counts them); on the CPU
    /// the chain stops there.
    pub fn mtp_drafts(&self, state: &mut SeqState, lead: (&[u32], &[f32]), token: u32, h: &[f32], max: usize, p_min: f32) -> Result<Vec<u32>> {
        let (lead, lead_h) = lead;
        if lead_h.len() != lead.len() * self.hidden_width() {
            return Err(EngineError::Config(format!("an MTP catch-up of {} tokens with {} hidden values", lead.len(), lead_h.len())));
        }
        if let Some(d) = self.device_mtp() {
            if max == 0 {
                self.mtp_catch_up(state, lead, lead_h)?;
                return Ok(Vec::new());
            }
            self.check_context(state, lead.len() + max)?;
            let pos = state.pos;
            let chain = d.mtp_draft_chain(state.device_mut()?, pos, (lead, lead_h), token, h, max)?;
            state.pos += lead.len() + chain.len();
            return Ok(chain.into_iter().take_while(|&(_, p)| p >= p_min).map(|(t, _)| t).collect());
        }
        self.mtp_catch_up(state, lead, lead_h)?;
        let (mut tok, mut hid) = (token, h.to_vec());
        let mut out = Vec::with_capacity(max);
        while out.len() < max {
            let o = self.mtp_draft(state, tok, &hid)?;
            if o.prob < p_min {
                break;
            }
            out.push(o.token);
            (tok, hid) = (o.token, o.hidden);
        }
        Ok(out)
    }

    /// The forward context of a draft head (MTP or DFlash) whose weights live in `file`, the
    /// model's own or a sidecar.
    fn head_ctx<'a>(&'a self, file: &'a GgufFile) -> Ctx<'a> {
        Ctx {
            backend: &self.backend,
            file,
            prof: &self.prof,
            chunked_scan: self.cfg.chunked_prefill,
            routes: None,
            attn: crate::backend::AttnMode { flash: self.cfg.flash_attn.enabled(), threads: self.backend.threads(), n_ctx: self.cfg.max_ctx },
            taps: None,
            faults: None,
            rows: None,
            layer_inputs: &[],
            // a draft head's MoE (an MTP layer's) computes every expert on every rank
            shard: None,
        }
    }

    /// Only the MTP head's KV rows for `tokens` (`MtpHead::write_kv`): the state a later
    /// `mtp_forward` drafts from is the one a full pass over these rows would leave.
    pub fn mtp_write_kv(&self, state: &mut SeqState, tokens: &[u32], h_in: &[f32]) -> Result<()> {
        if let Some(d) = self.device_mtp() {
            self.check_context(state, tokens.len())?;
            let pos = state.pos;
            d.mtp_forward(state.device_mut()?, pos, tokens, h_in, false)?;
            state.pos += tokens.len();
            return Ok(());
        }
        let head = self.mtp_head()?;
        self.check_context(state, tokens.len())?;
        let _guard = self.pool_lock.lock().unwrap_or_else(|p| p.into_inner());
        head.write_kv(&self.head_ctx(head.file()), state, tokens, h_in)
    }

    /// `mtp_write_kv` over rows a drafter kept since the head last ran (any number of them), in
    /// batches the model takes.
    pub fn mtp_catch_up(&self, state: &mut SeqState, tokens: &[u32], h_in: &[f32]) -> Result<()> {
        let batch = self.max_batch_rows().max(1);
        let h = self.hidden_width();
        for (toks, hs) in tokens.chunks(batch).zip(h_in.chunks(batch * h)) {
            self.mtp_write_kv(state, toks, hs)?;
        }
        Ok(())
    }

    /// Whether `tokens` can be fed to `state`: some tokens, each in the vocabulary, room in the
    /// context. What a pass checks first; a group of ranks checks it once before any rank
    /// starts, so a bad request fails alone instead of failing every rank of the group.
    pub fn check_feed(&self, state: &SeqState, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.n_vocab()) {
            return Err(EngineError::TokenOutOfRange { id, n_vocab: self.n_vocab() });
        }
        self.check_context(state, tokens.len())
    }

    fn check_context(&self, state: &SeqState, n: usize) -> Result<()> {
        let need = state.pos + n;
        if need > self.cfg.max_ctx {
            return Err(EngineError::ContextFull { need, max: self.cfg.max_ctx });
        }
        Ok(())
    }

    /// The named intermediate tensors recorded since the last call (`EngineConfig::record_taps`),
    /// in the order the forward computed them.
    pub fn take_taps(&self) -> Vec<crate::ctx::Tap> {
        std::mem::take(&mut *self.taps.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The routing decisions recorded since the last call (`EngineConfig::record_routes`), in
    /// order of step, then sequence and position, then layer.
    pub fn take_routes(&self) -> Vec<Route> {
        std::mem::take(&mut *self.routes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Per-op (name, seconds, calls) since load or the last reset; empty unless
    /// `EngineConfig::profile` was set.
    pub fn profile_report(&self) -> Vec<(&'static str, f64, u64)> {
        self.prof.report()
    }

    pub fn profile_reset(&self) {
        self.prof.reset()
    }

    /// Bytes of weights in the file.
    pub fn weight_bytes(&self) -> u64 {
        self.file.tensors().iter().map(|t| t.n_bytes).sum()
    }

    /// Bytes of weights read through the mapping (page-cache backed): all of them, or the
    /// trunk alone when experts and tables stream.
    pub fn mapped_weight_bytes(&self) -> u64 {
        self.file.tensors().iter().filter(|t| !self.streams_tensor(&t.name)).map(|t| t.n_bytes).sum()
    }
}

/// A device's output for a span or a decode row as the model's own (no hidden rows).
fn span_out(r: crate::device::RowOut) -> models::SpanOut {
    match r {
        crate::device::RowOut::Logits(logits) => models::SpanOut { logits, ..Default::default() },
        crate::device::RowOut::Argmax(t) => models::SpanOut { argmax: Some(t), ..Default::default() },
    }
}

/// A routed-expert stack (`blk.N.ffn_{gate,up,down}_exps.weight`), which a streaming store
/// reads from disk instead of the mapping.
fn is_routed_expert(name: &str) -> bool {
    name.ends_with("_exps.weight")
}
