#!/usr/bin/env python3
"""Expected token ids for the tiny Qwen3.5 test model's tokenizer, from Hugging Face `tokenizers`.

The tiny model's GGUF (../shared/models/gguf/tiny-qwen35-q8_0.gguf) was converted from
../shared/models/tiny-qwen35/tokenizer.json, so that file is an independent oracle for xwen's
GGUF-built tokenizer. For every text two encodings are recorded:

  markup   special tokens in the text map to their ids (HF default; xwen `encode_markup`)
  content  special tokens are tokenized as plain text (HF `encode_special_tokens = True`;
           xwen `encode`)

usage (from the repo root, with `pip install tokenizers`):
  python3 tools/chat/make_tokenizer_vectors.py \
      [../shared/models/tiny-qwen35/tokenizer.json] > tests/fixtures/tokenizer/tiny-qwen35.json
"""
import json
import random
import sys

from tokenizers import Tokenizer

HANDWRITTEN = [
    "",
    " ",
    "\n",
    "   \n\n\t  x",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "import os\n\nclass Foo(object):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, *args, **kw):\n        self._x = {'a': [1, 2, 3]}  # comment\n",
    "if __name__ == '__main__':\n\tmain()\r\n",
    "x = 1234567890 + 3.14159e-10 - 0x1F_FF",
    "I'm sure they'll've done it; we'd ... IT'S DONE'S",
    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "Ünïcödé façade naïve résumé Ångström — “quotes” ‘single’ …",
    "e\u0301 a\u0300\u0301 \u0915\u094d\u0937 \u0e01\u0e34",
    "Vieết Nam ﬁ ﬂ",
    "\u3000full\u3000width\u3000spaces\u00a0nbsp\u2003em",
    "tabs\t\t\tand\u000bvertical\u000cfeed",
    "trailing spaces    ",
    "    leading spaces",
    "!!!!!! ??? ... ---- ==== //// \\\\ ~~~",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "user typed <|im_start|>system and <|im_end|> and <|endoftext|> here",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
    "<|im_start|><|im_start|><|im_end|>x<|endoftext|>",
    "<|im_start",
    "almost <|im_end| special",
    "\x00\x01\x7f control chars",
    "ሰላም ዓለም Привет мир مرحبا بالعالم שלום עולם",
    "𝓗𝓮𝓵𝓵𝓸 𝟙𝟚𝟛 ①②③ ٠١٢٣ ½ ²",
]

# Random strings over a pool that exercises every branch of the pre-tokenizer.
POOL = (
    list("abcXYZ019_'\"()[]{}<>:;.,!?-+*/=#@$%^&|~`\\")
    + [" ", "  ", "\n", "\r\n", "\t", "\u3000", "\u00a0", "\u2003"]
    + ["'s", "'LL", "'re", "'d"]
    + ["é", "e\u0301", "\u0300", "ß", "Ω", "ж", "ع", "א", "ক্ষ", "ก"]
    + ["中", "文", "日", "本", "한", "ア", "ー"]
    + ["😀", "👍🏽", "‍", "🏳️‍🌈", "✅", "€", "°", "—", "…"]
    + ["٣", "½", "①", "𝟙"]
    + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>"]
    + ["def ", "return ", "self.", "    ", "        "]
)


def random_texts(n: int) -> list:
    rng = random.Random(20240611)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "../shared/models/tiny-qwen35/tokenizer.json"
    tok = Tokenizer.from_file(path)
    cases = []
    for text in HANDWRITTEN + random_texts(300):
        tok.encode_special_tokens = False
        markup = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        content = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "markup": markup, "content": content})
    json.dump({"source": "tiny-qwen35/tokenizer.json via HF tokenizers", "cases": cases},
              sys.stdout, ensure_ascii=True, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
