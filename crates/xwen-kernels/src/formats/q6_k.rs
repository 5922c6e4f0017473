//! Q6_K: 256-element super-block of 16 sub-blocks of 16 with signed 8-bit scales.
//!
//! Layout (block_q6_K, 210 B): u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d (last!).
//! For half h (128 elements) and l < 32, with ql' = ql[64h..], qh' = qh[32h..]:
//! element 128h + l      = (ql'[l] & 15)      | ((qh'[l] >> 0) & 3) << 4
//! element 128h + 32 + l = (ql'[l + 32] & 15) | ((qh'[l] >> 2) & 3) << 4
//! element 128h + 64 + l = (ql'[l] >> 4)      | ((qh'[l] >> 4) & 3) << 4
//! element 128h + 96 + l = (ql'[l + 32] >> 4) | ((qh'[l] >> 6) & 3) << 4
//! each minus 32; element e uses scales[e / 16]. Value = d * scale * q.
//! Quantizer: quantize_row_q6_K_ref (ggml-quants.c:1870).

use super::q8::{nearest_int, q8k_parts, Q8_K_BYTES, QK_K};
use super::block::{blocks, Block, BlockQ6K};
use super::search::make_qx_quants;
use crate::half::{f32_to_f16, read_f16};

pub const BYTES: usize = 210;

/// The 256 signed codes (-32..31) of a block (its 210 bytes), in element order.
#[inline]
pub fn codes(b: &[u8]) -> [i8; QK_K] {
    block_codes(&blocks::<BlockQ6K>(&b[..BYTES])[0])
}

/// `codes` of a typed block.
#[inline]
fn block_codes(b: &BlockQ6K) -> [i8; QK_K] {
    let mut o = [0i8; QK_K];
    for h in 0..2 {
        let ql = &b.ql[64 * h..64 * h + 64];
        let qh = &b.qh[32 * h..32 * h + 32];
        for l in 0..32 {
            o[128 * h + l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
            o[128 * h + 32 + l] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            o[128 * h + 64 + l] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            o[128 * h + 96 + l] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    o
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(&b[208..]);
        let q = codes(b);
        for (e, o) in y.iter_mut().enumerate() {
            // ggml evaluates d * sc * q left to right.
            *o = d * (b[192 + e / 16] as i8) as f32 * q[e] as f32;
        }
    }
}

pub fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..16 {
            let s = make_qx_quants(
                &xb[16 * ib..16 * ib + 16],
                32,
                &mut l[16 * ib..16 * ib + 16],
                1,
            );
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < 1e-15 {
            ob.fill(0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        ob[208..210].copy_from_slice(&f32_to_f16(1.0 / iscale).to_le_bytes());
        for ib in 0..16 {
            ob[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }
        let dh = read_f16(&ob[208..]);
        for j in 0..16 {
            let d = dh * (ob[192 + j] as i8) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(xb[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        let l: [u8; QK_K] = l.map(|v| v as u8);
        for h in 0..2 {
            let j = 128 * h;
            for i in 0..32 {
                let (q1, q2, q3, q4) = (
                    l[j + i] & 0xf,
                    l[j + i + 32] & 0xf,
                    l[j + i + 64] & 0xf,
                    l[j + i + 96] & 0xf,
                );
                ob[64 * h + i] = q1 | (q3 << 4);
                ob[64 * h + i + 32] = q2 | (q4 << 4);
                ob[128 + 32 * h + i] = (l[j + i] >> 4)
                    | ((l[j + i + 32] >> 4) << 2)
                    | ((l[j + i + 64] >> 4) << 4)
                    | ((l[j + i + 96] >> 4) << 6);
            }
        }
    }
}

pub fn dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, ya) in blocks::<BlockQ6K>(w)
        .iter()
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let (dy, q8, _) = q8k_parts(ya);
        let q = block_codes(b);
        let mut sumi = 0i32;
        for g in 0..16 {
            let mut t = 0i32;
            for l in 0..16 {
                t += q[16 * g + l] as i32 * q8[16 * g + l] as i8 as i32;
            }
            sumi += t * b.scales[g] as i32;
        }
        sumf += b.d() * dy * sumi as f32;
    }
    sumf
}

// SAFETY: a repr(C) struct of byte arrays (`block`); `blocks` asserts its size against this
// format's block size at compile time.
unsafe impl Block for BlockQ6K {
    const BYTES: usize = BYTES;
}
