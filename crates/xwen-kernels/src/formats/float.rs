//! Unquantized element types F32, F16 and BF16 (little-endian, one element per "block").
//! Scalar dots accumulate products in f64 like ggml's scalar fallback (ggml_vec_dot_f32 in
//! ggml-cpu/vec.cpp sums `(ggml_float)(x[i]*y[i])`).

use crate::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

#[inline]
fn u16s(b: &[u8]) -> impl Iterator<Item = u16> + '_ {
    b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]))
}

#[inline]
fn f32s(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (o, v) in dst.iter_mut().zip(f32s(src)) {
        *o = v;
    }
}

pub fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (o, h) in dst.iter_mut().zip(u16s(src)) {
        *o = f16_to_f32(h);
    }
}

pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (o, h) in dst.iter_mut().zip(u16s(src)) {
        *o = bf16_to_f32(h);
    }
}

pub fn quantize_f32(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

pub fn quantize_f16(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
    }
}

pub fn quantize_bf16(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
    }
}

pub fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    f32s(&w[..4 * n])
        .zip(f32s(&a[..4 * n]))
        .map(|(x, y)| (x * y) as f64)
        .sum::<f64>() as f32
}

pub fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    u16s(&w[..2 * n])
        .zip(u16s(&a[..2 * n]))
        .map(|(x, y)| (f16_to_f32(x) * f16_to_f32(y)) as f64)
        .sum::<f64>() as f32
}

pub fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    u16s(&w[..2 * n])
        .zip(u16s(&a[..2 * n]))
        .map(|(x, y)| (bf16_to_f32(x) * bf16_to_f32(y)) as f64)
        .sum::<f64>() as f32
}
