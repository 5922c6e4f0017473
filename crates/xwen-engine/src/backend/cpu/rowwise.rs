//! The per-row element-wise ops around the products: the causal convolution and SiLU, column
//! splits, the heads' norms, rope and output gates. Each row's arithmetic is the one function
//! of `ops` (ggml's order), so how rows are split into tasks changes no bit; rows run in tasks of about
//! `ELEMS_PER_TASK` values (each of these steps is a few percent of a prefill, serial
//! otherwise; a decode step's rows are too few to be worth a task switch).

use crate::backend::{Cols, ConvSilu, OutGate, Rope};
use super::SharedMut;
use crate::ops;
use xwen_kernels::Pool;

/// Values a task takes at least: 128 KiB of f32, a 16-token chunk of the 4B's convolution.
const ELEMS_PER_TASK: usize = 1 << 15;

/// `f(t0, t1)` over chunks of `n` rows `width` values wide, on the pool where there is more
/// than one chunk.
pub(super) fn row_chunks(pool: &Pool, n: usize, width: usize, f: &(dyn Fn(usize, usize) + Sync)) {
    let per_task = (ELEMS_PER_TASK / width.max(1)).max(1);
    if n <= per_task {
        f(0, n);
        return;
    }
    pool.run(n.div_ceil(per_task), &|i| f(i * per_task, ((i + 1) * per_task).min(n)));
}

/// `f(i, piece)` for every `width`-wide piece of x (the last may be shorter), each piece its
/// task's alone; `i · width` is where it starts.
pub(super) fn each_row(pool: &Pool, x: &mut [f32], width: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    if width == 0 {
        return;
    }
    let len = x.len();
    let xo = SharedMut::new(x);
    row_chunks(pool, len.div_ceil(width), width, &|t0, t1| {
        for t in t0..t1 {
            let at = t * width;
            // SAFETY: piece t belongs to this task alone, and lies inside x (at < len).
            f(t, unsafe { xo.slice(at, width.min(len - at)) });
        }
    });
}

/// ggml_ssm_conv over `window` ([kernel − 1 + n] rows of channels) then SiLU, into `out` (n rows).
pub fn conv_silu(pool: &Pool, conv: &ConvSilu, window: &[f32], out: &mut [f32]) {
    let cd = conv.taps.len() / conv.kernel;
    each_row(pool, out, cd, &|t, o| {
        o.fill(0.0);
        // per channel 0 + w₀k₀ + w₁k₁ + …, rounded in that order (ggml_ssm_conv's), one tap row
        // at a time so the loop vectorizes across channels (channel-major it ran scalar and
        // strided: ~2% of a 4B prefill; docs/bench.md "Kept: the DeltaNet convolution across channels")
        for j in 0..conv.kernel {
            let (wr, tr) = (&window[(t + j) * cd..(t + j + 1) * cd], &conv.taps[j * cd..(j + 1) * cd]);
            xwen_kernels::f32ops::conv_tap_acc(o, wr, tr);
        }
        for part in o.chunks_exact_mut(conv.silu_row) {
            ops::silu_row_inplace(part);
        }
    });
}

/// Row t of `src` (n rows) cut into consecutive column ranges, range i to row t of `outs[i]`:
/// `gather_columns` with one run per output, back to back.
pub fn split_columns(pool: &Pool, src: &[f32], n: usize, outs: &mut [&mut [f32]]) {
    if n == 0 {
        return;
    }
    let mut from = 0;
    let cols: Vec<Cols> = outs
        .iter()
        .enumerate()
        .map(|(out, o)| {
            let c = Cols { from, out, to: 0, len: o.len() / n };
            from += c.len;
            c
        })
        .collect();
    assert_eq!(src.len(), n * from, "the outputs' widths add up to the source's");
    gather_columns(pool, src, n, &cols, outs);
}

/// Runs of columns of each of the `n` rows of `src` into the same row of their outputs.
pub fn gather_columns(pool: &Pool, src: &[f32], n: usize, cols: &[Cols], outs: &mut [&mut [f32]]) {
    if n == 0 {
        return;
    }
    assert!(src.len().is_multiple_of(n), "whole source rows");
    let width = src.len() / n;
    let widths: Vec<usize> = outs.iter().map(|o| o.len() / n).collect();
    for c in cols {
        assert!(c.out < outs.len() && c.from + c.len <= width && c.to + c.len <= widths[c.out], "a run inside its rows: {c:?}");
    }
    let ptrs: Vec<SharedMut<f32>> = outs.iter_mut().map(|o| SharedMut::new(o)).collect();
    row_chunks(pool, n, width, &|t0, t1| {
        for t in t0..t1 {
            let row = &src[t * width..(t + 1) * width];
            for c in cols {
                let w = widths[c.out];
                // SAFETY: row t of each output belongs to this task alone (t < n rows of w), and
                // the run lies inside it (checked above).
                unsafe { ptrs[c.out].slice(t * w + c.to, c.len) }.copy_from_slice(&row[c.from..c.from + c.len]);
            }
        }
    });
}

