use super::*;
use std::collections::HashSet;

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xwen-synth-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn preset_names_round_trip() {
    for p in Preset::ALL {
        assert_eq!(p.name().parse::<Preset>().unwrap(), p);
        assert_eq!(p.to_string(), p.name());
    }
    assert!("qwen35-9000b".parse::<Preset>().unwrap_err().contains("qwen35moe-35b-a3b"));
}

#[test]
fn full_size_plans_match_the_official_file_sizes() {
    // Tensor bytes of the ggml-org Q4_K_M files: Qwen3.6-35B-A3B 20.4 GB, Qwen3.6-27B 19.1 GB.
    // Matching them to 0.2% checks geometry and type mix together.
    for (p, official) in [(Preset::Qwen35Moe35bA3b, 20.4e9), (Preset::Qwen35_27b, 19.1e9)] {
        let bytes: u64 = tensor_plan(&p.geometry()).iter().map(TensorPlan::n_bytes).sum();
        let rel = (bytes as f64 - official).abs() / official;
        assert!(rel < 0.002, "{p}: {bytes} bytes vs {official}");
    }
}

#[test]
fn plans_have_llama_cpp_shapes_and_the_q4_k_m_mix() {
    let g = Preset::Qwen35Moe35bA3b.geometry();
    let plan = tensor_plan(&g);
    let names: HashSet<_> = plan.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names.len(), plan.len(), "duplicate tensor names");
    let get = |n: &str| plan.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n} missing"));
    let check = |n: &str, ty: GgmlType, dims: &[u64]| {
        let t = get(n);
        assert_eq!((t.ty, t.dims.as_slice()), (ty, dims), "{n}");
    };
    check("token_embd.weight", GgmlType::Q4_K, &[2048, 248320]);
    check("output.weight", GgmlType::Q6_K, &[2048, 248320]);
    check("blk.0.attn_qkv.weight", GgmlType::Q8_0, &[2048, 8192]);
    check("blk.0.attn_gate.weight", GgmlType::Q8_0, &[2048, 4096]);
    check("blk.0.ssm_conv1d.weight", GgmlType::F32, &[4, 8192]);
    check("blk.0.ssm_a", GgmlType::F32, &[32]);
    check("blk.0.ssm_alpha.weight", GgmlType::Q8_0, &[2048, 32]);
    check("blk.0.ssm_out.weight", GgmlType::Q8_0, &[4096, 2048]);
    check("blk.3.attn_q.weight", GgmlType::Q8_0, &[2048, 8192]);
    check("blk.3.attn_k.weight", GgmlType::Q8_0, &[2048, 512]);
    check("blk.3.attn_output.weight", GgmlType::Q8_0, &[4096, 2048]);
    check("blk.3.attn_q_norm.weight", GgmlType::F32, &[256]);
    check("blk.39.ffn_down_exps.weight", GgmlType::Q4_K, &[512, 2048, 256]);
    check("blk.39.ffn_gate_inp.weight", GgmlType::F32, &[2048, 256]);
    check("blk.39.ffn_up_shexp.weight", GgmlType::Q8_0, &[2048, 512]);
    assert!(!names.contains("blk.3.attn_qkv.weight") && !names.contains("blk.4.attn_q.weight"));
    // 30 DeltaNet layers × 19 + 10 attention layers × 16 + 3 globals (the tiny llama-quantize
    // file has 3 + 5 × 19 + 16 = 114 by the same count).
    assert_eq!(plan.len(), 30 * 19 + 10 * 16 + 3);
    for p in Preset::ALL {
        for t in tensor_plan(&p.geometry()) {
            assert_eq!(t.dims[0] % t.ty.block_size() as u64, 0, "{p}: {}", t.name);
        }
    }
    let dense = tensor_plan(&Preset::Qwen35_27b.geometry());
    assert!(dense.iter().any(|t| t.name == "blk.63.ffn_down.weight" && t.dims == [17408, 5120]));
}

fn read_f32s(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    let mut out = vec![0f32; t.n_elements() as usize];
    xwen_kernels::dequantize(t.ty, f.tensor_data(t), &mut out).unwrap();
    out
}

