//! Every SIMD kernel against its scalar twin on random blocks, for every kernel set this CPU
//! supports (a set it lacks is reported as SKIP, loudly).
//!
//! Two checks per format:
//! - exact: all scale fields 1.0 and activations clamped to |q| <= 15 over one 256-element
//!   row, so every product and partial sum is an integer below 2^24 and any float summation
//!   order gives the same bits: SIMD must equal scalar exactly (F32/F16/BF16 excluded).
//! - tolerance: realistic scales and activations over rows of 4096: |simd - scalar| must be
//!   at most (n/32 + 16) * 2^-23 * sum|w_i * a_i|, a bound on f32 reassociation error.

mod common;
use common::*;
use xwen_kernels::dispatch::{self, Isa};
use xwen_kernels::formats::{self, q8};
use xwen_kernels::{quantize_activations, vec_dot_type, GgmlType};

const WEIGHTS: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

fn simd_sets() -> Vec<Isa> {
    let mut v = Vec::new();
    for isa in [Isa::Avx2, Isa::Avx512, Isa::Neon] {
        if dispatch::supported(isa) {
            v.push(isa);
        } else {
            eprintln!("SKIP: {isa:?} kernels not tested: this CPU lacks {isa:?}");
        }
    }
    v
}

fn set_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&xwen_kernels::half::f32_to_f16(v).to_le_bytes());
}

/// Weight blocks with every scale field 1.0 (the int scale bytes stay random).
fn unit_scale_blocks(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut b = random_blocks(rng, ty, n);
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    for blk in b.chunks_exact_mut(ty.type_size()) {
        for &f in fields {
            set_f16(blk, f, 1.0);
        }
    }
    b
}

/// Activations with d = 1 and |q| <= 15, derived fields (Q8_1 s, Q8_K bsums) consistent.
fn small_unit_activations(rng: &mut Rng, vd: GgmlType, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let x = rng.activations(n);
    quantize_activations(
        match vd {
            GgmlType::Q8_1 => GgmlType::Q4_1,
            GgmlType::Q8_K => GgmlType::Q4_K,
            _ => GgmlType::Q8_0,
        },
        &x,
        &mut out,
    );
    let clamp = |q: &mut u8| *q = (*q as i8).clamp(-15, 15) as u8;
    match vd {
        GgmlType::Q8_0 => out.chunks_exact_mut(34).for_each(|b| {
            set_f16(b, 0, 1.0);
            b[2..].iter_mut().for_each(clamp);
        }),
        GgmlType::Q8_1 => out.chunks_exact_mut(36).for_each(|b| {
            b[4..].iter_mut().for_each(clamp);
            let s: i32 = b[4..].iter().map(|&q| q as i8 as i32).sum();
            set_f16(b, 0, 1.0);
            set_f16(b, 2, s as f32);
        }),
        GgmlType::Q8_K => out.chunks_exact_mut(292).for_each(|b| {
            b[..4].copy_from_slice(&1.0f32.to_le_bytes());
            b[4..260].iter_mut().for_each(clamp);
            for g in 0..16 {
                let s: i32 = b[4 + 16 * g..20 + 16 * g]
                    .iter()
                    .map(|&q| q as i8 as i32)
                    .sum();
                b[260 + 2 * g..262 + 2 * g].copy_from_slice(&(s as i16).to_le_bytes());
            }
        }),
        _ => unreachable!(),
    }
    out
}

#[test]
fn integer_exact_formats_give_identical_bits() {
    let mut rng = Rng(0xabcdef);
    for isa in simd_sets() {
        for ty in WEIGHTS.into_iter().filter(|t| t.is_quantized()) {
            let scalar = formats::format(ty).unwrap().dot.unwrap();
            let simd = dispatch::dot_fn_for(ty, isa).unwrap();
            for trial in 0..200 {
                let w = unit_scale_blocks(&mut rng, ty, 256);
                let a = small_unit_activations(&mut rng, vec_dot_type(ty), 256);
                let (s, v) = (scalar(256, &w, &a), simd(256, &w, &a));
                assert_eq!(
                    s.to_bits(),
                    v.to_bits(),
                    "{isa:?} {ty} trial {trial}: scalar {s} simd {v}"
                );
            }
        }
    }
}

