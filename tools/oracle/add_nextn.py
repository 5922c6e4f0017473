"""Gives a qwen35 / qwen35moe GGUF a random MTP (nextn) block, for MTP parity on geometries
whose fixtures were converted without one (the MoE: `tests/fixtures/mtp/cond-qwen35moe`).

The new block `blk.{n_layer}` is the trunk's first full-attention layer with every matrix's rows
reversed (and an MoE's experts in reverse order), its norms scaled — so a loader reading the
wrong block shows — plus `nextn.eh_proj` (F32, N(0, 1/sqrt(2·hidden))), `nextn.enorm` and
`nextn.hnorm` (F32 in [0.5, 1.5]). block_count grows by one, `nextn_predict_layers` = 1, the
recurrent-layer flags gain a `false`. Needs gguf-py (the llama.cpp sdist's, on PYTHONPATH) and
numpy.

With --sidecar OUT is an MTP-only GGUF instead (llama.cpp's `convert_hf_to_gguf.py --mtp`
layout: the metadata, token_embd, output_norm, output and the nextn block, no trunk layers).

usage: python3 tools/oracle/add_nextn.py IN.gguf OUT.gguf [--seed N] [--sidecar]
"""

import argparse

import numpy as np
import gguf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sidecar", action="store_true", help="write the MTP block alone (with the embeddings and the head)")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    r = gguf.GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    n_layer = int(r.fields[f"{arch}.block_count"].contents())
    rec = r.fields[f"{arch}.attention.recurrent_layers"].contents()
    full = next(i for i, x in enumerate(rec) if not x)
    hidden = int(r.fields[f"{arch}.embedding_length"].contents())

    w = gguf.GGUFWriter(a.dst, arch)
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        val = f.contents()
        if f.name == f"{arch}.block_count":
            val = n_layer + 1
        elif f.name == f"{arch}.attention.recurrent_layers":
            val = list(val) + [False]
        w.add_key_value(f.name, val, vt, sub_type=sub)
    w.add_key_value(f"{arch}.nextn_predict_layers", 1, gguf.GGUFValueType.UINT32)

    tensors = [(t.name, t.data, t.tensor_type) for t in r.tensors if not (a.sidecar and t.name.startswith("blk."))]
    pre = f"blk.{full}."
    for t in r.tensors:
        if not t.name.startswith(pre):
            continue
        name = f"blk.{n_layer}." + t.name[len(pre):]
        d = np.array(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.F32 and d.ndim == 1:
            d = (d * rng.uniform(0.6, 1.4, d.shape)).astype(np.float32)
        elif d.ndim == 3:  # an expert stack: experts reversed, rows reversed
            d = d[::-1, ::-1].copy()
        else:  # rows reversed (a quantized row is a row of blocks: row order is safe to permute)
            d = d[::-1].copy()
        tensors.append((name, d, t.tensor_type))
    f32 = gguf.GGMLQuantizationType.F32
    tensors.append((f"blk.{n_layer}.nextn.eh_proj.weight", rng.normal(0, 1 / np.sqrt(2 * hidden), (hidden, 2 * hidden)).astype(np.float32), f32))
    tensors.append((f"blk.{n_layer}.nextn.enorm.weight", rng.uniform(0.5, 1.5, hidden).astype(np.float32), f32))
    tensors.append((f"blk.{n_layer}.nextn.hnorm.weight", rng.uniform(0.5, 1.5, hidden).astype(np.float32), f32))
    for name, d, ty in tensors:
        w.add_tensor_info(name, d.shape, d.dtype, d.nbytes, ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, d, _ in tensors:
        w.write_tensor_data(d)
    w.close()


if __name__ == "__main__":
    main()
