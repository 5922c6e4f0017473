#!/usr/bin/env bash
# One architecture's parity fixtures from nothing, on any x86 host with enough cores (the
# device machine: docs/parity.md): builds llama.cpp b11434 as an AVX2 machine's build (libllama
# and llama-quantize), runs tools/oracle/make_fixtures.py for $ARCH (qwen3_next, kimi_linear, ...;
# transformers + llama.cpp, f32 KV cache and flash attention off), then records
#   - llama.cpp at its defaults (f16 KV, flash attention on) for the committed tiers, into
#     tests/fixtures/parity/fa/cond-$ARCH-model-<tier>.* (crates/xwen-engine/tests/parity_fa.rs)
#   - for qwen3_next, the legacy `ssm_in` layout (tools/oracle/legacy_qwen3next.py) against the
#     current one: llama.cpp's two build_qkvz paths must agree bit for bit for xwen's legacy
#     test to stand
#       SDIST  a .tar.gz of the sdist's llama.cpp/ folder (CMakeLists.txt, cmake, src, ggml,
#              include, vendor, common, tools, licenses, convert_hf_to_gguf.py, conversion, gguf-py,
#              models/templates — Kimi K3's converter embeds Kimi-K3.jinja from there)
#       OUT    where the logs and a tarball of the new fixture files go
#       ARCH   the oracle's architecture name (default qwen3_next; kimi_k3 runs tools/oracle/kimi_k3.py)
# The device machine takes at most 64 MiB of working tree and the repository's tracked files are
# larger: untrack the big fixture folders for the call (`git rm -r --cached DIR` plus a
# .git/info/exclude line each; `git reset` after) — this script rebuilds what it needs there.
set -euo pipefail
arch="${ARCH:-qwen3_next}"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
: "${SDIST:?set SDIST}"
: "${OUT:?set OUT}"
work="${WORK:-$repo/target/qwen3next-refs}"
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
L="$work/cache/bin/llama_logits"
fx="$repo/tests/fixtures/parity"
if [ -n "${GEOMS:-}" ]; then
  # GEOMS=all or names of tools/oracle/models.py GEOMETRIES: fixtures in tests/fixtures/parity/geom/
  python3 "$here/make_fixtures.py" --sets "" --archs "" --geometries "$GEOMS" --trained no 2>&1 | tee "$OUT/fixtures.log"
  for d in "$fx"/geom/*/; do
    name=$(basename "$d")
    for m in "$d"model-*.gguf; do
      tier=$(basename "$m" .gguf)
      "$L" "$m" "$work/cache/oracle/geom/$name/llama-f32.prompts.txt" "$fx/fa/geom-$name-$tier" --threads 2 --kv f16 --fa on \
        >"$fx/fa/geom-$name-$tier.txt" 2>>"$OUT/fa.err"
    done
  done
  cd "$repo"
  tar czf "$OUT/geom-fixtures.tgz" tests/fixtures/parity/geom tests/fixtures/parity/fa/geom-* tests/fixtures/parity/summary.json
  echo done
  exit 0
fi
if [ "$arch" = kimi_k3 ]; then
  # no transformers class: the checkpoint is written by name, llama.cpp is the one oracle
  python3 "$here/kimi_k3.py" 2>&1 | tee "$OUT/fixtures.log"
else
  python3 "$here/make_fixtures.py" --sets cond,rand --archs "$arch" --trained no 2>&1 | tee "$OUT/fixtures.log"
fi
Q="$build/bin/llama-quantize"

# llama.cpp at its defaults on the committed tiers, and on the long prompts (tiled and split-KV paths)
for m in "$fx"/cond/"$arch"/model-*.gguf; do
  tier=$(basename "$m" .gguf)
  p="$work/cache/oracle/cond/$arch/llama-f32.prompts.txt"
  "$L" "$m" "$p" "$fx/fa/cond-$arch-$tier" --threads 2 --kv f16 --fa on >"$fx/fa/cond-$arch-$tier.txt" 2>"$OUT/fa-$tier.err"
done
"$L" "$fx/cond/$arch/model-q8_0.gguf" "$fx/fa/long-prompts.txt" "$fx/fa/long-cond-$arch-q8_0" --threads 2 --kv f16 --fa on \
  >"$fx/fa/long-cond-$arch-q8_0.txt" 2>"$OUT/fa-long.err"

# Kimi K3 has no transformers reference: bring back the f32 file's llama.cpp logits and every
# intermediate tensor of the Q8_0 file on prompt 0 (tools/oracle/llama_dump.cpp), for bisecting
if [ "$arch" = kimi_k3 ]; then
  D="$work/cache/bin/llama_dump"
  LLAMA_CPP_DIR="$src" LLAMA_CPP_BUILD="$build" TOOL=llama_dump OUT="$D" bash "$here/build_llama_logits.sh" >"$OUT/dump-build.log" 2>&1
  wd="$work/cache/oracle/cond/kimi_k3"
  head -1 "$wd/llama-f32.prompts.txt" >"$wd/p0.txt"
  mkdir -p "$wd/dump-q8_0"  # llama_dump writes into an existing folder
  "$D" "$fx/cond/kimi_k3/model-q8_0.gguf" "$wd/p0.txt" "$wd/dump-q8_0" --threads 2 >"$OUT/dump.log" 2>&1 || true
  tar czf "$OUT/kimi_k3-extra.tgz" -C "$wd" llama-f32.p0.npy llama-f32.p1.npy llama-f32.p2.npy dump-q8_0
fi

# the legacy layout: llama.cpp on both layouts, f32 and Q8_0
for s in cond rand; do
  [ "$arch" = qwen3_next ] || break
  wd="$work/cache/oracle/$s/qwen3_next"
  python3 "$here/legacy_qwen3next.py" "$wd/model-f32.gguf" "$wd/legacy-f32.gguf"
  "$Q" "$wd/legacy-f32.gguf" "$wd/legacy-q8_0.gguf" Q8_0 2 >/dev/null 2>&1
  for t in f32 q8_0; do
    for kind in model legacy; do
      "$L" "$wd/$kind-$t.gguf" "$wd/llama-f32.prompts.txt" "$wd/layout-$kind-$t" --n-gen 32 --threads 2 >"$wd/layout-$kind-$t.txt" 2>/dev/null
    done
    python3 - "$wd" "$t" <<'EOF' | tee -a "$OUT/legacy.log"
import sys, numpy as np
wd, t = sys.argv[1], sys.argv[2]
worst = max(float(np.abs(np.load(f"{wd}/layout-legacy-{t}.p{i}.npy") - np.load(f"{wd}/layout-model-{t}.p{i}.npy")).max()) for i in range(3))
g = lambda k: [l.split(":", 1)[1] for l in open(f"{wd}/layout-{k}-{t}.txt") if " greedy:" in l]
print(f"{wd.split('/')[-2]} {t}: legacy vs current layout max |diff| {worst:g}, greedy same: {g('legacy') == g('model')}")
EOF
  done
done
cd "$repo"
tar czf "$OUT/$arch-fixtures.tgz" tests/fixtures/parity/cond/"$arch" tests/fixtures/parity/fa/*"$arch"* \
  tests/fixtures/parity/summary.json tests/fixtures/parity/manifest.json
ls -la "$fx"/cond/"$arch" "$work/cache/oracle"/*/"$arch" >"$OUT/files.txt"
echo done
