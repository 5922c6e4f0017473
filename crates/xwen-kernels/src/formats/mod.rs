//! Per-format scalar reference code: block layout, dequantization, the reference quantizer
//! (ggml's *_ref, bit-identical), and a scalar dot product against the format's activation
//! type. One file per format family; this module is the table that binds them to GgmlType.

pub mod block;
pub mod float;
pub mod iq4;
pub mod legacy;
pub mod q2_k;
pub mod q3_k;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8;
pub mod search;

use crate::GgmlType;

pub type DequantFn = fn(&[u8], &mut [f32]);
pub type QuantFn = fn(&[f32], &mut [u8]);
/// (n elements, weight row bytes, activation row bytes) -> dot.
pub type DotFn = fn(usize, &[u8], &[u8]) -> f32;
/// (n, weight row, activations, activation row stride in bytes, out): out[t] = dot of the
/// weight row with activation row t, for 1..=4 rows; bit-identical to the single-row DotFn.
pub type MultiDotFn = fn(usize, &[u8], &[u8], usize, &mut [f32]);

pub struct Format {
    pub dequant: DequantFn,
    pub quant: QuantFn,
    /// Scalar dot with activations in `vec_dot_type`; None for activation-only formats.
    pub dot: Option<DotFn>,
    pub vec_dot_type: GgmlType,
}

fn q8_0_ref(x: &[f32], o: &mut [u8]) {
    q8::quantize_q8_0_ref(x, o)
}
fn q8_1_ref(x: &[f32], o: &mut [u8]) {
    q8::quantize_q8_1_ref(x, o)
}

/// The formats this crate implements; None for every other GgmlType.
pub fn format(ty: GgmlType) -> Option<&'static Format> {
    use GgmlType as T;
    macro_rules! f {
        ($d:expr, $q:expr, $dot:expr, $vd:expr) => {{
            static F: Format = Format {
                dequant: $d,
                quant: $q,
                dot: $dot,
                vec_dot_type: $vd,
            };
            Some(&F)
        }};
    }
    match ty {
        T::F32 => f!(
            float::dequantize_f32,
            float::quantize_f32,
            Some(float::dot_f32),
            T::F32
        ),
        T::F16 => f!(
            float::dequantize_f16,
            float::quantize_f16,
            Some(float::dot_f16),
            T::F16
        ),
        T::BF16 => f!(
            float::dequantize_bf16,
            float::quantize_bf16,
            Some(float::dot_bf16),
            T::BF16
        ),
        T::Q4_0 => f!(
            legacy::dequantize_q4_0,
            legacy::quantize_q4_0,
            Some(legacy::dot_q4_0),
            T::Q8_0
        ),
        T::Q4_1 => f!(
            legacy::dequantize_q4_1,
            legacy::quantize_q4_1,
            Some(legacy::dot_q4_1),
            T::Q8_1
        ),
        T::Q5_0 => f!(
            legacy::dequantize_q5_0,
            legacy::quantize_q5_0,
            Some(legacy::dot_q5_0),
            T::Q8_0
        ),
        T::Q5_1 => f!(
            legacy::dequantize_q5_1,
            legacy::quantize_q5_1,
            Some(legacy::dot_q5_1),
            T::Q8_1
        ),
        T::Q8_0 => f!(q8::dequantize_q8_0, q8_0_ref, Some(q8::dot_q8_0), T::Q8_0),
        T::Q8_1 => f!(q8::dequantize_q8_1, q8_1_ref, None, T::Q8_1),
        T::Q8_K => f!(q8::dequantize_q8_k, q8::quantize_q8_k, None, T::Q8_K),
        T::Q2_K => f!(q2_k::dequantize, q2_k::quantize, Some(q2_k::dot), T::Q8_K),
        T::Q3_K => f!(q3_k::dequantize, q3_k::quantize, Some(q3_k::dot), T::Q8_K),
        T::Q4_K => f!(q4_k::dequantize, q4_k::quantize, Some(q4_k::dot), T::Q8_K),
        T::Q5_K => f!(q5_k::dequantize, q5_k::quantize, Some(q5_k::dot), T::Q8_K),
        T::Q6_K => f!(q6_k::dequantize, q6_k::quantize, Some(q6_k::dot), T::Q8_K),
        T::IQ4_NL => f!(
            legacy::dequantize_iq4_nl,
            iq4::quantize_nl,
            Some(legacy::dot_iq4_nl),
            T::Q8_0
        ),
        T::IQ4_XS => f!(
            iq4::dequantize_xs,
            iq4::quantize_xs,
            Some(iq4::dot_xs),
            T::Q8_K
        ),
        _ => None,
    }
}
