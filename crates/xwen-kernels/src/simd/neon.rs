//! Arm NEON kernels (aarch64 only), kept simple: widening multiplies (vmull_s8) with pairwise
//! accumulation instead of the dotprod extension, for Q8_0, Q4_K, Q6_K and F32; dispatch uses
//! the scalar reference for the other formats.
//!
//! NOTE: written on an x86-64 host without an aarch64 toolchain; it has not been compiled or
//! run yet. The property tests (tests/simd_vs_scalar.rs) cover it on the first aarch64 run.

use std::arch::aarch64::*;

use crate::formats::q4_k::unpack_scales_k4;
use crate::formats::q8::q8k_parts;
use crate::formats::DotFn;
use crate::half::{read_f16, read_f32};
use crate::GgmlType;

macro_rules! safe_wrapper {
    ($name:ident, $inner:ident) => {
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: NEON is part of the aarch64 baseline; lengths checked by callers.
            unsafe { $inner(n, w, a) }
        }
    };
}

safe_wrapper!(q8_0, dot_q8_0);
safe_wrapper!(q4_k, dot_q4_k);
safe_wrapper!(q6_k, dot_q6_k);
safe_wrapper!(f32d, dot_f32);

pub fn dot_fn(weight: GgmlType) -> Option<DotFn> {
    Some(match weight {
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q6_K => q6_k,
        GgmlType::F32 => f32d,
        _ => return None,
    })
}

/// Sum of 16 int8 products, widened to i32 lanes added into `acc`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn mul_acc(acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(x), vget_low_s8(y));
    let hi = vmull_high_s8(x, y);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn ld_s8(p: &[u8], off: usize) -> int8x16_t {
    debug_assert!(off + 16 <= p.len());
    vld1q_s8(p.as_ptr().add(off) as *const i8)
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn ld_u8(p: &[u8], off: usize) -> uint8x16_t {
    debug_assert!(off + 16 <= p.len());
    vld1q_u8(p.as_ptr().add(off))
}

#[target_feature(enable = "neon")]
unsafe fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / 32 {
        let b = 34 * i;
        let mut acc = vdupq_n_s32(0);
        acc = mul_acc(acc, ld_s8(w, b + 2), ld_s8(a, b + 2));
        acc = mul_acc(acc, ld_s8(w, b + 18), ld_s8(a, b + 18));
        sumf += read_f16(&w[b..]) * read_f16(&a[b..]) * vaddvq_s32(acc) as f32;
    }
    sumf
}

#[target_feature(enable = "neon")]
unsafe fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m4 = vdupq_n_u8(0x0f);
    let mut sumf = 0.0f32;
    for i in 0..n / 256 {
        let (bw, ba) = (144 * i, 292 * i);
        let (dy, _, bsums) = q8k_parts(&a[ba..ba + 292]);
        let (sc, mn) = unpack_scales_k4(&w[bw + 4..bw + 16]);
        let mut summ = 0i32;
        for j in 0..16 {
            summ += bsums[j] as i32 * mn[j / 2] as i32;
        }
        let mut sumi = 0i32;
        for j in 0..4 {
            let (mut lo, mut hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
            for h in 0..2 {
                let q = ld_u8(w, bw + 16 + 32 * j + 16 * h);
                let ql = vreinterpretq_s8_u8(vandq_u8(q, m4));
                let qh = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
                lo = mul_acc(lo, ql, ld_s8(a, ba + 4 + 64 * j + 16 * h));
                hi = mul_acc(hi, qh, ld_s8(a, ba + 4 + 64 * j + 32 + 16 * h));
            }
            sumi += vaddvq_s32(lo) * sc[2 * j] as i32 + vaddvq_s32(hi) * sc[2 * j + 1] as i32;
        }
        sumf += dy * read_f16(&w[bw..]) * sumi as f32 - dy * read_f16(&w[bw + 2..]) * summ as f32;
    }
    sumf
}

#[target_feature(enable = "neon")]
unsafe fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m4 = vdupq_n_u8(0x0f);
    let m3 = vdupq_n_u8(3);
    let m32 = vdupq_n_s8(32);
    let mut sumf = 0.0f32;
    for i in 0..n / 256 {
        let (bw, ba) = (210 * i, 292 * i);
        let dy = read_f32(&a[ba..]);
        let mut sumi = 0i32;
        for h in 0..2 {
            for half in 0..2 {
                // 16 of the 32 positions l of this 128-element half
                let o = 16 * half;
                let ql0 = ld_u8(w, bw + 64 * h + o);
                let ql1 = ld_u8(w, bw + 64 * h + 32 + o);
                let qh = ld_u8(w, bw + 128 + 32 * h + o);
                let codes = [
                    vorrq_u8(vandq_u8(ql0, m4), vshlq_n_u8::<4>(vandq_u8(qh, m3))),
                    vorrq_u8(
                        vandq_u8(ql1, m4),
                        vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m3)),
                    ),
                    vorrq_u8(
                        vshrq_n_u8::<4>(ql0),
                        vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m3)),
                    ),
                    vorrq_u8(vshrq_n_u8::<4>(ql1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh))),
                ];
                for (k, c) in codes.iter().enumerate() {
                    let q = vsubq_s8(vreinterpretq_s8_u8(*c), m32);
                    let e = 128 * h + 32 * k + o; // first element of these 16
                    let acc = mul_acc(vdupq_n_s32(0), q, ld_s8(a, ba + 4 + e));
                    sumi += vaddvq_s32(acc) * (w[bw + 192 + e / 16] as i8) as i32;
                }
            }
        }
        sumf += dy * read_f16(&w[bw + 208..]) * sumi as f32;
    }
    sumf
}

#[target_feature(enable = "neon")]
unsafe fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (pw, pa) = (w.as_ptr() as *const f32, a.as_ptr() as *const f32);
    let mut acc = [vdupq_n_f32(0.0); 4];
    let n16 = n / 16 * 16;
    for i in (0..n16).step_by(16) {
        for (k, ac) in acc.iter_mut().enumerate() {
            *ac = vfmaq_f32(
                *ac,
                vld1q_f32(pw.add(i + 4 * k)),
                vld1q_f32(pa.add(i + 4 * k)),
            );
        }
    }
    let mut s = vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ));
    for i in n16..n {
        s += read_f32(&w[4 * i..]) * read_f32(&a[4 * i..]);
    }
    s
}
