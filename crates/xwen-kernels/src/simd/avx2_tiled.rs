//! AVX2 kernels for K-quant products in the float order of llama.cpp's tiled matmul (see
//! `crate::tiled`): one weight row against up to 4 Q8_K rows, each weight block widened once.
//! The integer sums are computed as ggml's AVX2 tiled microkernel does (maddubs of unsigned
//! codes with the activation, madd with the sub-block scale; the code bias folded out through
//! the Q8_K block sums), so they are exact, and the float epilogue is `tiled::fold`.

#![allow(clippy::needless_range_loop)] // t indexes several per-token arrays in lockstep

use std::arch::x86_64::*;

use super::avx2::h2f;
use crate::formats::q8::{Q8_K_BYTES, QK_K};
use crate::formats::{DotFn, MultiDotFn};
use crate::tiled::{fold, unpack};
use crate::GgmlType;

const Q6K: u8 = 0;
const Q4K: u8 = 1;
const Q5K: u8 = 2;
const Q3K: u8 = 3;
const Q2K: u8 = 4;

fn ggml_type(f: u8) -> GgmlType {
    match f {
        Q6K => GgmlType::Q6_K,
        Q4K => GgmlType::Q4_K,
        Q5K => GgmlType::Q5_K,
        Q3K => GgmlType::Q3_K,
        _ => GgmlType::Q2_K,
    }
}

macro_rules! kernel_set {
    ($f:expr, $dot:ident, $multi:ident) => {
        fn $dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
            let mut o = [0f32];
            // SAFETY: handed out by `kernels` only when AVX2/FMA/F16C were detected; callers
            // checked the slice lengths (one row of n elements each).
            unsafe { multi::<1, { $f }>(n, w, a, 0, &mut o) };
            o[0]
        }
        fn $multi(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
            // SAFETY: as above; `a` holds out.len() rows of `stride` bytes.
            unsafe { dispatch_t::<{ $f }>(n, w, a, stride, out) }
        }
    };
}

kernel_set!(Q6K, q6_k, q6_k_m);
kernel_set!(Q4K, q4_k, q4_k_m);
kernel_set!(Q5K, q5_k, q5_k_m);
kernel_set!(Q3K, q3_k, q3_k_m);
kernel_set!(Q2K, q2_k, q2_k_m);

