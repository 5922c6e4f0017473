//! Q2_K products in the float order of llama.cpp's repacked CPU kernels.
//!
//! An AVX-512 build of ggml-cpu holds every Q2_K matrix whose row count is a multiple of 8 as
//! block_q2_Kx8 (repack.cpp ggml_repack_get_optimal_repack_type; `q4k_repack::repacked_q8k`)
//! and multiplies it with ggml_gemv_q2_K_8x8_q8_K (one token, the n % 4 tail, every token of
//! MUL_MAT_ID) or ggml_gemm_q2_K_8x8_q8_K (groups of 4 tokens of a MUL_MAT). Their integer sums
//! are exact; the float steps differ from ggml_vec_dot_q2_K_q8_K (arch/x86/repack.cpp, b11434):
//! - gemv: per super-block, acc = fma(f32(Σ sc·dot), d·dy, acc) and
//!   accm = fma(f32(Σ m·bsum), dmin·dy, accm) over all 16 sub-blocks; result acc − accm.
//! - gemm: the same once per 128-element half (its `sb` loop: 8 sub-blocks), two per block.
//!
//! These are the scalar emulations; `simd::avx2::dot_q2_k_gemv` / `_gemm` compute the same bits.

use crate::formats::q2_k::{codes, BYTES};
use crate::formats::q8::{q8k_parts, Q8_K_BYTES, QK_K};
use crate::half::read_f16;

/// Per 128-element half of super-block `i`: (Σ sc·dot, Σ m·bsum) over its 8 sub-blocks, and
/// (d·dy, dmin·dy).
pub(crate) fn half_sums(w: &[u8], a: &[u8], i: usize) -> ([i32; 2], [i32; 2], f32, f32) {
    let b = &w[i * BYTES..(i + 1) * BYTES];
    let (dy, q8, bsums) = q8k_parts(&a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES]);
    let q = codes(b);
    let (mut s, mut m) = ([0i32; 2], [0i32; 2]);
    for g in 0..16 {
        let dot: i32 = (0..16).map(|l| q[16 * g + l] as i32 * q8[16 * g + l] as i8 as i32).sum();
        s[g / 8] += (b[g] & 0xf) as i32 * dot;
        m[g / 8] += (b[g] >> 4) as i32 * bsums[g] as i32;
    }
    (s, m, read_f16(&b[80..]) * dy, read_f16(&b[82..]) * dy)
}

/// One row in ggml_gemv_q2_K_8x8_q8_K's order.
pub fn dot_gemv_ref(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for i in 0..n / QK_K {
        let (s, m, d, dmin) = half_sums(w, a, i);
        acc = ((s[0] + s[1]) as f32).mul_add(d, acc);
        accm = ((m[0] + m[1]) as f32).mul_add(dmin, accm);
    }
    acc - accm
}

/// One row of a 4-token group in ggml_gemm_q2_K_8x8_q8_K's order.
pub fn dot_gemm_ref(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for i in 0..n / QK_K {
        let (s, m, d, dmin) = half_sums(w, a, i);
        for h in 0..2 {
            acc = (s[h] as f32).mul_add(d, acc);
            accm = (m[h] as f32).mul_add(dmin, accm);
        }
    }
    acc - accm
}
