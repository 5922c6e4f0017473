//! SIMD kernels, one file per instruction set. Every kernel here has a scalar twin in
//! `formats` and a property test holding them equal (tests/simd_vs_scalar.rs).
//! Selection happens at run time in `dispatch`; these modules only expose what they have.

/// `f::<len, X..>(args)` for a run-time `len` of 1..=4: the kernels taking 1..=4 rows (tokens or
/// weight rows) are const-generic in that count so each count compiles to unrolled code.
/// Written `count_1_to_4!(len, f::<N, X..>(args))` (the `N` stands for the count); panics
/// outside 1..=4.
macro_rules! count_1_to_4 {
    ($len:expr, $f:ident ::< N $(, $x:tt)* > ( $($a:expr),* $(,)? )) => {
        match $len {
            1 => $f::<1 $(, $x)*>($($a),*),
            2 => $f::<2 $(, $x)*>($($a),*),
            3 => $f::<3 $(, $x)*>($($a),*),
            4 => $f::<4 $(, $x)*>($($a),*),
            k => panic!("{} takes 1..=4 rows, got {k}", stringify!($f)),
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx2_multi;
#[cfg(target_arch = "x86_64")]
pub mod avx2_q4k_repack;
#[cfg(target_arch = "x86_64")]
pub mod avx2_tok8;
#[cfg(target_arch = "x86_64")]
pub mod avx2_tiled;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
pub mod avx512_tok8;
#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod prefetch;

use crate::formats::q8::{self, Q8Flavor};

/// Q8_0 activation quantization, vectorized where the flavour allows (same bytes either way).
pub fn quantize_q8_0(x: &[f32], out: &mut [u8], flavor: Q8Flavor) {
    #[cfg(target_arch = "x86_64")]
    if flavor == Q8Flavor::X86 && crate::dispatch::active() != crate::dispatch::Isa::Scalar {
        // SAFETY: active() is Avx2 or Avx512 only when AVX2/FMA/F16C were detected.
        unsafe { avx2::quantize_q8_0(x, out) };
        return;
    }
    q8::quantize_q8_0(x, out, flavor)
}

/// F32 -> F16 with F16C where available (same bits as the scalar conversion).
pub fn quantize_f16(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::dispatch::active() != crate::dispatch::Isa::Scalar {
        // SAFETY: as above.
        unsafe { avx2::quantize_f16(x, out) };
        return;
    }
    crate::formats::float::quantize_f16(x, out)
}

/// Q8_K activation quantization (ggml's single quantizer, or the 4x8 repack tie-break with
/// `prefer_positive`), vectorized where available (same bytes either way).
pub fn quantize_q8_k(x: &[f32], out: &mut [u8], prefer_positive: bool) {
    #[cfg(target_arch = "x86_64")]
    if crate::dispatch::active() != crate::dispatch::Isa::Scalar {
        assert!(
            out.len() >= x.len() / 256 * 292,
            "quantize_q8_k: output too short"
        );
        // SAFETY: active() is Avx2 or Avx512 only when AVX2/FMA/F16C were detected.
        unsafe { avx2::quantize_q8_k(x, out, prefer_positive) };
        return;
    }
    if prefer_positive {
        q8::quantize_q8_k_prefer_positive(x, out)
    } else {
        q8::quantize_q8_k(x, out)
    }
}
