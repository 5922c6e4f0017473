#!/bin/sh
# Regenerates crates/xwen-kernels/tests/vectors/f32ops_ggml.bin (golden SiLU / SwiGLU / softmax
# bits for src/f32ops) from llama.cpp b11434's CPU backend:
#   LLAMA_CPP=<llama.cpp source tree with a CPU build in build/> tools/kernels/make_expf_vectors.sh
# The values are those of the ISA that build targets: run it on an AVX2+FMA machine without
# AVX-512 (the file holds ggml's 8-lane AVX2 ggml_v_expf results).
set -eu
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree with a CPU build in build/}"
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../../crates/xwen-kernels/tests/vectors"
mkdir -p "$out"
tmp=$(mktemp -d)
gcc -O2 -std=gnu11 -I"$LLAMA_CPP/ggml/include" "$here/ggml_expf_vectors.c" \
    "$LLAMA_CPP/build/ggml/src/libggml-cpu.a" "$LLAMA_CPP/build/ggml/src/libggml-base.a" \
    -lstdc++ -lm -fopenmp -lpthread -o "$tmp/ggml_expf_vectors"
"$tmp/ggml_expf_vectors" "$out/f32ops_ggml.bin"
rm -rf "$tmp"
