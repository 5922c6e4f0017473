//! qwen35 / qwen35moe wholly on the GPU: the trunk's weights uploaded once in their GGUF block
//! formats, the KV caches (f16) and recurrent states (f32) on the device, and a decode step —
//! embedding to the sampled token, for a batch of sequences' next tokens or a verify's rows —
//! captured as one CUDA graph a batch size and replayed per step. The math is the engine's
//! (`models/hybrid.rs`, `layers/`), step for step; what differs is the order of float sums
//! inside a product (docs/parity.md "GPU").

use crate::error::{CudaError, Result};
use crate::gpu::{as_bytes, i32_bytes, Arg, DevBuf, DeviceInfo, Gpu};
use std::sync::Arc;
use cudarc::driver::sys;
use cudarc::driver::CudaGraph;
use xwen_engine::layers::deltanet::DeltaProj;
use xwen_engine::models::hybrid::{Ffn, Hybrid, Mixer};
use xwen_engine::weights::Mat;
use xwen_gguf::{GgmlType, GgufFile};

mod experts;
mod forward;
mod moe;
mod mtp;
mod plan;
mod seq;
mod upload;

pub use experts::ExpertCacheStats;
pub use plan::{device_bytes_needed, device_plan, mtp_plan_bytes, DevicePlan, MAX_DECODE_ROWS};
use experts::ExpertCache;
use forward::Pass;
use plan::{decode_rows_for, load_net, max_dense_values, max_tiles, plan_of, q8_width, rows_table_bytes, ubatch_for};
use xwen_engine::{PromptOut, RowOut};
pub(crate) use seq::{DevSeq, DevSnapshot};
use seq::{SeqLayer, SeqShape};
use upload::Uploader;

/// The threads an rms_norm launch of rows of `n` values takes: n / 8 where a thread can hold
/// eight values (the kernel's register path: n % 256 == 0, at most 1024 threads), else 1024.
pub fn rms_norm_threads(n: usize) -> u32 {
    if n.is_multiple_of(256) && n / 8 <= 1024 {
        (n / 8) as u32
    } else {
        1024
    }
}

/// Where and how big: the device and the context the KV caches hold.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    pub device: usize,
    pub n_ctx: usize,
    /// Replay the decode step as one CUDA graph (off: launch the kernels one by one, for
    /// debugging and for the graph's own test).
    pub graph: bool,
    /// Tokens a prefill pass takes at most (llama.cpp's n_ubatch); fewer where the split
    /// attention's partials at n_ctx would pass 256 MiB.
    pub ubatch: usize,
    /// A hard ceiling on the device bytes (`--vram-budget`), checked against the device plan
    /// before the device is opened; None: the card's free memory is the only bound.
    pub vram_budget: Option<u64>,
    /// Sequences whose state (KV at n_ctx, recurrent state) the device is to hold at once:
    /// the server's slots. The fit check and the plan count them all; each is allocated at
    /// its sequence's first pass.
    pub n_seq: usize,
    /// Under a VRAM expert cache, CPU threads that compute some of a decode step's missed
    /// experts from host RAM while the GPU copies up the others (0: every miss copied up).
    pub cpu_experts: usize,
    /// Under a VRAM expert cache, copy up the experts the next MoE layer's router picks from
    /// this layer's input while this layer computes (`experts/`; default from
    /// `XWEN_EXPERT_READAHEAD=1`).
    pub read_ahead: bool,
    /// This model's rank of a sharded model (`xwen_engine::shard`): it holds and computes only
    /// `experts` of every MoE layer and reduces the picks' outputs over the group. None: the
    /// whole model.
    pub shard: Option<DeviceShard>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions { device: 0, n_ctx: 4096, graph: true, ubatch: 512, vram_budget: None, n_seq: 1, cpu_experts: default_cpu_experts(), read_ahead: default_read_ahead(), shard: None }
    }
}

/// A rank's place in a sharded model on devices: its block of every MoE layer's experts and its
/// end of the group's reductions.
#[derive(Clone)]
pub struct DeviceShard {
    pub experts: std::ops::Range<usize>,
    pub comm: Arc<dyn crate::collective::DeviceCollective>,
}

impl std::fmt::Debug for DeviceShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} of {}, experts {:?}", self.comm.rank(), self.comm.size(), self.experts)
    }
}

/// Whether the VRAM expert cache reads ahead by default: `XWEN_EXPERT_READAHEAD=1`.
pub fn default_read_ahead() -> bool {
    std::env::var("XWEN_EXPERT_READAHEAD").is_ok_and(|v| v == "1")
}

