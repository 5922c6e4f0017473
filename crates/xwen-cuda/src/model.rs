//! qwen35 / qwen35moe wholly on the GPU: the trunk's weights uploaded once in their GGUF block
//! formats, the KV caches (f16) and recurrent states (f32) on the device, and one decode step —
//! embedding to the sampled token — captured as one CUDA graph and replayed per token. The
//! math is the engine's (`models/hybrid.rs`, `layers/`), step for step; what differs is the
//! order of float sums inside a product (docs/parity.md "GPU").

use crate::error::{CudaError, Result};
use crate::gpu::{Arg, DevBuf, DeviceInfo, Gpu};
use cudarc::driver::sys;
use cudarc::driver::CudaGraph;
use xwen_engine::layers::deltanet::DeltaProj;
use xwen_engine::models::hybrid::{Ffn, Hybrid, Mixer};
use xwen_engine::weights::Mat;
use xwen_gguf::{GgmlType, GgufFile};

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
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions { device: 0, n_ctx: 4096, graph: true, ubatch: 512 }
    }
}

/// A weight matrix (or a stack of experts) on the device, in its file's block format.
struct DevMat {
    buf: DevBuf,
    ty: i32,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

impl DevMat {
    fn mat_bytes(&self) -> usize {
        self.rows * self.row_bytes
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
    conv_state: DevBuf,
    s: DevBuf,
}

struct AttnLayer {
    q: DevMat,
    k: DevMat,
    v: DevMat,
    o: DevMat,
    q_norm: DevBuf,
    k_norm: DevBuf,
    k_cache: DevBuf,
    v_cache: DevBuf,
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
    logits: DevBuf,
    token: DevBuf,
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

/// qwen35 / qwen35moe on one GPU.
pub struct CudaModel {
    gpu: Gpu,
    d: Dims,
    n_ctx: usize,
    tok_embd: DevMat,
    layers: Vec<DevLayer>,
    output_norm: DevBuf,
    output: DevMat,
    still: Option<DevBuf>,
    sc: Scratch,
    graph: Option<CudaGraph>,
    use_graph: bool,
    /// The q8 activations the lm head takes.
    head_kinds: Kinds,
    /// Tokens a prefill pass takes (the scratch's rows).
    ubatch: usize,
    pos: usize,
    device_bytes: u64,
}

/// Types the products have a kernel for (kernels.cu `dot_row`, `deq1`).
fn device_type(ty: GgmlType) -> Option<i32> {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K).then(|| ty.id() as i32)
}

/// The bytes `load` puts on the device for `file`'s trunk and experts, KV at `n_ctx` and state.
pub fn device_bytes_needed(file: &GgufFile, opts: &CudaOptions) -> Result<u64> {
    let (net, experts) = load_net(file)?;
    let ub = ubatch_for(&net, opts);
    Ok(plan_bytes(file, &net, &experts, opts.n_ctx) + scratch_bytes(&net, opts.n_ctx, ub))
}

/// The prefill batch: `opts.ubatch`, fewer where the split attention's partials would pass
/// 256 MiB at this context.
fn ubatch_for(net: &Hybrid, opts: &CudaOptions) -> usize {
    let a = &net.cfg.attn;
    let per_token = a.n_head * opts.n_ctx.max(1).div_ceil(256) * (a.head_dim + 2) * 4;
    opts.ubatch.clamp(1, ((256usize << 20) / per_token.max(1)).max(1))
}

/// The scratch of a pass of `ub` tokens.
fn scratch_bytes(net: &Hybrid, n_ctx: usize, ub: usize) -> u64 {
    let c = &net.cfg;
    let (a, d) = (&c.attn, &c.delta);
    let (k, eff, sff, ne) = c.moe.as_ref().map_or((1, 0, 0, 0), |m| (m.n_used, m.expert_ff, m.shared_ff, m.n_expert));
    let hq = a.n_head * a.head_dim;
    let split = n_ctx.max(1).div_ceil(256);
    let row = 2 * c.hidden
        + 2 * d.conv_dim()
        + 2 * d.value_dim()
        + 2 * d.n_v_heads
        + 4 * hq
        + 2 * a.kv_width()
        + a.n_head * split * (a.head_dim + 2)
        + c.ff.max(k * eff)
        + c.ff.max(k * eff).max(sff)
        + k * c.hidden
        + sff
        + c.hidden
        + 1
        + ne
        + 2 * k
        + 2 * d.key_dim()
        + 2 * d.n_v_heads
        + d.value_dim();
    let wide = q8_width(net);
    // q8 copies (a byte a value, 8 bytes a 32), f16 inputs, grouped-expert lists
    let q8 = (ub * (c.hidden + wide)) as u64 * 5 / 2;
    let f16 = (2 * ub * (wide + c.hidden) + 2 * max_dense_values(net)) as u64;
    let ex = if ne > 0 { (4 * (2 * ne + ub * k) + 16 * (ub * k).div_ceil(16) + 16 * ne) as u64 } else { 0 };
    (ub * row + c.n_vocab + 2 + ub) as u64 * 4 + q8 + f16 + ex
}

/// The widest input of a product other than xn: DeltaNet / attention outputs, FFN and expert
/// hidden rows (a token's k expert rows together).
fn q8_width(net: &Hybrid) -> usize {
    let c = &net.cfg;
    let (k, eff, sff) = c.moe.as_ref().map_or((1, 0, 0), |m| (m.n_used, m.expert_ff, m.shared_ff));
    c.hidden.max(c.delta.value_dim()).max(c.attn.n_head * c.attn.head_dim).max(c.ff).max(k * eff).max(sff)
}

/// The most values of one trunk matrix a prompt pass multiplies (the f16 copy cuBLAS reads).
fn max_dense_values(net: &Hybrid) -> usize {
    let mut m = 0;
    for l in &net.layers {
        let mats: Vec<&Mat> = match &l.mixer {
            Mixer::Delta(w) => match &w.proj {
                DeltaProj::Split { qkv, gate, beta, alpha } => vec![qkv, gate, beta, alpha, &w.out],
                _ => vec![&w.out],
            },
            Mixer::Attn(w) => vec![&w.q, &w.k, &w.v, &w.o],
            Mixer::Mla(_) => vec![],
        };
        let ffn: Vec<&Mat> = match &l.ffn {
            Ffn::Dense(w) => vec![&w.gate, &w.up, &w.down],
            Ffn::Moe(w) => {
                let mut v = vec![&w.router];
                if let Some(s) = &w.shared {
                    v.extend([&s.gate, &s.up, &s.down]);
                }
                v
            }
        };
        for mat in mats.into_iter().chain(ffn) {
            m = m.max(mat.rows * mat.cols);
        }
    }
    m
}

fn load_net(file: &GgufFile) -> Result<(Hybrid, Vec<Option<[Mat; 3]>>)> {
    let spec = match file.architecture() {
        Some("qwen35") => &xwen_engine::models::qwen35::DENSE,
        Some("qwen35moe") => &xwen_engine::models::qwen35::MOE,
        Some(a) => return Err(CudaError::Unsupported(format!("the CUDA backend runs qwen35 and qwen35moe; this file is {a} (use -ngl 0 for the CPU)"))),
        None => return Err(CudaError::Unsupported("the file names no architecture".into())),
    };
    Ok(Hybrid::load(file, spec)?)
}

fn plan_bytes(file: &GgufFile, net: &Hybrid, experts: &[Option<[Mat; 3]>], n_ctx: usize) -> u64 {
    let cfg = &net.cfg;
    let weights: u64 = file.tensors().iter().map(|t| file.tensor_data(t).len() as u64).sum();
    let _ = experts;
    let state = xwen_engine::models::hybrid::state_bytes(cfg, n_ctx, (xwen_engine::KvType::F16, xwen_engine::KvType::F16));
    weights + state
}

impl CudaModel {
    /// Uploads `file`'s model to device `opts.device`; refuses a model that does not fit.
    pub fn load(file: &GgufFile, opts: &CudaOptions) -> Result<CudaModel> {
        let (net, experts) = load_net(file)?;
        let gpu = Gpu::new(opts.device)?;
        let ubatch = ubatch_for(&net, opts);
        let need = plan_bytes(file, &net, &experts, opts.n_ctx) + scratch_bytes(&net, opts.n_ctx, ubatch);
        if need + (256 << 20) > gpu.info.free_bytes {
            return Err(CudaError::TooBig {
                need_mib: need >> 20,
                free_mib: gpu.info.free_bytes >> 20,
                device: format!("cuda:{} ({})", gpu.info.ordinal, gpu.info.name),
                what: format!("weights, KV and state at -c {}", opts.n_ctx),
            });
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
            n_split: n_ctx.div_ceil(256),
            n_expert,
            n_used,
            expert_ff,
            norm_w,
            w_scale,
        };
        let up = Uploader { gpu: &gpu, file };
        let mut layers = Vec::with_capacity(net.layers.len());
        for (il, l) in net.layers.iter().enumerate() {
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
                        conv_state: gpu.zeros(dd.conv_state_len() * 4)?,
                        s: gpu.zeros(dd.state_len() * 4)?,
                    })
                }
                Mixer::Attn(w) => DevMixer::Attn(AttnLayer {
                    q: up.mat(&w.q)?,
                    k: up.mat(&w.k)?,
                    v: up.mat(&w.v)?,
                    o: up.mat(&w.o)?,
                    q_norm: gpu.upload_f32(&w.q_norm)?,
                    k_norm: gpu.upload_f32(&w.k_norm)?,
                    k_cache: gpu.zeros(n_ctx * att.kv_width() * 2)?,
                    v_cache: gpu.zeros(n_ctx * att.kv_width() * 2)?,
                }),
                Mixer::Mla(_) => return Err(CudaError::Unsupported("MLA layers are not on the CUDA backend".into())),
            };
            let ffn = match &l.ffn {
                Ffn::Dense(w) => DevFfn::Dense(Glu { gate: up.mat(&w.gate)?, up: up.mat(&w.up)?, down: up.mat(&w.down)? }),
                Ffn::Moe(w) => {
                    let ex = experts.get(il).and_then(|e| e.as_ref()).ok_or_else(|| CudaError::Unsupported(format!("layer {il}: an MoE layer without experts")))?;
                    DevFfn::Moe(MoeLayer {
                        router: up.mat(&w.router)?,
                        experts: Glu { gate: up.mat(&ex[0])?, up: up.mat(&ex[1])?, down: up.mat(&ex[2])? },
                        shared: match &w.shared {
                            Some(s) => Some(Glu { gate: up.mat(&s.gate)?, up: up.mat(&s.up)?, down: up.mat(&s.down)? }),
                            None => None,
                        },
                        shared_gate: match &w.shared_gate {
                            Some(g) => Some(DevMat { buf: gpu.upload_f32(g)?, ty: 0, rows: 1, cols: g.len(), row_bytes: g.len() * 4 }),
                            None => None,
                        },
                    })
                }
            };
            let kinds = LayerKinds::of(&mixer, &ffn);
            layers.push(DevLayer { attn_norm: gpu.upload_f32(&l.attn_norm)?, post_norm: gpu.upload_f32(&l.post_attn_norm)?, mixer, ffn, kinds });
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
            xq_b: gpu.zeros(t * q8_width(&net))?,
            xd_b: gpu.zeros(t * q8_width(&net).div_ceil(32) * 8)?,
            xq_bz: gpu.zeros(t * q8_width(&net))?,
            xd_bz: gpu.zeros(t * q8_width(&net).div_ceil(32) * 8)?,
            w_f16: gpu.zeros(if gpu.blas.is_some() { 2 * max_dense_values(&net) } else { 4 })?,
            xn_f16: gpu.zeros(if gpu.blas.is_some() { 2 * t * h } else { 4 })?,
            x_f16: gpu.zeros(if gpu.blas.is_some() { 2 * t * q8_width(&net) } else { 4 })?,
            ex_counts: f(n_expert.max(1))?,
            ex_offsets: f(n_expert.max(1))?,
            ex_order: f(t * n_used.max(1))?,
            ex_tiles: gpu.zeros(16 * max_tiles(t * n_used.max(1), n_expert))?,
            sg: f(t)?,
            router: f(t * n_expert.max(1))?,
            ids: f(t * n_used.max(1))?,
            weights: f(t * n_used.max(1))?,
            logits: f(d.n_vocab)?,
            token: f(1)?,
        };
        let output = up.mat(&net.output)?;
        let head_kinds = Kinds::of(&[&output]);
        let model = CudaModel {
            tok_embd: up.mat(&net.tok_embd)?,
            output_norm: gpu.upload_f32(&net.output_norm)?,
            output,
            head_kinds,
            layers,
            still,
            sc,
            graph: None,
            use_graph: opts.graph,
            ubatch,
            pos: 0,
            n_ctx,
            d,
            device_bytes: need,
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
        for l in &mut self.layers {
            if let DevMixer::Delta(dl) = &mut l.mixer {
                self.gpu.zero(&mut dl.conv_state)?;
                self.gpu.zero(&mut dl.s)?;
            }
        }
        self.pos = 0;
        self.gpu.sync()
    }

    /// Feeds `token` at the next position; returns the greedy next token (the argmax of its
    /// logits, computed on the device: the step's one host sync). `logits()` reads the rest.
    pub fn step(&mut self, token: u32) -> Result<u32> {
        self.check(&[token])?;
        self.write_step(&[token])?;
        if self.use_graph {
            if self.graph.is_none() {
                self.gpu.stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
                let recorded = self.record(1);
                let graph = self.gpu.stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
                recorded?;
                self.graph = Some(graph.ok_or_else(|| CudaError::Unsupported("stream capture made no graph".into()))?);
            }
            if let Some(g) = &self.graph {
                g.launch()?;
            }
        } else {
            self.record(1)?;
        }
        self.pos += 1;
        let t = self.gpu.read_i32(&self.sc.token, 1)?;
        Ok(t[0] as u32)
    }

    /// Feeds a prompt in batches of up to `ubatch()` tokens (each weight read once a batch);
    /// returns the greedy token after its last. The logits are the last token's.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<u32> {
        self.check(tokens)?;
        if tokens.len() == 1 {
            return self.step(tokens[0]);
        }
        for chunk in tokens.chunks(self.ubatch) {
            self.write_step(chunk)?;
            self.record(chunk.len())?;
            self.pos += chunk.len();
        }
        let t = self.gpu.read_i32(&self.sc.token, 1)?;
        Ok(t[0] as u32)
    }

    /// Device time per kernel of feeding `tokens` (one decode step for one token, prefill
    /// passes for more), each launch timed alone: (kernel, ms, launches), by time.
    pub fn profile(&mut self, tokens: &[u32]) -> Result<Vec<(String, f64, u64)>> {
        self.check(tokens)?;
        let n = tokens.len().min(self.ubatch);
        self.write_step(&tokens[..n])?;
        self.gpu.set_profiling(true);
        let r = self.record(n);
        let table = self.gpu.set_profiling(false);
        r?;
        self.pos += n;
        Ok(table)
    }

    /// The most tokens one prefill pass takes.
    pub fn ubatch(&self) -> usize {
        self.ubatch
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.d.n_vocab) {
            return Err(CudaError::TokenOutOfRange { id, n_vocab: self.d.n_vocab });
        }
        if self.pos + tokens.len() > self.n_ctx {
            return Err(CudaError::ContextFull { pos: self.pos + tokens.len(), n_ctx: self.n_ctx });
        }
        Ok(())
    }

    /// The step's parameters: [first position, token ids…].
    fn write_step(&mut self, tokens: &[u32]) -> Result<()> {
        let params: Vec<u8> = std::iter::once(self.pos as i32).chain(tokens.iter().map(|&t| t as i32)).flat_map(|v| v.to_le_bytes()).collect();
        self.gpu.write(&mut self.sc.step, &params)
    }

    /// The logits of the last token fed.
    pub fn logits(&self) -> Result<Vec<f32>> {
        self.gpu.read_f32(&self.sc.logits, self.d.n_vocab)
    }

    /// Enqueues a pass of `n` tokens (what the decode graph captures at n = 1).
    fn record(&self, n: usize) -> Result<()> {
        let g = &self.gpu;
        let d = &self.d;
        let sc = &self.sc;
        let h = d.hidden;
        g.launch(
            "embed",
            (h.div_ceil(256) as u32, n as u32),
            256,
            0,
            &[
                Arg::Ptr(self.tok_embd.buf.ptr),
                Arg::I32(self.tok_embd.ty),
                Arg::I32(h as i32),
                Arg::I64(self.tok_embd.row_bytes as i64),
                Arg::Ptr(sc.step.at(4)),
                Arg::Ptr(sc.x.ptr),
            ],
        )?;
        for l in &self.layers {
            let kinds = &l.kinds;
            let xn = self.rms_norm(sc.x.ptr, l.attn_norm.ptr, n, self.decode_rows(n), kinds.mix_in)?;
            match &l.mixer {
                DevMixer::Delta(w) => self.delta(w, xn, kinds.mix_out, n)?,
                DevMixer::Attn(w) => self.attention(w, xn, kinds.mix_out, n)?,
            }
            let moe_rows = matches!(l.ffn, DevFfn::Moe(_)) && !self.grouped_experts(n);
            let xn = self.rms_norm(sc.x.ptr, l.post_norm.ptr, n, self.decode_rows(n) || moe_rows, kinds.ffn_in)?;
            match &l.ffn {
                DevFfn::Dense(w) => {
                    self.glu(w, xn, sc.ffn_h.ptr, n)?;
                    let hin = self.input(sc.ffn_h.ptr, w.down.cols, n, self.decode_rows(n), kinds.ffn_mid)?;
                    self.proj(&w.down, hin, sc.x.ptr, Some(sc.x.ptr), n)?;
                }
                DevFfn::Moe(w) => self.moe(w, xn, kinds, n)?,
            }
        }
        // the head reads the last token only
        let last = sc.x.at((n - 1) * h * 4);
        let xn = self.rms_norm(last, self.output_norm.ptr, 1, true, self.head_kinds)?;
        self.proj(&self.output, xn, sc.logits.ptr, None, 1)?;
        g.launch("argmax", (1, 1), 1024, 0, &[Arg::Ptr(sc.logits.ptr), Arg::I32(d.n_vocab as i32), Arg::Ptr(sc.token.ptr)])
    }

    /// Whether a pass of n tokens multiplies row by row (the decode products, on q8 inputs).
    fn decode_rows(&self, n: usize) -> bool {
        n == 1
    }

    /// Whether a pass's routed experts run grouped per expert on tensor cores (mm_ex): prompt
    /// passes whose slots fit moe_sort's shared memory and whose expert widths are whole chunks.
    fn grouped_experts(&self, n: usize) -> bool {
        let d = &self.d;
        n > 1 && d.hidden % 128 == 0 && d.expert_ff % 128 == 0 && d.n_expert * 8 <= 48 << 10
    }

    /// RMSNorm of `n` rows of the hidden width into xn; for row-by-row products (`rows`), xn
    /// quantized as their weights need; for a cuBLAS pass, xn in f16 once for all its products.
    fn rms_norm(&self, x: u64, w: u64, n: usize, rows: bool, kinds: Kinds) -> Result<In> {
        let (sc, hd) = (&self.sc, self.d.hidden);
        let fused = rows && kinds.k && hd % 256 == 0;
        let (yq, yd) = if fused { (sc.xq_n.ptr, sc.xd_n.ptr) } else { (0, 0) };
        self.gpu.launch(
            "rms_norm",
            (n as u32, 1),
            1024,
            0,
            &[Arg::Ptr(x), Arg::Ptr(w), Arg::Ptr(sc.xn.ptr), Arg::I32(hd as i32), Arg::F32(self.d.eps), Arg::Ptr(yq), Arg::Ptr(yd)],
        )?;
        let mut q = Q8::default();
        if fused {
            q.qk = sc.xq_n.ptr;
            q.dk = sc.xd_n.ptr;
        }
        if rows && kinds.z && hd % 32 == 0 {
            self.quant(sc.xn.ptr, hd, n, 1, sc.xq_nz.ptr, sc.xd_nz.ptr)?;
            q.qz = sc.xq_nz.ptr;
            q.dz = sc.xd_nz.ptr;
        }
        let mut f16 = 0;
        if !rows && n >= BLAS_MIN_TOKENS && self.gpu.blas.is_some() {
            self.to_f16(sc.xn.ptr, hd, n, sc.xn_f16.ptr)?;
            f16 = sc.xn_f16.ptr;
        }
        Ok(In { f: sc.xn.ptr, q, f16 })
    }

    /// An input other than xn (`rows` rows of `cols` values at x), quantized where `rows_path`.
    fn input(&self, x: u64, cols: usize, rows: usize, rows_path: bool, kinds: Kinds) -> Result<In> {
        let sc = &self.sc;
        let mut q = Q8::default();
        if rows_path && kinds.k && cols % 256 == 0 {
            self.quant(x, cols, rows, 0, sc.xq_b.ptr, sc.xd_b.ptr)?;
            q.qk = sc.xq_b.ptr;
            q.dk = sc.xd_b.ptr;
        }
        if rows_path && kinds.z && cols % 32 == 0 {
            self.quant(x, cols, rows, 1, sc.xq_bz.ptr, sc.xd_bz.ptr)?;
            q.qz = sc.xq_bz.ptr;
            q.dz = sc.xd_bz.ptr;
        }
        Ok(In { f: x, q, f16: 0 })
    }

    fn quant(&self, x: u64, cols: usize, rows: usize, kind: i32, xq: u64, xd: u64) -> Result<()> {
        let per_warp = if kind == 0 { 256 } else { 32 };
        self.gpu.launch(
            "quant_q8",
            ((cols / per_warp).div_ceil(8) as u32, rows as u32),
            256,
            0,
            &[Arg::Ptr(x), Arg::I32(cols as i32), Arg::I64(cols as i64), Arg::Ptr(xq), Arg::Ptr(xd), Arg::I32(kind)],
        )
    }

    fn to_f16(&self, x: u64, cols: usize, n: usize, out: u64) -> Result<()> {
        let vals = n * cols;
        self.gpu.launch("to_f16", (vals.div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(x), Arg::I32(cols as i32), Arg::I64(cols as i64), Arg::I32(n as i32), Arg::Ptr(out)])
    }

    /// y[t] = W·x[t] (+ res[t]) for n rows of x (as wide as W), y rows as wide as W is tall.
    /// res, where given, is y (a residual added in place).
    fn proj(&self, w: &DevMat, x: In, y: u64, res: Option<u64>, n: usize) -> Result<()> {
        if n == 1 {
            return mv(&self.gpu, w, None, x, w.cols, 1, y, 0, res, 1);
        }
        if let Some(blas) = &self.gpu.blas {
            if n >= BLAS_MIN_TOKENS && res.is_none_or(|r| r == y) {
                return self.proj_blas(blas, w, x, y, res.is_some(), n);
            }
        }
        // mm_tc and mm take the same arguments; they differ in tile shape
        let (kernel, grid) = if n >= TC_MIN_TOKENS && w.cols % 128 == 0 {
            ("mm_tc", (w.rows.div_ceil(64) as u32, n.div_ceil(64) as u32))
        } else {
            ("mm", (w.rows.div_ceil(MV_WARPS) as u32, n.div_ceil(MM_T) as u32))
        };
        self.gpu.launch(
            kernel,
            grid,
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(w.buf.ptr),
                Arg::I32(w.ty),
                Arg::I32(w.rows as i32),
                Arg::I32(w.cols as i32),
                Arg::I64(w.row_bytes as i64),
                Arg::Ptr(x.f),
                Arg::I64(w.cols as i64),
                Arg::I32(n as i32),
                Arg::Ptr(y),
                Arg::I64(w.rows as i64),
                Arg::Ptr(res.unwrap_or(0)),
            ],
        )
    }

    /// Up to four row-by-row products of one input in one launch (`mv4`).
    fn proj_many(&self, parts: &[(&DevMat, u64)], x: In) -> Result<()> {
        let total: usize = parts.iter().map(|(m, _)| m.rows).sum();
        let mut args = vec![Arg::I32(parts[0].0.cols as i32), Arg::Ptr(x.f), Arg::Ptr(x.q.qk), Arg::Ptr(x.q.dk), Arg::Ptr(x.q.qz), Arg::Ptr(x.q.dz)];
        for i in 0..4 {
            match parts.get(i) {
                Some((m, y)) => args.extend([Arg::Ptr(m.buf.ptr), Arg::I32(m.ty), Arg::I32(m.rows as i32), Arg::I64(m.row_bytes as i64), Arg::Ptr(*y)]),
                None => args.extend([Arg::Ptr(0), Arg::I32(0), Arg::I32(0), Arg::I64(0), Arg::Ptr(0)]),
            }
        }
        self.gpu.launch("mv4", (total.div_ceil(MV_WARPS) as u32, 1), (32 * MV_WARPS) as u32, 0, &args)
    }

    /// A prompt product through cuBLAS: W to f16 rows, x to f16 (unless the input already is),
    /// one GEMM (+= y where `accumulate`).
    fn proj_blas(&self, blas: &crate::blas::Blas, w: &DevMat, x: In, y: u64, accumulate: bool, n: usize) -> Result<()> {
        let (g, sc) = (&self.gpu, &self.sc);
        let units = w.rows * units_per_row(w.ty, w.cols);
        g.launch(
            "dequant_f16",
            (units.div_ceil(256) as u32, 1),
            256,
            0,
            &[Arg::Ptr(w.buf.ptr), Arg::I32(w.ty), Arg::I32(w.rows as i32), Arg::I32(w.cols as i32), Arg::I64(w.row_bytes as i64), Arg::Ptr(sc.w_f16.ptr)],
        )?;
        let xh = if x.f16 != 0 {
            x.f16
        } else {
            self.to_f16(x.f, w.cols, n, sc.x_f16.ptr)?;
            sc.x_f16.ptr
        };
        blas.gemm_tn(w.rows, n, w.cols, sc.w_f16.ptr, w.cols, xh, w.cols, y, w.rows, accumulate)
    }

    /// h[t] = silu(gate·x[t]) ⊙ (up·x[t]) for n rows.
    fn glu(&self, w: &Glu, x: In, h: u64, n: usize) -> Result<()> {
        let (gm, um) = (&w.gate, &w.up);
        if n >= TC_MIN_TOKENS && (gm.cols % 128 == 0 || self.gpu.blas.is_some()) {
            // two tensor-core products, then the activation
            let u = self.sc.ffn_u.ptr;
            self.proj(gm, x, h, None, n)?;
            self.proj(um, x, u, None, n)?;
            let len = n * gm.rows;
            return self.gpu.launch("silu_mul", (len.div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(h), Arg::Ptr(u), Arg::I64(len as i64)]);
        }
        if n == 1 || gm.ty != um.ty || gm.row_bytes != um.row_bytes {
            return mv_glu(&self.gpu, w, None, x, gm.cols, 1, h, gm.rows, n);
        }
        self.gpu.launch(
            "mm_glu",
            (gm.rows.div_ceil(MV_WARPS) as u32, n.div_ceil(MM_T) as u32),
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(gm.buf.ptr),
                Arg::Ptr(um.buf.ptr),
                Arg::I32(gm.ty),
                Arg::I32(gm.rows as i32),
                Arg::I32(gm.cols as i32),
                Arg::I64(gm.row_bytes as i64),
                Arg::Ptr(x.f),
                Arg::I64(gm.cols as i64),
                Arg::I32(n as i32),
                Arg::Ptr(h),
                Arg::I64(gm.rows as i64),
            ],
        )
    }

    fn delta(&self, w: &DeltaLayer, x: In, out_kinds: Kinds, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        if n == 1 {
            self.proj_many(&[(&w.qkv, sc.qkv.ptr), (&w.z, sc.z.ptr), (&w.beta, sc.beta.ptr), (&w.alpha, sc.alpha.ptr)], x)?;
        } else {
            self.proj(&w.qkv, x, sc.qkv.ptr, None, n)?;
            self.proj(&w.z, x, sc.z.ptr, None, n)?;
            self.proj(&w.beta, x, sc.beta.ptr, None, n)?;
            self.proj(&w.alpha, x, sc.alpha.ptr, None, n)?;
        }
        let cd = w.qkv.rows;
        let conv_args = [
            Arg::Ptr(sc.qkv.ptr),
            Arg::Ptr(w.conv_state.ptr),
            Arg::Ptr(w.taps.ptr),
            Arg::Ptr(sc.conv.ptr),
            Arg::I32(cd as i32),
            Arg::I32(d.conv_kernel as i32),
            Arg::I32(n as i32),
        ];
        if n == 1 {
            g.launch("conv_step", (cd.div_ceil(256) as u32, 1), 256, 0, &conv_args)?;
        } else {
            // every (token, channel) at once, then the state moved on
            g.launch("conv_prompt", ((n * cd).div_ceil(256) as u32, 1), 256, 0, &conv_args)?;
            g.launch(
                "conv_shift",
                (cd.div_ceil(256) as u32, 1),
                256,
                0,
                &[Arg::Ptr(sc.qkv.ptr), Arg::Ptr(w.conv_state.ptr), Arg::I32(cd as i32), Arg::I32(d.conv_kernel as i32), Arg::I32(n as i32)],
            )?;
        }
        self.delta_scan(w, out_kinds, n)
    }

    /// The scan of a pass (a decode step too): gates and normed q / k per token, then S's rows
    /// spread over blocks (8 a block, in registers through the pass), then the output norms;
    /// the out projection. (delta_step, one block a head, is its single-kernel reference.)
    fn delta_scan(&self, w: &DeltaLayer, out_kinds: Kinds, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        if n == 1 {
            // a decode step: the gates and norms inside the rows' kernel
            g.launch(
                "delta_step_rows",
                (d.hv as u32, d.sd.div_ceil(8) as u32),
                128,
                0,
                &[
                    Arg::Ptr(sc.conv.ptr),
                    Arg::Ptr(sc.beta.ptr),
                    Arg::Ptr(sc.alpha.ptr),
                    Arg::Ptr(w.dt_bias.ptr),
                    Arg::Ptr(w.a.ptr),
                    Arg::Ptr(w.s.ptr),
                    Arg::Ptr(sc.o_raw.ptr),
                    Arg::I32(d.hk as i32),
                    Arg::I32(d.hv as i32),
                    Arg::I32(d.sd as i32),
                    Arg::I32(d.tiled as i32),
                    Arg::F32(d.eps),
                ],
            )?;
            return self.delta_finish(w, out_kinds, n);
        }
        g.launch(
            "delta_prep",
            (d.hk as u32, n as u32),
            32,
            0,
            &[
                Arg::Ptr(sc.conv.ptr),
                Arg::Ptr(sc.beta.ptr),
                Arg::Ptr(sc.alpha.ptr),
                Arg::Ptr(w.dt_bias.ptr),
                Arg::Ptr(w.a.ptr),
                Arg::Ptr(sc.qn.ptr),
                Arg::Ptr(sc.kn.ptr),
                Arg::Ptr(sc.gb.ptr),
                Arg::I32(d.hk as i32),
                Arg::I32(d.hv as i32),
                Arg::I32(d.sd as i32),
                Arg::I32(d.tiled as i32),
                Arg::F32(d.eps),
            ],
        )?;
        g.launch(
            "delta_rows",
            (d.hv as u32, d.sd.div_ceil(8) as u32),
            128,
            0,
            &[
                Arg::Ptr(sc.qn.ptr),
                Arg::Ptr(sc.kn.ptr),
                Arg::Ptr(sc.conv.ptr),
                Arg::Ptr(sc.gb.ptr),
                Arg::Ptr(w.s.ptr),
                Arg::Ptr(sc.o_raw.ptr),
                Arg::I32(d.hk as i32),
                Arg::I32(d.hv as i32),
                Arg::I32(d.sd as i32),
                Arg::I32(d.tiled as i32),
                Arg::I32(n as i32),
            ],
        )?;
        self.delta_finish(w, out_kinds, n)
    }

    /// The scan's gated output norms, then the out projection (and its residual).
    fn delta_finish(&self, w: &DeltaLayer, out_kinds: Kinds, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        g.launch(
            "delta_out",
            (d.hv as u32, n as u32),
            128,
            0,
            &[Arg::Ptr(sc.o_raw.ptr), Arg::Ptr(sc.z.ptr), Arg::Ptr(w.norm.ptr), Arg::Ptr(sc.delta_o.ptr), Arg::I32(d.hv as i32), Arg::I32(d.sd as i32), Arg::F32(d.eps)],
        )?;
        let o = self.input(sc.delta_o.ptr, w.out.cols, n, self.decode_rows(n), out_kinds)?;
        self.proj(&w.out, o, sc.x.ptr, Some(sc.x.ptr), n)
    }

    fn attention(&self, w: &AttnLayer, x: In, out_kinds: Kinds, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        if n == 1 {
            self.proj_many(&[(&w.q, sc.qg.ptr), (&w.k, sc.k.ptr), (&w.v, sc.v.ptr)], x)?;
        } else {
            self.proj(&w.q, x, sc.qg.ptr, None, n)?;
            self.proj(&w.k, x, sc.k.ptr, None, n)?;
            self.proj(&w.v, x, sc.v.ptr, None, n)?;
        }
        let block = d.hd.div_ceil(32) * 32;
        g.launch(
            "attn_heads",
            ((d.n_head + d.n_head_kv) as u32, n as u32),
            block as u32,
            (d.hd * 4) as u32,
            &[
                Arg::Ptr(sc.qg.ptr),
                Arg::Ptr(sc.k.ptr),
                Arg::Ptr(sc.v.ptr),
                Arg::Ptr(w.q_norm.ptr),
                Arg::Ptr(w.k_norm.ptr),
                Arg::Ptr(self.still.as_ref().map_or(0, |s| s.ptr)),
                Arg::Ptr(sc.step.ptr),
                Arg::Ptr(sc.q.ptr),
                Arg::Ptr(w.k_cache.ptr),
                Arg::Ptr(w.v_cache.ptr),
                Arg::I32(d.n_head as i32),
                Arg::I32(d.n_head_kv as i32),
                Arg::I32(d.hd as i32),
                Arg::I32(d.n_rot as i32),
                Arg::F32(d.theta_scale),
                Arg::F32(d.eps),
            ],
        )?;
        self.gpu.launch_3d(
            "attn_split",
            (d.n_head as u32, d.n_split as u32, n as u32),
            128,
            0,
            &[
                Arg::Ptr(sc.q.ptr),
                Arg::Ptr(w.k_cache.ptr),
                Arg::Ptr(w.v_cache.ptr),
                Arg::Ptr(sc.step.ptr),
                Arg::Ptr(sc.part_o.ptr),
                Arg::Ptr(sc.part_ml.ptr),
                Arg::I32(d.n_head as i32),
                Arg::I32(d.n_head_kv as i32),
                Arg::I32(d.hd as i32),
                Arg::F32(1.0 / (d.hd as f32).sqrt()),
            ],
        )?;
        g.launch(
            "attn_merge",
            (d.n_head as u32, n as u32),
            block as u32,
            0,
            &[Arg::Ptr(sc.part_o.ptr), Arg::Ptr(sc.part_ml.ptr), Arg::Ptr(sc.qg.ptr), Arg::Ptr(sc.attn_o.ptr), Arg::I32(d.hd as i32), Arg::I32(d.n_split as i32)],
        )?;
        let o = self.input(sc.attn_o.ptr, w.o.cols, n, self.decode_rows(n), out_kinds)?;
        self.proj(&w.o, o, sc.x.ptr, Some(sc.x.ptr), n)
    }

    fn moe(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h, eff) = (d.n_used, d.hidden, d.expert_ff);
        self.proj(&w.router, x, sc.router.ptr, None, n)?;
        let route_args = [
            Arg::Ptr(sc.router.ptr),
            Arg::I32(d.n_expert as i32),
            Arg::I32(k as i32),
            Arg::I32(d.norm_w as i32),
            Arg::F32(d.w_scale),
            Arg::Ptr(sc.ids.ptr),
            Arg::Ptr(sc.weights.ptr),
        ];
        if d.n_expert <= 512 && k <= 32 {
            // a warp a token, the experts' probabilities in registers
            g.launch("moe_route_warp", (n as u32, 1), 32, 0, &route_args)?;
        } else {
            g.launch("moe_route", (n as u32, 1), 256, (d.n_expert * 4) as u32, &route_args)?;
        }
        if self.grouped_experts(n) {
            self.experts_grouped(&w.experts, n)?;
        } else {
            // every (token, slot) its expert's products: a token's k slots read its row of xn
            mv_glu(g, &w.experts, Some(sc.ids.ptr), x, h, k, sc.ffn_h.ptr, eff, n * k)?;
            let hin = self.input(sc.ffn_h.ptr, eff, n * k, true, kinds.ffn_mid)?;
            mv(g, &w.experts.down, Some(sc.ids.ptr), hin, eff, 1, sc.ys.ptr, h, None, n * k)?;
        }
        let mut shared = 0u64;
        let mut sg = 0u64;
        if let Some(s) = &w.shared {
            self.glu(s, x, sc.sh_h.ptr, n)?;
            let hin = self.input(sc.sh_h.ptr, s.down.cols, n, self.decode_rows(n), kinds.shared_mid)?;
            self.proj(&s.down, hin, sc.sh_y.ptr, None, n)?;
            shared = sc.sh_y.ptr;
            if let Some(gate) = &w.shared_gate {
                self.proj(gate, x, sc.sg.ptr, None, n)?;
                sg = sc.sg.ptr;
            }
        }
        g.launch(
            "moe_combine",
            (h.div_ceil(256) as u32, n as u32),
            256,
            0,
            &[Arg::Ptr(sc.x.ptr), Arg::Ptr(sc.ys.ptr), Arg::Ptr(sc.weights.ptr), Arg::I32(k as i32), Arg::I32(h as i32), Arg::Ptr(shared), Arg::Ptr(sg)],
        )
    }

    /// A prompt pass's routed experts grouped per expert: the slots sorted by expert into tiles
    /// of up to 16 (on the device, no host round trip), then gate, up and down products on
    /// tensor cores, each expert's weights read once a tile.
    fn experts_grouped(&self, ex: &Glu, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h, eff) = (d.n_used, d.hidden, d.expert_ff);
        let slots = n * k;
        let tiles = max_tiles(slots, d.n_expert);
        g.launch(
            "moe_sort",
            (1, 1),
            1024,
            (d.n_expert * 8) as u32,
            &[
                Arg::Ptr(sc.ids.ptr),
                Arg::I32(slots as i32),
                Arg::I32(d.n_expert as i32),
                Arg::Ptr(sc.ex_counts.ptr),
                Arg::Ptr(sc.ex_offsets.ptr),
                Arg::Ptr(sc.ex_order.ptr),
                Arg::Ptr(sc.ex_tiles.ptr),
                Arg::I32(tiles as i32),
            ],
        )?;
        let product = |m: &DevMat, x: u64, x_stride: usize, x_div: usize, y: u64, y_stride: usize| {
            g.launch(
                "mm_ex",
                (m.rows.div_ceil(EX_ROWS) as u32, tiles as u32),
                128,
                0,
                &[
                    Arg::Ptr(m.buf.ptr),
                    Arg::I32(m.ty),
                    Arg::I32(m.rows as i32),
                    Arg::I32(m.cols as i32),
                    Arg::I64(m.row_bytes as i64),
                    Arg::I64(m.mat_bytes() as i64),
                    Arg::Ptr(sc.ex_tiles.ptr),
                    Arg::Ptr(sc.ex_order.ptr),
                    Arg::Ptr(x),
                    Arg::I64(x_stride as i64),
                    Arg::I32(x_div as i32),
                    Arg::Ptr(y),
                    Arg::I64(y_stride as i64),
                ],
            )
        };
        product(&ex.gate, sc.xn.ptr, h, k, sc.ffn_h.ptr, eff)?;
        product(&ex.up, sc.xn.ptr, h, k, sc.ffn_u.ptr, eff)?;
        let len = slots * eff;
        g.launch("silu_mul", (len.div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(sc.ffn_h.ptr), Arg::Ptr(sc.ffn_u.ptr), Arg::I64(len as i64)])?;
        product(&ex.down, sc.ffn_h.ptr, eff, 1, sc.ys.ptr, h)
    }
}

