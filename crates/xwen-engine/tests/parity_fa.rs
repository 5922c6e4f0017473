//! Parity at llama.cpp's default settings: an f16 KV cache and flash attention on (the CPU's
//! `-fa auto`). The references in tests/fixtures/parity/fa/ are llama.cpp b11434's (AVX2 build,
//! 2 threads; tools/oracle/fa_refs.sh on the device machine): all-position logits of each
//! prompt from one decode of the whole prompt, and 32 greedy tokens decoded one at a time.
//! Held bit for bit — the prompts cover flash attention's one-chunk path (short prompts),
//! its tiled path (70 and 300 rows) and, decoding past 256 cells, its split-KV path.

use std::path::{Path, PathBuf};
use xwen_engine::{EngineConfig, LogitsMode, Model};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity")
}

/// (shape, data) of a little-endian f32 .npy.
fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..6], b"\x93NUMPY", "{}", path.display());
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(header.contains("'<f4'"), "{header}");
    let shape: Vec<usize> = header.split('(').nth(1).unwrap().split(')').next().unwrap().split(',').filter_map(|x| x.trim().parse().ok()).collect();
    let data = b[10 + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (shape, data)
}

/// Prompts of a fixture's cases.txt (`prompt <i> <name> ids...`) or of a plain file (one prompt
/// of ids per line).
fn prompts(path: &Path) -> Vec<Vec<u32>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.first() {
                Some(&"prompt") => Some(w[3..].iter().map(|x| x.parse().unwrap()).collect()),
                Some(x) if x.parse::<u32>().is_ok() => Some(w.iter().map(|x| x.parse().unwrap()).collect()),
                _ => None,
            }
        })
        .collect()
}

/// llama_logits' greedy lines: prompt index → ids.
fn greedy(path: &Path) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for l in std::fs::read_to_string(path).unwrap().lines() {
        if let Some((k, ids)) = l.split_once(" greedy: ") {
            let i: usize = k.trim_start_matches('p').parse().unwrap();
            out.resize(out.len().max(i + 1), Vec::new());
            out[i] = ids.split_whitespace().map(|x| x.parse().unwrap()).collect();
        }
    }
    out
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Checks one model against its records; returns the failures.
fn check(name: &str, model: &Path, prompts_file: &Path) -> Vec<String> {
    check_with(name, model, prompts_file, EngineConfig::default().kv_types)
}

/// `check` with a cache of `kv_types` (records `fa/<name>.*` made with the same types).
fn check_with(name: &str, model: &Path, prompts_file: &Path, kv_types: (xwen_engine::KvType, xwen_engine::KvType)) -> Vec<String> {
    let fa = root().join("fa");
    // llama_logits' context is the prompt + 32 + 16, padded to 256: 512 covers every prompt here
    let mut cfg = EngineConfig { threads: 2, max_ctx: 512, kv_types, ..EngineConfig::default() };
    if xwen_kernels::dispatch::detected() == xwen_kernels::dispatch::Isa::Avx512 {
        cfg.max_isa = Some(xwen_kernels::dispatch::Isa::Avx2);
    }
    let m = Model::load(model, &cfg).unwrap();
    let want_greedy = greedy(&fa.join(format!("{name}.txt")));
    let mut fails = Vec::new();
    for (i, p) in prompts(prompts_file).iter().enumerate() {
        let (shape, want) = read_npy(&fa.join(format!("{name}.p{i}.npy")));
        assert_eq!(shape, [p.len(), m.n_vocab()], "{name} p{i}");
        let mut st = m.new_state();
        let got = m.forward(&mut st, p, LogitsMode::All).unwrap();
        if let Some(j) = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits()) {
            fails.push(format!("{name} p{i}: logits differ from position {} ({} vs {})", j / m.n_vocab(), got[j], want[j]));
            continue;
        }
        let n = m.n_vocab();
        let mut tok = argmax(&got[(p.len() - 1) * n..]);
        let mut ids = vec![tok];
        while ids.len() < want_greedy[i].len() {
            tok = argmax(&m.forward(&mut st, &[tok], LogitsMode::Last).unwrap());
            ids.push(tok);
        }
        if ids != want_greedy[i] {
            let at = ids.iter().zip(&want_greedy[i]).position(|(a, b)| a != b).unwrap_or(0);
            fails.push(format!("{name} p{i}: greedy differs at step {at}: {ids:?} vs {:?}", want_greedy[i]));
        }
    }
    fails
}

