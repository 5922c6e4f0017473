//! 8-bit formats: Q8_0 (weights and activations), Q8_1 (activations for Q4_1/Q5_1) and Q8_K
//! (activations for the k-quants and IQ4_XS).
//!
//! Layouts (ggml-common.h): block_q8_0 { f16 d; i8 qs[32] } = 34 bytes;
//! block_q8_1 { f16 d; f16 s; i8 qs[32] } = 36 bytes (s = d * sum(qs));
//! block_q8_K { f32 d; i8 qs[256]; i16 bsums[16] } = 292 bytes (bsums = sums of 16 quants).
//!
//! Three rounding flavours of the 32-element 8-bit quantizer exist in ggml and they do not agree
//! bit for bit, so activations must use the one llama.cpp runs on the same architecture:
//! - reference (ggml-quants.c:276 quantize_row_q8_0_ref): id = 1/(amax/127), roundf (ties away);
//! - x86 AVX/AVX2/AVX-512 (ggml-cpu/arch/x86/quants.c:302 quantize_row_q8_0): id = 127/amax,
//!   `_mm256_round_ps(_MM_ROUND_NEAREST)` (ties to even);
//! - Arm NEON (ggml-cpu/arch/arm/quants.c:41): id = 1/(amax/127), `vcvtnq_s32_f32` (ties to even).
//!
//! Q8_K has one quantizer on every architecture (quantize_row_q8_K = quantize_row_q8_K_ref,
//! ggml-quants.c:2769): iscale = -127/max where max is the first element of largest magnitude,
//! rounding by the `nearest_int` trick (ties to even). The one deviation is the x86 AVX2
//! 4-row interleaving quantizer used for repacked Q4_K matmuls (arch/x86/repack.cpp:290
//! ggml_quantize_mat_q8_K_4x8): on a +a/-a tie for the largest magnitude it takes the positive
//! one. See [`quantize_q8_k_prefer_positive`].

use super::block::{blocks, Block, BlockQ8_0};
use crate::half::{f32_to_f16, read_f16, read_f32};

pub const Q8_0_BYTES: usize = 34;
pub const Q8_1_BYTES: usize = 36;
pub const Q8_K_BYTES: usize = 292;
pub const QK_K: usize = 256;

/// Which rounding of the 32-wide 8-bit quantizer to use (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q8Flavor {
    Reference,
    X86,
    Arm,
}

impl Q8Flavor {
    /// The flavour llama.cpp's CPU backend uses on the architecture this was compiled for.
    pub const fn native() -> Q8Flavor {
        if cfg!(target_arch = "x86_64") {
            Q8Flavor::X86
        } else if cfg!(target_arch = "aarch64") {
            Q8Flavor::Arm
        } else {
            Q8Flavor::Reference
        }
    }
}

/// ggml's `nearest_int`: round half to even, exact for |x| < 2^22.
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

#[inline]
fn amax32(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// (d, id, rounding) for one 32-element block in the given flavour.
#[inline]
fn q8_block_quant(x: &[f32], flavor: Q8Flavor, qs: &mut [u8]) -> f32 {
    let amax = amax32(x);
    let d = amax / 127.0;
    match flavor {
        Q8Flavor::X86 => {
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            for (q, &v) in qs.iter_mut().zip(x) {
                *q = ((v * id).round_ties_even() as i32).clamp(-128, 127) as i8 as u8;
            }
        }
        Q8Flavor::Arm => {
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for (q, &v) in qs.iter_mut().zip(x) {
                *q = ((v * id).round_ties_even() as i32).clamp(-128, 127) as i8 as u8;
            }
        }
        Q8Flavor::Reference => {
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for (q, &v) in qs.iter_mut().zip(x) {
                *q = ((v * id).round() as i32).clamp(-128, 127) as i8 as u8;
            }
        }
    }
    d
}

pub fn quantize_q8_0(x: &[f32], out: &mut [u8], flavor: Q8Flavor) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let d = q8_block_quant(xb, flavor, &mut ob[2..]);
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    }
}

