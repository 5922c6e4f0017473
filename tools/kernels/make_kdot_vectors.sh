#!/bin/sh
# Regenerates crates/xwen-kernels/tests/vectors/kdot_*.bin (many-row K-quant vec_dot goldens)
# from llama.cpp (b11434):
#   LLAMA_CPP=<llama.cpp source tree with a CPU build in build/> tools/kernels/make_kdot_vectors.sh
# The dots are those of the ISA the build targets (here x86 AVX2).
set -eu
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree with a CPU build in build/}"
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../../crates/xwen-kernels/tests/vectors"
tmp=$(mktemp -d)
g++ -O2 -x c -std=gnu11 -I"$LLAMA_CPP/ggml/include" "$here/ggml_kdot_vectors.c" -x none \
    "$LLAMA_CPP/build/ggml/src/libggml.a" "$LLAMA_CPP/build/ggml/src/libggml-cpu.a" \
    "$LLAMA_CPP/build/ggml/src/libggml-base.a" -lstdc++ -lm -fopenmp -lpthread -ldl -o "$tmp/gen"
"$tmp/gen" "$out"
rm -rf "$tmp"
