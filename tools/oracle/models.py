"""Tiny random-weight models, structurally faithful to the real checkpoints.

Every architecture keeps what distinguishes the real config: both mixer kinds (full attention
at every 4th layer), DeltaNet V-heads a multiple (2x) of K-heads so the V-head pairing order the
converter rewrites is observable, partial rotary with interleaved MRoPE sections, an MTP block
where the real config has one, and every matrix row length a multiple of 256 so llama-quantize
can use k-quants everywhere (no fallback types).

Weights are set by name after construction (not by transformers' _init_weights) so a set is a
pure function of (arch, fixture set, seed). Norm weights, A_log and dt_bias are moved well off
their defaults: zero-centred (1 + w) norms get w in [-0.5, 1.0], plain norms [0.5, 2.0], so a
missing or doubled +1, a missing -exp(A_log) or a dropped dt bias changes logits by O(1).
"""
from __future__ import annotations

import math

import torch

HIDDEN = 256
N_LAYERS = 4  # layers 0-2 linear attention, layer 3 full attention ((i + 1) % 4 == 0)
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]

ROPE = {
    "rope_type": "default",
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,  # 16 of 64 head dims rotated
    "mrope_section": [3, 3, 2],
    "mrope_interleaved": True,
}

DELTANET = {
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,  # 2 V-heads per K-head: grouped vs tiled order differs
}

ATTN = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}

# Fixture sets. `matrix_gain` scales every weight matrix to N(0, gain / sqrt(fan_in)), so a
# linear map keeps the rms of its input times `gain`; `embed_std` and `lm_gain` set the
# residual stream's starting scale and the logit scale. "rand" is transformers' own default
# (N(0, initializer_range = 0.02) everywhere); "cond" is the well-conditioned set.
# Only "rand" carries the MTP block: one committed file with a nextn layer is enough for a
# loader test, and the block costs ~25% of a model's bytes.
SETS = {
    "rand": {"matrix_std": 0.02, "embed_std": 0.02, "lm_std": 0.02, "conv_std": 0.3, "mtp": True},
    "cond": {"matrix_gain": 0.35, "embed_std": 1.0, "lm_gain": 3.0, "conv_std": 0.3, "mtp": False},
}


def arch_config(arch: str, vocab: int, eos: int, mtp: bool) -> dict:
    common = {
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "num_hidden_layers": N_LAYERS,
        "layer_types": LAYER_TYPES,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "attention_bias": False,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "rope_parameters": dict(ROPE),
        "partial_rotary_factor": 0.25,
        **ATTN,
        **DELTANET,
    }
    if arch == "qwen3_5":
        return {
            **common,
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "intermediate_size": 256,
            "tie_word_embeddings": False,  # as Qwen3.5-27B (the trained tiny model covers tied)
            "mtp_num_hidden_layers": 1 if mtp else 0,
        }
    if arch == "qwen3_5_moe":
        return {
            **common,
            "architectures": ["Qwen3_5MoeForCausalLM"],
            "model_type": "qwen3_5_moe_text",
            "moe_intermediate_size": 256,
            "shared_expert_intermediate_size": 256,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "router_aux_loss_coef": 0.001,
            "tie_word_embeddings": False,
            "mtp_num_hidden_layers": 1 if mtp else 0,
        }
    if arch == "qwen3_next":
        # Qwen3-Next: same hybrid trunk, plain (not multimodal) partial rope, fused in_proj_qkvz /
        # in_proj_ba in the HF layout, every layer MoE with a gated shared expert
        rope = {k: v for k, v in ROPE.items() if not k.startswith("mrope")}
        return {
            **common,
            "rope_parameters": rope,
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "intermediate_size": 256,
            "moe_intermediate_size": 256,
            "shared_expert_intermediate_size": 256,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "router_aux_loss_coef": 0.001,
            "tie_word_embeddings": False,
            "mtp_num_hidden_layers": 1 if mtp else 0,
        }
    if arch == "kimi_linear":
        # Kimi-Linear: KDA (per-channel gated delta rule, separate q/k/v short convs) in layers
        # 0-2, MLA (kv_lora_rank, decoupled rope dims) at layer 3, first layer dense then MoE
        # with sigmoid router + score-correction bias, one shared expert, routed scale 2.446.
        # Plain RMSNorms (multiplier default 1), eps 1e-5.
        return {
            "vocab_size": vocab, "hidden_size": HIDDEN, "num_hidden_layers": N_LAYERS,
            "layer_types": LAYER_TYPES, "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
            "hidden_act": "silu", "rms_norm_eps": 1e-5, "initializer_range": 0.02,
            "bos_token_id": None, "eos_token_id": eos, "pad_token_id": eos,
            "intermediate_size": 256, "moe_intermediate_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 4,
            "kv_lora_rank": 256, "q_lora_rank": None, "qk_rope_head_dim": 32,
            "qk_nope_head_dim": 64, "v_head_dim": 64,
            "linear_head_dim": 64, "linear_num_heads": 4, "linear_conv_kernel_dim": 4,
            "num_local_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "routed_scaling_factor": 2.446, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
            "tie_word_embeddings": False,
            "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
        }
    raise ValueError(f"unknown arch {arch}")


