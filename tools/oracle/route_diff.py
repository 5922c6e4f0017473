#!/usr/bin/env python3
"""Where two runs' MoE routing parts, and whether it was a tie.

usage: tools/oracle/route_diff.py A.jsonl B.jsonl [--tie 1e-3]

A and B are route dumps (`xwen logits ... --dump-routes FILE`: one JSON object per position
and layer with pos, layer, experts, weights, margin — the last chosen expert's probability less
the best unchosen one's). Decisions are compared in order of position, then layer. The first
one whose chosen set differs is printed with both runs' margins; it is a near-tie the router
itself could not resolve when either margin is below --tie (then the logits that follow may
part without any op being wrong: compare from before it, or look at ops only if it is not a
tie). Exit 0 if every decision agrees, 1 at a departure, 2 on unusable input. Standard library
only.
"""

import argparse
import json
import sys


def load(path):
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                out[(int(r["pos"]), int(r["layer"]))] = r
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"route_diff: {path}: {e}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tie", type=float, default=1e-3)
    a = ap.parse_args()
    ra, rb = load(a.a), load(a.b)
    if set(ra) != set(rb):
        only = sorted(set(ra) ^ set(rb))[:5]
        print(f"route_diff: the dumps cover different (pos, layer) decisions, e.g. {only}", file=sys.stderr)
        return 2
    same_order = 0
    for key in sorted(ra):
        x, y = ra[key], rb[key]
        if set(x["experts"]) != set(y["experts"]):
            tie = min(x["margin"], y["margin"]) < a.tie
            print(f"first departure at pos {key[0]}, layer {key[1]}: {x['experts']} vs {y['experts']}")
            print(f"  margins {x['margin']:.3e} / {y['margin']:.3e} -> {'a near-tie' if tie else 'NOT a tie'} (--tie {a.tie:g})")
            print(f"  {same_order} decisions agreed before it")
            return 1
        same_order += 1
    print(f"all {len(ra)} routing decisions agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