/// Threads computing missed experts on the CPU by default: half the CPUs, or `XWEN_CPU_EXPERTS`
/// (0: every miss copied up; for A/B runs). Not all of them: the thread that queues the GPU's
/// work and the driver's own threads need cores while the pool's workers spin between layers.
/// On an H100 host of 16 cores (35B-A3B, `--vram-budget 12G`, tg64) 4 / 8 / 12 / 16 threads ran
/// 111.3 / 121.2 / 116.8 / 97.7 t/s, and none 113.2 (docs/bench.md).
pub fn default_cpu_experts() -> usize {
    if let Some(n) = std::env::var("XWEN_CPU_EXPERTS").ok().and_then(|v| v.parse().ok()) {
        return n;
    }
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// Refuses a VRAM expert cache whose host copy of every routed expert (`expert_bytes`) the
/// machine's available memory does not hold: the disk tier beneath it is not built.
fn check_host_room(expert_bytes: u64) -> Result<()> {
    match xwen_engine::memory_plan::mem_available() {
        Some(a) if a < expert_bytes + (1 << 30) => {
            let h = xwen_engine::memory_plan::human_bytes;
            Err(CudaError::OverBudget(format!(
                "the VRAM expert cache keeps every routed expert in host RAM ({}), and {} is available; streaming them from disk beneath it is not built yet: give a --vram-budget that holds them all, or run on the CPU (-ngl 0) with --ram-budget",
                h(expert_bytes),
                h(a)
            )))
        }
        _ => Ok(()),
    }
}

/// A weight matrix (or a stack of experts) on the device, in its file's block format: at
/// `ptr` in `buf` (a VRAM expert cache's pool holds a layer's gate, up and down side by side a
/// slot, so the three share one allocation), consecutive experts `stride` bytes apart.
struct DevMat {
    _buf: Arc<DevBuf>,
    ptr: u64,
    ty: i32,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    stride: usize,
}

impl DevMat {
    /// A matrix (or a stack of `rows`-row matrices back to back) that owns its buffer.
    fn owning(buf: DevBuf, ty: i32, rows: usize, cols: usize, row_bytes: usize) -> DevMat {
        DevMat { ptr: buf.ptr, _buf: Arc::new(buf), ty, rows, cols, row_bytes, stride: rows * row_bytes }
    }

    /// Bytes from one expert's matrix to the next (the kernels' expert stride).
    fn mat_bytes(&self) -> usize {
        self.stride
    }
}

struct DeltaLayer {
    qkv: DevMat,
    z: DevMat,
    beta: DevMat,
    alpha: DevMat,
    taps: DevBuf,
    dt_bias: DevBuf,
    a: DevBuf,
    norm: DevBuf,
    out: DevMat,
}

struct AttnLayer {
    q: DevMat,
    k: DevMat,
    v: DevMat,
    o: DevMat,
    q_norm: DevBuf,
    k_norm: DevBuf,
}

enum DevMixer {
    Delta(DeltaLayer),
    Attn(AttnLayer),
}

struct Glu {
    gate: DevMat,
    up: DevMat,
    down: DevMat,
}

struct MoeLayer {
    router: DevMat,
    experts: Glu,
    shared: Option<Glu>,
    /// The shared expert's gate row (F32, 1 × hidden): sigmoid(gate·x) scales its output.
    shared_gate: Option<DevMat>,
}

enum DevFfn {
    Dense(Glu),
    Moe(MoeLayer),
}

struct DevLayer {
    attn_norm: DevBuf,
    post_norm: DevBuf,
    mixer: DevMixer,
    ffn: DevFfn,
    /// The q8 activations each input of the layer's decode products takes.
    kinds: LayerKinds,
}

/// Which q8 activations an input's row-by-row products take: q8_K (some consumer a k-quant),
/// q8_0 (some consumer a Q8_0 matrix big enough that quantizing its input pays; smaller Q8_0
/// consumers take the f32 input).
#[derive(Clone, Copy, Debug, Default)]
struct Kinds {
    k: bool,
    z: bool,
}

impl Kinds {
    fn of(mats: &[&DevMat]) -> Kinds {
        let k = mats.iter().any(|m| matches!(m.ty, 12..=14));
        let z = mats.iter().any(|m| m.ty == GgmlType::Q8_0.id() as i32 && m.rows * m.cols >= 1 << 20);
        Kinds { k, z }
    }
}

/// A layer's inputs: the mixer's (xn), its output's, the FFN's (xn), the FFN's or experts'
/// hidden rows, the shared expert's hidden rows.
#[derive(Clone, Copy, Debug, Default)]
struct LayerKinds {
    mix_in: Kinds,
    mix_out: Kinds,
    ffn_in: Kinds,
    ffn_mid: Kinds,
    shared_mid: Kinds,
}

impl LayerKinds {
    fn of(mixer: &DevMixer, ffn: &DevFfn) -> LayerKinds {
        let (mix_in, mix_out) = match mixer {
            DevMixer::Delta(w) => (Kinds::of(&[&w.qkv, &w.z, &w.beta, &w.alpha]), Kinds::of(&[&w.out])),
            DevMixer::Attn(w) => (Kinds::of(&[&w.q, &w.k, &w.v]), Kinds::of(&[&w.o])),
        };
        let (ffn_in, ffn_mid, shared_mid) = match ffn {
            DevFfn::Dense(w) => (Kinds::of(&[&w.gate, &w.up]), Kinds::of(&[&w.down]), Kinds::default()),
            DevFfn::Moe(w) => {
                let mut ins = vec![&w.router, &w.experts.gate, &w.experts.up];
                if let Some(s) = &w.shared {
                    ins.extend([&s.gate, &s.up]);
                }
                (Kinds::of(&ins), Kinds::of(&[&w.experts.down]), w.shared.as_ref().map_or(Kinds::default(), |s| Kinds::of(&[&s.down])))
            }
        };
        LayerKinds { mix_in, mix_out, ffn_in, ffn_mid, shared_mid }
    }
}

/// The activations of a pass, rows for up to `ubatch` tokens.
struct Scratch {
    step: DevBuf, // [first position, token ids…]
    /// A decode batch's table: its rows' tokens, positions and state pointers (`write_rows`);
    /// a pass of prompt spans' too (rows for `ubatch` tokens).
    rows: DevBuf,
    /// A pass of prompt spans' spans table (`forward::spans_table_at`) and their last rows
    /// gathered for the head.
    spans: DevBuf,
    head_x: DevBuf,
    /// A span's cuBLAS output where its place in the pass is not 16-byte aligned (a weight of
    /// fewer than 4 rows, or not a multiple of 4: `gemm_aligned`).
    blas_y: DevBuf,
    x: DevBuf,
    xn: DevBuf,
    qkv: DevBuf,
    z: DevBuf,
    beta: DevBuf,
    alpha: DevBuf,
    conv: DevBuf,
    delta_o: DevBuf,
    qg: DevBuf,
    k: DevBuf,
    v: DevBuf,
    q: DevBuf,
    part_o: DevBuf,
    part_ml: DevBuf,
    attn_o: DevBuf,
    ffn_h: DevBuf,
    ys: DevBuf,
    sh_h: DevBuf,
    /// The up products beside ffn_h / sh_h's gate products on the tensor-core path.
    ffn_u: DevBuf,
    /// A prompt pass's DeltaNet scan: normed q and k, (β, decay) per (token, V-head), and the
    /// outputs before their norm.
    qn: DevBuf,
    kn: DevBuf,
    gb: DevBuf,
    o_raw: DevBuf,
    sh_y: DevBuf,
    /// q8 copies of xn (rows of the hidden width) and of the other products' inputs
    /// (quant_q8): the decode products' activations.
    xq_n: DevBuf,
    xd_n: DevBuf,
    xq_nz: DevBuf,
    xd_nz: DevBuf,
    xq_b: DevBuf,
    xd_b: DevBuf,
    xq_bz: DevBuf,
    xd_bz: DevBuf,
    /// cuBLAS prompt products: a weight as f16 rows, a pass's xn and other inputs as f16.
    w_f16: DevBuf,
    xn_f16: DevBuf,
    x_f16: DevBuf,
    /// A prompt pass's routed slots grouped per expert (moe_sort → mm_ex).
    ex_counts: DevBuf,
    ex_offsets: DevBuf,
    ex_order: DevBuf,
    ex_tiles: DevBuf,
    sg: DevBuf,
    router: DevBuf,
    ids: DevBuf,
    weights: DevBuf,
    /// The logits of a decode batch's rows (a prompt pass's last row: the first).
    logits: DevBuf,
    /// The argmax of each row of `logits`.
    token: DevBuf,
    /// The argmax blocks' (value, index) and their finish counters (zero between launches), for
    /// each row of a decode batch; then each row's banned tokens (`forward::MAX_BANS`).
    argmax_part: DevBuf,
    /// The finish counters of launches whose last block finishes a reduction (zero between
    /// launches): the router's (`forward::COUNT_ROUTE`), a decode row's norm's from
    /// `COUNT_NORM`, then each (row, slot)'s hidden rows' from `COUNT_MIDS + decode_max`.
    counts: DevBuf,
}

/// Geometry the step needs.
#[derive(Clone, Copy, Debug)]
struct Dims {
    hidden: usize,
    n_vocab: usize,
    eps: f32,
    // DeltaNet
    hk: usize,
    hv: usize,
    sd: usize,
    conv_kernel: usize,
    tiled: bool,
    // attention
    n_head: usize,
    n_head_kv: usize,
    hd: usize,
    n_rot: usize,
    theta_scale: f32,
    n_split: usize,
    // MoE
    n_expert: usize,
    n_used: usize,
    expert_ff: usize,
    norm_w: bool,
    w_scale: f32,
}

/// One sequence's prompt span of a step (`CudaModel::feed_spans`): its tokens from `pos` on,
/// and what comes back.
pub(crate) struct PromptSpan<'a> {
    pub seq: &'a mut DevSeq,
    pub pos: usize,
    pub tokens: &'a [u32],
    pub want: PromptOut<'a>,
}

/// A captured graph, kept by the model that captured it: the driver's handles are usable from
/// any thread with the context current, and a graph is launched only by the model's owner
/// (behind the engine's seam, inside `CudaDevice`'s lock), on the model's one stream.
struct SendGraph(CudaGraph);
// SAFETY: see above — never launched from two threads at once.
unsafe impl Send for SendGraph {}
// SAFETY: a shared reference offers nothing but `launch`, taken under the model's owner.
unsafe impl Sync for SendGraph {}

