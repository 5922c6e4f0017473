//! The op-level backend seam. The block files (`layers/`) state the math of a layer and hand
//! its heavy ops to a [`Backend`]: the matrix products (dense and quantized, one row or many,
//! several matrices over one input), attention over each sequence's span, the delta-rule scan
//! (a scalar gate as in Gated DeltaNet, a per-channel gate as in KDA), a routed expert's whole
//! FFN, and the named per-row passes around them (the causal convolution and SiLU, column
//! splits, the heads' norms and rope, the output gates), and the element-wise steps of the
//! residual stream and the FFNs (RMSNorm of rows, the residual add, the gated activations, the
//! delta rule's gate activations, a MoE's weighted sum and its shared expert's gate). How an op
//! is split into tasks, on which threads, with which kernel, is the backend's business; no pool,
//! thread or raw pointer appears in a layer or model file, and no closure crosses the seam.
//!
//! [`cpu::Cpu`] holds the bodies the engine has always run, bit for bit (llama.cpp's CPU float
//! orders). The activations a forward's ops produce — the products' outputs, q / k / v, the
//! gates, the norms' outputs — are buffers of the backend's arena ([`Scratch`], `Ctx::zeros`),
//! reused from op to op; the ops still read and write them as host slices. A device backend
//! (a later issue) implements this trait over device-resident weights and state — the next
//! step there is tensor handles into its arena in place of the slices (docs/decisions.md
//! "The backend seam").

pub mod cpu;
pub mod moe_route;
pub mod scratch;

use crate::batch::Rows;
use crate::state::KvCache;
pub use moe_route::{Route, RouteRule};
pub use scratch::{Buf, Scratch};
use xwen_kernels::QMatrix;

/// One matrix × vector product of a batch: y = W·x, for one token or several single-token
/// rows (x: n_tok × cols, y: n_tok × rows), each row in the one-token order.
pub struct MvJob<'b> {
    pub w: QMatrix<'b>,
    pub x: &'b [f32],
    pub y: &'b mut [f32],
}

impl MvJob<'_> {
    pub fn n_tok(&self) -> usize {
        self.x.len() / self.w.cols.max(1)
    }
}

/// Attention of a batch: per span, every query head of every row against the span's own KV
/// cache (causal: row i of a span at position pos0 + i sees positions 0..=pos0 + i).
/// Query head h of row t is `q[(t·n_head + h)·k_dim..][..k_dim]`; its output goes to
/// `out[(t·n_head + h)·v_dim..][..v_dim]`. Query head h reads KV head h / (n_head / n_head_kv),
/// whose K sits at `kvh·k_dim` of a K row `k_row` wide and V at `kvh·v_dim` of a V row `v_row`
/// wide (gated attention: rows of n_head_kv heads; MLA: one latent head, V the first v_dim of
/// the K row's latent).
#[derive(Clone, Copy, Debug)]
pub struct AttnHeads {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub k_row: usize,
    pub v_row: usize,
    pub scale: f32,
}

/// How attention runs: llama.cpp's flash-attention path or its plain one, and the cache types.
#[derive(Clone, Copy, Debug)]
pub struct AttnMode {
    pub flash: bool,
    /// Threads llama.cpp would split a decode row's KV over (the split-KV path).
    pub threads: usize,
    /// The context size, which caps llama.cpp's KV view (`flash_attn::n_kv`).
    pub n_ctx: usize,
}

/// Which K-head (query and key) a V-head pairs with when H_v > H_k.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadPairing {
    /// V-head h reads K-head h mod H_k: qwen35, whose converter reorders the V heads into
    /// ggml's broadcast (tiled) order.
    Tiled,
    /// V-head h reads K-head h / (H_v / H_k): qwen3next, which keeps the checkpoint's grouped
    /// order and repeat-interleaves q and k (`ggml_repeat_4d` over a new axis in qwen3next.cpp).
    Grouped,
}

impl HeadPairing {
    #[inline]
    pub fn k_head(self, v_head: usize, n_k: usize, n_v: usize) -> usize {
        match self {
            HeadPairing::Tiled => v_head % n_k,
            HeadPairing::Grouped => v_head / (n_v / n_k),
        }
    }
}

/// The delta rule over a batch: per span and V-head, S ← S·decay + β(v − S·k)kᵀ, o = S·q·scale
/// token by token. Rows are laid out per token: q and k `hk` heads of `sd`, v and the output
/// `hv` heads of `sd`, g one gate per (token, V-head) or, with `channels` (KDA), `sd` gates per
/// (token, V-head), beta one per (token, V-head). Gates are log-decays (the step takes exp).
pub struct DeltaScan<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub hk: usize,
    pub hv: usize,
    pub sd: usize,
    pub pairing: HeadPairing,
    pub channels: bool,
    pub rows: &'a Rows,
    /// Run spans of a prefill in the chunked (WY) form where allowed (`--prefill-scan chunked`);
    /// the recurrence otherwise, which is llama.cpp's CPU op bit for bit.
    pub chunked: bool,
}

