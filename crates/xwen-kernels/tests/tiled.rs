//! The tiled-order K-quant kernels (`xwen_kernels::tiled`, llama.cpp b11434 ggml-cpu/tiled):
//! the AVX2 kernels return the scalar reference's bits for every format, token count and
//! epilogue, and the reference is the exact product up to f32 rounding.

mod common;
use common::*;
use xwen_kernels::formats::q8::{Q8_K_BYTES, QK_K};
use xwen_kernels::{dequantize, quantize, quantize_activations, tiled, GgmlType};

const TYPES: [GgmlType; 6] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

fn randn(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.normalish() * scale).collect()
}

#[test]
fn tiled_kernels_match_reference_bits_and_exact_product() {
    let n = 8 * QK_K;
    let mut rng = Rng(7);
    for ty in TYPES {
        for round in 0..6 {
            let wf = randn(&mut rng, n, 0.02 + round as f32 * 0.1);
            let w = quantize(ty, &wf).unwrap();
            let mut wd = vec![0f32; n];
            dequantize(ty, &w, &mut wd).unwrap();
            let toks: Vec<Vec<f32>> = (0..4).map(|_| randn(&mut rng, n, 1.0 + round as f32)).collect();
            let mut act = Vec::new();
            let mut row = Vec::new();
            for x in &toks {
                quantize_activations(ty, x, &mut row);
                assert_eq!(row.len(), n / QK_K * Q8_K_BYTES);
                act.extend_from_slice(&row);
            }
            let stride = n / QK_K * Q8_K_BYTES;
            {
                let refs: Vec<f32> = (0..4)
                    .map(|t| tiled::dot_ref(ty, n, &w, &act[t * stride..(t + 1) * stride]))
                    .collect();
                // the exact product of the dequantized weight and the dequantized activations
                for t in 0..4 {
                    let mut ad = vec![0f32; n];
                    dequantize(GgmlType::Q8_K, &act[t * stride..(t + 1) * stride], &mut ad).unwrap();
                    let exact: f64 = wd.iter().zip(&ad).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = wd.iter().zip(&ad).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    let err = (refs[t] as f64 - exact).abs();
                    assert!(err <= 1e-5 * mag + 1e-6, "{ty:?} round {round}: {} vs {exact}", refs[t]);
                }
                #[cfg(target_arch = "x86_64")]
                if let Some((dot, multi)) = xwen_kernels::simd::avx2_tiled::kernels(ty) {
                    if !xwen_kernels::dispatch::supported(xwen_kernels::dispatch::Isa::Avx2) {
                        continue;
                    }
                    for t in 0..4 {
                        let v = dot(n, &w, &act[t * stride..(t + 1) * stride]);
                        assert_eq!(v.to_bits(), refs[t].to_bits(), "{ty:?} single t{t}");
                    }
                    let multi = multi.expect("multi kernel");
                    for k in 1..=4 {
                        let mut out = vec![0f32; k];
                        multi(n, &w, &act, stride, &mut out);
                        for t in 0..k {
                            assert_eq!(out[t].to_bits(), refs[t].to_bits(), "{ty:?} multi k{k} t{t}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn tiled_order_differs_from_vec_dot_order() {
    // The point of the module: on realistic rows the two orders round differently somewhere.
    let n = 16 * QK_K;
    let mut rng = Rng(11);
    let mut differ = 0;
    for _ in 0..64 {
        let w = quantize(GgmlType::Q6_K, &randn(&mut rng, n, 0.05)).unwrap();
        let mut a = Vec::new();
        quantize_activations(GgmlType::Q6_K, &randn(&mut rng, n, 1.0), &mut a);
        let t = tiled::dot_ref(GgmlType::Q6_K, n, &w, &a);
        let v = xwen_kernels::vec_dot(GgmlType::Q6_K, n, &w, &a);
        if t.to_bits() != v.to_bits() {
            differ += 1;
        }
    }
    assert!(differ > 0, "tiled and vec_dot orders never differed in 64 rows");
}
