//! AVX-512 F/BW/VL/VNNI kernels for the formats that dominate decode (Q8_0, Q4_K, Q5_K, Q6_K,
//! F32, F16, BF16); dispatch falls back to the AVX2 set for the rest.
//!
//! Integer products use VNNI `vpdpbusd` (u8 × i8 summed in groups of 4 into i32). Q6_K takes
//! its -32 offset from the activation's bsums instead of a second multiply, which is exact.
//! Every `unsafe fn` here requires the features named in its `target_feature`.

use std::arch::x86_64::*;

use crate::formats::q4_k::unpack_scales_k4;
use crate::formats::q8::q8k_parts;
use crate::formats::DotFn;
use crate::half::read_f32;
use crate::GgmlType;

macro_rules! safe_wrapper {
    ($name:ident, $inner:ident) => {
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only reachable through `dot_fn`, used by dispatch after detecting
            // AVX-512 F/BW/VL/VNNI (and AVX2/FMA/F16C); lengths checked by callers.
            unsafe { $inner(n, w, a) }
        }
    };
}

safe_wrapper!(q8_0, dot_q8_0);
safe_wrapper!(q4_k, dot_q4_k);
safe_wrapper!(q5_k, dot_q5_k);
safe_wrapper!(q6_k, dot_q6_k);
safe_wrapper!(f32d, dot_f32);
safe_wrapper!(f16d, dot_f16);
safe_wrapper!(bf16d, dot_bf16);

pub fn dot_fn(weight: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    Some(match weight {
        T::Q8_0 => q8_0,
        T::Q4_K => q4_k,
        T::Q5_K => q5_k,
        T::Q6_K => q6_k,
        T::F32 => f32d,
        T::F16 => f16d,
        T::BF16 => bf16d,
        _ => return None,
    })
}