/// What a delta scan advances and keeps, per span: its sequence's state matrices (hv × sd × sd),
/// the first token whose incoming state is kept, and one buffer per kept token for the state
/// before it (hv × sd × sd each).
pub struct ScanState<'a> {
    pub s: &'a mut [f32],
    pub keep_from: usize,
    pub kept: &'a mut [Vec<f32>],
}

/// One routed expert's FFN over the `tokens` rows of `x` (each `width` wide):
/// down(act(gate·x, up·x)), every token with MUL_MAT_ID's row quantizer; the result is
/// tokens × down.rows, token-major.
pub struct ExpertFfn<'a> {
    pub gate: QMatrix<'a>,
    pub up: QMatrix<'a>,
    pub down: QMatrix<'a>,
    pub x: &'a [f32],
    pub width: usize,
    pub tokens: &'a [usize],
}

/// The gated activation of an FFN or expert, between its gate/up and down products:
/// act(g, u) element-wise over a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    /// silu(g)·u (`ggml_swiglu_split`).
    SwiGlu,
    /// Kimi K3's situ (llama.cpp `kimi_k3_situ`, `LLM_FFN_SITU`):
    /// β·tanh(g/β)·sigmoid(g) · λ·tanh(u/λ), the up branch left as is when λ ≤ 0.
    Situ { beta: f32, linear_beta: f32 },
}

/// The delta rule's gate activations (the graph's ops between the projections and
/// `gated_delta_net`): β ← sigmoid(β) per (token, V-head); per (token, V-head h, gate channel c)
/// g ← softplus(g + dt[h·width + c])·a[h], or with a lower bound lb (Kimi K3)
/// sigmoid(−((g + dt)·a[h]))·lb.
pub struct DeltaGates<'a> {
    /// [heads × width]
    pub dt_bias: &'a [f32],
    /// [heads]: −exp(A_log)
    pub a: &'a [f32],
    /// Gate values per (token, head): 1 (Gated DeltaNet) or S_k (KDA).
    pub width: usize,
    pub lower_bound: Option<f32>,
}

/// A block of query rows at positions `pos0`.. attending over `pos0 + rows` key rows
/// (`Backend::attend_block`): row t sees key j unless `causal` and j > pos0 + t, or a sliding
/// `window` puts j at or past `window` positions before it.
#[derive(Clone, Copy, Debug)]
pub struct BlockAttn {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub pos0: usize,
    pub scale: f32,
    pub causal: bool,
    pub window: Option<usize>,
}

impl BlockAttn {
    /// Whether the query row at position `qp` sees the key at position `j`.
    pub fn visible(&self, qp: usize, j: usize) -> bool {
        !(self.causal && j > qp) && self.window.is_none_or(|w| qp < j || qp - j < w)
    }
}

/// The ops a forward pass runs on. Every op computes the bits its CPU body does (`cpu::Cpu`),
/// whatever the backend: the parity and batch-invariance suites hold any implementation to it.
pub trait Backend: Send + Sync {
    /// Threads the backend computes with (llama.cpp's split-KV attention depends on it).
    fn threads(&self) -> usize;

    /// y = W·x for one row.
    fn matvec(&self, w: QMatrix, x: &[f32], y: &mut [f32]);
    /// y = x·Wᵀ for n rows, activations quantized once (llama.cpp's mul_mat of a ubatch).
    fn matmul(&self, w: QMatrix, x: &[f32], n: usize, y: &mut [f32]);
    /// The activation arena the forward's buffers come from (`Ctx::zeros`, the products'
    /// outputs).
    fn scratch(&self) -> &Scratch;

    /// Products of several matrices with the same input rows of a batch, batch-invariantly:
    /// decode rows share one pass over each matrix, each row in the one-token order; a longer
    /// span takes the product of its own row count, as if it ran alone. The outputs are
    /// buffers of the backend's arena.
    fn mm_rows(&self, ws: &[QMatrix], x: &[f32], rows: &Rows) -> Vec<Buf<'_>>;
    /// Several independent matrix × vector products (one-token order) in one job.
    fn mv_batch(&self, jobs: &mut [MvJob]);

    /// Attention of every span's rows against its KV cache (`caches[i]` holds span i's
    /// positions, this span's included), into `out`.
    fn attend(&self, q: &[f32], caches: &[&KvCache], rows: &Rows, heads: &AttnHeads, mode: &AttnMode, out: &mut [f32]);
    /// Plain (non-flash) attention of a block of query rows over f32 key and value rows held
    /// outside any `KvCache` (a DFlash block: the drafter's cache rows, then the block's), each
    /// row seeing the keys `blk` admits, in ggml's non-flash order; into `out` ([rows][heads ×
    /// head_dim]).
    fn attend_block(&self, q: &[f32], k: &[f32], v: &[f32], blk: &BlockAttn, out: &mut [f32]);

