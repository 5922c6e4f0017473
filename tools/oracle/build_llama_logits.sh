#!/usr/bin/env bash
# Builds tools/oracle/llama_logits (or $TOOL: llama_dump, llama_mtp) against a static CPU build of
# llama.cpp b11434.
#   LLAMA_CPP_DIR  the llama.cpp source tree (the sdist's llama.cpp/ folder)
#   LLAMA_CPP_BUILD  its cmake build folder (default: $LLAMA_CPP_DIR/build), configured with
#                    BUILD_SHARED_LIBS=OFF
#   TOOL           which tools/oracle/*.cpp to build (default: llama_logits)
#   OUT            where to put the binary (default: $LLAMA_CPP_BUILD/bin/$TOOL)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to the llama.cpp source tree}"
build="${LLAMA_CPP_BUILD:-$LLAMA_CPP_DIR/build}"
tool="${TOOL:-llama_logits}"
out="${OUT:-$build/bin/$tool}"

libs=()
for lib in src/libllama.a ggml/src/libggml.a ggml/src/libggml-cpu.a ggml/src/libggml-base.a; do
  [ -f "$build/$lib" ] || { echo "missing $build/$lib (is the static build finished?)" >&2; exit 1; }
  libs+=("$build/$lib")
done
omp=()
if grep -q '^GGML_OPENMP_ENABLED:INTERNAL=ON' "$build/CMakeCache.txt" 2>/dev/null; then omp=(-fopenmp); fi

mkdir -p "$(dirname "$out")"
${CXX:-g++} -O2 -std=c++17 "${omp[@]}" \
  -I"$LLAMA_CPP_DIR/include" -I"$LLAMA_CPP_DIR/ggml/include" -I"$LLAMA_CPP_DIR/src" \
  "$here/$tool.cpp" -o "$out" \
  -Wl,--start-group "${libs[@]}" -Wl,--end-group "${omp[@]}" -lpthread -ldl -lm
echo "$out"
