"""The prefix cache across a restart (`serve --cache-dir`): turn 2 of a conversation served by a
new process resumes the state turn 1 left at its message boundary, read from disk — every
earlier token reported as cached — and gives the reply a server that never restarted gives."""

import json
import shutil
import tempfile
import urllib.request

from conftest import Server

SYSTEM = "You are a careful assistant who writes small Python functions and explains them briefly."
TURN1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Write a function that adds two numbers."}]


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def chat(url, messages):
    return post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 12, "temperature": 0})


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def test_turn_two_after_a_restart_reuses_turn_one_from_disk():
    d = tempfile.mkdtemp(prefix="xwen-prefix-")
    try:
        s = Server("-np", "2", "-c", "2048", "--cache-dir", d)
        r1 = chat(s.url, TURN1)
        reply = r1["choices"][0]["message"]["content"]
        turn2 = TURN1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Now one that subtracts."}]
        boundary = post(s.url, "/apply-template", {"messages": TURN1})["boundary"]
        # the reference: the same server, never restarted (its slot holds turn 1)
        want = chat(s.url, turn2)
        assert s.stop() == 0

        s = Server("-np", "2", "-c", "2048", "--cache-dir", d)
        got = chat(s.url, turn2)
        cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
        # everything before the boundary (the scheduler checkpoints before the prompt's last token)
        assert cached >= min(boundary, r1["usage"]["prompt_tokens"] - 1) > 0, got["usage"]
        assert metric(s.url, "xwen_prefix_cache_disk_restores_total") == 1
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert s.stop() == 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_damaged_cache_file_is_skipped_not_served():
    d = tempfile.mkdtemp(prefix="xwen-prefix-")
    try:
        s = Server("-np", "1", "-c", "2048", "--cache-dir", d)
        chat(s.url, TURN1)
        assert s.stop() == 0
        import os

        files = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".xwenprefix")]
        assert files
        for f in files:
            b = bytearray(open(f, "rb").read())
            b[len(b) // 2] ^= 0x55
            open(f, "wb").write(bytes(b))
        s = Server("-np", "1", "-c", "2048", "--cache-dir", d)
        turn2 = TURN1 + [{"role": "assistant", "content": "def add(a, b): return a + b"}, {"role": "user", "content": "Thanks."}]
        r = chat(s.url, turn2)
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert metric(s.url, "xwen_prefix_cache_disk_restores_total") == 0
        assert s.stop() == 0
    finally:
        shutil.rmtree(d, ignore_errors=True)
