"""Starts `xwen serve` on the demo model (with Qwen3.5's tool-rendering chat template) for the
SDK tests. XWEN_BIN names the binary (the cargo test that runs this suite sets it);
XWEN_SERVE_ARGS adds flags to every server the tests start (`-ngl 99`: the suite against a GPU
server, as scripts/gpu-serve-ab runs it)."""

import os
import re
import shlex
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(ROOT, "tests", "fixtures", "templates", "Qwen3.5-4B.jinja")


def binary():
    b = os.environ.get("XWEN_BIN") or os.path.join(ROOT, "target", "release", "xwen")
    assert os.path.exists(b), f"{b} does not exist: build with cargo build --release"
    return b


class Server:
    def __init__(self, *args, template=TEMPLATE):
        """`template` None: the model's own chat template (the GGUF's)."""
        tpl = ["--chat-template-file", template] if template else []
        extra = shlex.split(os.environ.get("XWEN_SERVE_ARGS", ""))
        cmd = [binary(), "serve", "--port", "0", *tpl, "-t", "1", *args, *extra]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.log = []
        deadline = time.time() + 60
        self.url = None
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"serving on (http://[0-9.:]+)", line)
            if m:
                self.url = m.group(1)
                break
        assert self.url, "the server did not start:\n" + "".join(self.log)

    def stop(self, sig=None):
        import signal

        self.proc.send_signal(sig or signal.SIGINT)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the server did not stop within 30 s of SIGINT")


@pytest.fixture(scope="session")
def server():
    s = Server("-np", "4", "-c", "4096")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="session")
def oa(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="session")
def an(server):
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
