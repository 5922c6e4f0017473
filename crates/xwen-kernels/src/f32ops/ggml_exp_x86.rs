//! x86 intrinsics of ggml's `ggml_v_expf` / `ggml_v_silu` (ggml/src/ggml-cpu/vec.h, b11434),
//! instruction for instruction, and the vec.cpp loops around them. The scalar emulations in
//! ggml_exp.rs are their twins.

use std::arch::x86_64::*;

use super::{silu_scalar, LN2_HI, LN2_LO, LOG2E, P1, P2, P3, P4, P5, R};

// ---------- AVX2 + FMA: vec.h's `#elif defined(__AVX2__) && defined(__FMA__)` ----------

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn v_expf256(x: __m256) -> __m256 {
    let r = _mm256_set1_ps(R);
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(LN2_LO),
        _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x),
    );
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        e,
        _mm256_castps_si256(_mm256_set1_ps(1.0)),
    ));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let c = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_set1_ps(P5), b, _mm256_set1_ps(P4)),
            u,
            _mm256_fmadd_ps(_mm256_set1_ps(P3), b, _mm256_set1_ps(P2)),
        ),
        u,
        _mm256_mul_ps(_mm256_set1_ps(P1), b),
    );
    if _mm256_movemask_ps(c) == 0 {
        return _mm256_fmadd_ps(j, k, k);
    }
    let g = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let d = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
    _mm256_or_ps(
        _mm256_and_ps(d, _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(
            d,
            _mm256_or_ps(
                _mm256_and_ps(c, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                _mm256_andnot_ps(c, _mm256_fmadd_ps(k, j, k)),
            ),
        ),
    )
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn v_silu256(x: __m256) -> __m256 {
    let neg_x = _mm256_sub_ps(_mm256_setzero_ps(), x);
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), v_expf256(neg_x)))
}

/// ggml_vec_soft_max_f32's per-chunk reduction: (hi + lo), movehl, movehdup.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_extractf128_ps::<1>(v), _mm256_castps256_ps128(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// # Safety
/// AVX2+FMA present; `x` readable, `y` writable for `n` elements (same pointer allowed).
#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu256(x: *const f32, y: *mut f32, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(y.add(i), v_silu256(_mm256_loadu_ps(x.add(i))));
        i += 8;
    }
    while i < n {
        *y.add(i) = silu_scalar(*x.add(i));
        i += 1;
    }
}

/// # Safety
/// AVX2+FMA present; equal lengths.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn swiglu256(g: &[f32], u: &[f32], y: &mut [f32]) {
    let n = g.len();
    let (pg, pu, py) = (g.as_ptr(), u.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    while i + 8 <= n {
        let s = v_silu256(_mm256_loadu_ps(pg.add(i)));
        _mm256_storeu_ps(py.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(pu.add(i))));
        i += 8;
    }
    while i < n {
        *py.add(i) = silu_scalar(*pg.add(i)) * *pu.add(i);
        i += 1;
    }
}

/// x ← exp(x − max) over a row of `row_len` columns (those from x.len() on are −inf), as
/// ggml_vec_soft_max_f32; returns the f64 sum.
///
/// # Safety
/// AVX2+FMA present.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp_sum256(x: &mut [f32], max: f32, row_len: usize) -> f64 {
    let n = x.len();
    let vmax = _mm256_set1_ps(max);
    let mut sum = 0.0f64;
    let mut i = 0;
    while i + 8 <= n {
        let p = x.as_mut_ptr().add(i);
        let val = v_expf256(_mm256_sub_ps(_mm256_loadu_ps(p), vmax));
        _mm256_storeu_ps(p, val);
        sum += hsum256(val) as f64;
        i += 8;
    }
    if i < n {
        if i + 8 <= row_len {
            let mut buf = [f32::NEG_INFINITY; 8];
            buf[..n - i].copy_from_slice(&x[i..]);
            let val = v_expf256(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), vmax));
            _mm256_storeu_ps(buf.as_mut_ptr(), val);
            x[i..].copy_from_slice(&buf[..n - i]);
            sum += hsum256(val) as f64;
        } else {
            for v in &mut x[i..] {
                let e = (*v - max).exp();
                sum += e as f64;
                *v = e;
            }
        }
    }
    sum
}