fn mean_std(x: &[f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let m = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / n;
    (m, var.sqrt())
}

#[test]
fn tiny_presets_write_loadable_files_with_realistic_values() {
    for p in [Preset::Qwen35Tiny, Preset::Qwen35MoeTiny, Preset::Qwen3NextTiny, Preset::KimiLinearTiny, Preset::Qwen4ExpTiny] {
        let path = temp_path(&format!("{p}.gguf"));
        let rep = write_synthetic(p, &path, None, 7).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(rep.file_bytes, f.file_len());
        let g = p.geometry();
        let plan = tensor_plan(&g);
        assert_eq!(f.tensors().len(), plan.len());
        for t in &plan {
            let ft = f.tensor(&t.name).unwrap();
            assert_eq!((ft.ty, &ft.dims), (t.ty, &t.dims), "{}", t.name);
            let x = read_f32s(&f, &t.name);
            assert!(x.iter().all(|v| v.is_finite()), "{p}: {} has non-finite values", t.name);
            let (m, s) = mean_std(&x);
            match t.fill {
                Fill::Matrix => assert!(m.abs() < 2e-3 && (0.015..0.025).contains(&s), "{}: mean {m} std {s}", t.name),
                Fill::Norm => assert!((m - 1.0).abs() < 0.05, "{}: mean {m}", t.name),
                Fill::SsmA => assert!(x.iter().all(|&v| v < 0.0), "{}: ssm_a must be negative", t.name),
                _ => {}
            }
        }
        assert_eq!(f.architecture(), Some(g.arch));
        assert_eq!(f.get_u32("general.file_type"), Some(15));
        assert_eq!(f.get_str("general.name"), Some(format!("synthetic {p}").as_str()));
        assert_eq!(f.get_array("tokenizer.ggml.tokens").unwrap().len(), g.n_vocab);
        assert_eq!(f.get_array("tokenizer.ggml.token_type").unwrap().len(), g.n_vocab);
        if g.kimi.is_some() {
            // kimi-linear marks its KDA layers by zero KV heads
            let kv = f.get_array(&f.arch_key("attention.head_count_kv")).unwrap();
            assert_eq!(kv.iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>(), [0, 0, 0, 1]);
        } else {
            let rec = f.get_array(&f.arch_key("attention.recurrent_layers")).unwrap();
            assert_eq!(rec.iter().map(|v| v.as_bool().unwrap()).collect::<Vec<_>>(), [true, true, true, false]);
        }
        let cfg = match g.arch {
            "qwen3next" => Some(xwen_engine::models::qwen3next::config(&f)),
            "kimi-linear" => Some(xwen_engine::models::kimi_linear::config(&f)),
            // qwen4exp's trunk is its own (the load below reads it)
            "qwen4exp" => None,
            _ => Some(xwen_engine::models::qwen35::config(&f)),
        };
        if let Some(cfg) = cfg.map(|c| c.unwrap()) {
            assert_eq!((cfg.n_layer, cfg.hidden, cfg.n_vocab), (g.n_layer, g.n_embd, g.n_vocab));
        }
        // the engine runs it: finite logits after a short prompt and a decode step
        let m = xwen_engine::Model::load(&path, &xwen_engine::EngineConfig { threads: 2, max_ctx: 64, ..Default::default() }).unwrap();
        let mut st = m.new_state();
        let logits = m.forward(&mut st, &[1, 2, 3, 4, 5], xwen_engine::LogitsMode::Last).unwrap();
        let next = m.forward(&mut st, &[6], xwen_engine::LogitsMode::Last).unwrap();
        assert!(logits.iter().chain(&next).all(|v| v.is_finite()), "{p}: non-finite logits");
        std::fs::remove_file(&path).unwrap();
    }
}

/// qwen4exp's additions as llama.cpp's loader names and shapes them (the parity fixture's file,
/// tests/fixtures/parity/cond/qwen4exp, has the same names and shapes at its geometry), and the
/// full-size preset's bulk where it is: the routed experts and the n-gram table.
#[test]
fn qwen4exp_plans_have_llama_cpp_shapes() {
    let g = Preset::Qwen4ExpTiny.geometry();
    let plan = tensor_plan(&g);
    let get = |n: &str| plan.iter().find(|t| t.name == n).unwrap_or_else(|| panic!("{n} missing"));
    let check = |n: &str, ty: GgmlType, dims: &[u64]| {
        let t = get(n);
        assert_eq!((t.ty, t.dims.as_slice()), (ty, dims), "{n}");
    };
    check("output_hc_down.weight", GgmlType::Q8_0, &[1024, 32]);
    check("output_hc_up.weight", GgmlType::Q8_0, &[32, 1024]);
    check("output_hc_norm.weight", GgmlType::F32, &[1024]);
    check("per_layer_token_embd.weight", GgmlType::F16, &[16, 16896]);
    check("blk.0.hc_attn_inject.weight", GgmlType::Q8_0, &[1024, 4]);
    check("blk.0.hc_ffn_norm.weight", GgmlType::F32, &[1024]);
    check("blk.1.ple_key.weight", GgmlType::Q8_0, &[256, 1024]);
    check("blk.1.ple_value.weight", GgmlType::Q8_0, &[256, 256]);
    check("blk.1.ple_conv1d.weight", GgmlType::F16, &[4, 1024]);
    check("blk.1.ple_norm_conv.weight", GgmlType::F32, &[1024]);
    check("blk.3.indexer.q_proj.weight", GgmlType::F32, &[256, 128]);
    check("blk.3.indexer.k_proj.weight", GgmlType::F32, &[256, 64]);
    check("blk.3.indexer.k_norm.weight", GgmlType::F32, &[64]);
    check("blk.3.attn_q.weight", GgmlType::Q8_0, &[256, 512]);
    let names: HashSet<_> = plan.iter().map(|t| t.name.as_str()).collect();
    assert!(!names.contains("output_norm.weight") && !names.contains("blk.0.attn_norm.weight") && !names.contains("blk.0.ple_key.weight"));
    // 6 globals; per layer 8 hc + 8 MoE + 9 DeltaNet or 10 attention (with the indexer); 6
    // PLE: the fixture's 113
    assert_eq!(plan.len(), 6 + 4 * 16 + 3 * 9 + 10 + 6);

    let full = tensor_plan(&Preset::Qwen4ExpFlashNext.geometry());
    let gb = |pred: &dyn Fn(&TensorPlan) -> bool| full.iter().filter(|t| pred(t)).map(TensorPlan::n_bytes).sum::<u64>() as f64 / 1e9;
    let table = full.iter().find(|t| t.name == "per_layer_token_embd.weight").unwrap();
    // 16 heads of 128 over ~320M rows: the "~45B" table (transformers' comment), Q5_0 where
    // Q4_K's 256-blocks do not fit a 128-wide row
    assert_eq!((table.ty, table.dims[0]), (GgmlType::Q5_0, 128));
    assert!((320_000_000..320_010_000).contains(&table.dims[1]), "{:?}", table.dims);
    let experts = gb(&|t| t.name.contains("_exps"));
    assert!((43.0..44.0).contains(&experts), "routed experts {experts} GB");
    assert!((27.5..28.5).contains(&gb(&|t| t.name.starts_with("per_layer"))));
    // the sizes the presets' docs state (the scaled one: half the experts, a quarter of the table)
    for (p, lo, hi) in [
        (Preset::Qwen4ExpFlashNext, 74.5, 75.5),
        (Preset::Qwen4ExpFlashNextScaled, 31.5, 32.5),
        (Preset::Qwen4ExpSmall, 0.2, 0.3),
        (Preset::Qwen35Moe122bA10b, 70.0, 78.0),
        (Preset::Qwen35Moe122bA10bScaled, 44.0, 50.0),
    ] {
        let b = tensor_plan(&p.geometry()).iter().map(TensorPlan::n_bytes).sum::<u64>() as f64 / 1e9;
        assert!((lo..hi).contains(&b), "{p}: {b} GB");
    }
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let (a, b, c) = (temp_path("a.gguf"), temp_path("b.gguf"), temp_path("c.gguf"));
    write_synthetic(Preset::Qwen35Tiny, &a, None, 1).unwrap();
    write_synthetic(Preset::Qwen35Tiny, &b, None, 1).unwrap();
    write_synthetic(Preset::Qwen35Tiny, &c, None, 2).unwrap();
    let read = |p: &Path| std::fs::read(p).unwrap();
    assert!(read(&a) == read(&b));
    assert!(read(&a) != read(&c));
    // Distinct rows: a tensor is not one block repeated.
    let f = GgufFile::open(&a).unwrap();
    let t = f.tensor("blk.0.ffn_up.weight").unwrap();
    let d = f.tensor_data(t);
    let row = t.ty.row_bytes(t.dims[0]).unwrap() as usize;
    assert_ne!(&d[..row], &d[row..2 * row]);
    for p in [a, b, c] {
        std::fs::remove_file(p).unwrap();
    }
}

fn vocab_file(n_tokens: usize) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", "qwen2".into());
    w.add_kv("tokenizer.ggml.model", "gpt2".into());
    w.add_kv("tokenizer.ggml.tokens", Value::Array((0..n_tokens).map(|i| Value::Str(format!("t{i}"))).collect()));
    w.add_kv("tokenizer.ggml.token_type", Value::Array(vec![Value::I32(1); n_tokens]));
    w.add_kv("tokenizer.ggml.merges", Value::Array(vec![Value::Str("t 1".into())]));
    w.add_kv("tokenizer.ggml.eos_token_id", Value::U32(3));
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn a_vocabulary_file_is_copied_and_padded() {
    let kv = vocab::from_gguf(&vocab_file(300), 1024).unwrap();
    let get = |k: &str| kv.iter().find(|(key, _)| key == k).map(|(_, v)| v).unwrap();
    let toks = get("tokenizer.ggml.tokens").as_array().unwrap();
    assert_eq!(toks.len(), 1024);
    assert_eq!((toks[299].as_str(), toks[300].as_str()), (Some("t299"), Some("[PAD300]")));
    let types = get("tokenizer.ggml.token_type").as_array().unwrap();
    assert_eq!((types.len(), &types[299], &types[300]), (1024, &Value::I32(1), &Value::I32(5)));
    assert_eq!(get("tokenizer.ggml.eos_token_id"), &Value::U32(3));
    assert!(kv.iter().all(|(k, _)| k.starts_with("tokenizer.")), "general.* keys must not be copied");
    assert!(vocab::from_gguf(&vocab_file(2000), 1024).is_err());
}

#[test]
fn the_synthetic_vocabulary_covers_every_byte() {
    let kv = vocab::synthetic(vocab::MIN_SYNTHETIC_VOCAB);
    let toks = kv.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").unwrap().1.as_array().unwrap();
    let set: HashSet<_> = toks.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(set.len(), toks.len(), "duplicate tokens");
    assert!(set.contains("Ġ") && set.contains("Ċ") && set.contains("A") && set.contains("<|im_end|>"));
}

/// A q8_0 cache holds QSA's indexer rows [raw | pooled] in blocks of 32; with an indexer head
/// of another width (48 here) a block would hold both keys, which llama.cpp computes and xwen
/// does not reproduce: the step is refused with the reason, never computed otherwise.
#[test]
fn a_q8_0_cache_refuses_an_indexer_head_that_is_not_whole_blocks() {
    let mut g = Preset::Qwen4ExpTiny.geometry();
    set_field(&mut g, "idx_dim=48").unwrap();
    let path = temp_path("qwen4exp-idx48.gguf");
    write_geometry(&g, "idx48", Mix::Q4KM, &path, None, 3, &mut |_| {}).unwrap();
    let q8 = xwen_engine::KvType::Q8_0;
    for (kv, ok) in [((q8, q8), false), ((xwen_engine::KvType::F16, xwen_engine::KvType::F16), true)] {
        let m = xwen_engine::Model::load(&path, &xwen_engine::EngineConfig { threads: 2, max_ctx: 64, kv_types: kv, ..Default::default() }).unwrap();
        let mut st = m.new_state();
        let r = m.forward(&mut st, &[1, 2, 3, 4, 5], xwen_engine::LogitsMode::Last);
        match r {
            Ok(_) => assert!(ok, "a q8_0 cache with 48-wide indexer keys ran"),
            Err(e) => assert!(!ok && e.to_string().contains("multiple of 32"), "{e}"),
        }
    }
    std::fs::remove_file(&path).unwrap();
}
