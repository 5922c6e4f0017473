//! A pass of the model as kernel launches: what the decode graph captures at one token and
//! a prefill pass enqueues at up to `ubatch`, layer by layer (models/hybrid.rs's order), and
//! which kernel each product takes (row by row on q8 activations, cuBLAS, tensor cores,
//! grouped experts).

use super::*;

/// What a pass feeds: a prompt pass's `n` tokens (n ≥ 2) of one sequence; several sequences'
/// prompt spans back to back (`Spans`: `n` rows, the spans' lengths longest first, each ≥ 2;
/// `CudaModel::spans_pass`); a decode batch's `n` rows, each the next token of its own
/// sequence; or a verify's `n` rows, consecutive tokens of one sequence each computed as a
/// decode row (`CudaModel::verify_pass`; `hist`: the states before each row kept for a
/// rollback). The tokens, positions and state pointers of all but a prompt pass are in the
/// batch table. A decode row is computed the same way whatever the batch around it: the batch
/// is a grid dimension of each kernel; a verify's recurrent steps run token after token inside
/// their kernels, in the decode step's arithmetic; a span's rows are computed as its own
/// prompt pass computes them (`Layout::Spans`).
#[derive(Clone, Copy)]
pub(super) enum Pass<'a> {
    Prompt { n: usize, seq: &'a DevSeq },
    Spans { n: usize, lens: &'a [usize] },
    Rows { n: usize },
    Verify { n: usize, hist: bool },
}

impl Pass<'_> {
    fn n(&self) -> usize {
        match *self {
            Pass::Prompt { n, .. } | Pass::Spans { n, .. } | Pass::Rows { n } | Pass::Verify { n, .. } => n,
        }
    }

    /// Whether each row is computed as a decode row (the row products, on q8 inputs).
    pub(super) fn rows(&self) -> bool {
        !matches!(self, Pass::Prompt { .. } | Pass::Spans { .. })
    }
}

/// How a pass's rows take their products: each row alone, as a decode row (`Rows`); or as
/// prompt spans back to back, their lengths longest first (`Spans`; a prompt pass is one span).
/// A product picks its kernel by a span's length (`prompt_kernel`), so a span's rows get the
/// bits its own pass gives them whatever spans share the pass: spans that pick the same
/// row-by-row kernel (`mm`, `mm_tc`: each output its own sum) share its launch; cuBLAS, whose
/// algorithm follows the shape, takes a GEMM a span.
#[derive(Clone, Copy)]
pub(super) enum Layout<'a> {
    Rows,
    Spans(&'a [usize]),
}

impl Layout<'_> {
    pub(super) fn rows(&self) -> bool {
        matches!(self, Layout::Rows)
    }

    /// Spans of the pass (1 for decode rows: their kernels take the batch as a grid dimension).
    fn spans(&self) -> usize {
        match self {
            Layout::Rows => 1,
            Layout::Spans(lens) => lens.len(),
        }
    }
}

/// The kernel of a prompt product, by its span's length (`CudaModel::prompt_kernel`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum PromptKernel {
    Blas,
    TensorCores,
    Rows8,
}

/// A layer's state as its kernels take it: a prompt pass's sequence's pointers (a: conv or K,
/// b: S or V), or the batch table's for the layer (two pointers a row) and the rows'
/// positions; for a verify (`one_seq`: every row the same sequence, in order) the kept states'
/// pointers too (hist, 0: none kept); for a pass of several spans, the spans table's (first
/// row, tokens) a span (seg) and each row's place in its span (row_off) (0: none).
#[derive(Clone, Copy)]
pub(super) struct LayerPtrs {
    a: u64,
    b: u64,
    tab: u64,
    pos: u64,
    hist: u64,
    one_seq: bool,
    seg: u64,
    row_off: u64,
}

impl LayerPtrs {
    /// The state of consecutive rows of one sequence (a verify's), the rows' table at `tab`
    /// (two pointers a row) and their positions at `pos`, no kept states.
    pub(super) fn one_sequence(tab: u64, pos: u64) -> LayerPtrs {
        LayerPtrs { a: 0, b: 0, tab, pos, hist: 0, one_seq: true, seg: 0, row_off: 0 }
    }
}

/// Where a decode batch or verify of `b` rows keeps its positions, layer `il`'s state pointers
/// (two a row) and a verify's kept states (two a row: the states after row t, before row t + 1)
/// in the batch table, after its b tokens: (positions, state pointers, kept states).
pub(super) fn rows_table_at(b: usize, il: usize, layers: usize) -> (usize, usize, usize) {
    (4 * b, 8 * b + 16 * b * il, 8 * b + 16 * b * layers + 16 * b * il)
}