#[test]
fn bit_identical_to_llama_cpp_at_its_defaults() {
    let r = root();
    let fa = r.join("fa");
    let mut fails = Vec::new();
    let mut checked = 0;
    for (set, arch, tier) in [
        ("cond", "qwen3_5", "f32"),
        ("cond", "qwen3_5", "q8_0"),
        ("cond", "qwen3_5", "q4_k_m"),
        ("cond", "qwen3_5_moe", "q8_0"),
        ("cond", "qwen3_5_moe", "q4_k_m"),
        ("rand", "qwen3_5", "q8_0"),
        ("cond", "qwen3_next", "q8_0"),
        ("cond", "qwen3_next", "q4_k_m"),
        ("cond", "kimi_linear", "q8_0"),
        ("cond", "kimi_linear", "q4_k_m"),
        ("cond", "kimi_k3", "q8_0"),
        ("cond", "kimi_k3", "q4_k_m"),
        ("cond", "qwen4exp", "q8_0"),
        ("cond", "qwen4exp", "q4_k_m"),
    ] {
        let dir = r.join(set).join(arch);
        fails.extend(check(&format!("{set}-{arch}-model-{tier}"), &dir.join(format!("model-{tier}.gguf")), &dir.join("cases.txt")));
        checked += 1;
    }
    let long = fa.join("long-prompts.txt");
    fails.extend(check("long-cond-qwen3_5-f32", &r.join("cond/qwen3_5/model-f32.gguf"), &long));
    fails.extend(check("long-cond-qwen3_5_moe-q8_0", &r.join("cond/qwen3_5_moe/model-q8_0.gguf"), &long));
    fails.extend(check("long-cond-qwen3_next-q8_0", &r.join("cond/qwen3_next/model-q8_0.gguf"), &long));
    fails.extend(check("long-cond-kimi_linear-q8_0", &r.join("cond/kimi_linear/model-q8_0.gguf"), &long));
    fails.extend(check("long-cond-kimi_k3-q8_0", &r.join("cond/kimi_k3/model-q8_0.gguf"), &long));
    // QSA's selection under flash attention: the tiled path (70 and 300 rows) and, decoding
    // past 512 cells, split-KV, each over the selected cells only
    fails.extend(check("long-cond-qwen4exp-q8_0", &r.join("cond/qwen4exp/model-q8_0.gguf"), &long));
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo/tiny-qwen35-q4_k_m.gguf");
    fails.extend(check("demo", &demo, &fa.join("demo-prompt.txt")));
    checked += 7;
    assert!(fails.is_empty(), "{} of {checked} models differ from llama.cpp's f16 + flash-attention records:\n{}", fails.len(), fails.join("\n"));
}