    /// The delta rule over every span (`states[i]` span i's), outputs into `o` (rows × hv × sd).
    fn delta_scan(&self, scan: &DeltaScan, states: &mut [ScanState], o: &mut [f32]);

    /// Routed experts' FFNs, each job's result into `ys[i]` (a buffer of the arena); `act` is
    /// the gated activation.
    fn expert_ffns<'s>(&'s self, jobs: &[ExpertFfn], act: Act, ff: usize, ys: &mut [Buf<'s>]);

    /// The causal depthwise convolution of one sequence's span, then SiLU (ggml_ssm_conv,
    /// ggml_silu): `window` is the span's conv state (kernel − 1 rows) then its n input rows,
    /// each `conv.taps.len() / conv.kernel` channels wide; `out` takes the n output rows.
    fn conv_silu(&self, conv: &ConvSilu, window: &[f32], out: &mut [f32]);
    /// Each of the `n` rows of `src` cut into consecutive column ranges, range i into the same
    /// row of `outs[i]` (`outs[i].len() / n` wide) — a view made contiguous.
    fn split_columns(&self, src: &[f32], n: usize, outs: &mut [&mut [f32]]);
    /// Runs of columns of each of the `n` rows of `src` copied into the same row of an output
    /// (`outs[c.out]`, `outs[i].len() / n` wide): the unpacking of a fused projection's
    /// interleaved heads, or a concatenation (a call per source).
    fn gather_columns(&self, src: &[f32], n: usize, cols: &[Cols], outs: &mut [&mut [f32]]);
    /// Gated DeltaNet's L2 norm (llama.cpp's `build_gdn_l2_norm`) of every `head`-wide piece of x.
    fn l2_norm_heads(&self, x: &mut [f32], head: usize, eps: f32);
    /// The delta rule's gated output norm, per `w.len()`-wide head: o ← rms_norm(o)·w ⊙ gate(z)
    /// (z is the gate's input, left holding its values).
    fn gated_rms_norm(&self, o: &mut [f32], z: &mut [f32], w: &[f32], eps: f32, gate: OutGate);
    /// For each (x, w) of `heads` (attention's q and k: `positions.len()` rows of heads `w.len()`
    /// wide): row t's heads RMS-normed by w, then rotated at `positions[t]`.
    fn norm_rope_heads(&self, heads: &mut [(&mut [f32], &[f32])], eps: f32, rope: &Rope, positions: &[usize]);
    /// x ← x ⊙ sigmoid(g), element-wise (an attention output's gate).
    fn mul_sigmoid(&self, x: &mut [f32], g: &[f32]);

    /// RMSNorm of every `w.len()`-wide row of x, times w, into y (ggml_rms_norm, ggml_mul).
    fn rms_norm(&self, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]);
    /// RMSNorm times w in place, of the first `w.len()` values of every `stride`-wide row of x
    /// (MLA's latent beside its rope part; a whole row where stride = w.len()).
    fn rms_norm_inplace(&self, x: &mut [f32], stride: usize, w: &[f32], eps: f32);
    /// x ← x + y, element-wise (the residual adds).
    fn add(&self, x: &mut [f32], y: &[f32]);
    /// y ← act(g, u) over consecutive rows of `row` values (one per token; SwiGLU's vector expf
    /// runs per row, so the row length is part of the arithmetic).
    fn glu(&self, act: Act, g: &[f32], u: &[f32], row: usize, y: &mut [f32]);
    /// The delta rule's gates in place: β (one per (token, V-head)) and g (`gates.width` per
    /// (token, V-head)).
    fn delta_gates(&self, gates: &DeltaGates, beta: &mut [f32], g: &mut [f32]);
    /// A MoE's weighted sum: each `out` row (`out.len() / rows` wide, rows = parts.len() / k)
    /// ← Σ over its k selection slots, in slot order, of weights[r·k + s]·parts[r·k + s], each
    /// product rounded before the add (ggml_mul, then ggml_add from slot 0 on).
    fn weighted_sum(&self, parts: &[&[f32]], weights: &[f32], k: usize, out: &mut [f32]);
    /// out ← out + sigmoid(gate·x)·y per row (a MoE's shared expert: x its input, y its output,
    /// rows as wide as `gate`); out ← out + y where the model has no gate.
    fn add_gated(&self, out: &mut [f32], y: &[f32], x: &[f32], gate: Option<&[f32]>);

