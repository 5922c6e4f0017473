//! Every subcommand driven with hostile arguments: each ends with a non-zero exit and one line
//! on stderr that names the problem — never a panic, a signal, or a screen of usage text.
//! Errors found only after the model is loaded (a token id outside its vocabulary) follow the
//! load's notes; there the last line is the error.

use std::path::PathBuf;
use std::process::Command;

fn demo() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf").to_string()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xwen-hostile-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `xwen args`; asserts failure, no panic, no signal, and returns stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).env("HF_HUB_OFFLINE", "1").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(out.status.code().is_some(), "{args:?}: killed by a signal: {err}");
    assert!(!out.status.success(), "{args:?} was accepted: {err}");
    err
}

/// Refused with exactly one line on stderr, starting `xwen: ` and containing `want`.
fn one_line(args: &[&str], want: &str) {
    let err = refused(args);
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line:\n{err}");
    assert!(err.starts_with("xwen: ") && err.contains(want), "{args:?}: wanted `{want}` in: {err}");
}

/// Refused, the last line of stderr being the error.
fn last_line(args: &[&str], want: &str) {
    let err = refused(args);
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("xwen: ") && last.contains(want), "{args:?}: wanted `{want}` in the last line of: {err}");
}

#[test]
fn every_subcommand_refuses_bad_values_in_one_line() {
    let d = demo();
    let dir = scratch("values");
    let empty_dir = dir.join("empty");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let not_gguf = dir.join("notes.gguf");
    std::fs::write(&not_gguf, b"hello\n").unwrap();
    let (empty_dir, not_gguf) = (empty_dir.to_str().unwrap().to_string(), not_gguf.to_str().unwrap().to_string());
    let bad_out = dir.join("no/such/dir/x.npy");
    let bad_out = bad_out.to_str().unwrap();

    // --vram-budget: a size, and only where the GPU computes (a CPU run's ceiling is --ram-budget)
    one_line(&["run", "-m", &d, "--vram-budget", "0", "-p", "hi"], "no budget");
    last_line(&["run", "-m", &d, "--vram-budget", "1G", "-p", "hi", "-n", "1"], "--ram-budget");
    last_line(&["bench", "-m", &d, "--vram-budget", "1G", "-p", "8", "-n", "1", "-r", "1"], "--ram-budget");
    last_line(&["plan", "-m", &d, "--vram-budget", "1G"], "-ngl 99");
    // top level
    one_line(&["frobnicate"], "unrecognized subcommand");
    one_line(&["--bogus"], "--bogus");
    // run: every value range-checked, naming the flag
    for (flag, value, want) in [
        ("-n", "abc", "--n-predict"),
        ("-n", "-2", "-1..="),
        ("--temp", "-1", "--temp"),
        ("--temp", "nan", "finite"),
        ("--top-p", "2", "0..=1"),
        ("--min-p", "-0.1", "--min-p"),
        ("--top-k", "-1", "--top-k"),
        ("--repeat-penalty", "0", "--repeat-penalty"),
        ("--presence-penalty", "1e9", "--presence-penalty"),
        ("--repeat-last-n", "-5", "--repeat-last-n"),
        ("--seed", "-7", "--seed"),
        ("-t", "0", "--threads"),
        ("-t", "lots", "--threads"),
        ("-c", "4611686018427387904", "--ctx-size"),
        ("-b", "0", "--batch-size"),
        ("-ub", "0", "--ubatch-size"),
        ("--ram-budget", "12Q", "--ram-budget"),
        ("--ram-budget", "-3G", "--ram-budget"),
        ("--isa", "avx9000", "--isa"),
        ("--prefill-scan", "sideways", "--prefill-scan"),
    ] {
        one_line(&["run", "-m", &d, flag, value], want);
    }
    one_line(&["run", "-m", &d, "--bogus"], "--bogus");
    one_line(&["run", "-m", &d], "no prompt");
    one_line(&["run", "-m", &d, "-p", "x", "--ids", "1"], "cannot be used with");
    one_line(&["run", "-m", &d, "-n"], "a value is required");
    one_line(&["run", "-m", "/no/such/model.gguf", "-p", "x"], "no such file");
    one_line(&["run", "-m", &empty_dir, "-p", "x"], "holds no .gguf");
    one_line(&["run", "-m", &not_gguf, "-p", "x"], "not a GGUF file");
    one_line(&["run", "-m", "qwen3.6-35b-a3b", "-p", "x"], "did you mean");
    one_line(&["run", "-m", &d, "-f", "/no/such/prompt.txt"], "-f");
    last_line(&["run", "-m", &d, "--ids", "99999999"], "outside the vocabulary");
    last_line(&["run", "-m", &d, "--ids", "x"], "not a token id");
    last_line(&["run", "-m", &d, "-p", ""], "tokenizes to nothing");
    last_line(&["run", "-m", &d, "-c", "4", "-p", "def add(a, b): return a + b"], "does not fit the context");
    // chat
    one_line(&["chat", "-m", &d, "-n", "x"], "--n-predict");
    one_line(&["chat", "-m", &d, "--top-p", "-1"], "--top-p");
    one_line(&["chat", "-m", "/no/such/model.gguf"], "no such file");
    // serve
    one_line(&["serve", "-m", &d, "--port", "70000"], "--port");
    one_line(&["serve", "-m", &d, "-np", "0"], "--parallel");
    one_line(&["serve", "-m", &d, "-np", "100000"], "--parallel");
    one_line(&["serve", "-m", &d, "--max-body", "0"], "--max-body");
    one_line(&["serve", "-m", &d, "--queue", "-1"], "--queue");
    last_line(&["serve", "-m", &d, "--chat-template-file", "/no/such/template.jinja"], "--chat-template-file");
    // inspect
    one_line(&["inspect"], "<FILE>");
    one_line(&["inspect", "/no/such/model.gguf"], "model.gguf");
    one_line(&["inspect", "-m", "/no/such/model.gguf"], "model.gguf");
    one_line(&["inspect", "a.gguf", "-m", "b.gguf"], "cannot be used with");
    one_line(&["inspect", &not_gguf], "not a GGUF file");
    one_line(&["inspect", &empty_dir], "xwen: ");
    one_line(&["inspect", &d, "--bogus"], "--bogus");
    // tokenize
    one_line(&["tokenize"], "<TEXT>");
    one_line(&["tokenize", "-m", "/no/such/model.gguf", "hello"], "model.gguf");
    one_line(&["tokenize", "-m", &d, "-f", "/no/such/text.txt"], "text.txt");
    one_line(&["tokenize", "-m", &d], "<TEXT>");
    // logits
    one_line(&["logits", "-m", &d, "--out", "x.npy"], "--ids");
    one_line(&["logits", "-m", &d, "--ids", "1"], "--out");
    last_line(&["logits", "-m", &d, "--ids", "", "--out", "x.npy"], "empty");
    last_line(&["logits", "-m", &d, "--ids", "1,2", "--out", bad_out], "writing");
    // bench
    one_line(&["bench", "-m", &d, "-p", "x"], "--n-prompt");
    one_line(&["bench", "-m", &d, "-r", "0"], "--repetitions");
    one_line(&["bench", "-m", &d, "--parallel", "0"], "--parallel");
    one_line(&["bench", "-m", &d, "-npl", "1,x"], "--parallel");
    one_line(&["bench", "-m", &d, "-o", "xml"], "--output");
    one_line(&["bench"], "-m MODEL");
    one_line(&["bench", "-m", "/no/such/model.gguf"], "no such file");
    // synth
    one_line(&["synth", "--preset", "nope", "--out", "x.gguf"], "unknown preset");
    one_line(&["synth", "--preset", "qwen35-tiny"], "--out");
    // pull (offline: nothing is fetched)
    one_line(&["pull"], "<MODEL>");
    one_line(&["pull", "not a repo"], "no such file");
    // completions
    one_line(&["completions", "nosh"], "nosh");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_and_version_work_everywhere() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    for cmd in ["run", "chat", "serve", "inspect", "tokenize", "logits", "bench", "synth", "pull", "completions"] {
        let h = run(&[cmd, "--help"]);
        assert!(h.contains("Usage: xwen") && h.contains("Examples:"), "{cmd} --help:\n{h}");
        assert_eq!(run(&["help", cmd]), h, "xwen help {cmd}");
    }
    let top = run(&["--help"]);
    for cmd in ["run", "chat", "serve", "inspect", "tokenize", "logits", "bench", "synth", "pull", "completions"] {
        assert!(top.contains(&format!("  {cmd} ")), "{cmd} missing from xwen --help");
    }
    let v = run(&["--version"]);
    assert!(v.starts_with(&format!("xwen {} (commit ", env!("CARGO_PKG_VERSION"))) && v.contains("kernels: "), "{v}");
    assert!(run(&["completions", "bash"]).contains("_xwen"));
}

