#!/usr/bin/env python3
"""Qwen3.8-Flash-Next's (`qwen4exp`) parity fixture: a tiny random transformers 5.23 Qwen4Exp
checkpoint, converted by llama.cpp's own converter (conversion/qwen4exp.py), quantized, and run
by llama.cpp b11434 (`src/models/qwen4exp.cpp`), plus transformers' float32 logits of the same
checkpoint as the second oracle.

The geometry is the other families' skeleton (hidden 256, 4 layers, full attention at layer 3,
DeltaNet 2 K-heads / 4 V-heads of 64, attention 4 / 2 heads of 64, partial interleaved M-RoPE)
with what qwen4exp adds, each with a value that makes its absence visible:
  - hyper-connections: 4 streams, a low-rank mixer of rank 32, norms zero-centred off 0;
  - QSA on the attention layer: 2 indexer heads of 64, blocks of 4 keys, a budget of 16 tokens,
    so the 64-token prompt selects (from position 19 on) and the short ones attend densely;
  - PLE on layer 1 (a DeltaNet layer): 3-grams, 8 heads per n-gram order (16 heads of 16), prime
    head vocabularies from 1009 (the table is 16,896 rows), conv kernel 4 dilated by 3;
  - MoE: 4 experts, top-2 (as the other families' fixtures), and the sigmoid-gated shared expert.
`output_gate_type` is "sigmoid": llama.cpp hard-codes the DeltaNet output norm's gate as a
sigmoid (`build_norm_gated`) and the converter does not carry the key; transformers' default
(silu) would disagree from the first position.

  LLAMA_CPP_DIR=<sdist llama.cpp> LLAMA_CPP_BIN=<build/bin> XWEN_CACHE=<dir> \\
      python3 tools/oracle/qwen4exp.py [--out tests/fixtures/parity]

Writes <out>/cond/qwen4exp/ (the Q8_0 and Q4_K_M GGUFs, llama.cpp's logits at every position
and token by token, greedy continuations and gaps, transformers' logits, cases.txt) and records
the figures in summary.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fixture_io  # noqa: E402
import make_fixtures as mf  # noqa: E402
import models  # noqa: E402
import tokenizer as tok  # noqa: E402

SEED = 1106
QUANTS = ["q8_0", "q4_k_m"]
KINDS = ["f32"] + QUANTS


def config(eos: int) -> dict:
    return {
        "vocab_size": mf.VOCAB, "hidden_size": models.HIDDEN, "num_hidden_layers": models.N_LAYERS,
        "layer_types": list(models.LAYER_TYPES), "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "initializer_range": 0.02, "attention_bias": False,
        "bos_token_id": None, "eos_token_id": eos, "pad_token_id": eos,
        "rope_parameters": dict(models.ROPE), **models.ATTN, **models.DELTANET,
        "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256,
        "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True,
        "router_aux_loss_coef": 0.001, "tie_word_embeddings": False,
        "hc_count": 4, "hc_lowrank": 32,
        "ple_layer_ids": [2], "ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 8,
        "ngram_vocab_size_base": 1000, "make_ngram_vocab_size_divisible_by": 128, "seed": 1234,
        "split_ngram_parts": 2,
        "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 64,
        "indexer_budget": 16, "indexer_compress_ratio": 4,
        "output_gate_type": "sigmoid",
        "architectures": ["Qwen4ExpForCausalLM"], "model_type": "qwen4_exp_text",
    }


def build(eos: int):
    import torch
    import transformers as tf

    cfg_dict = config(eos)
    conf = tf.Qwen4ExpTextConfig(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type")})
    conf.architectures = cfg_dict["architectures"]
    torch.manual_seed(SEED)
    model = tf.Qwen4ExpForCausalLM(conf).to(torch.float32).eval()
    params = dict(models.SETS["cond"], tied=False)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "ngram_embedding" in name:
                # the n-gram rows are embeddings (N(0, 1), like token_embd), not a matrix
                p.copy_(torch.randn(tuple(p.shape), generator=g))
            else:
                p.copy_(models.init_tensor(name, p, params, g))
    return model, cfg_dict


def save_hf(model, cfg: dict, hf_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    model.save_pretrained(str(hf_dir), max_shard_size="10GB")
    st = sorted(hf_dir.glob("*.safetensors"))
    tensors = {}
    for f in st:
        tensors.update(load_file(str(f)))
        f.unlink()
    for f in hf_dir.glob("*.safetensors.index.json"):
        f.unlink()
    # the PLE hash constants are buffers, which save_pretrained leaves out; the converter reads
    # them from the checkpoint as the release ships them
    for name, b in model.named_buffers():
        if "ple_embedding." in name:
            tensors[name] = b
    save_file({k: (v.contiguous() if v.dtype == torch.int64 else v.contiguous().to(torch.float32))
               for k, v in tensors.items()}, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    conf = json.loads((hf_dir / "config.json").read_text())
    conf.update({k: cfg[k] for k in ("architectures", "model_type")})
    # transformers renames the QSA layers "indexed_attention"; the release (and so the converter,
    # which sets a compress ratio only where it reads "full_attention") says "full_attention"
    conf["layer_types"] = list(cfg["layer_types"])
    (hf_dir / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(mf.TOKENIZER_DIR / f, hf_dir / f)


def hf_logits(model, prompts) -> list[np.ndarray]:
    import torch

    out = []
    with torch.no_grad():
        for _, ids in prompts:
            r = model(torch.tensor([ids]), use_cache=False)
            out.append(r.logits[0].float().numpy())
    return out


def write_index(path: Path, prompts, res: dict, kinds: list[str]) -> None:
    lines = ["# parity fixture; generated by tools/oracle/qwen4exp.py, do not edit",
             "set cond", "arch qwen4exp", "gguf_arch qwen4exp", f"n_gen {mf.N_GEN}"]
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(mf.REPO / "tests" / "fixtures" / "parity"))
    ap.add_argument("--convert-only", action="store_true", help="stop after the f32 GGUF")
    args = ap.parse_args()
    root = mf.llama_cpp_dir()
    out_root = Path(args.out)
    work = mf.cache_dir() / "oracle" / "cond" / "qwen4exp"
    work.mkdir(parents=True, exist_ok=True)
    prompts = mf.make_prompts(mf.TOKENIZER_DIR / "tokenizer.json")

    eos = tok.special_id(mf.VOCAB, "<|endoftext|>")
    model, cfg = build(eos)
    hf = work / "hf"
    save_hf(model, cfg, hf)
    ggufs = {"f32": work / "model-f32.gguf"}
    env = dict(os.environ, LLAMA_CPP_DIR=str(root), PYTHONPATH=str(root / "gguf-py"))
    r = subprocess.run([sys.executable, str(HERE / "convert.py"), "--force-pre", "qwen35", "--outtype", "f32",
                        "--no-mtp", "--outfile", str(ggufs["f32"]), str(hf)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"convert failed:\n{r.stderr[-6000:]}")
    hf_out = hf_logits(model, prompts)
    for i, a in enumerate(hf_out):
        np.save(work / f"hf.p{i}.npy", a.astype(np.float32))
    if args.convert_only:
        mf.log(f"converted: {ggufs['f32']}")
        return

    binp = mf.llama_bin(root, True)
    for q in QUANTS:
        ggufs[q] = work / f"model-{q}.gguf"
        mf.quantize(binp, ggufs["f32"], ggufs[q], q)
    res = {"greedy": {}, "gap": {}}
    for kind, path in ggufs.items():
        res["greedy"][kind], res["gap"][kind] = mf.run_llama(binp, path, prompts, work / f"llama-{kind}")
        mf.log(f"   {kind}: greedy of prompt 0 {res['greedy'][kind][0][:8]} ...")
    f32 = [np.load(f"{work}/llama-f32.p{i}.npy") for i in range(len(prompts))]
    vs_f32 = {kind: mf.compare([np.load(f"{work}/llama-{kind}.p{i}.npy") for i in range(len(prompts))], f32)
              for kind in QUANTS}
    hf_vs_llama = mf.compare(f32, hf_out)
    # per position, so the point where QSA's selections part is visible
    import hf_run

    hf_rows = [hf_run.rel_l2_rows(a, b).tolist() for a, b in zip(f32, hf_out)]

    odir = out_root / "cond" / "qwen4exp"
    if odir.exists():
        shutil.rmtree(odir)
    odir.mkdir(parents=True)
    # the f32 file (26 MB, the routed experts' bulk) stays in the work folder, as the other MoE
    # families' do; its figures are in summary.json
    for kind in QUANTS:
        shutil.copy(ggufs[kind], odir / ggufs[kind].name)
        for i in range(len(prompts)):
            shutil.copy(f"{work}/llama-{kind}.p{i}.npy", odir / f"llama-{kind}.p{i}.npy")
    for i in range(len(prompts)):
        shutil.copy(work / f"hf.p{i}.npy", odir / f"hf.p{i}.npy")
    write_index(odir / "cases.txt", prompts, res, QUANTS)
    import decode_ref

    decode_ref.process(str(binp["logits"]), odir, work, decode_ref.MAX_BYTES)

    summary_path = out_root / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"models": {}}
    summary.setdefault("models", {})["cond/qwen4exp"] = {
        "seed": SEED, "config": cfg, "set": "cond", "arch": "qwen4exp", "geometry": None,
        "n_params_hf": int(sum(p.numel() for p in model.parameters())),
        "gguf_bytes": {k: v.stat().st_size for k, v in ggufs.items()},
        "greedy": {f"llama-{k}": v for k, v in res["greedy"].items()},
        "gap": {f"llama-{k}": v for k, v in res["gap"].items()},
        "quantized_vs_llama_f32": vs_f32,
        "hf_vs_llama_f32": hf_vs_llama,
        "hf_vs_llama_f32_rows": hf_rows,
    }
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    fixture_io.write_manifest(out_root, summary)
    mf.log("done")


if __name__ == "__main__":
    main()
