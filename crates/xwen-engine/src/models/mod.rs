//! One file per architecture; each reads like the math: config from metadata, weights, forward.

pub mod qwen35;