impl CudaModel {
    /// Enqueues a pass (what a decode step's graph captures): the logits of a prompt pass's
    /// last row, or of every row of a decode batch, and their argmax.
    pub(super) fn record(&self, p: Pass<'_>) -> Result<()> {
        let g = &self.gpu;
        let d = &self.d;
        let sc = &self.sc;
        let h = d.hidden;
        let (n, rows) = (p.n(), p.rows());
        let one = [n];
        let lay = match p {
            Pass::Prompt { .. } => Layout::Spans(&one),
            Pass::Spans { lens, .. } => Layout::Spans(lens),
            Pass::Rows { .. } | Pass::Verify { .. } => Layout::Rows,
        };
        let ids = if matches!(p, Pass::Prompt { .. }) { sc.step.at(4) } else { sc.rows.ptr };
        g.launch(
            "embed",
            (h.div_ceil(256) as u32, n as u32),
            256,
            0,
            &[
                Arg::Ptr(self.tok_embd.ptr),
                Arg::I32(self.tok_embd.ty),
                Arg::I32(h as i32),
                Arg::I64(self.tok_embd.row_bytes as i64),
                Arg::Ptr(ids),
                Arg::Ptr(sc.x.ptr),
            ],
        )?;
        // a norm the stage before it applied in its last launch (-DFUSE_NORM=1): its output
        let mut normed: Option<In> = None;
        for (il, l) in self.layers.iter().enumerate() {
            let kinds = &l.kinds;
            let st = self.layer_ptrs(p, il)?;
            let xn = match normed.take() {
                Some(xn) => xn,
                None => self.rms_norm(sc.x.ptr, l.attn_norm.ptr, n, rows, kinds.mix_in)?,
            };
            let post = self.fusable_norm(l.post_norm.ptr, kinds.ffn_in, rows);
            let fused = match &l.mixer {
                DevMixer::Delta(w) => self.delta(w, st, xn, kinds.mix_out, n, lay, post)?,
                DevMixer::Attn(w) => self.attention(w, st, xn, kinds.mix_out, n, lay, post)?,
            };
            let moe_rows = matches!(l.ffn, DevFfn::Moe(_)) && !self.grouped_experts(n, rows);
            let xn = match fused {
                Some(xn) => xn,
                None => self.rms_norm(sc.x.ptr, l.post_norm.ptr, n, rows || moe_rows, kinds.ffn_in)?,
            };
            // the next layer's input norm, or the output norm of a pass whose every row has logits
            let next = match self.layers.get(il + 1) {
                Some(nl) => self.fusable_norm(nl.attn_norm.ptr, nl.kinds.mix_in, rows),
                None => self.fusable_norm(self.output_norm.ptr, self.head_kinds, rows),
            };
            normed = match &l.ffn {
                DevFfn::Dense(w) => {
                    self.glu(w, xn, sc.ffn_h.ptr, n, lay)?;
                    let hin = self.input(sc.ffn_h.ptr, w.down.cols, n, rows, kinds.ffn_mid)?;
                    self.proj_residual(&w.down, hin, n, lay, next)?
                }
                DevFfn::Moe(w) => self.moe(il, w, xn, kinds, n, lay, next)?,
            };
        }
        // a prompt pass's head reads its last token only; a pass of spans', each span's last
        // row; a decode batch's, every row
        let heads = match p {
            Pass::Rows { .. } | Pass::Verify { .. } => {
                let xn = match normed.take() {
                    Some(xn) => xn,
                    None => self.rms_norm(sc.x.ptr, self.output_norm.ptr, n, true, self.head_kinds)?,
                };
                self.proj(&self.output, xn, sc.logits.ptr, None, n, Layout::Rows)?;
                n
            }
            Pass::Spans { lens, .. } => {
                self.span_heads(lens.len())?;
                lens.len()
            }
            Pass::Prompt { .. } => {
                self.head(n - 1)?;
                1
            }
        };
        self.argmax(heads, false)
    }

    /// The argmax of the first `rows` rows of the logits into `token`, with each row's banned
    /// tokens (`MAX_BANS` a row, in the argmax scratch after its parts) skipped where `bans`.
    pub(super) fn argmax(&self, rows: usize, bans: bool) -> Result<()> {
        let (blocks, [a0, a1, a2, a3, a4, a5]) = self.argmax_grid();
        let args = [a0, a1, a2, a3, a4, a5, Arg::Ptr(if bans { self.bans_at() } else { 0 }), Arg::I32(MAX_BANS as i32)];
        self.gpu.launch("argmax", (blocks, rows as u32), 1024, 0, &args)
    }

    /// An argmax launch's blocks over the vocabulary and its first arguments: the logits, their
    /// count, the picks (`token`) and the scratch's parts and finish counters (`argmax`, and
    /// the MTP head's `argmax_answer`).
    pub(super) fn argmax_grid(&self) -> (u32, [Arg; 6]) {
        let (d, sc) = (&self.d, &self.sc);
        // over many blocks: one block reading a 248k vocabulary's logits takes ~0.1 ms
        let blocks = d.n_vocab.div_ceil(4096).min(ARGMAX_BLOCKS);
        let parts = ARGMAX_BLOCKS * self.decode_max;
        let args = [
            Arg::Ptr(sc.logits.ptr),
            Arg::I32(d.n_vocab as i32),
            Arg::Ptr(sc.token.ptr),
            Arg::Ptr(sc.argmax_part.ptr),
            Arg::Ptr(sc.argmax_part.at(4 * parts)),
            Arg::Ptr(sc.argmax_part.at(8 * parts)),
        ];
        (blocks as u32, args)
    }

    /// Where the rows' banned tokens go in the argmax scratch (after the parts and counters).
    pub(super) fn bans_at(&self) -> u64 {
        let parts = ARGMAX_BLOCKS * self.decode_max;
        self.sc.argmax_part.at(4 * (2 * parts + self.decode_max))
    }

    /// Layer `il`'s state for pass `p`.
    pub(super) fn layer_ptrs(&self, p: Pass<'_>, il: usize) -> Result<LayerPtrs> {
        let none = LayerPtrs { a: 0, b: 0, tab: 0, pos: 0, hist: 0, one_seq: true, seg: 0, row_off: 0 };
        match p {
            Pass::Rows { n } | Pass::Verify { n, .. } | Pass::Spans { n, .. } => {
                let (pos, tab, hist) = rows_table_at(n, il, self.layers.len());
                let (hist, one_seq) = match p {
                    Pass::Verify { hist: true, .. } => (self.sc.rows.at(hist), true),
                    Pass::Verify { .. } => (0, true),
                    _ => (0, false),
                };
                let (seg, row_off) = match p {
                    Pass::Spans { .. } => {
                        let (at_seg, _, at_off) = spans_table_at(self.decode_max);
                        (self.sc.spans.at(at_seg), self.sc.spans.at(at_off))
                    }
                    _ => (0, 0),
                };
                Ok(LayerPtrs { tab: self.sc.rows.at(tab), pos: self.sc.rows.at(pos), hist, one_seq, seg, row_off, ..none })
            }
            Pass::Prompt { seq, .. } => match (&self.layers[il].mixer, &seq.layers[il]) {
                (DevMixer::Delta(_), SeqLayer::Delta { conv, s }) => Ok(LayerPtrs { a: conv.ptr, b: s.ptr, ..none }),
                (DevMixer::Attn(_), SeqLayer::Attn { k, v }) => Ok(LayerPtrs { a: k.ptr, b: v.ptr, ..none }),
                _ => Err(CudaError::Unsupported("a sequence state of another model".into())),
            },
        }
    }

