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
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions { device: 0, n_ctx: 4096, graph: true }
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
}

/// The activations of one decode step.
struct Scratch {
    step: DevBuf, // [pos, token]
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
    sh_y: DevBuf,
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
    pos: usize,
    device_bytes: u64,
}

/// Types the products have a kernel for (kernels.cu `dot_row`, `deq1`).
fn device_type(ty: GgmlType) -> Option<i32> {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
        .then(|| ty.id() as i32)
}

/// The bytes `load` puts on the device for `file`'s trunk and experts, KV at `n_ctx` and state.
pub fn device_bytes_needed(file: &GgufFile, n_ctx: usize) -> Result<u64> {
    let (net, experts) = load_net(file)?;
    Ok(plan_bytes(file, &net, &experts, n_ctx))
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
    let scratch = (cfg.n_vocab as u64 + 64 * cfg.hidden as u64) * 4 + (64 << 20);
    weights + state + scratch
}

impl CudaModel {
    /// Uploads `file`'s model to device `opts.device`; refuses a model that does not fit.
    pub fn load(file: &GgufFile, opts: &CudaOptions) -> Result<CudaModel> {
        let (net, experts) = load_net(file)?;
        let gpu = Gpu::new(opts.device)?;
        let need = plan_bytes(file, &net, &experts, opts.n_ctx);
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
            layers.push(DevLayer { attn_norm: gpu.upload_f32(&l.attn_norm)?, post_norm: gpu.upload_f32(&l.post_attn_norm)?, mixer, ffn });
        }
        let still = att
            .rope_sections
            .map(|s| xwen_engine::ops::imrope_text_still(s, att.n_rot).iter().map(|&b| b as i32).collect::<Vec<i32>>())
            .map(|v| gpu.upload_i32(&v))
            .transpose()?;
        let h = d.hidden;
        let cd = dd.conv_dim();
        let vd = dd.value_dim();
        let hq = att.n_head * att.head_dim;
        let shared_ff = cfg.moe.as_ref().map_or(0, |m| m.shared_ff);
        let ffn_w = cfg.ff.max(n_used * expert_ff).max(shared_ff).max(1);
        let f = |n: usize| gpu.zeros(n * 4);
        let sc = Scratch {
            step: f(2)?,
            x: f(h)?,
            xn: f(h)?,
            qkv: f(cd)?,
            z: f(vd)?,
            beta: f(dd.n_v_heads)?,
            alpha: f(dd.n_v_heads)?,
            conv: f(cd)?,
            delta_o: f(vd)?,
            qg: f(2 * hq)?,
            k: f(att.kv_width())?,
            v: f(att.kv_width())?,
            q: f(hq)?,
            part_o: f(att.n_head * d.n_split * att.head_dim)?,
            part_ml: f(att.n_head * d.n_split * 2)?,
            attn_o: f(hq)?,
            ffn_h: f(ffn_w)?,
            ys: f(n_used.max(1) * h)?,
            sh_y: f(h)?,
            sg: f(1)?,
            router: f(n_expert.max(1))?,
            ids: f(n_used.max(1))?,
            weights: f(n_used.max(1))?,
            logits: f(d.n_vocab)?,
            token: f(1)?,
        };
        let model = CudaModel {
            tok_embd: up.mat(&net.tok_embd)?,
            output_norm: gpu.upload_f32(&net.output_norm)?,
            output: up.mat(&net.output)?,
            layers,
            still,
            sc,
            graph: None,
            use_graph: opts.graph,
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
        if token as usize >= self.d.n_vocab {
            return Err(CudaError::TokenOutOfRange { id: token, n_vocab: self.d.n_vocab });
        }
        if self.pos >= self.n_ctx {
            return Err(CudaError::ContextFull { pos: self.pos, n_ctx: self.n_ctx });
        }
        let params: Vec<u8> = [self.pos as i32, token as i32].iter().flat_map(|v| v.to_le_bytes()).collect();
        self.gpu.write(&mut self.sc.step, &params)?;
        if self.use_graph {
            if self.graph.is_none() {
                self.gpu.stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
                let recorded = self.record();
                let graph = self.gpu.stream.end_capture(sys::CUgraphInstantiate_flags(0))?;
                recorded?;
                self.graph = Some(graph.ok_or_else(|| CudaError::Unsupported("stream capture made no graph".into()))?);
            }
            if let Some(g) = &self.graph {
                g.launch()?;
            }
        } else {
            self.record()?;
        }
        self.pos += 1;
        let t = self.gpu.read_i32(&self.sc.token, 1)?;
        Ok(t[0] as u32)
    }

