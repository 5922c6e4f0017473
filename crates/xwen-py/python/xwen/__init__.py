"""xwen: run hybrid linear-attention and MoE language models from GGUF files.

    import xwen
    m = xwen.Model()                      # the embedded demo model (tiny-qwen35: writes Python)
    r = m.generate("def fibonacci(n):\\n", max_tokens=32)
    print(r.text, r.tokens, r.finish_reason, r.usage)
    for piece in m.stream("import os\\n", max_tokens=16):
        print(piece.text, end="")
    m.chat([{"role": "user", "content": "def add(a, b):"}], max_tokens=16).content

`Model(path_or_name)` opens a GGUF path or an official checkpoint's name (looked up in the
Hugging Face cache, downloaded on a miss). The engine runs with the GIL released; a model may be
shared between threads (generation on one model takes turns). numpy is optional: `logits`
returns an array when it is installed, lists otherwise.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from ._native import EngineError, InvalidArgument, LoadError, TemplateError, XwenError, __version__
from ._native import Model as _Model

__all__ = [
    "Model", "Completion", "Usage", "Piece", "Stream",
    "XwenError", "InvalidArgument", "LoadError", "TemplateError", "EngineError", "__version__",
]

Prompt = Union[str, Sequence[int]]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    prefill_secs: float
    decode_secs: float


@dataclass(frozen=True)
class Completion:
    """One sequence's result. `tokens` holds every sampled id, an end-of-text id included (as
    `xwen run --print-ids` prints them); `text` leaves out that token's text and a stop string.
    `finish_reason`: "eos", "stop_string", "length", "context_full" or "cancelled". After
    `chat`, `content`, `reasoning` and `tool_calls` (`[{"name", "arguments"}]`) split the reply."""

    text: str
    tokens: list
    finish_reason: str
    stop_string: Optional[str]
    seed: int
    usage: Usage
    content: Optional[str] = None
    reasoning: Optional[str] = None
    tool_calls: list = field(default_factory=list)

    @classmethod
    def _from(cls, d: dict) -> "Completion":
        return cls(
            text=d["text"], tokens=d["tokens"], finish_reason=d["finish_reason"], stop_string=d["stop_string"],
            seed=d["seed"], usage=Usage(**d["usage"]), content=d.get("content"), reasoning=d.get("reasoning"),
            tool_calls=d.get("tool_calls", []),
        )


@dataclass(frozen=True)
class Piece:
    """A streamed event. kind "token": `token` was sampled and the text grew by `text` (None
    token: the text held back until the end); after `chat` also "reasoning", "content" and
    "tool_call" (`text` a JSON object, `call` parsed)."""

    kind: str
    text: str
    token: Optional[int] = None
    index: int = 0

    @property
    def call(self) -> Optional[dict]:
        return json.loads(self.text) if self.kind == "tool_call" else None


class Stream:
    """An iterator of `Piece`s while the engine generates on its own thread; `completion`
    (or `completions` for several prompts) is set once it is exhausted. Leaving the loop early,
    `close()` or dropping it stops the generation."""

    def __init__(self, native, many: bool):
        self._native = native
        self._many = many
        self.completion: Optional[Completion] = None
        self.completions: Optional[list] = None

    def __iter__(self) -> Iterator[Piece]:
        for kind, index, token, text in self._native:
            if kind == "done":
                d = json.loads(text)
                if self._many:
                    self.completions = [Completion._from(c) for c in d]
                else:
                    self.completion = Completion._from(d)
                return
            yield Piece(kind=kind, text=text, token=token, index=index)

    def close(self) -> None:
        self._native.cancel()


def _sampling(max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, stop, ignore_eos) -> dict:
    if isinstance(stop, str):
        stop = [stop]
    return dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                repeat_penalty=repeat_penalty, seed=seed, stop=list(stop) if stop else None, ignore_eos=ignore_eos)


def _callback(on_piece: Optional[Callable[[Piece], Any]]):
    if on_piece is None:
        return None

    def cb(kind, index, token, text):
        r = on_piece(Piece(kind=kind, text=text, token=token, index=index))
        return r is not False  # None (no return) goes on; False stops

    return cb


class Model:
    """A loaded model. `path_or_name` None is the embedded demo model. Options: `threads`,
    `ctx_size` (0: the trained context), `ram_budget` (bytes; 0: automatic; MoE experts then
    stream from disk), `no_mmap`, `kv_type_k` / `kv_type_v` ("f16", "f32", "q8_0"),
    `chat_template` (Jinja source replacing the file's), `parallel` (prompts decoded at once)."""

    def __init__(self, path_or_name: Optional[str] = None, **opts):
        self._m = _Model(path_or_name, **opts)
        self.info: dict = json.loads(self._m.info_json())

    def tokenize(self, text: str, markup: bool = False) -> list:
        """Token ids (no BOS/EOS). As user text special-token spellings stay text; `markup`
        makes them their ids."""
        return self._m.tokenize(text, markup)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._m.detokenize(list(ids))

    def logits(self, ids: Sequence[int], all: bool = False):
        """Float32 logits after `ids` from an empty state: the last position's (shape
        [n_vocab]) or with `all` every position's ([len(ids), n_vocab]); a numpy array when numpy
        is installed, else lists."""
        raw, rows, n_vocab = self._m.logits(list(ids), all)
        try:
            import numpy as np
        except ImportError:
            flat = array("f")
            flat.frombytes(raw)
            out = [flat[i * n_vocab:(i + 1) * n_vocab].tolist() for i in range(rows)]
            return out if all else out[0]
        a = np.frombuffer(raw, dtype="<f4").reshape(rows, n_vocab)
        return a if all else a[0]

    def plan(self) -> dict:
        """The RAM plan (bytes): floor, trunk, state, scratch, expert cache, ..."""
        return json.loads(self._m.plan_json())

    def generate(self, prompt: Prompt, max_tokens: Optional[int] = None, temperature: Optional[float] = None,
                 top_k: Optional[int] = None, top_p: Optional[float] = None, min_p: Optional[float] = None,
                 repeat_penalty: Optional[float] = None, seed: Optional[int] = None,
                 stop: Union[str, Sequence[str], None] = None, ignore_eos: bool = False,
                 on_piece: Optional[Callable[[Piece], Any]] = None) -> Completion:
        """Completes `prompt` (text, or token ids). Sampling left None is the model card's (the
        demo model: greedy); no seed draws one (`Completion.seed` repeats it). `on_piece` sees
        each token; returning False stops."""
        s = _sampling(max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, stop, ignore_eos)
        return Completion._from(json.loads(self._m.run([_prompt(prompt)], callback=_callback(on_piece), **s)))

    def generate_batch(self, prompts: Sequence[Prompt], **kw) -> list:
        """Several prompts decoded together; each gets the tokens it gets alone (prompt i samples
        with the seed plus i). Keywords as `generate` (`on_piece` sees `Piece.index`)."""
        on_piece = kw.pop("on_piece", None)
        s = _sampling(**_defaults(kw))
        return [Completion._from(c) for c in json.loads(self._m.run([_prompt(p) for p in prompts], callback=_callback(on_piece), **s))]

    def stream(self, prompt: Union[Prompt, Sequence[Prompt]], **kw) -> Stream:
        """`generate` as an iterator of `Piece`s (a list of prompts: all of them, by index)."""
        many = isinstance(prompt, (list, tuple)) and len(prompt) > 0 and not isinstance(prompt[0], int)
        prompts = [_prompt(p) for p in prompt] if many else [_prompt(prompt)]
        return Stream(self._m.stream(prompts, **_sampling(**_defaults(kw))), many)

    def chat(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None, thinking: bool = True,
             stream: bool = False, on_piece: Optional[Callable[[Piece], Any]] = None, **kw):
        """A chat turn: OpenAI-style `messages` (and `tools`) through the model's chat template;
        returns a `Completion` with `content`, `reasoning` and `tool_calls`, or with `stream` a
        `Stream` of pieces ("reasoning", "content", "tool_call" besides "token")."""
        s = _sampling(**_defaults(kw))
        args = dict(messages_json=json.dumps(list(messages)), tools_json=json.dumps(list(tools)) if tools else None, thinking=thinking, **s)
        if stream:
            return Stream(self._m.stream(None, **args), False)
        return Completion._from(json.loads(self._m.run(None, callback=_callback(on_piece), **args)))


def _prompt(p: Prompt):
    if isinstance(p, str):
        return p
    return [int(t) for t in p]


def _defaults(kw: dict) -> dict:
    known = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "stop", "ignore_eos")
    unknown = set(kw) - set(known)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
    return {k: kw.get(k, False if k == "ignore_eos" else None) for k in known}
