#!/usr/bin/env python3
"""Random geometries against llama.cpp (issue 17 item 3; docs/parity.md "Random geometries").

usage: random_geometry.py --xwen BIN --llama-logits BIN [--families F,..] [--seeds A-B|A,B,..]
                          [--mixes M,..] [--settings KV-FA,..] [--n-gen N] [--record MANIFEST]
                          [--keep DIR]

For every family × seed × mix: `xwen synth --random SEED --family F --mix M` writes a tiny model
of a freshly drawn geometry (docs/cli.md `xwen synth`), four prompts of random token ids (1,
5-12, 30-48 and 70-140 tokens; `--short` drops the last) are drawn from the seed, llama.cpp (tools/oracle/llama_logits, 2 threads) records all-position
logits and N greedy tokens under each setting (KV type and flash attention: f32-off is the
oracle's plain path, f16-on llama.cpp's defaults, q8_0-on its rotated quantized cache), and xwen
is run with the same settings, the AVX2 kernels (`--isa native`: uncapped) and 2 threads. Prints one line per case: logits
bit-identical or the first differing position and the largest difference, greedy same or not.
Exit status 1 if anything differs.

--record appends each case that agreed to MANIFEST (JSON; default tests/fixtures/parity/random/
manifest.json; with --isa native, tests/fixtures/parity/random/manifest-native.json is the file
for a native build's records, each case listing the CPU flags its orders depend on): family, seed, mix, the file's FNV-1a, the prompts, and per setting each
position's FNV-1a of its logits' bytes with the greedy ids — what
crates/xwen-synth/tests/random_geometries.rs checks in CI without llama.cpp (it re-synthesizes
the same file from the seed). No numpy needed.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

from compare_refs import read_npy  # noqa: E402  (tools/oracle/, beside this script)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_MANIFEST = os.path.join(REPO, "tests", "fixtures", "parity", "random", "manifest.json")
FAMILIES = ["qwen35", "qwen35moe", "qwen3next", "kimi-linear"]


def fnv1a(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# CPU flags that select a different float order in llama.cpp's -march=native build (or in
# xwen's twin of it): AVX-512 widths, VNNI's tiled kernel and Q2_K repack, BF16's vdpbf16ps
ORDER_FLAGS = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"]


def order_flags():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return [fl for fl in ORDER_FLAGS if fl in flags]


def seeds_of(spec: str):
    out = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def prompts_for(family: str, seed: int, n_vocab: int, long: bool):
    """Random ids: one token, a short prompt, one past a few chunks of 16, and with `long` one of
    70-140 tokens (flash attention's tiled path from 64 rows, DeltaNet's chunked form)."""
    r = random.Random(f"{family}/{seed}")
    sizes = [1, r.randint(5, 12), r.randint(30, 48)] + ([r.randint(70, 140)] if long else [])
    return [[r.randrange(n_vocab) for _ in range(n)] for n in sizes]


def n_vocab_of(synth_log: str) -> int:
    for line in synth_log.splitlines():
        if " vocab" in line and "layers, hidden" in line:
            return int(line.split(" vocab ")[1].split()[0])
    raise SystemExit(f"cannot read the vocabulary size from xwen synth's log:\n{synth_log}")


def per_position_hashes(body: bytes, n_vocab: int):
    row = 4 * n_vocab
    return [fnv1a(body[i:i + row]) for i in range(0, len(body), row)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--xwen", required=True)
    ap.add_argument("--llama-logits", required=True)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--seeds", default="0-3")
    ap.add_argument("--mixes", default="q4_k_m")
    ap.add_argument("--settings", default="f32-off,f16-on")
    ap.add_argument("--n-gen", type=int, default=16)
    ap.add_argument("--record", nargs="?", const=DEFAULT_MANIFEST)
    ap.add_argument("--keep", help="keep the synthesized files and records here")
    ap.add_argument("--short", action="store_true", help="three prompts only (no 70-140-token one)")
    ap.add_argument("--isa", default="avx2", help="xwen's --isa (avx2: reproduce an AVX2 llama.cpp build, as "
                    "the records; native: no cap, against a llama.cpp built for this CPU)")
    args = ap.parse_args()

    manifest = []
    if args.record and os.path.exists(args.record):
        manifest = json.load(open(args.record))
    bad = 0
    work = args.keep or tempfile.mkdtemp(prefix="xwen-random-")
    os.makedirs(work, exist_ok=True)
    for family in args.families.split(","):
        for seed in seeds_of(args.seeds):
            for mix in args.mixes.split(","):
                name = f"{family}-{seed}-{mix}"
                gguf = os.path.join(work, name + ".gguf")
                syn = subprocess.run([args.xwen, "synth", "--random", str(seed), "--family", family, "--mix", mix,
                                      "--seed", str(seed + 1), "--out", gguf], capture_output=True, text=True)
                if syn.returncode != 0:
                    print(f"{name}: xwen synth failed:\n{syn.stderr}")
                    bad += 1
                    continue
                geometry = next((l.split(": ", 2)[2] for l in syn.stderr.splitlines() if "random" in l and "geometry" in l), "")
                n_vocab = n_vocab_of(syn.stderr)
                prompts = prompts_for(family, seed, n_vocab, not args.short)
                pfile = os.path.join(work, name + ".prompts.txt")
                with open(pfile, "w") as f:
                    f.write("".join(" ".join(map(str, p)) + "\n" for p in prompts))
                case = {"family": family, "seed": seed, "mix": mix, "geometry": geometry,
                        "file_fnv1a": fnv1a(open(gguf, "rb").read()), "prompts": prompts, "settings": {}}
                ok_case = True
                for setting in args.settings.split(","):
                    kv, fa = setting.split("-")
                    prefix = os.path.join(work, f"{name}.{setting}")
                    ref = subprocess.run([args.llama_logits, gguf, pfile, prefix, "--threads", "2", "--kv", kv, "--fa", fa,
                                          "--n-gen", str(args.n_gen)], capture_output=True, text=True)
                    flags = ["-ctk", kv, "-ctv", kv, "-fa", fa, "-t", "2"] + ([] if args.isa == "native" else ["--isa", args.isa])
                    if ref.returncode != 0:
                        # a setting llama.cpp refuses (a q8_0 cache on heads not a multiple of
                        # 32) must be refused by xwen too, with an error, not computed
                        mine = subprocess.run([args.xwen, "logits", "-m", gguf, "--ids", "1", "--out", prefix + ".refused.npy"] + flags,
                                              capture_output=True, text=True)
                        both = mine.returncode != 0 and "panicked" not in mine.stderr
                        print(f"{name} {setting}: llama.cpp refuses ({ref.stderr.strip().splitlines()[-2:]}), xwen "
                              + ("refuses too" if both else "DOES NOT"))
                        bad += not both
                        ok_case &= both
                        continue
                    greedy = {}
                    for line in ref.stdout.splitlines():
                        if " greedy:" in line:
                            k, ids = line.split(" greedy:")
                            greedy[int(k[1:])] = [int(x) for x in ids.split()]
                    recs = []
                    for i, ids in enumerate(prompts):
                        ids_arg = ",".join(map(str, ids))
                        out = prefix + f".xwen.p{i}.npy"
                        lx = subprocess.run([args.xwen, "logits", "-m", gguf, "--ids", ids_arg, "--out", out] + flags,
                                            capture_output=True, text=True)
                        if lx.returncode != 0:
                            print(f"{name} {setting} p{i}: xwen logits failed: {lx.stderr.strip()[-400:]}")
                            bad += 1
                            ok_case = False
                            continue
                        (shape, mine), (shape2, theirs) = read_npy(out), read_npy(f"{prefix}.p{i}.npy")
                        first, worst = None, 0.0
                        if shape != shape2:
                            first = f"shape {shape} vs {shape2}"
                        elif mine != theirs:
                            a = struct.unpack(f"<{len(mine) // 4}f", mine)
                            b = struct.unpack(f"<{len(theirs) // 4}f", theirs)
                            for j, (x, y) in enumerate(zip(a, b)):
                                if x != y and not (x != x and y != y):
                                    first = j // n_vocab if first is None else first
                                    worst = max(worst, abs(x - y))
                        run = subprocess.run([args.xwen, "run", "-m", gguf, "--ids", ids_arg, "-n", str(args.n_gen), "--temp", "0",
                                              "--print-ids", "--ignore-eos", "-q"] + flags, capture_output=True, text=True)
                        got = [int(x) for x in run.stdout.split()] if run.returncode == 0 else None
                        same = got == greedy.get(i)
                        ok = first is None and same
                        ok_case &= ok
                        bad += not ok
                        logits = "logits identical" if first is None else f"logits differ from position {first} (max {worst:.3g})"
                        print(f"{name} {setting} p{i} ({len(ids)} tokens): {logits}, greedy {'same' if same else 'DIFFERS'}", flush=True)
                        recs.append({"logits_fnv1a": per_position_hashes(theirs, n_vocab), "greedy": greedy.get(i, [])})
                    case["settings"][setting] = recs
                print(f"  {name}: {geometry}", flush=True)
                if args.record and ok_case:
                    if args.isa == "native":
                        # what the reference's orders depend on: the test runs these records only
                        # on a CPU that has every one of them
                        case["cpu_flags"] = order_flags()
                    manifest = [c for c in manifest if (c["family"], c["seed"], c["mix"]) != (family, seed, mix)]
                    manifest.append(case)
                if not args.keep:
                    for fn in os.listdir(work):
                        if fn.startswith(name + "."):
                            os.remove(os.path.join(work, fn))
    if args.record:
        os.makedirs(os.path.dirname(args.record), exist_ok=True)
        with open(args.record, "w") as f:
            # one case per line: diffs stay readable, the file small
            f.write("[\n" + ",\n".join(json.dumps(c, separators=(",", ":")) for c in manifest) + "\n]\n")
        print(f"recorded {len(manifest)} cases in {os.path.relpath(args.record, REPO)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
