//! Runtime choice of the SIMD kernel set, made once from CPUID (never from compile-time target
//! features, so one binary serves every x86-64), plus a process-wide switch that forces the
//! scalar reference everywhere for bisecting numeric differences.

use crate::formats::{self, DotFn, MultiDotFn};
use crate::GgmlType;

// The kernel-set state (CPUID, the cap, the force switch) lives in `isa`, a leaf module that
// the f32 primitives and the repack rules read without importing the kernel tables here.
pub use crate::isa::{active, detected, force_reference, generation, reference_avx512, set_force_reference, set_max_isa, Isa};

/// The dot kernel for `weight` under `isa` (falling back to scalar where that set has none).
/// Only hands out SIMD kernels for an `isa` this CPU supports.
pub fn dot_fn_for(weight: GgmlType, isa: Isa) -> Option<DotFn> {
    let scalar = formats::format(weight)?.dot?;
    let isa = if supported(isa) { isa } else { Isa::Scalar };
    let simd = match isa {
        Isa::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            crate::simd::avx512::dot_fn(weight).or_else(|| crate::simd::avx2::dot_fn(weight))
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => crate::simd::avx2::dot_fn(weight),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => crate::simd::neon::dot_fn(weight),
        #[allow(unreachable_patterns)]
        _ => None,
    };
    Some(simd.unwrap_or(scalar))
}

/// Whether kernels of `isa` may run on this CPU.
pub fn supported(isa: Isa) -> bool {
    matches!(
        (isa, detected()),
        (Isa::Scalar, _)
            | (Isa::Avx2, Isa::Avx2 | Isa::Avx512)
            | (Isa::Avx512, Isa::Avx512)
            | (Isa::Neon, Isa::Neon)
    )
}

/// The dot kernel in use now for `weight`.
pub fn dot_fn(weight: GgmlType) -> Option<DotFn> {
    dot_fn_for(weight, active())
}

/// A multi-token kernel for `weight` whose per-token results are bit-identical to
/// `dot_fn(weight)`; None where the active set has none (callers then loop over `dot_fn`).
/// On AVX-512 Q8_0 and Q6_K take the set's own VNNI multi-row kernels (their single-token
/// kernel's operations per row); the AVX2 multi-token kernels are valid where that set uses
/// the AVX2 single-token kernel.
pub fn multi_dot_fn(weight: GgmlType) -> Option<MultiDotFn> {
    match active() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => crate::simd::avx2_multi::multi_dot_fn(weight),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if crate::simd::avx512::multi_dot_fn(weight).is_some() => crate::simd::avx512::multi_dot_fn(weight),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if crate::simd::avx512::dot_fn(weight).is_none() => crate::simd::avx2_multi::multi_dot_fn(weight),
        _ => None,
    }
}

