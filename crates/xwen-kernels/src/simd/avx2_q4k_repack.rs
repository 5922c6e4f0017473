//! AVX2 twins of `q4k_repack` (Q4_K in the float order of ggml's repacked gemv/gemm): the
//! integer sums are those of `avx2::dot_q4_k`, reduced per super-block (gemv) or per
//! 64-element pair (gemm) before the same scalar FMAs the emulation does. One weight row
//! against up to 4 activation rows, decoding the weight block once.

#![allow(clippy::needless_range_loop)] // t indexes several per-token arrays in lockstep

use std::arch::x86_64::*;

use super::avx2::{bcast_i16, bsums32, cvtph_ps_at, f32at, h2f, hsum_i32x4, k4_scales_mins, load, q4k_scaled_dots, Q8K, QK};
use super::prefetch::prefetch_ahead_l2;
use crate::formats::{DotFn, MultiDotFn};

fn gemv(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: handed out by dispatch only after detecting AVX2/FMA/F16C; lengths checked by
    // the callers.
    unsafe { gemv1(n, w, a) }
}

fn gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32; 1];
    // SAFETY: as in `gemv`.
    unsafe { rows::<1, true>(n, w, a, 0, &mut out) };
    out[0]
}

macro_rules! multi_wrapper {
    ($name:ident, $gemm:tt) => {
        fn $name(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
            // SAFETY: as in `gemv`; callers checked that `a` holds out.len() rows of `stride`.
            unsafe {
                count_1_to_4!(out.len(), rows::<N, $gemm>(n, w, a, stride, out))
            }
        }
    };
}

multi_wrapper!(multi_gemv, false);
multi_wrapper!(multi_gemm, true);

/// (single-token, multi-token) kernels in the gemv (`gemm` false) or gemm order.
pub fn kernels(gemm_order: bool) -> (DotFn, MultiDotFn) {
    if gemm_order {
        (gemm, multi_gemm)
    } else {
        (gemv, multi_gemv)
    }
}

/// The four i32 lanes' sums of each of v[0..4], as lanes 0..4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum4_epi32(v: &[__m256i; 4]) -> __m128i {
    let t0 = _mm256_hadd_epi32(v[0], v[1]);
    let t1 = _mm256_hadd_epi32(v[2], v[3]);
    let t = _mm256_hadd_epi32(t0, t1);
    _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1))
}

/// A Q4_K block's scales and mins, unpacked in vector registers (ggml's kmask arithmetic on
/// the four 32-bit words at once): ([s0..s7] as i16 in both 128-bit halves, [m0, m0, m1, m1,
/// .., m7, m7] as i16, the mins paired to meet the 16 bsums of a Q8_K block in one madd).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_scales_mins(w: &[u8], off: usize) -> (__m256i, __m256i) {
    debug_assert!(off + 16 <= w.len());
    let u = _mm_loadu_si128(w.as_ptr().add(off) as *const __m128i); // u0 u1 u2 (q4 bytes)
    // [u0 & 3f.., u2 & 0f.., u1 & 3f.., (u2 >> 4) & 0f..] | [0, (u0 >> 2) & 30.., 0, (u1 >> 2) & 30..]
    let a = _mm_shuffle_epi32(u, 0b10_01_10_00);
    let lo = _mm_and_si128(
        _mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
        _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f),
    );
    let b = _mm_shuffle_epi32(u, 0b01_01_00_00);
    let hi = _mm_and_si128(_mm_srli_epi32(b, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    let r = _mm_or_si128(lo, hi); // bytes: s0..s7, m0..m7
    let sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(r, r));
    let pair = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    (sc, _mm256_cvtepu8_epi16(_mm_shuffle_epi8(r, pair)))
}

/// One super-block of one row against one token: [Σ sc·dot, Σ m·bsum, ..] as exact integers
/// converted to f32 (lanes 0 and 1).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_sums(w: &[u8], a: &[u8], bw: usize, ba: usize) -> __m128 {
    let (sc, mins) = q4k_scales_mins(w, bw + 4);
    let (vl, vh) = q4k_scaled_dots(w, bw, a, ba, sc);
    let pm = _mm256_madd_epi16(mins, load(a, ba + 4 + QK));
    let h = _mm256_hadd_epi32(_mm256_add_epi32(vl, vh), pm);
    let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    _mm_cvtepi32_ps(_mm_hadd_epi32(s, s))
}

