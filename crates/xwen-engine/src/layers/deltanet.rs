//! The delta rule (linear attention): Gated DeltaNet — the recurrent mixer of Qwen3.5/3.6 and
//! Qwen3-Next, one decay per head — and KDA — Kimi-Linear's, one decay per key channel
//! (`DeltaVariant`). One module as llama.cpp's `delta-net-base.cpp` serves both: the same
//! convolution, L2 norms, recurrence and gated output norm; only the projections, the gate's
//! shape and the output gate's function differ.
//! Ground truth: llama.cpp `src/models/qwen35.cpp::build_layer_attn_linear`, `kimi-linear.cpp`,
//! `delta-net-base.cpp` and ggml-cpu's fused `gated_delta_net` op (its `kda` branch).
//!
//! Per token, per V-head h (K-head h mod H_k where the GGUF's V order is tiled — qwen35 — and
//! h / (H_v/H_k) where it is grouped — qwen3next, `HeadPairing`):
//!   S ← S·exp(g);  d = (v − S k)·β;  S ← S + d kᵀ;  o = (S q)/√S_k
//! with S stored [S_v rows][S_k cols] (row j is "column j of S" in ggml's comment), fp32.
//! Decode runs that recurrence; prefill runs the equivalent chunked (WY) form over chunks of 64,
//! which turns the per-token outer products into small matrix products.

use crate::backend::{Buf, Cols, ConvSilu, DeltaGates, DeltaScan, OutGate, ScanState};
use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::profile::Op;
use crate::weights::{Loader, Mat};
use crate::error::Result;
use crate::state::recurrent::{DeltaState, PastState};

#[derive(Clone, Copy, Debug)]
pub struct DeltaDims {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    /// Head dim of keys/queries (S_k) and of values (S_v); equal in every shipped model.
    pub head_dim: usize,
    pub conv_kernel: usize,
    pub eps: f32,
    pub pairing: HeadPairing,
    pub variant: DeltaVariant,
    /// KDA's forget gate with a lower bound (Kimi K3, `kda.gate_lower_bound`): not a clamp but
    /// another activation, g = lb·sigmoid(−a·(f_b(f_a x) + dt)) with a = −exp(A_log), in place of
    /// a·softplus(…). None = softplus (Kimi-Linear).
    pub gate_lower_bound: Option<f32>,
}

/// Which delta rule a layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaVariant {
    /// Gated DeltaNet: g = a_h·softplus(α_h + dt_h), one decay per V-head; output gate silu(z).
    Gdn,
    /// Gated DeltaNet with a sigmoid output gate, sigmoid(z) in place of silu(z): qwen4exp
    /// (llama.cpp's `build_norm_gated` there hard-codes it).
    GdnSigmoid,
    /// Kimi Delta Attention: g = a_h·softplus(f_b(f_a x) + dt), one decay per key channel of
    /// each head (H_k = H_v); q, k and v convolved (and SiLU'd) as three streams; output gate
    /// sigmoid(g_b(g_a x)).
    Kda,
}

pub use crate::backend::HeadPairing;

impl DeltaDims {
    /// A zero state of these dims (`DeltaState::zeroed`).
    pub fn zero_state(&self) -> DeltaState {
        DeltaState::zeroed(self.conv_state_len(), self.state_len())
    }


    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_dim
    }
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }
    /// Width of the fused q|k|v stream the convolution runs over.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.head_dim * self.head_dim
    }
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }
    /// Gate values per (token, V-head): 1 (GDN) or S_k (KDA).
    pub fn gate_width(&self) -> usize {
        match self.variant {
            DeltaVariant::Gdn | DeltaVariant::GdnSigmoid => 1,
            DeltaVariant::Kda => self.head_dim,
        }
    }
    /// The row length ggml's SiLU runs over after the convolution: GDN convolves q|k|v as one
    /// tensor, KDA each stream alone (ggml's vector expf covers whole 8/16-lane chunks of a row,
    /// so the row length is part of the arithmetic).
    pub fn conv_silu_row(&self) -> usize {
        match self.variant {
            DeltaVariant::Gdn | DeltaVariant::GdnSigmoid => self.conv_dim(),
            DeltaVariant::Kda => self.value_dim(),
        }
    }
}

