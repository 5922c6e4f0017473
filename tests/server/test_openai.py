"""The OpenAI SDK against `xwen serve`: chat (streamed and not), completions, reasoning on and
off, logprobs, usage with cached tokens, stop strings."""

import json

import httpx

MSG = [{"role": "user", "content": "def fibonacci(n):"}]


def chat(oa, **kw):
    kw.setdefault("messages", MSG)
    kw.setdefault("model", "tiny-qwen35")
    kw.setdefault("temperature", 0)
    return oa.chat.completions.create(**kw)


def test_models_lists_the_model_once(oa):
    ids = [m.id for m in oa.models.list().data]
    assert ids == ["tiny-qwen35"]
    assert oa.models.retrieve("tiny-qwen35").id == "tiny-qwen35"


def test_chat_stream_equals_non_stream(oa):
    for thinking in (True, False):
        kw = dict(max_tokens=24, extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
        full = chat(oa, **kw)
        c = full.choices[0]
        assert c.finish_reason in ("length", "stop")
        assert full.usage.completion_tokens <= 24 and full.usage.prompt_tokens > 0
        content, reasoning, finish, usage = "", "", None, None
        for ch in chat(oa, stream=True, stream_options={"include_usage": True}, **kw):
            if ch.usage:
                usage = ch.usage
            for d in ch.choices:
                content += d.delta.content or ""
                reasoning += getattr(d.delta, "reasoning_content", None) or ""
                finish = d.finish_reason or finish
        assert content == (c.message.content or "")
        assert reasoning == (getattr(c.message, "reasoning_content", None) or "")
        assert finish == c.finish_reason
        assert usage.completion_tokens == full.usage.completion_tokens
        if thinking:
            # the template opens <think>: the reply starts as reasoning
            assert reasoning, "thinking on gives reasoning_content"
        else:
            assert not reasoning, "thinking off gives no reasoning"


def test_reasoning_effort_none_turns_thinking_off(oa):
    r = chat(oa, max_tokens=8, reasoning_effort="none")
    assert not getattr(r.choices[0].message, "reasoning_content", None)


def test_second_turn_reuses_the_first(oa, server):
    kw = dict(max_tokens=12, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    msgs = [{"role": "user", "content": "class Stack:"}]
    r1 = chat(oa, messages=msgs, **kw)
    # the message boundary: where the next turn's rendering departs from this prompt (the
    # template renders the reply's turn without the generation prompt's empty think block)
    boundary = httpx.post(server.url + "/apply-template", json={"messages": msgs, **kw["extra_body"]}).json()["boundary"]
    assert 0 < boundary <= r1.usage.prompt_tokens
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "def push(self, x):"}]
    r2 = chat(oa, messages=msgs, **kw)
    # every token the two renderings share is reused: none of the first turn is computed again
    assert r2.usage.prompt_tokens_details.cached_tokens == boundary
    # and the same request again is served from the cache up to its last token
    r3 = chat(oa, messages=msgs, **kw)
    assert r3.usage.prompt_tokens_details.cached_tokens == r3.usage.prompt_tokens - 1
    assert r3.choices[0].message.content == r2.choices[0].message.content


def test_logprobs(oa):
    r = chat(oa, max_tokens=6, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for e in lp:
        assert e.logprob <= 0
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        # greedy: the sampled token is the most likely one
        assert abs(e.logprob - tops[0]) < 1e-5


def test_stop_strings_cut_the_reply(oa):
    free = chat(oa, max_tokens=24, extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0].message.content
    assert len(free) > 4
    stop = free[2:5]
    r = chat(oa, max_tokens=24, stop=[stop], extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == free[: free.index(stop)].strip()
    assert r.choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(oa):
    a = chat(oa, max_tokens=16, temperature=1.0, seed=7).choices[0].message
    b = chat(oa, max_tokens=16, temperature=1.0, seed=7).choices[0].message
    assert (a.content, a.reasoning_content) == (b.content, b.reasoning_content)


def test_completions(oa):
    r = oa.completions.create(model="tiny-qwen35", prompt="import os\n", max_tokens=10, temperature=0, logprobs=2)
    c = r.choices[0]
    assert c.text and c.finish_reason == "length" and r.usage.completion_tokens == 10
    assert len(c.logprobs.tokens) == 10 and len(c.logprobs.top_logprobs[0]) == 2
    streamed = "".join(ch.choices[0].text for ch in oa.completions.create(model="tiny-qwen35", prompt="import os\n", max_tokens=10, temperature=0, stream=True) if ch.choices)
    assert streamed == c.text


def test_tokenize_roundtrip(server):
    t = httpx.post(server.url + "/tokenize", json={"content": "def f(x): return x"}).json()["tokens"]
    assert t and all(isinstance(i, int) for i in t)
    assert httpx.post(server.url + "/detokenize", json={"tokens": t}).json()["content"] == "def f(x): return x"


def test_small_routes(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    props = httpx.get(server.url + "/props").json()
    assert props["total_slots"] == 4 and props["n_ctx"] == 4096
    doc = httpx.get(server.url + "/openapi.json").json()
    assert "/v1/chat/completions" in doc["paths"] and "/v1/messages" in doc["paths"]
    m = httpx.get(server.url + "/metrics").text
    for name in ["xwen_requests_total", "xwen_prompt_tokens_total", "xwen_generated_tokens_total", "xwen_queue_depth", "xwen_batch_size", "xwen_prefix_cache_hit_rate", "xwen_tokens_per_second", "xwen_engine_forward_seconds_total", "xwen_engine_checkpoint_seconds_total", "xwen_engine_prompt_steps_total", "xwen_engine_prompt_spans_total"]:
        assert name in m, name
