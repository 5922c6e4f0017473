"""Writes a random-weight DFlash sidecar GGUF (llama.cpp arch `dflash`) for a qwen35 target, for
xwen's DFlash parity and drafting tests (`tests/fixtures/dflash/`).

Geometry: the target's width, heads and head size; 2 layers (layer 0 sliding-window 8, layer 1
full, so a prompt past 8 tokens exercises the window), partial rope (half the head), block size
16, taps = target layers 1 and 3 (their inputs: GGUF `target_layers` counts llama.cpp's
t_layer_inp, HF id + 1). No token_embd / output: the drafter shares the target's, as the
released Qwen3.6 sidecars do. The mask token is the target vocabulary's `--mask` id. Matrices
Q8_0 (the target's type, so the oracle's and xwen's products take the same path), norms F32 in
[0.5, 1.5]. The tokenizer metadata is the target's (llama.cpp loads the draft's vocab from it).
Needs gguf-py (the llama.cpp sdist's, on PYTHONPATH) and numpy.

usage: python3 tools/oracle/make_dflash.py TARGET.gguf OUT.gguf [--seed N] [--mask ID]
"""

import argparse

import numpy as np
import gguf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("dst")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--mask", type=int, default=500)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    r = gguf.GGUFReader(a.target)
    arch = r.fields["general.architecture"].contents()
    g = lambda k: r.fields[f"{arch}.{k}"].contents()
    hidden, n_head, n_kv, hd = int(g("embedding_length")), int(g("attention.head_count")), int(g("attention.head_count_kv")), int(g("attention.key_length"))
    n_vocab = len(r.fields["tokenizer.ggml.tokens"].contents())
    taps = [1, 3]
    n_layer, ff, block = 2, 2 * hidden, 16

    w = gguf.GGUFWriter(a.dst, "dflash")
    w.add_name("dflash-fixture")
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd // 2)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_value("dflash.block_size", block, gguf.GGUFValueType.UINT32)
    w.add_key_value("dflash.target_layers", taps, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    w.add_key_value("dflash.attention.sliding_window", 8, gguf.GGUFValueType.UINT32)
    w.add_key_value("dflash.attention.sliding_window_pattern", [True, False], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.BOOL)
    for f in r.fields.values():
        if f.name.startswith("tokenizer."):
            vt = f.types[0]
            sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(f.name, f.contents(), vt, sub_type=sub)
    w.add_key_value("tokenizer.ggml.mask_token_id", a.mask, gguf.GGUFValueType.UINT32)

    q8 = gguf.GGMLQuantizationType.Q8_0
    tensors = []

    def mat(name, rows, cols):
        d = rng.normal(0, 1 / np.sqrt(cols), (rows, cols)).astype(np.float32)
        tensors.append((name, gguf.quants.quantize(d, q8), q8, (rows, cols)))

    def norm(name, n):
        d = rng.uniform(0.5, 1.5, n).astype(np.float32)
        tensors.append((name, d, gguf.GGMLQuantizationType.F32, (n,)))

    mat("fc.weight", hidden, len(taps) * hidden)
    norm("enc.output_norm.weight", hidden)
    norm("output_norm.weight", hidden)
    for il in range(n_layer):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight", hidden)
        mat(p + "attn_q.weight", n_head * hd, hidden)
        mat(p + "attn_k.weight", n_kv * hd, hidden)
        mat(p + "attn_v.weight", n_kv * hd, hidden)
        mat(p + "attn_output.weight", hidden, n_head * hd)
        norm(p + "attn_q_norm.weight", hd)
        norm(p + "attn_k_norm.weight", hd)
        norm(p + "ffn_norm.weight", hidden)
        mat(p + "ffn_gate.weight", ff, hidden)
        mat(p + "ffn_up.weight", ff, hidden)
        mat(p + "ffn_down.weight", hidden, ff)
    for name, d, ty, shape in tensors:
        w.add_tensor(name, d, raw_shape=d.shape, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert n_vocab > a.mask


if __name__ == "__main__":
    main()
