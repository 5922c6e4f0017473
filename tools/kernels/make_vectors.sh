#!/bin/sh
# Regenerates crates/xwen-kernels/tests/vectors from llama.cpp (b11434):
#   LLAMA_CPP=<llama.cpp source tree with a CPU build in build/> tools/kernels/make_vectors.sh
# gguf_*.bin come from gguf-py (numpy), ggml_*.bin from the C libraries of that build (the
# activation quantizers and vec_dot are those of the machine the build targets, here x86 AVX2).
set -eu
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree with a CPU build in build/}"
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../../crates/xwen-kernels/tests/vectors"
mkdir -p "$out"
PYTHONPATH="$LLAMA_CPP/gguf-py" python3 "$here/make_vectors.py" "$out"
tmp=$(mktemp -d)
gcc -O2 -std=gnu11 -I"$LLAMA_CPP/ggml/include" "$here/ggml_vectors.c" \
    "$LLAMA_CPP/build/ggml/src/libggml-cpu.a" "$LLAMA_CPP/build/ggml/src/libggml-base.a" \
    -lstdc++ -lm -fopenmp -lpthread -o "$tmp/ggml_vectors"
"$tmp/ggml_vectors" "$out"
rm -rf "$tmp"
