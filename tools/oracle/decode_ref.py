#!/usr/bin/env python3
"""Single-token (decode) references for the committed parity fixtures.

llama.cpp's CPU logits depend on the batch: a prompt decoded in one ubatch takes tinyBLAS for
F32 products of 2+ tokens (attention's kqv, MoE routers), the tiled K-quant kernel for 8+
tokens, and the repacked Q4_K gemm for groups of 4, where one token at a time takes
ggml_vec_dot_f32, vec_dot and the gemv. xwen reproduces both, so its token-by-token path is
held to llama.cpp fed one token per llama_decode (`llama_logits --ubatch 1`), not to the
prefill rows.

For every `case` in every tests/fixtures/parity/*/*/cases.txt this runs llama_logits with
--ubatch 1 on each prompt and appends a line `decode_logits <src> <prompt> <file>` to
cases.txt: the prefill file when the rows are bit-identical, else a new
`<src>-ub1.p<i>.npy`. Idempotent (earlier decode_logits lines and -ub1 files are replaced).
A differing reference larger than --max-bytes (256 KiB: the trained models' 41-token prompt,
vocabulary 4096) is not committed; the suite then reports that prompt's decode check as a
SKIP. The long-context decode path stays covered by the 64-token `cond` prompts.

  LLAMA_LOGITS=<path to llama_logits> python3 tools/oracle/decode_ref.py [--fixtures DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import fixture_io  # noqa: E402


MAX_BYTES = 256 * 1024


def gguf_path(fdir: Path, ref: str) -> Path:
    if ref.startswith("@shared/"):
        return REPO.parent / "shared" / ref[len("@shared/"):]
    return fdir / ref


def run_ub1(binary: str, gguf: Path, prompts: list[list[int]], prefix: Path) -> list[np.ndarray]:
    pfile = prefix.with_suffix(".prompts.txt")
    pfile.write_text("".join(" ".join(map(str, ids)) + "\n" for ids in prompts))
    subprocess.run([binary, str(gguf), str(pfile), str(prefix), "--n-gen", "1", "--threads", "2",
                    "--ubatch", "1"], check=True, capture_output=True, text=True)
    return [np.load(f"{prefix}.p{i}.npy") for i in range(len(prompts))]


def process(binary: str, fdir: Path, work: Path, max_bytes: int) -> int:
    cases = fdir / "cases.txt"
    lines = [l for l in cases.read_text().splitlines() if not l.startswith("decode_logits ")]
    prompts: list[list[int]] = []
    tiers: list[tuple[str, str]] = []
    for l in lines:
        t = l.split()
        if t and t[0] == "prompt":
            prompts.append([int(x) for x in t[3:]])
        elif t and t[0] == "case":
            tiers.append((t[1], t[2]))
    for f in fdir.glob("*-ub1.p*.npy"):
        f.unlink()
    added = 0
    for tier, ref in tiers:
        src = f"llama-{tier}"
        gguf = gguf_path(fdir, ref)
        if not gguf.exists():
            print(f"  SKIP {fdir.name} {tier}: {gguf} missing", file=sys.stderr)
            continue
        ub1 = run_ub1(binary, gguf, prompts, work / f"{fdir.parent.name}-{fdir.name}-{tier}")
        for i, rows in enumerate(ub1):
            pre = np.load(fdir / f"{src}.p{i}.npy")
            if rows.shape != pre.shape:
                raise RuntimeError(f"{fdir} {tier} p{i}: shape {rows.shape} vs {pre.shape}")
            if np.array_equal(rows.view(np.uint32), pre.view(np.uint32)):
                name = f"{src}.p{i}.npy"
            elif rows.nbytes > max_bytes:
                print(f"  {fdir.parent.name}/{fdir.name} {tier} p{i}: differs, {rows.nbytes} bytes > --max-bytes: not committed")
                continue
            else:
                name = f"{src}-ub1.p{i}.npy"
                fixture_io.save_npy(fdir / name, rows.astype(np.float32))
                diff = int((rows != pre).any(axis=1).sum())
                print(f"  {fdir.parent.name}/{fdir.name} {tier} p{i}: {diff}/{len(rows)} rows differ from prefill")
            lines.append(f"decode_logits {src} {i} {name}")
            added += 1
    cases.write_text("\n".join(lines) + "\n")
    return added


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default=str(REPO / "tests" / "fixtures" / "parity"))
    ap.add_argument("--max-bytes", type=int, default=MAX_BYTES)
    args = ap.parse_args()
    binary = os.environ.get("LLAMA_LOGITS") or str(
        Path(os.environ.get("XWEN_CACHE", Path.home() / ".cache" / "xwen")) / "bin" / "llama_logits")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.fixtures)
        for cases in sorted(root.glob("*/*/cases.txt")):
            n = process(binary, cases.parent, Path(tmp), args.max_bytes)
            print(f"{cases.parent}: {n} decode references")
        summary = root / "summary.json"
        if summary.exists():  # keep manifest.json's file list and hashes true
            import json
            fixture_io.write_manifest(root, json.loads(summary.read_text()))


if __name__ == "__main__":
    main()
