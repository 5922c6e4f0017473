//! Matrix × vector and matrix × matrix products on the worker pool.

use crate::dispatch::RowKernel;
use crate::q4k_repack::repacked_q8k;
use crate::{dispatch, quantize_activations_into, vec_dot_type, GgmlType, KernelError, Pool};

/// A row-major quantized matrix: `rows` rows of `cols` elements, each row `ty.row_bytes(cols)`.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl<'a> QMatrix<'a> {
    /// Checks that `data` holds exactly `rows` whole rows.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        if !crate::is_supported_weight(ty) {
            return Err(KernelError::Unsupported(ty));
        }
        let block = ty.block_size();
        if !cols.is_multiple_of(block) {
            return Err(KernelError::NotBlockMultiple { ty, n: cols, block });
        }
        let expected = rows * (cols / block * ty.type_size());
        if data.len() != expected {
            return Err(KernelError::LengthMismatch {
                ty,
                n: rows * cols,
                expected,
                got: data.len(),
            });
        }
        Ok(QMatrix {
            ty,
            rows,
            cols,
            data,
        })
    }

    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    fn validate(&self) {
        assert!(
            crate::is_supported_weight(self.ty),
            "unsupported weight type {}",
            self.ty
        );
        assert!(
            self.cols.is_multiple_of(self.ty.block_size()),
            "cols not a whole number of blocks"
        );
        assert!(
            self.data.len() >= self.rows * self.row_bytes(),
            "matrix data too short"
        );
    }
}

/// Bytes of one activation row for products with `w`.
pub fn act_row_bytes(w: &QMatrix) -> usize {
    let vd = vec_dot_type(w.ty);
    w.cols / vd.block_size() * vd.type_size()
}

/// Whether the token-lane prefill kernels (`simd::avx2_tok8`) may run: AVX2 or AVX-512 active.
#[cfg(target_arch = "x86_64")]
fn lane_kernels_active() -> bool {
    matches!(dispatch::active(), dispatch::Isa::Avx2 | dispatch::Isa::Avx512)
}

/// Quantize `n_tok` activation rows (x is n_tok × cols) for a product with `w` exactly as
/// llama.cpp's MUL_MAT would: per row with the matvec quantizer, except that when `w` is a
/// repacked Q4_K/Q2_K matrix the first n_tok - n_tok % 4 rows use the 4-row quantizer's
/// positive tie-break (repack.cpp:4700 forward_mul_mat). `out` is resized.
pub fn quantize_activations_for_matmul(w: &QMatrix, x: &[f32], n_tok: usize, out: &mut Vec<u8>) {
    let vd = vec_dot_type(w.ty);
    let arb = act_row_bytes(w);
    assert_eq!(x.len(), n_tok * w.cols, "x must be n_tok × cols");
    out.clear();
    out.resize(n_tok * arb, 0);
    let grouped = if repacked_q8k(w.ty, w.rows) {
        n_tok - n_tok % 4
    } else {
        0
    };
    for t in 0..n_tok {
        quantize_activations_into(
            vd,
            &x[t * w.cols..(t + 1) * w.cols],
            &mut out[t * arb..(t + 1) * arb],
            t < grouped,
        );
    }
}

#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);

/// A task's results for up to `OUT_TILE_ROWS` consecutive weight rows × every token. The
/// kernels deliver a row's results for 8 consecutive tokens at a time: held row-major they are
/// one contiguous store each, and the tile reaches y (tokens × rows) transposed, as contiguous
/// runs of a token's rows. Written straight into y, a row's results for 512 tokens land in 512
/// lines of 512 different pages (y's row stride is the matrix's row count × 4 bytes); written
/// token-major into the tile, in 512 lines of a 128 KB tile that L1 cannot hold (4% of a pp512).
#[cfg(target_arch = "x86_64")]
struct OutTile {
    vals: Vec<f32>,
    r0: usize,
    /// floats from one tile row to the next: n_tok plus one cache line, so the rows of a
    /// column (read together when copying out) fall in different L1 sets even when n_tok is a
    /// power of two
    stride: usize,
}

#[cfg(target_arch = "x86_64")]
const OUT_TILE_ROWS: usize = 64;

/// Q8_0 lane product: rows that take each token group in turn, so that the group's
/// interleaved activations (nb·256 bytes: 20 KB at 2560 columns) are read from L1 by all of
/// them rather than from L3 by each row (a 512-token prefill's are 1.3 MB in all).
#[cfg(target_arch = "x86_64")]
const Q8_SUB_ROWS: usize = 8;

/// Token groups from which the Q4_K lane product decodes a quad of rows once (`WideQuad`)
/// instead of per group.
#[cfg(target_arch = "x86_64")]
const WIDE_MIN_GROUPS: usize = 4;

#[cfg(target_arch = "x86_64")]
impl OutTile {
    /// Computes rows r0..r1 of y (n_tok tokens × `rows` columns) tile by tile: `f(tile, rs, re)`
    /// puts the results of rows rs..re (at most OUT_TILE_ROWS; rs - r0 a multiple of it), then
    /// the tile is copied into y.
    ///
    /// # Safety
    /// y (through `yp`) has `rows` columns and n_tok rows; rows r0..r1 belong to this task.
    unsafe fn for_rows(yp: SyncPtr, rows: usize, n_tok: usize, r0: usize, r1: usize, mut f: impl FnMut(&mut OutTile, usize, usize)) {
        let stride = n_tok + 16;
        let mut tile = OutTile { vals: crate::scratch::take_f32(OUT_TILE_ROWS * stride), r0, stride };
        for rs in (r0..r1).step_by(OUT_TILE_ROWS) {
            let re = (rs + OUT_TILE_ROWS).min(r1);
            tile.r0 = rs;
            f(&mut tile, rs, re);
            // column t of the tile is token t's run of rows rs..re in y: 8×8 blocks transposed
            // in registers, the edges one float at a time
            let (nr, src) = (re - rs, tile.vals.as_ptr());
            let (nr8, nt8) = (nr - nr % 8, n_tok - n_tok % 8);
            for t0 in (0..nt8).step_by(8) {
                for i0 in (0..nr8).step_by(8) {
                    // SAFETY: lane kernels run only with AVX2 active; the block lies inside
                    // the tile (nr rows of `stride`) and inside y's rows t0..t0+8.
                    crate::simd::avx2::transpose8x8(src.add(i0 * stride + t0), stride, yp.0.add(t0 * rows + rs + i0), rows);
                }
            }
            for t in 0..n_tok {
                let i_from = if t < nt8 { nr8 } else { 0 };
                for i in i_from..nr {
                    *yp.0.add(t * rows + rs + i) = *tile.vals.get_unchecked(i * stride + t);
                }
            }
        }
        crate::scratch::give_f32(tile.vals);
    }