/// llama.cpp's `build_gdn_l2_norm` on every `head`-wide piece of x.
pub fn l2_norm_heads(pool: &Pool, x: &mut [f32], head: usize, eps: f32) {
    each_row(pool, x, head, &|_, h| ops::gdn_l2_norm_inplace(h, eps));
}

/// Per `head`-wide piece: o ← rms_norm(o)·w ⊙ gate(z), the gate's values left in z.
pub fn gated_rms_norm(pool: &Pool, o: &mut [f32], z: &mut [f32], w: &[f32], eps: f32, gate: OutGate) {
    let head = w.len();
    assert_eq!(o.len(), z.len(), "one gate value per output");
    let zo = SharedMut::new(z);
    each_row(pool, o, head, &|i, oh| {
        // SAFETY: piece i of z pairs with piece i of o, which is this task's alone.
        let zh = unsafe { zo.slice(i * head, head) };
        match gate {
            // ggml_silu runs on z viewed as [head_dim, H_v, n]: rows of head_dim
            OutGate::Silu => ops::silu_row_inplace(zh),
            OutGate::Sigmoid => zh.iter_mut().for_each(|v| *v = ops::sigmoid(*v)),
        }
        ops::rms_norm_inplace(oh, w, eps);
        for (ov, &sz) in oh.iter_mut().zip(zh.iter()) {
            *ov *= sz;
        }
    });
}

/// For each (x, w) of `heads` (each `positions.len()` rows of heads `w.len()` wide): row t's
/// heads RMS-normed by w, then rotated at `positions[t]` — the rope tables made once per row for
/// all of them.
pub fn norm_rope_heads(pool: &Pool, heads: &mut [(&mut [f32], &[f32])], eps: f32, rope: &Rope, positions: &[usize]) {
    let n = positions.len();
    if n == 0 {
        return;
    }
    let width: usize = heads.iter().map(|(x, _)| x.len() / n).sum();
    let parts: Vec<(SharedMut<f32>, usize, &[f32])> = heads.iter_mut().map(|(x, w)| (SharedMut::new(x), x.len() / n, *w)).collect();
    row_chunks(pool, n, width, &|t0, t1| {
        let (mut cos, mut sin) = (vec![0.0f32; rope.n_rot / 2], vec![0.0f32; rope.n_rot / 2]);
        for (t, &pos) in positions.iter().enumerate().take(t1).skip(t0) {
            ops::rope_cache(pos, rope.n_rot, rope.base, &mut cos, &mut sin);
            if let Some(still) = rope.still {
                ops::hold_pairs(still, &mut cos, &mut sin);
            }
            for (x, row_len, w) in &parts {
                // SAFETY: row t of each tensor belongs to this task alone (t < n rows).
                for h in unsafe { x.slice(t * row_len, *row_len) }.chunks_exact_mut(w.len()) {
                    ops::rms_norm_inplace(h, w, eps);
                    ops::rope_neox_inplace(h, rope.n_rot, &cos, &sin);
                }
            }
        }
    });
}