    /// The logits of each span's last row of a pass of `spans` spans (into rows 0… of the
    /// logits): the rows gathered (`embed` of f32 rows: a copy), then the decode rows' head,
    /// whose rows are each the bits of a prompt pass's one-row head (`head`).
    fn span_heads(&self, spans: usize) -> Result<()> {
        let (sc, h) = (&self.sc, self.d.hidden);
        let last = sc.spans.at(spans_table_at(self.decode_max).1);
        let f32_ty = 0;
        let args = [Arg::Ptr(sc.x.ptr), Arg::I32(f32_ty), Arg::I32(h as i32), Arg::I64((h * 4) as i64), Arg::Ptr(last), Arg::Ptr(sc.head_x.ptr)];
        self.gpu.launch("embed", (h.div_ceil(256) as u32, spans as u32), 256, 0, &args)?;
        let xn = self.rms_norm(sc.head_x.ptr, self.output_norm.ptr, spans, true, self.head_kinds)?;
        self.proj(&self.output, xn, sc.logits.ptr, None, spans, Layout::Rows)
    }

    /// The logits of a prompt pass's row `row` (its final norm and the output product).
    pub(super) fn head(&self, row: usize) -> Result<()> {
        let sc = &self.sc;
        let x = sc.x.at(row * self.d.hidden * 4);
        let xn = self.rms_norm(x, self.output_norm.ptr, 1, true, self.head_kinds)?;
        self.proj(&self.output, xn, sc.logits.ptr, None, 1, Layout::Rows)
    }

    /// Whether a pass's routed experts run grouped per expert on tensor cores (mm_ex): prompt
    /// passes whose slots fit moe_sort's shared memory and whose expert widths are whole chunks.
    pub(super) fn grouped_experts(&self, n: usize, rows: bool) -> bool {
        let d = &self.d;
        !rows && n > 1 && d.hidden % 128 == 0 && d.expert_ff % 128 == 0 && d.n_expert * 8 <= 48 << 10
    }

    /// RMSNorm of `n` rows of the hidden width into xn; for row-by-row products (`rows`), xn
    /// quantized as their weights need; for a cuBLAS pass, xn in f16 once for all its products.
    pub(super) fn rms_norm(&self, x: u64, w: u64, n: usize, rows: bool, kinds: Kinds) -> Result<In> {
        let (sc, hd) = (&self.sc, self.d.hidden);
        let (mut xn, [yq, yd, yqz, ydz]) = self.norm_outputs(rows, kinds);
        self.gpu.launch(
            "rms_norm",
            (n as u32, 1),
            rms_norm_threads(hd),
            0,
            &[Arg::Ptr(x), Arg::Ptr(w), Arg::Ptr(sc.xn.ptr), Arg::I32(hd as i32), Arg::F32(self.d.eps), Arg::Ptr(yq), Arg::Ptr(yd), Arg::Ptr(yqz), Arg::Ptr(ydz)],
        )?;
        if !rows && n >= BLAS_MIN_TOKENS && self.gpu.blas.is_some() {
            self.to_f16(sc.xn.ptr, hd, n, sc.xn_f16.ptr)?;
            xn.f16 = sc.xn_f16.ptr;
        }
        Ok(xn)
    }

    /// RMSNorm of `n` rows into xn, f32 only (a prompt pass's final hidden rows for an MTP head).
    pub(super) fn rms_norm_rows(&self, x: u64, w: u64, n: usize) -> Result<()> {
        self.rms_norm(x, w, n, false, Kinds::default()).map(|_| ())
    }

    /// A norm's output (xn) and, for decode rows, the q8 copies its products take (kinds):
    /// the input they make, and the copies' addresses (values, scales of q8_K; of q8_0; 0: none).
    fn norm_outputs(&self, rows: bool, kinds: Kinds) -> (In, [u64; 4]) {
        let (sc, hd) = (&self.sc, self.d.hidden);
        let mut q = Q8::default();
        if rows && kinds.k && hd % 256 == 0 {
            (q.qk, q.dk) = (sc.xq_n.ptr, sc.xd_n.ptr);
        }
        if rows && kinds.z && hd % 32 == 0 {
            (q.qz, q.dz) = (sc.xq_nz.ptr, sc.xd_nz.ptr);
        }
        (In { f: sc.xn.ptr, q, f16: 0 }, [q.qk, q.dk, q.qz, q.dz])
    }

    /// The norm after a stage that writes x, for the stage's last launch to apply (-DFUSE_NORM=1:
    /// decode rows, a hidden width of whole 256s up to 8192 — norm_row_block's); None: the
    /// norm takes a launch of its own.
    fn fusable_norm(&self, w: u64, kinds: Kinds, rows: bool) -> Option<NextNorm> {
        let hd = self.d.hidden;
        (self.gpu.knobs.fuse_norm && rows && hd % 256 == 0 && hd <= 8192).then_some(NextNorm { w, kinds })
    }

    /// A fused norm's kernel arguments after the product's (its finish counters, weight, eps,
    /// output and q8 copies), and the input its output makes.
    pub(super) fn norm_args(&self, next: NextNorm, count: u64) -> ([Arg; 8], In) {
        let (xn, [yq, yd, yqz, ydz]) = self.norm_outputs(true, next.kinds);
        let args = [Arg::Ptr(count), Arg::Ptr(next.w), Arg::F32(self.d.eps), Arg::Ptr(self.sc.xn.ptr), Arg::Ptr(yq), Arg::Ptr(yd), Arg::Ptr(yqz), Arg::Ptr(ydz)];
        (args, xn)
    }

    /// x += W·h for `n` rows (a layer's out or down projection), with `next` the norm after it
    /// applied by the same launch where it can be (one decode row: `mv_norm`); that norm's
    /// output, or None (it was not applied).
    pub(super) fn proj_residual(&self, w: &DevMat, h: In, n: usize, lay: Layout<'_>, next: Option<NextNorm>) -> Result<Option<In>> {
        let x = self.sc.x.ptr;
        match next {
            Some(next) if n == 1 && lay.rows() => {
                let (extra, xn) = self.norm_args(next, self.sc.counts.at(4 * COUNT_NORM));
                let mut args = mv_args(w, None, h, w.cols, 1, x, w.rows, Some(x));
                args.extend(extra);
                self.gpu.launch("mv_norm", (mv_blocks(&self.gpu, w), 1), (32 * MV_WARPS) as u32, 0, &args)?;
                Ok(Some(xn))
            }
            _ => self.proj(w, h, x, Some(x), n, lay).map(|_| None),
        }
    }