/// [d·dy, dmin·dy, ..] of super-block i.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_scales(w: &[u8], a: &[u8], bw: usize, ba: usize) -> __m128 {
    let dd = cvtph_ps_at(w, bw); // d, dmin and two code bytes' worth: lanes 0 and 1 used
    _mm_mul_ps(dd, _mm_set1_ps(f32at(a, ba)))
}

/// One row against one token in the gemv order: the decode kernel of every repacked Q4_K
/// matrix (dense FFN, routed experts). acc and accm live in lanes 0 and 1 of one vector, so
/// each lane computes exactly the scalar fma(f32(sum), d·dy, acc) of `dot_gemv_ref`; two
/// super-blocks per iteration give the out-of-order core two independent chains to overlap
/// (1.3x `rows::<1, false>` on a row in cache; docs/bench.md "Decode Q4_K: fewer vector ops per super-block").
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemv1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / QK;
    let mut acc = _mm_setzero_ps();
    let mut i = 0;
    while i + 2 <= nb {
        let (bw, ba) = (i * 144, i * Q8K);
        for l in 0..5 {
            prefetch_ahead_l2(w.as_ptr().add(bw + 64 * l));
        }
        let f0 = block_sums(w, a, bw, ba);
        let f1 = block_sums(w, a, bw + 144, ba + Q8K);
        acc = _mm_fmadd_ps(f0, block_scales(w, a, bw, ba), acc);
        acc = _mm_fmadd_ps(f1, block_scales(w, a, bw + 144, ba + Q8K), acc);
        i += 2;
    }
    if i < nb {
        let (bw, ba) = (i * 144, i * Q8K);
        for l in 0..3 {
            prefetch_ahead_l2(w.as_ptr().add(bw + 64 * l));
        }
        acc = _mm_fmadd_ps(block_sums(w, a, bw, ba), block_scales(w, a, bw, ba), acc);
    }
    _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const T: usize, const GEMM: bool>(
    n: usize,
    w: &[u8],
    a: &[u8],
    stride: usize,
    out: &mut [f32],
) {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [0f32; T];
    let mut accm = [0f32; T];
    for i in 0..n / QK {
        let bw = i * 144;
        if T == 1 {
            // one token: decode, streaming the matrix from DRAM (see `prefetch_ahead_l2`)
            for l in 0..3 {
                prefetch_ahead_l2(w.as_ptr().add(bw + 64 * l));
            }
        }
        let (wd, wdmin) = (h2f(w, bw), h2f(w, bw + 2));
        let sm = k4_scales_mins(w, bw + 4);
        let mins = _mm256_extracti128_si256(sm, 1);
        let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        let mut pair = [[_mm256_setzero_si256(); 4]; T];
        for j in 0..4 {
            let q4 = load(w, bw + 16 + 32 * j);
            let q4l = _mm256_and_si256(q4, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            let (sl, sh) = (bcast_i16(sc, 2 * j), bcast_i16(sc, 2 * j + 1));
            for t in 0..T {
                let ba = t * stride + i * Q8K;
                let pl = _mm256_maddubs_epi16(q4l, load(a, ba + 4 + 64 * j));
                let ph = _mm256_maddubs_epi16(q4h, load(a, ba + 4 + 64 * j + 32));
                pair[t][j] = _mm256_add_epi32(_mm256_madd_epi16(sl, pl), _mm256_madd_epi16(sh, ph));
            }
        }
        for t in 0..T {
            let ba = t * stride + i * Q8K;
            let dy = f32at(a, ba);
            let (d, dmin) = (wd * dy, wdmin * dy);
            // lane k: Σ m·bsum over sub-blocks 2k, 2k+1
            let pm = _mm_madd_epi16(mins, bsums32(a, ba));
            if GEMM {
                let ps = hsum4_epi32(&pair[t]);
                let (mut s4, mut m4v) = ([0i32; 4], [0i32; 4]);
                _mm_storeu_si128(s4.as_mut_ptr() as *mut __m128i, ps);
                _mm_storeu_si128(m4v.as_mut_ptr() as *mut __m128i, pm);
                for k in 0..4 {
                    acc[t] = (s4[k] as f32).mul_add(d, acc[t]);
                    accm[t] = (m4v[k] as f32).mul_add(dmin, accm[t]);
                }
            } else {
                let p = &pair[t];
                let v =
                    _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
                let ps = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
                acc[t] = (hsum_i32x4(ps) as f32).mul_add(d, acc[t]);
                accm[t] = (hsum_i32x4(pm) as f32).mul_add(dmin, accm[t]);
            }
        }
    }
    for t in 0..T {
        out[t] = acc[t] - accm[t];
    }
}
