//! Q2_K: 256-element super-block of 16 sub-blocks of 16 with 4-bit scale and 4-bit min.
//!
//! Layout (block_q2_K, 84 B): u8 scales[16] (low nibble scale, high nibble min); u8 qs[64];
//! f16 d; f16 dmin. For half h and l < 32, element 128h + 32k + l = (qs[32h + l] >> 2k) & 3.
//! Value = d*(sc&15)*q - dmin*(sc>>4). Quantizer: quantize_row_q2_K_ref (ggml-quants.c:891).

use super::q8::{nearest_int, q8k_parts, Q8_K_BYTES, QK_K};
use super::search::make_qkx2_quants;
use crate::half::{f32_to_f16, read_f16};

pub const BYTES: usize = 84;

#[inline]
pub fn codes(b: &[u8]) -> [u8; QK_K] {
    let mut o = [0u8; QK_K];
    for h in 0..2 {
        for k in 0..4 {
            for l in 0..32 {
                o[128 * h + 32 * k + l] = (b[16 + 32 * h + l] >> (2 * k)) & 3;
            }
        }
    }
    o
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (read_f16(&b[80..]), read_f16(&b[82..]));
        let q = codes(b);
        for g in 0..16 {
            let sc = b[g];
            let (dl, ml) = (d * (sc & 0xf) as f32, min * (sc >> 4) as f32);
            for l in 0..16 {
                y[16 * g + l] = dl * q[16 * g + l] as f32 - ml;
            }
        }
    }
}

pub fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        let mut weights = [0f32; 16];
        for j in 0..16 {
            let xs = &xb[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(
                xs,
                &weights,
                3,
                &mut l[16 * j..16 * j + 16],
                -0.5,
                0.1,
                15,
                true,
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
        let q4scale = 15.0f32;
        if max_scale > 0.0 {
            let iscale = q4scale / max_scale;
            for j in 0..16 {
                ob[j] = nearest_int(iscale * scales[j]) as u8;
            }
            ob[80..82].copy_from_slice(&f32_to_f16(max_scale / q4scale).to_le_bytes());
        } else {
            ob[..16].fill(0);
            ob[80..82].copy_from_slice(&f32_to_f16(0.0).to_le_bytes());
        }
        if max_min > 0.0 {
            let iscale = q4scale / max_min;
            for j in 0..16 {
                ob[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            ob[82..84].copy_from_slice(&f32_to_f16(max_min / q4scale).to_le_bytes());
        } else {
            ob[82..84].copy_from_slice(&f32_to_f16(0.0).to_le_bytes());
        }
        let (dh, dmh) = (read_f16(&ob[80..]), read_f16(&ob[82..]));
        for j in 0..16 {
            let d = dh * (ob[j] & 0xf) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmh * (ob[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((xb[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let j = 128 * h + i;
                ob[16 + 32 * h + i] = l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6);
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
        let q = codes(b);
        let mut summs = 0i32;
        for j in 0..16 {
            summs += bsums[j] as i32 * (b[j] >> 4) as i32;
        }
        let mut isum = 0i32;
        for g in 0..16 {
            let mut t = 0i32;
            for l in 0..16 {
                t += q[16 * g + l] as i32 * q8[16 * g + l] as i8 as i32;
            }
            isum += t * (b[g] & 0xf) as i32;
        }
        sumf += dy * read_f16(&b[80..]) * isum as f32 - dy * read_f16(&b[82..]) * summs as f32;
    }
    sumf
}
