//! Q5_K: Q4_K's super-block with a fifth bit per element.
//!
//! Layout (block_q5_K, 176 B): f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128].
//! Element 64*c + l (l < 32): low nibble of qs[32c + l] plus 16 if bit 2c of qh[l] is set;
//! element 64*c + 32 + l: high nibble plus 16 if bit 2c+1 of qh[l] is set.
//! Quantizer: quantize_row_q5_K_ref (ggml-quants.c:1645).

use super::q4_k::{pack_scales_k4, quantize_k4_scales, requantize_k4, unpack_scales_k4};
use super::q8::{q8k_parts, Q8_K_BYTES, QK_K};
use crate::half::{f32_to_f16, read_f16};

pub const BYTES: usize = 176;

pub fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let mut codes = [0u8; QK_K];
        let (ls, lm, d, dmin) = quantize_k4_scales(xb, 31, -0.5, 15, &mut codes);
        pack_scales_k4(&ls, &lm, &mut ob[4..16]);
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        ob[2..4].copy_from_slice(&f32_to_f16(dmin).to_le_bytes());
        requantize_k4(
            xb,
            read_f16(&ob[..2]),
            read_f16(&ob[2..4]),
            &ls,
            &lm,
            31,
            &mut codes,
        );
        ob[16..48].fill(0);
        for c in 0..4 {
            for j in 0..32 {
                let mut l1 = codes[64 * c + j];
                if l1 > 15 {
                    l1 -= 16;
                    ob[16 + j] |= 1 << (2 * c);
                }
                let mut l2 = codes[64 * c + 32 + j];
                if l2 > 15 {
                    l2 -= 16;
                    ob[16 + j] |= 2 << (2 * c);
                }
                ob[48 + 32 * c + j] = l1 | (l2 << 4);
            }
        }
    }
}

/// The 256 five-bit codes of a block, in element order.
#[inline]
pub fn codes(b: &[u8]) -> [u8; QK_K] {
    let (qh, qs) = (&b[16..48], &b[48..176]);
    let mut o = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            o[64 * c + l] = (qs[32 * c + l] & 0xf) | (((qh[l] >> (2 * c)) & 1) << 4);
            o[64 * c + 32 + l] = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
        }
    }
    o
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (read_f16(b), read_f16(&b[2..]));
        let (sc, m) = unpack_scales_k4(&b[4..16]);
        let q = codes(b);
        for s in 0..8 {
            let (ds, ms) = (d * sc[s] as f32, min * m[s] as f32);
            for l in 0..32 {
                y[32 * s + l] = ds * q[32 * s + l] as f32 - ms;
            }
        }
    }
}

pub fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, ya) in w
        .chunks_exact(BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let (dy, q8, bsums) = q8k_parts(ya);
        let (sc, m) = unpack_scales_k4(&b[4..16]);
        let q = codes(b);
        let mut summ = 0i32;
        for j in 0..16 {
            summ += bsums[j] as i32 * m[j / 2] as i32;
        }
        let mut sumi = 0i32;
        for s in 0..8 {
            let mut t = 0i32;
            for l in 0..32 {
                t += q[32 * s + l] as i32 * q8[32 * s + l] as i8 as i32;
            }
            sumi += t * sc[s] as i32;
        }
        sumf += read_f16(b) * dy * sumi as f32 - read_f16(&b[2..]) * dy * summ as f32;
    }
    sumf
}
