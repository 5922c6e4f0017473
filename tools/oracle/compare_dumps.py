#!/usr/bin/env python3
"""The first intermediate tensor where xwen and llama.cpp part (issue 17 item 4).

usage: compare_dumps.py XWEN_DIR LLAMA_DIR

XWEN_DIR from `xwen logits ... --dump-tensors XWEN_DIR`, LLAMA_DIR from
`tools/oracle/llama_dump MODEL PROMPT.txt LLAMA_DIR` on the same prompt (and the same KV type and
flash-attention switch): both hold NAME.bin (raw float32, ne0 fastest) and index.txt
(`NAME ne0 ne1 ne2 ne3`). In llama.cpp's computation order, every name both sides recorded is
compared; prints each one's verdict up to the first that differs (its first differing row and
largest difference), then stops. Exit status 1 if one differs. No numpy needed.
"""
import os
import struct
import sys


def index(d):
    out = []
    for line in open(os.path.join(d, "index.txt")):
        parts = line.split()
        if len(parts) >= 2:
            n = 1
            for x in parts[1:]:
                n *= int(x)
            out.append((parts[0], int(parts[1]), n))
    return out


def floats(d, name):
    data = open(os.path.join(d, name + ".bin"), "rb").read()
    return struct.unpack(f"<{len(data) // 4}f", data)


def main():
    xdir, ldir = sys.argv[1:3]
    mine = {name: (ne0, n) for name, ne0, n in index(xdir)}
    compared = 0
    for name, ne0, n in index(ldir):
        if name not in mine:
            continue
        compared += 1
        xne0, xn = mine[name]
        # the same bytes may be described by other shapes ([1, 8] vs [8, 1]): the count decides
        if xn != n:
            print(f"{name}: shapes differ (xwen {xne0} x {xn // max(xne0, 1)}, llama.cpp {ne0} x {n // max(ne0, 1)})")
            sys.exit(1)
        a, b = floats(xdir, name), floats(ldir, name)
        bad = [i for i, (x, y) in enumerate(zip(a, b)) if x != y and not (x != x and y != y)]
        if bad:
            worst = max(abs(a[i] - b[i]) for i in bad)
            print(f"{name}: DIFFERS from row {bad[0] // ne0} ({len(bad)} of {n} values, max {worst:.3g})")
            sys.exit(1)
        print(f"{name}: identical")
    print(f"{compared} tensors compared, all identical" if compared else "no tensor names in common")


if __name__ == "__main__":
    main()
