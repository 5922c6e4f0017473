"""Every error status in each dialect's shape, and the server's behaviour at its edges: a key,
a body limit, a full queue, a client that goes away, shutdown with a stream in flight."""

import json
import signal
import socket
import threading
import time

import httpx
import pytest

from conftest import Server

MSG = [{"role": "user", "content": "def fibonacci(n):"}]


def oa_error(r, status):
    assert r.status_code == status, (r.status_code, r.text)
    e = r.json()["error"]
    assert isinstance(e["message"], str) and e["type"]
    return e


def an_error(r, status, kind):
    assert r.status_code == status, (r.status_code, r.text)
    j = r.json()
    assert j["type"] == "error" and j["error"]["type"] == kind, j
    return j["error"]


def test_bad_bodies_are_400(server):
    u = server.url
    oa_error(httpx.post(u + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}), 400)
    oa_error(httpx.post(u + "/v1/chat/completions", content=b"[1, 2]"), 400)
    oa_error(httpx.post(u + "/v1/chat/completions", content=b"\xff\xfe"), 400)
    oa_error(httpx.post(u + "/v1/chat/completions", json={"messages": []}), 400)
    oa_error(httpx.post(u + "/v1/chat/completions", json={"messages": "hi"}), 400)
    oa_error(httpx.post(u + "/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}), 400)
    for bad in [{"temperature": "hot"}, {"temperature": 3}, {"top_p": 2}, {"top_logprobs": 50, "logprobs": True}, {"max_tokens": "5"},
                {"chat_template_kwargs": {"enable_thinking": "yes"}}, {"reasoning_effort": "max"}, {"tool_choice": "required"},
                {"logit_bias": {"999999": 1}}, {"n": 2}, {"stop": [1]}, {"seed": "x"}]:
        e = oa_error(httpx.post(u + "/v1/chat/completions", json={"messages": MSG, **bad}), 400)
        assert e["param"] is not None, bad
    an_error(httpx.post(u + "/v1/messages", json={"messages": MSG}), 400, "invalid_request_error")
    an_error(httpx.post(u + "/v1/messages", json={"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}), 400, "invalid_request_error")
    an_error(httpx.post(u + "/v1/messages", json={"max_tokens": 4, "messages": MSG, "temperature": 1.5}), 400, "invalid_request_error")
    oa_error(httpx.post(u + "/tokenize", json={"content": 5}), 400)
    oa_error(httpx.post(u + "/detokenize", json={"tokens": [-1]}), 400)


def test_context_overflow_is_400_before_any_work(server):
    long = "x = 1\n" * 3000
    e = oa_error(httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": long}]}), 400)
    assert e["code"] == "context_length_exceeded"


def test_unknown_model_and_route_are_404(server):
    e = oa_error(httpx.post(server.url + "/v1/chat/completions", json={"model": "gpt-9", "messages": MSG}), 404)
    assert e["code"] == "model_not_found"
    an_error(httpx.post(server.url + "/v1/messages", json={"model": "claude-9", "max_tokens": 4, "messages": MSG}), 404, "not_found_error")
    oa_error(httpx.get(server.url + "/v1/models/gpt-9"), 404)
    oa_error(httpx.get(server.url + "/v1/nothing"), 404)
    an_error(httpx.post(server.url + "/v1/messages/nothing", json={}), 404, "not_found_error")


def test_api_key_body_limit_and_full_queue():
    s = Server("-np", "1", "--queue", "1", "--api-key", "sekret", "--max-body", "4K", "-c", "32768")
    try:
        u = s.url
        assert httpx.get(u + "/health").status_code == 200
        e = oa_error(httpx.get(u + "/v1/models"), 401)
        assert e["code"] == "invalid_api_key"
        oa_error(httpx.get(u + "/v1/models", headers={"authorization": "Bearer wrong"}), 401)
        an_error(httpx.post(u + "/v1/messages", json={}), 401, "authentication_error")
        ok = {"authorization": "Bearer sekret"}
        assert httpx.get(u + "/v1/models", headers=ok).status_code == 200
        assert httpx.get(u + "/v1/models", headers={"x-api-key": "sekret"}).status_code == 200
        big = {"messages": [{"role": "user", "content": "a" * 8000}]}
        oa_error(httpx.post(u + "/v1/chat/completions", json=big, headers=ok), 413)
        an_error(httpx.post(u + "/v1/messages", json={"max_tokens": 1, **big}, headers=ok), 413, "request_too_large")
        # one slot, one queue place: a third concurrent request is refused with 429
        body = {"messages": MSG, "max_tokens": 30000, "ignore_eos": True, "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
        host, port = u[len("http://"):].split(":")
        payload = json.dumps(body).encode()
        socks = []
        for _ in range(2):
            k = socket.create_connection((host, int(port)))
            k.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sekret\r\ncontent-type: application/json\r\n"
                      + b"content-length: %d\r\n\r\n" % len(payload) + payload)
            socks.append(k)
        deadline = time.time() + 20
        while "xwen_queue_depth 1" not in httpx.get(u + "/metrics", headers=ok).text and time.time() < deadline:
            time.sleep(0.05)
        oa_error(httpx.post(u + "/v1/chat/completions", json=body, headers=ok), 429)
        an_error(httpx.post(u + "/v1/messages", json={"max_tokens": 4, "messages": MSG}, headers=ok), 429, "rate_limit_error")
        for k in socks:
            k.close()
        # the slot and the queue place are free again once the clients went away
        deadline = time.time() + 20
        while True:
            r = httpx.post(u + "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}, headers=ok, timeout=60)
            if r.status_code == 200 or time.time() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text
    finally:
        s.stop()


def test_disconnect_mid_stream_frees_the_slot(server):
    def cancelled():
        m = httpx.get(server.url + "/metrics").text
        return float([l for l in m.splitlines() if l.startswith("xwen_requests_cancelled_total")][0].split()[1])

    before = cancelled()
    body = {"messages": MSG, "max_tokens": 3000, "ignore_eos": True, "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        n = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                n += 1
            if n == 3:
                break
    deadline = time.time() + 10
    while cancelled() <= before and time.time() < deadline:
        time.sleep(0.1)
    assert cancelled() > before
    assert httpx.get(server.url + "/metrics").text.count("xwen_running_sequences 0") == 1


def test_shutdown_ends_streams_with_a_final_event():
    s = Server("-np", "2", "-c", "8192")
    body = {"messages": MSG, "max_tokens": 5000, "ignore_eos": True, "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
    lines = []
    with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == 6:
                s.proc.send_signal(signal.SIGTERM)
    lines = [l for l in lines if l]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    final = json.loads([l for l in lines if l.startswith("data: {")][-1][6:])
    assert final["choices"][0]["finish_reason"] == "stop"
    assert s.proc.wait(timeout=30) == 0


def test_many_disconnects_leave_the_server_up(server):
    # each client hangs up mid-stream while the server is still writing to it: a write to the
    # closed socket must be an error of that connection (EPIPE), never a signal that ends the
    # process (a CLI that restores SIGPIPE's default for `| head` must not do so for serve)
    body = {"messages": MSG, "max_tokens": 400, "ignore_eos": True, "stream": True, "chat_template_kwargs": {"enable_thinking": False}}
    for i in range(12):
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
            for n, line in enumerate(r.iter_lines()):
                if n >= 1 + i % 3:
                    break
    time.sleep(0.5)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_a_queued_request_whose_client_left_loses_its_place():
    """One slot, busy with a long stream; a request queued behind it (streamed or not) whose
    client hangs up leaves the queue at once, before it costs any work."""
    s = Server("-np", "1", "-c", "8192")
    try:
        def metric(name):
            m = httpx.get(s.url + "/metrics").text
            return float([l for l in m.splitlines() if l.startswith(name + " ")][0].split()[1])

        def wait_for(name, value, timeout=10):
            deadline = time.time() + timeout
            while metric(name) != value and time.time() < deadline:
                time.sleep(0.05)
            return metric(name)

        long = {"messages": MSG, "max_tokens": 7000, "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}
        t = threading.Thread(target=lambda: httpx.post(s.url + "/v1/chat/completions", json=long, timeout=120))
        t.start()
        assert wait_for("xwen_running_sequences", 1.0) == 1.0
        host, port = s.url.split("//")[1].split(":")
        for stream in (False, True):
            before = metric("xwen_requests_cancelled_total")
            c = socket.create_connection((host, int(port)))
            b = json.dumps({"messages": MSG, "max_tokens": 8, "stream": stream}).encode()
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
            assert wait_for("xwen_queue_depth", 1.0) == 1.0
            c.close()
            assert wait_for("xwen_queue_depth", 0.0) == 0.0, f"stream={stream}: the queued request kept its place"
            assert metric("xwen_requests_cancelled_total") == before + 1
            # the long request is still the one running
            assert metric("xwen_running_sequences") == 1.0
        t.join()
    finally:
        s.stop()