    /// An input other than xn (`rows` rows of `cols` values at x), quantized where `rows_path`.
    pub(super) fn input(&self, x: u64, cols: usize, rows: usize, rows_path: bool, kinds: Kinds) -> Result<In> {
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

    /// `input` for an output its producer already quantized (`fused`: the kinds `kinds` asks
    /// for, q8_K into xq_b, q8_0 into xq_bz).
    fn input_after(&self, x: u64, cols: usize, rows: usize, rows_path: bool, kinds: Kinds, fused: bool) -> Result<In> {
        if !fused {
            return self.input(x, cols, rows, rows_path, kinds);
        }
        let sc = &self.sc;
        let mut q = Q8::default();
        if kinds.k {
            (q.qk, q.dk) = (sc.xq_b.ptr, sc.xd_b.ptr);
        }
        if kinds.z {
            (q.qz, q.dz) = (sc.xq_bz.ptr, sc.xd_bz.ptr);
        }
        Ok(In { f: x, q, f16: 0 })
    }

    /// The q8 outputs a decode producer that quantizes whole 256-value blocks writes for its
    /// consumer's `kinds`: (xq_b, xd_b) for q8_K, (xq_bz, xd_bz) for q8_0; 0 = not wanted.
    fn fused_outputs(&self, kinds: Kinds) -> [Arg; 4] {
        let sc = &self.sc;
        let (yq, yd) = if kinds.k { (sc.xq_b.ptr, sc.xd_b.ptr) } else { (0, 0) };
        let (yqz, ydz) = if kinds.z { (sc.xq_bz.ptr, sc.xd_bz.ptr) } else { (0, 0) };
        [Arg::Ptr(yq), Arg::Ptr(yd), Arg::Ptr(yqz), Arg::Ptr(ydz)]
    }

    pub(super) fn quant(&self, x: u64, cols: usize, rows: usize, kind: i32, xq: u64, xd: u64) -> Result<()> {
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
    /// res, where given, is y (a residual added in place). Decode rows: row by row (`mv`, each
    /// row alone); prompt spans: each span's kernel by its length (`proj_spans`).
    pub(super) fn proj(&self, w: &DevMat, x: In, y: u64, res: Option<u64>, n: usize, lay: Layout<'_>) -> Result<()> {
        if let Layout::Spans(lens) = lay {
            return self.proj_spans(w, x, y, res, lens);
        }
        if n == 1 {
            return mv(&self.gpu, w, None, x, w.cols, 1, y, w.rows, res, 1);
        }
        // a decode batch: each weight row loaded once for mv_cols' rows of the batch
        let c = self.gpu.knobs.mv_cols;
        self.gpu.launch(
            "mv_cols",
            ((w.rows.div_ceil(MV_WARPS) * n.div_ceil(c)) as u32, 1),
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(w.ptr),
                Arg::I32(w.ty),
                Arg::I32(w.rows as i32),
                Arg::I32(w.cols as i32),
                Arg::I64(w.row_bytes as i64),
                Arg::Ptr(x.f),
                Arg::Ptr(x.q.qk),
                Arg::Ptr(x.q.dk),
                Arg::Ptr(x.q.qz),
                Arg::Ptr(x.q.dz),
                Arg::I64(w.cols as i64),
                Arg::I32(n as i32),
                Arg::Ptr(y),
                Arg::I64(w.rows as i64),
                Arg::Ptr(res.unwrap_or(0)),
            ],
        )
    }

    /// The kernel a prompt product of a span of `n` tokens takes: cuBLAS from `BLAS_MIN_TOKENS`
    /// (where present; it adds a residual only in place), tensor cores from `TC_MIN_TOKENS` (whole
    /// 128-column steps), else `mm`. Monotone in n: spans longest first take them in runs.
    fn prompt_kernel(&self, w: &DevMat, n: usize, res: Option<u64>, y: u64) -> PromptKernel {
        if self.gpu.blas.is_some() && n >= BLAS_MIN_TOKENS && res.is_none_or(|r| r == y) {
            PromptKernel::Blas
        } else if n >= TC_MIN_TOKENS && w.cols % 128 == 0 {
            PromptKernel::TensorCores
        } else {
            PromptKernel::Rows8
        }
    }

    /// `proj` for prompt spans back to back (`lens`, longest first): spans that take the same
    /// row-by-row kernel share one launch over their rows; cuBLAS spans share the weight's f16
    /// copy and take a GEMM each, of their own shape (so of their own algorithm and bits).
    fn proj_spans(&self, w: &DevMat, x: In, y: u64, res: Option<u64>, lens: &[usize]) -> Result<()> {
        let at_y = |r: usize| y + (r * w.rows * 4) as u64;
        let (mut r0, mut i) = (0, 0);
        while i < lens.len() {
            let kernel = self.prompt_kernel(w, lens[i], res, y);
            let run = lens[i..].iter().take_while(|&&l| self.prompt_kernel(w, l, res, y) == kernel).count();
            let rows: usize = lens[i..i + run].iter().sum();
            match (kernel, &self.gpu.blas) {
                (PromptKernel::Blas, Some(blas)) => {
                    self.dequant_f16(w)?;
                    let mut r = r0;
                    for &len in &lens[i..i + run] {
                        self.gemm_aligned(blas, w, x.at(r, w.cols), at_y(r), res.is_some(), len)?;
                        r += len;
                    }
                }
                _ => self.prompt_product(kernel, w, x.at(r0, w.cols), at_y(r0), res.map(|r| r + (r0 * w.rows * 4) as u64), rows)?,
            }
            (r0, i) = (r0 + rows, i + run);
        }
        Ok(())
    }

    /// A prompt product of `n` rows by `mm_tc` or `mm` (each output its own sum: the bits of a
    /// row do not depend on the rows beside it).
    fn prompt_product(&self, kernel: PromptKernel, w: &DevMat, x: In, y: u64, res: Option<u64>, n: usize) -> Result<()> {
        // mm_tc and mm take the same arguments; they differ in tile shape
        let (name, grid) = match kernel {
            PromptKernel::TensorCores => ("mm_tc", (w.rows.div_ceil(64) as u32, n.div_ceil(64) as u32)),
            _ => ("mm", (w.rows.div_ceil(MV_WARPS) as u32, n.div_ceil(MM_T) as u32)),
        };
        self.gpu.launch(
            name,
            grid,
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(w.ptr),
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

    /// Up to four row-by-row products of one input in one launch (`mv4`), for each of `n` rows;
    /// with `conv` (taps, output, the layer's state table) the first part's outputs convolved
    /// too, as conv_step convolves them (a DeltaNet layer's decode rows: `Knobs::mv4_conv`).
    fn proj_many(&self, parts: &[(&DevMat, u64)], x: In, n: usize, conv: Option<(u64, u64, u64)>) -> Result<()> {
        self.proj_many_routed(parts, x, n, conv, None)
    }

    /// `proj_many` whose first part is a MoE router, with `route` (ids, weights): its top-k in
    /// the same launch too (`mv4_route`: moe_route_warp's picks and weights, bit for bit).
    pub(super) fn proj_many_routed(&self, parts: &[(&DevMat, u64)], x: In, n: usize, conv: Option<(u64, u64, u64)>, route: Option<(u64, u64)>) -> Result<()> {
        let total: usize = parts.iter().map(|(m, _)| m.rows).sum();
        let mut args = vec![Arg::I32(parts[0].0.cols as i32), Arg::Ptr(x.f), Arg::Ptr(x.q.qk), Arg::Ptr(x.q.dk), Arg::Ptr(x.q.qz), Arg::Ptr(x.q.dz)];
        for i in 0..4 {
            match parts.get(i) {
                Some((m, y)) => args.extend([Arg::Ptr(m.ptr), Arg::I32(m.ty), Arg::I32(m.rows as i32), Arg::I64(m.row_bytes as i64), Arg::Ptr(*y)]),
                None => args.extend([Arg::Ptr(0), Arg::I32(0), Arg::I32(0), Arg::I64(0), Arg::Ptr(0)]),
            }
        }
        args.push(Arg::I32(n as i32));
        let (taps, out, tab) = conv.unwrap_or((0, 0, 0));
        args.extend([Arg::Ptr(taps), Arg::Ptr(out), Arg::I32(self.d.conv_kernel as i32), Arg::Ptr(tab)]);
        // one row alone (mv4), or mv_cols' rows of a decode batch a warp (mv4_cols): the same bits
        let (mut kernel, per) = if n == 1 { ("mv4", 1) } else { ("mv4_cols", self.gpu.knobs.mv_cols) };
        if let Some((ids, weights)) = route {
            let d = &self.d;
            kernel = if n == 1 { "mv4_route" } else { "mv4_cols_route" };
            args.extend([
                Arg::Ptr(self.sc.counts.at(4 * COUNT_ROUTE)),
                Arg::I32(d.n_used as i32),
                Arg::I32(d.norm_w as i32),
                Arg::F32(d.w_scale),
                Arg::Ptr(ids),
                Arg::Ptr(weights),
            ]);
        }
        self.gpu.launch(kernel, ((total.div_ceil(MV_WARPS) * n.div_ceil(per)) as u32, 1), (32 * MV_WARPS) as u32, 0, &args)
    }

    /// W as f16 rows into the cuBLAS scratch (`gemm` then reads it).
    fn dequant_f16(&self, w: &DevMat) -> Result<()> {
        let units = w.rows * units_per_row(w.ty, w.cols);
        self.gpu.launch(
            "dequant_f16",
            (units.div_ceil(256) as u32, 1),
            256,
            0,
            &[Arg::Ptr(w.ptr), Arg::I32(w.ty), Arg::I32(w.rows as i32), Arg::I32(w.cols as i32), Arg::I64(w.row_bytes as i64), Arg::Ptr(self.sc.w_f16.ptr)],
        )
    }

    /// A span's prompt product through cuBLAS on W's f16 copy (`dequant_f16`): x to f16 (unless
    /// the input already is), one GEMM (+= y where `accumulate`).
    fn gemm(&self, blas: &crate::blas::Blas, w: &DevMat, x: In, y: u64, accumulate: bool, n: usize) -> Result<()> {
        let sc = &self.sc;
        let xh = if x.f16 != 0 {
            x.f16
        } else {
            self.to_f16(x.f, w.cols, n, sc.x_f16.ptr)?;
            sc.x_f16.ptr
        };
        blas.gemm_tn(w.rows, n, w.cols, sc.w_f16.ptr, w.cols, xh, w.cols, y, w.rows, accumulate)
    }

    /// `gemm` for a span that may start past its buffers' start: cuBLAS picks its kernel by
    /// its pointers' alignment as well as the shape, and a span alone starts at the buffers'
    /// start, so an input or output not 16-byte aligned goes through the start of a scratch
    /// (the input's f16 copy made there; the output written there, and copied over).
    fn gemm_aligned(&self, blas: &crate::blas::Blas, w: &DevMat, x: In, y: u64, accumulate: bool, n: usize) -> Result<()> {
        let x = if x.f16 % 16 == 0 { x } else { In { f16: 0, ..x } };
        if y % 16 == 0 {
            return self.gemm(blas, w, x, y, accumulate, n);
        }
        let (tmp, bytes) = (self.sc.blas_y.ptr, n * w.rows * 4);
        if bytes > self.sc.blas_y.bytes() {
            return Err(CudaError::Unsupported(format!("a prompt product's {bytes}-byte output past the staging scratch")));
        }
        if accumulate {
            self.gpu.copy_at(tmp, y, bytes)?;
        }
        self.gemm(blas, w, x, tmp, accumulate, n)?;
        self.gpu.copy_at(y, tmp, bytes)
    }

    /// h[t] = silu(gate·x[t]) ⊙ (up·x[t]) for n rows (as `proj`: decode rows each alone,
    /// prompt spans each by its length).
    pub(super) fn glu(&self, w: &Glu, x: In, h: u64, n: usize, lay: Layout<'_>) -> Result<()> {
        let (gm, um) = (&w.gate, &w.up);
        if let Layout::Spans(lens) = lay {
            return self.glu_spans(w, x, h, lens);
        }
        if n > 1 && self.gpu.knobs.mv_glu_cols {
            // a decode batch: each weight row loaded once for mv_cols' rows of the batch
            return self.gpu.launch(
                "mv_glu_cols",
                ((gm.rows.div_ceil(MV_WARPS) * n.div_ceil(self.gpu.knobs.mv_cols)) as u32, 1),
                (32 * MV_WARPS) as u32,
                0,
                &[
                    Arg::Ptr(gm.ptr),
                    Arg::Ptr(um.ptr),
                    Arg::I32(gm.ty),
                    Arg::I32(um.ty),
                    Arg::I32(gm.rows as i32),
                    Arg::I32(gm.cols as i32),
                    Arg::I64(gm.row_bytes as i64),
                    Arg::I64(um.row_bytes as i64),
                    Arg::Ptr(x.f),
                    Arg::Ptr(x.q.qk),
                    Arg::Ptr(x.q.dk),
                    Arg::Ptr(x.q.qz),
                    Arg::Ptr(x.q.dz),
                    Arg::I64(gm.cols as i64),
                    Arg::I32(n as i32),
                    Arg::Ptr(h),
                    Arg::I64(gm.rows as i64),
                ],
            );
        }
        mv_glu(&self.gpu, w, None, x, gm.cols, 1, h, gm.rows, n)
    }

    /// `glu` for prompt spans back to back (`lens`, longest first): spans from `TC_MIN_TOKENS`
    /// on take two products (`proj_spans`) and the activation; the shorter ones (the rest of
    /// the list) one launch of both products (`mm_glu`, or `mv_glu` where gate and up differ).
    fn glu_spans(&self, w: &Glu, x: In, h: u64, lens: &[usize]) -> Result<()> {
        let (gm, um) = (&w.gate, &w.up);
        let two = |n: usize| n >= TC_MIN_TOKENS && (gm.cols % 128 == 0 || self.gpu.blas.is_some());
        let long = lens.iter().take_while(|&&n| two(n)).count();
        let long_rows: usize = lens[..long].iter().sum();
        if long > 0 {
            let u = self.sc.ffn_u.ptr;
            self.proj_spans(gm, x, h, None, &lens[..long])?;
            self.proj_spans(um, x, u, None, &lens[..long])?;
            let len = long_rows * gm.rows;
            self.gpu.launch("silu_mul", (len.div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(h), Arg::Ptr(u), Arg::I64(len as i64)])?;
        }
        let n: usize = lens[long..].iter().sum();
        if n == 0 {
            return Ok(());
        }
        let (x, h) = (x.at(long_rows, gm.cols), h + (long_rows * gm.rows * 4) as u64);
        if gm.ty != um.ty || gm.row_bytes != um.row_bytes {
            return mv_glu(&self.gpu, w, None, x, gm.cols, 1, h, gm.rows, n);
        }
        self.gpu.launch(
            "mm_glu",
            (gm.rows.div_ceil(MV_WARPS) as u32, n.div_ceil(MM_T) as u32),
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(gm.ptr),
                Arg::Ptr(um.ptr),
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

    /// A DeltaNet layer's mixer into x; with `next`, the norm after it applied by its last
    /// launch where it can be (`proj_residual`): that norm's output, else None.
    fn delta(&self, w: &DeltaLayer, st: LayerPtrs, x: In, out_kinds: Kinds, n: usize, lay: Layout<'_>, next: Option<NextNorm>) -> Result<Option<In>> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let rows = lay.rows();
        // decode rows, each its own sequence's next token: the convolution inside the qkv
        // product's launch where the knob says so (a verify's tokens run in order: conv_step)
        let fused_conv = rows && !st.one_seq && g.knobs.mv4_conv;
        if rows {
            let conv = fused_conv.then_some((w.taps.ptr, sc.conv.ptr, st.tab));
            self.proj_many(&[(&w.qkv, sc.qkv.ptr), (&w.z, sc.z.ptr), (&w.beta, sc.beta.ptr), (&w.alpha, sc.alpha.ptr)], x, n, conv)?;
        } else {
            self.proj(&w.qkv, x, sc.qkv.ptr, None, n, lay)?;
            self.proj(&w.z, x, sc.z.ptr, None, n, lay)?;
            self.proj(&w.beta, x, sc.beta.ptr, None, n, lay)?;
            self.proj(&w.alpha, x, sc.alpha.ptr, None, n, lay)?;
        }
        let cd = w.qkv.rows;
        let conv_state = st.a;
        if rows {
            // a decode batch: a row a token of its own sequence; a verify: its tokens in order
            // over the one sequence's state, each state after a token kept
            let (grid_y, n_tok) = if st.one_seq { (1, n) } else { (n, 1) };
            let conv_args = [
                Arg::Ptr(sc.qkv.ptr),
                Arg::Ptr(0),
                Arg::Ptr(w.taps.ptr),
                Arg::Ptr(sc.conv.ptr),
                Arg::I32(cd as i32),
                Arg::I32(d.conv_kernel as i32),
                Arg::I32(n_tok as i32),
                Arg::Ptr(st.tab),
                Arg::Ptr(st.hist),
            ];
            if !fused_conv {
                g.launch("conv_step", (cd.div_ceil(256) as u32, grid_y as u32), 256, 0, &conv_args)?;
            }
        } else {
            let conv_args = [
                Arg::Ptr(sc.qkv.ptr),
                Arg::Ptr(conv_state),
                Arg::Ptr(w.taps.ptr),
                Arg::Ptr(sc.conv.ptr),
                Arg::I32(cd as i32),
                Arg::I32(d.conv_kernel as i32),
                Arg::I32(n as i32),
                Arg::Ptr(st.row_off),
                Arg::Ptr(st.tab),
            ];
            // every (token, channel) at once, then each span's state moved on
            g.launch("conv_prompt", ((n * cd).div_ceil(256) as u32, 1), 256, 0, &conv_args)?;
            g.launch(
                "conv_shift",
                (cd.div_ceil(256) as u32, lay.spans() as u32),
                256,
                0,
                &[
                    Arg::Ptr(sc.qkv.ptr),
                    Arg::Ptr(conv_state),
                    Arg::I32(cd as i32),
                    Arg::I32(d.conv_kernel as i32),
                    Arg::I32(n as i32),
                    Arg::Ptr(st.seg),
                    Arg::Ptr(st.tab),
                ],
            )?;
        }
        self.delta_scan(w, st, out_kinds, n, lay, next)
    }

    /// The scan of a pass (a decode step too): gates and normed q / k per token, then S's rows
    /// spread over blocks (8 a block, in registers through the pass), then the output norms;
    /// the out projection. (delta_step, one block a head, is its single-kernel reference.)
    fn delta_scan(&self, w: &DeltaLayer, st: LayerPtrs, out_kinds: Kinds, n: usize, lay: Layout<'_>, next: Option<NextNorm>) -> Result<Option<In>> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (s, rows) = (st.b, lay.rows());
        if rows && !st.one_seq {
            // a decode batch: the gates and norms inside the rows' kernel, a row of the batch
            // a grid layer
            g.launch_3d(
                "delta_step_rows",
                (d.hv as u32, d.sd.div_ceil(8) as u32, n as u32),
                128,
                0,
                &[
                    Arg::Ptr(sc.conv.ptr),
                    Arg::Ptr(sc.beta.ptr),
                    Arg::Ptr(sc.alpha.ptr),
                    Arg::Ptr(w.dt_bias.ptr),
                    Arg::Ptr(w.a.ptr),
                    Arg::Ptr(s),
                    Arg::Ptr(sc.o_raw.ptr),
                    Arg::I32(d.hk as i32),
                    Arg::I32(d.hv as i32),
                    Arg::I32(d.sd as i32),
                    Arg::I32(d.tiled as i32),
                    Arg::F32(d.eps),
                    Arg::Ptr(st.tab),
                ],
            )?;
            return self.delta_finish(w, out_kinds, n, lay, next);
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
        // a block a span's rows of S (a pass of spans: blockIdx.z a span)
        g.launch_3d(
            "delta_rows",
            (d.hv as u32, d.sd.div_ceil(8) as u32, lay.spans() as u32),
            128,
            0,
            &[
                Arg::Ptr(sc.qn.ptr),
                Arg::Ptr(sc.kn.ptr),
                Arg::Ptr(sc.conv.ptr),
                Arg::Ptr(sc.gb.ptr),
                Arg::Ptr(s),
                Arg::Ptr(sc.o_raw.ptr),
                Arg::I32(d.hk as i32),
                Arg::I32(d.hv as i32),
                Arg::I32(d.sd as i32),
                Arg::I32(d.tiled as i32),
                Arg::I32(n as i32),
                Arg::Ptr(st.tab),
                Arg::Ptr(st.hist),
                Arg::Ptr(st.seg),
            ],
        )?;
        // (a verify's rows: delta_prep and delta_rows give each token delta_step_rows' bits)
        self.delta_finish(w, out_kinds, n, lay, next)
    }

    /// The scan's gated output norms, then the out projection (and its residual).
    fn delta_finish(&self, w: &DeltaLayer, out_kinds: Kinds, n: usize, lay: Layout<'_>, next: Option<NextNorm>) -> Result<Option<In>> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let rows = lay.rows();
        // a decode step's norm also quantizes where 256 values are whole heads
        let fuse = rows && (out_kinds.k || out_kinds.z) && 256 % d.sd == 0 && (d.hv * d.sd) % 256 == 0;
        let heads = if fuse { 256 / d.sd } else { 1 };
        let mut args = vec![
            Arg::Ptr(sc.o_raw.ptr),
            Arg::Ptr(sc.z.ptr),
            Arg::Ptr(w.norm.ptr),
            Arg::Ptr(sc.delta_o.ptr),
            Arg::I32(d.hv as i32),
            Arg::I32(d.sd as i32),
            Arg::F32(d.eps),
        ];
        args.extend(if fuse { self.fused_outputs(out_kinds) } else { [Arg::Ptr(0); 4] });
        g.launch("delta_out", ((d.hv / heads) as u32, n as u32), (128 * heads) as u32, 0, &args)?;
        let o = self.input_after(sc.delta_o.ptr, w.out.cols, n, rows, out_kinds, fuse)?;
        self.proj_residual(&w.out, o, n, lay, next)
    }

    /// An attention layer's mixer into x; `next` as for `delta`.
    pub(super) fn attention(&self, w: &AttnLayer, st: LayerPtrs, x: In, out_kinds: Kinds, n: usize, lay: Layout<'_>, next: Option<NextNorm>) -> Result<Option<In>> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k_cache, v_cache) = (st.a, st.b);
        let rows = lay.rows();
        if rows {
            self.proj_many(&[(&w.q, sc.qg.ptr), (&w.k, sc.k.ptr), (&w.v, sc.v.ptr)], x, n, None)?;
        } else {
            self.proj(&w.q, x, sc.qg.ptr, None, n, lay)?;
            self.proj(&w.k, x, sc.k.ptr, None, n, lay)?;
            self.proj(&w.v, x, sc.v.ptr, None, n, lay)?;
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
                Arg::Ptr(k_cache),
                Arg::Ptr(v_cache),
                Arg::I32(d.n_head as i32),
                Arg::I32(d.n_head_kv as i32),
                Arg::I32(d.hd as i32),
                Arg::I32(d.n_rot as i32),
                Arg::F32(d.theta_scale),
                Arg::F32(d.eps),
                Arg::Ptr(st.pos),
                Arg::Ptr(st.tab),
            ],
        )?;
        self.gpu.launch_3d(
            "attn_split",
            (d.n_head as u32, d.n_split as u32, n as u32),
            128,
            0,
            &[
                Arg::Ptr(sc.q.ptr),
                Arg::Ptr(k_cache),
                Arg::Ptr(v_cache),
                Arg::Ptr(sc.step.ptr),
                Arg::Ptr(sc.part_o.ptr),
                Arg::Ptr(sc.part_ml.ptr),
                Arg::I32(d.n_head as i32),
                Arg::I32(d.n_head_kv as i32),
                Arg::I32(d.hd as i32),
                Arg::F32(1.0 / (d.hd as f32).sqrt()),
                Arg::Ptr(st.pos),
                Arg::Ptr(st.tab),
            ],
        )?;
        // a decode step's merge also quantizes where 256 values are whole heads
        let fuse = rows && (out_kinds.k || out_kinds.z) && 256 % d.hd == 0 && (d.n_head * d.hd) % 256 == 0;
        let (grid_x, merge_block) = if fuse { (d.n_head * d.hd / 256, 256) } else { (d.n_head, block) };
        let mut args =
            vec![Arg::Ptr(sc.part_o.ptr), Arg::Ptr(sc.part_ml.ptr), Arg::Ptr(sc.qg.ptr), Arg::Ptr(sc.attn_o.ptr), Arg::I32(d.hd as i32), Arg::I32(d.n_split as i32)];
        args.extend(if fuse { self.fused_outputs(out_kinds) } else { [Arg::Ptr(0); 4] });
        g.launch("attn_merge", (grid_x as u32, n as u32), merge_block as u32, 0, &args)?;
        let o = self.input_after(sc.attn_o.ptr, w.o.cols, n, rows, out_kinds, fuse)?;
        self.proj_residual(&w.o, o, n, lay, next)
    }
}

/// A product's input quantized for the decode products (kernels.cu quant_q8): q8_K for the
/// k-quant weights, q8_0 for Q8_0; each int8 values and (scale, scale·Σq) per 32; 0 = absent.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Q8 {
    pub(super) qk: u64,
    pub(super) dk: u64,
    pub(super) qz: u64,
    pub(super) dz: u64,
}

/// A product's input: its f32 rows, their q8 copies for row-by-row products, and an f16 copy
/// where a cuBLAS pass made one (0 = none).
#[derive(Clone, Copy, Debug)]
pub(super) struct In {
    pub(super) f: u64,
    pub(super) q: Q8,
    pub(super) f16: u64,
}

impl In {
    /// The input from row `r` on (rows of `cols` values), for a prompt span's product: its f32
    /// and f16 rows (prompt products take no q8 copies).
    fn at(self, r: usize, cols: usize) -> In {
        if r == 0 {
            return self;
        }
        let f16 = if self.f16 != 0 { self.f16 + (2 * r * cols) as u64 } else { 0 };
        In { f: self.f + (4 * r * cols) as u64, q: Q8::default(), f16 }
    }
}

/// Where the spans table (`CudaModel::spans_pass`) keeps, for a pass of up to `spans` spans:
/// (each span's (first row, tokens) as int2, each span's last row, each row's place in its span).
pub(super) fn spans_table_at(spans: usize) -> (usize, usize, usize) {
    (0, 8 * spans, 12 * spans)
}

pub(super) const MV_WARPS: usize = 4;
/// Blocks of the greedy argmax at most (its scratch: a value and an index each, a counter).
pub(super) const ARGMAX_BLOCKS: usize = 128;

/// Tokens a greedy row's argmax skips on the device at most (kernels.cu MAX_BANS); a row with
/// more returns its logits for the sampler.
pub(super) const MAX_BANS: usize = 16;
/// Tokens a pass of the `mm` kernels (kernels.cu MM_T).
pub(super) const MM_T: usize = 8;
/// From this many tokens a product runs on tensor cores (`mm_tc`, 64-token tiles).
pub(super) const TC_MIN_TOKENS: usize = 16;
/// From this many tokens a prompt product goes through cuBLAS (where present): below it the
/// f16 copy of the weight costs more than the GEMM saves.
pub(super) const BLAS_MIN_TOKENS: usize = 32;
/// Slots of one expert an mm_ex tile takes at most (moe_sort's tiles for a prompt pass).
pub(super) const EX_TILE: usize = 16;
/// Weight rows of an mm_ex block (kernels.cu EX_WARPS · EX_NT · 8).
pub(super) const EX_ROWS: usize = 128;

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
pub(super) fn mv(g: &Gpu, w: &DevMat, ids: Option<u64>, x: In, x_stride: usize, x_div: usize, y: u64, y_stride: usize, res: Option<u64>, slots: usize) -> Result<()> {
    g.launch("mv", (mv_blocks(g, w), slots as u32), (32 * MV_WARPS) as u32, 0, &mv_args(w, ids, x, x_stride, x_div, y, y_stride, res))
}

/// `mv`'s (and `mv_norm`'s) blocks for one slot of `w`: MV_WARPS warps of mv_rows rows each.
fn mv_blocks(g: &Gpu, w: &DevMat) -> u32 {
    w.rows.div_ceil(MV_WARPS * g.knobs.mv_rows) as u32
}

/// `mv`'s kernel arguments (mv_norm's first ones).
#[allow(clippy::too_many_arguments)]
fn mv_args(w: &DevMat, ids: Option<u64>, x: In, x_stride: usize, x_div: usize, y: u64, y_stride: usize, res: Option<u64>) -> Vec<Arg> {
    vec![
        Arg::Ptr(w.ptr),
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
    ]
}

/// h[s] = silu(G_{ids[s]}·x[s / x_div]) ⊙ (U_{ids[s]}·x[s / x_div]) for `slots` slots.
#[allow(clippy::too_many_arguments)]
pub(super) fn mv_glu(g: &Gpu, w: &Glu, ids: Option<u64>, x: In, x_stride: usize, x_div: usize, h: u64, h_stride: usize, slots: usize) -> Result<()> {
    let (gm, um) = (&w.gate, &w.up);
    g.launch(
        "mv_glu",
        (gm.rows.div_ceil(MV_WARPS) as u32, slots as u32),
        (32 * MV_WARPS) as u32,
        0,
        &[
            Arg::Ptr(gm.ptr),
            Arg::Ptr(um.ptr),
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

/// The finish counters (`Scratch::counts`, u32s, zero between launches) of the launches whose
/// last block finishes a reduction: the router's top-k (`mv4_route`), then the experts' hidden
/// rows' quantization (`moe_glu`), one a (decode row, slot).
/// The RMSNorm after a stage that writes x (its weight; the q8 kinds its products take), for
/// the stage's last launch to apply (`CudaModel::fusable_norm`).
#[derive(Clone, Copy)]
pub(super) struct NextNorm {
    w: u64,
    kinds: Kinds,
}

pub(super) const COUNT_ROUTE: usize = 0;
/// A decode row's fused norm (`mv_norm`: row 0; `moe_down_combine_norm`: one a row).
pub(super) const COUNT_NORM: usize = 1;
/// The experts' hidden rows' quantizations (`moe_glu`) after the norms': `CudaModel::count_mids`.
pub(super) const COUNT_MIDS: usize = 1;