/// A product's input quantized for the decode products (kernels.cu quant_q8): q8_K for the
/// k-quant weights, q8_0 for Q8_0; each int8 values and (scale, scale·Σq) per 32; 0 = absent.
#[derive(Clone, Copy, Debug, Default)]
struct Q8 {
    qk: u64,
    dk: u64,
    qz: u64,
    dz: u64,
}

/// A product's input: its f32 rows, their q8 copies for row-by-row products, and an f16 copy
/// where a cuBLAS pass made one (0 = none).
#[derive(Clone, Copy, Debug)]
struct In {
    f: u64,
    q: Q8,
    f16: u64,
}

const MV_WARPS: usize = 4;
/// Tokens a pass of the `mm` kernels (kernels.cu MM_T).
const MM_T: usize = 8;
/// From this many tokens a product runs on tensor cores (`mm_tc`, 64-token tiles).
const TC_MIN_TOKENS: usize = 16;
/// From this many tokens a prompt product goes through cuBLAS (where present): below it the
/// f16 copy of the weight costs more than the GEMM saves.
const BLAS_MIN_TOKENS: usize = 32;
/// Weight rows of an mm_ex block (kernels.cu EX_WARPS · EX_NT · 8).
const EX_ROWS: usize = 128;

/// mm_ex tiles a pass of `slots` routed slots can need: a tile per 16 slots, plus a part-full
/// one per expert used.
fn max_tiles(slots: usize, n_expert: usize) -> usize {
    slots.div_ceil(16) + n_expert.min(slots)
}

