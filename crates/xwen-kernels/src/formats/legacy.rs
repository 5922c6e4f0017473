//! The 32-element "legacy" formats Q4_0, Q4_1, Q5_0, Q5_1 and the non-linear IQ4_NL.
//!
//! Layouts (ggml-common.h): q4_0 { f16 d; u8 qs[16] } 18 B; q4_1 { f16 d, m; u8 qs[16] } 20 B;
//! q5_0 { f16 d; u8 qh[4]; u8 qs[16] } 22 B; q5_1 { f16 d, m; u8 qh[4]; u8 qs[16] } 24 B;
//! iq4_nl { f16 d; u8 qs[16] } 18 B. Element j of a block is the low nibble of qs[j] for
//! j < 16 and the high nibble of qs[j-16] otherwise; Q5's fifth bit j is bit j of qh.
//! Quantizers are ggml-quants.c's *_ref (lines 113-275, IQ4_NL at 5072).

use crate::half::{f32_to_f16, read_f16};

pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const IQ4_NL_BYTES: usize = 18;

pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// First element of largest magnitude, with its sign (ggml's amax/max scan with strict `<`).
#[inline]
pub fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

pub fn quantize_q4_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let (_, max) = signed_absmax(xb);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..16 {
            let x0 = (((xb[j] * id) + 8.5) as i32 as i8 as i32).min(15) as u8;
            let x1 = (((xb[j + 16] * id) + 8.5) as i32 as i8 as i32).min(15) as u8;
            ob[2 + j] = x0 | (x1 << 4);
        }
    }
}

pub fn quantize_q4_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q4_1_BYTES)) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        ob[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        for j in 0..16 {
            let x0 = ((((xb[j] - min) * id) + 0.5) as i32 as i8 as i32).min(15) as u8;
            let x1 = ((((xb[j + 16] - min) * id) + 0.5) as i32 as i8 as i32).min(15) as u8;
            ob[4 + j] = x0 | (x1 << 4);
        }
    }
}

pub fn quantize_q5_0(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q5_0_BYTES)) {
        let (_, max) = signed_absmax(xb);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let mut qh = 0u32;
        for j in 0..16 {
            let x0 = (((xb[j] * id) + 16.5) as i32 as i8 as i32).min(31) as u32;
            let x1 = (((xb[j + 16] * id) + 16.5) as i32 as i8 as i32).min(31) as u32;
            ob[6 + j] = ((x0 & 0xf) | ((x1 & 0xf) << 4)) as u8;
            qh |= ((x0 & 0x10) >> 4) << j;
            qh |= ((x1 & 0x10) >> 4) << (j + 16);
        }
        ob[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

pub fn quantize_q5_1(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q5_1_BYTES)) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        ob[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        let mut qh = 0u32;
        for j in 0..16 {
            let x0 = ((((xb[j] - min) * id) + 0.5) as i32 as u8) as u32;
            let x1 = ((((xb[j + 16] - min) * id) + 0.5) as i32 as u8) as u32;
            ob[8 + j] = ((x0 & 0xf) | ((x1 & 0xf) << 4)) as u8;
            qh |= ((x0 & 0x10) >> 4) << j;
            qh |= ((x1 & 0x10) >> 4) << (j + 16);
        }
        ob[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

/// The 32 quant codes of a 4-bit block (low nibbles then high nibbles).
#[inline]
pub fn nibbles(qs: &[u8]) -> [u8; 32] {
    let mut o = [0u8; 32];
    for j in 0..16 {
        o[j] = qs[j] & 0xf;
        o[j + 16] = qs[j] >> 4;
    }
    o
}

/// 5-bit codes: nibbles plus bit j of qh as bit 4.
#[inline]
pub fn codes5(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut o = nibbles(qs);
    for (j, v) in o.iter_mut().enumerate() {
        *v |= (((h >> j) & 1) << 4) as u8;
    }
    o
}

pub fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_0_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = read_f16(b);
        for (o, q) in y.iter_mut().zip(nibbles(&b[2..])) {
            *o = (q as i32 - 8) as f32 * d;
        }
    }
}

pub fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_1_BYTES).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (read_f16(b), read_f16(&b[2..]));
        for (o, q) in y.iter_mut().zip(nibbles(&b[4..])) {
            *o = q as f32 * d + m;
        }
    }
}

