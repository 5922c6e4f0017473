#!/usr/bin/env python3
"""Copies a vocab-only GGUF with `tokenizer.ggml.pre` replaced, so llama.cpp can be asked how a
pre-tokenizer splits text over a vocabulary no published file pairs it with (the kimi-k2 split
over Qwen3.5's BPE: tools/oracle/vocab_refs.sh).

usage: LLAMA_CPP_DIR=... python3 vocab_with_pre.py IN.gguf OUT.gguf PRE
"""
import os
import sys
from pathlib import Path


def main() -> None:
    src, dst, pre = sys.argv[1], sys.argv[2], sys.argv[3]
    sys.path.insert(0, str(Path(os.environ["LLAMA_CPP_DIR"]) / "gguf-py"))
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    for field in r.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        value = pre if field.name == "tokenizer.ggml.pre" else field.contents()
        w.add_key_value(field.name, value, vt, sub_type=sub)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()


if __name__ == "__main__":
    main()
