#!/usr/bin/env python3
"""llama.cpp's MoE routing decisions from a llama_dump directory, as route_diff.py reads them.

usage: tools/oracle/llama_routes.py DUMP_DIR --n-used K [-o ROUTES.jsonl]

DUMP_DIR is what tools/oracle/llama_dump.cpp wrote for one prompt (index.txt: NAME ne0 ne1 ..,
NAME.bin: raw float32). Per MoE layer N it reads the router's selection scores —
`ffn_moe_probs_biased-N` where the model adds a selection bias (Kimi), else `ffn_moe_probs-N`
(n_expert × n_tokens) — and writes one JSON object per position and layer, as `xwen logits
--dump-routes` does: pos, layer, experts (the top K, best first: ggml_argsort_top_k), weights
(from `ffn_moe_weights-N` where the dump has it, else the chosen scores renormalized, as
qwen35moe's softmax router does) and margin (the K-th score less the best unchosen one's).
Then `route_diff.py XWEN.jsonl LLAMA.jsonl` names the first decision where the two engines
part and whether it was a near-tie. Standard library only.
"""

import argparse
import json
import os
import re
import struct
import sys


def read_index(d):
    shapes = {}
    with open(os.path.join(d, "index.txt")) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                # the first tensor of a name is the one its .bin holds
                shapes.setdefault(parts[0], [int(x) for x in parts[1:]])
    return shapes


def read_tensor(d, name, shape):
    with open(os.path.join(d, name + ".bin"), "rb") as f:
        data = f.read()
    n = 1
    for s in shape:
        n *= s
    if len(data) != 4 * n:
        raise ValueError(f"{name}.bin holds {len(data)} bytes, its shape {shape} needs {4 * n}")
    return struct.unpack(f"<{n}f", data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dump_dir")
    ap.add_argument("--n-used", type=int, required=True, help="experts per token (expert_used_count)")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    try:
        shapes = read_index(a.dump_dir)
    except OSError as e:
        sys.exit(f"llama_routes: {e}")
    layers = sorted({int(m.group(1)) for n in shapes for m in [re.fullmatch(r"ffn_moe_probs-(\d+)", n)] if m})
    if not layers:
        sys.exit("llama_routes: no ffn_moe_probs-N in the dump (dump without --filter, or with ffn_moe_)")
    out = []
    for il in layers:
        sel_name = f"ffn_moe_probs_biased-{il}" if f"ffn_moe_probs_biased-{il}" in shapes else f"ffn_moe_probs-{il}"
        ne = shapes[sel_name]
        n_expert, n_tok = ne[0], ne[1]
        if not 0 < a.n_used < n_expert:
            sys.exit(f"llama_routes: --n-used {a.n_used} with {n_expert} experts")
        sel = read_tensor(a.dump_dir, sel_name, ne)
        probs = read_tensor(a.dump_dir, f"ffn_moe_probs-{il}", shapes[f"ffn_moe_probs-{il}"])
        wname = f"ffn_moe_weights_norm-{il}" if f"ffn_moe_weights_norm-{il}" in shapes else f"ffn_moe_weights-{il}"
        weights = read_tensor(a.dump_dir, wname, shapes[wname]) if wname in shapes else None
        for t in range(n_tok):
            s = sel[t * n_expert:(t + 1) * n_expert]
            order = sorted(range(n_expert), key=lambda e: -s[e])
            chosen = order[:a.n_used]
            if weights is not None:
                w = list(weights[t * a.n_used:(t + 1) * a.n_used])
            else:
                p = [probs[t * n_expert + e] for e in chosen]
                total = sum(p)
                w = [x / total for x in p]
            out.append({"pos": t, "layer": il, "experts": chosen, "weights": w, "margin": s[order[a.n_used - 1]] - s[order[a.n_used]]})
    out.sort(key=lambda r: (r["pos"], r["layer"]))
    text = "".join(json.dumps(r) + "\n" for r in out)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(f"llama_routes: {len(out)} decisions ({len(layers)} MoE layers)", file=sys.stderr)


if __name__ == "__main__":
    main()
