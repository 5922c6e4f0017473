//! Tensor type mixes: which ggml type each matrix of a synthetic file gets.
//!
//! `tensor_plan` lays a file out in the official Q4_K_M mix; a mix then re-types its matrices
//! (norms, routers, conv taps, gates' biases stay F32, as every converter writes them). A row
//! length a type's block does not divide falls back as llama-quantize's
//! `tensor_type_fallback` (llama.cpp b11434 `src/llama-quant.cpp`) does: 256-element k-quants to
//! their 32-element kin, and anything still not dividing to F16 — so a file of an odd geometry
//! holds exactly the types llama.cpp would have written for it.

use crate::{Fill, Result, SynthError, TensorPlan};
use xwen_gguf::GgmlType;

/// The types of a synthetic file's matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// The official Q4_K_M files' mix (`tensor_plan`'s own types).
    Q4KM,
    /// Every matrix one type (F32, F16, BF16, Q8_0, any k-quant ...), with the fallbacks.
    Uniform(GgmlType),
    /// Every matrix a type drawn from `RANDOM_TYPES` by its name and the seed: a file that
    /// mixes kernels no real file pairs, so one comparison covers many of them.
    Random(u64),
}

/// The types `Mix::Random` draws from: every weight type xwen has kernels for.
pub const RANDOM_TYPES: [GgmlType; 15] = [
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

impl Mix {
    /// Re-types the matrices of `plan`.
    pub(crate) fn apply(self, plan: &mut [TensorPlan]) {
        for t in plan.iter_mut().filter(|t| t.fill == Fill::Matrix) {
            let target = match self {
                Mix::Q4KM => t.ty,
                Mix::Uniform(ty) => ty,
                Mix::Random(seed) => {
                    let h = crate::fnv1a(t.name.as_bytes()) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    RANDOM_TYPES[(crate::Rng::new(h).next_u64() % RANDOM_TYPES.len() as u64) as usize]
                }
            };
            t.ty = fallback(target, t.dims[0]);
        }
    }

    /// `general.file_type` (llama_ftype) of a file of this mix.
    pub(crate) fn file_type(self) -> u32 {
        match self {
            Mix::Uniform(GgmlType::F32) => 0,
            Mix::Uniform(GgmlType::F16) => 1,
            Mix::Uniform(GgmlType::Q8_0) => 7,
            Mix::Uniform(GgmlType::BF16) => 32,
            _ => 15, // LLAMA_FTYPE_MOSTLY_Q4_K_M
        }
    }

    /// The mix a name stands for: `q4_k_m`, `random`, or a type name (`f32`, `bf16`, `q8_0`, ...).
    pub fn parse(s: &str, seed: u64) -> Result<Mix> {
        match s.to_ascii_lowercase().as_str() {
            "q4_k_m" => Ok(Mix::Q4KM),
            "random" => Ok(Mix::Random(seed)),
            other => RANDOM_TYPES
                .iter()
                .find(|t| t.to_string().eq_ignore_ascii_case(other))
                .map(|&t| Mix::Uniform(t))
                .ok_or_else(|| {
                    let names: Vec<String> = RANDOM_TYPES.iter().map(|t| t.to_string().to_ascii_lowercase()).collect();
                    SynthError::Invalid(format!("unknown type mix `{s}` (known: q4_k_m, random, {})", names.join(", ")))
                }),
        }
    }
}

/// llama-quantize's fallback for a row of `ncols` elements.
pub fn fallback(target: GgmlType, ncols: u64) -> GgmlType {
    let fits = |ty: GgmlType| ncols.is_multiple_of(ty.block_size() as u64);
    if fits(target) {
        return target;
    }
    let demoted = match target {
        GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if fits(demoted) {
        demoted
    } else {
        GgmlType::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallbacks_follow_llama_quantize() {
        assert_eq!(fallback(GgmlType::Q4_K, 512), GgmlType::Q4_K);
        assert_eq!(fallback(GgmlType::Q4_K, 384), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q5_K, 96), GgmlType::Q5_1);
        assert_eq!(fallback(GgmlType::Q6_K, 160), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q3_K, 64), GgmlType::Q4_0);
        assert_eq!(fallback(GgmlType::IQ4_XS, 64), GgmlType::IQ4_NL);
        assert_eq!(fallback(GgmlType::Q8_0, 48), GgmlType::F16);
        assert_eq!(fallback(GgmlType::Q4_K, 48), GgmlType::F16);
        assert_eq!(fallback(GgmlType::F32, 7), GgmlType::F32);
    }

    #[test]
    fn mixes_parse_by_name() {
        assert_eq!(Mix::parse("Q4_K_M", 1).unwrap(), Mix::Q4KM);
        assert_eq!(Mix::parse("bf16", 1).unwrap(), Mix::Uniform(GgmlType::BF16));
        assert_eq!(Mix::parse("random", 9).unwrap(), Mix::Random(9));
        let e = Mix::parse("q9_9", 1).unwrap_err().to_string();
        assert!(e.contains("unknown type mix") && e.contains("q8_0"), "{e}");
    }
}
