//! The element-wise steps of the residual stream and the FFNs: RMSNorm of rows, the residual
//! add, the gated activations (SwiGLU, Kimi K3's situ), the delta rule's gate activations, a
//! MoE's weighted sum and its shared expert's gate, Kimi K3's cross-layer residual mix, the
//! Walsh–Hadamard rotation around a quantized KV cache. Each row's arithmetic is the one function
//! of `ops` / `f32ops` in ggml's order, so the task split (`rowwise::row_chunks`, a decode
//! step's rows on the calling thread) changes no bit.

use super::rowwise::{each_row, row_chunks};
use super::SharedMut;
use crate::backend::{Act, DeltaGates};
use crate::ops;
use xwen_kernels::Pool;

/// The width element-wise ops with no row structure are cut at (a task holds several).
const FLAT_WIDTH: usize = 4096;

/// y ← rms_norm(row)·w for every `w.len()`-wide row of x.
pub fn rms_norm(pool: &Pool, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let width = w.len();
    assert_eq!(x.len(), y.len(), "one output per input value");
    assert!(width > 0 && x.len().is_multiple_of(width), "whole rows of the norm's width");
    each_row(pool, y, width, &|t, yr| ops::rms_norm(&x[t * width..(t + 1) * width], w, eps, yr));
}

/// The first `w.len()` values of every `stride`-wide row of x ← rms_norm(them)·w.
pub fn rms_norm_inplace(pool: &Pool, x: &mut [f32], stride: usize, w: &[f32], eps: f32) {
    assert!(w.len() <= stride && x.len().is_multiple_of(stride), "whole rows, each holding the normed part");
    each_row(pool, x, stride, &|_, row| ops::rms_norm_inplace(&mut row[..w.len()], w, eps));
}

/// x ← x + y.
pub fn add(pool: &Pool, x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "one addend per value");
    each_row(pool, x, FLAT_WIDTH, &|i, xr| {
        for (a, &b) in xr.iter_mut().zip(&y[i * FLAT_WIDTH..]) {
            *a += b;
        }
    });
}

/// y ← act(g, u) over rows of `row` values, split over the pool.
pub fn glu(pool: &Pool, act: Act, g: &[f32], u: &[f32], row: usize, y: &mut [f32]) {
    assert!(row > 0 && g.len().is_multiple_of(row) && u.len() == g.len() && y.len() == g.len(), "whole rows of g, u and y");
    each_row(pool, y, row, &|t, yr| glu_serial(act, &g[t * row..(t + 1) * row], &u[t * row..(t + 1) * row], row, yr));
}

/// [`glu`] on this thread (an expert's activation inside its task).
pub fn glu_serial(act: Act, g: &[f32], u: &[f32], row: usize, y: &mut [f32]) {
    assert!(row > 0 && g.len().is_multiple_of(row) && u.len() == g.len() && y.len() == g.len(), "whole rows of g, u and y");
    match act {
        // ggml_swiglu_split per row: ggml's vector expf on full chunks, libm on the tail, so
        // rows back to back give the same bits only chunked per row
        Act::SwiGlu => {
            for ((gr, ur), yr) in g.chunks_exact(row).zip(u.chunks_exact(row)).zip(y.chunks_exact_mut(row)) {
                xwen_kernels::f32ops::swiglu(gr, ur, yr);
            }
        }
        Act::Situ { beta, linear_beta } => situ(g, u, beta, linear_beta, y),
    }
}

/// situ element-wise, in the order of llama.cpp's ggml ops, each rounded to f32:
/// a = tanh(g·(1/β))·β; a = a·sigmoid(g); u' = tanh(u·(1/λ))·λ (λ > 0); y = a·u'. ggml's tanh
/// and sigmoid are libm's tanhf and 1/(1+expf(−x)) per element (unary-ops.cpp), no vector path,
/// so the row length does not enter.
fn situ(g: &[f32], u: &[f32], beta: f32, linear_beta: f32, y: &mut [f32]) {
    let inv_beta = 1.0f32 / beta;
    let inv_lb = 1.0f32 / linear_beta;
    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
        let a = (g * inv_beta).tanh() * beta;
        let a = a * ops::sigmoid(g);
        let up = if linear_beta > 0.0 { (u * inv_lb).tanh() * linear_beta } else { u };
        *y = a * up;
    }
}