    /// x ← H x / √n on every block of `n` (a power of two) values: the Walsh–Hadamard
    /// rotation llama.cpp applies to q, k and v around a quantized KV cache.
    fn hadamard(&self, x: &mut [f32], n: usize);
    /// Kimi K3's cross-layer residual mix (layers/attn_res.rs states it) of every row of x
    /// (as wide as `score`) with the same rows of the banked checkpoints, into `out`.
    fn residual_mix(&self, bank: &[&[f32]], x: &[f32], score: &[f32], eps: f32, out: &mut [f32]);

    /// x ← x·s element-wise (`ggml_scale`).
    fn scale(&self, x: &mut [f32], s: f32);
    /// SiLU of every `row`-wide row of x in place (`ggml_silu`: its vector expf covers whole
    /// lane chunks of a row, so the row length is part of the arithmetic).
    fn silu_rows(&self, x: &mut [f32], row: usize);
    /// x ← sigmoid(x) element-wise (`ggml_sigmoid`, libm's expf).
    fn sigmoid(&self, x: &mut [f32]);
    /// RMSNorm of every `n`-wide row of x times its stream's weight: row r takes the r mod hc-th
    /// `n` values of w (hc = w.len() / n): the grouped norm of an hc-wide residual.
    fn rms_norm_streams(&self, x: &[f32], w: &[f32], n: usize, eps: f32, y: &mut [f32]);
    /// A hyper-connection mixer's collapse of hc streams: per token and column,
    /// scale · Σ_s xn_s·sigmoid(gate_s) (`ggml_dsv4_hc_pre_gated`); xn and gate are
    /// [tokens × hc × n], out [tokens × n].
    fn hc_pre(&self, xn: &[f32], gate: &[f32], hc: usize, n: usize, scale: f32, out: &mut [f32]);
    /// A hyper-connection's combine: every stream s of token t adds x_t·w[t·hc + s]
    /// (`ggml_dsv4_hc_post` with the identity comb); res [tokens × hc × n], x [tokens × n].
    fn hc_post(&self, res: &mut [f32], x: &[f32], w: &[f32], hc: usize);
    /// PLE's per-(token, stream) gate from the `n`-wide rows of key and query:
    /// sigmoid(sgn(s)·√max(|s|, 1e-6)) with s = (key·query)/√n.
    fn ple_gate(&self, key: &[f32], query: &[f32], n: usize, gate: &mut [f32]);
    /// PLE's depthwise causal conv of `kernel` taps dilated by `dil` over `window` (the
    /// (kernel − 1)·dil history rows, then the new rows, `c` channels each); `taps` is
    /// [channel][kernel]; `out` takes the new rows.
    fn dilated_conv(&self, window: &[f32], taps: &[f32], kernel: usize, dil: usize, c: usize, out: &mut [f32]);
    /// `attend` (flash attention or the plain path with an f32 cache, as `mode` says) where batch
    /// row t sees only the cached positions p with `sel[t][p]` (within its causal range): sparse
    /// attention's selection mask (QSA) added to the causal one.
    fn attend_selected(&self, q: &[f32], caches: &[&KvCache], rows: &Rows, heads: &AttnHeads, mode: &AttnMode, sel: &[Vec<bool>], out: &mut [f32]);

    /// A MoE router's top-k: each `rule.n_expert`-wide row of `logits` (one per token) to its
    /// token's experts and weights (`RouteRule::apply`).
    fn route(&self, logits: &[f32], rule: &RouteRule) -> Vec<Route>;
}

/// A run of `len` columns from column `from` of a source row to column `to` of the same row of
/// output `out` ([`Backend::gather_columns`]).
#[derive(Clone, Copy, Debug)]
pub struct Cols {
    pub from: usize,
    pub out: usize,
    pub to: usize,
    pub len: usize,
}

/// A causal depthwise convolution followed by SiLU.
pub struct ConvSilu<'a> {
    /// The kernel tap-major, [kernel][channels]: each tap a contiguous row.
    pub taps: &'a [f32],
    pub kernel: usize,
    /// The row length SiLU runs over (a divisor of the channels): ggml's vector expf covers
    /// whole 8/16-lane chunks of a row, so the row length is part of the arithmetic.
    pub silu_row: usize,
}

/// The function of a gated output norm's gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutGate {
    /// SiLU over each head's row (Gated DeltaNet).
    Silu,
    /// Sigmoid, element by element (KDA).
    Sigmoid,
}

/// Rotary position embedding of a head: NeoX pairs (i, i + n_rot/2) over its first `n_rot`
/// dims at angles pos·base^(−2i/n_rot); `still` marks the pairs interleaved M-RoPE leaves
/// unrotated for text (`ops::imrope_text_still`).
pub struct Rope<'a> {
    pub n_rot: usize,
    pub base: f32,
    pub still: Option<&'a [bool]>,
}
