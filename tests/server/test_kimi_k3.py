"""A Kimi K3 model (the tiny K3 parity fixture, converted by llama.cpp's converter with its
Kimi-K3.jinja) served with its own template: forced tool calls come out in K3's XTML call
markup and parse into calls of the tool's schema, in both dialects; the request's reasoning
effort and tool choice reach the template as K3 reads them (`thinking_effort`, `tool_choice`).
The fixture's 512-token vocabulary spells K3's markers as text, so a call is ~150 tokens here
(one token per marker with K3's own vocabulary: the grammar takes the marker token where the
vocabulary has one, unit test `structured::tests`)."""

import json
import os
import urllib.request

import pytest

from conftest import ROOT, Server

MODEL = os.path.join(ROOT, "tests", "fixtures", "parity", "cond", "kimi_k3", "model-q8_0.gguf")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city", "days"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def k3():
    s = Server("-m", MODEL, "--alias", "tiny-k3", "-np", "2", "-c", "2048", template=None)
    yield s
    assert s.stop() == 0


def post(server, path, body):
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def valid_args(args):
    assert set(args) == {"city", "days"}, args
    assert isinstance(args["city"], str) and len(args["city"]) <= 16
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 9


def test_forced_call_in_xtml_parses_into_a_call(k3):
    import openai

    oa = openai.OpenAI(base_url=k3.url + "/v1", api_key="none", max_retries=0)
    r = oa.chat.completions.create(model="tiny-k3", messages=[{"role": "user", "content": "weather in Paris?"}], tools=TOOLS,
                                   tool_choice="required", max_tokens=400, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    call = c.message.tool_calls[0]
    assert call.function.name == "get_weather"
    valid_args(json.loads(call.function.arguments))
    assert not c.message.content
    # the same call streamed (sampled, so another path through the grammar)
    name, args = None, ""
    for ch in oa.chat.completions.create(model="tiny-k3", messages=[{"role": "user", "content": "and Oslo?"}], tools=TOOLS,
                                         tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                         max_tokens=400, temperature=1.0, seed=5, stream=True):
        for d in ch.choices:
            for tc in d.delta.tool_calls or []:
                name = tc.function.name or name
                args += tc.function.arguments or ""
    assert name == "get_weather"
    valid_args(json.loads(args))


def test_anthropic_any_gives_a_tool_use_block(k3):
    import anthropic

    an = anthropic.Anthropic(base_url=k3.url, api_key="none", max_retries=0)
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    m = an.messages.create(model="tiny-k3", max_tokens=400, messages=[{"role": "user", "content": "weather?"}], tools=tools,
                           tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    valid_args(uses[0].input)


def test_reasoning_effort_and_tool_choice_reach_the_template(k3):
    msgs = [{"role": "user", "content": "hi"}]
    for effort, want in [("minimal", "low"), ("low", "low"), ("medium", "high"), ("high", "high"), ("xhigh", "max")]:
        p = post(k3, "/apply-template", {"messages": msgs, "reasoning_effort": effort})["prompt"]
        assert f"`thinking_effort={want}`" in p, (effort, p)
    # the client's own template variable wins
    p = post(k3, "/apply-template", {"messages": msgs, "reasoning_effort": "low", "chat_template_kwargs": {"thinking_effort": "max"}})["prompt"]
    assert "`thinking_effort=max`" in p
    # thinking off: no effort message, the response element opened
    p = post(k3, "/apply-template", {"messages": msgs, "reasoning_effort": "none"})["prompt"]
    assert "thinking_effort" not in p and p.endswith("<|open|>response<|sep|>")
    p = post(k3, "/apply-template", {"messages": msgs, "tools": TOOLS, "tool_choice": "required"})["prompt"]
    assert "tool_choice=required" in p
    p = post(k3, "/apply-template", {"messages": msgs, "tools": TOOLS, "tool_choice": "none"})["prompt"]
    assert "tool_choice=none" in p
    p = post(k3, "/apply-template", {"messages": msgs, "tools": TOOLS})["prompt"]
    assert "tool_choice=" not in p
