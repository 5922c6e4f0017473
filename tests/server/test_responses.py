"""The OpenAI SDK's Responses API against `xwen serve`: string and item input, instructions,
reasoning on and off, the streamed event sequence folded by the SDK's own stream helper into the
same response as the non-streamed call, function tools (forced, then the call's output sent back
as input items), text.format json_schema, max_output_tokens → incomplete, and the refusals."""

import json

import openai
import pytest

TOOLS = [{"type": "function", "name": "get_weather", "description": "current weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}]


def create(oa, **kw):
    kw.setdefault("model", "tiny-qwen35")
    kw.setdefault("temperature", 0)
    return oa.responses.create(**kw)


def test_string_input_gives_a_message(oa):
    r = create(oa, input="def fibonacci(n):", max_output_tokens=24, reasoning={"effort": "none"})
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    msgs = [o for o in r.output if o.type == "message"]
    assert len(msgs) == 1 and msgs[0].role == "assistant"
    assert r.output_text == msgs[0].content[0].text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert not [o for o in r.output if o.type == "reasoning"]


def test_reasoning_comes_back_as_a_reasoning_item(oa):
    r = create(oa, input="def add(a, b):", max_output_tokens=64)
    kinds = [o.type for o in r.output]
    assert kinds[0] == "reasoning", kinds
    text = "".join(c.text for c in r.output[0].content)
    assert text and r.usage.output_tokens_details.reasoning_tokens > 0


def test_stream_folds_into_the_non_streamed_response(oa):
    for effort in ("none", "low"):
        kw = dict(model="tiny-qwen35", temperature=0, max_output_tokens=40, reasoning={"effort": effort},
                  instructions="You write Python.", input=[{"role": "user", "content": [{"type": "input_text", "text": "def add(a, b):"}]}])
        full = oa.responses.create(**kw)
        types, last = [], None
        # the SDK's stream helper folds the events (it asserts their order and indices)
        with oa.responses.stream(**kw) as s:
            for ev in s:
                types.append(ev.type)
                last = ev
        # response.completed or, at the token limit, response.incomplete carries the whole object
        final = last.response
        assert types[0] == "response.created" and types[1] == "response.in_progress"
        assert types[-1] in ("response.completed", "response.incomplete")
        text = "".join(c.text for o in final.output if o.type == "message" for c in o.content)
        assert text == full.output_text
        assert [o.type for o in final.output] == [o.type for o in full.output]
        assert final.status == full.status and final.usage.output_tokens == full.usage.output_tokens
        if effort == "low":
            assert "response.reasoning_text.delta" in types


def test_raw_stream_events_are_numbered_and_ordered(oa):
    seqs, types = [], []
    for ev in create(oa, input="import os", max_output_tokens=16, stream=True, reasoning={"effort": "none"}):
        seqs.append(ev.sequence_number)
        types.append(ev.type)
    assert seqs == list(range(len(seqs)))
    i = types.index("response.output_item.added")
    assert types[i + 1] == "response.content_part.added"
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", types[-1]]


def test_max_output_tokens_is_incomplete(oa):
    r = create(oa, input="def fibonacci(n):", max_output_tokens=3, reasoning={"effort": "none"})
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_forced_tool_call_then_its_output_as_input(oa):
    r = create(oa, input="weather in Paris?", tools=TOOLS, tool_choice="required", max_output_tokens=200)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    args = json.loads(calls[0].arguments)
    assert isinstance(args.get("city"), str)
    # the call and its output go back as items; the model answers in text
    follow = create(oa, tools=TOOLS, max_output_tokens=20, reasoning={"effort": "none"}, input=[
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"},
    ])
    assert follow.output and follow.usage.input_tokens > r.usage.input_tokens


def test_named_tool_choice_streams_a_call(oa):
    with oa.responses.stream(model="tiny-qwen35", input="weather?", tools=TOOLS, max_output_tokens=200, temperature=0,
                             tool_choice={"type": "function", "name": "get_weather"}) as s:
        types = [ev.type for ev in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in types
    call = [o for o in final.output if o.type == "function_call"][0]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)


def test_json_schema_text_format(oa):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}, "required": ["name"], "additionalProperties": False}
    r = create(oa, input="a name", max_output_tokens=60, text={"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}})
    v = json.loads(r.output_text)
    assert set(v) == {"name"} and isinstance(v["name"], str)


@pytest.mark.parametrize("kw", [
    dict(input=None),
    dict(input=[{"type": "input_image", "image_url": "x"}]),
    dict(input="x", previous_response_id="resp_123"),
    dict(input="x", store=True),
    dict(input="x", tools=[{"type": "web_search"}]),
    dict(input="x", tool_choice="required"),
    dict(input="x", reasoning={"effort": "enormous"}),
    dict(input="x", max_output_tokens=0),
    dict(input="x", model="no-such-model"),
])
def test_bad_requests_are_4xx(oa, kw):
    kw = dict(kw)
    model = kw.pop("model", "tiny-qwen35")
    with pytest.raises((openai.BadRequestError, openai.NotFoundError)):
        oa.responses.create(model=model, **kw)
