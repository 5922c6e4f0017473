"""Runs llama.cpp's own convert_hf_to_gguf.py with tokenizer.ggml.pre forced.

The converter identifies a BPE pre-tokenizer by hashing the ids of a probe string; the
fixture tokenizer is a cut-down copy of a trained one, so no hash matches. Its pre-tokenizer
regex is Qwen3.5's, so the pre name is forced (default qwen35) instead of letting the
converter refuse.

Qwen4Exp (qwen4exp): the converter loads config.json through transformers' AutoConfig, and
transformers 5.23's Qwen4ExpTextConfig renames the "full_attention" layer types to
"indexed_attention" on load; conversion/qwen4exp.py writes a QSA compress ratio only where it
reads "full_attention", so every QSA layer would convert as dense attention (compress_ratios all
0). The hparams are given back their on-disk names. Everything else is the unmodified converter.

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
    load = base.ModelBase.load_hparams

    def load_hparams(dir_model, is_mistral_format, guess=True):
        config = load(dir_model, is_mistral_format, guess)
        for c in (config, config.get("text_config") or {}):
            lt = c.get("layer_types")
            if str(c.get("model_type", "")).startswith("qwen4_exp") and lt:
                c["layer_types"] = ["full_attention" if t == "indexed_attention" else t for t in lt]
        return config

    base.ModelBase.load_hparams = staticmethod(load_hparams)
    import convert_hf_to_gguf

    sys.argv = [str(root / "convert_hf_to_gguf.py")] + argv
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