/// (single-token, multi-token) tiled-order kernels for `ty`. IQ4_XS (codes up to 241 overflow
/// an i16 maddubs pair) has none here.
pub fn kernels(ty: GgmlType) -> Option<(DotFn, Option<MultiDotFn>)> {
    let (d, m): (DotFn, MultiDotFn) = match ty {
        GgmlType::Q6_K => (q6_k, q6_k_m),
        GgmlType::Q4_K => (q4_k, q4_k_m),
        GgmlType::Q5_K => (q5_k, q5_k_m),
        GgmlType::Q3_K => (q3_k, q3_k_m),
        GgmlType::Q2_K => (q2_k, q2_k_m),
        _ => return None,
    };
    Some((d, Some(m)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dispatch_t<const F: u8>(
    n: usize,
    w: &[u8],
    a: &[u8],
    stride: usize,
    out: &mut [f32],
) {
    count_1_to_4!(out.len(), multi::<N, F>(n, w, a, stride, out))
}

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

#[inline(always)]
unsafe fn ld(p: &[u8], off: usize) -> __m256i {
    debug_assert!(off + 32 <= p.len());
    _mm256_loadu_si256(p.as_ptr().add(off) as *const __m256i)
}

/// A widened weight block: 8 code vectors of 32 unsigned codes, the i16 scale vector of each,
/// and per Q8_K block-sum lane (16 elements each) the bias correction and min coefficients.
struct Block {
    d: f32,
    dmin: f32,
    codes: [__m256i; 8],
    scales: [__m256i; 8],
    bias_coef: __m256i,
    min_coef: __m256i,
}

#[inline(always)]
unsafe fn widen<const F: u8>(b: &[u8]) -> Block {
    let m4 = _mm256_set1_epi8(0x0f);
    let zero = _mm256_setzero_si256();
    let mut blk = Block {
        d: 0.0,
        dmin: 0.0,
        codes: [zero; 8],
        scales: [zero; 8],
        bias_coef: zero,
        min_coef: zero,
    };
    match F {
        Q4K => {
            blk.d = h2f(b, 0);
            blk.dmin = h2f(b, 2);
            let (sc, mn) = crate::formats::q4_k::unpack_scales_k4(&b[4..16]);
            for k in 0..4 {
                let q = ld(b, 16 + 32 * k);
                blk.codes[2 * k] = _mm256_and_si256(q, m4);
                blk.codes[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            }
            let mut mc = [0i16; 16];
            for j in 0..8 {
                blk.scales[j] = _mm256_set1_epi16(sc[j] as i16);
                mc[2 * j] = mn[j] as i16;
                mc[2 * j + 1] = mn[j] as i16;
            }
            blk.min_coef = _mm256_loadu_si256(mc.as_ptr() as *const __m256i);
        }
        Q6K => {
            blk.d = h2f(b, 208);
            let m3 = _mm256_set1_epi8(3);
            for h in 0..2 {
                let ql0 = ld(b, 64 * h);
                let ql1 = ld(b, 64 * h + 32);
                let qh = ld(b, 128 + 32 * h);
                let hi = |s: i32| -> __m256i {
                    let v = match s {
                        0 => qh,
                        2 => _mm256_srli_epi16(qh, 2),
                        4 => _mm256_srli_epi16(qh, 4),
                        _ => _mm256_srli_epi16(qh, 6),
                    };
                    _mm256_slli_epi16(_mm256_and_si256(v, m3), 4)
                };
                blk.codes[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), hi(0));
                blk.codes[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), hi(2));
                blk.codes[4 * h + 2] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), hi(4));
                blk.codes[4 * h + 3] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hi(6));
            }
            let sc = &b[192..208];
            let mut bc = [0i16; 16];
            for c in 0..8 {
                let (s0, s1) = (sc[2 * c] as i8 as i16, sc[2 * c + 1] as i8 as i16);
                blk.scales[c] = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                bc[2 * c] = -32 * s0;
                bc[2 * c + 1] = -32 * s1;
            }
            blk.bias_coef = _mm256_loadu_si256(bc.as_ptr() as *const __m256i);
        }
        _ => {
            let u = unpack(ggml_type(F), b);
            blk.d = u.d;
            blk.dmin = u.dmin;
            for c in 0..8 {
                blk.codes[c] = _mm256_loadu_si256(u.codes.as_ptr().add(32 * c) as *const __m256i);
            }
            let (mut bc, mut mc) = ([0i16; 16], [0i16; 16]);
            for k in 0..16 {
                let s = k * 16 / u.sub; // sub-block of block-sum lane k
                bc[k] = (-u.bias * u.scales[s]) as i16;
                mc[k] = u.mins[s] as i16;
            }
            for c in 0..8 {
                blk.scales[c] = if u.sub == 32 {
                    _mm256_set1_epi16(u.scales[c] as i16)
                } else {
                    _mm256_set_m128i(
                        _mm_set1_epi16(u.scales[2 * c + 1] as i16),
                        _mm_set1_epi16(u.scales[2 * c] as i16),
                    )
                };
            }
            blk.bias_coef = _mm256_loadu_si256(bc.as_ptr() as *const __m256i);
            blk.min_coef = _mm256_loadu_si256(mc.as_ptr() as *const __m256i);
        }
    }
    blk
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn multi<const T: usize, const F: u8>(
    n: usize,
    w: &[u8],
    a: &[u8],
    stride: usize,
    out: &mut [f32],
) {
    let bb = ggml_type(F).type_size();
    let has_min = matches!(F, Q4K | Q5K | Q2K);
    let has_bias = matches!(F, Q6K | Q3K);
    let mut acc = [0f32; T];
    for i in 0..n / QK_K {
        let blk = widen::<F>(&w[i * bb..(i + 1) * bb]);
        let mut sums = [_mm256_setzero_si256(); T];
        for c in 0..8 {
            for t in 0..T {
                let q8 = ld(a, t * stride + i * Q8_K_BYTES + 4 + 32 * c);
                let p = _mm256_maddubs_epi16(blk.codes[c], q8);
                sums[t] = _mm256_add_epi32(sums[t], _mm256_madd_epi16(p, blk.scales[c]));
            }
        }
        for t in 0..T {
            let base = t * stride + i * Q8_K_BYTES;
            let bsums = ld(a, base + 4 + QK_K);
            let mut s = sums[t];
            if has_bias {
                s = _mm256_add_epi32(s, _mm256_madd_epi16(bsums, blk.bias_coef));
            }
            let s1 = hsum_i32(s);
            let s2 = if has_min {
                hsum_i32(_mm256_madd_epi16(bsums, blk.min_coef))
            } else {
                0
            };
            let d8 = f32::from_le_bytes([a[base], a[base + 1], a[base + 2], a[base + 3]]);
            acc[t] = fold(acc[t], blk.d, blk.dmin, has_min, s1, s2, d8);
        }
    }
    out[..T].copy_from_slice(&acc);
}
