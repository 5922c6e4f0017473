//! `xwen serve` driven by the official `openai` and `anthropic` Python SDKs (tests/server):
//! chat, streaming, reasoning on and off, logprobs, the prefix cache across turns, every error
//! status, disconnects, shutdown, 32 concurrent streams equal to each served alone, bodies
//! fuzzed from /openapi.json, and two replicas behind nginx with a conversation kept on one. The clients live in a venv at target/pyenv that `.ci/run` creates
//! (`python3 -m venv target/pyenv && target/pyenv/bin/pip install -r tests/server/requirements.txt`);
//! without it cargo lists this test as ignored (crates/prereqs.rs), and under XWEN_REQUIRE_ALL=1
//! (CI) it fails.

use std::path::PathBuf;
use std::process::Command;

#[test]
#[cfg_attr(xwen_no_sdk_venv, ignore = "needs the venv target/pyenv with tests/server/requirements.txt (README.md, \"Tests\")")]
fn sdk_suite_passes() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join("target/pyenv/bin/python");
    assert!(
        python.exists(),
        "no target/pyenv (python3 -m venv target/pyenv && target/pyenv/bin/pip install -r tests/server/requirements.txt)"
    );
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/server"])
        .current_dir(&root)
        .env("XWEN_BIN", env!("CARGO_BIN_EXE_xwen"))
        .output()
        .expect("running pytest");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the SDK suite failed:\n{text}");
    eprintln!("{}", text.lines().last().unwrap_or(""));
}
