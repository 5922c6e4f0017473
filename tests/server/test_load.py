"""32 concurrent streaming clients on loopback: no errors, and each greedy reply equals the same
request served alone (the engine's batch invariance, through continuous batching)."""

import concurrent.futures as cf

import openai


PROMPTS = ["def add(a, b):", "import os\n", "class Node:", "for i in range(10):", "def main():", "# sort a list", "with open(path) as f:", "try:"]


def one(url, i):
    oa = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + f" # {i}"}]
    kw = dict(model="tiny-qwen35", messages=msgs, max_tokens=24, temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": i % 2 == 0}})
    out = ""
    for ch in oa.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            out += (c.delta.content or "") + (getattr(c.delta, "reasoning_content", None) or "")
    return kw, out


def test_32_concurrent_streams_equal_alone(server, oa):
    with cf.ThreadPoolExecutor(32) as ex:
        results = list(ex.map(lambda i: one(server.url, i), range(32)))
    for kw, out in results:
        alone = oa.chat.completions.create(**kw).choices[0].message
        assert out == (alone.content or "") + (getattr(alone, "reasoning_content", None) or ""), kw["messages"]