def checkpoint_fixups(arch: str, conf: dict, tensors: dict) -> tuple[dict, dict]:
    """Make transformers' save look like the released checkpoint the converter was written for.
    Kimi-Linear: transformers writes its native config keys, the converter reads the original
    `linear_attn_config` block; and the native-to-original weight renaming also moves the dense
    first layer's MLP under `block_sparse_moe`, where the original has it under `mlp`."""
    if arch != "kimi_linear":
        return conf, tensors
    import re

    full = [i + 1 for i, t in enumerate(conf["layer_types"]) if t == "full_attention"]
    kda = [i + 1 for i, t in enumerate(conf["layer_types"]) if t != "full_attention"]
    conf = dict(conf)
    conf.update({
        "linear_attn_config": {"full_attn_layers": full, "kda_layers": kda,
                               "head_dim": conf["linear_head_dim"], "num_heads": conf["linear_num_heads"],
                               "short_conv_kernel_size": conf["linear_conv_kernel_dim"]},
        "first_k_dense_replace": conf["mlp_layer_types"].count("dense"),
        "num_experts_per_tok": conf["num_experts_per_token"],
        "num_local_experts": conf["num_experts"],
        "moe_router_activation_func": "sigmoid",
        "norm_topk_prob": conf["moe_renormalize"],
    })
    tensors = {re.sub(r"\.block_sparse_moe\.(gate_proj|up_proj|down_proj)\.", r".mlp.\1.", k): v
               for k, v in tensors.items()}
    return conf, tensors


def hf_classes(arch: str):
    import transformers as tf

    if arch == "qwen3_5":
        return tf.Qwen3_5TextConfig, tf.Qwen3_5ForCausalLM
    if arch == "qwen3_5_moe":
        return tf.Qwen3_5MoeTextConfig, tf.Qwen3_5MoeForCausalLM
    if arch == "qwen3_next":
        return tf.Qwen3NextConfig, tf.Qwen3NextForCausalLM
    if arch == "kimi_linear":
        return tf.KimiLinearConfig, tf.KimiLinearForCausalLM
    raise ValueError(arch)


def _fan_in(name: str, shape: tuple[int, ...]) -> int:
    # nn.Linear and fused expert tensors store [.., out, in]
    return shape[-1]


def init_tensor(name: str, t: torch.Tensor, params: dict, g: torch.Generator) -> torch.Tensor:
    """The value of one parameter, by name; `t` gives shape and dtype only."""
    shape = tuple(t.shape)
    u = lambda lo, hi: torch.rand(shape, generator=g) * (hi - lo) + lo  # noqa: E731
    n = lambda std: torch.randn(shape, generator=g) * std  # noqa: E731
    if name.endswith("A_log"):
        return u(-1.0, 1.5)  # A = exp(A_log) in [0.37, 4.5]; default is log U(0.01, 16)
    if name.endswith("dt_bias"):
        return u(-2.0, 2.0)  # default is all ones
    if name.endswith("e_score_correction_bias"):
        return u(-0.5, 0.5)  # router selection bias, default zeros
    if name.endswith("linear_attn.norm.weight") or (params.get("plain_norms") and "norm" in name):
        return u(0.5, 2.0)  # plain-multiplier RMSNorm, default ones
    if "norm" in name and len(shape) == 1:
        return u(-0.5, 1.0)  # zero-centred (1 + w) RMSNorm, default zeros
    if "conv1d" in name:
        return n(params["conv_std"])
    if name.endswith("embed_tokens.weight"):
        if params.get("tied") and "lm_gain" in params:
            # one matrix is both: its scale is set by the logits it must produce
            return n(params["lm_gain"] / math.sqrt(shape[-1]))
        return n(params["embed_std"])
    if name.endswith("lm_head.weight"):
        if "lm_std" in params:
            return n(params["lm_std"])
        return n(params["lm_gain"] / math.sqrt(shape[-1]))
    if len(shape) >= 2:
        if "matrix_std" in params:
            return n(params["matrix_std"])
        return n(params["matrix_gain"] / math.sqrt(_fan_in(name, shape)))
    raise ValueError(f"no init rule for {name} {shape}")