/// f16 at p[off..off+2] to f32 with F16C (the software conversion costs more than a Q8_0 block).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn h2f(p: &[u8], off: usize) -> f32 {
    debug_assert!(off + 2 <= p.len());
    let h = (p.as_ptr().add(off) as *const u16).read_unaligned();
    // The conversion goes through asm so the input is materialized with vmovd: given the
    // intrinsic, LLVM merges the load into a `vpinsrw` on an arbitrary register, often the
    // loop's accumulator, which chains every block on the previous block's FMA (3x slower Q8_0).
    let v = _mm_cvtsi32_si128(h as i32);
    let r: __m128;
    std::arch::asm!("vcvtph2ps {o}, {i}", i = in(xmm_reg) v, o = lateout(xmm_reg) r,
        options(pure, nomem, nostack, preserves_flags));
    _mm_cvtss_f32(r)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn load256(p: &[u8], off: usize) -> __m256i {
    debug_assert!(off + 32 <= p.len());
    _mm256_loadu_si256(p.as_ptr().add(off) as *const __m256i)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn load512(p: &[u8], off: usize) -> __m512i {
    debug_assert!(off + 64 <= p.len());
    _mm512_loadu_si512(p.as_ptr().add(off) as *const __m512i)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Two f32 broadcasts: lanes 0..8 = a, 8..16 = b.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn set2_ps(a: f32, b: f32) -> __m512 {
    _mm512_castsi512_ps(join(
        _mm256_castps_si256(_mm256_set1_ps(a)),
        _mm256_castps_si256(_mm256_set1_ps(b)),
    ))
}

/// Signed × signed bytes via VNNI: |x| · sign(y, x), 16 i32 sums of 4.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_i8(acc: __m512i, x: __m512i, y: __m512i) -> __m512i {
    let ax = _mm512_abs_epi8(x);
    let sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    _mm512_dpbusd_epi32(acc, ax, sy)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let nb = n / 32;
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i + 2 <= nb {
        let (b0, b1) = (34 * i, 34 * i + 34);
        let x = join(load256(w, b0 + 2), load256(w, b1 + 2));
        let y = join(load256(a, b0 + 2), load256(a, b1 + 2));
        let p = dot_i8(_mm512_setzero_si512(), x, y);
        let d = set2_ps(h2f(w, b0) * h2f(a, b0), h2f(w, b1) * h2f(a, b1));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
        i += 2;
    }
    let mut s = _mm512_reduce_add_ps(acc);
    if i < nb {
        let b = 34 * i;
        let x = _mm512_zextsi256_si512(load256(w, b + 2));
        let y = _mm512_zextsi256_si512(load256(a, b + 2));
        // upper halves of x and y are zeroed below, so lanes 8..16 of the product are 0
        let p = dot_i8(_mm512_setzero_si512(), x, y);
        s += h2f(w, b) * h2f(a, b) * _mm512_reduce_add_epi32(p) as f32;
    }
    s
}

/// 8 sub-block scales as 16-lane i32 vectors: for chunk j, lanes 0..8 = sc[2j], 8..16 = sc[2j+1].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn scale2(lo: u8, hi: u8) -> __m512i {
    join(_mm256_set1_epi32(lo as i32), _mm256_set1_epi32(hi as i32))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm512_setzero_ps();
    let mut summ = 0.0f32;
    for i in 0..n / 256 {
        let (bw, ba) = (144 * i, 292 * i);
        let (dy, _, bsums) = q8k_parts(&a[ba..ba + 292]);
        let (sc, mn) = unpack_scales_k4(&w[bw + 4..bw + 16]);
        let mut m = 0i32;
        for j in 0..16 {
            m += bsums[j] as i32 * mn[j / 2] as i32;
        }
        summ += dy * h2f(w, bw + 2) * m as f32;
        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            let q = load256(w, bw + 16 + 32 * j);
            let q4 = join(
                _mm256_and_si256(q, m4),
                _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
            );
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q4, load512(a, ba + 4 + 64 * j));
            sumi = _mm512_add_epi32(
                sumi,
                _mm512_mullo_epi32(p, scale2(sc[2 * j], sc[2 * j + 1])),
            );
        }
        acc = _mm512_fmadd_ps(
            _mm512_set1_ps(dy * h2f(w, bw)),
            _mm512_cvtepi32_ps(sumi),
            acc,
        );
    }
    _mm512_reduce_add_ps(acc) - summ
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let m1 = _mm256_set1_epi8(1);
    let mut acc = _mm512_setzero_ps();
    let mut summ = 0.0f32;
    for i in 0..n / 256 {
        let (bw, ba) = (176 * i, 292 * i);
        let (dy, _, bsums) = q8k_parts(&a[ba..ba + 292]);
        let (sc, mn) = unpack_scales_k4(&w[bw + 4..bw + 16]);
        let mut m = 0i32;
        for j in 0..16 {
            m += bsums[j] as i32 * mn[j / 2] as i32;
        }
        summ += dy * h2f(w, bw + 2) * m as f32;
        let mut hbits = load256(w, bw + 16);
        let mut sumi = _mm512_setzero_si512();
        for j in 0..4 {
            let q = load256(w, bw + 48 + 32 * j);
            let hl = _mm256_slli_epi16(_mm256_and_si256(hbits, m1), 4);
            let hh = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), m1), 4);
            hbits = _mm256_srli_epi16(hbits, 2);
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), hl);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hh);
            let p = _mm512_dpbusd_epi32(
                _mm512_setzero_si512(),
                join(lo, hi),
                load512(a, ba + 4 + 64 * j),
            );
            sumi = _mm512_add_epi32(
                sumi,
                _mm512_mullo_epi32(p, scale2(sc[2 * j], sc[2 * j + 1])),
            );
        }
        acc = _mm512_fmadd_ps(
            _mm512_set1_ps(dy * h2f(w, bw)),
            _mm512_cvtepi32_ps(sumi),
            acc,
        );
    }
    _mm512_reduce_add_ps(acc) - summ
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut sumf = 0.0f32;
    for i in 0..n / 256 {
        let (bw, ba) = (210 * i, 292 * i);
        let (dy, _, bsums) = q8k_parts(&a[ba..ba + 292]);
        let mut sc = [0i32; 16];
        for (k, v) in sc.iter_mut().enumerate() {
            *v = w[bw + 192 + k] as i8 as i32;
        }
        // codes are stored +32: sum(sc_g * (q + 32) * y) - 32 * sum(sc_g * bsum_g)
        let mut off = 0i32;
        for g in 0..16 {
            off += sc[g] * bsums[g] as i32;
        }
        let mut sumi = _mm512_setzero_si512();
        for h in 0..2 {
            let q1 = load256(w, bw + 64 * h);
            let q2 = load256(w, bw + 64 * h + 32);
            let qh = load256(w, bw + 128 + 32 * h);
            let c0 = _mm256_or_si256(_mm256_and_si256(q1, m4), super::avx2::q6_hi(qh));
            let c1 = _mm256_or_si256(
                _mm256_and_si256(q2, m4),
                super::avx2::q6_hi(_mm256_srli_epi16(qh, 2)),
            );
            let c2 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(q1, 4), m4),
                super::avx2::q6_hi(_mm256_srli_epi16(qh, 4)),
            );
            let c3 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(q2, 4), m4),
                super::avx2::q6_hi(_mm256_srli_epi16(qh, 6)),
            );
            for (k, codes) in [join(c0, c1), join(c2, c3)].into_iter().enumerate() {
                let p = _mm512_dpbusd_epi32(
                    _mm512_setzero_si512(),
                    codes,
                    load512(a, ba + 4 + 128 * h + 64 * k),
                );
                // lanes 4g..4g+4 hold group g of these 64 elements
                let g0 = 8 * h + 4 * k;
                let s = _mm512_setr_epi32(
                    sc[g0],
                    sc[g0],
                    sc[g0],
                    sc[g0],
                    sc[g0 + 1],
                    sc[g0 + 1],
                    sc[g0 + 1],
                    sc[g0 + 1],
                    sc[g0 + 2],
                    sc[g0 + 2],
                    sc[g0 + 2],
                    sc[g0 + 2],
                    sc[g0 + 3],
                    sc[g0 + 3],
                    sc[g0 + 3],
                    sc[g0 + 3],
                );
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(p, s));
            }
        }
        let total = _mm512_reduce_add_epi32(sumi) - 32 * off;
        sumf += dy * h2f(w, bw + 208) * total as f32;
    }
    sumf
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (pw, pa) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    let mut acc = [_mm512_setzero_ps(); 4];
    let n64 = n / 64 * 64;
    for i in (0..n64).step_by(64) {
        for (k, ac) in acc.iter_mut().enumerate() {
            *ac = _mm512_fmadd_ps(
                _mm512_loadu_ps(pw.add(i + 16 * k)),
                _mm512_loadu_ps(pa.add(i + 16 * k)),
                *ac,
            );
        }
    }
    let mut s = _mm512_reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(acc[0], acc[1]),
        _mm512_add_ps(acc[2], acc[3]),
    ));
    for i in n64..n {
        s += read_f32(&w[4 * i..]) * read_f32(&a[4 * i..]);
    }
    s
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let n32 = n / 32 * 32;
    for i in (0..n32).step_by(32) {
        for (k, ac) in acc.iter_mut().enumerate() {
            let x = _mm512_cvtph_ps(load256(w, 2 * (i + 16 * k)));
            let y = _mm512_cvtph_ps(load256(a, 2 * (i + 16 * k)));
            *ac = _mm512_fmadd_ps(x, y, *ac);
        }
    }
    let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    for i in n32..n {
        s += h2f(w, 2 * i) * h2f(a, 2 * i);
    }
    s
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn bf16x16(p: &[u8], off: usize) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(load256(p, off)),
        16,
    ))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let n32 = n / 32 * 32;
    for i in (0..n32).step_by(32) {
        for (k, ac) in acc.iter_mut().enumerate() {
            *ac = _mm512_fmadd_ps(
                bf16x16(w, 2 * (i + 16 * k)),
                bf16x16(a, 2 * (i + 16 * k)),
                *ac,
            );
        }
    }
    let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    for i in n32..n {
        let x = crate::half::bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]]));
        let y = crate::half::bf16_to_f32(u16::from_le_bytes([a[2 * i], a[2 * i + 1]]));
        s += x * y;
    }
    s
}
