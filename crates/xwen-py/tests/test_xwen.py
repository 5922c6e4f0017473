"""The Python package on the embedded demo model."""

import json
import threading
import time

import pytest

import xwen

PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def m():
    return xwen.Model()


def test_generate_returns_text_tokens_finish_and_usage(m):
    r = m.generate(PROMPT, max_tokens=24)
    assert r.finish_reason == "length" and len(r.tokens) == 24
    assert r.text == m.detokenize(r.tokens)
    assert r.usage.prompt_tokens == len(m.tokenize(PROMPT)) and r.usage.completion_tokens == 24
    # greedy by default on the demo model, as `xwen run`; token ids as the prompt
    assert m.generate(m.tokenize(PROMPT), max_tokens=24, temperature=0).tokens == r.tokens


def test_streaming_gives_the_same_text_and_can_stop(m):
    full = m.generate(PROMPT, max_tokens=24)
    s = m.stream(PROMPT, max_tokens=24)
    text = "".join(p.text for p in s if p.kind == "token")
    assert text == full.text and s.completion.tokens == full.tokens
    # leaving early stops the engine; the model is free again
    for i, _ in enumerate(m.stream(PROMPT, max_tokens=1000)):
        if i == 2:
            break
    seen = []
    r = m.generate(PROMPT, max_tokens=24, on_piece=lambda p: seen.append(p.token) or len(seen) < 3)
    assert r.finish_reason == "cancelled" and r.tokens == full.tokens[:3]


def test_stop_strings_seeds_and_batches(m):
    full = m.generate(PROMPT, max_tokens=24)
    stop = full.text[10:13]
    r = m.generate(PROMPT, max_tokens=24, stop=stop)
    assert (r.finish_reason, r.stop_string, r.text) == ("stop_string", stop, full.text[: full.text.index(stop)])
    a = m.generate("import ", max_tokens=16, temperature=1.0)
    assert m.generate("import ", max_tokens=16, temperature=1.0, seed=a.seed).tokens == a.tokens
    batch = m.generate_batch([PROMPT, "class Stack:\n"], max_tokens=16)
    assert batch[0].tokens == full.tokens[:16]
    assert batch[1].tokens == m.generate("class Stack:\n", max_tokens=16).tokens
    # streamed together: each piece says its prompt
    s = m.stream([PROMPT, "class Stack:\n"], max_tokens=16)
    texts = ["", ""]
    for p in s:
        texts[p.index] += p.text
    assert texts == [c.text for c in batch] == [c.text for c in s.completions]


def test_chat_through_the_template(m):
    msgs = [{"role": "user", "content": "def add(a, b):"}]
    r = m.chat(msgs, max_tokens=12)
    assert len(r.tokens) == 12 and r.content is not None and r.tool_calls == []
    s = m.chat(msgs, max_tokens=12, stream=True)
    content = "".join(p.text for p in s if p.kind == "content")
    assert content == r.content == s.completion.content
    with pytest.raises(xwen.InvalidArgument):
        m.chat([{"role": "robot", "content": "x"}])


def test_tokens_logits_and_plan(m):
    ids = m.tokenize("def f(x):\n    return x\n")
    assert m.detokenize(ids) == "def f(x):\n    return x\n"
    assert m.tokenize("<|endoftext|>", markup=True) == m.info["eos_ids"][:1]
    last = m.logits(ids)
    n_vocab = m.info["n_vocab"]
    assert len(last) == n_vocab
    best = max(range(n_vocab), key=lambda i: last[i])
    assert m.generate(ids, max_tokens=1).tokens == [best]
    rows = m.logits(ids, all=True)
    assert len(rows) == len(ids) and len(rows[0]) == n_vocab
    plan = m.plan()
    assert plan["trunk_bytes"] > 0 and plan["max_ctx"] == m.info["context"]


def test_errors_are_exceptions(m):
    with pytest.raises(xwen.InvalidArgument):
        m.generate("")
    with pytest.raises(xwen.InvalidArgument):
        m.detokenize([1 << 31])
    with pytest.raises(xwen.LoadError):
        xwen.Model("/nonexistent/model.gguf")
    with pytest.raises(TypeError):
        m.stream(PROMPT, nonsense=1)
    # a callback's exception comes back out
    def boom(p):
        raise RuntimeError("from the callback")
    with pytest.raises(RuntimeError, match="from the callback"):
        m.generate(PROMPT, max_tokens=4, on_piece=boom)


def test_the_gil_is_released_while_the_engine_runs(m):
    # a Python thread keeps running while another generates: it ticks inside the generation's
    # window (holding the GIL, the engine would leave it no tick there)
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            stop.wait(0.001)

    t = threading.Thread(target=tick)
    t.start()
    start = time.monotonic()
    r = m.generate(PROMPT, max_tokens=1500, ignore_eos=True)
    end = time.monotonic()
    stop.set()
    t.join()
    assert len(r.tokens) == 1500
    assert sum(start < x < end for x in ticks) >= 3, (end - start, len(ticks))


def test_numpy_logits_when_numpy_is_there(m):
    np = pytest.importorskip("numpy")
    a = m.logits(m.tokenize("import os\n"), all=True)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape[1] == m.info["n_vocab"]