/// x ← x ⊙ sigmoid(g), element by element.
pub fn mul_sigmoid(pool: &Pool, x: &mut [f32], g: &[f32]) {
    assert_eq!(x.len(), g.len(), "one gate value per element");
    const WIDTH: usize = 4096;
    each_row(pool, x, WIDTH, &|i, xr| {
        for (v, &gv) in xr.iter_mut().zip(&g[i * WIDTH..]) {
            *v *= ops::sigmoid(gv);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::noise;

    /// Split across tasks on two threads, every op gives each row what the row's function of
    /// `ops` gives it alone.
    #[test]
    fn the_row_ops_give_each_row_its_own_function_bits() {
        let pool = Pool::new(2);
        let (n, heads, hd, n_rot) = (70, 4, 64, 32);
        let w = noise(hd, 1);
        let x = noise(n * heads * hd, 2);
        let positions: Vec<usize> = (0..n).map(|t| 3 * t + 1).collect();
        let still: Vec<bool> = (0..n_rot / 2).map(|i| i % 5 == 4).collect();
        let rope = Rope { n_rot, base: 10000.0, still: Some(&still) };
        // two tensors of different widths and norms (q of `heads` heads, k of one)
        let (w2, x2) = (noise(hd, 8), noise(n * hd, 9));
        let (mut got, mut got2) = (x.clone(), x2.clone());
        norm_rope_heads(&pool, &mut [(&mut got, &w), (&mut got2, &w2)], 1e-6, &rope, &positions);
        for (got, x, w, width) in [(&got, &x, &w, heads * hd), (&got2, &x2, &w2, hd)] {
            let mut want = x.clone();
            for (t, row) in want.chunks_exact_mut(width).enumerate() {
                let (mut cos, mut sin) = (vec![0.0; n_rot / 2], vec![0.0; n_rot / 2]);
                ops::rope_cache(positions[t], n_rot, 10000.0, &mut cos, &mut sin);
                ops::hold_pairs(&still, &mut cos, &mut sin);
                for h in row.chunks_exact_mut(hd) {
                    ops::rms_norm_inplace(h, w, 1e-6);
                    ops::rope_neox_inplace(h, n_rot, &cos, &sin);
                }
            }
            assert_eq!(got, &want, "norm + rope, rows {width} wide");
        }

        for gate in [OutGate::Silu, OutGate::Sigmoid] {
            let (mut o, mut z) = (x.clone(), noise(x.len(), 3));
            gated_rms_norm(&pool, &mut o, &mut z, &w, 1e-6, gate);
            let (mut wo, mut wz) = (x.clone(), noise(x.len(), 3));
            for (oh, zh) in wo.chunks_exact_mut(hd).zip(wz.chunks_exact_mut(hd)) {
                match gate {
                    OutGate::Silu => ops::silu_row_inplace(zh),
                    OutGate::Sigmoid => zh.iter_mut().for_each(|v| *v = ops::sigmoid(*v)),
                }
                ops::rms_norm_inplace(oh, &w, 1e-6);
                oh.iter_mut().zip(zh.iter()).for_each(|(a, b)| *a *= b);
            }
            assert_eq!(o, wo, "gated norm {gate:?}");
        }

        let mut l2 = x.clone();
        l2_norm_heads(&pool, &mut l2, hd, 1e-6);
        let mut wl2 = x.clone();
        wl2.chunks_exact_mut(hd).for_each(|h| ops::gdn_l2_norm_inplace(h, 1e-6));
        assert_eq!(l2, wl2, "l2 norm");

        let g = noise(x.len(), 4);
        let mut ms = x.clone();
        mul_sigmoid(&pool, &mut ms, &g);
        let wms: Vec<f32> = x.iter().zip(&g).map(|(a, b)| a * ops::sigmoid(*b)).collect();
        assert_eq!(ms, wms, "sigmoid gate");

        // q | k | v columns of each row
        let (a, b, c) = (96, 32, 128);
        let src = noise(n * (a + b + c), 5);
        let (mut qa, mut kb, mut vc) = (vec![0.0; n * a], vec![0.0; n * b], vec![0.0; n * c]);
        split_columns(&pool, &src, n, &mut [&mut qa, &mut kb, &mut vc]);
        for (t, row) in src.chunks_exact(a + b + c).enumerate() {
            assert_eq!(&qa[t * a..(t + 1) * a], &row[..a]);
            assert_eq!(&kb[t * b..(t + 1) * b], &row[a..a + b]);
            assert_eq!(&vc[t * c..(t + 1) * c], &row[a + b..]);
        }

        // interleaved heads unpacked: per row, columns [4..8) to out 1 at 0, [0..4) to out 0 at 2
        let src = noise(n * 8, 11);
        let (mut o0, mut o1) = (vec![0.0; n * 6], vec![0.0; n * 4]);
        let cols = [Cols { from: 4, out: 1, to: 0, len: 4 }, Cols { from: 0, out: 0, to: 2, len: 4 }];
        gather_columns(&pool, &src, n, &cols, &mut [&mut o0, &mut o1]);
        for (t, row) in src.chunks_exact(8).enumerate() {
            assert_eq!(&o0[t * 6..(t + 1) * 6], &[&[0.0, 0.0][..], &row[..4]].concat()[..]);
            assert_eq!(&o1[t * 4..(t + 1) * 4], &row[4..]);
        }

        // the convolution: each output row from its kernel-row window, in tap order
        let (cd, kernel) = (1024, 4);
        let taps = noise(kernel * cd, 6);
        let window = noise((kernel - 1 + n) * cd, 7);
        let mut out = vec![0.0; n * cd];
        conv_silu(&pool, &ConvSilu { taps: &taps, kernel, silu_row: cd / 2 }, &window, &mut out);
        for t in 0..n {
            let mut row = vec![0.0f32; cd];
            for j in 0..kernel {
                xwen_kernels::f32ops::conv_tap_acc(&mut row, &window[(t + j) * cd..][..cd], &taps[j * cd..][..cd]);
            }
            row.chunks_exact_mut(cd / 2).for_each(ops::silu_row_inplace);
            assert_eq!(&out[t * cd..(t + 1) * cd], &row[..], "conv row {t}");
        }
    }
}