/// The input projections, as each architecture's converter lays them out. Whatever the layout,
/// `project` hands the layer the same streams: q|k|v [conv_dim], z [value_dim], β and α [H_v],
/// V heads in the file's order (`HeadPairing`).
#[allow(clippy::large_enum_variant)] // one per layer, loaded once: boxing buys nothing
pub enum DeltaProj {
    /// qwen35: `attn_qkv` [conv_dim × hidden], `attn_gate` (z) [value_dim × hidden],
    /// `ssm_beta` and `ssm_alpha` [H_v × hidden].
    Split { qkv: Mat, gate: Mat, beta: Mat, alpha: Mat },
    /// qwen3next: `attn_qkv`, `attn_gate`, and `ssm_ba` [2·H_v × hidden] = per K-head
    /// [β of its r V-heads | α of its r V-heads] (r = H_v / H_k).
    FusedBa { qkv: Mat, gate: Mat, ba: Mat },
    /// qwen3next as first converted: `ssm_in` [(2·key_dim + 2·value_dim) × hidden] = per K-head
    /// [q | k | v of its r V-heads | z of its r V-heads], and `ssm_ba`.
    Legacy { qkvz: Mat, ba: Mat },
    /// kimi-linear (KDA): `attn_q`, `attn_k`, `attn_v` [d_inner × hidden]; the forget gate's
    /// low-rank pair `ssm_f_a` [head_dim × hidden], `ssm_f_b` [d_inner × head_dim]; `ssm_beta`
    /// [H × hidden]; the output gate (`KdaGate`).
    Kda { q: Mat, k: Mat, v: Mat, f_a: Mat, f_b: Mat, beta: Mat, gate: KdaGate },
}

/// KDA's output gate projection, whose sigmoid multiplies the normed output.
pub enum KdaGate {
    /// Kimi-Linear: `ssm_g_a` [head_dim × hidden] then `ssm_g_b` [d_inner × head_dim].
    LowRank { a: Mat, b: Mat },
    /// Kimi K3: one full-rank `ssm_g` [d_inner × hidden].
    Full(Mat),
}

pub struct DeltaNetWeights {
    pub proj: DeltaProj,
    /// The convolution kernel tap-major, [kernel][conv_dim] (the file stores [conv_dim][kernel]):
    /// transposed once here so each tap is a contiguous row `conv_silu` vectorizes over.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>, // [H_v] (GDN) or [H·S_k] (KDA)
    pub a: Vec<f32>,     // [H_v], −exp(A_log) baked in by the converter
    pub norm: Vec<f32>,  // [head_dim]
    pub out: Mat,        // [hidden × value_dim]
}