    /// Row r's results for tokens t0..t0 + vals.len().
    #[inline]
    fn put(&mut self, r: usize, t0: usize, vals: &[f32]) {
        let at = (r - self.r0) * self.stride + t0;
        self.vals[at..at + vals.len()].copy_from_slice(vals);
    }
}

/// Decode-order tokens past a lane product's groups (`matvec_tokens_q`: a verify of 8 drafts is
/// 9 rows), computed with the one-token kernels — their bits — inside the lane tasks, on each
/// tile of weight rows while it is in cache, instead of a second job over every weight.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct RestTokens<'x> {
    /// Their quantized rows.
    xq: &'x [u8],
    n: usize,
    /// The first of them (the tile column they go to).
    at: usize,
    kernel: RowKernel,
}

#[cfg(target_arch = "x86_64")]
impl RestTokens<'_> {
    /// Tokens at..n_tok of `xq` (None when there are none).
    fn new<'x>(w: &QMatrix, xq: &'x [u8], at: usize, n_tok: usize) -> Option<RestTokens<'x>> {
        (n_tok > at).then(|| RestTokens {
            xq: &xq[at * act_row_bytes(w)..],
            n: n_tok - at,
            at,
            kernel: dispatch::row_kernel(w.ty, w.rows).expect("validated"),
        })
    }

    /// Their results for weight rows rs..re into `tile` (`buf`: the task's scratch for them).
    fn put(&self, w: &QMatrix, tile: &mut OutTile, rs: usize, re: usize, buf: &mut Vec<f32>) {
        buf.resize((re - rs) * self.n, 0.0);
        dot_rows_tokens(w, self.kernel, self.xq, self.n, rs, buf);
        for (i, vals) in buf.chunks_exact(self.n).enumerate() {
            tile.put(rs + i, self.at, vals);
        }
    }
}

/// Tokens a lane product computes: its own and any `RestTokens`.
#[cfg(target_arch = "x86_64")]
fn with_rest(done: usize, rest: &Option<RestTokens>) -> usize {
    done + rest.map_or(0, |r| r.n)
}

// SAFETY: tasks write disjoint elements through it.
unsafe impl Sync for SyncPtr {}
unsafe impl Send for SyncPtr {}

/// Rows per task: at least four tasks per thread so the dynamic scheduler can balance, and at
/// most 64 rows, which measured 1.2-1.3x faster than 128-512 at 8 threads on a 16-core Xeon
/// (docs/bench.md): many short interleaved streams keep more memory requests in flight.
fn row_chunk(rows: usize, n_threads: usize) -> usize {
    if n_threads <= 1 {
        return rows.max(1);
    }
    rows.div_ceil(n_threads * 4).clamp(8, 64)
}

/// Rows ahead of the one being multiplied whose bytes a matvec asks the cache to fetch, for
/// kernels that do not prefetch themselves (`RowKernel::prefetches`). A single core on this
/// class of machine streams only ~5-8 GB/s from DRAM on its own once the kernel's arithmetic
/// fills the out-of-order window; see docs/bench.md.
const PREFETCH_ROWS: usize = 4;

/// A matrix head requested at once: the kernels' own lookahead (`simd::avx2::PREFETCH_AHEAD`,
/// 16 KB) never covers it. Twice that measured faster than the lookahead alone (docs/bench.md
/// "Decode: a 32 KB matrix head": 13 of 18 alternated decode pairs, +3-4% median on both models; 64 KB no better).
const CHUNK_HEAD_BYTES: usize = 32 << 10;

/// y[i] = dot(row r0 + i of `w`, xq) for i < y.len(): the inner loop of every matrix × vector
/// product (`Pool::matvec_q`, the engine's batched decode jobs), one row at a time (one
/// sequential stream per thread). Kernels that do not prefetch inside their loop get a row
/// `PREFETCH_ROWS` ahead requested before each row.
pub fn dot_rows(w: &QMatrix, k: RowKernel, xq: &[u8], r0: usize, y: &mut [f32]) {
    let rb = w.row_bytes();
    if k.prefetches && r0 == 0 {
        // a prefetching kernel asks for lines PREFETCH_AHEAD past what it reads, so the head
        // of a matrix (cold in decode: each is read once per token) would come in by demand
        // misses; ask for it at once. Later runs of rows have their head prefetched by the
        // run before (measured: bursts at every run's head cost the 4B 1-6% of its decode;
        // the matrix head alone gained the 35B's many small experts 8-12%, docs/bench.md)
        prefetch_row(w.data, 0, (y.len() * rb).min(CHUNK_HEAD_BYTES));
    }
    for (i, yi) in y.iter_mut().enumerate() {
        let r = r0 + i;
        if !k.prefetches {
            prefetch_row(w.data, (r + PREFETCH_ROWS) * rb, rb);
        }
        *yi = (k.dot)(w.cols, &w.data[r * rb..(r + 1) * rb], xq);
    }
}

