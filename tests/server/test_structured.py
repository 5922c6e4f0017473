"""Constrained decoding: json_schema / json_object output that parses and validates, and forced
tool calls (tool_choice required / named, Anthropic's any / tool) that parse into calls, even
from a 6M-parameter model that has never seen JSON or a tool."""

import json

import pytest

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "current weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
          "required": ["name", "ok", "tags"], "additionalProperties": False}


def valid(v, schema):
    assert isinstance(v, dict) and set(v) == set(schema["required"])
    assert isinstance(v["name"], str) and len(v["name"]) <= 12 and isinstance(v["ok"], bool)
    assert isinstance(v["tags"], list) and len(v["tags"]) <= 2 and all(isinstance(t, str) for t in v["tags"])


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_json_schema_output_parses_and_validates(oa, temperature):
    r = oa.chat.completions.create(model="tiny-qwen35", messages=[{"role": "user", "content": "a person"}], max_tokens=200, temperature=temperature, seed=3,
                                   response_format={"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    valid(json.loads(c.message.content), PERSON)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_listed_properties_are_the_only_keys(oa, seed):
    # no additionalProperties: as llama.cpp and vLLM read a schema, the listed keys only
    schema = {"type": "object", "properties": {"b": {"type": "boolean"}, "s": {"type": "string", "maxLength": 8}}, "required": ["b", "s"]}
    r = oa.chat.completions.create(model="tiny-qwen35", messages=[{"role": "user", "content": "give json"}], max_tokens=80, temperature=1.0, seed=seed,
                                   response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    v = json.loads(c.message.content)
    assert set(v) == {"b", "s"} and isinstance(v["b"], bool), v


def test_json_object_streams_valid_json(oa):
    text = ""
    for ch in oa.chat.completions.create(model="tiny-qwen35", messages=[{"role": "user", "content": "config"}], max_tokens=300, temperature=0, stream=True,
                                         response_format={"type": "json_object"}):
        for c in ch.choices:
            text += c.delta.content or ""
    v = json.loads(text)
    assert isinstance(v, dict)


def test_bad_schema_is_400(oa):
    import openai

    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model="tiny-qwen35", messages=[{"role": "user", "content": "x"}], max_tokens=10,
                                   response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}})


def test_tool_round_trip_with_required_choice(oa):
    msgs = [{"role": "user", "content": "what is the weather in Paris?"}]
    r = oa.chat.completions.create(model="tiny-qwen35", messages=msgs, tools=TOOLS, tool_choice="required", max_tokens=200, temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    call = c.message.tool_calls[0]
    assert call.function.name in ("get_weather", "search")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")
    # the tool's answer goes back, and the model replies (no tool forced now)
    msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    r2 = oa.chat.completions.create(model="tiny-qwen35", messages=msgs, tools=TOOLS, max_tokens=16, temperature=0)
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens


def test_named_tool_choice_streams_a_call(oa):
    calls = []
    fin = None
    for ch in oa.chat.completions.create(model="tiny-qwen35", messages=[{"role": "user", "content": "find cats"}], tools=TOOLS, max_tokens=200, temperature=0, stream=True,
                                         tool_choice={"type": "function", "function": {"name": "search"}}):
        for c in ch.choices:
            calls += c.delta.tool_calls or []
            fin = c.finish_reason or fin
    assert fin == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "search" and set(json.loads(calls[0].function.arguments)) == {"query"}


def test_anthropic_any_tool_gives_tool_use(an):
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    m = an.messages.create(model="tiny-qwen35", max_tokens=200, messages=[{"role": "user", "content": "weather?"}], tools=tools, tool_choice={"type": "any"}, extra_body={"temperature": 0})
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name in ("get_weather", "search") and isinstance(uses[0].input, dict)
    with an.messages.stream(model="tiny-qwen35", max_tokens=200, messages=[{"role": "user", "content": "weather?"}], tools=tools, tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].type == "tool_use" and final.content[-1].name == "get_weather"
    assert set(final.content[-1].input) == {"city", "unit"}


# a forced call's integer argument of any length is a JSON number (not a string, not a float):
# a bias on the digit 7 (token 22 of the demo vocabulary) keeps the integer growing until the
# token limit, past 42 digits
SEVENS = {"22": 100}
ID_TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}}


def long_sevens(args):
    assert set(args) == {"id"} and type(args["id"]) is int, args
    digits = str(args["id"])
    assert len(digits) >= 42 and set(digits) == {"7"}, digits


def test_a_forced_calls_long_integer_comes_back_as_that_number(oa, an):
    msgs = [{"role": "user", "content": "look it up"}]
    r = oa.chat.completions.create(model="tiny-qwen35", messages=msgs, tools=[ID_TOOL], tool_choice="required", max_tokens=80, temperature=0, logit_bias=SEVENS)
    long_sevens(json.loads(r.choices[0].message.tool_calls[0].function.arguments))
    text = ""
    for ch in oa.chat.completions.create(model="tiny-qwen35", messages=msgs, tools=[ID_TOOL], max_tokens=80, temperature=0, logit_bias=SEVENS, stream=True,
                                         tool_choice={"type": "function", "function": {"name": "lookup"}}):
        for c in ch.choices:
            text += "".join(t.function.arguments or "" for t in c.delta.tool_calls or [])
    long_sevens(json.loads(text))
    tool = {"name": "lookup", "input_schema": ID_TOOL["function"]["parameters"]}
    body = {"temperature": 0, "logit_bias": SEVENS}
    m = an.messages.create(model="tiny-qwen35", max_tokens=80, messages=msgs, tools=[tool], tool_choice={"type": "any"}, extra_body=body)
    uses = [b.input for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1, m
    long_sevens(uses[0])
    with an.messages.stream(model="tiny-qwen35", max_tokens=80, messages=msgs, tools=[tool], tool_choice={"type": "tool", "name": "lookup"}, extra_body=body) as s:
        final = s.get_final_message()
    assert final.content[-1].type == "tool_use", final
    long_sevens(final.content[-1].input)