impl DeltaNetWeights {
    /// qwen35's layout (`DeltaProj::Split`).
    pub fn load_split(ld: &Loader, il: usize, hidden: usize, d: &DeltaDims) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let proj = DeltaProj::Split {
            qkv: ld.mat(&p("attn_qkv.weight"), d.conv_dim(), hidden)?,
            gate: ld.mat(&p("attn_gate.weight"), d.value_dim(), hidden)?,
            beta: ld.mat(&p("ssm_beta.weight"), d.n_v_heads, hidden)?,
            alpha: ld.mat(&p("ssm_alpha.weight"), d.n_v_heads, hidden)?,
        };
        Self::load_with(ld, il, hidden, d, proj)
    }

    /// qwen3next's layouts: `attn_qkv` + `attn_gate` where the file has them (today's
    /// converter), else the legacy fused `ssm_in`; `ssm_ba` in both.
    pub fn load_fused(ld: &Loader, il: usize, hidden: usize, d: &DeltaDims) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let ba = ld.mat(&p("ssm_ba.weight"), 2 * d.n_v_heads, hidden)?;
        let proj = if ld.has(&p("attn_qkv.weight")) {
            DeltaProj::FusedBa {
                qkv: ld.mat(&p("attn_qkv.weight"), d.conv_dim(), hidden)?,
                gate: ld.mat(&p("attn_gate.weight"), d.value_dim(), hidden)?,
                ba,
            }
        } else {
            DeltaProj::Legacy { qkvz: ld.mat(&p("ssm_in.weight"), 2 * d.key_dim() + 2 * d.value_dim(), hidden)?, ba }
        };
        Self::load_with(ld, il, hidden, d, proj)
    }

    /// A KDA layer (`DeltaProj::Kda`, kimi-linear and kimi-k3): three convolutions
    /// (`ssm_conv1d_q/_k/_v`, [kernel, 1, d_inner], concatenated into one q|k|v stream), a
    /// per-channel dt bias, the output gate (low-rank pair or K3's full-rank `ssm_g`, whichever
    /// the file has), the output norm `ssm_norm` and projection `attn_output`. `ssm_a` is [1, H]
    /// (kimi-linear's padded shape) or [H] (K3).
    pub fn load_kda(ld: &Loader, il: usize, hidden: usize, d: &DeltaDims) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let (h, sd) = (d.n_v_heads, d.head_dim);
        let inner = h * sd;
        let proj = DeltaProj::Kda {
            q: ld.mat(&p("attn_q.weight"), inner, hidden)?,
            k: ld.mat(&p("attn_k.weight"), inner, hidden)?,
            v: ld.mat(&p("attn_v.weight"), inner, hidden)?,
            f_a: ld.mat(&p("ssm_f_a.weight"), sd, hidden)?,
            f_b: ld.mat(&p("ssm_f_b.weight"), inner, sd)?,
            beta: ld.mat(&p("ssm_beta.weight"), h, hidden)?,
            gate: if ld.has(&p("ssm_g.weight")) {
                KdaGate::Full(ld.mat(&p("ssm_g.weight"), inner, hidden)?)
            } else {
                KdaGate::LowRank { a: ld.mat(&p("ssm_g_a.weight"), sd, hidden)?, b: ld.mat(&p("ssm_g_b.weight"), inner, sd)? }
            },
        };
        let a_shape: &[u64] = if ld.dims(&p("ssm_a")).is_some_and(|d| d.len() == 1) { &[h as u64] } else { &[1, h as u64] };
        let mut kernel = Vec::with_capacity(3 * inner * d.conv_kernel);
        for part in ["q", "k", "v"] {
            kernel.extend(ld.f32_tensor(&p(&format!("ssm_conv1d_{part}.weight")), &[d.conv_kernel as u64, 1, inner as u64])?);
        }
        Ok(DeltaNetWeights {
            proj,
            conv: tap_major(&kernel, d.conv_kernel),
            dt_bias: ld.vec(&p("ssm_dt.bias"), inner)?,
            a: ld.f32_tensor(&p("ssm_a"), a_shape)?,
            norm: ld.vec(&p("ssm_norm.weight"), sd)?,
            out: ld.mat(&p("attn_output.weight"), hidden, inner)?,
        })
    }

    fn load_with(ld: &Loader, il: usize, hidden: usize, d: &DeltaDims, proj: DeltaProj) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.{s}");
        Ok(DeltaNetWeights {
            proj,
            conv: tap_major(&ld.f32_tensor(&p("ssm_conv1d.weight"), &[d.conv_kernel as u64, d.conv_dim() as u64])?, d.conv_kernel),
            dt_bias: ld.vec(&p("ssm_dt.bias"), d.n_v_heads)?,
            a: ld.vec(&p("ssm_a"), d.n_v_heads)?,
            norm: ld.vec(&p("ssm_norm.weight"), d.head_dim)?,
            out: ld.mat(&p("ssm_out.weight"), hidden, d.value_dim())?,
        })
    }
}

/// A [channel][tap] kernel as [tap][channel].
fn tap_major(kernel: &[f32], taps: usize) -> Vec<f32> {
    let channels = kernel.len() / taps;
    let mut t = vec![0.0f32; kernel.len()];
    for (c, kc) in kernel.chunks_exact(taps).enumerate() {
        for (j, &kv) in kc.iter().enumerate() {
            t[j * channels + c] = kv;
        }
    }
    t
}

