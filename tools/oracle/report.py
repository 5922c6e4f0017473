#!/usr/bin/env python3
"""Prints the oracle's figures from tests/fixtures/parity/summary.json as the markdown tables
docs/parity.md carries (self-check, amplification, bug sensitivity, sizes)."""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def e(x):
    return f"{x:.2e}"


def main() -> None:
    root = REPO / "tests" / "fixtures" / "parity"
    s = json.loads((root / "summary.json").read_text())
    rows = {**s.get("models", {}), **{f"trained/{k}": v for k, v in s.get("trained", {}).items()}}

    print("### Self-check: llama.cpp vs transformers float32\n")
    print("| fixture | gguf | rel-L2 max/pos | median/pos | top-1 agree | greedy prefix (of 32) per prompt |")
    print("|---|---|---|---|---|---|")
    for name, m in rows.items():
        for kind, v in m["vs_hf"].items():
            top1 = f"{v['top1_agree']:.3f}" if "top1_agree" in v else "-"
            print(f"| {name} | {kind} | {e(v['rel_l2_max_pos'])} | {e(v['rel_l2_median_pos'])} | {top1} | "
                  f"{' / '.join(map(str, m['greedy_prefix_vs_hf'][kind]))} |")

    print("\n### Amplification (rel-L2 of logits / injected relative noise eps)\n")
    print("| fixture | act 1e-4 median | act 1e-3 median | act 1e-3 all | act 1e-3 max/pos | "
          "weight 1e-3 median | weight 1e-3 all |")
    print("|---|---|---|---|---|---|---|")
    for name, m in rows.items():
        a = m.get("amplification")
        if not a:
            continue
        print(f"| {name} | {a['act']['0.0001']['median']:.2f} | {a['act']['0.001']['median']:.2f} | "
              f"{a['act']['0.001']['all']:.2f} | {a['act']['0.001']['max']:.2f} | "
              f"{a['weight']['0.001']['median']:.2f} | {a['weight']['0.001']['all']:.2f} |")

    print("\n### Activation rounding effect (transformers, every matmul input rounded as ggml does)\n")
    print("| fixture | Q8_0 median/pos | Q8_0 max | Q8_K median/pos | Q8_K max | bf16 median/pos | bf16 max |")
    print("|---|---|---|---|---|---|---|")
    for name, m in rows.items():
        q = m.get("act_quant_effect")
        if q:
            print(f"| {name} | " + " | ".join(f"{e(q[f]['median'])} | {e(q[f]['max'])}" for f in ("q8_0", "q8_k", "bf16")) + " |")

    print("\n### Bug sensitivity (rel-L2 of logits when the bug is injected into transformers)\n")
    print("| fixture | norm +1 missing | dt bias dropped | A scaled by 1/e |")
    print("|---|---|---|---|")
    for name, m in rows.items():
        b = m.get("bug_sensitivity")
        if b:
            print(f"| {name} | {b.get('norm_missing_plus1', 0):.3f} | {b.get('dt_bias_dropped', 0):.3f} | "
                  f"{b.get('ssm_a_scaled', 0):.3f} |")

    print("\n### Router margins (MoE; smallest k-th minus (k+1)-th expert probability, per prompt)\n")
    for name, m in rows.items():
        if m.get("router_margin_min"):
            print(f"- {name}: " + ", ".join(f"{x:.1e}" for x in m["router_margin_min"]))

    man = json.loads((root / "manifest.json").read_text())
    print(f"\n### Sizes\n\ncommitted total: {man['total_bytes'] / 1e6:.1f} MB in {len(man['files'])} files\n")
    for name, m in s.get("models", {}).items():
        sizes = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in m["gguf_bytes"].items())
        print(f"- {name}: {m['n_params_hf'] / 1e6:.2f} M params; GGUF {sizes}")


if __name__ == "__main__":
    sys.exit(main())
