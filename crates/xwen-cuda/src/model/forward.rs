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
    fn rows(&self) -> bool {
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
    fn rows(&self) -> bool {
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
        let (d, sc) = (&self.d, &self.sc);
        // over many blocks: one block reading a 248k vocabulary's logits takes ~0.1 ms
        let blocks = d.n_vocab.div_ceil(4096).min(ARGMAX_BLOCKS);
        let parts = ARGMAX_BLOCKS * self.decode_max;
        self.gpu.launch(
            "argmax",
            (blocks as u32, rows as u32),
            1024,
            0,
            &[
                Arg::Ptr(sc.logits.ptr),
                Arg::I32(d.n_vocab as i32),
                Arg::Ptr(sc.token.ptr),
                Arg::Ptr(sc.argmax_part.ptr),
                Arg::Ptr(sc.argmax_part.at(4 * parts)),
                Arg::Ptr(sc.argmax_part.at(8 * parts)),
                Arg::Ptr(if bans { self.bans_at() } else { 0 }),
                Arg::I32(MAX_BANS as i32),
            ],
        )
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
    fn grouped_experts(&self, n: usize, rows: bool) -> bool {
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
    fn norm_args(&self, next: NextNorm, count: u64) -> ([Arg; 8], In) {
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
    fn proj_many_routed(&self, parts: &[(&DevMat, u64)], x: In, n: usize, conv: Option<(u64, u64, u64)>, route: Option<(u64, u64)>) -> Result<()> {
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

    /// A MoE layer into x; with `norm_after`, the norm after it applied by its last launch where
    /// it can be (a decode batch's `moe_down_combine_norm`): that norm's output, else None.
    pub(super) fn moe(&self, il: usize, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, lay: Layout<'_>, norm_after: Option<NextNorm>) -> Result<Option<In>> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let k = d.n_used;
        let rows = lay.rows();
        // the VRAM cache holds the trunk's layers' experts; an MTP head's are resident
        let cache = self.expert_cache.as_ref().filter(|_| il < self.layers.len());
        // -DFUSE_ROUTE=1: a decode row's top-k in the router product's launch (mv4_route)
        let fuse_route = rows && g.knobs.fuse_route && d.n_expert <= 512 && k <= 32;
        let route = fuse_route.then_some((sc.ids.ptr, sc.weights.ptr));
        match &w.shared_gate {
            // the router and the shared expert's gate read the same input: one launch
            Some(gate) if rows => self.proj_many_routed(&[(&w.router, sc.router.ptr), (gate, sc.sg.ptr)], x, n, None, route)?,
            _ if fuse_route => self.proj_many_routed(&[(&w.router, sc.router.ptr)], x, n, None, route)?,
            _ => self.proj(&w.router, x, sc.router.ptr, None, n, lay)?,
        }
        if !fuse_route {
            self.route(sc.router.ptr, sc.ids.ptr, sc.weights.ptr, n)?;
        }
        if let Some(sh) = &self.shard {
            return self.moe_rank(sh, w, x, kinds, n, lay).map(|_| None);
        }
        // the next MoE layer's guess from this layer's input (read-ahead, decode rows)
        let ahead = match (cache, rows) {
            (Some(cache), true) => cache.read_ahead.as_ref().zip(self.next_moe(il)),
            _ => None,
        };
        if let Some((ra, (_, next))) = ahead {
            self.proj(&next.router, x, ra.logits.ptr, None, n, lay)?;
            self.route(ra.logits.ptr, ra.ids.ptr, ra.weights.ptr, n)?;
        }
        // under a VRAM budget: the picked experts copied into the layer's pool, in rounds
        // where the pass needs more than it holds (`experts/`); decode rows with the CPU path
        // on read their input rows back with the picks (one sync)
        let (rounds, jobs, xh) = match cache {
            Some(cache) => {
                let want_x = (rows && cache.has_cpu()).then_some((x.f, n * d.hidden));
                let (ids, xh) = cache.read_back(g, sc.ids.ptr, n * k, want_x)?;
                cache.wait_read_ahead(g, il)?;
                let (rounds, jobs) = cache.plan(il, &ids, rows)?;
                (rounds, jobs, xh)
            }
            None => (vec![], vec![], vec![]),
        };
        // the guessed experts' copies go after this layer's own work is enqueued: the copy
        // engine takes copies in order, and this layer's are needed first
        let guess = match ahead {
            Some((ra, (jl, next))) => Some((jl, next, g.read_i32(&ra.ids, n * k)?)),
            None => None,
        };
        let read_ahead = || -> Result<()> {
            match (cache, &guess) {
                (Some(cache), Some((jl, next, ids))) => cache.read_ahead(g, *jl, &next.experts, ids),
                _ => Ok(()),
            }
        };
        // a decode step's misses copied beside the held experts' products (`Pipe`), or some
        // of them computed by the CPU
        let overlap = rows && cache.is_some_and(|c| c.pipe.takes(&rounds));
        if !jobs.is_empty() || overlap {
            return self.experts_beside_cpu(il, w, x, kinds, n, (&rounds, &jobs, &xh), &read_ahead).map(|_| None);
        }
        if rounds.len() <= 1 {
            if let Some(r) = rounds.first() {
                self.expert_round(il, w, r)?;
            }
            if rows && self.group_decode_experts(n) {
                self.moe_decode_grouped(w, x, kinds, n)?;
                return read_ahead().map(|_| None);
            }
            // moe_down_combine's block holds a warp a slot and the shared expert's
            if rows && k < 32 {
                let normed = self.moe_decode(w, x, kinds, n, norm_after)?;
                read_ahead()?;
                return Ok(normed);
            }
            self.routed_products(w, x, kinds, n, rows)?;
        } else {
            // each round's slots into ys where the whole pass puts them; one weighted sum below
            for r in &rounds {
                self.expert_round(il, w, r)?;
                self.routed_products(w, x, kinds, n, rows)?;
            }
        }
        self.moe_sum(w, x, kinds, n, lay)?;
        read_ahead().map(|_| None)
    }

    /// A rank of a sharded model after routing: its block's picks computed into their ys slots,
    /// the other slots zero; the reduction fills those with their owners' outputs; then the
    /// shared expert, the weighted sum and the residual as one GPU computes them — the bits of
    /// the whole model on one GPU (`moe_decode` is the bits of these launches).
    fn moe_rank(&self, sh: &super::DeviceShard, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, lay: Layout<'_>) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let slots = n * d.n_used;
        let ys_len = slots * d.hidden;
        let args = [Arg::Ptr(sc.ids.ptr), Arg::I32(slots as i32), Arg::I32(sh.experts.start as i32), Arg::I32(sh.experts.end as i32), Arg::Ptr(sc.ys.ptr), Arg::I64(ys_len as i64)];
        g.launch("moe_local_ids", (ys_len.div_ceil(256).clamp(1, 1024) as u32, 1), 256, 0, &args)?;
        self.routed_products(w, x, kinds, n, lay.rows())?;
        sh.comm.all_reduce_sum(g, sc.ys.ptr, ys_len)?;
        self.moe_sum(w, x, kinds, n, lay)
    }

    /// The top-k experts and their weights of `n` tokens' router logits (n_expert a token).
    fn route(&self, logits: u64, ids: u64, weights: u64, n: usize) -> Result<()> {
        let (g, d) = (&self.gpu, &self.d);
        let k = d.n_used;
        let args = [Arg::Ptr(logits), Arg::I32(d.n_expert as i32), Arg::I32(k as i32), Arg::I32(d.norm_w as i32), Arg::F32(d.w_scale), Arg::Ptr(ids), Arg::Ptr(weights)];
        if d.n_expert <= 512 && k <= 32 {
            // a warp a token, the experts' probabilities in registers
            g.launch("moe_route_warp", (n as u32, 1), 32, 0, &args)
        } else {
            g.launch("moe_route", (n as u32, 1), 256, (d.n_expert * 4) as u32, &args)
        }
    }

    /// The MoE layer after layer `il`, if any: (its index, its weights).
    fn next_moe(&self, il: usize) -> Option<(usize, &MoeLayer)> {
        self.layers.iter().enumerate().skip(il + 1).find_map(|(j, l)| match &l.ffn {
            DevFfn::Moe(w) => Some((j, w)),
            DevFfn::Dense(_) => None,
        })
    }

    /// A decode step's routed experts under the VRAM cache, some of the missed ones perhaps on
    /// the CPU (`jobs`: routed slot, expert; `xh`: the rows' input, read back). With the pipe
    /// on and one round to run: the misses copied up on their own stream while the model's
    /// stream computes the held experts' slots and the shared expert, then the copied slots'
    /// products once the copies are in. Off, or over several rounds: each round's copies and
    /// products in turn, then the shared expert. The CPU's products meanwhile from the host
    /// copy, their rows copied into ys before the weighted sum; the parts' times teach the
    /// split (`CpuSplit`), read at the next read-back rather than waited for.
    /// `read_ahead` issues the next layer's guessed copies once this layer's GPU part is queued.
    #[allow(clippy::too_many_arguments)]
    fn experts_beside_cpu(
        &self,
        il: usize,
        w: &MoeLayer,
        x: In,
        kinds: &LayerKinds,
        n: usize,
        (rounds, jobs, xh): (&[experts::Round], &[(usize, usize)], &[f32]),
        read_ahead: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let (g, sc) = (&self.gpu, &self.sc);
        let Some(cache) = &self.expert_cache else { return Ok(()) };
        let pipe = &cache.pipe;
        pipe.t0.record(&g.stream)?;
        // the GPU's part: the shared expert and the routed slots but the CPU's; the copies'
        // count teaches the split
        let (shared, copies) = if pipe.takes(rounds) {
            // the held experts' products and the shared expert while the misses' copies run
            // on their own stream; both id tables written first, while the stream is drained
            // (pageable copies wait for it)
            let (held, fresh) = experts::Pipe::split(&rounds[0]);
            g.write_at(sc.ids.ptr, i32_bytes(&held.slot_ids))?;
            g.write_at(pipe.ids.ptr, i32_bytes(&fresh.slot_ids))?;
            cache.copy_up_beside(g, il, &w.experts, &fresh.loads)?;
            self.routed_products_at(w, x, kinds, n, sc.ids.ptr)?;
            let shared = self.shared_expert(w, x, kinds, n, Layout::Rows)?;
            cache.wait_copies(g)?;
            self.routed_products_at(w, x, kinds, n, pipe.ids.ptr)?;
            pipe.t1.record(&g.stream)?;
            (shared, fresh.loads.len())
        } else {
            let mut copies = 0;
            for r in rounds {
                self.expert_round(il, w, r)?;
                self.routed_products(w, x, kinds, n, true)?;
                copies += r.loads.len();
            }
            pipe.t1.record(&g.stream)?;
            // the shared expert needs no routed output: the GPU computes it while the CPU works
            (self.shared_expert(w, x, kinds, n, Layout::Rows)?, copies)
        };
        read_ahead()?;
        let t_cpu = self.cpu_experts(cache, il, jobs, xh)?;
        if pipe.on {
            cache.learn_later(jobs.len(), copies, t_cpu);
        } else {
            pipe.t1.synchronize()?;
            cache.learn(jobs.len(), copies, t_cpu, pipe.t0.elapsed_ms(&pipe.t1)? as f64 / 1e3);
        }
        self.combine(shared, n)
    }

    /// The CPU's `jobs` of layer `il` computed from the read-back rows `xh` and their outputs
    /// queued up into ys (none: nothing); the seconds the CPU took.
    fn cpu_experts(&self, cache: &ExpertCache, il: usize, jobs: &[(usize, usize)], xh: &[f32]) -> Result<f64> {
        if jobs.is_empty() {
            return Ok(0.0);
        }
        let start = std::time::Instant::now();
        let ys = cache.cpu_products(il, jobs, xh, self.d.n_used)?;
        let t_cpu = start.elapsed().as_secs_f64();
        cache.put_cpu_outputs(&self.gpu, jobs, &ys, self.d.hidden, self.sc.ys.ptr)?;
        Ok(t_cpu)
    }

    /// The shared expert, the routed slots' weighted sum (ys) and the residual.
    fn moe_sum(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, lay: Layout<'_>) -> Result<()> {
        let shared = self.shared_expert(w, x, kinds, n, lay)?;
        self.combine(shared, n)
    }

    /// The shared expert's output and its gate (addresses; 0: none), for `combine`.
    fn shared_expert(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, lay: Layout<'_>) -> Result<(u64, u64)> {
        let sc = &self.sc;
        let rows = lay.rows();
        let mut shared = 0u64;
        let mut sg = 0u64;
        if let Some(s) = &w.shared {
            self.glu(s, x, sc.sh_h.ptr, n, lay)?;
            let hin = self.input(sc.sh_h.ptr, s.down.cols, n, rows, kinds.shared_mid)?;
            self.proj(&s.down, hin, sc.sh_y.ptr, None, n, lay)?;
            shared = sc.sh_y.ptr;
            if let Some(gate) = &w.shared_gate {
                // a decode row's gate came with the router's product (proj_many above)
                if !rows {
                    self.proj(gate, x, sc.sg.ptr, None, n, lay)?;
                }
                sg = sc.sg.ptr;
            }
        }
        Ok((shared, sg))
    }

    /// x += Σ_s w_s·ys[s] (+ the gated shared expert's output), each decode row as alone.
    fn combine(&self, (shared, sg): (u64, u64), n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h) = (d.n_used, d.hidden);
        g.launch(
            "moe_combine",
            (h.div_ceil(256) as u32, n as u32),
            256,
            0,
            &[Arg::Ptr(sc.x.ptr), Arg::Ptr(sc.ys.ptr), Arg::Ptr(sc.weights.ptr), Arg::I32(k as i32), Arg::I32(h as i32), Arg::Ptr(shared), Arg::Ptr(sg)],
        )
    }

    /// Every routed (token, slot)'s expert products into ys (slots whose id is -1 skipped):
    /// grouped per expert on tensor cores for a prompt pass, else row by row — the bits
    /// moe_decode's fused launches give a decode row.
    fn routed_products(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, rows: bool) -> Result<()> {
        if self.grouped_experts(n, rows) {
            return self.experts_grouped(&w.experts, n);
        }
        self.routed_products_at(w, x, kinds, n, self.sc.ids.ptr)
    }

    /// The routed slots' products row by row, each slot's pool or expert number from `ids`
    /// (k a token; -1 skipped).
    fn routed_products_at(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, ids: u64) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h, eff) = (d.n_used, d.hidden, d.expert_ff);
        // a token's k slots read its row of xn
        mv_glu(g, &w.experts, Some(ids), x, h, k, sc.ffn_h.ptr, eff, n * k)?;
        let hin = self.input(sc.ffn_h.ptr, eff, n * k, true, kinds.ffn_mid)?;
        mv(g, &w.experts.down, Some(ids), hin, eff, 1, sc.ys.ptr, h, None, n * k)
    }

    /// A round of layer `il`'s cached experts: its missing experts copied into their pool
    /// slots, and the routed slots' pool numbers (-1: another round's) over the router's ids.
    fn expert_round(&self, il: usize, w: &MoeLayer, r: &experts::Round) -> Result<()> {
        let Some(cache) = &self.expert_cache else { return Ok(()) };
        // the ids first: a copy from pageable memory waits for the stream to drain, which it
        // has here (the router's picks were just read back) but would not after the copies
        self.gpu.write_at(self.sc.ids.ptr, i32_bytes(&r.slot_ids))?;
        cache.copy_up(&self.gpu, il, &w.experts, &r.loads).map(|_| ())
    }

    /// A decode batch's experts after routing (`n` rows): gate, up and SwiGLU of the k slots and
    /// of the shared expert, then every down product, the weighted sum and the residual in one
    /// launch (moe_down_combine: the bits of mv + mv + moe_combine).
    /// With `norm_after`, the norm after the layer applied to each row by the down launch's last
    /// block a row (`moe_down_combine_norm`): that norm's output.
    fn moe_decode(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, norm_after: Option<NextNorm>) -> Result<Option<In>> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h, eff) = (d.n_used, d.hidden, d.expert_ff);
        let ex = &w.experts;
        let (mut s_ptr, mut s_ty, mut s_cols, mut s_rb) = (0u64, 0i32, 0usize, 0usize);
        // with -DFUSE_MIDS=1 the gate/up launch quantizes its hidden rows itself
        let mut fused = None;
        match &w.shared {
            Some(s) => {
                (s_ptr, s_ty, s_cols, s_rb) = (s.down.ptr, s.down.ty, s.down.cols, s.down.row_bytes);
                fused = if g.knobs.fuse_mids { self.mids(kinds, s.down.cols, n) } else { None };
                self.moe_glu(ex, s, x, n, fused)?;
            }
            None => mv_glu(g, ex, Some(sc.ids.ptr), x, h, k, sc.ffn_h.ptr, eff, n * k)?,
        }
        let (hin, sin) = match fused {
            Some(m) => {
                let (hin, sin) = m.inputs(sc);
                (hin, Some(sin))
            }
            None => self.quant_hidden(w, kinds, n)?,
        };
        let sin = sin.unwrap_or(In { f: 0, q: Q8::default(), f16: 0 });
        let sg = if w.shared.is_some() && w.shared_gate.is_some() { sc.sg.ptr } else { 0 };
        let dm = &w.experts.down;
        // a block a row, a warp a slot's product (k routed, then the shared expert's)
        let warps = k + usize::from(s_ptr != 0);
        let mut args = vec![
            Arg::Ptr(dm.ptr),
            Arg::I32(dm.ty),
            Arg::I32(dm.rows as i32),
            Arg::I32(dm.cols as i32),
            Arg::I64(dm.row_bytes as i64),
            Arg::I64(dm.mat_bytes() as i64),
            Arg::Ptr(sc.ids.ptr),
            Arg::Ptr(sc.weights.ptr),
            Arg::I32(k as i32),
            Arg::Ptr(hin.f),
            Arg::Ptr(hin.q.qk),
            Arg::Ptr(hin.q.dk),
            Arg::Ptr(hin.q.qz),
            Arg::Ptr(hin.q.dz),
            Arg::Ptr(s_ptr),
            Arg::I32(s_ty),
            Arg::I32(s_cols as i32),
            Arg::I64(s_rb as i64),
            Arg::Ptr(sin.f),
            Arg::Ptr(sin.q.qk),
            Arg::Ptr(sin.q.dk),
            Arg::Ptr(sin.q.qz),
            Arg::Ptr(sin.q.dz),
            Arg::Ptr(sg),
            Arg::Ptr(sc.x.ptr),
        ];
        let (kernel, normed) = match norm_after {
            Some(next) => {
                // a row's counter a decode row (COUNT_NORM..)
                let (extra, xn) = self.norm_args(next, sc.counts.at(4 * COUNT_NORM));
                args.extend(extra);
                ("moe_down_combine_norm", Some(xn))
            }
            None => ("moe_down_combine", None),
        };
        g.launch(kernel, (dm.rows.div_ceil(g.knobs.moe_down_rows) as u32, n as u32), (32 * warps) as u32, 0, &args)?;
        Ok(normed)
    }

    /// Whether a decode batch of `n` rows takes its routed experts grouped per expert
    /// (`moe_decode_grouped`): from the knob's row count on, on one GPU's whole stacks (a VRAM
    /// cache's pool or a rank's block runs a slot at a time), where moe_sort's counts fit.
    fn group_decode_experts(&self, n: usize) -> bool {
        let rows = self.gpu.knobs.moe_group_rows;
        rows > 0 && n >= rows && self.expert_cache.is_none() && self.shard.is_none() && self.d.n_expert * 8 <= 48 << 10
    }

    /// A decode batch's experts after routing, grouped per expert: the slots sorted into tiles
    /// of one expert (`moe_sort`), each tile's gate, up and SwiGLU (`moe_glu_tiles`) and down
    /// products (`mv_tiles`) with the expert's weights loaded once for the tile, the shared
    /// expert's as a dense FFN of the batch (`glu`, then its down product), then the weighted
    /// sum and the residual (`combine`). Each slot's and row's bits are those `moe_decode`
    /// gives the row alone (its fused launches are the bits of mv + mv + moe_combine), so a
    /// decode batch's rows stay their own; the batch reads each expert once.
    fn moe_decode_grouped(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h) = (d.n_used, d.hidden);
        let ex = &w.experts;
        let tiles = self.moe_sort(n * k, g.knobs.moe_tile)?;
        let (eg, eu) = (&ex.gate, &ex.up);
        g.launch(
            "moe_glu_tiles",
            (eg.rows.div_ceil(2 * g.knobs.moe_glu_rows) as u32, tiles as u32),
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(eg.ptr),
                Arg::Ptr(eu.ptr),
                Arg::I32(eg.ty),
                Arg::I32(eu.ty),
                Arg::I32(eg.rows as i32),
                Arg::I64(eg.row_bytes as i64),
                Arg::I64(eu.row_bytes as i64),
                Arg::I64(eg.mat_bytes() as i64),
                Arg::I64(eu.mat_bytes() as i64),
                Arg::Ptr(sc.ex_tiles.ptr),
                Arg::Ptr(sc.ex_order.ptr),
                Arg::I32(k as i32),
                Arg::I32(h as i32),
                Arg::Ptr(x.f),
                Arg::Ptr(x.q.qk),
                Arg::Ptr(x.q.dk),
                Arg::Ptr(x.q.qz),
                Arg::Ptr(x.q.dz),
                Arg::Ptr(sc.ffn_h.ptr),
            ],
        )?;
        if let Some(s) = &w.shared {
            self.glu(s, x, sc.sh_h.ptr, n, Layout::Rows)?;
        }
        let (hin, sin) = self.quant_hidden(w, kinds, n)?;
        let dm = &ex.down;
        g.launch(
            "mv_tiles",
            (dm.rows.div_ceil(MV_WARPS) as u32, tiles as u32),
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(dm.ptr),
                Arg::I32(dm.ty),
                Arg::I32(dm.rows as i32),
                Arg::I32(dm.cols as i32),
                Arg::I64(dm.row_bytes as i64),
                Arg::I64(dm.mat_bytes() as i64),
                Arg::Ptr(sc.ex_tiles.ptr),
                Arg::Ptr(sc.ex_order.ptr),
                Arg::Ptr(hin.f),
                Arg::Ptr(hin.q.qk),
                Arg::Ptr(hin.q.dk),
                Arg::Ptr(hin.q.qz),
                Arg::Ptr(hin.q.dz),
                Arg::Ptr(sc.ys.ptr),
                Arg::I64(h as i64),
            ],
        )?;
        let mut shared = (0u64, 0u64);
        if let (Some(s), Some(sin)) = (&w.shared, sin) {
            self.proj(&s.down, sin, sc.sh_y.ptr, None, n, Layout::Rows)?;
            // the shared expert's gate came with the router's product (proj_many)
            shared = (sc.sh_y.ptr, if w.shared_gate.is_some() { sc.sg.ptr } else { 0 });
        }
        self.combine(shared, n)
    }

    /// A decode batch's expert hidden rows quantized for their down products: the routed slots'
    /// (ffn_h), and the shared expert's (sh_h, None without one) past them in their kind's
    /// scratch — one launch for both where each takes one q8 kind (`quant_mids`), else one each.
    fn quant_hidden(&self, w: &MoeLayer, kinds: &LayerKinds, n: usize) -> Result<(In, Option<In>)> {
        let (d, sc) = (&self.d, &self.sc);
        let (k, eff) = (d.n_used, d.expert_ff);
        let Some(s) = &w.shared else {
            return Ok((self.input(sc.ffn_h.ptr, eff, n * k, true, kinds.ffn_mid)?, None));
        };
        if let Some((hin, sin)) = self.quant_mids(kinds, s.down.cols, n)? {
            return Ok((hin, Some(sin)));
        }
        let hin = self.input(sc.ffn_h.ptr, eff, n * k, true, kinds.ffn_mid)?;
        // the shared expert's hidden rows go past the routed ones in the q8 scratch
        Ok((hin, Some(self.input_at(sc.sh_h.ptr, s.down.cols, kinds.shared_mid, n * k * eff, n)?)))
    }

    /// The routed experts' gate, up and SwiGLU (k slots a row into ffn_h) and the shared
    /// expert's (into sh_h) of a decode batch of `n` rows in one launch.
    /// With `mids`, the launch also quantizes those rows for the down products (the last block
    /// of each slot's row: quant_q8_2's bits), into where `mids` says.
    fn moe_glu(&self, ex: &Glu, s: &Glu, x: In, n: usize, mids: Option<Mids>) -> Result<()> {
        let (d, sc) = (&self.d, &self.sc);
        let m = mids.unwrap_or_default();
        let count = if mids.is_some() { sc.counts.at(4 * (COUNT_MIDS + self.decode_max)) } else { 0 };
        let (eg, eu, sg, su) = (&ex.gate, &ex.up, &s.gate, &s.up);
        self.gpu.launch_3d(
            "moe_glu",
            // two row groups a block of four warps: a warp a group's gate or up products
            (eg.rows.max(sg.rows).div_ceil(2 * self.gpu.knobs.moe_glu_rows) as u32, d.n_used as u32 + 1, n as u32),
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(eg.ptr),
                Arg::Ptr(eu.ptr),
                Arg::I32(eg.ty),
                Arg::I32(eu.ty),
                Arg::I32(eg.rows as i32),
                Arg::I64(eg.row_bytes as i64),
                Arg::I64(eu.row_bytes as i64),
                Arg::I64(eg.mat_bytes() as i64),
                Arg::I64(eu.mat_bytes() as i64),
                Arg::Ptr(sc.ids.ptr),
                Arg::I32(d.n_used as i32),
                Arg::Ptr(sg.ptr),
                Arg::Ptr(su.ptr),
                Arg::I32(sg.ty),
                Arg::I32(su.ty),
                Arg::I32(sg.rows as i32),
                Arg::I64(sg.row_bytes as i64),
                Arg::I64(su.row_bytes as i64),
                Arg::I32(eg.cols as i32),
                Arg::Ptr(x.f),
                Arg::Ptr(x.q.qk),
                Arg::Ptr(x.q.dk),
                Arg::Ptr(x.q.qz),
                Arg::Ptr(x.q.dz),
                Arg::Ptr(sc.ffn_h.ptr),
                Arg::Ptr(sc.sh_h.ptr),
                Arg::Ptr(count),
                Arg::I32(m.kind),
                Arg::Ptr(m.q),
                Arg::Ptr(m.d),
                Arg::I32(m.kind_s),
                Arg::Ptr(m.q_s),
                Arg::Ptr(m.d_s),
            ],
        )
    }

    /// A decode batch's experts' hidden rows and the shared expert's quantized for their down
    /// products in one launch (quant_q8_2), where each takes one q8 kind: the shared rows go
    /// after the n · k slots' rows in their kind's scratch. None where that does not hold.
    fn quant_mids(&self, kinds: &LayerKinds, s_cols: usize, n: usize) -> Result<Option<(In, In)>> {
        let (d, sc) = (&self.d, &self.sc);
        let (k, eff) = (d.n_used, d.expert_ff);
        let Some(m) = self.mids(kinds, s_cols, n) else { return Ok(None) };
        let per_block = 8; // warps of 256 threads, a q8 block each
        let blocks = (eff / m.width).max(s_cols / m.width_s).div_ceil(per_block);
        self.gpu.launch_3d(
            "quant_q8_2",
            (blocks as u32, k as u32 + 1, n as u32),
            256,
            0,
            &[
                Arg::Ptr(sc.ffn_h.ptr),
                Arg::I32(eff as i32),
                Arg::Ptr(m.q),
                Arg::Ptr(m.d),
                Arg::I32(m.kind),
                Arg::Ptr(sc.sh_h.ptr),
                Arg::I32(s_cols as i32),
                Arg::Ptr(m.q_s),
                Arg::Ptr(m.d_s),
                Arg::I32(m.kind_s),
            ],
        )?;
        Ok(Some(m.inputs(sc)))
    }

    /// Where a decode batch's experts' hidden rows and the shared expert's go quantized when
    /// each takes one q8 kind (`quant_mids`, or `moe_glu`'s fused quantization): the shared
    /// rows after the n · k slots' rows in their kind's scratch. None where that does not hold.
    fn mids(&self, kinds: &LayerKinds, s_cols: usize, n: usize) -> Option<Mids> {
        let (d, sc) = (&self.d, &self.sc);
        let (k, eff) = (d.n_used, d.expert_ff);
        // (kind, block width, scratch values, scratch scales)
        let one = |kd: Kinds| match (kd.k, kd.z) {
            (true, false) => Some((0, 256, sc.xq_b.ptr, sc.xd_b.ptr)),
            (false, true) => Some((1, 32, sc.xq_bz.ptr, sc.xd_bz.ptr)),
            _ => None,
        };
        let (Some((kind, width, q, dq)), Some((kind_s, width_s, q_s, d_s))) = (one(kinds.ffn_mid), one(kinds.shared_mid)) else {
            return None;
        };
        let off = n * k * eff;
        if eff % width != 0 || s_cols % width_s != 0 || off % width_s != 0 {
            return None;
        }
        Some(Mids { kind, width, q, d: dq, kind_s, width_s, q_s: q_s + off as u64, d_s: d_s + (off / 32 * 8) as u64 })
    }

    /// `n` rows of `cols` values at x quantized into the q8 scratch `offset` values in (past
    /// rows another input of the same product still holds there).
    fn input_at(&self, x: u64, cols: usize, kinds: Kinds, offset: usize, n: usize) -> Result<In> {
        let sc = &self.sc;
        let mut q = Q8::default();
        if kinds.k && cols % 256 == 0 && offset % 256 == 0 {
            let (xq, xd) = (sc.xq_b.ptr + offset as u64, sc.xd_b.ptr + (offset / 32 * 8) as u64);
            self.quant(x, cols, n, 0, xq, xd)?;
            (q.qk, q.dk) = (xq, xd);
        }
        if kinds.z && cols % 32 == 0 && offset % 32 == 0 {
            let (xq, xd) = (sc.xq_bz.ptr + offset as u64, sc.xd_bz.ptr + (offset / 32 * 8) as u64);
            self.quant(x, cols, n, 1, xq, xd)?;
            (q.qz, q.dz) = (xq, xd);
        }
        Ok(In { f: x, q, f16: 0 })
    }

    /// The routed slots (`slots` ids) sorted by expert into tiles of up to `tile` slots of one
    /// expert (ex_tiles: (expert, first, count); ex_order: the slots), on the device. Returns the
    /// tiles' count (the empty ones last).
    fn moe_sort(&self, slots: usize, tile: usize) -> Result<usize> {
        let (d, sc) = (&self.d, &self.sc);
        // a rank's stacks hold its block: ids index them (-1: another rank's, skipped)
        let n_expert = self.shard.as_ref().map_or(d.n_expert, |sh| sh.experts.len());
        let tiles = max_tiles(slots, n_expert, tile);
        self.gpu.launch(
            "moe_sort",
            (1, 1),
            1024,
            (n_expert * 8) as u32,
            &[
                Arg::Ptr(sc.ids.ptr),
                Arg::I32(slots as i32),
                Arg::I32(n_expert as i32),
                Arg::Ptr(sc.ex_counts.ptr),
                Arg::Ptr(sc.ex_offsets.ptr),
                Arg::Ptr(sc.ex_order.ptr),
                Arg::Ptr(sc.ex_tiles.ptr),
                Arg::I32(tiles as i32),
                Arg::I32(tile as i32),
            ],
        )?;
        Ok(tiles)
    }

    /// A prompt pass's routed experts grouped per expert: the slots sorted by expert into tiles
    /// of up to 16 (on the device, no host round trip), then gate, up and down products on
    /// tensor cores, each expert's weights read once a tile.
    fn experts_grouped(&self, ex: &Glu, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h, eff) = (d.n_used, d.hidden, d.expert_ff);
        let slots = n * k;
        let tiles = self.moe_sort(slots, EX_TILE)?;
        let product = |m: &DevMat, x: u64, x_stride: usize, x_div: usize, y: u64, y_stride: usize| {
            g.launch(
                "mm_ex",
                (m.rows.div_ceil(EX_ROWS) as u32, tiles as u32),
                128,
                0,
                &[
                    Arg::Ptr(m.ptr),
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
pub(super) struct Q8 {
    qk: u64,
    dk: u64,
    qz: u64,
    dz: u64,
}

/// A product's input: its f32 rows, their q8 copies for row-by-row products, and an f16 copy
/// where a cuBLAS pass made one (0 = none).
#[derive(Clone, Copy, Debug)]
pub(super) struct In {
    f: u64,
    q: Q8,
    f16: u64,
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
fn mv(g: &Gpu, w: &DevMat, ids: Option<u64>, x: In, x_stride: usize, x_div: usize, y: u64, y_stride: usize, res: Option<u64>, slots: usize) -> Result<()> {
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
fn mv_glu(g: &Gpu, w: &Glu, ids: Option<u64>, x: In, x_stride: usize, x_div: usize, h: u64, h_stride: usize, slots: usize) -> Result<()> {
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

/// Where a decode batch's experts' hidden rows go quantized (`CudaModel::mids`): the routed
/// slots' kind (0 q8_K, 1 q8_0), its block width and scratch, the shared expert's likewise.
#[derive(Clone, Copy, Default)]
struct Mids {
    kind: i32,
    width: usize,
    q: u64,
    d: u64,
    kind_s: i32,
    width_s: usize,
    q_s: u64,
    d_s: u64,
}

impl Mids {
    /// The down products' inputs: the routed slots' rows (ffn_h) and the shared expert's (sh_h).
    fn inputs(&self, sc: &Scratch) -> (In, In) {
        let q = |kind: i32, q: u64, dq: u64| if kind == 0 { Q8 { qk: q, dk: dq, qz: 0, dz: 0 } } else { Q8 { qk: 0, dk: 0, qz: q, dz: dq } };
        (In { f: sc.ffn_h.ptr, q: q(self.kind, self.q, self.d), f16: 0 }, In { f: sc.sh_h.ptr, q: q(self.kind_s, self.q_s, self.d_s), f16: 0 })
    }
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
