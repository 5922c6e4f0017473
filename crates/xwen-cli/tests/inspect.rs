//! `xwen inspect` on files made by the GGUF writer, through the built binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use xwen_gguf::{GgmlType, GgufWriter, Value};

fn scratch_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xwen-inspect-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A qwen35-shaped file: 4 layers (one full attention), a 100-token vocabulary, mixed types.
fn write_model(path: &Path) {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::from("qwen35"));
    w.add_kv("general.name", Value::from("Inspect Test"));
    w.add_kv("general.file_type", Value::U32(7));
    w.add_kv("qwen35.block_count", Value::U32(4));
    w.add_kv("qwen35.context_length", Value::U32(1024));
    w.add_kv("qwen35.embedding_length", Value::U32(64));
    w.add_kv("qwen35.attention.head_count", Value::U32(4));
    w.add_kv("qwen35.attention.head_count_kv", Value::U32(2));
    w.add_kv("qwen35.attention.key_length", Value::U32(16));
    w.add_kv("qwen35.attention.value_length", Value::U32(16));
    w.add_kv("qwen35.full_attention_interval", Value::U32(4));
    w.add_kv("qwen35.ssm.conv_kernel", Value::U32(4));
    w.add_kv("qwen35.ssm.state_size", Value::U32(16));
    w.add_kv("qwen35.ssm.group_count", Value::U32(2));
    w.add_kv("qwen35.ssm.inner_size", Value::U32(32));
    w.add_kv("qwen35.rope.freq_base", Value::F32(1e7));
    let tokens: Vec<Value> = (0..100).map(|i| Value::Str(format!("t{i}"))).collect();
    w.add_kv("tokenizer.ggml.tokens", Value::Array(tokens));
    w.add_tensor(
        "token_embd.weight",
        GgmlType::Q8_0,
        &[64, 100],
        vec![0; 34 * 2 * 100],
    )
    .unwrap();
    w.add_tensor("output_norm.weight", GgmlType::F32, &[64], vec![0; 256])
        .unwrap();
    w.add_tensor(
        "blk.0.ffn_up.weight",
        GgmlType::Q8_0,
        &[64, 8],
        vec![1; 34 * 2 * 8],
    )
    .unwrap();
    w.write_file(path).unwrap();
}