/// `dot_rows` for `n_tok` single-token activations at once (`xq` holds them back to back,
/// `act_row_bytes(w)` each): out[i * n_tok + t] = dot(row r0 + i of `w`, token t), every value
/// the bits `dot_rows` gives that token alone. Each weight row is read from memory once for
/// all tokens (the multi-token kernel decodes its blocks once; without one the row stays in L1
/// for the other tokens' dots), which is what lets several sequences' decode steps share one
/// pass over the weights. `out.len()` must be a multiple of `n_tok`.
pub fn dot_rows_tokens(w: &QMatrix, k: RowKernel, xq: &[u8], n_tok: usize, r0: usize, out: &mut [f32]) {
    assert!(n_tok > 0 && out.len().is_multiple_of(n_tok), "dot_rows_tokens: out must be rows × n_tok");
    let arb = act_row_bytes(w);
    assert!(xq.len() >= n_tok * arb, "dot_rows_tokens: activations too short");
    if n_tok == 1 {
        return dot_rows(w, k, xq, r0, out);
    }
    let rb = w.row_bytes();
    let n_rows = out.len() / n_tok;
    // the multi-token kernels do not prefetch inside their loop: request rows ahead here
    prefetch_row(w.data, r0 * rb, (PREFETCH_ROWS * rb).min(CHUNK_HEAD_BYTES));
    #[cfg(target_arch = "x86_64")]
    if k.q8_prepared {
        // the activation rows laid out once for every weight row of this task
        return Q8_PREPARED.with(|p| {
            let mut acts = p.borrow_mut();
            acts.fill(xq, n_tok, w.cols / 32);
            for i in 0..n_rows {
                let r = r0 + i;
                prefetch_row(w.data, (r + PREFETCH_ROWS) * rb, rb);
                crate::simd::avx512::q8_0_prepared(&w.data[r * rb..(r + 1) * rb], &acts, &mut out[i * n_tok..(i + 1) * n_tok]);
            }
        });
    }
    for i in 0..n_rows {
        let r = r0 + i;
        prefetch_row(w.data, (r + PREFETCH_ROWS) * rb, rb);
        let row = &w.data[r * rb..(r + 1) * rb];
        let y = &mut out[i * n_tok..(i + 1) * n_tok];
        match k.multi {
            Some(multi) => {
                let m = k.multi_rows;
                for (g, yg) in y.chunks_mut(m).enumerate() {
                    multi(w.cols, row, &xq[g * m * arb..], arb, yg);
                }
            }
            None => {
                for (t, yt) in y.iter_mut().enumerate() {
                    *yt = (k.dot)(w.cols, row, &xq[t * arb..(t + 1) * arb]);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// A thread's Q8_0 activation rows in `q8_0_prepared`'s layout (`dot_rows_tokens`), its
    /// buffers kept from task to task.
    static Q8_PREPARED: std::cell::RefCell<crate::simd::avx512::Q8Prepared> = Default::default();
}

/// Fewest Q8_0 tokens that `Pool::matvec_tokens_q` pads to a group of 8 lanes with AVX-512
/// VNNI: 6 at first; since the lane kernel lost its per-row compensation and prefetches a call
/// ahead, a padded group streams a 9216 × 2560 matrix in
/// 1.22–1.37 ms against 1.58 for 4 tokens on the per-row kernels, 1.21–1.50 against 1.80 for 5
/// (`examples/matmul_bench --decode`, 2 threads); at 3 the two are even (docs/bench.md
/// "4 and 5 Q8_0 rows padded to a lane group").
const Q8_PAD_MIN: usize = 4;

/// Whether `Pool::matvec_tokens_q` runs `n_tok` single-token products with a `ty` matrix on a
/// token-lane kernel (the lanes' own order, or one zero-padded Q8_0 group on AVX-512) rather
/// than the per-row kernels a batched `dot_rows_tokens` job would use.
pub fn tokens_on_lanes(ty: GgmlType, rows: usize, n_tok: usize) -> bool {
    lanes_keep_one_token_order(ty, rows, n_tok) || q8_0_padded(ty, n_tok)
}

/// 4 to 7 Q8_0 tokens padded to one group of 8 lanes on the VNNI lane kernel.
fn q8_0_padded(ty: GgmlType, n_tok: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        ty == GgmlType::Q8_0 && dispatch::active() == dispatch::Isa::Avx512 && n_tok >= Q8_PAD_MIN
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, n_tok);
        false
    }
}

/// Whether a product of `n_tok` tokens with a `ty` matrix of `rows` rows runs through a
/// token-lane kernel whose per-token results are the one-token (matvec) bits: Q8_0 in whole
/// groups of 8 (its lane kernel keeps vec_dot's order) and repacked Q4_K from
/// `q4k_lanes_min` tokens (the gemv-order lanes; MUL_MAT_ID's order), the tokens past the
/// lanes taking the one-token kernels. Other types' batched orders differ from their one-token order (tinyBLAS, tiled).
pub fn lanes_keep_one_token_order(ty: GgmlType, rows: usize, n_tok: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        lane_kernels_active()
            && match ty {
                GgmlType::Q8_0 => n_tok >= crate::simd::avx2_tok8::TOK,
                GgmlType::Q4_K => crate::q4k_repack::repacked(rows) && n_tok >= q4k_lanes_min(),
                _ => false,
            }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, rows, n_tok);
        false
    }
}

/// Fewest tokens a repacked Q4_K product (or its last group) takes to the token-lane kernels:
/// from 2 where AVX-512 VNNI runs the 16-row kernel (`avx512_tok8::rows16_vnni` computes only
/// the real tokens: 1.4x the per-row kernels at 2 tokens in cache, 1.8x at 3; once it
/// prefetched the next call's rows it also streams cold weights as well as they do, and 4B
/// decode of 2 sequences went +10% — it was 0.95x with the kernel's old prefetch), else from 4
/// (the 8-lane kernels compute padded lanes too).
#[cfg(target_arch = "x86_64")]
fn q4k_lanes_min() -> usize {
    if dispatch::active() == dispatch::Isa::Avx512 {
        2
    } else {
        4
    }
}

/// Software prefetch of `len` bytes of `data` from `off` (clamped to the slice).
#[inline(always)]
fn prefetch_row(data: &[u8], off: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = (off + len).min(data.len());
        let mut o = off;
        while o < end {
            // SAFETY: o < data.len(); prefetch has no architectural effect.
            unsafe {
                std::arch::x86_64::_mm_prefetch(data.as_ptr().add(o) as *const i8, std::arch::x86_64::_MM_HINT_T0)
            };
            o += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, off, len);
}

