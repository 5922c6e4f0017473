//! Bodies of the ops of an hc-wide residual (hyper-connections) and of the per-layer n-gram
//! embedding (PLE), in the float orders of llama.cpp b11434's CPU graph for qwen4exp: the fused
//! `ggml_dsv4_hc_pre_gated` / `ggml_dsv4_hc_post` loops (GCC contracts the first's stream sum to
//! an FMA chain and leaves the second's multiply and add apart, as the AVX2 build's object code
//! shows), and the plain ops the PLE block chains (`ggml_sum_rows` sums in double).

use crate::ops;

/// RMSNorm of every `n`-wide row of x, row r times the weight of its stream r mod (w.len() / n)
/// (ggml_rms_norm of [n, hc, T], then ggml_mul by an [n, hc] gamma).
pub fn rms_norm_streams(x: &[f32], w: &[f32], n: usize, eps: f32, y: &mut [f32]) {
    let hc = w.len() / n;
    for (r, (xr, yr)) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)).enumerate() {
        ops::rms_norm(xr, &w[(r % hc) * n..][..n], eps, yr);
    }
}

/// `ggml_dsv4_hc_pre_gated`: per token t and column i, scale · Σ_s xn[t,s,i]·sigmoid(g[t,s,i]),
/// the sum an FMA chain from 0 in stream order.
pub fn hc_pre(xn: &[f32], gate: &[f32], hc: usize, n: usize, scale: f32, out: &mut [f32]) {
    let n_tok = xn.len() / (hc * n);
    for t in 0..n_tok {
        for i in 0..n {
            let mut sum = 0.0f32;
            for s in 0..hc {
                let at = (t * hc + s) * n + i;
                let wv = 1.0f32 / (1.0f32 + (-gate[at]).exp());
                sum = xn[at].mul_add(wv, sum);
            }
            out[t * n + i] = scale * sum;
        }
    }
}

/// `ggml_dsv4_hc_post` without a comb matrix: res[t,s,i] ← x[t,i]·w[t,s] + res[t,s,i], the
/// product rounded before the add.
pub fn hc_post(res: &mut [f32], x: &[f32], w: &[f32], hc: usize) {
    let n_tok = w.len() / hc;
    let n = x.len() / n_tok.max(1);
    for t in 0..n_tok {
        for s in 0..hc {
            let p = w[t * hc + s];
            let row = &mut res[(t * hc + s) * n..][..n];
            for (r, &xv) in row.iter_mut().zip(&x[t * n..(t + 1) * n]) {
                *r += xv * p;
            }
        }
    }
}

/// PLE's gate per (token, stream): s = Σ_i key·query (each product rounded, summed in double,
/// `ggml_sum_rows`), scaled by 1/√n, then sigmoid(sgn(s)·√max(|s|, 1e-6)).
pub fn ple_gate(key: &[f32], query: &[f32], n: usize, gate: &mut [f32]) {
    let scale = 1.0f32 / (n as f32).sqrt();
    for ((k, q), g) in key.chunks_exact(n).zip(query.chunks_exact(n)).zip(gate.iter_mut()) {
        let mut sum = 0.0f64;
        for (&a, &b) in k.iter().zip(q) {
            sum += (a * b) as f64;
        }
        let s = (sum as f32) * scale;
        let mag = s.abs().clamp(1e-6, f32::INFINITY).sqrt();
        let sgn = if s > 0.0 { 1.0f32 } else if s < 0.0 { -1.0 } else { 0.0 };
        *g = ops::sigmoid(sgn * mag);
    }
}

/// PLE's depthwise causal conv dilated by `dil` over `window` (history rows then the new rows,
/// each `c` channels): out[t, ch] = ((x[t−(K−1)d]·w0 + x[t−(K−2)d]·w1) + …) + x[t]·w_{K−1},
/// each product rounded (a sum of shifted copies, `build_ple`); `taps` is [channel][K].
pub fn dilated_conv(window: &[f32], taps: &[f32], kernel: usize, dil: usize, c: usize, out: &mut [f32]) {
    let hist = (kernel - 1) * dil;
    let n = out.len() / c;
    for t in 0..n {
        for ch in 0..c {
            let mut acc = 0.0f32;
            for k in 0..kernel {
                let src = window[(hist - (kernel - 1 - k) * dil + t) * c + ch];
                let term = src * taps[ch * kernel + k];
                acc = if k == 0 { term } else { acc + term };
            }
            out[t * c + ch] = acc;
        }
    }
}