/// A q8_0 cache (`-ctk q8_0 -ctv q8_0`): q and k rotated by a Hadamard transform and v too, the
/// output rotated back (llama.cpp's attention rotation for quantized caches), K and V quantized
/// on write, Q8_0 dot products, V dequantized per row on ggml's one-chunk path — bit-identical
/// to llama.cpp b11434 with the same cache (records `fa/q8_0-*`, `tools/oracle/fa_refs.sh`
/// with SETTINGS=q8_0-on), prefill and 32 greedy decode steps, incl. the 70/300-token prompts.
#[test]
fn a_q8_0_cache_is_bit_identical_to_llama_cpp() {
    let r = root();
    let q8 = (xwen_engine::KvType::Q8_0, xwen_engine::KvType::Q8_0);
    let mut fails = Vec::new();
    let mut checked = 0;
    for (set, arch, tier) in [("cond", "qwen3_5", "f32"), ("cond", "qwen3_5", "q4_k_m"), ("cond", "qwen3_5_moe", "q8_0"), ("cond", "qwen3_next", "q4_k_m"), ("cond", "kimi_linear", "q8_0"), ("cond", "qwen4exp", "q4_k_m")] {
        let dir = r.join(set).join(arch);
        fails.extend(check_with(&format!("q8_0-{set}-{arch}-model-{tier}"), &dir.join(format!("model-{tier}.gguf")), &dir.join("cases.txt"), q8));
        checked += 1;
    }
    fails.extend(check_with("long-q8_0-cond-qwen3_5-model-f32", &r.join("cond/qwen3_5/model-f32.gguf"), &r.join("fa/long-prompts.txt"), q8));
    checked += 1;
    assert!(fails.is_empty(), "{} of {checked} models differ from llama.cpp's q8_0-cache records:\n{}", fails.len(), fails.join("\n"));
}

/// The rotation is a pure function of the cache types: f16 and f32 caches take none, and a
/// q8_0 cache's q8_0 state holds 34 bytes per 32 elements, smaller than f16's.
#[test]
fn a_q8_0_cache_stays_within_its_rounding() {
    let r = root();
    let model = r.join("cond/qwen3_5/model-q8_0.gguf");
    let p = &prompts(&r.join("cond/qwen3_5/cases.txt"))[2];
    let run = |kv| {
        let cfg = EngineConfig { threads: 2, max_ctx: 512, kv_types: (kv, kv), ..EngineConfig::default() };
        let m = Model::load(&model, &cfg).unwrap();
        let mut st = m.new_state();
        let l = m.forward(&mut st, p, LogitsMode::All).unwrap();
        (l, st.bytes())
    };
    let (f16, b16) = run(xwen_engine::KvType::F16);
    let (q8, b8) = run(xwen_engine::KvType::Q8_0);
    let worst = f16.iter().zip(&q8).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst > 0.0 && worst < 0.2, "q8_0 vs f16: max difference {worst}");
    assert!(b8 < b16, "the q8_0 state ({b8} B) is smaller than the f16 one ({b16} B)");
}

/// Fixtures of other geometries (tools/oracle/models.py GEOMETRIES, `tests/fixtures/parity/
/// geom/<name>/`, made by `GEOMS=all tools/oracle/arch_refs.sh`) at llama.cpp's defaults, where
/// their records are present: each model-<tier>.gguf against fa/geom-<name>-model-<tier>.*.
/// (They are too large to commit; the oracle run checks them where it makes them.)
#[test]
fn geometry_fixtures_at_defaults() {
    let r = root();
    let Ok(dirs) = std::fs::read_dir(r.join("geom")) else {
        eprintln!("SKIP geometry fixtures: tests/fixtures/parity/geom/ not present (GEOMS=all tools/oracle/arch_refs.sh makes it)");
        return;
    };
    let mut fails = Vec::new();
    let mut checked = 0;
    for d in dirs.flatten().map(|e| e.path()).filter(|p| p.join("cases.txt").exists()) {
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        for tier in ["q8_0", "q4_k_m", "f32"] {
            let model = d.join(format!("model-{tier}.gguf"));
            let rec = format!("geom-{name}-model-{tier}");
            if model.exists() && r.join("fa").join(format!("{rec}.txt")).exists() {
                fails.extend(check(&rec, &model, &d.join("cases.txt")));
                checked += 1;
            }
        }
    }
    eprintln!("geometry fixtures at llama.cpp's defaults: {checked} models checked");
    assert!(fails.is_empty(), "{} differ from llama.cpp's f16 + flash-attention records:\n{}", fails.len(), fails.join("\n"));
}