/// qwen35 / qwen35moe on one GPU.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    d: Dims,
    n_ctx: usize,
    tok_embd: DevMat,
    layers: Vec<DevLayer>,
    output_norm: DevBuf,
    output: DevMat,
    still: Option<DevBuf>,
    sc: Scratch,
    /// The sequence `step` / `prefill` / `reset` feed, made at their first call (the engine's
    /// sequences bring their own, `seq.rs`).
    seq: Option<DevSeq>,
    /// Rows a decode batch takes at most (`decode_rows_for`).
    decode_max: usize,
    /// The decode step of each batch size and the verify pass of each row count, captured at
    /// their first use (key: rows, and 0 for a decode batch, 1 + whether states are kept for a
    /// verify): the kernels read the rows' sequences from the batch table, so a graph serves any.
    graphs: std::collections::HashMap<(usize, u8), SendGraph>,
    /// What a sequence's state is made of, layer by layer.
    shape: SeqShape,
    use_graph: bool,
    /// The q8 activations the lm head takes.
    head_kinds: Kinds,
    /// Tokens a prefill pass takes (the scratch's rows).
    ubatch: usize,
    /// Whether a step's prompt spans share passes (`feed_spans`; `XWEN_PACK_PROMPTS=0`: not).
    pack_prompts: bool,
    pos: usize,
    device_bytes: u64,
    /// The routed experts' VRAM cache where the budget holds only part of them (`experts/`).
    expert_cache: Option<ExpertCache>,
    /// This model's rank of a sharded model: its block of the experts, its reductions.
    shard: Option<DeviceShard>,
    /// The MTP draft head, where the model has one on the device (`mtp.rs`).
    mtp: Option<mtp::MtpHead>,
    /// Sequences the device holds at once (`CudaOptions::n_seq`): what a draft head's states count.
    n_seq: usize,
}

/// Layer `il`'s weights onto the device in their file's block formats: its mixer, its FFN (an
/// MoE layer's routed experts as the caller placed them: `experts`), its norms.
fn dev_layer(up: &Uploader<'_>, il: usize, l: &xwen_engine::models::hybrid::Layer, experts: Option<[DevMat; 3]>) -> Result<DevLayer> {
    let gpu = up.gpu;
    let mixer = match &l.mixer {
        Mixer::Delta(w) => {
            let DeltaProj::Split { qkv, gate, beta, alpha } = &w.proj else {
                return Err(CudaError::Unsupported("the CUDA backend takes qwen35's split DeltaNet projections".into()));
            };
            DevMixer::Delta(DeltaLayer {
                qkv: up.mat(qkv)?,
                z: up.mat(gate)?,
                beta: up.mat(beta)?,
                alpha: up.mat(alpha)?,
                taps: gpu.upload_f32(&w.conv)?,
                dt_bias: gpu.upload_f32(&w.dt_bias)?,
                a: gpu.upload_f32(&w.a)?,
                norm: gpu.upload_f32(&w.norm)?,
                out: up.mat(&w.out)?,
            })
        }
        Mixer::Attn(w) => DevMixer::Attn(AttnLayer {
            q: up.mat(&w.q)?,
            k: up.mat(&w.k)?,
            v: up.mat(&w.v)?,
            o: up.mat(&w.o)?,
            q_norm: gpu.upload_f32(&w.q_norm)?,
            k_norm: gpu.upload_f32(&w.k_norm)?,
        }),
        Mixer::Mla(_) => return Err(CudaError::Unsupported("MLA layers are not on the CUDA backend".into())),
    };
    let ffn = match (&l.ffn, experts) {
        (Ffn::Dense(w), _) => DevFfn::Dense(Glu { gate: up.mat(&w.gate)?, up: up.mat(&w.up)?, down: up.mat(&w.down)? }),
        (Ffn::Moe(w), Some([gate, upm, down])) => DevFfn::Moe(MoeLayer {
            router: up.mat(&w.router)?,
            experts: Glu { gate, up: upm, down },
            shared: match &w.shared {
                Some(s) => Some(Glu { gate: up.mat(&s.gate)?, up: up.mat(&s.up)?, down: up.mat(&s.down)? }),
                None => None,
            },
            shared_gate: match &w.shared_gate {
                Some(g) => Some(DevMat::owning(gpu.upload_f32(g)?, 0, 1, g.len(), g.len() * 4)),
                None => None,
            },
        }),
        (Ffn::Moe(_), None) => return Err(CudaError::Unsupported(format!("layer {il}: an MoE layer without experts"))),
    };
    let kinds = LayerKinds::of(&mixer, &ffn);
    Ok(DevLayer { attn_norm: gpu.upload_f32(&l.attn_norm)?, post_norm: gpu.upload_f32(&l.post_attn_norm)?, mixer, ffn, kinds })
}

/// A pass's graph: decode batches and verifies by row count (and kept states); prompt passes
/// run without one.
fn graph_key(pass: Pass<'_>) -> Option<(usize, u8)> {
    match pass {
        Pass::Rows { n } => Some((n, 0u8)),
        Pass::Verify { n, hist } => Some((n, 1 + hist as u8)),
        Pass::Prompt { .. } | Pass::Spans { .. } => None,
    }
}

impl CudaModel {
    /// Uploads `file`'s model to device `opts.device`; refuses a model that does not fit.
    pub fn load(file: &GgufFile, opts: &CudaOptions) -> Result<CudaModel> {
        CudaModel::load_with_store(file, opts, None)
    }