// ---------- AVX-512: vec.h's `#elif defined(__AVX512F__) && defined(__AVX512DQ__)` ----------

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn v_expf512(x: __m512) -> __m512 {
    let r = _mm512_set1_ps(R);
    let z = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(
        n,
        _mm512_set1_ps(LN2_LO),
        _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x),
    );
    let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_set1_ps(P5), b, _mm512_set1_ps(P4)),
            u,
            _mm512_fmadd_ps(_mm512_set1_ps(P3), b, _mm512_set1_ps(P2)),
        ),
        u,
        _mm512_fmadd_ps(_mm512_set1_ps(P1), b, _mm512_set1_ps(1.0)),
    );
    let res = _mm512_scalef_ps(j, n);
    if _mm512_kortestz(d, d) != 0 {
        return res;
    }
    let zero = _mm512_setzero_ps();
    let alt = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero),
        _mm512_set1_ps(f32::INFINITY),
        zero,
    );
    _mm512_mask_blend_ps(d, res, alt)
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn v_silu512(x: __m512) -> __m512 {
    let neg_x = _mm512_sub_ps(_mm512_setzero_ps(), x);
    _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), v_expf512(neg_x)))
}

/// GCC's `_mm512_reduce_add_ps`: 256-bit halves, 128-bit halves, {2,3,0,1}, then lanes 0 + 1.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn hsum512(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let lo = _mm512_castps512_ps256(v);
    let t3 = _mm256_add_ps(hi, lo);
    let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
    let t8 = _mm_add_ps(t6, _mm_shuffle_ps::<0x4e>(t6, t6));
    _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps::<1>(t8, t8))
}

/// # Safety
/// AVX-512F present; `x` readable, `y` writable for `n` elements (same pointer allowed).
#[target_feature(enable = "avx512f")]
pub unsafe fn silu512(x: *const f32, y: *mut f32, n: usize) {
    let mut i = 0;
    while i + 16 <= n {
        _mm512_storeu_ps(y.add(i), v_silu512(_mm512_loadu_ps(x.add(i))));
        i += 16;
    }
    while i < n {
        *y.add(i) = silu_scalar(*x.add(i));
        i += 1;
    }
}

/// # Safety
/// AVX-512F present; equal lengths.
#[target_feature(enable = "avx512f")]
pub unsafe fn swiglu512(g: &[f32], u: &[f32], y: &mut [f32]) {
    let n = g.len();
    let (pg, pu, py) = (g.as_ptr(), u.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    while i + 16 <= n {
        let s = v_silu512(_mm512_loadu_ps(pg.add(i)));
        _mm512_storeu_ps(py.add(i), _mm512_mul_ps(s, _mm512_loadu_ps(pu.add(i))));
        i += 16;
    }
    while i < n {
        *py.add(i) = silu_scalar(*pg.add(i)) * *pu.add(i);
        i += 1;
    }
}

/// As [`exp_sum256`] with 16 lanes.
///
/// # Safety
/// AVX-512F present.
#[target_feature(enable = "avx512f")]
pub unsafe fn exp_sum512(x: &mut [f32], max: f32, row_len: usize) -> f64 {
    let n = x.len();
    let vmax = _mm512_set1_ps(max);
    let mut sum = 0.0f64;
    let mut i = 0;
    while i + 16 <= n {
        let p = x.as_mut_ptr().add(i);
        let val = v_expf512(_mm512_sub_ps(_mm512_loadu_ps(p), vmax));
        _mm512_storeu_ps(p, val);
        sum += hsum512(val) as f64;
        i += 16;
    }
    if i < n {
        if i + 16 <= row_len {
            let mut buf = [f32::NEG_INFINITY; 16];
            buf[..n - i].copy_from_slice(&x[i..]);
            let val = v_expf512(_mm512_sub_ps(_mm512_loadu_ps(buf.as_ptr()), vmax));
            _mm512_storeu_ps(buf.as_mut_ptr(), val);
            x[i..].copy_from_slice(&buf[..n - i]);
            sum += hsum512(val) as f64;
        } else {
            for v in &mut x[i..] {
                let e = (*v - max).exp();
                sum += e as f64;
                *v = e;
            }
        }
    }
    sum
}

/// Raw `ggml_v_expf` over 8 / 16 lanes, for the tests that hold each lane to its emulation.
#[cfg(test)]
pub mod lanes {
    use super::*;

    /// # Safety
    /// AVX2+FMA present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn expf8(x: &[f32; 8]) -> [f32; 8] {
        let mut y = [0.0f32; 8];
        _mm256_storeu_ps(y.as_mut_ptr(), v_expf256(_mm256_loadu_ps(x.as_ptr())));
        y
    }

    /// # Safety
    /// AVX-512F present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn expf16(x: &[f32; 16]) -> [f32; 16] {
        let mut y = [0.0f32; 16];
        _mm512_storeu_ps(y.as_mut_ptr(), v_expf512(_mm512_loadu_ps(x.as_ptr())));
        y
    }
}
