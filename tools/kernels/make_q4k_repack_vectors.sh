#!/bin/sh
# Regenerates crates/xwen-kernels/tests/vectors/repack_q4k_*.bin from llama.cpp (b11434):
#   LLAMA_CPP=<llama.cpp source tree with a CPU build in build/> tools/kernels/make_q4k_repack_vectors.sh
# Valid where ggml repacks Q4_K (x86 with AVX2); the build here targets AVX2.
set -eu
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree with a CPU build in build/}"
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../../crates/xwen-kernels/tests/vectors"
tmp=$(mktemp -d)
g++ -O2 -x c -std=gnu11 -I"$LLAMA_CPP/ggml/include" "$here/ggml_q4k_repack_vectors.c" -x none \
    "$LLAMA_CPP/build/ggml/src/libggml.a" "$LLAMA_CPP/build/ggml/src/libggml-cpu.a" \
    "$LLAMA_CPP/build/ggml/src/libggml-base.a" -lstdc++ -lm -fopenmp -lpthread -ldl -o "$tmp/gen"
"$tmp/gen" "$out"
rm -rf "$tmp"
