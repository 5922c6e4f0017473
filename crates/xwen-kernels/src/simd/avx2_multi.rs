//! AVX2 multi-token dots for batched matmul: one weight row against up to 4 activation rows,
//! decoding each weight block once. Per token the arithmetic is exactly that of the single-token
//! kernel in `avx2` (same operations, same order), so matmul results equal per-row vec_dot bit
//! for bit (tests/pool.rs holds them equal).

#![allow(clippy::needless_range_loop)] // t indexes several per-token arrays in lockstep

use std::arch::x86_64::*;

use super::avx2::{
    bcast_i16, bsums32, f32at, h2f, hsum_ps, k4_scales_mins, load, load128, q6_half, q6_offset, scale_pair, Q8K,
    QK,
};
use crate::formats::MultiDotFn;
use crate::GgmlType;

macro_rules! multi_wrapper {
    ($name:ident, $inner:ident) => {
        fn $name(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
            // SAFETY: handed out by dispatch only after detecting AVX2/FMA/F16C; callers checked
            // that `a` holds out.len() rows of `stride` bytes.
            unsafe {
                count_1_to_4!(out.len(), $inner::<N>(n, w, a, stride, out))
            }
        }
    };
}

multi_wrapper!(q8_0, multi_q8_0);
multi_wrapper!(q4_k, multi_q4_k);
/// The most activation rows the Q6_K multi-token kernel takes at once: decoding its blocks
/// (4-bit halves, 2-bit highs, scales) costs more than a row's product, so 8 decode rows share
/// it; each row's arithmetic stays the single-token kernel's. The other types take 4.
pub const MULTI_Q6_K_ROWS: usize = 8;

fn q6_k(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    // SAFETY: as multi_wrapper's.
    unsafe {
        match out.len() {
            1 => multi_q6_k::<1>(n, w, a, stride, out),
            2 => multi_q6_k::<2>(n, w, a, stride, out),
            3 => multi_q6_k::<3>(n, w, a, stride, out),
            4 => multi_q6_k::<4>(n, w, a, stride, out),
            5 => multi_q6_k::<5>(n, w, a, stride, out),
            6 => multi_q6_k::<6>(n, w, a, stride, out),
            7 => multi_q6_k::<7>(n, w, a, stride, out),
            8 => multi_q6_k::<8>(n, w, a, stride, out),
            k => panic!("multi_q6_k takes 1..={MULTI_Q6_K_ROWS} rows, got {k}"),
        }
    }
}

pub fn multi_dot_fn(weight: GgmlType) -> Option<MultiDotFn> {
    Some(match weight {
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q6_K => q6_k,
        _ => return None,
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn multi_q8_0<const T: usize>(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..n / 32 {
        let bw = i * 34;
        let x = load(w, bw + 2);
        let ax = _mm256_sign_epi8(x, x);
        let dx = h2f(w, bw);
        for t in 0..T {
            let ba = t * stride + i * 34;
            let d = _mm256_set1_ps(dx * h2f(a, ba));
            let sy = _mm256_sign_epi8(load(a, ba + 2), x);
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
        }
    }
    for t in 0..T {
        out[t] = hsum_ps(acc[t]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn multi_q4_k<const T: usize>(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_m = [_mm_setzero_ps(); T];
    for i in 0..n / QK {
        let bw = i * 144;
        let (wd, wdmin) = (h2f(w, bw), h2f(w, bw + 2));
        let sm = k4_scales_mins(w, bw + 4);
        let mins = _mm256_extracti128_si256(sm, 1);
        let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        let mut scv = [_mm256_setzero_si256(); 8];
        for (k, v) in scv.iter_mut().enumerate() {
            *v = bcast_i16(sc, k);
        }
        let mut sumi = [_mm256_setzero_si256(); T];
        for t in 0..T {
            let ba = t * stride + i * Q8K;
            let dy = f32at(a, ba);
            let prod = _mm_madd_epi16(mins, bsums32(a, ba));
            acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(-dy * wdmin), _mm_cvtepi32_ps(prod), acc_m[t]);
        }
        for j in 0..4 {
            let q4 = load(w, bw + 16 + 32 * j);
            let q4l = _mm256_and_si256(q4, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            for t in 0..T {
                let ba = t * stride + i * Q8K;
                let pl = _mm256_maddubs_epi16(q4l, load(a, ba + 4 + 64 * j));
                let ph = _mm256_maddubs_epi16(q4h, load(a, ba + 4 + 64 * j + 32));
                let pl = _mm256_madd_epi16(scv[2 * j], pl);
                let ph = _mm256_madd_epi16(scv[2 * j + 1], ph);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
            }
        }
        for t in 0..T {
            let dy = f32at(a, t * stride + i * Q8K);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dy * wd), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..T {
        let m = _mm_add_ps(acc_m[t], _mm_movehl_ps(acc_m[t], acc_m[t]));
        let m = _mm_add_ss(m, _mm_movehdup_ps(m));
        out[t] = hsum_ps(acc[t]) + _mm_cvtss_f32(m);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn multi_q6_k<const T: usize>(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..n / QK {
        let bw = i * 210;
        let wd = h2f(w, bw + 208);
        let scales = load128(w, bw + 192);
        let mut sumi = [_mm256_setzero_si256(); T];
        for h in 0..2 {
            for (k, &qk) in q6_half(w, bw, h).iter().enumerate() {
                let s = scale_pair(scales, 4 * h + k);
                for t in 0..T {
                    let q8 = load(a, t * stride + i * Q8K + 4 + 128 * h + 32 * k);
                    let p = _mm256_maddubs_epi16(qk, q8);
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s, p));
                }
            }
        }
        for t in 0..T {
            let ba = t * stride + i * Q8K;
            let d = f32at(a, ba) * wd;
            let si = _mm256_sub_epi32(sumi[t], q6_offset(w, bw, a, ba));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(si), acc[t]);
        }
    }
    for t in 0..T {
        out[t] = hsum_ps(acc[t]);
    }
}