#[test]
fn llama_cpp_habits_are_accepted() {
    let d = demo();
    let ok = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{args:?}: {err}");
        (String::from_utf8_lossy(&out.stdout).to_string(), err)
    };
    // --flag=value, a repeated flag keeping the last, -ngl 0 (the CPU), -s, -b/-ub, --no-mmap
    let (a, _) = ok(&["run", "-m", &d, "-p", "def f(", "--n-predict=3", "-n", "5", "--temp", "0", "--print-ids", "-q"]);
    assert_eq!(a.split_whitespace().count(), 5, "{a}");
    let (_, err) = ok(&["run", "-m", &d, "-p", "def f(", "-n", "2", "-ngl", "0"]);
    assert!(!err.contains("error"), "{err}");
    let (b, _) = ok(&["run", "-m", &d, "-p", "def f(", "-n", "5", "--temp", "0", "--print-ids", "-q", "-b", "2", "-ub", "1", "--no-mmap"]);
    assert_eq!(a, b, "prefill in steps of one token read into memory");
    // a random seed by default, printed; the printed seed repeats the run
    let sample = |seed: Option<&str>| {
        let mut args = vec!["run", "-m", &d, "-p", "def f(", "-n", "12", "--temp", "1.5", "--top-k", "0", "--print-ids"];
        if let Some(s) = seed {
            args.extend(["-s", s]);
        }
        let (out, err) = ok(&args);
        let seed = err.lines().find_map(|l| l.strip_prefix("xwen: seed ")).and_then(|l| l.split_whitespace().next()).map(str::to_string);
        (out, seed.expect("the seed is printed"))
    };
    let (x, sx) = sample(None);
    let (y, sy) = sample(None);
    assert_ne!(sx, sy, "two runs drew the same default seed");
    let (x2, _) = sample(Some(&sx));
    assert_eq!(x, x2, "--seed {sx} did not repeat the run");
    let _ = y;
    // -m DIR holding one GGUF
    let dir = scratch("habits").join("one");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&d, dir.join("tiny.gguf")).unwrap();
    let (c, _) = ok(&["run", "-m", dir.to_str().unwrap(), "-p", "def f(", "-n", "5", "--temp", "0", "--print-ids", "-q"]);
    assert_eq!(a, c);
    std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
}

