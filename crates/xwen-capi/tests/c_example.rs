//! examples/c/generate.c compiled with the system's C compiler against the static library,
//! run on the demo model: its greedy tokens are the library's. The binary is kept in
//! target/c-example/ for the Python package's parity test.

use std::path::{Path, PathBuf};
use std::process::Command;
use xwen_embed::{GenerateOptions, LoadOptions, Prompt, SamplerConfig, Xwen};

/// target/<profile>/, above the deps/ folder this test runs from.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

#[test]
fn the_c_example_generates_the_librarys_greedy_tokens() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // cargo builds the static library with this test into deps/ (it is copied up to
    // target/<profile>/ only by a build of the crate itself)
    let lib = profile_dir().join("deps/libxwen_capi.a");
    assert!(lib.exists(), "{} is missing (cargo builds it with this test)", lib.display());
    let out_dir = profile_dir().join("../c-example");
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join("generate");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", "-I"])
        .arg(root.join("include"))
        .arg(root.join("examples/c/generate.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .status()
        .unwrap_or_else(|e| panic!("{cc}: {e} (a C compiler is needed: set CC)"));
    assert!(st.success(), "compiling examples/c/generate.c failed");
    let run = Command::new(&exe).args(["--ids", "-n", "48"]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(run.stderr.is_empty(), "the library printed: {}", String::from_utf8_lossy(&run.stderr));
    let ids: Vec<u32> = String::from_utf8(run.stdout).unwrap().split_whitespace().map(|t| t.parse().unwrap()).collect();
    let x = Xwen::load(None, &LoadOptions::default()).unwrap();
    let greedy = GenerateOptions { max_tokens: Some(48), sampling: SamplerConfig::greedy(), ..Default::default() };
    let want = x.generate(Prompt::Text(xwen_embed::DEMO_PROMPT), &greedy, &mut |_| true).unwrap();
    assert_eq!(ids, want.tokens);
    // streamed text and the summary line
    let run = Command::new(&exe).args(["-n", "8"]).output().unwrap();
    let text = String::from_utf8(run.stdout).unwrap();
    assert!(text.starts_with(xwen_embed::DEMO_PROMPT) && text.contains("[8 tokens, finish: length"), "{text}");
    // an error is a message and a status, not a crash
    let run = Command::new(&exe).args(["-m", "/nonexistent.gguf"]).output().unwrap();
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).starts_with("generate: load: "), "{}", String::from_utf8_lossy(&run.stderr));
}