/// `unit`s of a row (kernels.cu `units`): one thread of dequant_f16 each.
fn units_per_row(ty: i32, cols: usize) -> usize {
    match ty {
        12 | 13 => cols / 256 * 32,
        14 => cols / 256 * 16,
        8 => cols / 32 * 8,
        2 => cols / 32 * 4,
        _ => cols / 4,
    }
}

/// y[s] = W_{ids[s]}·x[s / x_div] (+ res[s]) for `slots` slots.
#[allow(clippy::too_many_arguments)]
fn mv(g: &Gpu, w: &DevMat, ids: Option<u64>, x: In, x_stride: usize, x_div: usize, y: u64, y_stride: usize, res: Option<u64>, slots: usize) -> Result<()> {
    g.launch(
        "mv",
        (w.rows.div_ceil(MV_WARPS) as u32, slots as u32),
        (32 * MV_WARPS) as u32,
        0,
        &[
            Arg::Ptr(w.buf.ptr),
            Arg::I32(w.ty),
            Arg::I32(w.rows as i32),
            Arg::I32(w.cols as i32),
            Arg::I64(w.row_bytes as i64),
            Arg::I64(w.mat_bytes() as i64),
            Arg::Ptr(ids.unwrap_or(0)),
            Arg::Ptr(x.f),
            Arg::Ptr(x.q.qk),
            Arg::Ptr(x.q.dk),
            Arg::Ptr(x.q.qz),
            Arg::Ptr(x.q.dz),
            Arg::I64(x_stride as i64),
            Arg::I32(x_div.max(1) as i32),
            Arg::Ptr(y),
            Arg::I64(y_stride as i64),
            Arg::Ptr(res.unwrap_or(0)),
        ],
    )
}

