"""The Anthropic SDK against `xwen serve`: messages, the exact stream event sequence, thinking
blocks, stop sequences, count_tokens."""

import httpx

MSG = [{"role": "user", "content": "def fibonacci(n):"}]


def test_message_non_stream_and_stream_agree(an):
    for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}):
        m = an.messages.create(model="tiny-qwen35", max_tokens=20, messages=MSG, extra_body={"temperature": 0}, thinking=thinking)
        assert m.role == "assistant" and m.stop_reason in ("end_turn", "max_tokens")
        kinds = [b.type for b in m.content]
        if thinking["type"] == "disabled":
            assert "thinking" not in kinds
        else:
            assert kinds[0] == "thinking"
        with an.messages.stream(model="tiny-qwen35", max_tokens=20, messages=MSG, extra_body={"temperature": 0}, thinking=thinking) as s:
            final = s.get_final_message()
        assert [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content]
        assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens


def test_no_thinking_blocks_unless_the_request_enables_thinking(an):
    m = an.messages.create(model="tiny-qwen35", max_tokens=20, messages=MSG, extra_body={"temperature": 0})
    assert m.content and all(b.type != "thinking" for b in m.content), m.content
    with an.messages.stream(model="tiny-qwen35", max_tokens=20, messages=MSG, extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    assert all(b.type != "thinking" for b in final.content), final.content


def test_stream_event_sequence(server):
    body = {"model": "tiny-qwen35", "max_tokens": 12, "messages": MSG, "stream": True, "temperature": 0}
    names = []
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    body_events = names[2:-2]
    # each block: start, deltas, stop
    i = 0
    while i < len(body_events):
        assert body_events[i] == "content_block_start", body_events
        i += 1
        while body_events[i] == "content_block_delta":
            i += 1
        assert body_events[i] == "content_block_stop"
        i += 1


def test_system_and_stop_sequences(an):
    kw = dict(model="tiny-qwen35", max_tokens=24, extra_body={"temperature": 0}, thinking={"type": "disabled"}, system="You write Python.")
    free = an.messages.create(messages=MSG, **kw)
    text = "".join(b.text for b in free.content if b.type == "text")
    assert len(text) > 4
    stop = text[2:5]
    m = an.messages.create(messages=MSG, stop_sequences=[stop], **kw)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert "".join(b.text for b in m.content if b.type == "text") == text[: text.index(stop)].strip()


def test_count_tokens(an, server):
    n = an.messages.count_tokens(model="tiny-qwen35", messages=MSG).input_tokens
    m = an.messages.create(model="tiny-qwen35", max_tokens=1, messages=MSG)
    assert n == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_tool_result_round_trip_renders(an):
    tools = [{"name": "get_weather", "description": "weather of a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    msgs = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
    ]
    m = an.messages.create(model="tiny-qwen35", max_tokens=8, messages=msgs, tools=tools, extra_body={"temperature": 0})
    assert m.usage.output_tokens > 0