pub fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_0_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = read_f16(b);
        for (o, q) in y.iter_mut().zip(codes5(&b[2..6], &b[6..])) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

pub fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_1_BYTES).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (read_f16(b), read_f16(&b[2..]));
        for (o, q) in y.iter_mut().zip(codes5(&b[4..8], &b[8..])) {
            *o = q as f32 * d + m;
        }
    }
}

pub fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(IQ4_NL_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = read_f16(b);
        for (o, q) in y.iter_mut().zip(nibbles(&b[2..])) {
            *o = d * KVALUES_IQ4NL[q as usize] as f32;
        }
    }
}

#[inline]
fn q8(a: &[u8]) -> impl Iterator<Item = i32> + '_ {
    a.iter().map(|&v| v as i8 as i32)
}

/// Scalar dots with ggml's generic order (ggml-cpu/quants.c): integer block sum, then scale.
pub fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, ba) in w
        .chunks_exact(Q4_0_BYTES)
        .zip(a.chunks_exact(34))
        .take(n / 32)
    {
        let sumi: i32 = nibbles(&bw[2..])
            .iter()
            .zip(q8(&ba[2..]))
            .map(|(&q, y)| (q as i32 - 8) * y)
            .sum();
        sumf += sumi as f32 * read_f16(bw) * read_f16(ba);
    }
    sumf
}

pub fn dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, ba) in w
        .chunks_exact(Q4_1_BYTES)
        .zip(a.chunks_exact(36))
        .take(n / 32)
    {
        let sumi: i32 = nibbles(&bw[4..])
            .iter()
            .zip(q8(&ba[4..]))
            .map(|(&q, y)| q as i32 * y)
            .sum();
        sumf +=
            (read_f16(bw) * read_f16(ba)) * sumi as f32 + read_f16(&bw[2..]) * read_f16(&ba[2..]);
    }
    sumf
}

pub fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, ba) in w
        .chunks_exact(Q5_0_BYTES)
        .zip(a.chunks_exact(34))
        .take(n / 32)
    {
        let codes = codes5(&bw[2..6], &bw[6..]);
        let sumi: i32 = codes
            .iter()
            .zip(q8(&ba[2..]))
            .map(|(&q, y)| (q as i32 - 16) * y)
            .sum();
        sumf += (read_f16(bw) * read_f16(ba)) * sumi as f32;
    }
    sumf
}

pub fn dot_q5_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, ba) in w
        .chunks_exact(Q5_1_BYTES)
        .zip(a.chunks_exact(36))
        .take(n / 32)
    {
        let codes = codes5(&bw[4..8], &bw[8..]);
        let sumi: i32 = codes
            .iter()
            .zip(q8(&ba[4..]))
            .map(|(&q, y)| q as i32 * y)
            .sum();
        sumf +=
            (read_f16(bw) * read_f16(ba)) * sumi as f32 + read_f16(&bw[2..]) * read_f16(&ba[2..]);
    }
    sumf
}

pub fn dot_iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, ba) in w
        .chunks_exact(IQ4_NL_BYTES)
        .zip(a.chunks_exact(34))
        .take(n / 32)
    {
        let sumi: i32 = nibbles(&bw[2..])
            .iter()
            .zip(q8(&ba[2..]))
            .map(|(&q, y)| KVALUES_IQ4NL[q as usize] as i32 * y)
            .sum();
        sumf += (read_f16(bw) * read_f16(ba)) * sumi as f32;
    }
    sumf
}