/// h[s] = silu(G_{ids[s]}·x[s / x_div]) ⊙ (U_{ids[s]}·x[s / x_div]) for `slots` slots.
#[allow(clippy::too_many_arguments)]
fn mv_glu(g: &Gpu, w: &Glu, ids: Option<u64>, x: In, x_stride: usize, x_div: usize, h: u64, h_stride: usize, slots: usize) -> Result<()> {
    let (gm, um) = (&w.gate, &w.up);
    g.launch(
        "mv_glu",
        (gm.rows.div_ceil(MV_WARPS) as u32, slots as u32),
        (32 * MV_WARPS) as u32,
        0,
        &[
            Arg::Ptr(gm.buf.ptr),
            Arg::Ptr(um.buf.ptr),
            Arg::I32(gm.ty),
            Arg::I32(um.ty),
            Arg::I32(gm.rows as i32),
            Arg::I32(gm.cols as i32),
            Arg::I64(gm.row_bytes as i64),
            Arg::I64(um.row_bytes as i64),
            Arg::I64(gm.mat_bytes() as i64),
            Arg::I64(um.mat_bytes() as i64),
            Arg::Ptr(ids.unwrap_or(0)),
            Arg::Ptr(x.f),
            Arg::Ptr(x.q.qk),
            Arg::Ptr(x.q.dk),
            Arg::Ptr(x.q.qz),
            Arg::Ptr(x.q.dz),
            Arg::I64(x_stride as i64),
            Arg::I32(x_div.max(1) as i32),
            Arg::Ptr(h),
            Arg::I64(h_stride as i64),
        ],
    )
}

struct Uploader<'a> {
    gpu: &'a Gpu,
    file: &'a GgufFile,
}

impl Uploader<'_> {
    /// A matrix or a whole stack, its bytes as the file holds them.
    fn mat(&self, m: &Mat) -> Result<DevMat> {
        let ty = device_type(m.ty).ok_or_else(|| CudaError::Unsupported(format!("{}: type {} has no CUDA kernel yet", m.info.name, m.ty.name())))?;
        if m.cols % 4 != 0 {
            // the products read activations four floats at a time
            return Err(CudaError::Unsupported(format!("{}: {} columns (the CUDA products take multiples of 4)", m.info.name, m.cols)));
        }
        let data = crate::layout::device_layout(m.ty, self.file.tensor_data(&m.info));
        Ok(DevMat { buf: self.gpu.upload(&data)?, ty, rows: m.rows, cols: m.cols, row_bytes: crate::layout::device_row_bytes(m.ty, m.cols) })
    }
}
