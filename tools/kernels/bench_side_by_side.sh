#!/bin/sh
# xwen vs ggml matrix x vector, same shapes and thread counts, interleaved (shared machines are
# noisy: compare the two in the same minute, and repeat). Needs a llama.cpp CPU build:
#   LLAMA_CPP=<llama.cpp tree> tools/kernels/bench_side_by_side.sh [ROUNDS]
set -eu
: "${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp source tree with a CPU build in build/}"
rounds=${1:-2}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
for tool in ggml_matvec_bench ggml_dot_bench; do
    gcc -O2 -std=gnu11 -I"$LLAMA_CPP/ggml/include" "$here/$tool.c" \
        "$LLAMA_CPP/build/ggml/src/libggml-cpu.a" "$LLAMA_CPP/build/ggml/src/libggml-base.a" \
        -lstdc++ -lm -fopenmp -lpthread -o "$tmp/$tool"
done
cargo build -q -p xwen-kernels --release --example matvec_bench
xwen="$here/../../target/release/examples/matvec_bench"
"$xwen" --quick | sed -n '1,6p'
for r in $(seq "$rounds"); do
    echo "--- round $r ($(uptime | sed 's/.*load/load/'))"
    "$xwen" --in-cache | tail -n +2
    "$tmp/ggml_dot_bench"
    for shape in 2048x2048 5120x17408 4096x14336; do
        rows=${shape%x*}; cols=${shape#*x}
        for t in 1 2; do
            "$xwen" --only-matvec --shape "$shape" --threads "$t" | tail -n +2
            "$tmp/ggml_matvec_bench" "$rows" "$cols" "$t"
        done
    done
done
rm -rf "$tmp"