# Geometries beyond the default one (make_fixtures.py --geometries; fixtures in
# tests/fixtures/parity/geom/<name>/): the real checkpoints' shapes the default tiny models do
# not have — DeltaNet head dims 128 and 32, K:V head ratios 3, attention head dim 256 with rope
# over 64, tied embeddings (quantized token_embd), FFN and expert widths that are not multiples
# of 256 (k-quant fallbacks), rms eps 1e-5, more layers than one attention period.
def _layers(pattern: str) -> list[str]:
    return ["full_attention" if c == "A" else "linear_attention" for c in pattern]


GEOMETRIES = {
    "dense-hd128-kv3-tied": ("qwen3_5", {
        "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 1, "linear_num_value_heads": 3,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 256,
        "rope_parameters": {**ROPE, "mrope_section": [11, 11, 10]},
        "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "intermediate_size": 384,
        "num_hidden_layers": 8, "layer_types": _layers("DDDADDDA"), "mtp_num_hidden_layers": 0,
    }),
    "moe-hd32-kv3-e192": ("qwen3_5_moe", {
        "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "linear_num_key_heads": 2, "linear_num_value_heads": 6,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "moe_intermediate_size": 192, "shared_expert_intermediate_size": 128,
        "num_experts": 8, "num_experts_per_tok": 3,
        "num_hidden_layers": 5, "layer_types": _layers("DDDAD"), "mtp_num_hidden_layers": 0,
    }),
}


def build(arch: str, set_name: str, seed: int, vocab: int, eos: int, overrides: dict | None = None):
    """Returns (hf_model in float32 eval mode, config dict, the generator for later draws)."""
    cfg_cls, model_cls = hf_classes(arch)
    cfg_dict = arch_config(arch, vocab, eos, SETS[set_name]["mtp"])
    cfg_dict.update(overrides or {})
    config = cfg_cls(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type")})
    config.architectures = cfg_dict["architectures"]
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    params = dict(SETS[set_name], tied=bool(config.tie_word_embeddings),
                  plain_norms=(arch == "kimi_linear"))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.copy_(init_tensor(name, p, params, g))
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(init_tensor(name, b, params, g))
        if config.tie_word_embeddings:
            model.tie_weights()
    return model, cfg_dict, g


def mtp_tensors(saved: dict[str, torch.Tensor], cfg: dict, set_name: str,
                g: torch.Generator) -> dict[str, torch.Tensor]:
    """An MTP block as the real checkpoints ship it (transformers drops mtp.* on load, so it is
    written next to the saved tensors, in the on-disk naming): a full-attention decoder layer
    plus fc and norms. It is never on the main forward path; it is there so a loader meets a
    file that has one."""
    params = SETS[set_name]
    full = next(i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
    out = {}
    for name, p in sorted(saved.items()):
        prefix = f"model.layers.{full}."
        if name.startswith(prefix):
            sub = name[len(prefix):]
            out[f"mtp.layers.0.{sub}"] = init_tensor(f"mtp.layers.0.{sub}", p, params, g).contiguous()
    h = cfg["hidden_size"]
    out["mtp.fc.weight"] = init_tensor("mtp.fc.weight", torch.empty(h, 2 * h), params, g)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}.weight"] = init_tensor(f"mtp.{n}.weight", torch.empty(h), params, g)
    return out
