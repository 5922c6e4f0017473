//! Random geometries held against llama.cpp in CI (docs/parity.md "Random
//! geometries"). `tools/oracle/random_geometry.py --record` drew each case's geometry from its
//! seed (`xwen synth --random`), ran llama.cpp b11434 over three prompts under each setting and
//! kept, per position, an FNV-1a of its logits' bytes and the greedy ids. Here every case's file
//! is synthesized again from the same seed (its FNV-1a must match the one recorded: the records
//! belong to that exact file), and xwen must give the same bytes at every position and the same
//! greedy tokens — bit for bit, without llama.cpp or the files in the repository; and again with
//! every prompt in one batch, decoded together, an MoE's experts streamed (`check_batched`).

use std::path::PathBuf;
use xwen_engine::{EngineConfig, FlashAttn, KvType, LogitsMode, Model, SeqStep};
use xwen_synth::{fnv1a, random_geometry, write_geometry, Family, Mix};

fn manifest(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/random").join(name)
}

fn row_hash(row: &[f32]) -> String {
    let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
    format!("{:016x}", fnv1a(&bytes))
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

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("an id array").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

/// The engine settings of a record's setting (`f16-on`: KV type, flash attention), with the
/// kernels capped to AVX2 on an AVX-512 machine unless the case is a native build's record
/// (`cpu_flags`): manifest.json comes from llama.cpp's AVX2 build.
fn config(setting: &str, native: bool) -> EngineConfig {
    let (kv, fa) = setting.split_once('-').expect("KV-FA");
    let kv: KvType = kv.parse().unwrap();
    let mut cfg = EngineConfig {
        threads: 2,
        max_ctx: 512,
        kv_types: (kv, kv),
        flash_attn: if fa == "on" { FlashAttn::On } else { FlashAttn::Off },
        ..EngineConfig::default()
    };
    // the cap is process-wide: set it either way (the native records run after the capped ones)
    let detected = xwen_kernels::dispatch::detected();
    cfg.max_isa = Some(if !native && detected == xwen_kernels::dispatch::Isa::Avx512 { xwen_kernels::dispatch::Isa::Avx2 } else { detected });
    cfg
}

/// A native build's record (it lists the CPU flags its orders depend on).
fn is_native(case: &serde_json::Value) -> bool {
    case.get("cpu_flags").is_some()
}

/// The flags of a native record this CPU lacks (its orders are not this CPU's build's).
#[cfg(target_arch = "x86_64")]
fn missing_flags(case: &serde_json::Value) -> Vec<String> {
    let has = |f: &str| match f {
        "avx2" => is_x86_feature_detected!("avx2"),
        "fma" => is_x86_feature_detected!("fma"),
        "f16c" => is_x86_feature_detected!("f16c"),
        "avx512f" => is_x86_feature_detected!("avx512f"),
        "avx512bw" => is_x86_feature_detected!("avx512bw"),
        "avx512vl" => is_x86_feature_detected!("avx512vl"),
        "avx512dq" => is_x86_feature_detected!("avx512dq"),
        "avx512_vnni" => is_x86_feature_detected!("avx512vnni"),
        "avx512_bf16" => is_x86_feature_detected!("avx512bf16"),
        _ => false,
    };
    case["cpu_flags"].as_array().map_or(Vec::new(), |fl| fl.iter().filter_map(|f| f.as_str()).filter(|f| !has(f)).map(String::from).collect())
}

#[cfg(not(target_arch = "x86_64"))]
fn missing_flags(case: &serde_json::Value) -> Vec<String> {
    case["cpu_flags"].as_array().map_or(Vec::new(), |fl| fl.iter().filter_map(|f| f.as_str()).map(String::from).collect())
}

/// Checks one recorded case; returns its failures.
fn check(case: &serde_json::Value, dir: &std::path::Path) -> Vec<String> {
    let family: Family = case["family"].as_str().unwrap().parse().unwrap();
    let seed = case["seed"].as_u64().unwrap();
    let mix_name = case["mix"].as_str().unwrap();
    let name = format!("{family}-{seed}-{mix_name}");
    let path = dir.join(format!("{name}.gguf"));
    let g = random_geometry(family, seed);
    // the tool's `xwen synth --random SEED --seed SEED+1 --mix MIX`
    let mix = Mix::parse(mix_name, seed + 1).unwrap();
    write_geometry(&g, &format!("random-{family}-{seed}"), mix, &path, None, seed + 1, &mut |_| {}).unwrap();
    let file_hash = format!("{:016x}", fnv1a(&std::fs::read(&path).unwrap()));
    assert_eq!(
        file_hash,
        case["file_fnv1a"].as_str().unwrap(),
        "{name}: `xwen synth --random` no longer writes the file these records were made on \
         ({}): rerecord with tools/oracle/random_geometry.py --record",
        xwen_synth::describe(&g)
    );
    let prompts: Vec<Vec<u32>> = case["prompts"].as_array().unwrap().iter().map(ids).collect();
    let mut fails = Vec::new();
    for (setting, recs) in case["settings"].as_object().unwrap() {
        let m = Model::load(&path, &config(setting, is_native(case))).unwrap_or_else(|e| panic!("{name}: {e}"));
        let n = m.n_vocab();
        for (i, (p, rec)) in prompts.iter().zip(recs.as_array().unwrap()).enumerate() {
            let want: Vec<&str> = rec["logits_fnv1a"].as_array().unwrap().iter().map(|h| h.as_str().unwrap()).collect();
            let mut st = m.new_state();
            let got = m.forward(&mut st, p, LogitsMode::All).unwrap();
            assert_eq!(got.len(), p.len() * n, "{name} {setting} p{i}");
            if let Some(pos) = (0..p.len()).find(|&t| row_hash(&got[t * n..(t + 1) * n]) != want[t]) {
                fails.push(format!("{name} {setting} p{i}: logits differ from position {pos} ({})", xwen_synth::describe(&g)));
                continue;
            }
            let want_greedy = ids(&rec["greedy"]);
            let mut tok = argmax(&got[(p.len() - 1) * n..]);
            let mut out = vec![tok];
            while out.len() < want_greedy.len() {
                tok = argmax(&m.forward(&mut st, &[tok], LogitsMode::Last).unwrap());
                out.push(tok);
            }
            if out != want_greedy {
                fails.push(format!("{name} {setting} p{i}: greedy {out:?} vs llama.cpp's {want_greedy:?}"));
            }
        }
    }
    fails.extend(check_batched(case, &name, &path, &prompts));
    let _ = std::fs::remove_file(&path);
    fails
}

/// The first setting's records again, with every prompt in one batched forward and every
/// greedy step one batched decode of all sequences (batch invariance: a sequence's logits
/// depend only on its own tokens and spans), and for an MoE its routed experts streamed through
/// a cache smaller than the model's experts.
fn check_batched(case: &serde_json::Value, name: &str, path: &std::path::Path, prompts: &[Vec<u32>]) -> Vec<String> {
    let (setting, recs) = case["settings"].as_object().unwrap().iter().next().unwrap();
    let mut cfg = config(setting, is_native(case));
    if case["family"].as_str() != Some("qwen35") {
        // the floor plus a few experts: most routed experts are read from the file; the plan
        // holds every prompt's state at once
        cfg.n_seq = prompts.len();
        let probe = Model::load(path, &EngineConfig { ram_budget: Some(1 << 50), ..cfg.clone() }).unwrap();
        let plan = probe.memory_plan().expect("a budget gives a plan");
        cfg.ram_budget = Some(plan.floor() + 4 * plan.record_bytes);
    }
    let m = Model::load(path, &cfg).unwrap_or_else(|e| panic!("{name} batched: {e}"));
    let n = m.n_vocab();
    let recs = recs.as_array().unwrap();
    let mut states: Vec<_> = prompts.iter().map(|_| m.new_state()).collect();
    let mut fails = Vec::new();
    let outs = {
        let mut steps: Vec<SeqStep> = states.iter_mut().zip(prompts).map(|(st, p)| SeqStep::new(st, p, LogitsMode::All)).collect();
        m.forward_batch(&mut steps).unwrap()
    };
    let mut last: Vec<u32> = Vec::new();
    for (i, (got, p)) in outs.iter().zip(prompts).enumerate() {
        let want: Vec<&str> = recs[i]["logits_fnv1a"].as_array().unwrap().iter().map(|h| h.as_str().unwrap()).collect();
        if let Some(pos) = (0..p.len()).find(|&t| row_hash(&got[t * n..(t + 1) * n]) != want[t]) {
            fails.push(format!("{name} {setting} p{i} batched{}: logits differ from position {pos}", if m.streams_experts() { ", streamed" } else { "" }));
        }
        last.push(argmax(&got[(p.len() - 1) * n..]));
    }
    let want: Vec<Vec<u32>> = recs.iter().map(|r| ids(&r["greedy"])).collect();
    let mut got: Vec<Vec<u32>> = last.iter().map(|&t| vec![t]).collect();
    for _ in 1..want.iter().map(Vec::len).max().unwrap_or(0) {
        let toks: Vec<[u32; 1]> = got.iter().map(|g| [*g.last().unwrap()]).collect();
        let outs = {
            let mut steps: Vec<SeqStep> = states.iter_mut().zip(&toks).map(|(st, t)| SeqStep::new(st, t, LogitsMode::Last)).collect();
            m.forward_batch(&mut steps).unwrap()
        };
        for (g, o) in got.iter_mut().zip(&outs) {
            g.push(argmax(o));
        }
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if g != w {
            fails.push(format!("{name} {setting} p{i} batched decode: greedy {g:?} vs llama.cpp's {w:?}"));
        }
    }
    fails
}

/// Every case of a manifest checked (files synthesized under a directory of `tag`'s own: the
/// tests run at once); returns the failures.
fn check_manifest(cases: &[serde_json::Value], tag: &str) -> Vec<String> {
    let dir = std::env::temp_dir().join(format!("xwen-random-geometries-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut fails = Vec::new();
    for case in cases {
        fails.extend(check(case, &dir));
    }
    let _ = std::fs::remove_dir_all(&dir);
    fails
}

fn load(name: &str) -> Vec<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(manifest(name)).unwrap()).unwrap()
}

/// Both manifests in one test, one after the other: the kernel cap they need is process-wide.
#[test]
fn random_geometries_are_bit_identical_to_llama_cpp() {
    avx2_build_records();
    native_avx512_build_records();
}

fn avx2_build_records() {
    let cases = load("manifest.json");
    assert!(cases.len() >= 8, "the manifest holds {} cases", cases.len());
    assert!(cases.iter().all(|c| !is_native(c)), "manifest.json holds the AVX2 build's records only");
    let fails = check_manifest(&cases, "avx2");
    let families: std::collections::BTreeSet<&str> = cases.iter().map(|c| c["family"].as_str().unwrap()).collect();
    assert_eq!(families.len(), Family::ALL.len(), "every family is recorded: {families:?}");
    assert!(fails.is_empty(), "{} of {} cases differ from llama.cpp:\n{}", fails.len(), cases.len(), fails.join("\n"));
}

/// Families with AVX2-build records only: their native records need llama.cpp built with
/// `-march=native` on an AVX-512 CPU (VNNI, BF16), not made for them yet.
const NOT_RECORDED_NATIVE: [Family; 1] = [Family::Qwen4Exp];

/// The records of llama.cpp b11434 built with `-march=native` (GCC) on an AVX-512 CPU
/// (manifest-native.json: the AVX-512 widths, VNNI's tiled epilogue and Q2_K repack, BF16's
/// vdpbf16ps), against xwen uncapped — run where this CPU has every flag the records list.
fn native_avx512_build_records() {
    let cases = load("manifest-native.json");
    assert!(cases.len() >= 8 && cases.iter().all(is_native), "the native manifest holds {} cases, each with its cpu_flags", cases.len());
    let missing = missing_flags(&cases[0]);
    if !missing.is_empty() {
        eprintln!("SKIP native records: they need CPU flags this machine lacks: {missing:?} (an AVX-512 CPU with VNNI and BF16)");
        return;
    }
    let fails = check_manifest(&cases, "native");
    let families: std::collections::BTreeSet<&str> = cases.iter().map(|c| c["family"].as_str().unwrap()).collect();
    let want: std::collections::BTreeSet<&str> = Family::ALL.iter().filter(|f| !NOT_RECORDED_NATIVE.contains(f)).map(|f| f.arch()).collect();
    assert!(want.is_subset(&families), "every family is recorded: {families:?}");
    assert!(fails.is_empty(), "{} of {} cases differ from llama.cpp's native build:\n{}", fails.len(), cases.len(), fails.join("\n"));
}