#[test]
fn simd_dots_match_scalar_within_reassociation_bound() {
    let mut rng = Rng(0x1234_5678);
    let n = 4096;
    for isa in simd_sets() {
        for ty in WEIGHTS {
            let scalar = formats::format(ty).unwrap().dot.unwrap();
            let simd = dispatch::dot_fn_for(ty, isa).unwrap();
            let mut worst = 0f64;
            for trial in 0..50 {
                let w = random_blocks(&mut rng, ty, n);
                let mut a = Vec::new();
                quantize_activations(ty, &rng.activations(n), &mut a);
                let (s, v) = (scalar(n, &w, &a) as f64, simd(n, &w, &a) as f64);
                let scale = abs_dot(ty, &w, vec_dot_type(ty), &a, n);
                let bound = (n as f64 / 32.0 + 16.0) * 2f64.powi(-23) * scale + 1e-30;
                assert!(
                    (s - v).abs() <= bound,
                    "{isa:?} {ty} trial {trial}: scalar {s:e} simd {v:e} bound {bound:e}"
                );
                worst = worst.max((s - v).abs() / scale.max(1e-30));
            }
            eprintln!("{isa:?} {ty}: worst |simd-scalar| / sum|w*a| = {worst:.2e}");
        }
    }
}

#[test]
fn vectorized_activation_quantizers_equal_scalar() {
    let mut rng = Rng(99);
    for _ in 0..200 {
        let mut x = rng.activations(1024);
        // exact halfway points after scaling: amax 127 makes id = 1
        x[0] = 127.0;
        for v in x[1..32].iter_mut() {
            *v = (*v).round() + 0.5;
        }
        let mut fast = vec![0u8; 32 * 34];
        let mut slow = vec![0u8; 32 * 34];
        xwen_kernels::simd::quantize_q8_0(&x, &mut fast, q8::Q8Flavor::native());
        q8::quantize_q8_0(&x, &mut slow, q8::Q8Flavor::native());
        assert_eq!(fast, slow);
        for prefer_positive in [false, true] {
            let mut tie = x.clone();
            tie[77] = 9.0e3; // +/- tie for the largest magnitude inside the first super-block
            tie[5] = -9.0e3;
            let mut fast = vec![0u8; 4 * 292];
            let mut slow = vec![0u8; 4 * 292];
            xwen_kernels::simd::quantize_q8_k(&tie, &mut fast, prefer_positive);
            if prefer_positive {
                q8::quantize_q8_k_prefer_positive(&tie, &mut slow);
            } else {
                q8::quantize_q8_k(&tie, &mut slow);
            }
            assert_eq!(fast, slow, "q8_K prefer_positive={prefer_positive}");
        }
        let mut fh = vec![0u8; 2048];
        let mut sh = vec![0u8; 2048];
        xwen_kernels::simd::quantize_f16(&x, &mut fh);
        formats::float::quantize_f16(&x, &mut sh);
        assert_eq!(fh, sh);
    }
}

/// The AVX-512 Q8_0 kernel must return the AVX2 kernel's bits (dispatch relies on it to reuse
/// the AVX2 multi-token kernel for matmul).
#[test]
fn avx512_q8_0_is_bit_identical_to_avx2() {
    if !dispatch::supported(Isa::Avx512) {
        eprintln!("SKIP: avx512_q8_0_is_bit_identical_to_avx2: this CPU lacks AVX-512");
        return;
    }
    let mut rng = Rng(4242);
    let f512 = dispatch::dot_fn_for(GgmlType::Q8_0, Isa::Avx512).unwrap();
    let f256 = dispatch::dot_fn_for(GgmlType::Q8_0, Isa::Avx2).unwrap();
    for _ in 0..500 {
        let n = 32 * (1 + rng.below(200));
        let w = random_blocks(&mut rng, GgmlType::Q8_0, n);
        let mut a = Vec::new();
        quantize_activations(GgmlType::Q8_0, &rng.activations(n), &mut a);
        assert_eq!(f512(n, &w, &a).to_bits(), f256(n, &w, &a).to_bits());
    }
}
