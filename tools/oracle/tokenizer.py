"""A small real tokenizer for the random-weight fixtures.

The trained test models' byte-level BPE (vocab 4096, Qwen3.5 pre-tokenizer) is cut down to
`n_vocab` ids: the 256 byte tokens, the first merges (in this tokenizer merge i produces id
256 + i, so a prefix of the merge list is closed under itself), then the 7 special tokens
renumbered to the end. The result is a genuine, self-consistent BPE with a vocab small enough
that embeddings and logit fixtures stay small.
"""
import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
            "<tool_call>", "</tool_call>"]


def truncate(src: dict, n_vocab: int) -> dict:
    model = src["model"]
    vocab = model["vocab"]
    merges = model["merges"]
    n_plain = n_vocab - len(SPECIALS)
    n_merges = n_plain - 256
    if n_merges < 0 or n_merges > len(merges):
        raise ValueError(f"n_vocab {n_vocab} out of range")
    for i, m in enumerate(merges[:n_merges]):
        a, b = m if isinstance(m, list) else m.split(" ")
        if vocab.get(a + b) != 256 + i:
            raise ValueError("source tokenizer does not number merges in order; cannot truncate")
    out = json.loads(json.dumps(src))
    out["model"]["vocab"] = {tok: i for tok, i in vocab.items() if i < n_plain}
    out["model"]["merges"] = merges[:n_merges]
    by_content = {a["content"]: a for a in src["added_tokens"]}
    out["added_tokens"] = []
    for j, name in enumerate(SPECIALS):
        entry = dict(by_content[name])
        entry["id"] = n_plain + j
        out["added_tokens"].append(entry)
    return out


def write_tokenizer(src_dir: Path, dst_dir: Path, n_vocab: int) -> None:
    src = json.loads((src_dir / "tokenizer.json").read_text())
    dst_dir.mkdir(parents=True, exist_ok=True)
    (dst_dir / "tokenizer.json").write_text(json.dumps(truncate(src, n_vocab), ensure_ascii=False))
    cfg = json.loads((src_dir / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 4096
    (dst_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def special_id(n_vocab: int, name: str) -> int:
    return n_vocab - len(SPECIALS) + SPECIALS.index(name)
