"""`xwen run`, the C example and the Python package give the same greedy tokens on the demo
model. The binaries are what `cargo test --workspace --release` leaves in target/ (xwen-cli's
`xwen`, xwen-capi's compiled examples/c/generate.c); XWEN_BIN and XWEN_C_EXAMPLE name others.
A missing one is a skip, or a failure under XWEN_REQUIRE_ALL=1 (.ci/run)."""

import os
import pathlib
import subprocess

import pytest

import xwen

ROOT = pathlib.Path(__file__).resolve().parents[3]
N = "48"


def binary(env: str, default: pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(os.environ.get(env, default))
    if not path.exists():
        why = f"{path} is missing (cargo test --workspace --release builds it; or set {env})"
        if os.environ.get("XWEN_REQUIRE_ALL") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return path


def ids(cmd) -> list:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [int(t) for t in out.split()]


def test_xwen_run_the_c_example_and_python_agree_token_for_token():
    cli = binary("XWEN_BIN", ROOT / "target/release/xwen")
    c = binary("XWEN_C_EXAMPLE", ROOT / "target/c-example/generate")
    py = xwen.Model().generate("def fibonacci(n):\n", max_tokens=int(N)).tokens
    assert len(py) == int(N)
    assert ids([cli, "run", "-q", "--print-ids", "-n", N]) == py
    assert ids([c, "--ids", "-n", N]) == py
