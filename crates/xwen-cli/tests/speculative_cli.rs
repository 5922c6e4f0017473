//! `xwen run --draft ngram` and `-md FILE`: the same greedy ids as plain decoding, the drafter's
//! figures in the closing line and in --json, and a draft model of another vocabulary refused.

use std::process::Command;

fn demo() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo/tiny-qwen35-q4_k_m.gguf").to_string()
}

fn run(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{args:?}: {err}");
    (String::from_utf8_lossy(&out.stdout).to_string(), err)
}

#[test]
fn drafted_runs_print_plain_greedy_ids() {
    let d = demo();
    let base = ["run", "-m", &d, "-p", "def fibonacci(n):\n", "-n", "96", "--temp", "0", "--print-ids", "-t", "2"];
    let (plain, _) = run(&base);
    let (ngram, err) = run(&[&base[..], &["--draft", "ngram", "--draft-max", "6"]].concat());
    assert_eq!(ngram, plain);
    assert!(err.contains("draft ngram:") && err.contains("tokens per step"), "{err}");
    // the demo model drafting for itself: every draft accepted
    let (own, err) = run(&[&base[..], &["-md", &d, "--draft-p-min", "0"]].concat());
    assert_eq!(own, plain);
    assert!(err.contains("(100%)"), "{err}");
    let (json, _) = run(&["run", "-m", &d, "-p", "def f(", "-n", "24", "--temp", "0", "--json", "-q", "--draft", "ngram"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["draft"]["kind"], "ngram");
    assert!(v["draft"]["steps"].as_u64().unwrap() > 0);
    check_per_position(&v["draft"]);
}

/// A drafter's counts by draft position add up to its totals, and a draft is only accepted
/// where every draft before it in the step was.
fn check_per_position(d: &serde_json::Value) {
    let at = |k: &str| -> Vec<u64> { d[k].as_array().unwrap_or_else(|| panic!("{k} in {d}")).iter().map(|x| x.as_u64().unwrap()).collect() };
    let (drafted, accepted) = (at("drafted_per_pos"), at("accepted_per_pos"));
    assert_eq!(drafted.iter().sum::<u64>(), d["drafted"].as_u64().unwrap(), "{d}");
    assert_eq!(accepted.iter().sum::<u64>(), d["accepted"].as_u64().unwrap(), "{d}");
    assert!(drafted.windows(2).all(|w| w[0] >= w[1]) && accepted.windows(2).all(|w| w[0] >= w[1]), "{d}");
    assert!(drafted.iter().zip(&accepted).all(|(d, a)| a <= d), "{d}");
}

/// `xwen bench --draft`: plain and drafted decoding of the same prompt, both rates, and the
/// drafter's counts; a drafted run that departed from plain greedy would fail the command.
#[test]
fn bench_compares_a_drafter_with_plain_decoding() {
    let d = demo();
    let (json, _) = run(&["bench", "-m", &d, "--draft", "ngram", "--draft-prompt", "def fibonacci(n):\n", "-n", "48", "-r", "2", "-t", "2", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!((v["draft"].as_str(), v["n_gen"].as_u64(), v["repetitions"].as_u64()), (Some("ngram"), Some(48), Some(2)), "{v}");
    assert_eq!(v["identical"], true);
    assert!(v["plain_median_ts"].as_f64().unwrap() > 0.0 && v["draft_median_ts"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["drafted"].as_u64().unwrap() > 0, "the demo's repetitive greedy text gives n-gram drafts: {v}");
    check_per_position(&v);
    // the table form names the drafter and the speedup
    let (md, _) = run(&["bench", "-m", &d, "-md", &d, "--draft-p-min", "0", "-n", "16", "-r", "1", "-t", "2", "-p", "8"]);
    assert!(md.contains("| model (max 8) | random 8 | tg16 |") && md.contains("×"), "{md}");
    // what bench cannot do with a drafter is said
    for (args, says) in [
        (vec!["--draft", "none"], "nothing to compare"),
        (vec!["--draft", "ngram", "--verify", "1,2"], "without --verify"),
        (vec!["--draft", "ngram", "-n", "1"], "at least 2 tokens"),
        (vec!["--draft", "ngram", "--draft-file", "/nonexistent/edit.txt"], "--draft-file"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args([&["bench", "-m", &d, "-r", "1"][..], &args[..]].concat()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
    }
}

/// The trained MoE with the trained dense model as its draft (same tokenizer), from ../shared.
#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn a_trained_draft_model_keeps_the_moe_output() {
    let shared = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/models/gguf");
    let (moe, dense) = (format!("{shared}/tiny-qwen35moe-q4_k_m.gguf"), format!("{shared}/tiny-qwen35-q4_k_m.gguf"));
    assert!(std::path::Path::new(&moe).exists(), "{moe} is missing");
    let base = ["run", "-m", &moe, "-p", "import os\n", "-n", "64", "--temp", "0", "--print-ids", "-t", "2"];
    let (plain, _) = run(&base);
    let (drafted, err) = run(&[&base[..], &["-md", &dense]].concat());
    assert_eq!(drafted, plain, "{err}");
    assert!(err.contains("draft model:"), "{err}");
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let fx = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/parity/cond/qwen3_5/model-q8_0.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(["run", "-m", &demo(), "-p", "x", "-n", "4", "--temp", "0", "-md", fx]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("same vocabulary"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(["run", "-m", &demo(), "-p", "x", "--draft", "model"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("-md FILE"));
}

/// `xwen chat --draft ngram`: every reply is the plain chat's, turn after turn (the drafted
/// turns leave the state holding exactly what the plain ones do).
#[test]
fn a_drafted_chat_gives_the_plain_replies() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("xwen-spec-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = demo();
    let mut replies = Vec::new();
    for (i, draft) in [&[][..], &["--draft", "ngram"][..], &["-md", &d][..]].iter().enumerate() {
        let saved = dir.join(format!("c{i}.json"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_xwen"))
            .args(["chat", "-m", &d, "--temp", "0", "-t", "1", "-n", "48"])
            .args(*draft)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let input = format!("def add(a, b):\nimport sys\nclass Stack:\n/save {}\n", saved.display());
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        if !draft.is_empty() {
            assert!(err.contains("tokens per step"), "{err}");
        }
        replies.push(std::fs::read_to_string(&saved).unwrap());
    }
    assert_eq!(replies[1], replies[0], "ngram-drafted chat differs from the plain one");
    assert_eq!(replies[2], replies[0], "model-drafted chat differs from the plain one");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--draft contrary` drafts tokens the model does not take: the output is plain greedy's, no
/// draft is accepted, and the controller pauses it (few tokens drafted over a long run); it
/// takes no file and serve refuses it (a benchmark drafter).
#[test]
fn a_contrary_drafter_is_never_right_and_paused() {
    let d = demo();
    let base = ["run", "-m", &d, "-p", "def fibonacci(n):\n", "-n", "200", "--temp", "0", "--print-ids", "-t", "2", "--ignore-eos"];
    let (plain, _) = run(&base);
    let (got, err) = run(&[&base[..], &["--draft", "contrary"]].concat());
    assert_eq!(got, plain);
    let line = err.lines().find(|l| l.contains("draft contrary")).unwrap_or_else(|| panic!("no draft line: {err}"));
    assert!(line.contains(" 0 accepted") || line.contains("0 / ") || line.contains("(0%)"), "{line}");
    // depth 8, then 1 a step until the pause: far fewer than one draft a token
    let drafted: usize = line.split(" drafted").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("{line}"));
    assert!(drafted > 0 && drafted < 40, "{line}");
    let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(["run", "-m", &d, "-p", "x", "--draft", "contrary:f"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("takes no file"));
}

/// `--draft replay:FILE` drafts a known continuation (`--print-ids`'s): every draft right, the
/// output the plain one, several tokens a step — the verify's upper bound. A file of ids outside the vocabulary or of no ids at all is refused or drafts nothing.
#[test]
fn a_replayed_continuation_is_every_draft_right() {
    let d = demo();
    let base = ["run", "-m", &d, "-p", "def fibonacci(n):\n", "-n", "80", "--temp", "0", "--print-ids", "-t", "2", "--ignore-eos"];
    let (plain, _) = run(&base);
    let dir = std::env::temp_dir().join(format!("xwen-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ids = dir.join("ids.txt");
    std::fs::write(&ids, &plain).unwrap();
    let spec = format!("replay:{}", ids.display());
    let (got, err) = run(&[&base[..], &["--draft", &spec, "--draft-max", "6"]].concat());
    assert_eq!(got, plain);
    assert!(err.contains("draft replay:") && err.contains("(100%)"), "{err}");
    let per_step: f64 = err.split(" tokens per step").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    // (the controller may cap the depth where its measured verify cost says a shallower one pays
    // more — on this small model it can; how deep depends on the machine's timing)
    assert!(per_step > 2.0, "a perfect drafter at up to depth 6: {err}");
    // a continuation of another text drafts, is rejected, and changes nothing
    std::fs::write(&ids, "1 2 3 4 5 6 7 8").unwrap();
    let (got, _) = run(&[&base[..], &["--draft", &spec]].concat());
    assert_eq!(got, plain);
    std::fs::write(&ids, "99999999").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args([&base[..], &["--draft", &spec]].concat()).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("outside the vocabulary"));
    let _ = std::fs::remove_dir_all(&dir);
}
