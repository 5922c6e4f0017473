#!/usr/bin/env python3
"""Kimi K3's parity fixture: a tiny random checkpoint in the released layout, converted by
llama.cpp's own converter (conversion/kimi_k3.py), quantized, and run by llama.cpp.

transformers has no Kimi K3 class (the release ships remote code), so unlike make_fixtures.py
there is no transformers reference: the checkpoint is written tensor by tensor in the names the
converter reads, and llama.cpp b11434 (`src/models/kimi-k3.cpp`) is the one oracle. The
geometry keeps every part K3 adds to Kimi-Linear, each with a value that makes its absence
visible:
  - cross-layer residual attention with a block size of 2 over 4 layers (banks at layers 0 and
    2, so both the "restart from the mixer output" and the carried residual run), the fused
    `*_res_norm * *_res_proj` score vectors scaled so the checkpoint softmax is far from uniform;
  - a latent MoE: routed experts at width 128 inside a 256-wide model (`routed_expert_down/up`,
    `routed_expert_norm`), the router and the shared expert on the full width;
  - situ with beta 0.5 and linear beta 2.0 (both branches non-linear, and swapped values differ);
  - the MLA output gate (`g_proj` on an MLA layer) and a compressed q (q_lora_rank 128);
  - the full-rank KDA gate (`g_proj` on a KDA layer) and the sigmoid forget gate of
    `gate_lower_bound` -5;
  - unrenormalized sigmoid routing (`moe_renormalize` false) with a routed scale of 2.5.
Row lengths of 128 make llama-quantize fall back from k-quants on those tensors (Q5_0 etc.), so
the Q4_K_M file mixes types as real conversions of odd widths do.

  LLAMA_CPP_DIR=<sdist llama.cpp> LLAMA_CPP_BIN=<build/bin> XWEN_CACHE=<dir> \\
      python3 tools/oracle/kimi_k3.py [--out tests/fixtures/parity]

Writes <out>/cond/kimi_k3/ (Q8_0 and Q4_K_M GGUFs, llama.cpp's logits, greedy continuations and
gaps, cases.txt) and records the f32 file's figures in summary.json. Run it through
tools/oracle/arch_refs.sh (ARCH=kimi_k3) on the device machine.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fixture_io  # noqa: E402
import make_fixtures as mf  # noqa: E402
import tokenizer as tok  # noqa: E402

SEED = 1105
H, VOCAB, N_LAYERS = 256, mf.VOCAB, 4
N_HEAD, KDA_HEAD, CONV = 4, 64, 4
Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD = 128, 256, 32, 64, 64
N_EXPERT, N_USED, EXPERT_FF, LATENT, N_SHARED, DENSE_FF = 4, 2, 128, 128, 1, 256
FULL_ATTN = [4]  # 1-indexed, as the released config: layers 0-2 KDA, layer 3 MLA
QUANTS = ["q8_0", "q4_k_m"]


def config(eos: int) -> dict:
    return {
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",  # unknown to transformers: the converter reads config.json as is
        "vocab_size": VOCAB, "hidden_size": H, "num_hidden_layers": N_LAYERS,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD,
        "intermediate_size": DENSE_FF, "moe_intermediate_size": EXPERT_FF,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "bos_token_id": None, "eos_token_id": eos, "pad_token_id": eos,
        "hidden_act": "situ", "activation_situ_beta": 0.5, "activation_situ_linear_beta": 2.0,
        "q_lora_rank": Q_LORA, "kv_lora_rank": KV_LORA, "qk_rope_head_dim": ROPE,
        "qk_nope_head_dim": NOPE, "v_head_dim": V_HEAD, "mla_use_nope": True,
        "linear_attn_config": {"full_attn_layers": FULL_ATTN,
                               "kda_layers": [i + 1 for i in range(N_LAYERS) if i + 1 not in FULL_ATTN],
                               "head_dim": KDA_HEAD, "num_heads": N_HEAD,
                               "short_conv_kernel_size": CONV, "gate_lower_bound": -5.0},
        "num_experts": N_EXPERT, "num_experts_per_tok": N_USED, "num_shared_experts": N_SHARED,
        "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "moe_renormalize": False,
        "moe_router_activation_func": "sigmoid", "routed_expert_hidden_size": LATENT,
        "attn_res_block_size": 2,
    }


def tensors(g) -> dict:
    """Every tensor of the checkpoint by its released name (torch layout: [out, in])."""
    import torch

    n = lambda shape, std: torch.randn(shape, generator=g) * std  # noqa: E731
    u = lambda shape, lo, hi: torch.rand(shape, generator=g) * (hi - lo) + lo  # noqa: E731
    mat = lambda o, i: n((o, i), 0.35 / math.sqrt(i))  # noqa: E731  the "cond" set's gain
    norm = lambda d: u((d,), 0.5, 2.0)  # noqa: E731  plain-multiplier RMSNorms
    inner = N_HEAD * KDA_HEAD
    p = "language_model.model."
    t = {
        p + "embed_tokens.weight": n((VOCAB, H), 1.0),
        "language_model.lm_head.weight": n((VOCAB, H), 3.0 / math.sqrt(H)),
        p + "norm.weight": norm(H),
    }

    def res(prefix: str):
        # fused by the converter into one score vector; ~3/sqrt(H) so the scores are O(1-3)
        t[prefix + "_norm.weight"] = norm(H)
        t[prefix + "_proj.weight"] = n((1, H), 2.0 / math.sqrt(H))

    res(p + "output_attn_res")
    for il in range(N_LAYERS):
        q = f"{p}layers.{il}."
        t[q + "input_layernorm.weight"] = norm(H)
        t[q + "post_attention_layernorm.weight"] = norm(H)
        res(q + "self_attention_res")
        res(q + "mlp_res")
        a = q + "self_attn."
        if il + 1 in FULL_ATTN:
            t[a + "q_a_proj.weight"] = mat(Q_LORA, H)
            t[a + "q_a_layernorm.weight"] = norm(Q_LORA)
            t[a + "q_b_proj.weight"] = mat(N_HEAD * (NOPE + ROPE), Q_LORA)
            t[a + "kv_a_proj_with_mqa.weight"] = mat(KV_LORA + ROPE, H)
            t[a + "kv_a_layernorm.weight"] = norm(KV_LORA)
            t[a + "kv_b_proj.weight"] = mat(N_HEAD * (NOPE + V_HEAD), KV_LORA)
            t[a + "g_proj.weight"] = mat(N_HEAD * V_HEAD, H)
            t[a + "o_proj.weight"] = mat(H, N_HEAD * V_HEAD)
        else:
            for s in "qkv":
                t[a + f"{s}_proj.weight"] = mat(inner, H)
                t[a + f"{s}_conv1d.weight"] = n((inner, 1, CONV), 0.3)
            t[a + "f_a_proj.weight"] = mat(KDA_HEAD, H)
            t[a + "f_b_proj.weight"] = mat(inner, KDA_HEAD)
            t[a + "b_proj.weight"] = mat(N_HEAD, H)
            t[a + "A_log"] = u((N_HEAD,), -1.0, 1.5)
            t[a + "dt_bias"] = u((inner,), -2.0, 2.0)
            t[a + "g_proj.weight"] = mat(inner, H)
            t[a + "o_norm.weight"] = norm(KDA_HEAD)
            t[a + "o_proj.weight"] = mat(H, inner)
        if il == 0:
            m = q + "mlp."
            t[m + "gate_proj.weight"] = mat(DENSE_FF, H)
            t[m + "up_proj.weight"] = mat(DENSE_FF, H)
            t[m + "down_proj.weight"] = mat(H, DENSE_FF)
        else:
            m = q + "block_sparse_moe."
            t[m + "gate.weight"] = mat(N_EXPERT, H)
            t[m + "gate.e_score_correction_bias"] = u((N_EXPERT,), -0.5, 0.5)
            for e in range(N_EXPERT):
                t[m + f"experts.{e}.w1.weight"] = mat(EXPERT_FF, LATENT)
                t[m + f"experts.{e}.w3.weight"] = mat(EXPERT_FF, LATENT)
                t[m + f"experts.{e}.w2.weight"] = mat(LATENT, EXPERT_FF)
            t[m + "routed_expert_down_proj.weight"] = mat(LATENT, H)
            t[m + "routed_expert_up_proj.weight"] = mat(H, LATENT)
            t[m + "routed_expert_norm.weight"] = norm(LATENT)
            sff = EXPERT_FF * N_SHARED
            t[m + "shared_experts.gate_proj.weight"] = mat(sff, H)
            t[m + "shared_experts.up_proj.weight"] = mat(sff, H)
            t[m + "shared_experts.down_proj.weight"] = mat(H, sff)
    return {k: v.contiguous().float() for k, v in t.items()}


def write_index(path: Path, prompts, res: dict, kinds: list[str]) -> None:
    lines = ["# parity fixture; generated by tools/oracle/kimi_k3.py, do not edit",
             "set cond", "arch kimi_k3", "gguf_arch kimi-k3", f"n_gen {mf.N_GEN}"]
    for i, (name, ids) in enumerate(prompts):
        lines.append(f"prompt {i} {name} " + " ".join(map(str, ids)))
    for kind in kinds:
        lines.append(f"case {kind} model-{kind}.gguf {fixture_io.tolerance(kind, 1.0):.3g}")
        for i in range(len(prompts)):
            lines.append(f"logits llama-{kind} {i} llama-{kind}.p{i}.npy")
            lines.append(f"greedy llama-{kind} {i} " + " ".join(map(str, res["greedy"][kind][i])))
            lines.append(f"gap llama-{kind} {i} " + " ".join(f"{x:.6g}" for x in res["gap"][kind][i]))
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    import torch
    from safetensors.torch import save_file

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(mf.REPO / "tests" / "fixtures" / "parity"))
    args = ap.parse_args()
    root = mf.llama_cpp_dir()
    binp = mf.llama_bin(root, True)
    out_root = Path(args.out)
    work = mf.cache_dir() / "oracle" / "cond" / "kimi_k3"
    work.mkdir(parents=True, exist_ok=True)
    prompts = mf.make_prompts(mf.TOKENIZER_DIR / "tokenizer.json")

    eos = tok.special_id(VOCAB, "<|endoftext|>")
    hf = work / "hf"
    if hf.exists():
        shutil.rmtree(hf)
    hf.mkdir(parents=True)
    g = torch.Generator().manual_seed(SEED)
    ts = tensors(g)
    save_file(ts, str(hf / "model.safetensors"), metadata={"format": "pt"})
    cfg = config(eos)
    (hf / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    shutil.copy(mf.TOKENIZER_DIR / "tokenizer.json", hf / "tokenizer.json")
    # without the fixture tokenizer's (Qwen) template, so the converter embeds Kimi-K3.jinja as
    # it does for the release, which ships none
    tc = json.loads((mf.TOKENIZER_DIR / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (hf / "tokenizer_config.json").write_text(json.dumps(tc, indent=1) + "\n")

    ggufs = {"f32": work / "model-f32.gguf"}
    env = dict(__import__("os").environ, LLAMA_CPP_DIR=str(root), PYTHONPATH=str(root / "gguf-py"))
    r = subprocess.run([sys.executable, str(HERE / "convert.py"), "--force-pre", "qwen35", "--outtype", "f32",
                        "--outfile", str(ggufs["f32"]), str(hf)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"convert failed:\n{r.stderr[-6000:]}")
    for q in QUANTS:
        ggufs[q] = work / f"model-{q}.gguf"
        mf.quantize(binp, ggufs["f32"], ggufs[q], q)

    res = {"greedy": {}, "gap": {}}
    for kind, path in ggufs.items():
        res["greedy"][kind], res["gap"][kind] = mf.run_llama(binp, path, prompts, work / f"llama-{kind}")
        mf.log(f"   {kind}: greedy of prompt 0 {res['greedy'][kind][0][:8]} ...")
    # quantized tiers against the f32 file (how far quantization moves this model; not a test)
    f32 = [np.load(f"{work}/llama-f32.p{i}.npy") for i in range(len(prompts))]
    vs_f32 = {}
    for kind in QUANTS:
        ql = [np.load(f"{work}/llama-{kind}.p{i}.npy") for i in range(len(prompts))]
        vs_f32[kind] = mf.compare(ql, f32)

    odir = out_root / "cond" / "kimi_k3"
    if odir.exists():
        shutil.rmtree(odir)
    odir.mkdir(parents=True)
    for kind in QUANTS:
        shutil.copy(ggufs[kind], odir / ggufs[kind].name)
        for i in range(len(prompts)):
            shutil.copy(f"{work}/llama-{kind}.p{i}.npy", odir / f"llama-{kind}.p{i}.npy")
    write_index(odir / "cases.txt", prompts, res, QUANTS)
    import decode_ref

    decode_ref.process(str(binp["logits"]), odir, work, decode_ref.MAX_BYTES)

    summary_path = out_root / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"models": {}}
    summary.setdefault("models", {})["cond/kimi_k3"] = {
        "seed": SEED, "config": cfg, "set": "cond", "arch": "kimi_k3", "geometry": None,
        "n_params_hf": int(sum(v.numel() for v in ts.values())),
        "gguf_bytes": {k: v.stat().st_size for k, v in ggufs.items()},
        "greedy": {f"llama-{k}": v for k, v in res["greedy"].items()},
        "gap": {f"llama-{k}": v for k, v in res["gap"].items()},
        "quantized_vs_llama_f32": vs_f32,
        "oracle": "llama.cpp only (transformers has no Kimi K3 class)",
    }
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    fixture_io.write_manifest(out_root, summary)
    mf.log("done")


if __name__ == "__main__":
    main()
