//! The F32 / F16 matrix kernel for 2+ tokens in tinyBLAS's order (llamafile sgemm.cpp
//! gemm_bloc): one FMA chain of 16 lanes (an AVX-512 build) or 8 (AVX2) over k, the k % lanes
//! tail one more step of zero-filled loads (`load_partial`: x86 tinyBLAS takes any k), then the
//! build's horizontal sum. Held against scalar emulations for widths that are and are not
//! multiples of the lanes (models of hidden size 196, 200 or 264 run the tail; xwen was once found
//! running ggml's vec_dot there instead, and checked both against llama.cpp builds).

use xwen_kernels::dispatch::{self, Isa};
use xwen_kernels::half::{f16_to_f32, f32_to_f16};
use xwen_kernels::GgmlType;

/// tinyBLAS<16>'s arithmetic on widened values.
fn tinyblas16(w: &[f32], x: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for (i, (a, b)) in w.iter().zip(x).enumerate() {
        lanes[i % 16] = a.mul_add(*b, lanes[i % 16]);
    }
    // GCC's _mm512_reduce_add_ps: 256-bit halves, 128-bit halves, then 0 + 2 / 1 + 3
    let t3: [f32; 8] = std::array::from_fn(|i| lanes[i + 8] + lanes[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[i + 4] + t3[i]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// tinyBLAS<8>'s arithmetic: the 8-lane chain, then the AVX2 hsum (l_i + l_{i+4}, then
/// movehl, then movehdup).
fn tinyblas8(w: &[f32], x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    for (i, (a, b)) in w.iter().zip(x).enumerate() {
        lanes[i % 8] = a.mul_add(*b, lanes[i % 8]);
    }
    let h: [f32; 4] = std::array::from_fn(|i| lanes[i + 4] + lanes[i]);
    (h[0] + h[2]) + (h[1] + h[3])
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) as f32
        })
        .collect()
}

/// `dispatch::matrix_kernels`' F32 and F16 kernels against `emulate` for several widths.
fn check(emulate: fn(&[f32], &[f32]) -> f32, what: &str) {
    for k in [8usize, 16, 17, 31, 196, 200, 256, 264, 300] {
        let (w, x) = (values(k, k as u64 + 1), values(k, 3 * k as u64 + 7));
        // F32: the weight row and the activations as they are
        let (dot, _) = dispatch::matrix_kernels(GgmlType::F32, 8, false).unwrap();
        let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(dot(k, &wb, &xb).to_bits(), emulate(&w, &x).to_bits(), "{what} F32 k = {k}");
        // F16: both sides in half precision (ggml converts the activations first), widened
        let (dot, _) = dispatch::matrix_kernels(GgmlType::F16, 8, false).unwrap();
        let (wh, xh): (Vec<u16>, Vec<u16>) = (w.iter().map(|&v| f32_to_f16(v)).collect(), x.iter().map(|&v| f32_to_f16(v)).collect());
        let wb: Vec<u8> = wh.iter().flat_map(|v| v.to_le_bytes()).collect();
        let xb: Vec<u8> = xh.iter().flat_map(|v| v.to_le_bytes()).collect();
        let (ww, xw): (Vec<f32>, Vec<f32>) = (wh.iter().map(|&h| f16_to_f32(h)).collect(), xh.iter().map(|&h| f16_to_f32(h)).collect());
        assert_eq!(dot(k, &wb, &xb).to_bits(), emulate(&ww, &xw).to_bits(), "{what} F16 k = {k}");
    }
}

/// Both widths in one test: the kernel cap is process-wide.
#[test]
fn float_matrices_take_tinyblas_with_its_tail() {
    if dispatch::detected() == Isa::Avx512 && dispatch::reference_avx512() {
        check(tinyblas16, "tinyBLAS<16>");
    } else {
        eprintln!("SKIP tinyBLAS<16>: this CPU reproduces no AVX-512 build ({:?})", dispatch::detected());
    }
    if matches!(dispatch::detected(), Isa::Avx512 | Isa::Avx2) {
        dispatch::set_max_isa(Some(Isa::Avx2));
        check(tinyblas8, "tinyBLAS<8>");
        dispatch::set_max_isa(None);
    } else {
        eprintln!("SKIP tinyBLAS<8>: no AVX2 on this CPU");
    }
}
