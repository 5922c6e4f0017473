//! Qwen3-Next — llama.cpp architecture `qwen3next`.
//! Reference: llama.cpp b11434 `src/models/qwen3next.cpp` (and its converter, `conversion/qwen.py`
//! `Qwen3NextModel`); HF transformers `models/qwen3_next` for intent.
//!
//! The hybrid trunk (`hybrid.rs`) with:
//! - DeltaNet projections fused: `attn_qkv` (q|k|v) + `attn_gate` (z) as today's converter
//!   writes them, or the legacy `ssm_in` = per K-head [q | k | v·r | z·r]; and `ssm_ba` = per
//!   K-head [β·r | α·r] (r = H_v / H_k);
//! - V-heads in the checkpoint's grouped order: V-head h pairs with K-head h / r (llama.cpp
//!   repeat-interleaves q and k; qwen35's converter reorders V instead);
//! - plain NeoX partial rope (qwen35's IMROPE sections are the same rotation for text);
//! - every layer an MoE (softmax router, top-k renormalized) with a sigmoid-gated shared expert,
//!   whose width falls back to `feed_forward_length`.

use super::hybrid::{self, Config, TrunkSpec};
use super::Loaded;
use crate::error::Result;
use crate::layers::deltanet::{DeltaNetWeights, HeadPairing};
use xwen_gguf::GgufFile;

pub const SPEC: TrunkSpec =
    TrunkSpec { moe: true, shared_ff_from_ff: true, pairing: HeadPairing::Grouped, imrope: false, load_delta: DeltaNetWeights::load_fused };

/// The geometry of a qwen3next file.
pub fn config(f: &GgufFile) -> Result<Config> {
    Config::from_gguf(f, &SPEC)
}

/// The registry's loader for `qwen3next`.
pub fn load(f: &GgufFile) -> Result<Loaded> {
    hybrid::load(f, &SPEC)
}
