//! Q4_K products in the float order of llama.cpp's repacked CPU kernels.
//!
//! On x86 with AVX2, ggml-cpu holds every Q4_K matrix whose row count is a multiple of 8 as
//! block_q4_Kx8 (repack.cpp ggml_repack_get_optimal_repack_type; AVX-512 builds take the same
//! branch) and multiplies it with ggml_gemv_q4_K_8x8_q8_K (one token; also every token of
//! MUL_MAT_ID) or ggml_gemm_q4_K_8x8_q8_K (groups of 4 tokens of a MUL_MAT; the n % 4 tail
//! goes through the gemv). Their integer sums are exact, so a row's result depends only on
//! where the float rounding happens, which differs from ggml_vec_dot_q4_K_q8_K:
//! - gemv: per super-block, acc = fma(f32(Σ sc·dot), d·dy, acc) and
//!   accm = fma(f32(Σ m·bsum), dmin·dy, accm) over all 8 sub-blocks; result acc - accm.
//! - gemm: the same, but one fma per pair of sub-blocks (64 elements), four per super-block.
//!
//! The functions here are the scalar emulations; `simd::avx2_q4k_repack` computes the same
//! bits with AVX2, and `dispatch` picks between them.

use crate::formats::q4_k::{scale_min_k4, BYTES};
use crate::half::read_f16;
use crate::GgmlType;

const QK: usize = 256;
const Q8K: usize = 292;

/// Whether llama.cpp's CPU backend on this machine repacks a Q4_K matrix of `rows` rows.
/// Decided from the CPU, not from the active kernel set: it is a property of the reference.
pub fn repacked(rows: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // the CPU has the AVX2 set that llama.cpp's repack needs (as `dispatch::detected`)
        rows.is_multiple_of(8)
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = rows;
        false
    }
}

/// Per 64-element pair k of super-block `i`: (Σ sc·dot, Σ m·bsum) over its two sub-blocks.
fn pair_sums(w: &[u8], a: &[u8], i: usize) -> ([i32; 4], [i32; 4]) {
    let (bw, ba) = (i * BYTES, i * Q8K);
    let scales = &w[bw + 4..bw + 16];
    let qs = &w[bw + 16..bw + BYTES];
    let aq = &a[ba + 4..ba + 4 + QK];
    let bsum =
        |k: usize| i16::from_le_bytes([a[ba + 4 + QK + 2 * k], a[ba + 5 + QK + 2 * k]]) as i32;
    let (mut s, mut m) = ([0i32; 4], [0i32; 4]);
    for k in 0..4 {
        for half in 0..2 {
            let j = 2 * k + half;
            let (sc, mn) = scale_min_k4(j, scales);
            let mut dot = 0i32;
            for l in 0..32 {
                let b = qs[32 * k + l];
                let q = if half == 0 { b & 0xf } else { b >> 4 };
                dot += q as i32 * aq[32 * j + l] as i8 as i32;
            }
            s[k] += sc as i32 * dot;
            m[k] += mn as i32 * (bsum(2 * j) + bsum(2 * j + 1));
        }
    }
    (s, m)
}

fn scales_of(w: &[u8], a: &[u8], i: usize) -> (f32, f32) {
    let (bw, ba) = (i * BYTES, i * Q8K);
    let dy = f32::from_le_bytes(a[ba..ba + 4].try_into().unwrap());
    (
        read_f16(&w[bw..bw + 2]) * dy,
        read_f16(&w[bw + 2..bw + 4]) * dy,
    )
}

/// One row in ggml_gemv_q4_K_8x8_q8_K's order (scalar emulation).
pub fn dot_gemv_ref(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for i in 0..n / QK {
        let (s, m) = pair_sums(w, a, i);
        let (d, dmin) = scales_of(w, a, i);
        acc = (s.iter().sum::<i32>() as f32).mul_add(d, acc);
        accm = (m.iter().sum::<i32>() as f32).mul_add(dmin, accm);
    }
    acc - accm
}

/// One row of a 4-token group in ggml_gemm_q4_K_8x8_q8_K's order (scalar emulation).
pub fn dot_gemm_ref(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for i in 0..n / QK {
        let (s, m) = pair_sums(w, a, i);
        let (d, dmin) = scales_of(w, a, i);
        for k in 0..4 {
            acc = (s[k] as f32).mul_add(d, acc);
            accm = (m[k] as f32).mul_add(dmin, accm);
        }
    }
    acc - accm
}

/// Whether llama.cpp's CPU backend on this machine repacks a 2-D `ty` matrix of `rows` rows
/// (CPU_REPACK, any layout: Q4_K, Q4_0 and IQ4_NL with AVX2, Q2_K with AVX-512). A caller with
/// a matrix llama.cpp does not repack (a 3-D stack's head) must keep xwen from repacking it.
pub fn repacked_by_reference(ty: GgmlType, rows: usize) -> bool {
    repacked_q8k(ty, rows) || repacked_q8_0(ty, rows)
}

/// Whether llama.cpp on this machine holds a `ty` matrix of `rows` rows in its AVX2 repacked
/// 8×8 layout with Q8_0 activations (repack.cpp ggml_repack_get_optimal_repack_type: Q4_0 and
/// IQ4_NL with AVX2, rows % 8 == 0), whose gemv and gemm both run one float chain per output
/// (`simd::avx2::dot_q4_0_repacked`).
pub(crate) fn repacked_q8_0(ty: GgmlType, rows: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(ty, GgmlType::Q4_0 | GgmlType::IQ4_NL) && is_x86_feature_detected!("avx2") && rows.is_multiple_of(8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, rows);
        false
    }
}

/// Whether llama.cpp's CPU backend on this machine would hold a `ty` matrix of `rows` rows in
/// its repacked (CPU_REPACK) layout with K-quant activations, quantizing groups of 4 tokens with
/// the interleaving Q8_K quantizer (ggml-cpu/repack.cpp:4925 ggml_repack_get_optimal_repack_type:
/// Q4_K with AVX2, Q2_K with AVX-512, rows % 8 == 0). Its Q4_0/IQ4_NL repack uses a Q8_0
/// quantizer with the same values. A property of the reference on this CPU, not of the active
/// kernel set; `tiled::applies` is its complement among the plain K-quants.
pub(crate) fn repacked_q8k(ty: GgmlType, rows: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let ok = match ty {
            GgmlType::Q4_K => is_x86_feature_detected!("avx2"),
            GgmlType::Q2_K => is_x86_feature_detected!("avx512f") && crate::isa::reference_avx512(),
            _ => false,
        };
        ok && rows.is_multiple_of(8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, rows);
        false
    }
}

