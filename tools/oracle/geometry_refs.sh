#!/usr/bin/env bash
# On the device: llama.cpp (AVX2 build) against xwen at its defaults on synthetic models of the
# real geometries (qwen35-4b: head dim 256, partial rope 64; qwen35moe-small: the 35B-A3B's).
# Carry a gzip of a stripped release xwen as target/devbin/xwen.gz and the sdist cut as
# target/llama-src/llama-min.tar.gz (with long512.txt: two prompts of 70 and 300 ids); the
# logits of a 248K vocabulary are too large to bring back, so the comparison runs there.
set -e
gunzip -c target/devbin/xwen.gz > /tmp/xwen && chmod +x /tmp/xwen
mkdir -p /tmp/geo
SDIST=target/llama-src/llama-min.tar.gz OUT=/tmp/geo/fx bash tools/oracle/fa_refs.sh >/dev/null
bin=/tmp/llama-fa/build/bin
for p in qwen35-4b qwen35moe-small; do
  [ -f /tmp/geo/$p.gguf ] || /tmp/xwen synth --preset $p --out /tmp/geo/$p.gguf >/dev/null 2>&1
  $bin/llama_logits /tmp/geo/$p.gguf target/llama-src/long512.txt /tmp/geo/refs/$p/llama-f16-faon --threads 2 --kv f16 --fa on > /tmp/geo/refs/$p/llama-f16-faon.txt 2>/dev/null || { mkdir -p /tmp/geo/refs/$p; $bin/llama_logits /tmp/geo/$p.gguf target/llama-src/long512.txt /tmp/geo/refs/$p/llama-f16-faon --threads 2 --kv f16 --fa on > /tmp/geo/refs/$p/llama-f16-faon.txt; }
  python3 tools/oracle/compare_refs.py /tmp/xwen /tmp/geo/refs $p /tmp/geo/$p.gguf target/llama-src/long512.txt f16-on || true
done
