//! Kimi-Linear — llama.cpp architecture `kimi-linear`.
//! Reference: llama.cpp b11434 `src/models/kimi-linear.cpp` (and `conversion/kimi_linear.py`);
//! HF `models/kimi_linear` for intent.
//!
//! The hybrid skeleton (`hybrid.rs`) with other blocks in it:
//! - KDA layers (where `attention.head_count_kv` is 0): the delta rule with one decay per key
//!   channel, q/k/v convolved separately, the forget gate `a·softplus(f_b(f_a x) + dt)`, the
//!   output gate `sigmoid(g_b(g_a x))` (`deltanet::DeltaVariant::Kda`);
//! - MLA layers in the absorbed form without rope (`layers/mla.rs`);
//! - `ffn_norm` before the FFN; the first `leading_dense_block_count` layers a SwiGLU, the rest an
//!   MoE with a sigmoid router, the score-correction bias `exp_probs_b` for selection, the chosen
//!   weights renormalized and scaled by `expert_weights_scale`, and an ungated shared expert of
//!   `expert_shared_count` × the expert width.
//!
//! Norm weights are plain multipliers (no +1 baked in, unlike Qwen's).
//!
//! Kimi K3 (`kimi_k3.rs`) is this trunk with its own activation, gates, latent MoE and
//! cross-layer residual attention: `config` and `build` serve both.

use super::hybrid::{req_u, req_u_or_arr, Config, Ffn, Hybrid, Layer, Mixer};
use super::Loaded;
use crate::error::{EngineError, Result};
use crate::layers::attention::AttnDims;
use crate::layers::deltanet::{DeltaDims, DeltaNetWeights, DeltaVariant, HeadPairing};
use crate::layers::attn_res::{AttnRes, LayerRes};
use crate::layers::ffn::{Act, FfnWeights};
use crate::layers::mla::{MlaDims, MlaWeights};
use crate::layers::moe::{Gating, MoeDims, MoeWeights};
use crate::weights::Loader;
use xwen_gguf::GgufFile;

/// The geometry of a kimi-linear file.
pub fn config(f: &GgufFile) -> Result<Config> {
    let arch = f.architecture().unwrap_or("kimi-linear").to_string();
    let k = |s: &str| format!("{arch}.{s}");
    let n_layer = req_u(f, &k("block_count"))?;
    let hidden = req_u(f, &k("embedding_length"))?;
    let eps = f.get_f32(&k("attention.layer_norm_rms_epsilon")).ok_or_else(|| EngineError::MissingKey(k("attention.layer_norm_rms_epsilon")))?;
    let n_head = req_u(f, &k("attention.head_count"))?;
    // head_count_kv per layer: 0 marks a KDA (recurrent) layer, as llama.cpp reads it
    let kv_heads: Vec<usize> = match f.get_array(&k("attention.head_count_kv")) {
        Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(0) as usize).collect(),
        None => vec![req_u(f, &k("attention.head_count_kv"))?; n_layer],
    };
    if kv_heads.len() < n_layer {
        return Err(EngineError::BadHparams(format!("head_count_kv has {} entries for {n_layer} layers", kv_heads.len())));
    }
    let recurrent: Vec<bool> = kv_heads[..n_layer].iter().map(|&h| h == 0).collect();
    let kda_head = req_u(f, &k("kda.head_dim"))?;
    let conv_kernel = req_u(f, &k("ssm.conv_kernel"))?;
    let delta = DeltaDims {
        n_k_heads: n_head,
        n_v_heads: n_head,
        head_dim: kda_head,
        conv_kernel,
        eps,
        pairing: HeadPairing::Tiled,
        variant: DeltaVariant::Kda,
        gate_lower_bound: None,
    };
    let kv_lora = req_u(f, &k("attention.kv_lora_rank"))?;
    let rope = req_u(f, &k("rope.dimension_count"))?;
    let k_mla = req_u(f, &k("attention.key_length_mla"))?;
    let v_mla = req_u(f, &k("attention.value_length_mla"))?;
    let q_lora = f.get_u64(&k("attention.q_lora_rank")).unwrap_or(0) as usize;
    let nope = k_mla.checked_sub(rope).ok_or_else(|| EngineError::BadHparams(format!("key_length_mla {k_mla} < rope dims {rope}")))?;
    let mla = MlaDims { n_head, kv_lora, nope, rope, v_head: v_mla, eps, q_lora };
    if n_head == 0 || kda_head == 0 || conv_kernel < 1 || kv_lora == 0 || v_mla == 0 {
        return Err(EngineError::BadHparams(format!("kimi-linear geometry: {n_head} heads, KDA head {kda_head}, kernel {conv_kernel}, kv rank {kv_lora}")));
    }
    let emb = f.tensor("token_embd.weight").ok_or_else(|| EngineError::MissingTensor("token_embd.weight".into()))?;
    let n_vocab = *emb.dims.get(1).ok_or_else(|| EngineError::BadHparams("token_embd is 1-D".into()))? as usize;
    let n_expert = req_u(f, &k("expert_count"))?;
    let n_used = req_u(f, &k("expert_used_count"))?;
    let expert_ff = req_u_or_arr(f, &k("expert_feed_forward_length"))?;
    if n_used == 0 || n_used > n_expert {
        return Err(EngineError::BadHparams(format!("{n_used} of {n_expert} experts used")));
    }
    let gating_v = f.get_u64(&k("expert_gating_func")).unwrap_or(2);
    let gating = Gating::from_gguf(gating_v).ok_or_else(|| EngineError::BadHparams(format!("expert_gating_func {gating_v}")))?;
    let n_shared = f.get_u64(&k("expert_shared_count")).unwrap_or(0) as usize;
    let moe = MoeDims {
        n_expert,
        n_used,
        expert_ff,
        // llama.cpp: n_ff_exp × max(n_expert_shared, 1), the tensors optional
        shared_ff: expert_ff * n_shared.max(1),
        gating,
        w_scale: f.get_f32(&k("expert_weights_scale")).unwrap_or(0.0),
        // kimi-linear.cpp passes norm_w = true; K3 reads expert_weights_norm (kimi_k3.rs)
        norm_w: true,
        act: Act::SwiGlu,
        latent: 0,
        eps,
    };
    let attn = AttnDims { n_head, n_head_kv: 1, head_dim: k_mla, n_rot: rope, rope_base: 0.0, rope_sections: None, eps };
    let ff = f.get_u64(&k("feed_forward_length")).unwrap_or(0) as usize;
    Ok(Config {
        arch,
        n_layer,
        hidden,
        n_vocab,
        eps,
        recurrent,
        attn,
        delta,
        ff,
        moe: Some(moe),
        mla: Some(mla),
    })
}