/// β ← sigmoid(β); g ← softplus(g + dt)·a (or K3's sigmoid(−((g + dt)·a))·lb), per head.
/// A few values per token: on this thread.
pub fn delta_gates(gates: &DeltaGates, beta: &mut [f32], g: &mut [f32]) {
    let (heads, gw) = (gates.a.len(), gates.width);
    assert!(heads > 0 && gw > 0, "gates of at least one head and channel");
    assert_eq!(gates.dt_bias.len(), heads * gw, "a dt bias per head and gate channel");
    assert_eq!(g.len() / (heads * gw), beta.len() / heads, "a β and the gates of every (token, head)");
    for b in beta.iter_mut() {
        *b = ops::sigmoid(*b);
    }
    for gt in g.chunks_exact_mut(heads * gw) {
        for (h, gh) in gt.chunks_exact_mut(gw).enumerate() {
            for (c, v) in gh.iter_mut().enumerate() {
                let x = *v + gates.dt_bias[h * gw + c];
                *v = match gates.lower_bound {
                    None => ops::softplus(x) * gates.a[h],
                    Some(lb) => ops::sigmoid(-(x * gates.a[h])) * lb,
                };
            }
        }
    }
}

/// Each `out` row ← Σ_s weights[r·k + s]·parts[r·k + s], from slot 0 on, each product rounded.
pub fn weighted_sum(pool: &Pool, parts: &[&[f32]], weights: &[f32], k: usize, out: &mut [f32]) {
    assert!(k > 0 && parts.len() == weights.len() && parts.len().is_multiple_of(k), "k weighted parts per row");
    let rows = parts.len() / k;
    if rows == 0 {
        return;
    }
    let width = out.len() / rows;
    assert_eq!(out.len(), rows * width, "whole output rows");
    each_row(pool, out, width, &|r, o| {
        o.fill(0.0);
        for (part, &p) in parts[r * k..(r + 1) * k].iter().zip(&weights[r * k..(r + 1) * k]) {
            for (a, &v) in o.iter_mut().zip(&part[..width]) {
                *a += v * p;
            }
        }
    });
}

/// out ← out + sigmoid(gate·x)·y per row; out ← out + y without a gate.
pub fn add_gated(pool: &Pool, out: &mut [f32], y: &[f32], x: &[f32], gate: Option<&[f32]>) {
    let Some(gw) = gate else {
        add(pool, out, y);
        return;
    };
    let width = gw.len();
    assert!(width > 0 && out.len() == y.len() && x.len() == y.len() && out.len().is_multiple_of(width), "rows of the gate's width");
    each_row(pool, out, width, &|t, o| {
        let g = ops::sigmoid(ops::dot(gw, &x[t * width..(t + 1) * width]));
        for (a, &v) in o.iter_mut().zip(&y[t * width..(t + 1) * width]) {
            *a += v * g;
        }
    });
}

/// Kimi K3's residual mix of every row: scores s_i = Σ_j (rms_norm(c_i)·w)_j (f64 sums, as
/// ggml_sum_rows) for each checkpoint c_i and for x, p = softmax(s), then one f32 accumulator per
/// element over the checkpoints in bank order (`sum += c·p`, rounded twice: no FMA) plus x·p_x.
pub fn residual_mix(pool: &Pool, bank: &[&[f32]], x: &[f32], score: &[f32], eps: f32, out: &mut [f32]) {
    let hidden = score.len();
    assert!(hidden > 0 && x.len() == out.len() && x.len().is_multiple_of(hidden), "rows of the score's width");
    assert!(bank.iter().all(|c| c.len() == x.len()), "a checkpoint row for every row of x");
    let k = bank.len();
    let oo = SharedMut::new(out);
    row_chunks(pool, x.len() / hidden, hidden, &|t0, t1| {
        let mut normed = vec![0.0f32; hidden];
        let mut p = vec![0.0f32; k + 1];
        let mut score_of = |row: &[f32]| -> f32 {
            ops::rms_norm(row, score, eps, &mut normed);
            normed.iter().map(|&v| v as f64).sum::<f64>() as f32
        };
        for t in t0..t1 {
            let xr = &x[t * hidden..(t + 1) * hidden];
            for (i, c) in bank.iter().enumerate() {
                p[i] = score_of(&c[t * hidden..(t + 1) * hidden]);
            }
            p[k] = score_of(xr);
            ops::softmax_inplace(&mut p);
            // SAFETY: row t of out belongs to this task alone (t < the rows of x).
            let or = unsafe { oo.slice(t * hidden, hidden) };
            for (j, o) in or.iter_mut().enumerate() {
                let mut sum = 0.0f32;
                for (i, c) in bank.iter().enumerate() {
                    sum += c[t * hidden + j] * p[i];
                }
                *o = sum + xr[j] * p[k];
            }
        }
    });
}

