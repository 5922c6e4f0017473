#!/usr/bin/env python3
"""Compare xwen with llama.cpp records made by tools/oracle/fa_refs.sh.

usage: compare_refs.py XWEN_BIN REFS_DIR NAME MODEL.gguf PROMPTS.txt [SETTING ...]

REFS_DIR/NAME holds llama-<kv>-fa<on|off>.p<i>.npy (all-position logits of prompt i) and
llama-<kv>-fa<on|off>.txt ("p<i> greedy: ids"); PROMPTS.txt one prompt of token ids per line
(or a fixture cases.txt, whose `prompt <i> <name> ids` lines are read). For each setting
(default: f16-on f32-on) xwen runs with the same cache type and flash-attention switch, the
AVX2 kernel set and 2 threads; prints, per prompt, whether the logits are bit-identical (else
the first differing position and the largest difference) and whether the greedy ids agree.
Exit status 1 if anything differs. No numpy needed.
"""
import os
import struct
import subprocess
import sys
import tempfile


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY", path
    hlen = struct.unpack("<H", data[8:10])[0]
    header = data[10:10 + hlen].decode()
    shape = tuple(int(x) for x in header.split("(")[1].split(")")[0].split(",") if x.strip())
    body = data[10 + hlen:]
    return shape, body


def prompts_of(path):
    out = []
    for line in open(path):
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "prompt":
            out.append([int(x) for x in parts[3:]])
        elif parts[0].isdigit():
            out.append([int(x) for x in parts])
    return out


def main():
    xwen, refs, name, model, prompts_file = sys.argv[1:6]
    settings = sys.argv[6:] or ["f16-on", "f32-on"]
    prompts = prompts_of(prompts_file)
    bad = 0
    for setting in settings:
        kv, fa = setting.split("-")
        base = os.path.join(refs, name, f"llama-{kv}-fa{fa}")
        greedy = {}
        for line in open(base + ".txt"):
            if " greedy: " in line:
                k, ids = line.split(" greedy: ")
                greedy[int(k[1:])] = ids.split()
        flags = ["-ctk", kv, "-ctv", kv, "-fa", fa, "--isa", "avx2", "-t", "2", "-q"]
        for i, ids in enumerate(prompts):
            ids_arg = ",".join(map(str, ids))
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "x.npy")
                subprocess.run([xwen, "logits", "-m", model, "--ids", ids_arg, "--out", out] + flags[:-1], check=True, capture_output=True)
                (shape, mine), (shape2, theirs) = read_npy(out), read_npy(f"{base}.p{i}.npy")
            assert shape == shape2, (shape, shape2)
            n_vocab = shape[1]
            first, worst = None, 0.0
            if mine != theirs:
                a = struct.unpack(f"<{len(mine) // 4}f", mine)
                b = struct.unpack(f"<{len(theirs) // 4}f", theirs)
                for j, (x, y) in enumerate(zip(a, b)):
                    if x != y:
                        first = j // n_vocab if first is None else first
                        worst = max(worst, abs(x - y))
            run = subprocess.run([xwen, "run", "-m", model, "--ids", ids_arg, "-n", str(len(greedy.get(i, [])) or 32), "--temp", "0", "--print-ids", "--ignore-eos"] + flags, check=True, capture_output=True, text=True)
            same_greedy = run.stdout.split() == greedy.get(i)
            ok = first is None and same_greedy
            bad += not ok
            logits = "logits identical" if first is None else f"logits differ from position {first} (max {worst:.3g})"
            print(f"{name} {setting} p{i} ({len(ids)} tokens): {logits}, greedy {'same' if same_greedy else 'DIFFERS'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
