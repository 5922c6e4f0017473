"""Two `xwen serve` replicas behind nginx (deploy/nginx-replicas.conf, docs/serving.md): a
conversation's turns reach the replica holding its prefix, so its second turn is served from
that replica's cache; conversations spread over both; streams pass through. Needs nginx
(Debian's nginx-light; XWEN_NGINX names another): skipped without it, failed under CI's
XWEN_REQUIRE_ALL."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import httpx
import openai
import pytest
from conftest import ROOT, Server

KW = dict(max_tokens=10, temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})


def nginx_binary():
    for p in (os.environ.get("XWEN_NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"):
        if p and os.access(p, os.X_OK):
            return p
    if os.environ.get("XWEN_REQUIRE_ALL", "") not in ("", "0"):
        pytest.fail("nginx is not installed (apt-get install nginx-light, or set XWEN_NGINX)")
    pytest.skip("nginx is not installed (apt-get install nginx-light, or set XWEN_NGINX)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def balanced():
    nginx = nginx_binary()
    replicas = [Server("-np", "2", "-c", "4096") for _ in range(2)]
    work = tempfile.mkdtemp()
    port = free_port()
    upstreams = "".join(f"        server {r.url.removeprefix('http://')};\n" for r in replicas)
    conf = open(os.path.join(ROOT, "deploy", "nginx-replicas.conf")).read()
    conf = conf.replace("@PREFIX@", work).replace("@LISTEN@", f"127.0.0.1:{port}").replace("@UPSTREAMS@\n", upstreams)
    with open(os.path.join(work, "nginx.conf"), "w") as f:
        f.write(conf)
    lb = subprocess.Popen([nginx, "-p", work, "-c", os.path.join(work, "nginx.conf"), "-e", os.path.join(work, "error.log")], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert lb.poll() is None, "nginx exited: " + lb.stderr.read()
            time.sleep(0.1)
    else:
        raise AssertionError("nginx did not listen")
    yield f"http://127.0.0.1:{port}", [r.url for r in replicas]
    lb.terminate()
    lb.wait(timeout=10)
    for r in replicas:
        assert r.stop() == 0
    shutil.rmtree(work, ignore_errors=True)


def client(url, conversation=None):
    headers = {"X-Conversation-Id": conversation} if conversation else {}
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, default_headers=headers)


def boundary(url, messages):
    """Where the next turn's rendering departs from this prompt's (test_openai.py says why)."""
    return httpx.post(url + "/apply-template", json={"messages": messages, **KW["extra_body"]}).json()["boundary"]


def turn(c, messages, **kw):
    raw = c.chat.completions.with_raw_response.create(model="tiny-qwen35", messages=messages, **{**KW, **kw})
    return raw.parse(), raw.headers["x-xwen-replica"]


def test_a_conversation_stays_on_the_replica_that_holds_it(balanced):
    url, replicas = balanced
    c = client(url, "conversation-a")
    msgs = [{"role": "user", "content": "Describe a lighthouse at night in one sentence."}]
    r1, rep1 = turn(c, msgs)
    assert rep1.removeprefix("http://") in [u.removeprefix("http://") for u in replicas]
    shared = boundary(url, msgs)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "And at dawn?"}]
    r2, rep2 = turn(c, msgs)
    assert rep2 == rep1, "the second turn went to another replica"
    # the first turn came from the replica's slot: every token the renderings share
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached == shared > 0, f"second turn: {cached} of {r2.usage.prompt_tokens} prompt tokens cached, {shared} shared"
    # the same turn sent straight to the other replica computes it all again
    other = next(u for u in replicas if u.removeprefix("http://") != rep1)
    r3 = client(other).chat.completions.create(model="tiny-qwen35", messages=msgs, **KW)
    assert r3.usage.prompt_tokens_details.cached_tokens < cached // 2
    assert r3.choices[0].message.content == r2.choices[0].message.content


def test_conversations_spread_over_the_replicas(balanced):
    url, _ = balanced
    seen = {}
    for i in range(24):
        _, rep = turn(client(url, f"conversation-{i}"), [{"role": "user", "content": "hi"}], max_tokens=1)
        seen.setdefault(rep, []).append(i)
        # the same key again: the same replica
        _, again = turn(client(url, f"conversation-{i}"), [{"role": "user", "content": "hello"}], max_tokens=1)
        assert again == rep, f"conversation-{i} moved from {rep} to {again}"
    assert len(seen) == 2, f"24 conversations all on one replica: {seen}"


def test_streams_pass_through_the_balancer(balanced):
    url, _ = balanced
    c = client(url, "conversation-stream")
    msgs = [{"role": "user", "content": "Count from one to five."}]
    first = c.chat.completions.create(model="tiny-qwen35", messages=msgs, **KW)
    shared = boundary(url, msgs)
    msgs += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "Now backwards."}]
    chunks = list(c.chat.completions.create(model="tiny-qwen35", messages=msgs, stream=True, stream_options={"include_usage": True}, **KW))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    usage = chunks[-1].usage
    assert text and usage.completion_tokens > 0
    assert usage.prompt_tokens_details.cached_tokens == shared > 0


def test_without_a_key_a_client_keeps_its_replica(balanced):
    url, _ = balanced
    reps = {turn(client(url), [{"role": "user", "content": f"question {i}"}], max_tokens=1)[1] for i in range(4)}
    assert len(reps) == 1, f"one client address, several replicas: {reps}"