/// x ← H x / √n on every block of `n` (a power of two) values: ggml-cpu's fast Walsh–Hadamard
/// transform (ops.cpp `ggml_compute_forward_fwht`, what a mul_mat hinted
/// GGML_HINT_SRC0_IS_HADAMARD runs): scale first, then the butterflies u + v, u − v for
/// len = 1, 2, … n/2, each rounded to f32 (the SIMD passes' fma(v, −1, u) is u − v exactly).
pub fn hadamard(pool: &Pool, x: &mut [f32], n: usize) {
    assert!(n.is_power_of_two() && x.len().is_multiple_of(n), "whole blocks of a power of two");
    each_row(pool, x, n, &|_, row| hadamard_block(row));
}

fn hadamard_block(row: &mut [f32]) {
    let n = row.len();
    let scale = 1.0f32 / (n as f32).sqrt();
    row.iter_mut().for_each(|v| *v *= scale);
    let mut len = 1;
    while len < n {
        for i in (0..n).step_by(2 * len) {
            for j in i..i + len {
                let (u, v) = (row[j], row[j + len]);
                row[j] = u + v;
                row[j + len] = u - v;
            }
        }
        len <<= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::noise;

    /// Split over two threads (70 rows, many tasks), every op gives each row the bits of its
    /// one-row function.
    #[test]
    fn the_elementwise_ops_give_each_row_its_own_function_bits() {
        let pool = Pool::new(2);
        let (n, width) = (70, 1000);
        let x = noise(n * width, 1);
        let w = noise(width, 2);

        let mut y = vec![0.0; x.len()];
        rms_norm(&pool, &x, &w, 1e-6, &mut y);
        for (xr, yr) in x.chunks_exact(width).zip(y.chunks_exact(width)) {
            let mut want = vec![0.0; width];
            ops::rms_norm(xr, &w, 1e-6, &mut want);
            assert_eq!(yr, &want[..], "rms_norm");
        }

        // the first 600 of each 1000-wide row normed, the rest left
        let mut z = x.clone();
        rms_norm_inplace(&pool, &mut z, width, &w[..600], 1e-5);
        for (xr, zr) in x.chunks_exact(width).zip(z.chunks_exact(width)) {
            let mut want = xr.to_vec();
            ops::rms_norm_inplace(&mut want[..600], &w[..600], 1e-5);
            assert_eq!(zr, &want[..], "rms_norm_inplace");
        }

        let b = noise(x.len(), 3);
        let mut s = x.clone();
        add(&pool, &mut s, &b);
        assert_eq!(s, x.iter().zip(&b).map(|(a, b)| a + b).collect::<Vec<_>>(), "add");

        let u = noise(x.len(), 4);
        for act in [Act::SwiGlu, Act::Situ { beta: 0.7, linear_beta: 1.5 }, Act::Situ { beta: 2.0, linear_beta: 0.0 }] {
            let mut got = vec![0.0; x.len()];
            glu(&pool, act, &x, &u, width, &mut got);
            for ((gr, ur), yr) in x.chunks_exact(width).zip(u.chunks_exact(width)).zip(got.chunks_exact(width)) {
                let want: Vec<f32> = match act {
                    Act::SwiGlu => {
                        let mut r = vec![0.0; width];
                        xwen_kernels::f32ops::swiglu(gr, ur, &mut r);
                        r
                    }
                    Act::Situ { beta, linear_beta } => gr
                        .iter()
                        .zip(ur)
                        .map(|(&g, &u)| {
                            let a = (g * (1.0 / beta)).tanh() * beta * ops::sigmoid(g);
                            a * if linear_beta > 0.0 { (u * (1.0 / linear_beta)).tanh() * linear_beta } else { u }
                        })
                        .collect(),
                };
                assert_eq!(yr, &want[..], "{act:?}");
            }
        }

        // GDN (one gate per head) and KDA (a gate per key channel), softplus and K3's bound
        let (heads, tokens) = (6, 9);
        for (gw, lb) in [(1, None), (16, None), (16, Some(5.0f32))] {
            let (dt, a) = (noise(heads * gw, 5), noise(heads, 6));
            let (mut beta, mut g) = (noise(tokens * heads, 7), noise(tokens * heads * gw, 8));
            let (b0, g0) = (beta.clone(), g.clone());
            delta_gates(&DeltaGates { dt_bias: &dt, a: &a, width: gw, lower_bound: lb }, &mut beta, &mut g);
            assert_eq!(beta, b0.iter().map(|&v| ops::sigmoid(v)).collect::<Vec<_>>(), "β");
            for (i, (&got, &g0)) in g.iter().zip(&g0).enumerate() {
                let (h, c) = ((i / gw) % heads, i % gw);
                let v = g0 + dt[h * gw + c];
                let want = match lb {
                    None => ops::softplus(v) * a[h],
                    Some(lb) => ops::sigmoid(-(v * a[h])) * lb,
                };
                assert_eq!(got.to_bits(), want.to_bits(), "gate {i} (width {gw})");
            }
        }

        // k = 3 slots per row, parts from anywhere
        let k = 3;
        let pool_of_parts: Vec<Vec<f32>> = (0..n * k).map(|i| noise(width, 100 + i as u32)).collect();
        let parts: Vec<&[f32]> = pool_of_parts.iter().map(Vec::as_slice).collect();
        let weights = noise(n * k, 9);
        let mut sum = noise(n * width, 10); // overwritten, not added to
        weighted_sum(&pool, &parts, &weights, k, &mut sum);
        for (r, row) in sum.chunks_exact(width).enumerate() {
            let mut want = vec![0.0f32; width];
            for s in 0..k {
                for (a, &v) in want.iter_mut().zip(parts[r * k + s]) {
                    *a += v * weights[r * k + s];
                }
            }
            assert_eq!(row, &want[..], "weighted sum row {r}");
        }

        let yv = noise(x.len(), 11);
        for gate in [Some(&w[..]), None] {
            let mut out = b.clone();
            add_gated(&pool, &mut out, &yv, &x, gate);
            for t in 0..n {
                let g = gate.map_or(1.0, |gw| ops::sigmoid(ops::dot(gw, &x[t * width..(t + 1) * width])));
                let want: Vec<f32> = (0..width).map(|j| b[t * width + j] + yv[t * width + j] * g).collect();
                assert_eq!(&out[t * width..(t + 1) * width], &want[..], "shared expert gate {:?}", gate.is_some());
            }
        }

        // K3's residual mix over a bank of two checkpoints
        let (c1, c2) = (noise(x.len(), 12), noise(x.len(), 13));
        let mut mixed = vec![0.0; x.len()];
        residual_mix(&pool, &[&c1, &c2], &x, &w, 1e-6, &mut mixed);
        for t in 0..n {
            let r = t * width..(t + 1) * width;
            let score = |row: &[f32]| {
                let mut nrm = vec![0.0; width];
                ops::rms_norm(row, &w, 1e-6, &mut nrm);
                nrm.iter().map(|&v| v as f64).sum::<f64>() as f32
            };
            let mut p = vec![score(&c1[r.clone()]), score(&c2[r.clone()]), score(&x[r.clone()])];
            ops::softmax_inplace(&mut p);
            let want: Vec<f32> = r.clone().map(|j| (0.0 + c1[j] * p[0] + c2[j] * p[1]) + x[j] * p[2]).collect();
            assert_eq!(&mixed[r], &want[..], "residual mix row {t}");
        }
    }

    /// The transform is H/√n with Sylvester's H (row i, column j: (−1)^popcount(i & j)), and
    /// applying it twice gives the input back (H·H = n·I), up to rounding; split over tasks, each
    /// block has the bits it has alone.
    #[test]
    fn hadamard_is_the_normalized_sylvester_transform() {
        let n = 64;
        let x: Vec<f32> = (0..2 * n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.25).collect();
        let pool = Pool::new(2);
        let mut y = x.clone();
        hadamard(&pool, &mut y, n);
        for (b, (xb, yb)) in x.chunks(n).zip(y.chunks(n)).enumerate() {
            for (i, &yi) in yb.iter().enumerate() {
                let want: f64 = xb.iter().enumerate().map(|(j, &v)| if (i & j).count_ones() % 2 == 0 { v as f64 } else { -(v as f64) }).sum::<f64>() / (n as f64).sqrt();
                assert!((yi as f64 - want).abs() < 1e-5, "block {b} row {i}: {yi} vs {want}");
            }
        }
        hadamard(&pool, &mut y, n);
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-5));

        let big = noise(1000 * 128, 21);
        let mut split = big.clone();
        hadamard(&pool, &mut split, 128);
        let mut alone = big;
        alone.chunks_exact_mut(128).for_each(hadamard_block);
        assert_eq!(split, alone, "blocks split over tasks");
    }

}
