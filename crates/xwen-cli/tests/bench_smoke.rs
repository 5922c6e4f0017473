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

fn temp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("xwen-bench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn bench_json_has_llama_bench_fields() {
    let dir = temp_dir();
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
