#!/usr/bin/env bash
# On the device machine: llama.cpp (AVX2 build) against xwen at both defaults (f16 KV cache,
# flash attention on) on synthetic models of the real geometries — qwen35-4b (head dim 256,
# partial rope 64, 16 q / 4 kv heads, the 248K Qwen3.5 vocabulary) and qwen35moe-small (the
# 35B-A3B's geometry). Carry a gzip of a stripped release xwen as target/devbin/xwen.gz and the
# sdist cut as target/llama-src/llama-min.tar.gz with long512.txt (two prompts of 70 and 300
# ids); 248K-vocabulary logits are too large to bring back, so the comparison runs there.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
w="${WORK:-$repo/target/geo}"
mkdir -p "$w/refs"
gunzip -c "$repo/target/devbin/xwen.gz" > "$w/xwen" && chmod +x "$w/xwen"
SDIST="$repo/target/llama-src/llama-min.tar.gz" OUT="$w/fx" WORK="$w/llama" bash "$here/fa_refs.sh" >/dev/null
bin="$w/llama/build/bin"
prompts="$repo/target/llama-src/long512.txt"
for p in qwen35-4b qwen35moe-small; do
  [ -f "$w/$p.gguf" ] || (cd "$repo" && "$w/xwen" synth --preset "$p" --out "$w/$p.gguf" >/dev/null 2>&1)
  mkdir -p "$w/refs/$p"
  "$bin/llama_logits" "$w/$p.gguf" "$prompts" "$w/refs/$p/llama-f16-faon" --threads 2 --kv f16 --fa on >"$w/refs/$p/llama-f16-faon.txt" 2>/dev/null
  python3 "$here/compare_refs.py" "$w/xwen" "$w/refs" "$p" "$w/$p.gguf" "$prompts" f16-on || true
done
