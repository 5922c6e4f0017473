//! Block quantization formats of ggml (dequantize, reference quantizers, dot products), SIMD
//! kernels chosen at run time from CPUID, and the worker pool that runs matrix × vector
//! products.
//!
//! Numerics follow llama.cpp b11434's CPU backend: dequantization is bit-exact with
//! ggml-quants.c, the reference quantizers are bit-exact with ggml's `*_ref`, and activations
//! are quantized exactly as ggml-cpu does on the same architecture (see `formats::q8`). Dot
//! products agree with ggml up to float summation order.

pub mod dispatch;
pub mod f32ops;
pub mod formats;
pub mod half;
pub mod isa;
pub mod membw;
mod matmul;
mod pool;
pub mod q2k_repack;
pub mod q4k_repack;
pub mod scratch;
pub mod simd;
pub mod tiled;

pub use matmul::{act_row_bytes, dot_rows, dot_rows_tokens, lanes_keep_one_token_order, tokens_on_lanes, quantize_activations_for_matmul, QMatrix};
pub use pool::Pool;
pub use xwen_gguf::GgmlType;

use formats::q8::{self, Q8Flavor};

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("type {0} is not supported by xwen-kernels")]
    Unsupported(GgmlType),
    #[error("{n} elements is not a whole number of {ty} blocks ({block} elements each)")]
    NotBlockMultiple {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{ty}: {n} elements need {expected} bytes, got {got}")]
    LengthMismatch {
        ty: GgmlType,
        n: usize,
        expected: usize,
        got: usize,
    },
}

/// Whether `ty` can be dequantized and quantized here.
pub fn is_supported(ty: GgmlType) -> bool {
    formats::format(ty).is_some()
}

/// Whether `ty` can be a weight in `vec_dot`/`matvec` (activation-only formats cannot).
pub fn is_supported_weight(ty: GgmlType) -> bool {
    formats::format(ty).is_some_and(|f| f.dot.is_some())
}

fn check_len(
    ty: GgmlType,
    n: usize,
    bytes: usize,
) -> Result<&'static formats::Format, KernelError> {
    let f = formats::format(ty).ok_or(KernelError::Unsupported(ty))?;
    let block = ty.block_size();
    if !n.is_multiple_of(block) {
        return Err(KernelError::NotBlockMultiple { ty, n, block });
    }
    let expected = n / block * ty.type_size();
    if bytes != expected {
        return Err(KernelError::LengthMismatch {
            ty,
            n,
            expected,
            got: bytes,
        });
    }
    Ok(f)
}

/// Dequantize whole blocks; dst.len() = n elements, src.len() = ty.row_bytes(n).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    let f = check_len(ty, dst.len(), src.len())?;
    (f.dequant)(src, dst);
    Ok(())
}

/// Reference quantizer from f32 (ggml's *_ref quantizers; bit-identical to ggml). For Q8_0 and
/// Q8_1 this is the *reference* rounding, not the activation rounding: use
/// [`quantize_activations`] for activations.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, KernelError> {
    let f = formats::format(ty).ok_or(KernelError::Unsupported(ty))?;
    let block = ty.block_size();
    if !src.len().is_multiple_of(block) {
        return Err(KernelError::NotBlockMultiple {
            ty,
            n: src.len(),
            block,
        });
    }
    let mut out = vec![0u8; src.len() / block * ty.type_size()];
    (f.quant)(src, &mut out);
    Ok(out)
}

/// The activation format ggml pairs with a weight format for dot products
/// (ggml-cpu.c type_traits_cpu[].vec_dot_type). Types this crate does not implement map to
/// themselves.
pub fn vec_dot_type(weight: GgmlType) -> GgmlType {
    formats::format(weight).map_or(weight, |f| f.vec_dot_type)
}

/// Quantize activations `x` (length a multiple of the block size) into `out` (cleared and
/// resized) in `vec_dot_type(weight)`, exactly as llama.cpp's CPU backend does for a matrix ×
/// vector product on this architecture: Q8_0/Q8_1 with the native rounding flavour, Q8_K with
/// ggml's single quantizer, F16/BF16 by rounding, F32 by copy.
///
/// Panics if `weight` is unsupported or `x.len()` is not a whole number of blocks.
pub fn quantize_activations(weight: GgmlType, x: &[f32], out: &mut Vec<u8>) {
    let vd = vec_dot_type(weight);
    assert!(
        is_supported(vd),
        "quantize_activations: unsupported weight type {weight}"
    );
    let bs = vd.block_size();
    assert!(
        x.len().is_multiple_of(bs),
        "quantize_activations: {} elements is not a multiple of {bs}",
        x.len()
    );
    out.clear();
    out.resize(x.len() / bs * vd.type_size(), 0);
    quantize_activations_into(vd, x, out, false);
}

/// Activation quantization into a sized buffer. `prefer_positive` selects the Q8_K tie-break
/// of ggml's x86 4-row repack quantizer (see `formats::q8`).
pub(crate) fn quantize_activations_into(
    vd: GgmlType,
    x: &[f32],
    out: &mut [u8],
    prefer_positive: bool,
) {
    match vd {
        GgmlType::Q8_0 => simd::quantize_q8_0(x, out, Q8Flavor::native()),
        GgmlType::Q8_1 => q8::quantize_q8_1(x, out, Q8Flavor::native()),
        GgmlType::Q8_K => simd::quantize_q8_k(x, out, prefer_positive),
        GgmlType::F32 => formats::float::quantize_f32(x, out),
        GgmlType::F16 => simd::quantize_f16(x, out),
        GgmlType::BF16 => formats::float::quantize_bf16(x, out),
        other => unreachable!("no activation quantizer for {other}"),
    }
}

/// Dot product of one weight row (n elements) with activations already in
/// `vec_dot_type(weight)`. Uses the active SIMD kernel set.
///
/// Panics if `weight` is not a supported weight type or either slice is shorter than n
/// elements need.
pub fn vec_dot(weight: GgmlType, n: usize, w_row: &[u8], act: &[u8]) -> f32 {
    let f = dispatch::dot_fn(weight)
        .unwrap_or_else(|| panic!("vec_dot: unsupported weight type {weight}"));
    check_dot_args(weight, n, w_row, act);
    f(n, w_row, act)
}

pub(crate) fn check_dot_args(weight: GgmlType, n: usize, w_row: &[u8], act: &[u8]) {
    let vd = vec_dot_type(weight);
    assert!(
        n.is_multiple_of(weight.block_size()) && n.is_multiple_of(vd.block_size()),
        "vec_dot: n = {n} is not a whole number of blocks"
    );
    assert!(
        w_row.len() >= n / weight.block_size() * weight.type_size(),
        "vec_dot: weight row too short"
    );
    assert!(
        act.len() >= n / vd.block_size() * vd.type_size(),
        "vec_dot: activation row too short"
    );
}
