"""`xwen serve --ram-budget` with parallel slots: a MoE model larger than the budget serves
several requests at once with its experts streamed, every greedy reply the mapped server's,
and the server's peak RSS (VmHWM, over its whole life: load, 4 slots decoding together)
stays under the budget — the plan counts every slot's state and the shared expert cache."""

import concurrent.futures
import os
import subprocess
import tempfile

import httpx
import pytest

from conftest import Server, binary

PROMPTS = ["def add(a, b):", "import os\n", "class Node:", "for i in range(10):"]
BUDGET = 196 << 20


@pytest.fixture(scope="module")
def small_moe():
    d = tempfile.mkdtemp(prefix="xwen-serve-budget-")
    path = os.path.join(d, "small.gguf")
    r = subprocess.run([binary(), "synth", "--preset", "qwen35moe-small", "--out", path], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    yield path
    os.remove(path)
    os.rmdir(d)


def complete(url, prompt, max_tokens=24):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="VmHWM is Linux's")
def test_parallel_slots_stay_inside_the_budget(small_moe):
    size = os.path.getsize(small_moe)
    assert size > BUDGET + (32 << 20), "the model must outgrow the budget"
    mapped = Server("-m", small_moe, "-np", "4", "-c", "256", template=None)
    try:
        want = [complete(mapped.url, p) for p in PROMPTS]
    finally:
        assert mapped.stop() == 0
    streamed = Server("-m", small_moe, "-np", "4", "-c", "256", "--ram-budget", str(BUDGET), "--cache-ram", "16", "-t", "2", template=None)
    try:
        assert any("stream from disk" in l for l in streamed.log), "".join(streamed.log)
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda p: complete(streamed.url, p), PROMPTS * 2))
        assert got == want * 2
        peak = peak_rss(streamed.proc.pid)
        assert peak is not None and peak <= BUDGET, f"peak RSS {peak} B over the {BUDGET} B budget"
        print(f"serve --ram-budget {BUDGET >> 20}M -np 4: peak RSS {peak / 2**20:.1f} MiB, model {size / 2**20:.1f} MiB")
    finally:
        assert streamed.stop() == 0
