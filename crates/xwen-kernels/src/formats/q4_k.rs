//! Q4_K: 256-element super-block of 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min.
//!
//! Layout (ggml-common.h block_q4_K, 144 B): f16 d; f16 dmin; u8 scales[12]; u8 qs[128].
//! Element 64*c + l (l < 32) is the low nibble of qs[32c + l], element 64*c + 32 + l its high
//! nibble; sub-block s uses scale d*sc[s] and min dmin*m[s] (get_scale_min_k4 packing).
//! Value = d*sc*q - dmin*m. Quantizer: quantize_row_q4_K_ref (ggml-quants.c:1458).

use super::q8::{nearest_int, q8k_parts, QK_K};
use super::block::{blocks, Block, BlockQ4K};
use super::search::make_qkx2_quants;
use crate::half::{f32_to_f16, read_f16};

pub const BYTES: usize = 144;

/// ggml's get_scale_min_k4: (scale, min) of sub-block j from the 12 packed bytes.
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All 8 (scales, mins) at once.
#[inline]
pub fn unpack_scales_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = scale_min_k4(j, q);
    }
    (sc, m)
}

/// The inverse packing used by the Q4_K and Q5_K quantizers.
pub fn pack_scales_k4(ls: &[u8; 8], lm: &[u8; 8], out: &mut [u8]) {
    out[..12].fill(0);
    for j in 0..8 {
        if j < 4 {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (ls[j] & 0xf) | ((lm[j] & 0xf) << 4);
            out[j - 4] |= (ls[j] >> 4) << 6;
            out[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// Sub-block (scale, min) search shared with Q5_K; returns the quantized 6-bit scales/mins
/// and the two super-block factors. `nmax` is 15 (Q4_K) or 31 (Q5_K).
pub fn quantize_k4_scales(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    codes: &mut [u8; QK_K],
) -> ([u8; 8], [u8; 8], f32, f32) {
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    let mut weights = [0f32; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            xs,
            &weights,
            nmax,
            &mut codes[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        // C stores nearest_int into a uint8_t before MIN(63, .): keep the wrap.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    (ls, lm, max_scale / 63.0, max_min / 63.0)
}

/// Final code choice once the rounded (d, dmin) are known.
pub fn requantize_k4(
    x: &[f32],
    ob_d: f32,
    ob_dmin: f32,
    ls: &[u8; 8],
    lm: &[u8; 8],
    nmax: i32,
    codes: &mut [u8; QK_K],
) {
    for j in 0..8 {
        let d = ob_d * ls[j] as f32;
        if d == 0.0 {
            continue;
        }
        let dm = ob_dmin * lm[j] as f32;
        for ii in 0..32 {
            codes[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

pub fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let mut codes = [0u8; QK_K];
        let (ls, lm, d, dmin) = quantize_k4_scales(xb, 15, -1.0, 20, &mut codes);
        pack_scales_k4(&ls, &lm, &mut ob[4..16]);
        let dh = f32_to_f16(d);
        let dmh = f32_to_f16(dmin);
        ob[..2].copy_from_slice(&dh.to_le_bytes());
        ob[2..4].copy_from_slice(&dmh.to_le_bytes());
        requantize_k4(
            xb,
            read_f16(&ob[..2]),
            read_f16(&ob[2..4]),
            &ls,
            &lm,
            15,
            &mut codes,
        );
        for c in 0..4 {
            for l in 0..32 {
                ob[16 + 32 * c + l] = codes[64 * c + l] | (codes[64 * c + 32 + l] << 4);
            }
        }
    }
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockQ4K>(src).iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d(), b.dmin());
        let (sc, m) = unpack_scales_k4(&b.scales);
        for c in 0..4 {
            let q = &b.qs[32 * c..32 * c + 32];
            let (d1, m1) = (d * sc[2 * c] as f32, min * m[2 * c] as f32);
            let (d2, m2) = (d * sc[2 * c + 1] as f32, min * m[2 * c + 1] as f32);
            for l in 0..32 {
                y[64 * c + l] = d1 * (q[l] & 0xf) as f32 - m1;
                y[64 * c + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// Scalar reference dot with Q8_K activations: exact integer sums per super-block, then
/// d*dy*sum(sc*isum) - dmin*dy*sum(m*bsum).
pub fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, ya) in blocks::<BlockQ4K>(w)
        .iter()
        .zip(a.chunks_exact(super::q8::Q8_K_BYTES))
        .take(n / QK_K)
    {
        let (dy, q8, bsums) = q8k_parts(ya);
        let (sc, m) = unpack_scales_k4(&b.scales);
        let mut summ = 0i32;
        for j in 0..16 {
            summ += bsums[j] as i32 * m[j / 2] as i32;
        }
        let mut sumi = 0i32;
        for c in 0..4 {
            let q = &b.qs[32 * c..32 * c + 32];
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                lo += (q[l] & 0xf) as i32 * q8[64 * c + l] as i8 as i32;
                hi += (q[l] >> 4) as i32 * q8[64 * c + 32 + l] as i8 as i32;
            }
            sumi += lo * sc[2 * c] as i32 + hi * sc[2 * c + 1] as i32;
        }
        sumf += b.d() * dy * sumi as f32 - b.dmin() * dy * summ as f32;
    }
    sumf
}

// SAFETY: a repr(C) struct of byte arrays (`block`); `blocks` asserts its size against this
// format's block size at compile time.
unsafe impl Block for BlockQ4K {
    const BYTES: usize = BYTES;
}