/// `-ngl 99` on a machine or build without CUDA is a one-line error naming what is missing (a
/// build without the feature, or no driver / device), never a crash; a partial layer split is
/// refused until it exists; a bad --device is refused.
#[test]
fn gpu_flags_without_a_gpu_are_clear_errors() {
    let d = demo();
    let fail = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{args:?} succeeded: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        err
    };
    for cmd in ["run", "bench"] {
        let mut args = vec![cmd, "-m", &d, "-ngl", "99"];
        if cmd == "run" {
            args.extend(["-p", "def f(", "-n", "2"]);
        } else {
            args.extend(["-p", "8", "-n", "2", "-r", "1"]);
        }
        let err = fail(&args);
        assert!(err.contains("CUDA") || err.contains("cuda"), "{cmd}: {err}");
    }
    let err = fail(&["plan", "-m", &d, "-ngl", "99"]);
    assert!(err.contains("CUDA") || err.contains("cuda"), "plan: {err}");
    // the engine's commands on the GPU: refused at load, before a port is bound or a line read
    let npy = std::env::temp_dir().join(format!("xwen-ngl-logits-{}.npy", std::process::id()));
    for args in [
        vec!["chat", "-m", &d, "-ngl", "99"],
        vec!["serve", "-m", &d, "-ngl", "99", "--port", "0"],
        vec!["logits", "-m", &d, "-ngl", "99", "--ids", "1,2", "--out", npy.to_str().unwrap()],
    ] {
        let err = fail(&args);
        assert!(err.contains("CUDA") || err.contains("cuda"), "{args:?}: {err}");
    }
    assert!(!npy.exists(), "a refused logits run writes nothing");
    let v = Command::new(env!("CARGO_BIN_EXE_xwen")).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&v.stdout).contains("cuda:"), "--version names the CUDA backend's state");
    let err = fail(&["run", "-m", &d, "-p", "def f(", "-n", "2", "-ngl", "3"]);
    assert!(err.contains("split"), "{err}");
    let err = fail(&["run", "-m", &d, "-p", "def f(", "-n", "2", "--device", "gpu7"]);
    assert!(err.contains("--device"), "{err}");
}