    /// `load`, with `store` (the engine's expert store: under `--ram-budget` a bounded RAM
    /// cache fed from disk) as the VRAM expert cache's host tier instead of a page-locked
    /// copy of every expert; it is used only where the budget puts the experts in a cache.
    pub fn load_with_store(file: &GgufFile, opts: &CudaOptions, store: Option<Arc<dyn xwen_engine::ExpertStore>>) -> Result<CudaModel> {
        let (net, experts) = load_net(file)?;
        let plan = plan_of(file, &net, &experts, opts);
        if let Some(sh) = &opts.shard {
            if plan.n_expert == 0 || sh.experts.is_empty() || sh.experts.end > plan.n_expert {
                return Err(CudaError::Unsupported(format!("experts {}..{} of a rank: the model has {} a layer", sh.experts.start, sh.experts.end, plan.n_expert)));
            }
        }
        // a rank holds its block of every layer's experts, the whole of it (no VRAM cache)
        let rank_bytes = opts.shard.as_ref().map(|sh| plan.resident_bytes() + plan.expert_bytes * sh.experts.len() as u64 / plan.n_expert as u64);
        match (opts.vram_budget, rank_bytes) {
            (Some(b), Some(r)) if r > b => {
                let h = xwen_engine::memory_plan::human_bytes;
                return Err(CudaError::OverBudget(format!("--vram-budget {}: this rank holds {} (its experts are not cached on a multi-GPU split): more GPUs split them finer", h(b), h(r))));
            }
            (Some(b), None) => plan.check_budget(b).map_err(CudaError::OverBudget)?,
            _ => {}
        }
        let gpu = Gpu::new(opts.device)?;
        let ubatch = ubatch_for(&net, opts);
        let decode_max = decode_rows_for(opts, ubatch);
        // under a budget below the whole model, each MoE layer's experts in a pool of `slots`
        let slots = plan.expert_slots(opts.vram_budget);
        let cached = plan.n_expert > 0 && slots < plan.n_expert && opts.shard.is_none();
        if cached && store.is_none() {
            check_host_room(plan.expert_bytes)?;
        }
        let need = rank_bytes.unwrap_or_else(|| plan.held_bytes(opts.vram_budget));
        if need + (256 << 20) > gpu.info.free_bytes {
            return Err(CudaError::TooBig {
                need_mib: need >> 20,
                free_mib: gpu.info.free_bytes >> 20,
                device: format!("cuda:{} ({})", gpu.info.ordinal, gpu.info.name),
                what: format!("weights, and KV and state at -c {} for {} sequence(s)", opts.n_ctx, opts.n_seq.max(1)),
            });
        }
        // checkpoints kept on the device (a server's, one at every prompt's end), within
        // `DevicePlan::checkpoint_room`; none on a rank of a split; XWEN_DEVICE_CHECKPOINTS=0:
        // none (every checkpoint read back)
        let keep_on_device = opts.shard.is_none() && std::env::var("XWEN_DEVICE_CHECKPOINTS").map_or(true, |v| v != "0");
        if keep_on_device {
            gpu.snapshots.set_cap(DevicePlan::checkpoint_room(gpu.info.free_bytes, need, opts.vram_budget));
        }
        let cfg = &net.cfg;
        let att = &cfg.attn;
        let dd = &cfg.delta;
        let (n_expert, n_used, expert_ff, norm_w, w_scale) = cfg.moe.as_ref().map_or((0, 0, 0, true, 1.0), |m| (m.n_expert, m.n_used, m.expert_ff, m.norm_w, m.w_scale));
        if let Some(m) = &cfg.moe {
            if m.latent > 0 || m.gating != xwen_engine::layers::moe::Gating::Softmax || !matches!(m.act, xwen_engine::layers::ffn::Act::SwiGlu) {
                return Err(CudaError::Unsupported("the CUDA backend's MoE is the softmax-routed SwiGLU of qwen35moe".into()));
            }
        }
        if att.head_dim % 32 != 0 || att.head_dim > 256 || dd.head_dim % 32 != 0 || dd.head_dim > 256 || n_used > 64 {
            return Err(CudaError::Unsupported(format!(
                "head dims {} (attention) / {} (DeltaNet), {n_used} experts a token: the CUDA kernels take multiples of 32 up to 256 and up to 64 experts",
                att.head_dim, dd.head_dim
            )));
        }
        let n_ctx = opts.n_ctx.max(1);
        let d = Dims {
            hidden: cfg.hidden,
            n_vocab: cfg.n_vocab,
            eps: cfg.eps,
            hk: dd.n_k_heads,
            hv: dd.n_v_heads,
            sd: dd.head_dim,
            conv_kernel: dd.conv_kernel,
            tiled: dd.pairing == xwen_engine::backend::HeadPairing::Tiled,
            n_head: att.n_head,
            n_head_kv: att.n_head_kv,
            hd: att.head_dim,
            n_rot: att.n_rot,
            theta_scale: att.rope_base.powf(-2.0 / att.n_rot as f32),
            n_split: plan::attn_splits(n_ctx),
            n_expert,
            n_used,
            expert_ff,
            norm_w,
            w_scale,
        };
        let up = Uploader { gpu: &gpu, file };
        let mut layers = Vec::with_capacity(net.layers.len());
        for (il, l) in net.layers.iter().enumerate() {
            let ex = match &l.ffn {
                Ffn::Moe(_) => {
                    let ex = experts.get(il).and_then(|e| e.as_ref()).ok_or_else(|| CudaError::Unsupported(format!("layer {il}: an MoE layer without experts")))?;
                    Some(match (&opts.shard, cached) {
                        (Some(sh), _) => [up.block(&ex[0], sh.experts.clone())?, up.block(&ex[1], sh.experts.clone())?, up.block(&ex[2], sh.experts.clone())?],
                        (None, true) => up.pool(ex, slots)?,
                        (None, false) => [up.mat(&ex[0])?, up.mat(&ex[1])?, up.mat(&ex[2])?],
                    })
                }
                Ffn::Dense(_) => None,
            };
            layers.push(dev_layer(&up, il, l, ex)?);
        }
        let still =
            att.rope_sections.map(|s| xwen_engine::ops::imrope_text_still(s, att.n_rot).iter().map(|&b| b as i32).collect::<Vec<i32>>()).map(|v| gpu.upload_i32(&v)).transpose()?;
        let h = d.hidden;
        let cd = dd.conv_dim();
        let vd = dd.value_dim();
        let hq = att.n_head * att.head_dim;
        let shared_ff = cfg.moe.as_ref().map_or(0, |m| m.shared_ff);
        let ffn_w = cfg.ff.max(n_used * expert_ff).max(1);
        let t = ubatch;
        let f = |n: usize| gpu.zeros(n * 4);
        let sc = Scratch {
            step: f(1 + t)?,
            rows: gpu.zeros(rows_table_bytes(decode_max.max(ubatch), net.layers.len()))?,
            spans: gpu.zeros(forward::spans_table_at(decode_max).2 + 4 * ubatch)?,
            head_x: f(decode_max * h)?,
            blas_y: f(t * plan::max_unaligned_rows(&net).max(1))?,
            x: f(t * h)?,
            xn: f(t * h)?,
            qkv: f(t * cd)?,
            z: f(t * vd)?,
            beta: f(t * dd.n_v_heads)?,
            alpha: f(t * dd.n_v_heads)?,
            conv: f(t * cd)?,
            delta_o: f(t * vd)?,
            qg: f(t * 2 * hq)?,
            k: f(t * att.kv_width())?,
            v: f(t * att.kv_width())?,
            q: f(t * hq)?,
            part_o: f(t * att.n_head * d.n_split * att.head_dim)?,
            part_ml: f(t * att.n_head * d.n_split * 2)?,
            attn_o: f(t * hq)?,
            ffn_h: f(t * ffn_w)?,
            ys: f(t * n_used.max(1) * h)?,
            sh_h: f(t * shared_ff.max(1))?,
            ffn_u: f(t * ffn_w.max(shared_ff).max(1))?,
            qn: f(t * dd.key_dim())?,
            kn: f(t * dd.key_dim())?,
            gb: f(t * 2 * dd.n_v_heads)?,
            o_raw: f(t * vd)?,
            sh_y: f(t * h)?,
            xq_n: gpu.zeros(t * h)?,
            xd_n: gpu.zeros(t * h.div_ceil(32) * 8)?,
            xq_nz: gpu.zeros(t * h)?,
            xd_nz: gpu.zeros(t * h.div_ceil(32) * 8)?,
            xq_b: gpu.zeros(t.max(2) * q8_width(&net))?,
            xd_b: gpu.zeros(t.max(2) * q8_width(&net).div_ceil(32) * 8)?,
            xq_bz: gpu.zeros(t.max(2) * q8_width(&net))?,
            xd_bz: gpu.zeros(t.max(2) * q8_width(&net).div_ceil(32) * 8)?,
            w_f16: gpu.zeros(if gpu.blas.is_some() { 2 * max_dense_values(&net) } else { 4 })?,
            xn_f16: gpu.zeros(if gpu.blas.is_some() { 2 * t * h } else { 4 })?,
            x_f16: gpu.zeros(if gpu.blas.is_some() { 2 * t * q8_width(&net) } else { 4 })?,
            ex_counts: f(n_expert.max(1))?,
            ex_offsets: f(n_expert.max(1))?,
            ex_order: f(t * n_used.max(1))?,
            ex_tiles: gpu.zeros(16 * max_tiles(t * n_used.max(1), n_expert, forward::EX_TILE).max(max_tiles(decode_max * n_used.max(1), n_expert, gpu.knobs.moe_tile)))?,
            sg: f(t)?,
            router: f(t * n_expert.max(1))?,
            ids: f(t * n_used.max(1))?,
            weights: f(t * n_used.max(1))?,
            logits: f(decode_max * d.n_vocab)?,
            token: f(decode_max)?,
            argmax_part: f(decode_max * (2 * forward::ARGMAX_BLOCKS + 1 + forward::MAX_BANS))?,
            counts: f(forward::COUNT_MIDS + decode_max + decode_max * (n_used + 1))?,
        };
        let output = up.mat(&net.output)?;
        let head_kinds = Kinds::of(&[&output]);
        let tok_embd = up.mat(&net.tok_embd)?;
        let output_norm = gpu.upload_f32(&net.output_norm)?;
        let expert_cache = if cached {
            let cache = ExpertCache::new(&gpu, file, &experts, n_expert, n_used, slots, opts.cpu_experts, opts.read_ahead.then_some(decode_max), store, (decode_max, cfg.hidden, ubatch))?;
            for (il, l) in layers.iter().enumerate() {
                if let DevFfn::Moe(w) = &l.ffn {
                    cache.fill(&gpu, il, &w.experts)?;
                }
            }
            Some(cache)
        } else {
            None
        };
        let gpu = Arc::new(gpu);
        let shape = SeqShape::of(&net, n_ctx);
        let model = CudaModel {
            seq: None,
            decode_max,
            graphs: std::collections::HashMap::new(),
            shape,
            tok_embd,
            output_norm,
            output,
            head_kinds,
            layers,
            still,
            sc,
            // a pass with experts to copy up stops at each MoE layer for the router's picks; a
            // rank's reductions may go through host memory
            use_graph: opts.graph && expert_cache.is_none() && opts.shard.is_none(),
            shard: opts.shard.clone(),
            expert_cache,
            ubatch,
            pack_prompts: std::env::var("XWEN_PACK_PROMPTS").map_or(true, |v| v != "0"),
            pos: 0,
            n_ctx,
            d,
            device_bytes: need,
            mtp: None,
            n_seq: opts.n_seq,
            gpu,
        };
        model.gpu.sync()?;
        Ok(model)
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.gpu.info
    }

