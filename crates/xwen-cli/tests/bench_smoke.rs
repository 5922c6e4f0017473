//! `xwen synth` writes a tiny synthetic model and `xwen bench --json` reports on it with
//! llama-bench's field names. No timing assertions: only shape and consistency.

use std::path::PathBuf;
use std::process::Command;

fn xwen(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).output().expect("run xwen");
    assert!(
        out.status.success(),
        "xwen {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// A folder of this test alone (tests run in parallel in one process).
fn temp_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xwen-bench-smoke-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn bench_json_has_llama_bench_fields() {
    let dir = temp_dir("json");
    let model = dir.join("qwen35-tiny.gguf");
    let model_s = model.to_str().unwrap();
    let synth_out = xwen(&["synth", "--preset", "qwen35-tiny", "--out", model_s, "--seed", "3"]);
    assert!(synth_out.contains("wrote"), "{synth_out}");

    let out = xwen(&["bench", "-m", model_s, "-p", "16", "-n", "4", "-r", "2", "-t", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let tests = v.as_array().expect("a JSON array");
    assert_eq!(tests.len(), 2, "one pp and one tg test: {out}");
    for (t, (p, n)) in tests.iter().zip([(16, 0), (0, 4)]) {
        assert_eq!(t["n_prompt"].as_u64(), Some(p));
        assert_eq!(t["n_gen"].as_u64(), Some(n));
        assert_eq!(t["n_threads"].as_u64(), Some(1));
        assert_eq!(t["model_filename"].as_str(), Some(model_s));
        assert_eq!(t["model_type"].as_str(), Some("qwen35 ?B Q4_K - Medium"));
        let size = t["model_size"].as_u64().unwrap();
        let file_len = std::fs::metadata(&model).unwrap().len();
        assert!(size > 0 && size < file_len, "model_size {size} counts tensor bytes of a {file_len}-byte file");
        assert!(t["model_n_params"].as_u64().unwrap() > 1_000_000);
        // Dense: everything but token_embd, of which one row.
        let decode = t["decode_weight_bytes"].as_u64().unwrap();
        assert!(decode > size / 2 && decode < size, "decode_weight_bytes {decode} of {size}");
        let ns: Vec<u64> = t["samples_ns"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        let ts: Vec<f64> = t["samples_ts"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!((ns.len(), ts.len()), (2, 2));
        for (&a, &b) in ns.iter().zip(&ts) {
            assert!(a > 0);
            let want = 1e9 * (p + n) as f64 / a as f64;
            assert!((b - want).abs() <= 1e-6 * want, "samples_ts {b} vs {want}");
        }
        let avg_ns = t["avg_ns"].as_u64().unwrap();
        assert!(avg_ns >= *ns.iter().min().unwrap() && avg_ns <= *ns.iter().max().unwrap());
        let avg_ts = t["avg_ts"].as_f64().unwrap();
        assert!((avg_ts - (ts[0] + ts[1]) / 2.0).abs() <= 1e-6 * avg_ts);
        assert!(t["stddev_ts"].as_f64().unwrap() >= 0.0);
        assert!(t["stddev_ns"].is_u64());
        assert!(t["test_time"].as_str().unwrap().ends_with('Z'));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_rejects_a_missing_model() {
    let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(["bench", "-p", "8", "-n", "0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("-m MODEL"));
}

#[test]
fn membw_reports_a_bandwidth_and_refuses_a_model_or_a_cache_sized_buffer() {
    let out = xwen(&["bench", "--membw", "-t", "2", "-r", "2", "--membw-mib", "64", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["test"].as_str(), Some("membw"));
    assert_eq!(v["n_threads"].as_u64(), Some(2));
    assert_eq!(v["buffer_bytes"].as_u64(), Some(64 << 20));
    let s: Vec<f64> = v["samples_gbs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    assert_eq!(s.len(), 2);
    assert!(s.iter().all(|g| g.is_finite() && *g > 0.0));
    assert_eq!(v["best_gbs"].as_f64(), Some(s[0].max(s[1])));
    for (args, msg) in [
        (&["bench", "--membw", "-m", "x.gguf"][..], "cannot be used with"),
        (&["bench", "--membw", "--membw-mib", "8"][..], "may fit in a cache"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).output().unwrap();
        assert!(!o.status.success(), "{args:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(msg), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// scripts/bench-vs-llamacpp end to end with a stand-in llama-bench (a script printing
/// llama-bench's JSON): alternation, medians, ratios and the --floor shares.
#[test]
fn side_by_side_script_runs_with_a_stand_in_llama_bench() {
    // python3 is the script's interpreter (and .ci/run's): its absence is a failure, not a skip
    let dir = temp_dir("script");
    let model = dir.join("qwen35-tiny.gguf");
    let model_s = model.to_str().unwrap();
    xwen(&["synth", "--preset", "qwen35-tiny", "--out", model_s, "--seed", "5"]);
    let fake = dir.join("llama-bench");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho '[{\"n_prompt\": 16, \"n_gen\": 0, \"avg_ts\": 100.0}, {\"n_prompt\": 0, \"n_gen\": 4, \"avg_ts\": 10.0}]'\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let json_out = dir.join("out.json");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/bench-vs-llamacpp");
    let out = Command::new("python3")
        .args([script, "-m", model_s, "-t", "1", "-p", "16", "-n", "4", "--rounds", "2", "--floor", "--no-build"])
        .arg("--json-out")
        .arg(&json_out)
        .env("LLAMA_CPP_BIN", &dir)
        .env("XWEN_BIN", env!("CARGO_BIN_EXE_xwen"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("|           pp16 |") && stdout.contains("|            tg4 |"), "{stdout}");
    // xwen reads the file back in 2 MiB pages each round unless --keep-page-cache
    assert!(stdout.contains("--reread-huge-pages"), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    let summary = v["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 2);
    for s in summary {
        let (l, x) = (s["llama_cpp_median_ts"].as_f64().unwrap(), s["xwen_median_ts"].as_f64().unwrap());
        assert!((s["ratio"].as_f64().unwrap() - x / l).abs() < 1e-9 * (x / l));
        assert_eq!(s["xwen_samples_ts"].as_array().unwrap().len(), 2);
    }
    let floor = v["floor"].as_array().unwrap();
    assert_eq!(floor.len(), 1, "the floor is decode's only");
    assert_eq!(floor[0]["test"].as_str(), Some("tg4"));
    assert_eq!(floor[0]["membw_best_gbs"].as_array().unwrap().len(), 2);
    for (best, ba) in floor[0]["membw_best_gbs"].as_array().unwrap().iter().zip(floor[0]["membw_before_after_gbs"].as_array().unwrap()) {
        let ba: Vec<f64> = ba.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(ba.len(), 2, "read before and after each round");
        assert_eq!(best.as_f64(), Some(ba[0].max(ba[1])));
    }
    // llama.cpp's stand-in decodes at 10 t/s: its share is 10 x bytes / bandwidth, per round
    let share = floor[0]["llama_cpp_share"].as_f64().unwrap();
    assert!(share > 0.0 && share.is_finite());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// scripts/bench-ram-limited with a stand-in llama-bench: both engines run inside a memory cgroup
/// below the model's size and the medians come out. Needs a writable cgroup memory controller
/// (root); elsewhere it says SKIP.
#[cfg(target_os = "linux")]
#[test]
fn ram_limited_script_runs_with_a_stand_in_llama_bench() {
    let probe = ["/sys/fs/cgroup/cgroup.controllers", "/sys/fs/cgroup/memory"]
        .iter()
        .map(std::path::Path::new)
        .find(|p| p.exists())
        .map(|p| if p.is_dir() { p.join(format!("xwen-probe-{}", std::process::id())) } else { p.with_file_name(format!("xwen-probe-{}", std::process::id())) });
    // a group we may create and whose memory we may limit (cgroup v2 enables the controller
    // per subtree: its file may be missing)
    let writable = probe.is_some_and(|d| {
        let made = std::fs::create_dir(&d).is_ok();
        let limits = made && (d.join("memory.max").exists() || d.join("memory.limit_in_bytes").exists());
        made && std::fs::remove_dir(&d).is_ok() && limits
    });
    if !writable {
        eprintln!("SKIP ram_limited_script: no writable cgroup memory controller (needs root)");
        return;
    }
    let dir = temp_dir("ramlimit");
    let model = dir.join("qwen35moe-small.gguf");
    let model_s = model.to_str().unwrap();
    xwen(&["synth", "--preset", "qwen35moe-small", "--out", model_s]);
    let fake = dir.join("llama-bench");
    std::fs::write(&fake, "#!/bin/sh\necho '[{\"n_prompt\": 0, \"n_gen\": 4, \"avg_ts\": 0.5}]'\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/bench-ram-limited");
    // the script with `test` (its -n or -p) under a 400M limit and a 200M budget: (stdout, stderr)
    let run = |test: [&str; 2], rounds: &str| {
        let out = Command::new("bash")
            .args([script, "-m", model_s, "-l", "400M", "-b", "200M", "-t", "1", test[0], test[1], "--rounds", rounds])
            .env("LLAMA_CPP_BIN", &dir)
            .env("XWEN_BIN", env!("CARGO_BIN_EXE_xwen"))
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
        assert!(out.status.success(), "{stdout}\n{stderr}");
        (stdout, stderr)
    };
    let (stdout, stderr) = run(["-n", "4"], "2");
    assert_eq!(stderr.matches("xwen (--ram-budget 200M) tg4:").count(), 2, "{stderr}");
    assert!(!stderr.contains("failed"), "{stderr}");
    assert!(stdout.contains("memory limit 400M, tg4: llama.cpp 0.500 t/s"), "{stdout}");
    assert!(stdout.contains("xwen / llama.cpp"), "{stdout}");
    // -p: a prompt instead of decode
    let (stdout, stderr) = run(["-p", "40"], "1");
    assert!(stderr.contains("xwen (--ram-budget 200M) pp40:") && !stderr.contains("failed"), "{stderr}");
    assert!(stdout.contains("memory limit 400M, pp40: llama.cpp 0.500 t/s"), "{stdout}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bench_parallel_prints_llama_batched_bench_jsonl() {
    let dir = temp_dir("parallel");
    let model = dir.join("qwen35moe-tiny.gguf");
    let model_s = model.to_str().unwrap();
    xwen(&["synth", "--preset", "qwen35moe-tiny", "--out", model_s, "--seed", "5"]);
    let out = xwen(&["bench", "-m", model_s, "--parallel", "1,3", "-p", "8,5", "-n", "4", "-t", "2", "--json"]);
    let lines: Vec<serde_json::Value> =
        out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert_eq!(lines.len(), 4, "pp × tg × pl = 2 × 1 × 2 lines: {out}");
    for (v, (pp, pl)) in lines.iter().zip([(8, 1), (8, 3), (5, 1), (5, 3)]) {
        assert_eq!(v["pp"].as_u64(), Some(pp));
        assert_eq!(v["tg"].as_u64(), Some(4));
        assert_eq!(v["pl"].as_u64(), Some(pl));
        assert_eq!(v["n_kv"].as_u64(), Some(pl * (pp + 4)));
        let (t_pp, t_tg, t) = (v["t_pp"].as_f64().unwrap(), v["t_tg"].as_f64().unwrap(), v["t"].as_f64().unwrap());
        assert!(t_pp > 0.0 && t_tg > 0.0 && (t - t_pp - t_tg).abs() < 1e-9);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
        assert!(close(v["speed_pp"].as_f64().unwrap(), (pl * pp) as f64 / t_pp));
        assert!(close(v["speed_tg"].as_f64().unwrap(), (pl * 4) as f64 / t_tg));
        assert!(close(v["speed"].as_f64().unwrap(), (pl * (pp + 4)) as f64 / t));
        assert!(close(v["speed_tg_per_seq"].as_f64().unwrap(), v["speed_tg"].as_f64().unwrap() / pl as f64));
    }
    // the markdown table has llama-batched-bench's columns and one row per configuration
    let md = xwen(&["bench", "-m", model_s, "--parallel", "2", "-p", "4", "-n", "2", "-t", "1"]);
    assert!(md.contains("S_TG t/s") && md.contains("S_TG/seq"), "{md}");
    assert_eq!(md.lines().filter(|l| l.starts_with("|     4 |")).count(), 1, "{md}");
    let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(["bench", "-m", model_s, "--parallel", "0"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not a count of sequences in the allowed range 1..=256"));
}

/// scripts/bench-batched-vs-llamacpp with a stand-in llama-batched-bench (jsonl lines): the
/// medians, ratios and scaling come out for every N.
#[test]
fn batched_side_by_side_script_runs_with_a_stand_in_llama_batched_bench() {
    let dir = temp_dir("batched-script");
    let model = dir.join("qwen35-tiny.gguf");
    let model_s = model.to_str().unwrap();
    xwen(&["synth", "--preset", "qwen35-tiny", "--out", model_s, "--seed", "5"]);
    let fake = dir.join("llama-batched-bench");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho '{\"pp\": 8, \"tg\": 4, \"pl\": 1, \"speed_tg\": 10.0}'\necho '{\"pp\": 8, \"tg\": 4, \"pl\": 2, \"speed_tg\": 15.0}'\n",
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let json_out = dir.join("out.json");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/bench-batched-vs-llamacpp");
    let out = Command::new("python3")
        .args([script, "-m", model_s, "-t", "1", "-p", "8", "-n", "4", "--npl", "1,2", "--rounds", "2", "--no-build"])
        .arg("--json-out")
        .arg(&json_out)
        .env("LLAMA_CPP_BIN", &dir)
        .env("XWEN_BIN", env!("CARGO_BIN_EXE_xwen"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    let summary = v["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 2);
    for (s, want_llama) in summary.iter().zip([10.0, 15.0]) {
        assert_eq!(s["llama_cpp_median_speed_tg"].as_f64(), Some(want_llama));
        let x = s["xwen_median_speed_tg"].as_f64().unwrap();
        assert!(x > 0.0 && (s["ratio"].as_f64().unwrap() - x / want_llama).abs() < 1e-9 * x);
        assert_eq!(s["xwen_samples"].as_array().unwrap().len(), 2);
    }
    assert!(stdout.contains("|    2 |"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `-d` (llama-bench's --n-depth): every pp / tg test again on top of that much context, named
/// "… @ dN" and reported with n_depth; a depth that does not fit the context, or one given to
/// a test that sets its own context, is a clear error.
#[test]
fn bench_depth_runs_each_test_on_top_of_a_context() {
    let dir = temp_dir("depth");
    let model = dir.join("qwen35-tiny.gguf");
    let model_s = model.to_str().unwrap();
    xwen(&["synth", "--preset", "qwen35-tiny", "--out", model_s, "--seed", "3"]);

    let out = xwen(&["bench", "-m", model_s, "-p", "8", "-n", "4", "-d", "0,40", "-r", "1", "-t", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let got: Vec<(u64, u64, u64)> = v
        .as_array()
        .expect("a JSON array")
        .iter()
        .map(|t| (t["n_prompt"].as_u64().unwrap(), t["n_gen"].as_u64().unwrap(), t["n_depth"].as_u64().unwrap()))
        .collect();
    assert_eq!(got, [(8, 0, 0), (0, 4, 0), (8, 0, 40), (0, 4, 40)], "{out}");
    let md = xwen(&["bench", "-m", model_s, "-p", "8", "-n", "0", "-d", "40", "-r", "1", "-t", "1"]);
    assert!(md.contains("pp8 @ d40"), "{md}");

    let fail = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_xwen")).args(args).output().expect("run xwen");
        assert!(!out.status.success(), "xwen {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = fail(&["bench", "-m", model_s, "-c", "32", "-p", "8", "-n", "0", "-d", "40", "-t", "1"]);
    assert!(err.contains("raise -c") && !err.contains("panicked"), "{err}");
    let err = fail(&["bench", "-m", model_s, "--parallel", "2", "-d", "40", "-t", "1"]);
    assert!(err.contains("--n-depth") && !err.contains("panicked"), "{err}");
}
