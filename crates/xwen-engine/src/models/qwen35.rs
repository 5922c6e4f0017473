//! Qwen3.5 / Qwen3.6 / Qwen3.8 — llama.cpp architectures `qwen35` (dense) and `qwen35moe`.
//! References: llama.cpp b11434 `src/models/qwen35.cpp`, `qwen35moe.cpp`.
//!
//! The hybrid trunk (`hybrid.rs`) with:
//! - DeltaNet projections split four ways: `attn_qkv` (q|k|v), `attn_gate` (z), `ssm_beta`,
//!   `ssm_alpha`;
//! - V-heads in the tiled order the converter writes (V-head h pairs with K-head h mod H_k);
//! - a SwiGLU FFN (`qwen35`) or an MoE with a sigmoid-gated shared expert (`qwen35moe`).

use super::hybrid::{self, Config, TrunkSpec};
use super::Loaded;
use crate::error::Result;
use crate::layers::deltanet::{DeltaNetWeights, HeadPairing};
use xwen_gguf::GgufFile;

pub const DENSE: TrunkSpec =
    TrunkSpec { moe: false, shared_ff_from_ff: false, pairing: HeadPairing::Tiled, imrope: true, load_delta: DeltaNetWeights::load_split };

pub const MOE: TrunkSpec = TrunkSpec { moe: true, ..DENSE };

fn spec(f: &GgufFile) -> &'static TrunkSpec {
    if f.architecture() == Some("qwen35moe") {
        &MOE
    } else {
        &DENSE
    }
}

/// The geometry of a qwen35 / qwen35moe file.
pub fn config(f: &GgufFile) -> Result<Config> {
    Config::from_gguf(f, spec(f))
}

/// The registry's loader for `qwen35` and `qwen35moe`.
pub fn load(f: &GgufFile) -> Result<Loaded> {
    hybrid::load(f, spec(f))
}
