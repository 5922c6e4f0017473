//! Route dumps (`xwen logits --dump-routes`) and tools/oracle/route_diff.py on them.

use std::process::Command;

/// `xwen logits --dump-routes` writes one decision per position and layer; route_diff finds
/// two identical dumps equal and names the first departure (with its margins) in a changed one.
#[test]
fn route_dumps_and_route_diff() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/parity/cond/qwen3_5_moe/model-q8_0.gguf");
    let dir = std::env::temp_dir().join(format!("xwen-routes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b, npy) = (dir.join("a.jsonl"), dir.join("b.jsonl"), dir.join("l.npy"));
    for out in [&a, &b] {
        let st = Command::new(env!("CARGO_BIN_EXE_xwen"))
            .args(["logits", "-m", model, "--ids", "1,2,3,4,5", "-t", "1", "--out"])
            .arg(&npy)
            .arg("--dump-routes")
            .arg(out)
            .output()
            .unwrap();
        assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    }
    let text = std::fs::read_to_string(&a).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!((first["pos"].as_u64(), first["layer"].as_u64()), (Some(0), Some(0)));
    assert!(first["margin"].as_f64().unwrap() >= 0.0);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/oracle/route_diff.py");
    let same = Command::new("python3").arg(script).arg(&a).arg(&b).output().unwrap();
    assert_eq!(same.status.code(), Some(0), "{}", String::from_utf8_lossy(&same.stdout));
    // swap one decision's expert set at position 3
    let changed: Vec<String> = text
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if v["pos"] == 3 && v["layer"] == 1 {
                v["experts"][0] = serde_json::json!(v["experts"][0].as_u64().unwrap() + 100);
            }
            v.to_string()
        })
        .collect();
    std::fs::write(&b, changed.join("\n")).unwrap();
    let diff = Command::new("python3").arg(script).arg(&a).arg(&b).output().unwrap();
    let out = String::from_utf8_lossy(&diff.stdout);
    assert_eq!(diff.status.code(), Some(1), "{out}");
    assert!(out.contains("pos 3, layer 1") && out.contains("margins"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `xwen logits --dump-tensors` writes every layer's taps in llama.cpp's names and layout (the
/// index in computation order, each file rows × width float32), the last layer's output is the
/// final norm's input, and compare_dumps.py finds two dumps equal and names the first tensor a
/// changed one differs in.
#[test]
fn tensor_dumps_and_compare_dumps() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/parity/cond/qwen3_5/model-q8_0.gguf");
    let dir = std::env::temp_dir().join(format!("xwen-dumps-{}", std::process::id()));
    let (a, b, npy) = (dir.join("a"), dir.join("b"), dir.join("l.npy"));
    std::fs::create_dir_all(&dir).unwrap();
    for out in [&a, &b] {
        let st = Command::new(env!("CARGO_BIN_EXE_xwen"))
            .args(["logits", "-m", model, "--ids", "1,2,3,4,5", "-t", "1", "--out"])
            .arg(&npy)
            .arg("--dump-tensors")
            .arg(out)
            .output()
            .unwrap();
        assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    }
    let index = std::fs::read_to_string(a.join("index.txt")).unwrap();
    let names: Vec<&str> = index.lines().map(|l| l.split(' ').next().unwrap()).collect();
    let hidden: usize = index.lines().next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    // a DeltaNet layer's taps in computation order, then its residual stream
    let layer0: Vec<&str> = names.iter().copied().take_while(|n| n.ends_with("-0")).collect();
    assert_eq!(
        layer0,
        ["attn_norm-0", "linear_attn_qkv_mixed-0", "conv_output_silu-0", "q_conv_predelta-0", "k_conv_predelta-0", "gate-0", "beta_sigmoid-0", "attn_output-0", "final_output-0", "linear_attn_out-0", "attn_residual-0", "attn_post_norm-0", "ffn_out-0", "l_out-0"],
        "{index}"
    );
    assert!(names.contains(&"attn_output-3") && names.contains(&"l_out-3") && names.last() == Some(&"result_norm"), "{index}");
    for line in index.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (ne0, ne1): (usize, usize) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        assert_eq!(std::fs::metadata(a.join(format!("{}.bin", f[0]))).unwrap().len() as usize, 4 * ne0 * ne1, "{line}");
        if ["attn_norm-", "attn_residual-", "attn_post_norm-", "ffn_out-", "l_out-", "result_norm"].iter().any(|p| f[0].starts_with(p)) {
            assert_eq!((ne0, ne1), (hidden, 5), "{line}");
        }
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/oracle/compare_dumps.py");
    let same = Command::new("python3").arg(script).arg(&a).arg(&b).output().unwrap();
    let out = String::from_utf8_lossy(&same.stdout);
    assert_eq!(same.status.code(), Some(0), "{out}");
    assert!(out.contains(&format!("{} tensors compared, all identical", names.len())), "{out}");
    // flip one value of layer 2's FFN output: the first tensor named is that one
    let f = b.join("ffn_out-2.bin");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[4 * (hidden + 7)] ^= 1;
    std::fs::write(&f, bytes).unwrap();
    let diff = Command::new("python3").arg(script).arg(&a).arg(&b).output().unwrap();
    let out = String::from_utf8_lossy(&diff.stdout);
    assert_eq!(diff.status.code(), Some(1), "{out}");
    assert!(out.trim_end().lines().last().unwrap().starts_with("ffn_out-2: DIFFERS from row 1"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two-sided: the trained tiny MoE's routing against llama.cpp's own, recorded with
/// `llama_dump --filter ffn_moe_probs,ffn_moe_weights_norm` (b11434, f16 KV, flash attention)
/// and converted by tools/oracle/llama_routes.py (tests/fixtures/routes/): every position's
/// chosen experts in llama.cpp's order, and their weights. The prompt's tightest decision has a
/// margin of 2.2e-6 (Q4_K_M), and xwen's AVX2 orders (`--isa avx2`) route it the same.
#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn trained_moe_routes_equal_llama_cpps() {
    let shared = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/models/gguf");
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/routes");
    let ids: Vec<String> = std::fs::read_to_string(format!("{fixtures}/code.ids")).unwrap().split_whitespace().map(String::from).collect();
    for quant in ["q8_0", "q4_k_m"] {
        let model = format!("{shared}/tiny-qwen35moe-{quant}.gguf");
        assert!(std::path::Path::new(&model).exists(), "{model} is missing");
        let dir = std::env::temp_dir().join(format!("xwen-routes-llama-{quant}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (routes, npy) = (dir.join("r.jsonl"), dir.join("l.npy"));
        let st = Command::new(env!("CARGO_BIN_EXE_xwen"))
            .args(["logits", "-m", &model, "--ids", &ids.join(","), "-t", "2", "--out"])
            .arg(&npy)
            .arg("--dump-routes")
            .arg(&routes)
            .output()
            .unwrap();
        assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
        let parse = |text: &str| -> Vec<serde_json::Value> { text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect() };
        let mine = parse(&std::fs::read_to_string(&routes).unwrap());
        let theirs = parse(&std::fs::read_to_string(format!("{fixtures}/tiny-qwen35moe-{quant}.llama.jsonl")).unwrap());
        assert_eq!(mine.len(), theirs.len(), "{quant}: decisions");
        let key = |r: &serde_json::Value| (r["pos"].as_u64().unwrap(), r["layer"].as_u64().unwrap());
        for (x, y) in mine.iter().zip(&theirs) {
            assert_eq!(key(x), key(y), "{quant}: decisions in the same order");
            assert_eq!(x["experts"], y["experts"], "{quant} at {:?}: chosen experts (llama.cpp's margin {})", key(x), y["margin"]);
            let (wx, wy) = (x["weights"].as_array().unwrap(), y["weights"].as_array().unwrap());
            for (a, b) in wx.iter().zip(wy) {
                assert!((a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-5, "{quant} at {:?}: weights {wx:?} vs {wy:?}", key(x));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
