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


FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures"


def complete(url, prompt, stream=False):
    import httpx

    body = {"prompt": prompt, "max_tokens": 48, "temperature": 0}
    if not stream:
        return httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ch = __import__("json").loads(line[6:])["choices"]
                text += ch[0]["text"] if ch else ""
    return text


def test_mtp_drafted_replies_equal_plain_ones():
    """`--draft mtp -md SIDECAR`: an MoE model's MTP head from a sidecar GGUF drafts in the slots;
    every greedy reply is the undrafted server's, one at a time and several at once."""
    moe = str(FIXTURES / "parity/cond/qwen3_5_moe/model-q8_0.gguf")
    side = str(FIXTURES / "mtp/cond-qwen35moe/mtp-q8_0.gguf")
    plain = Server("-m", moe, "-np", "2", "-c", "1024")
    mtp = Server("-m", moe, "-md", side, "--draft", "mtp", "--draft-max", "4", "-np", "2", "-c", "1024")
    try:
        want = [complete(plain.url, p) for p in PROMPTS]
        assert [complete(mtp.url, p) for p in PROMPTS] == want
        assert [complete(mtp.url, p, stream=True) for p in PROMPTS] == want
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            assert list(ex.map(lambda p: complete(mtp.url, p), PROMPTS * 2)) == want * 2
        import httpx

        drafted = [l for l in httpx.get(mtp.url + "/metrics").text.splitlines() if l.startswith("xwen_draft_tokens_total")]
        assert drafted and float(drafted[0].split()[1]) > 0, drafted
    finally:
        assert plain.stop() == 0
        assert mtp.stop() == 0


def test_mtp_without_a_head_is_refused():
    import subprocess

    from conftest import binary

    r = subprocess.run([binary(), "serve", "--port", "0", "--draft", "mtp"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "no MTP head" in r.stderr, r.stderr


def metric_values(url, name):
    """`name`'s samples on /metrics: {labels or "": value}."""
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            key, v = line.rsplit(" ", 1)
            out[key[len(name):]] = float(v)
    return out


def test_a_draft_model_in_the_slots_leaves_replies_as_they_are():
    """`--draft model:FILE`: the dense fixture (same tokenizer) drafts for the MoE one in every
    slot; greedy replies are the undrafted server's, one at a time, streamed, several at once,
    and a slot's next request (its drafter kept with its session) too. /metrics counts drafts per
    position as llama-server's spec_decode_num_accepted_tokens_per_pos_total."""
    moe = str(FIXTURES / "parity/cond/qwen3_5_moe/model-q8_0.gguf")
    dense = str(FIXTURES / "parity/cond/qwen3_5/model-q8_0.gguf")
    plain = Server("-m", moe, "-np", "2", "-c", "1024")
    drafted = Server("-m", moe, "--draft", "model:" + dense, "--draft-max", "4", "--draft-p-min", "0", "-np", "2", "-c", "1024")
    try:
        want = [complete(plain.url, p) for p in PROMPTS]
        assert [complete(drafted.url, p) for p in PROMPTS] == want
        assert [complete(drafted.url, p, stream=True) for p in PROMPTS] == want
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            assert list(ex.map(lambda p: complete(drafted.url, p), PROMPTS * 2)) == want * 2
        # a continuation of an earlier prompt lands on that slot, drafter and all
        longer = PROMPTS[0] + want[0]
        assert complete(drafted.url, longer) == complete(plain.url, longer)

        total = metric_values(drafted.url, "xwen_draft_tokens_total")[""]
        accepted = metric_values(drafted.url, "xwen_draft_tokens_accepted_total")[""]
        steps = metric_values(drafted.url, "xwen_spec_decode_verify_steps_total")[""]
        by_pos = metric_values(drafted.url, "xwen_spec_decode_num_accepted_tokens_per_pos_total")
        drafted_at = metric_values(drafted.url, "xwen_spec_decode_num_drafted_tokens_per_pos_total")
        assert total > 0 and steps > 0 and 0 <= accepted <= total
        assert drafted_at['{position="0"}'] == steps, drafted_at
        assert sum(drafted_at.values()) == total and sum(by_pos.values()) == accepted
        acc = [by_pos.get('{position="%d"}' % i, 0) for i in range(len(drafted_at))]
        assert acc == sorted(acc, reverse=True), acc
        assert all(by_pos[k] <= drafted_at[k] for k in by_pos)
    finally:
        assert plain.stop() == 0
        assert drafted.stop() == 0


def test_bad_draft_specs_are_refused():
    import subprocess

    from conftest import binary

    for args, says in [
        (["--draft", "model"], "needs a draft model"),
        (["--draft", "model:"], "give the file"),
        (["--draft", "ngram:x"], "takes no file"),
        (["--draft", "dflash"], "needs its sidecar GGUF"),
        (["--draft", "dspark"], "unknown drafter"),
        (["--draft", "model:a.gguf", "-md", "b.gguf"], "two files"),
        (["--draft", "model:no-such-file.gguf"], "no-such-file.gguf"),
        (["--draft", "contrary"], "benchmark of a drafter that is never right"),
    ]:
        r = subprocess.run([binary(), "serve", "--port", "0", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, args
        assert says in r.stderr, (args, r.stderr)
