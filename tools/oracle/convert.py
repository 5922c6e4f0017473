"""Runs llama.cpp's own convert_hf_to_gguf.py with tokenizer.ggml.pre forced.

The converter identifies a BPE pre-tokenizer by hashing the ids of a probe string; the
fixture tokenizer is a cut-down copy of a trained one, so no hash matches. Its pre-tokenizer
regex is Qwen3.5's, so the pre name is forced (default qwen35) instead of letting the
converter refuse. Everything else is the unmodified converter.

usage: LLAMA_CPP_DIR=... python3 convert.py [--force-pre NAME] <convert_hf_to_gguf args...>
"""
import os
import sys
from pathlib import Path


def main() -> None:
    argv = sys.argv[1:]
    pre = "qwen35"
    if argv[:1] == ["--force-pre"]:
        pre, argv = argv[1], argv[2:]
    root = Path(os.environ["LLAMA_CPP_DIR"])
    sys.path.insert(0, str(root / "gguf-py"))
    sys.path.insert(0, str(root))
    import conversion.base as base  # the converter's own package

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    import convert_hf_to_gguf

    sys.argv = [str(root / "convert_hf_to_gguf.py")] + argv
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
