//! The CPU backend: a worker pool and the kernels of `xwen-kernels`, in llama.cpp's CPU float
//! orders. Each op's task split lives here — products by row blocks of similar bytes,
//! attention by (sequence, head), the delta rule by (sequence, V-head), experts one per task —
//! so the layers above state only the math.

pub mod attention;
pub mod delta;
pub mod elementwise;
pub mod experts;
pub mod flash_attn;
pub mod products;
pub mod rowwise;
pub mod streams;

use crate::backend::{Act, AttnHeads, AttnMode, Backend, BlockAttn, Buf, Cols, ConvSilu, DeltaGates, DeltaScan, ExpertFfn, MvJob, OutGate, Rope, Route, RouteRule, ScanState, Scratch};
use crate::batch::Rows;
use crate::state::KvCache;
use xwen_kernels::{Pool, QMatrix};

/// A raw pointer that worker tasks may share because each task writes a disjoint range: the
/// CPU backend's alone (the layers hand it whole slices and never split work themselves).
#[derive(Clone, Copy)]
pub struct SharedMut<T>(pub *mut T);
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub fn new(s: &mut [T]) -> Self {
        SharedMut(s.as_mut_ptr())
    }
    /// # Safety
    /// Callers guarantee that concurrently used ranges are disjoint and in bounds.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(start), len)
    }
}

pub struct Cpu {
    pool: Pool,
    scratch: Scratch,
}

impl Cpu {
    pub fn new(pool: Pool) -> Cpu {
        Cpu { pool, scratch: Scratch::new() }
    }
}

impl Backend for Cpu {
    fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    fn matvec(&self, w: QMatrix, x: &[f32], y: &mut [f32]) {
        self.pool.matvec(w, x, y);
    }

    fn matmul(&self, w: QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
        self.pool.matmul(w, x, n, y);
    }

    fn scratch(&self) -> &Scratch {
        &self.scratch
    }

