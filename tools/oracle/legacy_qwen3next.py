#!/usr/bin/env python3
"""Rewrites a qwen3next GGUF into the legacy layout of the first Qwen3-Next conversions.

Early llama.cpp converters wrote each Gated DeltaNet layer's input projection as one fused
`blk.N.ssm_in.weight` in the checkpoint's own order — per K-head [q | k | v·r | z·r] — where the
current converter writes `attn_qkv` (q of every head, then k, then v) and `attn_gate` (z).
llama.cpp b11434 still loads both (qwen3next.cpp `build_qkvz`, "legacy (slower) path"), and
GGUFs of that layout are in circulation, so xwen runs both; this makes the legacy file from a
current one (unquantized tensors only: F32/F16 rows are permuted as numbers) so the oracle can
hold the two paths equal.

usage: LLAMA_CPP_DIR=... python3 legacy_qwen3next.py IN.gguf OUT.gguf
"""
import os
import sys
from pathlib import Path

import numpy as np


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    sys.path.insert(0, str(Path(os.environ["LLAMA_CPP_DIR"]) / "gguf-py"))
    import gguf

    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    assert arch == "qwen3next", arch
    u = lambda k: int(r.fields[f"{arch}.{k}"].contents())  # noqa: E731
    hk, nk, nv = u("ssm.state_size"), u("ssm.group_count"), u("ssm.time_step_rank")
    hv = u("ssm.inner_size") // nv
    ratio = nv // nk
    tensors = {t.name: t for t in r.tensors}

    w = gguf.GGUFWriter(dst, arch)
    for field in r.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vt, sub_type=sub)

    out = []  # (name, array, type)
    for t in r.tensors:
        if t.name.endswith(".attn_gate.weight"):
            continue  # folded into ssm_in with its layer's attn_qkv
        if t.name.endswith(".attn_qkv.weight") and t.name.replace("attn_qkv", "attn_gate") in tensors:
            gate = tensors[t.name.replace("attn_qkv", "attn_gate")]
            assert t.tensor_type == gate.tensor_type and t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
            qkv, z = np.asarray(t.data), np.asarray(gate.data)  # [rows][n_embd]
            q, k, v = qkv[:nk * hk], qkv[nk * hk:2 * nk * hk], qkv[2 * nk * hk:]
            parts = []
            for h in range(nk):
                parts += [q[h * hk:(h + 1) * hk], k[h * hk:(h + 1) * hk],
                          v[h * ratio * hv:(h + 1) * ratio * hv], z[h * ratio * hv:(h + 1) * ratio * hv]]
            out.append((t.name.replace("attn_qkv", "ssm_in"), np.ascontiguousarray(np.concatenate(parts)), t.tensor_type))
        else:
            out.append((t.name, np.asarray(t.data), t.tensor_type))
    for name, a, ty in out:
        w.add_tensor_info(name, a.shape, a.dtype, a.nbytes, ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, a, _ in out:
        w.write_tensor_data(a, tensor_endianess=r.endianess)
    w.close()


if __name__ == "__main__":
    main()
