//! Element-wise and row-wise operations, written to reproduce ggml-cpu's arithmetic (the parity
//! oracle): RMSNorm accumulates in f64 like `ggml_compute_forward_rms_norm_f32`, softplus has the
//! same x > 20 cut-off, SiLU is x / (1 + e^-x). Row-wise SiLU and softmax go through
//! xwen-kernels' ggml-exact versions: ggml evaluates exp with its own vector polynomial on full
//! 8/16-lane chunks of a row and libm's expf only on the tail, so the row length matters.

/// y = x / sqrt(mean(x²) + eps) · w. ggml sums squares in double (ggml_float) and rounds the
/// mean to f32 before adding eps; we do the same so the two agree to the last bit on the scale.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    debug_assert_eq!(x.len(), w.len());
    let scale = rms_scale(x, eps);
    for ((yi, &xi), &wi) in y.iter_mut().zip(x).zip(w) {
        *yi = (xi * scale) * wi;
    }
}

/// In-place variant of [`rms_norm`].
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (xi, &wi) in x.iter_mut().zip(w) {
        *xi = (*xi * scale) * wi;
    }
}

pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut sum = 0.0f64;
    for &v in x {
        sum += (v * v) as f64;
    }
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// llama.cpp's `build_gdn_l2_norm`: rms_norm(x, eps/n) scaled by 1/sqrt(n), i.e.
/// x / sqrt(Σx² + eps) computed in ggml's operation order.
pub fn gdn_l2_norm_inplace(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    let scale = rms_scale(x, eps / n);
    let post = 1.0 / n.sqrt();
    for v in x.iter_mut() {
        *v = (*v * scale) * post;
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// SiLU of one ggml row in place (`ggml_silu` runs `ggml_vec_silu_f32` per row of ne0).
#[inline]
pub fn silu_row_inplace(x: &mut [f32]) {
    xwen_kernels::f32ops::silu_inplace(x)
}

/// Softmax of one row in place as `ggml_soft_max` (no mask): f64 sum, ggml's vector expf.
pub fn softmax_inplace(x: &mut [f32]) {
    xwen_kernels::f32ops::softmax_inplace(x)
}

/// Softmax of the first x.len() columns of a `row_len`-column row whose other columns are
/// masked to −inf, as `ggml_soft_max_ext` with llama.cpp's causal mask. The masked columns give
/// exp = 0 but decide whether the last visible columns are summed by the vector reduction or
/// the scalar tail, so the sum's rounding depends on `row_len`.
pub fn softmax_masked_inplace(x: &mut [f32], row_len: usize) {
    xwen_kernels::f32ops::softmax_masked_inplace(x, row_len)
}

/// Rotary tables for NeoX-style rope over the first `n_rot` dims of a head.
/// theta advances multiplicatively (theta *= theta_scale) exactly as ggml's rope cache does, so
/// the angles carry the same rounding.
pub fn rope_cache(pos: usize, n_rot: usize, freq_base: f32, cos: &mut [f32], sin: &mut [f32]) {
    let theta_scale = freq_base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for i in 0..n_rot / 2 {
        cos[i] = theta.cos();
        sin[i] = theta.sin();
        theta *= theta_scale;
    }
}

/// The rotary pairs that interleaved M-RoPE leaves unrotated for a text token (ggml-cpu
/// `ggml_mrope_cache_init` with is_imrope): pair i's sector is i mod Σsections; sectors
/// s ≡ 0, 1, 2 (mod 3) below 3 × sections[0, 1, 2] turn by the t, h, w positions (all p for text),
/// every other one by the 4th, which llama.cpp sets to 0 for text — angle 0. Checkpoints'
/// sections ([11, 11, 10] over 32 pairs) claim every pair; other shapes need not.
pub fn imrope_text_still(sections: [u32; 4], n_rot: usize) -> Vec<bool> {
    let sect_dims = sections.iter().sum::<u32>() as usize;
    (0..n_rot / 2)
        .map(|i| {
            if sect_dims == 0 {
                return false;
            }
            let s = i % sect_dims;
            let claimed = |k: usize| s % 3 == k && s < 3 * sections[k] as usize;
            !(claimed(0) || claimed(1) || claimed(2))
        })
        .collect()
}

/// cos 1, sin 0 (ggml's rope_yarn of angle 0) for the pairs marked still.
pub fn hold_pairs(still: &[bool], cos: &mut [f32], sin: &mut [f32]) {
    for (i, _) in still.iter().enumerate().filter(|(_, &s)| s) {
        cos[i] = 1.0;
        sin[i] = 0.0;
    }
}

/// Rotate one head in place: pairs (i, i + n_rot/2), dims ≥ n_rot untouched.
///
/// In the rounding of llama.cpp's CPU build (GCC, -march=native, so FMA): ggml's rotate_pairs
/// writes `x0*cos - x1*sin` and `x0*sin + x1*cos`, which GCC contracts to one fused
/// multiply-add on the first product (the second product rounded first). Measured: that form
/// reproduces ggml's roped K bit for bit where the plain form is 1 ulp off in ~10% of elements.
pub fn rope_neox_inplace(head: &mut [f32], n_rot: usize, cos: &[f32], sin: &[f32]) {
    let half = n_rot / 2;
    for i in 0..half {
        let x0 = head[i];
        let x1 = head[i + half];
        head[i] = x0.mul_add(cos[i], -(x1 * sin[i]));
        head[i + half] = x0.mul_add(sin[i], x1 * cos[i]);
    }
}

/// f32 dot product (runtime-dispatched SIMD in xwen-kernels).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    xwen_kernels::f32ops::dot(a, b)
}

/// y += a·x (runtime-dispatched SIMD in xwen-kernels).
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    xwen_kernels::f32ops::axpy(a, x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_except_skips_the_banned_and_keeps_the_first_of_equals() {
        let x = [1.0f32, 7.0, 3.0, 7.0, 6.0];
        assert_eq!(argmax(&x), 1);
        assert_eq!(argmax_except(&x, &[]), 1);
        assert_eq!(argmax_except(&x, &[1]), 3);
        assert_eq!(argmax_except(&x, &[1, 3]), 4);
        assert_eq!(argmax_except(&x, &[0, 1, 2, 3, 4]), 0);
        assert_eq!(argmax_except(&[f32::NEG_INFINITY, f32::NEG_INFINITY], &[0]), 1);
    }

    #[test]
    fn l2_norm_matches_definition() {
        let mut x = vec![3.0f32, 4.0];
        gdn_l2_norm_inplace(&mut x, 1e-6);
        let want = 3.0 / (25.0f32 + 1e-6).sqrt();
        assert!((x[0] - want).abs() < 1e-6);
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norm() {
        let mut h: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let (mut c, mut s) = (vec![0.0; 2], vec![0.0; 2]);
        rope_cache(5, 4, 10000.0, &mut c, &mut s);
        let before: f32 = h[..4].iter().map(|v| v * v).sum();
        rope_neox_inplace(&mut h, 4, &c, &s);
        let after: f32 = h[..4].iter().map(|v| v * v).sum();
        assert!((before - after).abs() < 1e-3);
        assert_eq!(&h[4..], &[5.0, 6.0, 7.0, 8.0]);
        // Pair (0, 2) rotated by angle 5 rad.
        assert!((h[0] - (1.0 * 5f32.cos() - 3.0 * 5f32.sin())).abs() < 1e-5);
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut x = vec![1.0f32, 2.0, 3.0, -100.0];
        softmax_inplace(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[2] > x[1] && x[1] > x[0]);
    }
}

/// The index of the first largest of `logits` and the probability a softmax over them gives
/// it (a drafter's confidence in its pick, against `p_min`); (0, 1) for an empty slice.
pub fn top(logits: &[f32]) -> (u32, f32) {
    let best = argmax(logits) as usize;
    let Some(&m) = logits.get(best) else { return (0, 1.0) };
    let sum: f64 = logits.iter().map(|&x| ((x - m) as f64).exp()).sum();
    (best as u32, (1.0 / sum) as f32)
}

/// The index of the first largest value (greedy sampling's pick; 0 for an empty slice).
pub fn argmax(x: &[f32]) -> u32 {
    argmax_except(x, &[])
}

/// `argmax` over the values whose index is not in `banned` (greedy sampling with those tokens
/// banned, as a logit bias of −∞ bans them; 0 when every index is banned).
pub fn argmax_except(x: &[f32], banned: &[u32]) -> u32 {
    let mut best: Option<usize> = None;
    for (i, &v) in x.iter().enumerate() {
        if banned.contains(&(i as u32)) {
            continue;
        }
        if best.is_none_or(|b| v > x[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0) as u32
}