    fn mm_rows(&self, ws: &[QMatrix], x: &[f32], rows: &Rows) -> Vec<Buf<'_>> {
        products::mm_rows(&self.pool, &self.scratch, ws, x, rows)
    }

    fn mv_batch(&self, jobs: &mut [MvJob]) {
        products::mv_batch(&self.pool, jobs);
    }

    fn attend(&self, q: &[f32], caches: &[&KvCache], rows: &Rows, heads: &AttnHeads, mode: &AttnMode, out: &mut [f32]) {
        attention::attend(&self.pool, q, caches, rows, heads, mode, out);
    }

    fn delta_scan(&self, scan: &DeltaScan, states: &mut [ScanState], o: &mut [f32]) {
        delta::scan(&self.pool, scan, states, o);
    }

    fn expert_ffns<'s>(&'s self, jobs: &[ExpertFfn], act: Act, ff: usize, ys: &mut [Buf<'s>]) {
        experts::ffns(&self.pool, &self.scratch, jobs, act, ff, ys);
    }

    fn conv_silu(&self, conv: &ConvSilu, window: &[f32], out: &mut [f32]) {
        rowwise::conv_silu(&self.pool, conv, window, out);
    }

    fn split_columns(&self, src: &[f32], n: usize, outs: &mut [&mut [f32]]) {
        rowwise::split_columns(&self.pool, src, n, outs);
    }

    fn gather_columns(&self, src: &[f32], n: usize, cols: &[Cols], outs: &mut [&mut [f32]]) {
        rowwise::gather_columns(&self.pool, src, n, cols, outs);
    }

    fn l2_norm_heads(&self, x: &mut [f32], head: usize, eps: f32) {
        rowwise::l2_norm_heads(&self.pool, x, head, eps);
    }

    fn gated_rms_norm(&self, o: &mut [f32], z: &mut [f32], w: &[f32], eps: f32, gate: OutGate) {
        rowwise::gated_rms_norm(&self.pool, o, z, w, eps, gate);
    }

    fn norm_rope_heads(&self, heads: &mut [(&mut [f32], &[f32])], eps: f32, rope: &Rope, positions: &[usize]) {
        rowwise::norm_rope_heads(&self.pool, heads, eps, rope, positions);
    }

    fn mul_sigmoid(&self, x: &mut [f32], g: &[f32]) {
        rowwise::mul_sigmoid(&self.pool, x, g);
    }

    fn rms_norm(&self, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
        elementwise::rms_norm(&self.pool, x, w, eps, y);
    }

    fn rms_norm_inplace(&self, x: &mut [f32], stride: usize, w: &[f32], eps: f32) {
        elementwise::rms_norm_inplace(&self.pool, x, stride, w, eps);
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        elementwise::add(&self.pool, x, y);
    }

    fn glu(&self, act: Act, g: &[f32], u: &[f32], row: usize, y: &mut [f32]) {
        elementwise::glu(&self.pool, act, g, u, row, y);
    }

    fn delta_gates(&self, gates: &DeltaGates, beta: &mut [f32], g: &mut [f32]) {
        elementwise::delta_gates(gates, beta, g);
    }

    fn weighted_sum(&self, parts: &[&[f32]], weights: &[f32], k: usize, out: &mut [f32]) {
        elementwise::weighted_sum(&self.pool, parts, weights, k, out);
    }

    fn add_gated(&self, out: &mut [f32], y: &[f32], x: &[f32], gate: Option<&[f32]>) {
        elementwise::add_gated(&self.pool, out, y, x, gate);
    }

    fn hadamard(&self, x: &mut [f32], n: usize) {
        elementwise::hadamard(&self.pool, x, n);
    }

    fn residual_mix(&self, bank: &[&[f32]], x: &[f32], score: &[f32], eps: f32, out: &mut [f32]) {
        elementwise::residual_mix(&self.pool, bank, x, score, eps, out);
    }

    fn scale(&self, x: &mut [f32], s: f32) {
        for v in x.iter_mut() {
            *v *= s;
        }
    }

    fn silu_rows(&self, x: &mut [f32], row: usize) {
        for r in x.chunks_exact_mut(row) {
            crate::ops::silu_row_inplace(r);
        }
    }

    fn sigmoid(&self, x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = crate::ops::sigmoid(*v);
        }
    }

    fn rms_norm_streams(&self, x: &[f32], w: &[f32], n: usize, eps: f32, y: &mut [f32]) {
        streams::rms_norm_streams(x, w, n, eps, y);
    }

    fn hc_pre(&self, xn: &[f32], gate: &[f32], hc: usize, n: usize, scale: f32, out: &mut [f32]) {
        streams::hc_pre(xn, gate, hc, n, scale, out);
    }

    fn hc_post(&self, res: &mut [f32], x: &[f32], w: &[f32], hc: usize) {
        streams::hc_post(res, x, w, hc);
    }

    fn ple_gate(&self, key: &[f32], query: &[f32], n: usize, gate: &mut [f32]) {
        streams::ple_gate(key, query, n, gate);
    }

    fn dilated_conv(&self, window: &[f32], taps: &[f32], kernel: usize, dil: usize, c: usize, out: &mut [f32]) {
        streams::dilated_conv(window, taps, kernel, dil, c, out);
    }

    fn attend_block(&self, q: &[f32], k: &[f32], v: &[f32], blk: &BlockAttn, out: &mut [f32]) {
        attention::attend_block(&self.pool, q, k, v, blk, out);
    }

    fn attend_selected(&self, q: &[f32], caches: &[&KvCache], rows: &Rows, heads: &AttnHeads, mode: &AttnMode, sel: &[Vec<bool>], out: &mut [f32]) {
        attention::attend_selected(&self.pool, q, caches, rows, heads, mode, sel, out);
    }

    fn route(&self, logits: &[f32], rule: &RouteRule) -> Vec<Route> {
        // a few hundred values a token: the rows' sorts are too small to split over threads
        logits.chunks_exact(rule.n_expert).map(|l| rule.apply(l)).collect()
    }
}

/// Deterministic values in [−1, 1) for the CPU bodies' tests.
#[cfg(test)]
pub(crate) fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}
