//! IQ4_NL and IQ4_XS quantizers (non-linear 4-bit grid `kvalues_iq4nl`), ported from
//! ggml-quants.c quantize_row_iq4_nl_impl (:4938) with quant_weights = NULL, and IQ4_XS
//! dequantize/dot. IQ4_NL's dequant and dot live in `legacy` beside the other 32-blocks.
//!
//! IQ4_XS layout (block_iq4_xs, 136 B): f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128].
//! Sub-block ib (32 elements) has scale ((scales_l[ib/2] >> 4(ib%2)) & 15 | ((scales_h >> 2ib) & 3) << 4) - 32
//! and its 32 codes are the nibbles of qs[16ib..16ib+16] (low nibbles first).

use super::legacy::{nibbles, KVALUES_IQ4NL as KV};
use super::q8::{nearest_int, q8k_parts, Q8_K_BYTES, QK_K};
use crate::half::{f32_to_f16, read_f16};

pub const XS_BYTES: usize = 136;

/// best_index_int8 (ggml-quants.c:28).
#[inline]
fn best_index(x: f32) -> u8 {
    if x <= KV[0] as f32 {
        return 0;
    }
    if x >= KV[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < KV[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (KV[mu - 1] as f32) < KV[mu] as f32 - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// One sub-block's scale search. Returns the scale (0 for an all-zero block, codes untouched).
fn block_scale(xb: &[f32], weight: &[f32], lb: &mut [u8], ntry: i32) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        return 0.0;
    }
    let v0 = KV[0] as f32;
    let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for j in 0..xb.len() {
        let l = best_index(id * xb[j]);
        lb[j] = l;
        let q = KV[l as usize] as f32;
        let w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        id = (itry as f32 + v0) / max;
        sumqx = 0.0;
        sumq2 = 0.0;
        for j in 0..xb.len() {
            let q = KV[best_index(id * xb[j]) as usize] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// IQ4_NL as llama-quantize writes it: ggml_quantize_chunk -> quantize_iq4_nl with no
/// importance weights (ntry = 7, then codes re-chosen from the final scale). ggml's separate
/// quantize_row_iq4_nl_ref (ntry = -1) is not what model files contain, so it is not used.
pub fn quantize_nl(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(18)) {
        let mut l = [0u8; 32];
        let weight: [f32; 32] = std::array::from_fn(|j| xb[j] * xb[j]);
        let d = block_scale(xb, &weight, &mut l, 7);
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for j in 0..32 {
            l[j] = best_index(id * xb[j]);
        }
        for j in 0..16 {
            ob[2 + j] = l[j] | (l[16 + j] << 4);
        }
    }
}

/// quantize_row_iq4_xs_ref (quantize_iq4_xs with no importance weights, ntry = 7).
pub fn quantize_xs(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(XS_BYTES)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 8];
        let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
        for ib in 0..8 {
            let xs = &xb[32 * ib..32 * ib + 32];
            let weight: [f32; 32] = std::array::from_fn(|j| xs[j] * xs[j]);
            scales[ib] = block_scale(xs, &weight, &mut l[32 * ib..32 * ib + 32], 7);
            if scales[ib].abs() > amax_scale {
                amax_scale = scales[ib].abs();
                max_scale = scales[ib];
            }
        }
        let d = -max_scale / 32.0;
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (mut sh, mut sl) = (0u16, [0u8; 4]);
        for ib in 0..8 {
            let li = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                l[32 * ib + j] = best_index(idl * xb[32 * ib + j]);
            }
            let lv = (li + 32) as u8;
            if ib % 2 == 0 {
                sl[ib / 2] = lv & 0xf;
            } else {
                sl[ib / 2] |= (lv & 0xf) << 4;
            }
            sh |= ((lv >> 4) as u16) << (2 * (ib % 8));
        }
        ob[2..4].copy_from_slice(&sh.to_le_bytes());
        ob[4..8].copy_from_slice(&sl);
        for i in 0..8 {
            for j in 0..16 {
                ob[8 + 16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
            }
        }
    }
}

#[inline]
pub fn xs_scale(b: &[u8], ib: usize) -> i32 {
    let sh = u16::from_le_bytes([b[2], b[3]]);
    (((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) as i32 | (((sh >> (2 * ib)) & 3) << 4) as i32) - 32
}

pub fn dequantize_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(XS_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(b);
        for ib in 0..8 {
            let dl = d * xs_scale(b, ib) as f32;
            for (o, q) in y[32 * ib..32 * ib + 32]
                .iter_mut()
                .zip(nibbles(&b[8 + 16 * ib..]))
            {
                *o = dl * KV[q as usize] as f32;
            }
        }
    }
}

pub fn dot_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (b, ya) in w
        .chunks_exact(XS_BYTES)
        .zip(a.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let (dy, q8, _) = q8k_parts(ya);
        let mut sumi = 0i32;
        for ib in 0..8 {
            let t: i32 = nibbles(&b[8 + 16 * ib..])
                .iter()
                .zip(&q8[32 * ib..32 * ib + 32])
                .map(|(&q, &y)| KV[q as usize] as i32 * y as i8 as i32)
                .sum();
            sumi += t * xs_scale(b, ib);
        }
        sumf += read_f16(b) * dy * sumi as f32;
    }
    sumf
}
