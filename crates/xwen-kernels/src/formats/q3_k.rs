//! Q3_K: 256-element super-block of 16 sub-blocks of 16 with 6-bit signed scales.
//!
//! Layout (block_q3_K, 110 B): u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d.
//! For half h, k < 4, l < 32: element 128h + 32k + l has low bits (qs[32h + l] >> 2k) & 3 and
//! subtracts 4 unless bit (4h + k) of hmask[l] is set. Scales: 16 six-bit values packed in 12
//! bytes (low nibbles in bytes 0..8, high 2 bits in bytes 8..12), stored +32.
//! Quantizer: quantize_row_q3_K_ref (ggml-quants.c:1230).

use super::q8::{nearest_int, q8k_parts, Q8_K_BYTES, QK_K};
use super::search::make_q3_quants;
use crate::half::{f32_to_f16, read_f16};

pub const BYTES: usize = 110;

/// The 16 scales (already minus 32), ggml's kmask unpacking.
#[inline]
pub fn scales(s: &[u8]) -> [i8; 16] {
    let mut o = [0i8; 16];
    for (j, v) in o.iter_mut().enumerate() {
        let lo = if j < 8 { s[j] & 0xf } else { s[j - 8] >> 4 };
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *v = (lo | (hi << 4)) as i8 - 32;
    }
    o
}

/// Signed codes (-4..3) in element order.
#[inline]
pub fn codes(b: &[u8]) -> [i8; QK_K] {
    let (hm, qs) = (&b[..32], &b[32..96]);
    let mut o = [0i8; QK_K];
    for h in 0..2 {
        for k in 0..4 {
            for l in 0..32 {
                let low = ((qs[32 * h + l] >> (2 * k)) & 3) as i8;
                let high = (hm[l] >> (4 * h + k)) & 1;
                o[128 * h + 32 * k + l] = low - if high != 0 { 0 } else { 4 };
            }
        }
    }
    o
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d_all = read_f16(&b[108..]);
        let sc = scales(&b[96..108]);
        let q = codes(b);
        for g in 0..16 {
            let dl = d_all * sc[g] as f32;
            for l in 0..16 {
                y[16 * g + l] = dl * q[16 * g + l] as f32;
            }
        }
    }
}

pub fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let mut l = [0i8; QK_K];
        let mut sc = [0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for j in 0..16 {
            sc[j] = make_q3_quants(
                &xb[16 * j..16 * j + 16],
                4,
                &mut l[16 * j..16 * j + 16],
                true,
            );
            if sc[j].abs() > amax {
                amax = sc[j].abs();
                max_scale = sc[j];
            }
        }
        let s = &mut ob[96..108];
        s.fill(0);
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // int8_t l = nearest_int(...); l = MAX(-32, MIN(31, l)) + 32;
                let mut v = (nearest_int(iscale * sc[j]) as i8).clamp(-32, 31) + 32;
                if j < 8 {
                    s[j] = (v & 0xf) as u8;
                } else {
                    s[j - 8] |= ((v & 0xf) << 4) as u8;
                }
                v >>= 4;
                s[j % 4 + 8] |= (v << (2 * (j / 4))) as u8;
            }
            ob[108..110].copy_from_slice(&f32_to_f16(1.0 / iscale).to_le_bytes());
        } else {
            ob[108..110].copy_from_slice(&f32_to_f16(0.0).to_le_bytes());
        }
        let dh = read_f16(&ob[108..]);
        let scl = scales(&ob[96..108]);
        for j in 0..16 {
            let d = dh * scl[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int(xb[16 * j + ii] / d).clamp(-4, 3) as i8 + 4;
            }
        }
        let mut lu: [u8; QK_K] = l.map(|v| v as u8);
        ob[..32].fill(0);
        for (j, v) in lu.iter_mut().enumerate() {
            if *v > 3 {
                ob[j % 32] |= 1 << (j / 32);
                *v -= 4;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let j = 128 * h + i;
                ob[32 + 32 * h + i] =
                    lu[j] | (lu[j + 32] << 2) | (lu[j + 64] << 4) | (lu[j + 96] << 6);
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
        let (dy, q8, _) = q8k_parts(ya);
        let sc = scales(&b[96..108]);
        let q = codes(b);
        let mut isum = 0i32;
        for g in 0..16 {
            let mut t = 0i32;
            for l in 0..16 {
                t += q[16 * g + l] as i32 * q8[16 * g + l] as i8 as i32;
            }
            isum += t * sc[g] as i32;
        }
        sumf += read_f16(&b[108..]) * dy * isum as f32;
    }
    sumf
}