    /// What the model holds on the device (weights, KV, state, scratch), as planned.
    pub fn device_bytes(&self) -> u64 {
        self.device_bytes
    }

    /// The VRAM expert cache's counts since load (None: every expert resident).
    pub fn expert_cache_stats(&self) -> Option<ExpertCacheStats> {
        self.expert_cache.as_ref().map(|c| c.stats())
    }

    pub fn n_vocab(&self) -> usize {
        self.d.n_vocab
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Tokens the sequence holds.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Starts a new sequence: the recurrent states zeroed, the KV caches' positions free.
    pub fn reset(&mut self) -> Result<()> {
        self.gpu.ctx.bind_to_thread()?;
        let mut seq = self.take_seq()?;
        let r = seq.zero();
        self.seq = Some(seq);
        r?;
        self.pos = 0;
        self.gpu.sync()
    }

    /// Feeds `token` at the next position; returns the greedy next token (the argmax of its
    /// logits, computed on the device: the step's one host sync). `logits()` reads the rest.
    pub fn step(&mut self, token: u32) -> Result<u32> {
        self.prefill(&[token])
    }

    /// Feeds a prompt in batches of up to `ubatch()` tokens (each weight read once a batch);
    /// returns the greedy token after its last. The logits are the last token's.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<u32> {
        let mut seq = self.take_seq()?;
        let r = self.feed_argmax(&mut seq, self.pos, tokens, &[]);
        self.seq = Some(seq);
        let t = r?;
        self.pos += tokens.len();
        Ok(t)
    }

    /// Device time per kernel of feeding `tokens` (one decode step for one token, prefill
    /// passes for more), each launch timed alone: (kernel, ms, launches), by time.
    pub fn profile(&mut self, tokens: &[u32]) -> Result<Vec<(String, f64, u64)>> {
        self.check(self.pos, tokens)?;
        let n = tokens.len().min(self.ubatch);
        let seq = self.take_seq()?;
        let pass = if n == 1 {
            self.write_rows(&[(&seq, self.pos, tokens[0])], None)?;
            Pass::Rows { n: 1 }
        } else {
            self.write_step(self.pos, &tokens[..n])?;
            Pass::Prompt { n, seq: &seq }
        };
        self.gpu.set_profiling(true);
        let r = self.record(pass);
        let table = self.gpu.set_profiling(false);
        self.seq = Some(seq);
        r?;
        self.pos += n;
        Ok(table)
    }

    /// Device time per kernel of one decode batch of `b` rows (fresh sequences at position 0),
    /// each launch timed alone: (kernel, ms, launches), by time.
    pub fn profile_batch(&mut self, b: usize) -> Result<Vec<(String, f64, u64)>> {
        self.gpu.ctx.bind_to_thread()?;
        self.check_rows(b)?;
        let seqs = (0..b).map(|_| DevSeq::zeroed(&self.gpu, &self.shape)).collect::<Result<Vec<_>>>()?;
        let rows: Vec<(&DevSeq, usize, u32)> = seqs.iter().enumerate().map(|(i, s)| (s, 0, i as u32 % self.d.n_vocab as u32)).collect();
        self.write_rows(&rows, None)?;
        self.gpu.set_profiling(true);
        let r = self.record(Pass::Rows { n: b });
        let table = self.gpu.set_profiling(false);
        r?;
        Ok(table)
    }

    /// The most tokens one prefill pass takes.
    pub fn ubatch(&self) -> usize {
        self.ubatch
    }

    /// Tokens a prompt pass takes of a span of `n` (`plan::pass_tokens`).
    fn pass_tokens(&self, n: usize) -> usize {
        plan::pass_tokens(n, self.ubatch)
    }

    /// Feeds `tokens` to `seq` from `pos` — one token, or with `one_by_one` each row in the
    /// decode step's arithmetic (a verify: one pass where the rows and the kept states fit,
    /// else row by row); else prompt passes of up to `ubatch` — and returns the logits of the
    /// span's rows `want`, back to back. What the engine's device seam runs.
    pub(crate) fn feed(&mut self, seq: &mut DevSeq, pos: usize, tokens: &[u32], one_by_one: bool, want: std::ops::Range<usize>) -> Result<Vec<f32>> {
        self.gpu.ctx.bind_to_thread()?;
        self.check(pos, tokens)?;
        let mut out = Vec::with_capacity(want.len() * self.d.n_vocab);
        let n = tokens.len();
        if one_by_one && self.verifies_in_one_pass(seq, n) {
            // a verify: every row in one pass, each in the decode step's arithmetic
            self.verify_pass(seq, pos, tokens)?;
            for i in want.filter(|&i| i < n) {
                out.extend(self.batch_logits(i)?);
            }
            return Ok(out);
        }
        if tokens.len() == 1 || one_by_one {
            for (i, &t) in tokens.iter().enumerate() {
                self.decode_batch(&mut [(&mut *seq, pos + i, t)])?;
                if want.contains(&i) {
                    out.extend(self.logits()?);
                }
            }
            return Ok(out);
        }
        let per = self.pass_tokens(tokens.len());
        for (c, chunk) in tokens.chunks(per).enumerate() {
            let first = c * per;
            self.prompt_pass(seq, pos + first, chunk)?;
            let last = first + chunk.len() - 1;
            // the pass computed its last row's logits; any other row asked for takes the head again
            let rows: Vec<usize> = want.clone().filter(|r| (first..=last).contains(r)).collect();
            let last_logits = if rows.last() == Some(&last) { Some(self.logits()?) } else { None };
            for &r in rows.iter().filter(|&&r| r != last) {
                self.head(r - first)?;
                out.extend(self.logits()?);
            }
            out.extend(last_logits.unwrap_or_default());
        }
        Ok(out)
    }