fn xwen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xwen"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[test]
fn human_output_describes_the_file() {
    let dir = scratch_dir("text");
    let path = dir.join("m.gguf");
    write_model(&path);
    let o = xwen(&["inspect", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for needle in [
        "architecture:  qwen35",
        "name:          Inspect Test",
        "file type:     Q8_0 (7)",
        "GGUF version:  3",
        "tensors:       3",
        "hyperparameters (qwen35.*):",
        "block_count",
        "tokenizer.ggml.tokens: arr[str] = [str; 100] \"t0\", \"t1\"",
        "Q8_0",
        "memory a run needs",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    // Q8_0: 6800 + 544 bytes in two tensors; total with the F32 norm: 7600.
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().take(3).collect::<Vec<_>>() == ["Q8_0", "2", "7344"]),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().take(3).collect::<Vec<_>>() == ["total", "3", "7600"]),
        "{text}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn json_output() {
    let dir = scratch_dir("json");
    let path = dir.join("m.gguf");
    write_model(&path);
    let o = xwen(&["inspect", path.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["architecture"], "qwen35");
    assert_eq!(j["name"], "Inspect Test");
    assert_eq!(j["version"], 3);
    assert_eq!(j["tensor_count"], 3);
    assert_eq!(j["metadata"]["qwen35.block_count"], 4);
    assert_eq!(j["metadata"]["qwen35.rope.freq_base"], 1e7);
    let toks = &j["metadata"]["tokenizer.ggml.tokens"];
    assert_eq!(
        (&toks["type"], &toks["len"]),
        (&"str".into(), &100.into()),
        "{toks}"
    );
    assert_eq!(toks["head"].as_array().unwrap().len(), 16);
    assert_eq!(toks["head"][15], "t15");
    let t = &j["tensors"][0];
    assert_eq!(t["name"], "token_embd.weight");
    assert_eq!(t["type"], "Q8_0");
    assert_eq!(t["shape"], serde_json::json!([64, 100]));
    assert_eq!(
        (t["offset"].as_u64(), t["bytes"].as_u64()),
        (Some(0), Some(6800))
    );
    assert_eq!(
        j["tensors"][1]["offset"], 6816,
        "second tensor starts at the next 32-byte boundary"
    );
    // 1 attention layer of 4: 2 KV heads × (16 + 16) × 2 bytes (f16, the default) per token, at n_ctx 1024.
    let m = &j["memory_estimate"];
    assert_eq!(
        (
            m["attention_layers"].as_u64(),
            m["recurrent_layers"].as_u64()
        ),
        (Some(1), Some(3))
    );
    assert_eq!(m["kv_bytes"].as_u64(), Some(128 * 1024));
    // what -ngl 99 would hold on a GPU: a number in a build with the CUDA backend (no device
    // needed to say it), null without one; the key is always there
    let vram = j.get("vram_bytes").expect("a vram_bytes key");
    assert!(vram.is_null() || vram.as_u64().is_some_and(|b| b > m["kv_bytes"].as_u64().unwrap()), "{vram}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn corrupt_and_foreign_files_fail_with_one_line() {
    let dir = scratch_dir("bad");
    let good = dir.join("m.gguf");
    write_model(&good);
    let bytes = std::fs::read(&good).unwrap();
    let cases = [
        (
            "truncated.gguf",
            bytes[..bytes.len() - 300].to_vec(),
            "past the end of the file",
        ),
        ("text.gguf", b"hello, world\n".to_vec(), "not a GGUF file"),
        ("empty.gguf", Vec::new(), "truncated file"),
    ];
    for (name, content, expect) in cases {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        let o = xwen(&["inspect", p.to_str().unwrap()]);
        let err = stderr(&o);
        assert!(!o.status.success(), "{name} accepted");
        assert!(stdout(&o).is_empty(), "{name}: printed {}", stdout(&o));
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(
            err.starts_with("xwen: ") && err.contains(expect),
            "{name}: {err}"
        );
    }
    let o = xwen(&["inspect", dir.join("missing.gguf").to_str().unwrap()]);
    assert!(
        !o.status.success() && stderr(&o).contains("missing.gguf"),
        "{}",
        stderr(&o)
    );
    let o = xwen(&["inspect"]);
    assert!(
        !o.status.success() && stderr(&o).contains("usage"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_moe_model_reports_its_ram_budget_floor() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond");
    let run = |file: &Path, json: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_xwen"));
        c.arg("inspect").arg(file);
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let moe = root.join("qwen3_5_moe/model-q4_k_m.gguf");
    assert!(run(&moe, false).contains("with --ram-budget the routed experts"));
    let j: serde_json::Value = serde_json::from_str(&run(&moe, true)).unwrap();
    assert!(j["ram_budget_floor_bytes"].as_u64().is_some_and(|b| b > 0), "{}", j["ram_budget_floor_bytes"]);
    let dense = root.join("qwen3_5/model-q4_k_m.gguf");
    assert!(!run(&dense, false).contains("--ram-budget"));
    let j: serde_json::Value = serde_json::from_str(&run(&dense, true)).unwrap();
    assert!(j["ram_budget_floor_bytes"].is_null());
}

/// For an architecture xwen runs, the estimate is the engine's own state shapes: kimi-linear's
/// MLA keeps a latent K (kv_lora_rank + rope) and V (kv_lora_rank) per position in one head,
/// and its KDA layers a per-channel recurrent state with three convolution windows.
#[test]
fn the_estimate_of_a_registered_architecture_is_the_engines() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond/kimi_linear/model-q8_0.gguf");
    let o = xwen(&["inspect", model.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let m = &j["memory_estimate"];
    assert_eq!((m["attention_layers"].as_u64(), m["recurrent_layers"].as_u64()), (Some(1), Some(3)), "{m}");
    // (256 + 32) K + 256 V, f16
    assert_eq!(m["kv_bytes_per_token"].as_u64(), Some((288 + 256) * 2), "{m}");
    // 3 KDA layers: conv windows 3 × (3 × 256) f32 + 4 heads × 64 × 64 f32 state
    assert_eq!(m["recurrent_state_bytes"].as_u64(), Some(3 * (3 * 3 * 256 + 4 * 64 * 64) * 4), "{m}");
}