/// Activations of a Q4_K lane product (`simd::avx2_tok8::Act8`), laid out once and reusable by
/// every matrix of the same type and width that takes the same tokens (an expert's gate and up).
#[cfg(target_arch = "x86_64")]
struct Q4kLanes {
    act: crate::simd::avx2_tok8::Act8,
    groups: usize,
    /// tokens computed by the lanes (the rest take the per-row kernels)
    n_valid: usize,
    gemm: bool,
}

#[cfg(target_arch = "x86_64")]
impl Q4kLanes {
    /// None where the lane kernel does not apply to `w` (type, row count, ISA, < 4 tokens).
    fn build(w: &QMatrix, xq: &[u8], n_tok: usize, grouped: usize) -> Option<Q4kLanes> {
        use crate::simd::avx2_tok8::{Act8, TOK};
        let applies = w.ty == GgmlType::Q4_K && crate::q4k_repack::repacked(w.rows) && lane_kernels_active();
        let gemm = grouped > 0;
        // tokens of one order: the 4-token groups (gemm) or, with none, every token (gemv)
        let n_same = if gemm { grouped } else { n_tok };
        // a last partial group of 4+ tokens runs padded with zero lanes (faster than the per-row
        // kernel for them, e.g. the routed experts' ~16 tokens each at pp512)
        let groups = n_same / TOK + usize::from(n_same % TOK >= q4k_lanes_min());
        let n_valid = (groups * TOK).min(n_same);
        if !applies || groups == 0 {
            return None;
        }
        let mut act = Act8::default();
        act.build(xq, act_row_bytes(w), w.cols / 256, groups, n_valid);
        Some(Q4kLanes { act, groups, n_valid, gemm })
    }
}

/// Q8_0 rows the VNNI token-lane kernel takes at once (each activation load serves them all).
#[cfg(target_arch = "x86_64")]
const Q8_VNNI_ROWS: usize = 4;

/// Tokens per tile in `matmul`: one weight row is read from memory once per tile.
const TOKEN_TILE: usize = 32;