pub fn quantize_q8_0_ref(x: &[f32], out: &mut [u8]) {
    quantize_q8_0(x, out, Q8Flavor::Reference)
}

pub fn quantize_q8_1(x: &[f32], out: &mut [u8], flavor: Q8Flavor) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
        let d = q8_block_quant(xb, flavor, &mut ob[4..]);
        let sum: i32 = ob[4..].iter().map(|&q| q as i8 as i32).sum();
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        // Both ggml versions compute s from the integer sum times d (x86: d * hsum; ref: sum*d).
        ob[2..4].copy_from_slice(&f32_to_f16(d * sum as f32).to_le_bytes());
    }
}

pub fn quantize_q8_1_ref(x: &[f32], out: &mut [u8]) {
    quantize_q8_1(x, out, Q8Flavor::Reference)
}

fn q8_k_block(x: &[f32], out: &mut [u8], max: f32, amax: f32) {
    if amax == 0.0 {
        // ggml leaves bsums untouched here; they are multiplied by d = 0, so zero is equivalent.
        out.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    for (q, &v) in out[4..4 + QK_K].iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let s: i32 = out[4 + 16 * j..4 + 16 * j + 16]
            .iter()
            .map(|&q| q as i8 as i32)
            .sum();
        out[4 + QK_K + 2 * j..4 + QK_K + 2 * j + 2].copy_from_slice(&(s as i16).to_le_bytes());
    }
    out[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

/// quantize_row_q8_K_ref: max is the first element of largest magnitude.
pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        q8_k_block(xb, ob, max, amax);
    }
}

/// ggml_quantize_mat_q8_K_4x8 (x86 AVX2, arch/x86/repack.cpp:290) per row: identical to
/// [`quantize_q8_k`] except that when +a and -a both reach the largest magnitude a, the sign
/// is taken positive (its lane mask tracks only positive maxima).
pub fn quantize_q8_k_prefer_positive(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let positive = xb.contains(&amax);
        q8_k_block(xb, ob, if positive { amax } else { -amax }, amax);
    }
}

pub fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<BlockQ8_0>(src).iter().zip(dst.chunks_exact_mut(32)) {
        let d = b.d();
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

pub fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_1_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = read_f16(b);
        for (o, &q) in y.iter_mut().zip(&b[4..]) {
            *o = (q as i8 as f32) * d;
        }
    }
}

pub fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f32(b);
        for (o, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
            *o = d * (q as i8 as f32);
        }
    }
}

/// Sum of 32 int8 products; shared by every 32-block format's scalar dot.
#[inline]
pub fn isum32(a: &[i8; 32], b: &[u8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| x as i32 * (y as i8 as i32))
        .sum()
}

/// ggml_vec_dot_q8_0_q8_0_generic order: per-block integer sum, then sumi * (dx * dy).
pub fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (bw, ba) in blocks::<BlockQ8_0>(w).iter().zip(blocks::<BlockQ8_0>(a)).take(n / 32) {
        let sumi: i32 = bw.qs.iter().zip(&ba.qs).map(|(&x, &y)| x as i32 * y as i32).sum();
        sumf += sumi as f32 * (bw.d() * ba.d());
    }
    sumf
}

/// Bytes of one Q8_K block's fields.
#[inline]
pub fn q8k_parts(b: &[u8]) -> (f32, &[u8], [i16; 16]) {
    let mut bsums = [0i16; 16];
    for (j, s) in bsums.iter_mut().enumerate() {
        *s = i16::from_le_bytes([b[4 + QK_K + 2 * j], b[4 + QK_K + 2 * j + 1]]);
    }
    (read_f32(b), &b[4..4 + QK_K], bsums)
}

// SAFETY: a repr(C) struct of byte arrays (`block`); `blocks` asserts its size against this
// format's block size at compile time.
unsafe impl Block for BlockQ8_0 {
    const BYTES: usize = Q8_0_BYTES;
}