/// The registry's loader for `kimi-linear`.
pub fn load(f: &GgufFile) -> Result<Loaded> {
    build(f, config(f)?, Act::SwiGlu, None)
}

/// The Kimi trunk's weights for `cfg`: `dense_act` is the leading dense layers' activation (the
/// MoE's is in `cfg.moe`), `res_block` K3's cross-layer residual bank interval (its score
/// vectors `blk.N.attn_res_score`, `blk.N.ffn_res_score`, `output_res_score`).
pub(super) fn build(f: &GgufFile, cfg: Config, dense_act: Act, res_block: Option<usize>) -> Result<Loaded> {
    let ld = Loader::new(f);
    let h = cfg.hidden;
    let n_dense = f.get_u64(&format!("{}.leading_dense_block_count", cfg.arch)).unwrap_or(0) as usize;
    let moe = cfg.moe.expect("kimi-linear config has MoE dims");
    let mla = cfg.mla.expect("kimi-linear config has MLA dims");
    let tok_embd = ld.mat("token_embd.weight", cfg.n_vocab, h)?;
    let output = ld.mat("output.weight", cfg.n_vocab, h)?;
    let mut layers = Vec::with_capacity(cfg.n_layer);
    let mut experts = Vec::with_capacity(cfg.n_layer);
    for il in 0..cfg.n_layer {
        let mixer = if cfg.recurrent[il] {
            Mixer::Delta(DeltaNetWeights::load_kda(&ld, il, h, &cfg.delta)?)
        } else {
            Mixer::Mla(MlaWeights::load(&ld, il, h, &mla)?)
        };
        let ffn = if il < n_dense {
            experts.push(None);
            Ffn::Dense(FfnWeights::load(&ld, il, h, cfg.ff, "")?.with_act(dense_act))
        } else {
            let (w, ex) = MoeWeights::load(&ld, il, h, &moe)?;
            experts.push(Some(ex));
            Ffn::Moe(w)
        };
        layers.push(Layer {
            attn_norm: ld.vec(&format!("blk.{il}.attn_norm.weight"), h)?,
            post_attn_norm: ld.vec(&format!("blk.{il}.ffn_norm.weight"), h)?,
            mixer,
            ffn,
            res: match res_block {
                Some(_) => Some(LayerRes {
                    attn: ld.vec(&format!("blk.{il}.attn_res_score.weight"), h)?,
                    ffn: ld.vec(&format!("blk.{il}.ffn_res_score.weight"), h)?,
                }),
                None => None,
            },
        });
    }
    let output_norm = ld.vec("output_norm.weight", h)?;
    let res = match res_block {
        Some(block) => Some(AttnRes { block, output: ld.vec("output_res_score.weight", h)? }),
        None => None,
    };
    Ok(Loaded { net: Box::new(Hybrid { cfg, tok_embd, layers, output_norm, output, res }), experts })
}
