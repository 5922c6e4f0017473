#!/usr/bin/env python3
"""The qwen4exp MTP head's fixture (tests/fixtures/mtp/cond-qwen4exp): an MTP block added to the
transformers checkpoint of cond/qwen4exp (tools/oracle/qwen4exp.py), as the release ships one —
transformers 5.23 drops `mtp.*` on load and never runs it, so the block exists only on disk, in
its on-disk names — converted by llama.cpp's own converter with `--mtp` into a sidecar
(conversion/qwen4exp.py: `fc_embedding`/`fc_hidden` joined into eh_proj, the hyper-connection
head mixer as `nextn.hc_head_*`), quantized to Q8_0 and run by llama.cpp b11434 beside the
committed trunk (`tools/oracle/llama_mtp`): the trunk's hc-wide hidden rows, the head over each
prompt, and a 4-step greedy draft chain.

The block is a QSA full-attention layer with its own hyper-connection mixers and MoE (the
trunk's layer 3 names, fresh random values of the `cond` set), plus:
  mtp.fc_embedding [h, h], mtp.fc_hidden [h, h]           eh_proj = [fc_embedding | fc_hidden]
  mtp.pre_fc_norm_embedding [h], mtp.pre_fc_norm_hidden [hc*h]   (zero-centred, 1 + w)
  mtp.hyper_connection_mixer.{hc_norm, input_mix_weight_down, input_mix_weight_up}  the head's mixer

  LLAMA_CPP_DIR=<sdist llama.cpp> LLAMA_CPP_BIN=<build/bin> XWEN_CACHE=<dir> \\
      python3 tools/oracle/qwen4exp_mtp.py --llama-mtp <tools/oracle/llama_mtp binary>
It needs the work folder qwen4exp.py leaves (its hf/ checkpoint).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_fixtures as mf  # noqa: E402
import models  # noqa: E402

SEED = 1107
FULL_LAYER = 3  # the trunk's QSA layer, whose tensor names the block copies


def mtp_tensors(saved: dict, hc: int, g) -> dict:
    import torch

    params = dict(models.SETS["cond"], tied=False)
    out = {}
    prefix = f"model.layers.{FULL_LAYER}."
    for name, p in sorted(saved.items()):
        if name.startswith(prefix):
            sub = name[len(prefix):]
            out[f"mtp.layers.0.{sub}"] = models.init_tensor(f"mtp.layers.0.{sub}", p, params, g).contiguous()
    h = saved["model.embed_tokens.weight"].shape[1]
    for n, shape in (("fc_embedding.weight", (h, h)), ("fc_hidden.weight", (h, h)),
                     ("pre_fc_norm_embedding.weight", (h,)), ("pre_fc_norm_hidden.weight", (hc * h,))):
        out[f"mtp.{n}"] = models.init_tensor(f"mtp.{n}", torch.empty(shape), params, g).contiguous()
    for n in ("hc_norm.weight", "input_mix_weight_down.weight", "input_mix_weight_up.weight"):
        src = saved[f"model.hyper_connection_mixer.{n}"]
        out[f"mtp.hyper_connection_mixer.{n}"] = models.init_tensor(f"mtp.hyper_connection_mixer.{n}", src, params, g).contiguous()
    return out


def main() -> None:
    import torch
    from safetensors.torch import load_file, save_file

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-mtp", required=True, help="tools/oracle/llama_mtp, built by build_llama_logits.sh")
    ap.add_argument("--out", default=str(mf.REPO / "tests" / "fixtures" / "mtp" / "cond-qwen4exp"))
    ap.add_argument("--full", action="store_true", help="also convert a full trunk + nextn GGUF (work folder only)")
    args = ap.parse_args()
    root = mf.llama_cpp_dir()
    work = mf.cache_dir() / "oracle" / "cond" / "qwen4exp"
    src = work / "hf"
    if not (src / "model.safetensors").exists():
        sys.exit(f"{src}: run tools/oracle/qwen4exp.py first")
    hf = work / "hf-mtp"
    if hf.exists():
        shutil.rmtree(hf)
    shutil.copytree(src, hf)
    conf = json.loads((hf / "config.json").read_text())
    saved = load_file(str(hf / "model.safetensors"))
    g = torch.Generator().manual_seed(SEED)
    saved.update(mtp_tensors(saved, conf["hc_count"], g))
    save_file(saved, str(hf / "model.safetensors"), metadata={"format": "pt"})
    conf["mtp_num_hidden_layers"] = 1
    (hf / "config.json").write_text(json.dumps(conf, indent=2) + "\n")

    env = dict(os.environ, LLAMA_CPP_DIR=str(root), PYTHONPATH=str(root / "gguf-py"))
    binp = mf.llama_bin(root, True)
    outs = {"mtp": ["--mtp"]}
    if args.full:
        outs["full"] = []
    for kind, extra in outs.items():
        f32 = work / f"{kind}-f32.gguf"
        r = subprocess.run([sys.executable, str(HERE / "convert.py"), "--force-pre", "qwen35", "--outtype", "f32", *extra,
                            "--outfile", str(f32), str(hf)], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"convert ({kind}) failed:\n{r.stderr[-6000:]}")
        mf.quantize(binp, f32, work / f"{kind}-q8_0.gguf", "q8_0")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trunk = mf.REPO / "tests" / "fixtures" / "parity" / "cond" / "qwen4exp" / "model-q8_0.gguf"
    shutil.copy(work / "mtp-q8_0.gguf", out / "mtp-q8_0.gguf")
    prompts = mf.make_prompts(mf.TOKENIZER_DIR / "tokenizer.json")
    (out / "prompts.txt").write_text("".join(" ".join(map(str, ids)) + "\n" for _, ids in prompts))
    r = subprocess.run([args.llama_mtp, str(trunk), str(out / "prompts.txt"), str(out / "p"), "--mtp", str(out / "mtp-q8_0.gguf")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"llama_mtp failed:\n{r.stderr[-4000:]}")
    (out / "drafts.txt").write_text(r.stdout)
    # llama_mtp writes OUT_PREFIX.p<i>.*: rename p.p<i> to p<i>
    for f in out.glob("p.p*.npy"):
        f.rename(out / f.name[2:])
    mf.log(f"done: {out}")


if __name__ == "__main__":
    main()
