#!/usr/bin/env python3
"""Test vectors for crates/xwen-kernels from llama.cpp's gguf-py (numpy reference code).

For each format: random blocks (random bytes, scale fields set to finite halves) and their
dequantization by gguf.quants; where gguf-py has a quantizer, a random f32 input and its
quantization. Written as crates/xwen-kernels/tests/vectors/gguf_<TYPE>.bin:
  b"XWKV" u32 ggml_type_id u32 n_elements, then tagged sections (4-byte tag, u32 length, bytes):
  QRND random blocks, DQPY gguf-py dequant (f32), INPY quantizer input (f32), QUPY its output.

Usage: PYTHONPATH=<llama.cpp>/gguf-py python3 tools/kernels/make_vectors.py [OUTDIR]
The companion tools/kernels/make_vectors.sh adds ggml_<TYPE>.bin from llama.cpp's C library.
"""
import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

# (type, byte offsets of f16 scale fields inside one block)
FORMATS = [
    (T.F16, None), (T.BF16, None), (T.Q4_0, [0]), (T.Q4_1, [0, 2]), (T.Q5_0, [0]), (T.Q5_1, [0, 2]),
    (T.Q8_0, [0]), (T.Q2_K, [80, 82]), (T.Q3_K, [108]), (T.Q4_K, [0, 2]), (T.Q5_K, [0, 2]),
    (T.Q6_K, [208]), (T.IQ4_NL, [0]), (T.IQ4_XS, [0]),
]
N = 1024


def random_blocks(rng, qtype, f16_offsets):
    block, size = quants.GGML_QUANT_SIZES[qtype]
    n_blocks = N // block
    if qtype == T.F16:
        return rng.standard_normal(N).astype(np.float16).view(np.uint8)
    if qtype == T.BF16:
        bits = (rng.standard_normal(N).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in f16_offsets:
        # magnitudes from 2^-20 (subnormal halves included) to 2^4, both signs
        scale = (rng.standard_normal(n_blocks) * np.exp2(rng.uniform(-20, 4, n_blocks))).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def section(tag, data):
    data = bytes(data)
    return tag + struct.pack("<I", len(data)) + data


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../crates/xwen-kernels/tests/vectors")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20260501)
    for qtype, offs in FORMATS:
        raw = random_blocks(rng, qtype, offs)
        deq = quants.dequantize(raw, qtype).astype(np.float32).reshape(-1)
        body = section(b"QRND", raw.tobytes()) + section(b"DQPY", deq.tobytes())
        x = (rng.standard_normal(N) * np.exp2(rng.uniform(-8, 8, N))).astype(np.float32)
        try:
            q = quants.quantize(x.reshape(1, -1), qtype).reshape(-1)
            body += section(b"INPY", x.tobytes()) + section(b"QUPY", q.tobytes())
        except NotImplementedError:
            pass
        path = os.path.join(out, f"gguf_{qtype.name}.bin")
        with open(path, "wb") as f:
            f.write(b"XWKV" + struct.pack("<II", int(qtype), N) + body)
        print(path)


if __name__ == "__main__":
    main()
