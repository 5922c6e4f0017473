//! Kimi K3 — llama.cpp architecture `kimi-k3`.
//! Reference: llama.cpp b11434 `src/models/kimi-k3.cpp` (and `conversion/kimi_k3.py`).
//!
//! Kimi-Linear's trunk (`kimi_linear.rs`: KDA and MLA mixers, leading dense layers, a sigmoid
//! router with the selection bias, plain-multiplier norms) with what K3 adds:
//! - situ in place of SwiGLU everywhere (`ffn::Act::Situ`, `activation.situ_beta`,
//!   `activation.situ_linear_beta`);
//! - a latent MoE: the routed experts run at `expert_latent_length` between `ffn_routed_down`
//!   and `ffn_routed_up` (+ `ffn_routed_norm`), the router and shared experts on the full width
//!   (`moe::LatentProj`); the chosen weights renormalized only where `expert_weights_norm` says;
//! - the MLA output gate `attn_gate` and an optional compressed q (`mla.rs`);
//! - KDA's full-rank output gate `ssm_g` and the lower-bound forget gate
//!   (`kda.gate_lower_bound`: g = lb·sigmoid(exp(A_log)·(f_b(f_a x) + dt)));
//! - cross-layer residual attention every `attn_res.block_size` layers (`layers/attn_res.rs`).

use super::hybrid::{req_u, Config};
use super::{kimi_linear, Loaded};
use crate::error::{EngineError, Result};
use crate::layers::ffn::Act;
use xwen_gguf::GgufFile;

/// The geometry of a kimi-k3 file, and the bank interval of its residual attention (0 = none).
pub fn config(f: &GgufFile) -> Result<(Config, Act, usize)> {
    let mut cfg = kimi_linear::config(f)?;
    let k = |s: &str| format!("{}.{s}", cfg.arch);
    let f32_key = |s: &str| f.get_f32(&k(s)).ok_or_else(|| EngineError::MissingKey(k(s)));
    let beta = f32_key("activation.situ_beta")?;
    let linear_beta = f32_key("activation.situ_linear_beta")?;
    if beta.is_nan() || beta <= 0.0 || !beta.is_finite() || !linear_beta.is_finite() {
        return Err(EngineError::BadHparams(format!("situ beta {beta}, linear beta {linear_beta}")));
    }
    let act = Act::Situ { beta, linear_beta };
    let block = req_u(f, &k("attn_res.block_size"))?;
    let latent = f.get_u64(&k("expert_latent_length")).unwrap_or(0) as usize;
    if let Some(m) = cfg.moe.as_mut() {
        m.act = act;
        m.latent = latent;
        m.norm_w = f.get_bool(&k("expert_weights_norm")).unwrap_or(false);
    }
    // a bound of -inf (or none) keeps Kimi-Linear's softplus gate, as llama.cpp's `> -INFINITY`
    cfg.delta.gate_lower_bound = f.get_f32(&k("kda.gate_lower_bound")).filter(|b| b.is_finite());
    Ok((cfg, act, block))
}

/// The registry's loader for `kimi-k3`.
pub fn load(f: &GgufFile) -> Result<Loaded> {
    let (cfg, act, block) = config(f)?;
    kimi_linear::build(f, cfg, act, (block > 0).then_some(block))
}