    /// `feed` in the span's own order returning only the argmax of its last row skipping the
    /// tokens `banned`, picked on the device (`greedy_picks`: one id copied back).
    pub(crate) fn feed_argmax(&mut self, seq: &mut DevSeq, pos: usize, tokens: &[u32], banned: &[u32]) -> Result<u32> {
        self.gpu.ctx.bind_to_thread()?;
        self.check(pos, tokens)?;
        if tokens.len() == 1 {
            self.decode_batch(&mut [(&mut *seq, pos, tokens[0])])?;
        } else {
            let per = self.pass_tokens(tokens.len());
            for (c, chunk) in tokens.chunks(per).enumerate() {
                self.prompt_pass(seq, pos + c * per, chunk)?;
            }
        }
        Ok(self.greedy_picks(&[banned])?[0])
    }

    /// Whether a verify of `n` rows of `seq` runs as one pass (`verify_pass`): rows a decode
    /// batch holds, and the kept states a rollback needs reserved for them.
    fn verifies_in_one_pass(&self, seq: &DevSeq, n: usize) -> bool {
        n > 1 && n <= self.decode_max && seq.keeps_at_least(n)
    }

    /// A greedy verify (`DeviceModel::forward_verify_argmax`): the rows in one pass in the
    /// decode step's arithmetic, as `feed` runs a verify, then each row's argmax skipping
    /// `banned` (`greedy_picks`) — a token a row copied back, not a vocabulary's logits. Where
    /// the rows cannot share a pass (more than a decode batch, fewer kept states than rows),
    /// one decode step a row, each picked after its step.
    pub(crate) fn feed_verify_argmax(&mut self, seq: &mut DevSeq, pos: usize, tokens: &[u32], banned: &[u32]) -> Result<Vec<u32>> {
        self.gpu.ctx.bind_to_thread()?;
        self.check(pos, tokens)?;
        let n = tokens.len();
        if self.verifies_in_one_pass(seq, n) {
            self.verify_pass(seq, pos, tokens)?;
            return self.greedy_picks(&vec![banned; n]);
        }
        let mut picks = Vec::with_capacity(n);
        for (i, &t) in tokens.iter().enumerate() {
            self.decode_batch(&mut [(&mut *seq, pos + i, t)])?;
            picks.push(self.greedy_picks(&[banned])?[0]);
        }
        Ok(picks)
    }

    /// A step's prompt spans of several sequences (`DeviceModel::forward_prompts`), one result
    /// a span. Spans of 2 to `ubatch` tokens that ask for their last row's logits or argmax
    /// share passes (`spans_pass`: up to `ubatch` rows and `decode_max` spans a pass, longest
    /// first, each into the first pass with room), so a burst of new requests reads each
    /// weight — above all each routed expert — once a pass instead of once a prompt; each row
    /// keeps the bits its span's own pass gives it. The rest (one token, more than a pass,
    /// other rows' logits, a sequence given twice, a span that fails its checks) run alone
    /// (`feed`, `feed_argmax`). `XWEN_PACK_PROMPTS=0`: every span alone.
    pub(crate) fn feed_spans(&mut self, spans: &mut [PromptSpan<'_>]) -> Vec<Result<RowOut>> {
        if let Err(e) = self.gpu.ctx.bind_to_thread() {
            let why = CudaError::from(e).to_string();
            return spans.iter().map(|_| Err(CudaError::Unsupported(why.clone()))).collect();
        }
        let packs = |i: usize, s: &PromptSpan<'_>| {
            let n = s.tokens.len();
            let last_only = match &s.want {
                PromptOut::Argmax(_) => true,
                PromptOut::Logits(r) => r.is_empty() || *r == (n - 1..n),
            };
            (2..=self.ubatch).contains(&n)
                && last_only
                && s.seq.hidden.is_none()
                && self.check(s.pos, s.tokens).is_ok()
                && !spans.iter().enumerate().any(|(j, o)| j != i && std::ptr::eq(&*o.seq, &*s.seq))
        };
        let packed: Vec<(usize, usize)> =
            if self.pack_prompts { (0..spans.len()).filter(|&i| packs(i, &spans[i])).map(|i| (i, spans[i].tokens.len())).collect() } else { Vec::new() };
        let passes = plan::pack_spans(&packed, self.ubatch, self.decode_max);
        let mut out: Vec<Option<Result<RowOut>>> = (0..spans.len()).map(|_| None).collect();
        // (a pass of one span is that span's own pass: run alone below)
        for members in passes.iter().filter(|m| m.len() > 1) {
            for (i, r) in members.iter().zip(self.spans_pass(spans, members)) {
                out[*i] = Some(r);
            }
        }
        for (i, s) in spans.iter_mut().enumerate() {
            if out[i].is_none() {
                out[i] = Some(match s.want {
                    PromptOut::Logits(ref rows) => self.feed(s.seq, s.pos, s.tokens, false, rows.clone()).map(RowOut::Logits),
                    PromptOut::Argmax(banned) => self.feed_argmax(s.seq, s.pos, s.tokens, banned).map(RowOut::Argmax),
                });
            }
        }
        out.into_iter().map(|r| r.unwrap_or_else(|| Err(CudaError::Unsupported("a prompt span with no result".into())))).collect()
    }