/// Kernels for products with a `weight` matrix of `rows` rows, per token: `grouped` selects the
/// order of a token in one of llama.cpp's 4-token MUL_MAT groups, else that of a single-token
/// product (matvec, the n % 4 tail, every MUL_MAT_ID token). They differ from `dot_fn` only
/// where llama.cpp would repack the matrix (`q4k_repack`). The multi-token kernel, when given,
/// returns per token the single-token kernel's bits.
pub fn matrix_kernels(
    weight: GgmlType,
    rows: usize,
    grouped: bool,
) -> Option<(DotFn, Option<MultiDotFn>)> {
    if weight == GgmlType::Q4_K && crate::q4k_repack::repacked(rows) {
        #[cfg(target_arch = "x86_64")]
        if matches!(active(), Isa::Avx2 | Isa::Avx512) {
            let (d, m) = crate::simd::avx2_q4k_repack::kernels(grouped);
            // decode rows in the gemv order: AVX-512's VNNI twin of the multi-row kernel
            let m = if active() == Isa::Avx512 && !grouped { crate::simd::avx512::q4k_gemv_multi } else { m };
            return Some((d, Some(m)));
        }
        let d: DotFn = if grouped {
            crate::q4k_repack::dot_gemm_ref
        } else {
            crate::q4k_repack::dot_gemv_ref
        };
        return Some((d, None));
    }
    if weight == GgmlType::Q2_K && crate::q4k_repack::repacked_q8k(weight, rows) {
        #[cfg(target_arch = "x86_64")]
        if matches!(active(), Isa::Avx2 | Isa::Avx512) {
            let d: DotFn = if grouped { crate::simd::avx2::dot_q2_k_gemm } else { crate::simd::avx2::dot_q2_k_gemv };
            return Some((d, None));
        }
        let d: DotFn = if grouped { crate::q2k_repack::dot_gemm_ref } else { crate::q2k_repack::dot_gemv_ref };
        return Some((d, None));
    }
    #[cfg(target_arch = "x86_64")]
    if crate::q4k_repack::repacked_q8_0(weight, rows) && matches!(active(), Isa::Avx2 | Isa::Avx512) {
        let d: DotFn = if weight == GgmlType::Q4_0 { crate::simd::avx2::dot_q4_0_repacked } else { crate::simd::avx2::dot_iq4_nl_repacked };
        return Some((d, None));
    }
    // llamafile's tinyBLAS takes float weights only when the row count is a multiple of 4
    // (sgemm.cpp tinyBLAS::matmul); any other matrix goes through ggml's generic path, which
    // runs the one-token vec_dot for every output
    if matches!(weight, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) && !rows.is_multiple_of(4) {
        if let Some(d) = vec_dot_twin(weight) {
            return Some((d, None));
        }
    }
    Some((dot_fn(weight)?, multi_dot_fn(weight)))
}

/// The one-token vec_dot kernels (ggml_vec_dot_f32 / _f16 / _bf16 / _iq4_nl_q8_0) where they
/// differ from tinyBLAS's order for the same type (AVX2; AVX-512: F32, F16, BF16 with AVX512-BF16, IQ4_NL).
pub(crate) fn vec_dot_twin(weight: GgmlType) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    if active() == Isa::Avx2 {
        match weight {
            GgmlType::F32 => return Some(crate::simd::avx2::dot_f32_vec_dot),
            GgmlType::BF16 => return Some(crate::simd::avx2::dot_bf16_vec_dot),
            GgmlType::F16 => return Some(crate::simd::avx2::dot_f16_vec_dot),
            GgmlType::IQ4_NL => return Some(crate::simd::avx2::dot_iq4_nl_vec_dot),
            _ => {}
        }
    }
    // an AVX-512 build's ggml_vec_dot_f32 / _f16 run 16 lanes; its _bf16 takes vdpbf16ps where
    // the CPU has AVX512-BF16 (without it: not reproduced); its _iq4_nl_q8_0 has no AVX-512
    // branch, so the AVX2 one runs there too
    #[cfg(target_arch = "x86_64")]
    if active() == Isa::Avx512 {
        match weight {
            GgmlType::F32 => return Some(crate::simd::avx512::dot_f32_vec_dot),
            GgmlType::F16 => return Some(crate::simd::avx512::dot_f16_vec_dot),
            GgmlType::BF16 if crate::simd::avx512::has_bf16_dot() => return Some(crate::simd::avx512::dot_bf16_vec_dot),
            GgmlType::IQ4_NL => return Some(crate::simd::avx2::dot_iq4_nl_vec_dot),
            _ => {}
        }
    }
    let _ = weight;
    None
}

/// The one-token kernel of a `weight` matrix of `rows` rows where it is not
/// `matrix_kernels`'s: the vec_dot twins of the types llama.cpp multiplies with tinyBLAS for 2+
/// tokens (F32, F16, BF16, an IQ4_NL matrix it did not repack).
fn one_token_twin(weight: GgmlType, rows: usize) -> Option<DotFn> {
    if crate::q4k_repack::repacked_q8_0(weight, rows) {
        return None;
    }
    vec_dot_twin(weight)
}

/// The kernel for a product with one token (matvec rows, decode batches, a 1-token matmul):
/// `matrix_kernels`'s single-token kernel, or its vec_dot twin (`one_token_twin`).
pub fn row_dot_fn(weight: GgmlType, rows: usize) -> Option<DotFn> {
    one_token_twin(weight, rows).or_else(|| matrix_kernels(weight, rows, false).map(|k| k.0))
}