impl Pool {
    /// y[r] = w_r · x for every row r; x is quantized once to the vec_dot type (into a buffer
    /// the pool reuses), rows are split across threads.
    pub fn matvec(&self, w: QMatrix, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), w.cols, "matvec: x.len() != cols");
        let mut buf = self.act_buf.lock().unwrap_or_else(|e| e.into_inner());
        let vd = vec_dot_type(w.ty);
        buf.clear();
        buf.resize(act_row_bytes(&w), 0);
        quantize_activations_into(vd, x, &mut buf, false);
        self.matvec_q(w, &buf, y);
    }

    /// matvec with activations already quantized by `quantize_activations(w.ty, ..)`.
    pub fn matvec_q(&self, w: QMatrix, xq: &[u8], y: &mut [f32]) {
        w.validate();
        assert_eq!(y.len(), w.rows, "matvec: y.len() != rows");
        assert!(
            xq.len() >= act_row_bytes(&w),
            "matvec: activations too short"
        );
        let kern = dispatch::row_kernel(w.ty, w.rows).expect("validated");
        let chunk = row_chunk(w.rows, self.n_threads());
        let n_tasks = w.rows.div_ceil(chunk);
        let yp = SyncPtr(y.as_mut_ptr());
        self.run(n_tasks, &|t| {
            let r0 = t * chunk;
            let r1 = (r0 + chunk).min(w.rows);
            #[allow(clippy::redundant_locals)] // capture the Sync wrapper, not its raw field
            let yp = yp;
            // SAFETY: rows r0..r1 < y.len() belong to this task alone.
            let y = unsafe { std::slice::from_raw_parts_mut(yp.0.add(r0), r1 - r0) };
            dot_rows(&w, kern, xq, r0, y);
        });
    }

    /// Batched product: x is n_tok × cols row-major, y is n_tok × rows row-major. Activations are
    /// quantized once (as llama.cpp's MUL_MAT does, see `quantize_activations_for_matmul`) and
    /// reused across rows; work is tiled so each weight row is read once per tile of tokens.
    pub fn matmul(&self, w: QMatrix, x: &[f32], n_tok: usize, y: &mut [f32]) {
        w.validate();
        assert_eq!(x.len(), n_tok * w.cols, "matmul: x must be n_tok × cols");
        assert_eq!(y.len(), n_tok * w.rows, "matmul: y must be n_tok × rows");
        if n_tok == 0 {
            return;
        }
        let mut buf = self.act_buf.lock().unwrap_or_else(|e| e.into_inner());
        quantize_activations_for_matmul(&w, x, n_tok, &mut buf);
        self.matmul_q(w, &buf, n_tok, y);
    }

    /// matmul with activations already quantized by `quantize_activations_for_matmul`
    /// (n_tok rows of `act_row_bytes`); per token in the float order llama.cpp's MUL_MAT uses
    /// for it (4-token groups, then single tokens; the tiled order of `crate::tiled` for plain
    /// K-quant matrices once n_tok >= 8).
    pub fn matmul_q(&self, w: QMatrix, xq: &[u8], n_tok: usize, y: &mut [f32]) {
        let grouped = if repacked_q8k(w.ty, w.rows) { n_tok - n_tok % 4 } else { 0 };
        self.matmul_q_grouped(w, xq, n_tok, grouped, y);
    }

    /// matmul_q for llama.cpp's MUL_MAT_ID (expert) semantics: every token is its own
    /// single-token product, its activations quantized by `quantize_activations`, except that
    /// an expert with 8 or more tokens takes the tiled order where `crate::tiled` applies.
    ///
    /// F32, F16 and BF16 experts are the exception to "the tiled or tinyBLAS order for 2+
    /// tokens": ggml-cpu's MUL_MAT_ID never calls llamafile's sgemm, it takes `vec_dot` one token
    /// column at a time (ggml-cpu.c `ggml_compute_forward_mul_mat_id_one_chunk`), so every token
    /// keeps ggml_vec_dot_f32's / _f16's / _bf16's one-token order however many share the expert.
    /// So are IQ4_NL experts llama.cpp did not repack (tinyBLAS's order is not vec_dot's there).
    pub fn matmul_q_id(&self, w: QMatrix, xq: &[u8], n_tok: usize, y: &mut [f32]) {
        let iq4_nl_vec_dot = w.ty == GgmlType::IQ4_NL && !crate::q4k_repack::repacked_q8_0(w.ty, w.rows);
        if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) || iq4_nl_vec_dot {
            self.matvec_tokens_q(w, xq, n_tok, y);
            return;
        }
        self.matmul_q_grouped(w, xq, n_tok, 0, y);
    }

    /// `matmul_q_id` of several matrices of one type and width with the same activations (a
    /// routed expert's gate and up): ys[i] = ws[i] × xq, with the lane kernels' activation
    /// layout built once for all of them.
    pub fn matmul_q_id_shared(&self, ws: &[QMatrix], xq: &[u8], n_tok: usize, ys: &mut [&mut [f32]]) {
        assert_eq!(ws.len(), ys.len(), "matmul_q_id_shared: one output per matrix");
        let Some(w0) = ws.first() else { return };
        assert!(ws.iter().all(|w| w.ty == w0.ty && w.cols == w0.cols), "matmul_q_id_shared: matrices differ in type or width");
        #[cfg(target_arch = "x86_64")]
        if ws.iter().all(|w| w.rows == w0.rows) {
            if let Some(lanes) = Q4kLanes::build(w0, xq, n_tok, 0) {
                for (w, y) in ws.iter().zip(ys.iter_mut()) {
                    assert_eq!(y.len(), n_tok * w.rows, "matmul: y must be n_tok × rows");
                    self.run_q4k_lanes(*w, &lanes, None, y);
                    self.matmul_q_rest(*w, xq, n_tok, lanes.n_valid, 0, y);
                }
                return;
            }
        }
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            self.matmul_q_id(*w, xq, n_tok, y);
        }
    }

    /// `n_tok` single-token products with one matrix (`xq`: the tokens' activations quantized
    /// one by one with `quantize_activations`, back to back; y token-major n_tok × rows): every
    /// token the bits `matvec` gives it alone, the weights read once for all of them. Several
    /// sequences' decode rows go through here; where `lanes_keep_one_token_order` holds, the
    /// token-lane kernels (8 tokens in the vector lanes, each lane's integer sums exact and its
    /// float epilogue the one-token order) do the arithmetic, else `dot_rows_tokens`.
    pub fn matvec_tokens_q(&self, w: QMatrix, xq: &[u8], n_tok: usize, y: &mut [f32]) {
        w.validate();
        assert_eq!(y.len(), n_tok * w.rows, "matvec_tokens: y must be n_tok × rows");
        assert!(xq.len() >= n_tok * act_row_bytes(&w), "matvec_tokens: activations too short");
        if n_tok == 0 {
            return;
        }
        if lanes_keep_one_token_order(w.ty, w.rows, n_tok) {
            // Q8_0: the tokens past the last whole group of 8 take the one-token kernels on
            // the same pass over the weights (a verify of 8 drafts is 9 rows: its ninth read
            // every weight again in a job of its own)
            #[cfg(target_arch = "x86_64")]
            if w.ty == GgmlType::Q8_0 && self.matmul_q8_0_tok8(w, xq, n_tok, true, y) == n_tok {
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if let Some(lanes) = Q4kLanes::build(&w, xq, n_tok, 0) {
                return self.run_q4k_lanes(w, &lanes, Some(xq), y);
            }
            return self.matmul_q_grouped(w, xq, n_tok, 0, y);
        }
        // 4 to 7 Q8_0 tokens: one padded group of 8 lanes (zero rows: zero scales, so zero
        // lanes, never stored past n_tok) on the VNNI lane kernel costs less than the per-row
        // kernels (`Q8_PAD_MIN`)
        #[cfg(target_arch = "x86_64")]
        if q8_0_padded(w.ty, n_tok) {
            let arb = act_row_bytes(&w);
            let n_pad = n_tok.next_multiple_of(crate::simd::avx2_tok8::TOK);
            let mut xp = xq[..n_tok * arb].to_vec();
            xp.resize(n_pad * arb, 0);
            let mut yp = vec![0.0f32; n_pad * w.rows];
            self.matmul_q_grouped(w, &xp, n_pad, 0, &mut yp);
            y.copy_from_slice(&yp[..n_tok * w.rows]);
            return;
        }
        let kern = dispatch::row_kernel(w.ty, w.rows).expect("validated");
        let chunk = row_chunk(w.rows, self.n_threads());
        let n_tasks = w.rows.div_ceil(chunk);
        let yp = SyncPtr(y.as_mut_ptr());
        let rows = w.rows;
        self.run(n_tasks, &|t| {
            #[allow(clippy::redundant_locals)] // capture the Sync wrapper, not its raw field
            let yp = yp;
            let (r0, r1) = (t * chunk, ((t + 1) * chunk).min(rows));
            let mut tile = crate::scratch::take_f32((r1 - r0) * n_tok);
            dot_rows_tokens(&w, kern, xq, n_tok, r0, &mut tile);
            for tok in 0..n_tok {
                for (i, r) in (r0..r1).enumerate() {
                    // SAFETY: rows r0..r1 of every token belong to this task alone.
                    unsafe { *yp.0.add(tok * rows + r) = tile[i * n_tok + tok] };
                }
            }
            crate::scratch::give_f32(tile);
        });
    }

    /// Tokens below `grouped` (a multiple of 4) take the 4-token-group kernels.
    fn matmul_q_grouped(&self, w: QMatrix, xq: &[u8], n_tok: usize, grouped: usize, y: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if self.matmul_f32_blocked(w, xq, n_tok, y) {
                return;
            }
            let done = if w.ty == GgmlType::Q8_0 {
                self.matmul_q8_0_tok8(w, xq, n_tok, false, y)
            } else {
                self.matmul_q4k_tok8(w, xq, n_tok, grouped, y)
            };
            if done > 0 {
                self.matmul_q_rest(w, xq, n_tok, done, grouped, y);
                return;
            }
        }
        self.matmul_q_plain(w, xq, n_tok, grouped, y)
    }

    /// Tokens done..n_tok of a product whose first `done` tokens a lane kernel computed, by
    /// the per-row kernels (the 4-token-group order below `grouped`).
    fn matmul_q_rest(&self, w: QMatrix, xq: &[u8], n_tok: usize, done: usize, grouped: usize, y: &mut [f32]) {
        if done < n_tok {
            let arb = act_row_bytes(&w);
            self.matmul_q_plain(w, &xq[done * arb..], n_tok - done, grouped.saturating_sub(done), &mut y[done * w.rows..]);
        }
    }

    /// Repacked Q4_K (the bulk of prefill: dense FFN, routed experts) in whole groups of 8
    /// tokens of one order (gemm below `grouped`, gemv when nothing is grouped) through the
    /// token-lane kernel (`simd::avx2_tok8`); returns how many leading tokens it computed
    /// (0 when it does not apply).
    #[cfg(target_arch = "x86_64")]
    fn matmul_q4k_tok8(&self, w: QMatrix, xq: &[u8], n_tok: usize, grouped: usize, y: &mut [f32]) -> usize {
        match Q4kLanes::build(&w, xq, n_tok, grouped) {
            Some(lanes) => {
                self.run_q4k_lanes(w, &lanes, None, y);
                lanes.n_valid
            }
            None => 0,
        }
    }

    /// The lane product of `w` with activations laid out by `Q4kLanes::build` (for a matrix
    /// of w's type and width): tokens 0..lanes.n_valid of y. With `one_token_rest` (the
    /// tokens' quantized rows, decode-order rows only: `matvec_tokens_q`) the tokens past
    /// n_valid take `dot_rows_tokens` — the one-token bits — in the same tasks, each tile of
    /// weight rows while it is in cache: all of y's tokens.
    #[cfg(target_arch = "x86_64")]
    fn run_q4k_lanes(&self, w: QMatrix, lanes: &Q4kLanes, one_token_rest: Option<&[u8]>, y: &mut [f32]) {
        use crate::simd::avx2_tok8::{rows4, WideQuad, ROWS, TOK};
        use crate::simd::avx512_tok8::ROWS16;
        w.validate();
        let Q4kLanes { ref act, groups, n_valid, gemm } = *lanes;
        let nb = w.cols / 256;
        let row_groups = w.rows / ROWS;
        // Decode each quad once when enough token groups reuse it (dense prefill); routed experts
        // (~2 groups each) read the codes straight from the blocks.
        let wide = groups >= WIDE_MIN_GROUPS;
        let vnni = dispatch::active() == dispatch::Isa::Avx512;
        // one task per run of row quads, all token groups inside it: each quad's weights stay in
        // L1 while every group streams past them
        let chunk = row_chunk(row_groups, self.n_threads()).div_ceil(4).max(1);
        // the 16-row kernel (cold weights, not decoded once) takes runs of 4 quads: a task's
        // rows start on a multiple of 16 so that its tiles (OUT_TILE_ROWS) hold whole runs
        let rows16 = vnni && !wide;
        let chunk = if rows16 { chunk.next_multiple_of(ROWS16 / ROWS) } else { chunk };
        let n_row_chunks = row_groups.div_ceil(chunk);
        let yp = SyncPtr(y.as_mut_ptr());
        let (rb, rows) = (w.row_bytes(), w.rows);
        let rest = one_token_rest.and_then(|xq| RestTokens::new(&w, xq, n_valid, y.len() / rows));
        self.run(n_row_chunks, &|rc| {
            #[allow(clippy::redundant_locals)] // capture the Sync wrapper, not its raw field
            let yp = yp;
            let (q0, q1) = (rc * chunk, ((rc + 1) * chunk).min(row_groups));
            let mut out = [[0f32; TOK]; ROWS];
            let mut wq = WideQuad::default();
            let mut out16 = [[0f32; TOK]; ROWS16];
            let mut rest_buf = Vec::new();
            let quads = |tile: &mut OutTile, rs: usize, re: usize| {
                if let Some(r) = &rest {
                    r.put(&w, tile, rs, re, &mut rest_buf);
                }
                let mut rs = rs;
                while rows16 && rs + ROWS16 <= re {
                    let wr = &w.data[rs * rb..(rs + ROWS16) * rb];
                    let after = (rs + ROWS16) * rb;
                    let next = if rs + 2 * ROWS16 <= q1 * ROWS { &w.data[after..after + ROWS16 * rb] } else { &[][..] };
                    for g in 0..groups {
                        let next = if g == 0 { next } else { &[][..] };
                        let lanes = TOK.min(n_valid - g * TOK);
                        // SAFETY: AVX-512 VNNI is the active set; wr holds 16 rows (whose starts
                        // are < 2^31 bytes apart: a row is at most a few hundred KB) and act
                        // `groups` groups of nb blocks.
                        unsafe {
                            use crate::simd::avx512_tok8::rows16_vnni;
                            if gemm {
                                rows16_vnni::<true>(wr, rb, next, act, g, lanes, &mut out16)
                            } else {
                                rows16_vnni::<false>(wr, rb, next, act, g, lanes, &mut out16)
                            }
                        }
                        for (r, o) in out16.iter().enumerate() {
                            tile.put(rs + r, g * TOK, &o[..lanes]);
                        }
                    }
                    rs += ROWS16;
                }
                for q in rs / ROWS..re / ROWS {
                    let r0 = q * ROWS;
                    let wr = &w.data[r0 * rb..(r0 + ROWS) * rb];
                    if wide {
                        // SAFETY: AVX2/FMA/F16C checked above; wr holds ROWS rows.
                        unsafe { wq.fill(wr, rb, nb) };
                    }
                    // the next quad's weights, fetched while the first group computes this one
                    // (cold weights: experts; dense quads are decoded once by `wq.fill`)
                    let next = if !wide && q + 1 < q1 { &w.data[(r0 + ROWS) * rb..(r0 + 2 * ROWS) * rb] } else { &[][..] };
                    for g in 0..groups {
                        let next = if g == 0 { next } else { &[][..] };
                        // SAFETY: AVX2/FMA/F16C checked above (active set); wr holds ROWS rows
                        // and act `groups` groups of nb blocks; wq holds wr's rows when `wide`.
                        unsafe {
                            use crate::simd::avx512_tok8::rows4_vnni;
                            match (vnni, gemm, wide) {
                                (false, true, true) => rows4::<true, true>(wr, rb, &wq, next, act, g, &mut out),
                                (false, true, false) => rows4::<true, false>(wr, rb, &wq, next, act, g, &mut out),
                                (false, false, true) => rows4::<false, true>(wr, rb, &wq, next, act, g, &mut out),
                                (false, false, false) => rows4::<false, false>(wr, rb, &wq, next, act, g, &mut out),
                                // the VNNI twins (the same bits) where AVX-512 is the active set
                                (true, true, true) => rows4_vnni::<true, true>(wr, rb, &wq, next, act, g, &mut out),
                                (true, true, false) => rows4_vnni::<true, false>(wr, rb, &wq, next, act, g, &mut out),
                                (true, false, true) => rows4_vnni::<false, true>(wr, rb, &wq, next, act, g, &mut out),
                                (true, false, false) => rows4_vnni::<false, false>(wr, rb, &wq, next, act, g, &mut out),
                            }
                        }
                        let lanes = TOK.min(n_valid - g * TOK);
                        for (r, o) in out.iter().enumerate() {
                            tile.put(r0 + r, g * TOK, &o[..lanes]);
                        }
                    }
                }
            };
            // SAFETY: rows q0·ROWS..q1·ROWS of tokens 0..n_valid and the rest belong to this
            // task; OUT_TILE_ROWS is a multiple of ROWS, so every tile holds whole quads.
            unsafe { OutTile::for_rows(yp, rows, with_rest(n_valid, &rest), q0 * ROWS, q1 * ROWS, quads) };
        });
    }

    /// F32 weights (the MoE routers) against 2+ tokens, `F32_BLOCK_ROWS` rows × `F32_BLOCK_TOKENS`
    /// tokens per kernel call, each output in `dot_f32`'s order; returns false where that kernel
    /// is not the one `matmul_q_plain` would use (another ISA, k % 8 != 0, one token).
    #[cfg(target_arch = "x86_64")]
    fn matmul_f32_blocked(&self, w: QMatrix, xq: &[u8], n_tok: usize, y: &mut [f32]) -> bool {
        use crate::simd::avx2::{f32_block, F32_BLOCK_ROWS as R, F32_BLOCK_TOKENS as T};
        // tinyBLAS's order, which it uses only for a row count that is a multiple of 4
        if w.ty != GgmlType::F32 || n_tok < 2 || !w.cols.is_multiple_of(8) || !w.rows.is_multiple_of(4) || dispatch::active() != dispatch::Isa::Avx2 {
            return false;
        }
        w.validate();
        assert_eq!(y.len(), n_tok * w.rows, "matmul: y must be n_tok × rows");
        assert!(xq.len() >= n_tok * w.cols * 4, "matmul: activations too short");
        let (rows, cols) = (w.rows, w.cols);
        let chunk = row_chunk(rows, self.n_threads()).next_multiple_of(R);
        let n_row_chunks = rows.div_ceil(chunk);
        let yp = SyncPtr(y.as_mut_ptr());
        self.run(n_row_chunks, &|rc| {
            #[allow(clippy::redundant_locals)] // capture the Sync wrapper, not its raw field
            let yp = yp;
            let (wp, ap) = (w.data.as_ptr() as *const f32, xq.as_ptr() as *const f32);
            let (r0, r1) = (rc * chunk, ((rc + 1) * chunk).min(rows));
            // SAFETY: AVX2/FMA active; rows r0..r1 < rows and tokens < n_tok are in bounds of
            // w and xq (validated above); cols % 8 == 0; (t, r) for r in r0..r1 belong to
            // this task alone.
            unsafe {
                let put = |r: usize, t: usize, v: f32| *yp.0.add(t * rows + r) = v;
                let mut r = r0;
                while r < r1 {
                    let nr = if r + R <= r1 { R } else { 1 };
                    let mut t = 0;
                    while t < n_tok {
                        let wr = wp.add(r * cols);
                        let at = ap.add(t * cols);
                        if nr == R && t + T <= n_tok {
                            let mut out = [[0f32; T]; R];
                            f32_block::<R, T>(cols, wr, cols, at, cols, &mut out);
                            for (i, o) in out.iter().enumerate() {
                                for (j, &v) in o.iter().enumerate() {
                                    put(r + i, t + j, v);
                                }
                            }
                            t += T;
                        } else {
                            for i in 0..nr {
                                let mut out = [[0f32; 1]; 1];
                                f32_block::<1, 1>(cols, wr.add(i * cols), cols, at, cols, &mut out);
                                put(r + i, t, out[0][0]);
                            }
                            t += 1;
                        }
                    }
                    r += nr;
                }
            }
        });
        true
    }

    /// Q8_0 (attention, DeltaNet and shared-expert matrices) in whole groups of 8 tokens through
    /// the token-lane kernel; returns how many leading tokens it computed (0: not applicable).
    /// With `one_token_rest` (decode-order rows only: `matvec_tokens_q`) the tokens past the
    /// last whole group take `dot_rows_tokens` — the one-token bits — in the same tasks, on each
    /// tile of weight rows while it is in cache, and every token is computed.
    #[cfg(target_arch = "x86_64")]
    fn matmul_q8_0_tok8(&self, w: QMatrix, xq: &[u8], n_tok: usize, one_token_rest: bool, y: &mut [f32]) -> usize {
        use crate::simd::avx2_tok8::{abs_codes_q8_0, row_q8_0, Act8Q8, TOK};
        let groups = n_tok / TOK;
        if !lane_kernels_active() || groups == 0 {
            return 0;
        }
        w.validate();
        let arb = act_row_bytes(&w);
        let nb = w.cols / 32;
        let mut act = Act8Q8::default();
        // the VNNI twin of the lane kernel (the same bits) where AVX-512 is the active set,
        // with its own layout of the activations
        let vnni = dispatch::active() == dispatch::Isa::Avx512;
        if vnni {
            act.build_vnni(xq, arb, nb, groups);
        } else {
            act.build(xq, arb, nb, groups);
        }
        let chunk = row_chunk(w.rows, self.n_threads());
        let n_row_chunks = w.rows.div_ceil(chunk);
        let yp = SyncPtr(y.as_mut_ptr());
        let (rb, rows) = (w.row_bytes(), w.rows);
        let act = &act;
        let done = groups * TOK;
        let rest = if one_token_rest { RestTokens::new(&w, xq, done, n_tok) } else { None };
        self.run(n_row_chunks, &|rc| {
            #[allow(clippy::redundant_locals)] // capture the Sync wrapper, not its raw field
            let yp = yp;
            let (r0, r1) = (rc * chunk, ((rc + 1) * chunk).min(rows));
            let mut out = [0f32; TOK];
            // |x| of the rows, for the AVX2 kernel only
            let mut ax = if vnni { Vec::new() } else { vec![0u8; Q8_SUB_ROWS * nb * 32] };
            let mut rest_buf = Vec::new();
            let each_row = |tile: &mut OutTile, rs: usize, re: usize| {
                if let Some(r) = &rest {
                    r.put(&w, tile, rs, re, &mut rest_buf);
                }
                if vnni {
                    use crate::simd::avx512_tok8::{row_q8_0_vnni, rows_q8_0_vnni};
                    const R: usize = Q8_VNNI_ROWS;
                    let row = |r: usize| &w.data[r * rb..(r + 1) * rb];
                    let mut r = rs;
                    // R rows share each activation load; the rest one at a time
                    while r + R <= re {
                        let ws: [&[u8]; R] = std::array::from_fn(|j| row(r + j));
                        let mut outs = [[0f32; TOK]; R];
                        for g in 0..groups {
                            // SAFETY: AVX-512 VNNI is the active set; each row holds nb blocks,
                            // act `groups` groups with the offset codes built.
                            unsafe { rows_q8_0_vnni::<R>(ws, act, g, &mut outs) };
                            for (j, o) in outs.iter().enumerate() {
                                tile.put(r + j, g * TOK, o);
                            }
                        }
                        r += R;
                    }
                    for r in r..re {
                        for g in 0..groups {
                            // SAFETY: as above.
                            unsafe { row_q8_0_vnni(row(r), act, g, &mut out) };
                            tile.put(r, g * TOK, &out);
                        }
                    }
                    return;
                }
                for s0 in (rs..re).step_by(Q8_SUB_ROWS) {
                    let s1 = (s0 + Q8_SUB_ROWS).min(re);
                    for (r, axr) in (s0..s1).zip(ax.chunks_exact_mut(nb * 32)) {
                        // SAFETY: AVX2 checked above (active set); a row is nb whole blocks.
                        unsafe { abs_codes_q8_0(&w.data[r * rb..(r + 1) * rb], axr) };
                    }
                    for g in 0..groups {
                        for (r, axr) in (s0..s1).zip(ax.chunks_exact(nb * 32)) {
                            let wr = &w.data[r * rb..(r + 1) * rb];
                            // SAFETY: AVX2/FMA/F16C checked above (active set); wr and axr
                            // hold nb blocks, act `groups` groups.
                            unsafe { row_q8_0(wr, axr, act, g, &mut out) };
                            tile.put(r, g * TOK, &out);
                        }
                    }
                }
            };
            // SAFETY: rows r0..r1 of tokens 0..done and the rest belong to this task.
            unsafe { OutTile::for_rows(yp, rows, with_rest(done, &rest), r0, r1, each_row) };
        });
        with_rest(done, &rest)
    }

    fn matmul_q_plain(&self, w: QMatrix, xq: &[u8], n_tok: usize, grouped: usize, y: &mut [f32]) {
        w.validate();
        assert_eq!(y.len(), n_tok * w.rows, "matmul: y must be n_tok × rows");
        let arb = act_row_bytes(&w);
        assert!(xq.len() >= n_tok * arb, "matmul: activations too short");
        debug_assert!(grouped.is_multiple_of(4) && grouped <= n_tok);
        let tiled = n_tok >= crate::tiled::MIN_BATCH && crate::tiled::applies(w.ty, w.rows);
        let single = if n_tok == 1 {
            (dispatch::row_dot_fn(w.ty, w.rows).expect("validated"), None)
        } else if tiled {
            dispatch::tiled_kernels(w.ty).expect("tiled::applies")
        } else {
            dispatch::matrix_kernels(w.ty, w.rows, false).expect("validated")
        };
        let group = if grouped > 0 {
            dispatch::matrix_kernels(w.ty, w.rows, true).expect("validated")
        } else {
            single
        };
        let tile = TOKEN_TILE.min(n_tok);
        let n_tiles = n_tok.div_ceil(tile);
        let chunk = row_chunk(w.rows, self.n_threads().div_ceil(n_tiles).max(1));
        let n_row_chunks = w.rows.div_ceil(chunk);
        let yp = SyncPtr(y.as_mut_ptr());
        let (rb, rows, cols) = (w.row_bytes(), w.rows, w.cols);
        self.run(n_row_chunks * n_tiles, &|task| {
            #[allow(clippy::redundant_locals)] // capture the Sync wrapper, not its raw field
            let yp = yp;
            let (rc, tt) = (task % n_row_chunks, task / n_row_chunks);
            let (r0, t0) = (rc * chunk, tt * tile);
            let (r1, t1) = ((r0 + chunk).min(rows), (t0 + tile).min(n_tok));
            let mut out = [0f32; 4];
            for r in r0..r1 {
                let wr = &w.data[r * rb..(r + 1) * rb];
                let mut t = t0;
                while t < t1 {
                    // a run of tokens never straddles the group boundary
                    let (end, (dot, multi)) = if t < grouped {
                        (t1.min(grouped), group)
                    } else {
                        (t1, single)
                    };
                    let k = if multi.is_some() { (end - t).min(4) } else { 1 };
                    match multi {
                        Some(m) => m(cols, wr, &xq[t * arb..(t + k) * arb], arb, &mut out[..k]),
                        None => out[0] = dot(cols, wr, &xq[t * arb..(t + 1) * arb]),
                    }
                    for (j, v) in out[..k].iter().enumerate() {
                        // SAFETY: (t + j, r) is in bounds and owned by this task alone.
                        unsafe { *yp.0.add((t + j) * rows + r) = *v };
                    }
                    t += k;
                }
            }
        });
    }
}