/// Mixer output for the batch `rows` of normalized input `x` (rows.n × hidden) → rows.n ×
/// hidden; `states[i]` is span i's sequence's state, advanced over the span.
pub fn forward<'a>(ctx: &Ctx<'a>, w: &DeltaNetWeights, d: &DeltaDims, x: &[f32], rows: &Rows, states: &mut [&mut DeltaState], il: usize) -> Buf<'a> {
    assert_eq!(states.len(), rows.spans.len(), "one recurrent state per span");
    let n = rows.n;
    let cd = d.conv_dim();
    let (hk, hv, sd) = (d.n_k_heads, d.n_v_heads, d.head_dim);

    let sp = ctx.span(Op::DeltaProj);
    // qkv [n × conv_dim], z [n × value_dim], β and α [n × H_v]
    let Projected { qkv, z, beta: beta_in, alpha: alpha_in } = project(ctx, &w.proj, d, x, rows);
    // llama.cpp's names (qwen35.cpp build_layer_attn_linear)
    ctx.tap("linear_attn_qkv_mixed", Some(il), &qkv, cd);

    drop(sp);
    let sp = ctx.span(Op::DeltaConv);
    // Causal depthwise convolution over each sequence's fused stream, its state prepended, then SiLU.
    // the inputs before each span's tokens (its conv state), for the history of kept positions
    let conv_before: Vec<Option<Vec<f32>>> = states.iter().map(|st| (st.keep > 0).then(|| st.conv.clone())).collect();
    let conv_out: Vec<f32> = if rows.is_single() {
        conv_silu(ctx, &w.conv, d, &qkv, n, &mut states[0].conv)
    } else {
        let mut all = Vec::with_capacity(n * cd);
        for (s, st) in rows.spans.iter().zip(states.iter_mut()) {
            all.extend(conv_silu(ctx, &w.conv, d, &qkv[s.start * cd..(s.start + s.len) * cd], s.len, &mut st.conv));
        }
        all
    };

    ctx.tap("conv_output_silu", Some(il), &conv_out, cd);
    // Split into per-head q, k (L2-normalized) and v; β = sigmoid, g = a·softplus(α + dt).
    let mut q = ctx.zeros(n * hk * sd);
    let mut k = ctx.zeros(n * hk * sd);
    let mut v = ctx.zeros(n * hv * sd);
    ctx.backend.split_columns(&conv_out, n, &mut [&mut q, &mut k, &mut v]);
    ctx.backend.l2_norm_heads(&mut q, sd, d.eps);
    ctx.backend.l2_norm_heads(&mut k, sd, d.eps);
    // GDN: one g per (token, V-head); KDA: one per (token, head, key channel), the dt bias per
    // channel and a per head (ggml_add, softplus, then ggml_mul broadcasting a over channels)
    // (K3's lower-bound gate: ggml_add, ggml_mul by a, scale −1, sigmoid, scale lb)
    let (mut beta, mut g) = (beta_in, alpha_in);
    let gw = d.gate_width();
    ctx.backend.delta_gates(&DeltaGates { dt_bias: &w.dt_bias, a: &w.a, width: gw, lower_bound: d.gate_lower_bound }, &mut beta, &mut g);

    // the delta op's inputs, as llama.cpp names them (q and k L2-normed)
    ctx.tap("q_conv_predelta", Some(il), &q, sd);
    ctx.tap("k_conv_predelta", Some(il), &k, sd);
    ctx.tap("gate", Some(il), &g, hv * gw);
    ctx.tap("beta_sigmoid", Some(il), &beta, hv);
    drop(sp);
    let sp = ctx.span(Op::DeltaScan);
    // The delta rule over every span, keeping the state before each of a span's last `keep`
    // tokens (a speculative verify rolls back to any of them).
    let mut o = ctx.zeros(n * hv * sd);
    let kept: Vec<usize> = rows.spans.iter().zip(states.iter()).map(|(sp, st)| sp.len - st.keep.min(sp.len)).collect();
    // buffers the sequence's earlier kept states let go where it has them (no zeroing: the
    // scan writes all of each)
    let mut snaps: Vec<Vec<Vec<f32>>> = rows
        .spans
        .iter()
        .zip(&kept)
        .zip(states.iter_mut())
        .map(|((sp, &j0), st)| (j0..sp.len).map(|_| st.state_buffer()).collect())
        .collect();
    {
        let scan = DeltaScan {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            hk,
            hv,
            sd,
            pairing: d.pairing,
            channels: d.variant == DeltaVariant::Kda,
            rows,
            chunked: ctx.chunked_scan,
        };
        let mut scan_states: Vec<ScanState> = states
            .iter_mut()
            .zip(&kept)
            .zip(snaps.iter_mut())
            .map(|((st, &keep_from), snap)| ScanState { s: &mut st.s, keep_from, kept: snap })
            .collect();
        ctx.backend.delta_scan(&scan, &mut scan_states, &mut o);
    }
    // the kept positions' states, oldest first, at most `keep` of them
    for (((sp, st), (j0, snap)), before) in rows.spans.iter().zip(states.iter_mut()).zip(kept.iter().zip(snaps)).zip(conv_before) {
        let Some(before) = before else { continue };
        let hist = d.conv_kernel - 1;
        let window: Vec<f32> = before.iter().chain(&qkv[sp.start * cd..(sp.start + sp.len) * cd]).copied().collect();
        let (stale, kept_before): (Vec<PastState>, Vec<PastState>) = std::mem::take(&mut st.past).into_iter().partition(|p| p.pos >= sp.pos0);
        st.past = kept_before.into();
        for p in stale {
            st.recycle(p.s);
        }
        for (j, s_before) in (*j0..sp.len).zip(snap) {
            st.past.push_back(PastState { pos: sp.pos0 + j, conv: window[j * cd..(j + hist) * cd].to_vec(), s: s_before });
        }
        while st.past.len() > st.keep {
            if let Some(p) = st.past.pop_front() {
                st.recycle(p.s);
            }
        }
    }

    ctx.tap("attn_output", Some(il), &o, sd);
    drop(sp);
    let _sp = ctx.span(Op::DeltaOut);
    // Gated RMSNorm per head: norm(o)·w · silu(z) (KDA: sigmoid(z)), then the output projection.
    let mut z = z;
    let gate = match d.variant {
        DeltaVariant::Gdn => OutGate::Silu,
        DeltaVariant::Kda | DeltaVariant::GdnSigmoid => OutGate::Sigmoid,
    };
    ctx.backend.gated_rms_norm(&mut o, &mut z, &w.norm, d.eps, gate);
    ctx.tap("final_output", Some(il), &o, hv * sd);
    ctx.mm_rows1(&w.out, &o, rows)
}