/// The kernel of a product with one token, per row, and whether it prefetches for itself.
#[derive(Clone, Copy)]
pub struct RowKernel {
    pub dot: DotFn,
    /// The kernel prefetches the weights ahead of its own loop (simd::avx2::prefetch_ahead),
    /// so the row loop must not add its own bursts (which measured slower on top).
    pub prefetches: bool,
    /// A kernel for one row against 1..=4 activation rows whose per-row results are `dot`'s
    /// bits: several sequences' decode rows share one read of the weight row (`dot_rows_tokens`)
    /// without leaving the single-token order. None = loop `dot` over the tokens.
    pub multi: Option<MultiDotFn>,
    /// The most activation rows `multi` takes at once (4; Q6_K's 8: its unpacking of a block
    /// costs more than the per-row products, so 8 decode rows share one).
    pub multi_rows: usize,
    /// Q8_0 on AVX-512: several activation rows are laid out once (`simd::avx512::Q8Prepared`)
    /// and each weight row's products with them take `simd::avx512::q8_0_prepared` — `dot`'s
    /// bits per row, about half `multi`'s instructions per row and block.
    pub q8_prepared: bool,
}

/// `row_dot_fn`, except that Q8_0 takes its streaming twin (the same bits, with prefetch; see
/// `simd::avx2::q8_0_stream`). Valid on AVX-512 too, whose VNNI Q8_0 kernel returns the AVX2
/// kernel's bits.
pub fn row_kernel(weight: GgmlType, rows: usize) -> Option<RowKernel> {
    let simd = matches!(active(), Isa::Avx2 | Isa::Avx512) && cfg!(target_arch = "x86_64");
    let dot = match weight {
        #[cfg(target_arch = "x86_64")]
        GgmlType::Q8_0 if simd => crate::simd::avx2::q8_0_stream,
        _ => row_dot_fn(weight, rows)?,
    };
    // The AVX2 kernels with prefetch_ahead in their loop (Q6_K has no AVX-512 kernel, so AVX2's
    // runs there too; Q4_K only in the repacked order; F32 only where row_dot_fn hands out
    // ggml_vec_dot_f32's twin).
    let prefetches = simd
        && match weight {
            GgmlType::Q8_0 | GgmlType::Q6_K => true,
            GgmlType::Q4_K => crate::q4k_repack::repacked(rows),
            // ggml_vec_dot_f32's twin (dot_f32_vec_dot) is the AVX2 set's only
            GgmlType::F32 => active() == Isa::Avx2,
            _ => false,
        };
    // `matrix_kernels`' multi-token twin returns its single-token kernel's bits; that kernel is
    // `row_dot_fn`'s (and, for Q8_0, `q8_0_stream`'s: the same bits) except where that is a
    // vec_dot twin, which has no multi-token form.
    let multi = if one_token_twin(weight, rows).is_some() { None } else { matrix_kernels(weight, rows, false).and_then(|k| k.1) };
    #[cfg(target_arch = "x86_64")]
    let q6_k_rows = crate::simd::avx2_multi::MULTI_Q6_K_ROWS;
    #[cfg(not(target_arch = "x86_64"))]
    let q6_k_rows = 4;
    let multi_rows = if simd && weight == GgmlType::Q6_K { q6_k_rows } else { 4 };
    let q8_prepared = simd && weight == GgmlType::Q8_0 && active() == Isa::Avx512;
    Some(RowKernel { dot, prefetches, multi, multi_rows, q8_prepared })
}

/// Kernels for a `ty` product in llama.cpp's tiled order (`crate::tiled`): a single-token dot
/// and, where the active kernel set has one, a multi-token kernel returning the same bits per
/// token.
pub fn tiled_kernels(ty: GgmlType) -> Option<(DotFn, Option<MultiDotFn>)> {
    #[cfg(target_arch = "x86_64")]
    if matches!(active(), Isa::Avx2 | Isa::Avx512) {
        if let Some(k) = crate::simd::avx2_tiled::kernels(ty) {
            return Some(k);
        }
    }
    crate::tiled::ref_fn(ty).map(|d| (d, None))
}

