//! AVX2 + FMA + F16C kernels (ggml-cpu/arch/x86/quants.c AVX2 paths are the model).

use crate::formats::DotFn;
use crate::GgmlType;
use std::arch::x86_64::*;

pub fn dot_fn(_weight: GgmlType) -> Option<DotFn> {
    None
}

/// quantize_row_q8_0's AVX path: id = 127/amax, round half to even.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    crate::formats::q8::quantize_q8_0(x, out, crate::formats::q8::Q8Flavor::X86)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_f16(x: &[f32], out: &mut [u8]) {
    let n8 = x.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm_storeu_si128(out.as_mut_ptr().add(2 * i) as *mut __m128i, h);
    }
    crate::formats::float::quantize_f16(&x[n8..], &mut out[2 * n8..]);
}
