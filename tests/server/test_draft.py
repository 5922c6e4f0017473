"""`xwen serve --draft ngram`: prompt-lookup drafting in the slots leaves every greedy reply as
it is without drafting (the shared server has none), streamed or not, several at once."""

import concurrent.futures

import pytest

from conftest import Server

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\nimport os\n", "class Stack:\n    def push(self, x):\n"]


@pytest.fixture(scope="module")
def drafted():
    s = Server("-np", "2", "-c", "2048", "--draft", "ngram", "--draft-max", "6")
    yield s
    assert s.stop() == 0


def reply(url, prompt, stream=False):
    import openai

    c = openai.OpenAI(base_url=url + "/v1", api_key="none")
    kw = dict(model="tiny-qwen35", messages=[{"role": "user", "content": prompt}], max_tokens=64, temperature=0,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    if not stream:
        return c.chat.completions.create(**kw).choices[0].message.content
    return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(stream=True, **kw) if ch.choices)


def test_drafted_replies_equal_plain_ones(server, drafted):
    for p in PROMPTS:
        want = reply(server.url, p)
        assert reply(drafted.url, p) == want
        assert reply(drafted.url, p, stream=True) == want


def test_drafted_replies_at_once(server, drafted):
    want = [reply(server.url, p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda p: reply(drafted.url, p), PROMPTS * 2))
    assert got == want * 2


def test_metrics_count_drafts(drafted):
    import httpx

    reply(drafted.url, "import os\nimport sys\nimport os\nimport sys\n")
    text = httpx.get(drafted.url + "/metrics").text
    vals = {}
    for line in text.splitlines():
        if line.startswith("xwen_draft_tokens"):
            name, v = line.split()
            vals[name] = float(v)
    assert vals.get("xwen_draft_tokens_total", 0) > 0, text
    assert 0 <= vals.get("xwen_draft_tokens_accepted_total", 0) <= vals["xwen_draft_tokens_total"]