    /// Feeds a prompt token by token; returns the greedy token after its last.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<u32> {
        let mut next = 0;
        for &t in tokens {
            next = self.step(t)?;
        }
        Ok(next)
    }

    /// The logits of the last step.
    pub fn logits(&self) -> Result<Vec<f32>> {
        self.gpu.read_f32(&self.sc.logits, self.d.n_vocab)
    }

    /// Enqueues one decode step (what the graph captures).
    fn record(&self) -> Result<()> {
        let g = &self.gpu;
        let d = &self.d;
        let sc = &self.sc;
        let h = d.hidden;
        let eps = d.eps;
        g.launch("embed", (((h + 255) / 256) as u32, 1), 256, 0, &[Arg::Ptr(self.tok_embd.buf.ptr), Arg::I32(self.tok_embd.ty), Arg::I32(h as i32), Arg::I64(self.tok_embd.row_bytes as i64), Arg::Ptr(sc.step.ptr), Arg::Ptr(sc.x.ptr)])?;
        for l in &self.layers {
            self.rms_norm(sc.x.ptr, l.attn_norm.ptr, sc.xn.ptr)?;
            match &l.mixer {
                DevMixer::Delta(w) => self.delta(w)?,
                DevMixer::Attn(w) => self.attention(w)?,
            }
            self.rms_norm(sc.x.ptr, l.post_norm.ptr, sc.xn.ptr)?;
            match &l.ffn {
                DevFfn::Dense(w) => {
                    self.glu(w, None, sc.xn.ptr, 0, sc.ffn_h.ptr, 0, 1)?;
                    self.mv(&w.down, None, sc.ffn_h.ptr, 0, sc.x.ptr, 0, Some(sc.x.ptr), 1)?;
                }
                DevFfn::Moe(w) => self.moe(w)?,
            }
        }
        self.rms_norm(sc.x.ptr, self.output_norm.ptr, sc.xn.ptr)?;
        self.mv(&self.output, None, sc.xn.ptr, 0, sc.logits.ptr, 0, None, 1)?;
        g.launch("argmax", (1, 1), 1024, 0, &[Arg::Ptr(sc.logits.ptr), Arg::I32(d.n_vocab as i32), Arg::Ptr(sc.token.ptr)])?;
        let _ = eps;
        Ok(())
    }

    fn rms_norm(&self, x: u64, w: u64, y: u64) -> Result<()> {
        self.gpu.launch("rms_norm", (1, 1), 1024, 0, &[Arg::Ptr(x), Arg::Ptr(w), Arg::Ptr(y), Arg::I32(self.d.hidden as i32), Arg::F32(self.d.eps)])
    }

    /// y[s] = W_{ids[s]}·x[s] (+ res[s]) for `slots` slots.
    #[allow(clippy::too_many_arguments)]
    fn mv(&self, w: &DevMat, ids: Option<u64>, x: u64, x_stride: usize, y: u64, y_stride: usize, res: Option<u64>, slots: usize) -> Result<()> {
        mv(&self.gpu, w, ids, x, x_stride, y, y_stride, res, slots)
    }

    #[allow(clippy::too_many_arguments)]
    fn glu(&self, w: &Glu, ids: Option<u64>, x: u64, x_stride: usize, h: u64, h_stride: usize, slots: usize) -> Result<()> {
        let (gm, um) = (&w.gate, &w.up);
        self.gpu.launch(
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
                Arg::Ptr(x),
                Arg::I64(x_stride as i64),
                Arg::Ptr(h),
                Arg::I64(h_stride as i64),
            ],
        )
    }

    fn delta(&self, w: &DeltaLayer) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        self.mv(&w.qkv, None, sc.xn.ptr, 0, sc.qkv.ptr, 0, None, 1)?;
        self.mv(&w.z, None, sc.xn.ptr, 0, sc.z.ptr, 0, None, 1)?;
        self.mv(&w.beta, None, sc.xn.ptr, 0, sc.beta.ptr, 0, None, 1)?;
        self.mv(&w.alpha, None, sc.xn.ptr, 0, sc.alpha.ptr, 0, None, 1)?;
        let cd = w.qkv.rows;
        g.launch("conv_step", (cd.div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(sc.qkv.ptr), Arg::Ptr(w.conv_state.ptr), Arg::Ptr(w.taps.ptr), Arg::Ptr(sc.conv.ptr), Arg::I32(cd as i32), Arg::I32(d.conv_kernel as i32)])?;
        g.launch(
            "delta_step",
            (d.hv as u32, 1),
            256,
            0,
            &[
                Arg::Ptr(sc.conv.ptr),
                Arg::Ptr(sc.z.ptr),
                Arg::Ptr(sc.beta.ptr),
                Arg::Ptr(sc.alpha.ptr),
                Arg::Ptr(w.dt_bias.ptr),
                Arg::Ptr(w.a.ptr),
                Arg::Ptr(w.s.ptr),
                Arg::Ptr(w.norm.ptr),
                Arg::Ptr(sc.delta_o.ptr),
                Arg::I32(d.hk as i32),
                Arg::I32(d.hv as i32),
                Arg::I32(d.sd as i32),
                Arg::I32(d.tiled as i32),
                Arg::F32(d.eps),
            ],
        )?;
        self.mv(&w.out, None, sc.delta_o.ptr, 0, sc.x.ptr, 0, Some(sc.x.ptr), 1)
    }

    fn attention(&self, w: &AttnLayer) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        self.mv(&w.q, None, sc.xn.ptr, 0, sc.qg.ptr, 0, None, 1)?;
        self.mv(&w.k, None, sc.xn.ptr, 0, sc.k.ptr, 0, None, 1)?;
        self.mv(&w.v, None, sc.xn.ptr, 0, sc.v.ptr, 0, None, 1)?;
        let block = d.hd.div_ceil(32) * 32;
        g.launch(
            "attn_heads",
            ((d.n_head + d.n_head_kv) as u32, 1),
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
        g.launch(
            "attn_split",
            (d.n_head as u32, d.n_split as u32),
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
        g.launch("attn_merge", (d.n_head as u32, 1), block as u32, 0, &[Arg::Ptr(sc.part_o.ptr), Arg::Ptr(sc.part_ml.ptr), Arg::Ptr(sc.qg.ptr), Arg::Ptr(sc.attn_o.ptr), Arg::I32(d.hd as i32), Arg::I32(d.n_split as i32)])?;
        self.mv(&w.o, None, sc.attn_o.ptr, 0, sc.x.ptr, 0, Some(sc.x.ptr), 1)
    }

    fn moe(&self, w: &MoeLayer) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let k = d.n_used;
        self.mv(&w.router, None, sc.xn.ptr, 0, sc.router.ptr, 0, None, 1)?;
        g.launch(
            "moe_route",
            (1, 1),
            256,
            (d.n_expert * 4) as u32,
            &[Arg::Ptr(sc.router.ptr), Arg::I32(d.n_expert as i32), Arg::I32(k as i32), Arg::I32(d.norm_w as i32), Arg::F32(d.w_scale), Arg::Ptr(sc.ids.ptr), Arg::Ptr(sc.weights.ptr)],
        )?;
        let eff = d.expert_ff;
        self.glu(&w.experts, Some(sc.ids.ptr), sc.xn.ptr, 0, sc.ffn_h.ptr, eff, k)?;
        self.mv(&w.experts.down, Some(sc.ids.ptr), sc.ffn_h.ptr, eff, sc.ys.ptr, d.hidden, None, k)?;
        let mut shared = 0u64;
        let mut sg = 0u64;
        if let Some(s) = &w.shared {
            // the routed experts' hidden in ffn_h is spent (their down product ran): reuse it
            self.glu(s, None, sc.xn.ptr, 0, sc.ffn_h.ptr, 0, 1)?;
            self.mv(&s.down, None, sc.ffn_h.ptr, 0, sc.sh_y.ptr, 0, None, 1)?;
            shared = sc.sh_y.ptr;
            if let Some(gate) = &w.shared_gate {
                self.mv(gate, None, sc.xn.ptr, 0, sc.sg.ptr, 0, None, 1)?;
                sg = sc.sg.ptr;
            }
        }
        g.launch("moe_combine", (d.hidden.div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(sc.x.ptr), Arg::Ptr(sc.ys.ptr), Arg::Ptr(sc.weights.ptr), Arg::I32(k as i32), Arg::I32(d.hidden as i32), Arg::Ptr(shared), Arg::Ptr(sg)])
    }
}

const MV_WARPS: usize = 4;

#[allow(clippy::too_many_arguments)]
fn mv(g: &Gpu, w: &DevMat, ids: Option<u64>, x: u64, x_stride: usize, y: u64, y_stride: usize, res: Option<u64>, slots: usize) -> Result<()> {
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
            Arg::Ptr(x),
            Arg::I64(x_stride as i64),
            Arg::Ptr(y),
            Arg::I64(y_stride as i64),
            Arg::Ptr(res.unwrap_or(0)),
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
        let data = self.file.tensor_data(&m.info);
        Ok(DevMat { buf: self.gpu.upload(data)?, ty, rows: m.rows, cols: m.cols, row_bytes: m.row_bytes() })
    }
}
