//! AVX2 multi-token dots for batched matmul: one weight row against up to 4 activation rows,
//! decoding each weight block once. Per token the arithmetic is exactly that of the single-token
//! kernel in `avx2` (same operations, same order), so matmul results equal per-row vec_dot bit
//! for bit (tests/pool.rs holds them equal).

use std::arch::x86_64::*;

use super::avx2::{bsums32, h2f, hsum_ps, load, scale_pair, Q8K, QK};
use crate::formats::MultiDotFn;
use crate::half::read_f32;
use crate::GgmlType;

macro_rules! multi_wrapper {
    ($name:ident, $inner:ident) => {
        fn $name(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
            // SAFETY: handed out by dispatch only after detecting AVX2/FMA/F16C; callers checked
            // that `a` holds out.len() rows of `stride` bytes.
            unsafe {
                match out.len() {
                    1 => $inner::<1>(n, w, a, stride, out),
                    2 => $inner::<2>(n, w, a, stride, out),
                    3 => $inner::<3>(n, w, a, stride, out),
                    4 => $inner::<4>(n, w, a, stride, out),
                    k => panic!("multi-token dot takes 1..=4 rows, got {k}"),
                }
            }
        }
    };
}

multi_wrapper!(q8_0, multi_q8_0);
multi_wrapper!(q4_k, multi_q4_k);
multi_wrapper!(q6_k, multi_q6_k);

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
        let (sc, mn) = crate::formats::q4_k::unpack_scales_k4(&w[bw + 4..bw + 16]);
        let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mn.as_ptr() as *const __m128i));
        let scv: [__m256i; 8] = std::array::from_fn(|k| _mm256_set1_epi16(sc[k] as i16));
        let mut sumi = [_mm256_setzero_si256(); T];
        for t in 0..T {
            let ba = t * stride + i * Q8K;
            let dy = read_f32(&a[ba..]);
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
            let dy = read_f32(&a[t * stride + i * Q8K..]);
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
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(3);
    let m32s = _mm256_set1_epi8(32);
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..n / QK {
        let bw = i * 210;
        let wd = h2f(w, bw + 208);
        let sc: [i8; 16] = std::array::from_fn(|k| w[bw + 192 + k] as i8);
        let mut sumi = [_mm256_setzero_si256(); T];
        for h in 0..2 {
            let q4b1 = load(w, bw + 64 * h);
            let q4b2 = load(w, bw + 64 * h + 32);
            let qh = load(w, bw + 128 + 32 * h);
            let hb = |v: __m256i| _mm256_slli_epi16(_mm256_and_si256(v, m2), 4);
            let q = [
                _mm256_or_si256(_mm256_and_si256(q4b1, m4), hb(qh)),
                _mm256_or_si256(_mm256_and_si256(q4b2, m4), hb(_mm256_srli_epi16(qh, 2))),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(q4b1, 4), m4),
                    hb(_mm256_srli_epi16(qh, 4)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(q4b2, 4), m4),
                    hb(_mm256_srli_epi16(qh, 6)),
                ),
            ];
            for (k, &qk) in q.iter().enumerate() {
                let s = scale_pair(sc[8 * h + 2 * k], sc[8 * h + 2 * k + 1]);
                for t in 0..T {
                    let q8 = load(a, t * stride + i * Q8K + 4 + 128 * h + 32 * k);
                    let p = _mm256_sub_epi16(
                        _mm256_maddubs_epi16(qk, q8),
                        _mm256_maddubs_epi16(m32s, q8),
                    );
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(s, p));
                }
            }
        }
        for t in 0..T {
            let d = read_f32(&a[t * stride + i * Q8K..]) * wd;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    for t in 0..T {
        out[t] = hsum_ps(acc[t]);
    }
}