/// The input projections of a batch in the layer's canonical streams.
struct Projected<'a> {
    qkv: Buf<'a>,
    z: Buf<'a>,
    beta: Buf<'a>,
    alpha: Buf<'a>,
}

/// Runs the layout's matrices in one `mm_rows` (one weight pass for all of them, each output
/// element the dot product it is in llama.cpp's graph: a fused matrix's rows are the split
/// matrices' rows) and unpacks the fused ones.
fn project<'a>(ctx: &Ctx<'a>, proj: &DeltaProj, d: &DeltaDims, x: &[f32], rows: &Rows) -> Projected<'a> {
    let n = rows.n;
    let (hk, hv, sd) = (d.n_k_heads, d.n_v_heads, d.head_dim);
    let r = hv / hk;
    // β and α of V-head kh·r + i sit at kh·2r + i and kh·2r + r + i of a token's ssm_ba row
    let split_ba = |ba: &[f32]| {
        let (mut beta, mut alpha) = (ctx.zeros(n * hv), ctx.zeros(n * hv));
        let cols: Vec<Cols> = (0..hk)
            .flat_map(|kh| [Cols { from: kh * 2 * r, out: 0, to: kh * r, len: r }, Cols { from: kh * 2 * r + r, out: 1, to: kh * r, len: r }])
            .collect();
        ctx.backend.gather_columns(ba, n, &cols, &mut [&mut beta, &mut alpha]);
        (beta, alpha)
    };
    match proj {
        DeltaProj::Split { qkv, gate, beta, alpha } => {
            let mut p = ctx.mm_rows(&[qkv, gate, beta, alpha], x, rows).into_iter();
            let mut next = || p.next().expect("one product per matrix");
            Projected { qkv: next(), z: next(), beta: next(), alpha: next() }
        }
        DeltaProj::FusedBa { qkv, gate, ba } => {
            let mut p = ctx.mm_rows(&[qkv, gate, ba], x, rows).into_iter();
            let mut next = || p.next().expect("one product per matrix");
            let (qkv, z, ba) = (next(), next(), next());
            let (beta, alpha) = split_ba(&ba);
            Projected { qkv, z, beta, alpha }
        }
        DeltaProj::Legacy { qkvz, ba } => {
            let mut p = ctx.mm_rows(&[qkvz, ba], x, rows).into_iter();
            let mut next = || p.next().expect("one product per matrix");
            let (mixed, ba) = (next(), next());
            let (cd, vd, kd) = (d.conv_dim(), d.value_dim(), d.key_dim());
            // per K-head a group [q | k | v of its r V-heads | z of its r V-heads]
            let group = 2 * sd + 2 * r * sd;
            let (mut qkv, mut z) = (ctx.zeros(n * cd), ctx.zeros(n * vd));
            let cols: Vec<Cols> = (0..hk)
                .flat_map(|kh| {
                    let g = kh * group;
                    [
                        Cols { from: g, out: 0, to: kh * sd, len: sd },
                        Cols { from: g + sd, out: 0, to: kd + kh * sd, len: sd },
                        Cols { from: g + 2 * sd, out: 0, to: 2 * kd + kh * r * sd, len: r * sd },
                        Cols { from: g + 2 * sd + r * sd, out: 1, to: kh * r * sd, len: r * sd },
                    ]
                })
                .collect();
            ctx.backend.gather_columns(&mixed, n, &cols, &mut [&mut qkv, &mut z]);
            let (beta, alpha) = split_ba(&ba);
            Projected { qkv, z, beta, alpha }
        }
        DeltaProj::Kda { q, k, v, f_a, f_b, beta, gate } => {
            // the low-rank gates' first halves (or K3's full-rank gate) with q, k, v and β (one
            // weight pass), then their second halves on those outputs
            let first = match gate {
                KdaGate::LowRank { a, .. } => a,
                KdaGate::Full(g) => g,
            };
            let mut p = ctx.mm_rows(&[q, k, v, f_a, beta, first], x, rows).into_iter();
            let mut next = || p.next().expect("one product per matrix");
            let (q, k, v, fa, beta, g1) = (next(), next(), next(), next(), next(), next());
            let alpha = ctx.mm_rows1(f_b, &fa, rows);
            let z = match gate {
                KdaGate::LowRank { b, .. } => ctx.mm_rows1(b, &g1, rows),
                KdaGate::Full(_) => g1,
            };
            let inner = d.value_dim();
            // one q|k|v stream per token, as the convolution reads it
            let mut qkv = ctx.zeros(n * 3 * inner);
            for (i, part) in [&q, &k, &v].into_iter().enumerate() {
                ctx.backend.gather_columns(part, n, &[Cols { from: 0, out: 0, to: i * inner, len: inner }], &mut [&mut qkv]);
            }
            Projected { qkv, z, beta, alpha }
        }
    }
}

/// ggml_ssm_conv over [state ‖ new inputs] with the tap-major kernel `taps`, then SiLU; updates
/// the conv state. The conv output is [conv_dim, n] in ggml, so ggml_silu's rows are one
/// token's conv_dim values (KDA's: each stream's).
fn conv_silu(ctx: &Ctx, taps: &[f32], d: &DeltaDims, qkv: &[f32], n: usize, state: &mut [f32]) -> Vec<f32> {
    let cd = d.conv_dim();
    let hist = d.conv_kernel - 1;
    // window rows: hist state rows then n input rows.
    let mut window = Vec::with_capacity((hist + n) * cd);
    window.extend_from_slice(state);
    window.extend_from_slice(qkv);
    let mut out = vec![0.0f32; n * cd];
    ctx.backend.conv_silu(&ConvSilu { taps, kernel: d.conv_kernel, silu_row: d.conv_silu_row() }, &window, &mut out);
    state.copy_from_slice(&window[n * cd..(n + hist) * cd]);
    out
}