    /// One pass of the spans `members` (of `spans`; longest first, checked by `feed_spans`):
    /// their rows back to back in the batch table (tokens, positions, each row's sequence's
    /// states), the spans table (each span's first row and length, its last row, each row's
    /// place in its span), the pass (`forward::Pass::Spans`), then each span's last row's
    /// argmax or logits. An error fails every span of the pass.
    fn spans_pass(&mut self, spans: &[PromptSpan<'_>], members: &[usize]) -> Vec<Result<RowOut>> {
        let run = |m: &mut CudaModel| -> Result<Vec<RowOut>> {
            let lens: Vec<usize> = members.iter().map(|&i| spans[i].tokens.len()).collect();
            let rows: Vec<(&DevSeq, usize, u32)> =
                members.iter().flat_map(|&i| spans[i].tokens.iter().enumerate().map(move |(t, &tok)| (&*spans[i].seq, spans[i].pos + t, tok))).collect();
            m.write_rows(&rows, None)?;
            m.gpu.write(&mut m.sc.spans, i32_bytes(&plan::spans_table(&lens, m.decode_max)))?;
            m.record(Pass::Spans { n: rows.len(), lens: &lens })?;
            let bans: Vec<&[u32]> = members.iter().map(|&i| if let PromptOut::Argmax(b) = spans[i].want { b } else { &[][..] }).collect();
            let ids = m.greedy_picks(&bans)?;
            members
                .iter()
                .enumerate()
                .map(|(s, &i)| match &spans[i].want {
                    PromptOut::Argmax(_) => Ok(RowOut::Argmax(ids[s])),
                    PromptOut::Logits(r) if r.is_empty() => Ok(RowOut::Logits(Vec::new())),
                    PromptOut::Logits(_) => m.batch_logits(s).map(RowOut::Logits),
                })
                .collect()
        };
        match run(self) {
            Ok(v) => v.into_iter().map(Ok).collect(),
            Err(e) => {
                let why = e.to_string();
                members.iter().map(|_| Err(CudaError::Unsupported(format!("a pass of {} prompt spans: {why}", members.len())))).collect()
            }
        }
    }

    /// Rows a decode batch takes at most (`decode_batch`).
    pub fn max_decode_rows(&self) -> usize {
        self.decode_max
    }

    /// Refuses a decode batch or verify of `b` rows the scratch does not hold.
    fn check_rows(&self, b: usize) -> Result<()> {
        if b == 0 || b > self.decode_max {
            return Err(CudaError::Unsupported(format!("a decode batch of {b} rows (this model's take 1 to {})", self.decode_max)));
        }
        Ok(())
    }

    /// A decode batch: each row's token at its position through its own sequence, all rows in
    /// one replay of the step captured for this many rows (at its first use). Each row's
    /// logits and argmax are then row r of `logits` / `token`; a row's bits are the same in any
    /// batch (each kernel takes the batch as a grid dimension, a row computed as alone).
    pub(crate) fn decode_batch(&mut self, rows: &mut [(&mut DevSeq, usize, u32)]) -> Result<()> {
        self.gpu.ctx.bind_to_thread()?;
        let b = rows.len();
        self.check_rows(b)?;
        for (i, (seq, pos, token)) in rows.iter().enumerate() {
            self.check(*pos, &[*token])?;
            if rows[..i].iter().any(|(o, _, _)| std::ptr::eq(&**o, &**seq)) {
                return Err(CudaError::Unsupported(format!("decode row {i}'s sequence is in the batch twice")));
            }
        }
        for (seq, pos, _) in rows.iter_mut() {
            if seq.keeps() {
                seq.save(*pos)?;
            }
        }
        let table: Vec<(&DevSeq, usize, u32)> = rows.iter().map(|(s, p, t)| (&**s, *p, *t)).collect();
        self.write_rows(&table, None)?;
        self.replay(Pass::Rows { n: b })?;
        let mut seqs: Vec<&mut DevSeq> = rows.iter_mut().map(|(s, _, _)| &mut **s).collect();
        self.collect_hidden_rows(&mut seqs)
    }

    /// The first `rows` final hidden rows of the last pass: xn after the output norm (a decode
    /// batch's or verify's last norm; a prompt pass's after `rms_norm_rows`).
    fn final_hidden(&self, rows: usize) -> Result<Vec<f32>> {
        self.gpu.read_f32_at(&self.sc.xn, 0, rows * self.d.hidden)
    }

    /// The final hidden rows of the last pass's rows, row r into `seqs[r]` where that sequence
    /// collects them (`final_hidden`).
    fn collect_hidden_rows(&self, seqs: &mut [&mut DevSeq]) -> Result<()> {
        if seqs.iter().all(|s| s.hidden.is_none()) {
            return Ok(());
        }
        let h = self.d.hidden;
        let rows = self.final_hidden(seqs.len())?;
        for (s, row) in seqs.iter_mut().zip(rows.chunks_exact(h)) {
            if let Some(v) = s.hidden.as_mut() {
                v.extend_from_slice(row);
            }
        }
        Ok(())
    }

    /// A verify's rows: `tokens` from `pos` through `seq`, each row in the decode step's
    /// arithmetic (its bits are the row fed alone: `decode_batch`), all in one replay of the
    /// pass captured for this many rows. Where `seq` keeps states for a rollback, the kernels
    /// write the recurrent state after each row into the kept state before the next (the
    /// row-by-row loop's copies, without the loop). Row r's logits and argmax are then row r of
    /// `logits` / `token`. (`feed`, its caller, has bound the context and checked the tokens.)
    fn verify_pass(&mut self, seq: &mut DevSeq, pos: usize, tokens: &[u32]) -> Result<()> {
        let n = tokens.len();
        self.check_rows(n)?;
        let hist = if seq.keeps() { Some(seq.reserve_history(pos, n)?) } else { None };
        let rows: Vec<(&DevSeq, usize, u32)> = tokens.iter().enumerate().map(|(i, &t)| (&*seq, pos + i, t)).collect();
        self.write_rows(&rows, hist.as_deref())?;
        self.replay(Pass::Verify { n, hist: hist.is_some() })?;
        if seq.hidden.is_some() {
            let rows = self.final_hidden(n)?;
            seq.hidden.get_or_insert_with(Vec::new).extend(rows);
        }
        Ok(())
    }

    /// Runs a decode batch or a verify (their table written): the pass's graph, captured at its
    /// first use (a graph serves any sequences: they come from the table).
    fn replay(&mut self, pass: Pass<'_>) -> Result<()> {
        match graph_key(pass) {
            Some(key) => self.run_graph(key, |m| m.record(pass)),
            None => self.record(pass),
        }
    }

    /// What `rec` enqueues, as the graph `key` (captured at its first use) where the model's
    /// passes run as graphs, else enqueued as it is.
    fn run_graph(&mut self, key: (usize, u8), rec: impl FnOnce(&CudaModel) -> Result<()>) -> Result<()> {
        if !self.use_graph {
            return rec(self);
        }
        self.capture_with(key, rec)?;
        if let Some(g) = self.graphs.get(&key) {
            g.0.launch()?;
        }
        Ok(())
    }

    /// `pass` captured as a graph under `key`, unless it is already: a capture enqueues
    /// nothing, so nothing runs.
    fn capture(&mut self, pass: Pass<'_>, key: (usize, u8)) -> Result<()> {
        self.capture_with(key, |m| m.record(pass))
    }

    /// What `rec` enqueues captured as a graph under `key`, unless it is already.
    fn capture_with(&mut self, key: (usize, u8), rec: impl FnOnce(&CudaModel) -> Result<()>) -> Result<()> {
        if self.graphs.contains_key(&key) {
            return Ok(());
        }
        self.gpu.stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let recorded = rec(self);
        let graph = self.gpu.stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
        recorded?;
        self.graphs.insert(key, SendGraph(graph.ok_or_else(|| CudaError::Unsupported("stream capture made no graph".into()))?));
        Ok(())
    }

    /// The decode steps of batches of 1 to `rows` rows captured now (a graph a size), so a
    /// server's requests never wait on a capture when the batch first reaches a size. Every
    /// row's tokens, positions and states come from the rows table at replay, so a capture
    /// needs no sequence. Nothing where the steps run without graphs.
    pub fn capture_decode_batches(&mut self, rows: usize) -> Result<()> {
        self.capture_each((1..=rows.min(self.decode_max)).map(|n| Pass::Rows { n }))
    }

    /// Each of `passes` captured now, unless it is already (the graphs the passes' first uses
    /// would otherwise capture mid-request); nothing where the steps run without graphs.
    fn capture_each(&mut self, passes: impl Iterator<Item = Pass<'static>>) -> Result<()> {
        if !self.use_graph {
            return Ok(());
        }
        self.gpu.ctx.bind_to_thread()?;
        for pass in passes {
            if let Some(key) = graph_key(pass) {
                self.capture(pass, key)?;
            }
        }
        Ok(())
    }

    /// The verifies of 2 to `rows` rows that keep states for a rollback (the engine's) captured
    /// now (a graph a size), so a drafted request's first verify of a size does not pay the
    /// capture mid-request (tens of ms against a few). Like the decode batches', a verify's
    /// graph serves any sequence. Where the model's MTP head is on the device, its passes and
    /// draft chains for that depth too (`capture_mtp`). Nothing where the steps run without
    /// graphs.
    pub fn capture_verifies(&mut self, rows: usize) -> Result<()> {
        self.capture_each((2..=rows.min(self.decode_max)).map(|n| Pass::Verify { n, hist: true }))?;
        self.capture_mtp(rows)
    }

    /// A decode batch's or verify's table (`forward::rows_table_at`): the rows' tokens, their
    /// positions, layer by layer each row's two state pointers, and for a verify that keeps
    /// states, layer by layer where the state after each row but the last goes (`hist[t]`: the
    /// recurrent layers' (conv, S) kept before row t + 1).
    fn write_rows(&mut self, rows: &[(&DevSeq, usize, u32)], hist: Option<&[Vec<(u64, u64)>]>) -> Result<()> {
        let b = rows.len();
        let n_layers = self.layers.len();
        let mut bytes = vec![0u8; rows_table_bytes(b, n_layers)];
        let mut put = |at: usize, v: &[u8]| bytes[at..at + v.len()].copy_from_slice(v);
        let (at_pos, _, _) = forward::rows_table_at(b, 0, n_layers);
        for (r, (seq, pos, token)) in rows.iter().enumerate() {
            if seq.layers.len() != n_layers {
                return Err(CudaError::Unsupported("a sequence state of another model".into()));
            }
            put(4 * r, &(*token as i32).to_le_bytes());
            put(at_pos + 4 * r, &(*pos as i32).to_le_bytes());
            let mut delta_layer = 0;
            for (il, (l, st)) in self.layers.iter().zip(&seq.layers).enumerate() {
                let (a, p) = match (&l.mixer, st) {
                    (DevMixer::Delta(_), SeqLayer::Delta { conv, s }) => (conv.ptr, s.ptr),
                    (DevMixer::Attn(_), SeqLayer::Attn { k, v }) => (k.ptr, v.ptr),
                    _ => return Err(CudaError::Unsupported("a sequence state of another model".into())),
                };
                let (_, at, at_hist) = forward::rows_table_at(b, il, n_layers);
                put(at + 16 * r, &a.to_le_bytes());
                put(at + 16 * r + 8, &p.to_le_bytes());
                if let (Some(h), DevMixer::Delta(_)) = (hist, &l.mixer) {
                    if let Some(&(c, s)) = h.get(r).and_then(|kept| kept.get(delta_layer)) {
                        put(at_hist + 16 * r, &c.to_le_bytes());
                        put(at_hist + 16 * r + 8, &s.to_le_bytes());
                    }
                }
                if matches!(l.mixer, DevMixer::Delta(_)) {
                    delta_layer += 1;
                }
            }
        }
        self.gpu.write(&mut self.sc.rows, &bytes)
    }

    /// A prompt pass of `tokens` (at most `ubatch`) from `pos`; one token is a decode row.
    fn prompt_pass(&mut self, seq: &mut DevSeq, pos: usize, tokens: &[u32]) -> Result<()> {
        self.gpu.ctx.bind_to_thread()?;
        if tokens.len() == 1 {
            return self.decode_batch(&mut [(seq, pos, tokens[0])]);
        }
        self.write_step(pos, tokens)?;
        self.record(Pass::Prompt { n: tokens.len(), seq })?;
        if seq.hidden.is_some() {
            // the pass normed its last row alone (the head's): every row's final hidden
            let n = tokens.len();
            self.rms_norm_rows(self.sc.x.ptr, self.output_norm.ptr, n)?;
            let rows = self.final_hidden(n)?;
            seq.hidden.get_or_insert_with(Vec::new).extend(rows);
        }
        Ok(())
    }

    /// The logits of row `row` of the last decode batch (row 0: a prompt pass's last row's).
    pub(crate) fn batch_logits(&self, row: usize) -> Result<Vec<f32>> {
        let n = self.d.n_vocab;
        self.gpu.read_f32_at(&self.sc.logits, row * n, n)
    }

    /// The greedy picks of the last pass's first `bans.len()` rows, each skipping its banned
    /// tokens (a sampler's bans, as `ignore_eos` bans the end-of-generation tokens;
    /// `ops::argmax_except`): the pass's own argmax where a row bans nothing, its argmax run
    /// again over the rows that ban up to `forward::MAX_BANS` tokens (the bans written after
    /// the argmax parts), and for a row that bans more, its logits read back and picked here.
    pub(crate) fn greedy_picks(&self, bans: &[&[u32]]) -> Result<Vec<u32>> {
        let rows = bans.len();
        self.check_rows(rows)?;
        let on_device = |b: &[u32]| !b.is_empty() && b.len() <= forward::MAX_BANS;
        if bans.iter().any(|b| on_device(b)) {
            let mut table = vec![-1i32; rows * forward::MAX_BANS];
            for (r, b) in bans.iter().enumerate().filter(|(_, b)| on_device(b)) {
                for (j, &t) in b.iter().enumerate() {
                    table[r * forward::MAX_BANS + j] = t as i32;
                }
            }
            self.gpu.write_at(self.bans_at(), i32_bytes(&table))?;
            self.argmax(rows, true)?;
        }
        let ids = self.gpu.read_i32(&self.sc.token, rows)?;
        ids.into_iter()
            .zip(bans)
            .enumerate()
            .map(|(i, (id, b))| if b.len() > forward::MAX_BANS { Ok(xwen_engine::ops::argmax_except(&self.batch_logits(i)?, b)) } else { Ok(id as u32) })
            .collect()
    }

    /// The model's own sequence, made at its first use (a model behind the engine's device
    /// seam never feeds it: its sequences bring their own).
    fn take_seq(&mut self) -> Result<DevSeq> {
        match self.seq.take() {
            Some(s) => Ok(s),
            None => DevSeq::zeroed(&self.gpu, &self.shape),
        }
    }

    /// A sequence holding the host form `layers` at `pos`.
    pub(crate) fn upload_seq(&self, layers: &[xwen_engine::state::LayerState], pos: usize) -> Result<DevSeq> {
        self.gpu.ctx.bind_to_thread()?;
        DevSeq::upload(&self.gpu, &self.shape, layers, pos)
    }

    fn check(&self, pos: usize, tokens: &[u32]) -> Result<()> {
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.d.n_vocab) {
            return Err(CudaError::TokenOutOfRange { id, n_vocab: self.d.n_vocab });
        }
        if pos + tokens.len() > self.n_ctx {
            return Err(CudaError::ContextFull { pos: pos + tokens.len(), n_ctx: self.n_ctx });
        }
        Ok(())
    }

    /// The step's parameters: [first position, token ids…].
    fn write_step(&mut self, pos: usize, tokens: &[u32]) -> Result<()> {
        let params: Vec<u8> = std::iter::once(pos as i32).chain(tokens.iter().map(|&t| t as i32)).flat_map(|v| v.to_le_bytes()).collect();
        self.gpu.write(&mut self.sc.step, &params)
    }

    /// The logits of the last token fed.
    pub fn logits(&self) -> Result<Vec<f32>> {
        self.batch_logits(0)
    }
}
