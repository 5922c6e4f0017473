//! Parity suite: xwen's logits and greedy continuations against llama.cpp b11434's run of the
//! same GGUF (and, for f32 files, against transformers float32) on the fixtures that
//! `tools/oracle/make_fixtures.py` writes under tests/fixtures/parity/. Tiers, tolerances and
//! how they were derived: docs/parity.md.
//!
//! Each fixture folder has a `cases.txt` (a line format, so this test needs no JSON crate):
//! prompts, reference logits (.npy) and greedy continuations per GGUF, and a tolerance per tier.
//! A GGUF under `@shared/` is one of the trained models in the shared/ folder beside the repo;
//! those cases are their own test, `parity_suite_trained_shared_models`, which cargo lists as
//! ignored where that folder is absent (crates/prereqs.rs). An architecture the engine reports
//! unsupported is a loud SKIP with the engine's reason.
//!
//! Run: cargo test -p xwen-engine --release --test parity -- --nocapture
//! The summary table also goes to target/parity-summary.txt (target/parity-summary-shared.txt
//! for the trained models). With PARITY_DUMP_DIR=<dir> set,
//! xwen's logits for every case and prompt are written there as .npy, to bisect a failure;
//! PARITY_FORCE_REFERENCE=1 runs the engine on its scalar reference kernels; PARITY_ONLY=<text>
//! runs only the fixture folders whose path contains it.

#![allow(clippy::neg_cmp_op_on_partial_ord)] // `!(e <= tol)`: an error that is NaN must fail

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use xwen_engine::{EngineConfig, EngineError, LogitsMode, Model};

// ---------- .npy (float32 / float16, C order, 1-D or 2-D) ----------

struct Npy {
    shape: Vec<usize>,
    data: Vec<f32>,
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as i32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // subnormal: renormalize
            let mut e = -14;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (((e + 127) as u32) << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 31 {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | (((exp - 15 + 127) as u32) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

fn parse_npy(bytes: &[u8]) -> Result<Npy, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not an .npy file".into());
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("truncated header".into());
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(format!("npy version {v} unsupported")),
    };
    let header = bytes.get(hstart..hstart + hlen).ok_or("truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "header not utf-8")?;
    let width = if header.contains("'<f4'") {
        4
    } else if header.contains("'<f2'") {
        2
    } else {
        return Err(format!("dtype unsupported in {header}"));
    };
    if header.contains("'fortran_order': True") {
        return Err("fortran order unsupported".into());
    }
    let s = header.find("'shape': (").ok_or("no shape")? + "'shape': (".len();
    let e = s + header[s..].find(')').ok_or("bad shape")?;
    let shape: Vec<usize> = header[s..e]
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<usize>().map_err(|_| format!("bad dim {t}")))
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let body = &bytes[hstart + hlen..];
    if body.len() != n * width {
        return Err(format!(
            "body is {} bytes, shape {:?} needs {}",
            body.len(),
            shape,
            n * width
        ));
    }
    let data = if width == 4 {
        body.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        body.chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    };
    Ok(Npy { shape, data })
}

/// Writes float32 [rows, cols] as .npy (for PARITY_DUMP_DIR: xwen's logits, to bisect a failure).
fn write_npy(path: &Path, data: &[f32], rows: usize, cols: usize) -> std::io::Result<()> {
    let mut h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&(h.len() as u16).to_le_bytes());
    v.extend_from_slice(h.as_bytes());
    v.extend(data.iter().flat_map(|x| x.to_le_bytes()));
    std::fs::write(path, v)
}

fn read_npy(path: &Path) -> Result<Npy, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_npy(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

// ---------- cases.txt ----------

#[derive(Default, Debug)]
struct Fixture {
    dir: PathBuf,
    set: String,
    arch: String,
    gguf_arch: String,
    amplification: Option<f64>,
    /// index -> (name, ids)
    prompts: BTreeMap<usize, (String, Vec<u32>)>,
    /// (source, prompt) -> file
    logits: BTreeMap<(String, usize), String>,
    /// (source, prompt) -> llama.cpp's logits with one token per llama_decode (ubatch 1), the
    /// reference for xwen's token-by-token path (tools/oracle/decode_ref.py)
    decode_logits: BTreeMap<(String, usize), String>,
    /// (source, prompt) -> ids
    greedy: BTreeMap<(String, usize), Vec<u32>>,
    /// (source, prompt) -> top-1 minus top-2 logit per greedy step
    gaps: BTreeMap<(String, usize), Vec<f32>>,
    router_margin: BTreeMap<usize, String>,
    /// (tier, gguf, tolerance) in file order
    cases: Vec<(String, String, f64)>,
}

fn parse_cases(dir: &Path, text: &str) -> Result<Fixture, String> {
    let mut f = Fixture {
        dir: dir.to_path_buf(),
        ..Default::default()
    };
    let ids = |toks: &[&str]| -> Result<Vec<u32>, String> {
        toks.iter()
            .map(|t| t.parse::<u32>().map_err(|_| format!("bad id {t}")))
            .collect()
    };
    for (ln, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let t: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("cases.txt line {}: {line}", ln + 1);
        let idx = |s: &str| s.parse::<usize>().map_err(|_| bad());
        match t[0] {
            "set" => f.set = t.get(1).ok_or_else(bad)?.to_string(),
            "arch" => f.arch = t.get(1).ok_or_else(bad)?.to_string(),
            "gguf_arch" => f.gguf_arch = t.get(1).ok_or_else(bad)?.to_string(),
            "n_gen" => {}
            "amplification" => f.amplification = t.get(1).and_then(|s| s.parse().ok()),
            "prompt" if t.len() >= 4 => {
                f.prompts
                    .insert(idx(t[1])?, (t[2].to_string(), ids(&t[3..])?));
            }
            "logits" if t.len() == 4 => {
                f.logits
                    .insert((t[1].to_string(), idx(t[2])?), t[3].to_string());
            }
            "decode_logits" if t.len() == 4 => {
                f.decode_logits
                    .insert((t[1].to_string(), idx(t[2])?), t[3].to_string());
            }
            "greedy" if t.len() >= 4 => {
                f.greedy
                    .insert((t[1].to_string(), idx(t[2])?), ids(&t[3..])?);
            }
            "gap" if t.len() >= 4 => {
                let g = t[3..]
                    .iter()
                    .map(|s| s.parse::<f32>().map_err(|_| bad()))
                    .collect::<Result<_, _>>()?;
                f.gaps.insert((t[1].to_string(), idx(t[2])?), g);
            }
            "router_margin" if t.len() == 3 => {
                f.router_margin.insert(idx(t[1])?, t[2].to_string());
            }
            "case" if t.len() == 4 => {
                let tol = t[3].parse::<f64>().map_err(|_| bad())?;
                f.cases.push((t[1].to_string(), t[2].to_string(), tol));
            }
            _ => return Err(bad()),
        }
    }
    if f.prompts.is_empty() || f.cases.is_empty() {
        return Err(format!("{}: no prompts or no cases", dir.display()));
    }
    Ok(f)
}

// ---------- comparison ----------

/// ‖a − b‖ / ‖b‖ for one row (b is the reference).
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for i in 1..v.len() {
        if v[i] > v[best] {
            best = i; // first index wins ties, as in the oracle
        }
    }
    best as u32
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..")
}

fn resolve_gguf(fx: &Fixture, spec: &str) -> PathBuf {
    match spec.strip_prefix("@shared/") {
        Some(rest) => repo_root().join("..").join("shared").join(rest),
        None => fx.dir.join(spec),
    }
}

struct Row {
    fixture: String,
    tier: String,
    tol: f64,
    max_vs_llama: Option<f64>,
    max_vs_hf: Option<f64>,
    max_decode: Option<f64>,
    greedy: String,
    status: String,
}

/// Runs one (fixture, tier) case. Returns the row and, on failure, the reasons.
fn run_case(fx: &Fixture, tier: &str, spec: &str, tol: f64, threads: usize) -> (Row, Vec<String>) {
    let name = format!(
        "{}/{}",
        fx.set,
        fx.dir.file_name().unwrap().to_string_lossy()
    );
    let mut row = Row {
        fixture: name.clone(),
        tier: tier.to_string(),
        tol,
        max_vs_llama: None,
        max_vs_hf: None,
        max_decode: None,
        greedy: "-".into(),
        status: String::new(),
    };
    let mut fails = Vec::new();
    let path = resolve_gguf(fx, spec);
    if !path.exists() {
        row.status = "FAIL: GGUF missing".into();
        fails.push(format!("{name} {tier}: {} is missing", path.display()));
        return (row, fails);
    }
    // PARITY_FORCE_REFERENCE=1 runs xwen's scalar reference kernels: a failure that goes away
    // there is in a SIMD kernel, one that stays is in the model code or the reference itself
    let force_reference = std::env::var_os("PARITY_FORCE_REFERENCE").is_some_and(|v| v == "1");
    // the fixtures' llama.cpp settings: an f32 KV cache, flash attention off (docs/parity.md)
    let cfg = EngineConfig {
        threads,
        force_reference,
        ..EngineConfig::default().with_f32_cache_no_flash()
    };
    let model = match Model::load(&path, &cfg) {
        Ok(m) => m,
        Err(EngineError::UnsupportedArchitecture(a)) => {
            row.status = format!("SKIP: engine does not support `{a}`");
            eprintln!("SKIP parity {name} {tier}: engine reports architecture `{a}` unsupported — NOT a pass");
            return (row, fails);
        }
        Err(e) => {
            row.status = "FAIL: load".into();
            fails.push(format!("{name} {tier}: load failed: {e}"));
            return (row, fails);
        }
    };
    if model.architecture() != fx.gguf_arch {
        fails.push(format!(
            "{name} {tier}: architecture {} != expected {}",
            model.architecture(),
            fx.gguf_arch
        ));
    }
    let n_vocab = model.n_vocab();
    let is_moe = fx.arch.contains("moe") || fx.gguf_arch.contains("moe");
    let mut worst_llama = 0.0f64;
    let mut worst_hf: Option<f64> = None;
    let mut worst_decode: Option<f64> = None;
    let mut greedy_parts = Vec::new();
    let src = format!("llama-{tier}");
    for (&pi, (pname, ids)) in &fx.prompts {
        let mut st = model.new_state();
        let logits = match model.forward(&mut st, ids, LogitsMode::All) {
            Ok(l) => l,
            Err(e) => {
                fails.push(format!("{name} {tier} {pname}: forward failed: {e}"));
                continue;
            }
        };
        if logits.len() != ids.len() * n_vocab {
            fails.push(format!(
                "{name} {tier} {pname}: got {} logits, want {}",
                logits.len(),
                ids.len() * n_vocab
            ));
            continue;
        }
        if let Some(d) = std::env::var_os("PARITY_DUMP_DIR") {
            let f = Path::new(&d).join(format!("{}-{tier}.p{pi}.npy", name.replace('/', "-")));
            let _ = std::fs::create_dir_all(&d);
            if let Err(e) = write_npy(&f, &logits, ids.len(), n_vocab) {
                eprintln!("PARITY_DUMP_DIR: cannot write {}: {e}", f.display());
            }
        }
        // per-position rel-L2 against each reference this case has
        for (refsrc, is_hf) in [(src.as_str(), false), ("hf", true)] {
            if is_hf && tier != "f32" {
                continue; // transformers is the reference only for unquantized weights
            }
            let Some(file) = fx.logits.get(&(refsrc.to_string(), pi)) else {
                if !is_hf {
                    fails.push(format!(
                        "{name} {tier} {pname}: no {refsrc} logits in cases.txt"
                    ));
                }
                continue;
            };
            let r = match read_npy(&fx.dir.join(file)) {
                Ok(r) => r,
                Err(e) => {
                    fails.push(e);
                    continue;
                }
            };
            if r.shape != [ids.len(), n_vocab] {
                fails.push(format!(
                    "{name} {tier} {pname}: {refsrc} logits shape {:?}, want [{}, {n_vocab}]",
                    r.shape,
                    ids.len()
                ));
                continue;
            }
            for p in 0..ids.len() {
                let e = rel_l2(
                    &logits[p * n_vocab..(p + 1) * n_vocab],
                    &r.data[p * n_vocab..(p + 1) * n_vocab],
                );
                if is_hf {
                    worst_hf = Some(worst_hf.unwrap_or(0.0).max(e));
                } else {
                    worst_llama = worst_llama.max(e);
                }
                if !(e <= tol) {
                    fails.push(format!(
                        "{name} {tier} {pname} pos {p}: rel-L2 vs {refsrc} {e:.3e} > {tol:.1e}"
                    ));
                }
            }
        }
        // The same prompt one token per forward (xwen's decode path), against llama.cpp fed one
        // token per llama_decode: its kernels depend on the batch (tinyBLAS for 2+ tokens, tiled
        // K-quants for 8+, Q4_K gemm groups of 4), so its prefill rows are not the reference.
        // A fixture without decode references (older cases.txt) falls back to the prefill rows.
        let has_decode_refs = fx.decode_logits.keys().any(|(s, _)| *s == src);
        let decode_ref = if has_decode_refs {
            let f = fx.decode_logits.get(&(src.clone(), pi));
            if f.is_none() {
                eprintln!("SKIP {name} {tier} {pname} token-by-token check: no single-token llama.cpp reference committed (tools/oracle/decode_ref.py --max-bytes) — NOT a pass");
            }
            f
        } else {
            fx.logits.get(&(src.clone(), pi))
        };
        if let Some(r) = decode_ref.and_then(|f| read_npy(&fx.dir.join(f)).ok()) {
            if r.shape == [ids.len(), n_vocab] {
                let mut st1 = model.new_state();
                let mut all = Vec::with_capacity(ids.len() * n_vocab);
                for (p, &t) in ids.iter().enumerate() {
                    match model.forward(&mut st1, &[t], LogitsMode::Last) {
                        Ok(l) => {
                            all.extend_from_slice(&l);
                            let e = rel_l2(&l, &r.data[p * n_vocab..(p + 1) * n_vocab]);
                            worst_decode = Some(worst_decode.unwrap_or(0.0).max(e));
                            if !(e <= tol) {
                                fails.push(format!("{name} {tier} {pname} pos {p} (token-by-token): rel-L2 vs {src} {e:.3e} > {tol:.1e}"));
                            }
                        }
                        Err(e) => {
                            fails.push(format!("{name} {tier} {pname}: decode failed at {p}: {e}"));
                            break;
                        }
                    }
                }
                if let Some(d) = std::env::var_os("PARITY_DUMP_DIR") {
                    let f = Path::new(&d).join(format!(
                        "{}-{tier}-decode.p{pi}.npy",
                        name.replace('/', "-")
                    ));
                    let _ = write_npy(&f, &all, all.len() / n_vocab, n_vocab);
                }
            }
        }
        // greedy, one decode per token, against llama.cpp's own greedy on this file
        let Some(want) = fx.greedy.get(&(src.clone(), pi)) else {
            fails.push(format!(
                "{name} {tier} {pname}: no {src} greedy in cases.txt"
            ));
            continue;
        };
        let mut got = vec![argmax(&logits[(ids.len() - 1) * n_vocab..])];
        while got.len() < want.len() {
            match model.forward(&mut st, &[*got.last().unwrap()], LogitsMode::Last) {
                Ok(l) => got.push(argmax(&l)),
                Err(e) => {
                    fails.push(format!("{name} {tier} {pname}: decode failed: {e}"));
                    break;
                }
            }
        }
        let agree = got.iter().zip(want).take_while(|(a, b)| a == b).count();
        greedy_parts.push(format!("{agree}/{}", want.len()));
        if agree < want.len() && got.len() == want.len() {
            let gap = fx
                .gaps
                .get(&(src.clone(), pi))
                .and_then(|g| g.get(agree))
                .copied();
            let gap_s = gap.map_or("unknown".to_string(), |g| format!("{g:.3e}"));
            let mut msg = format!(
                "{name} {tier} {pname}: greedy diverges at step {agree}: xwen {} vs llama.cpp {} \
                 (llama.cpp's top-1 minus top-2 logit there: {gap_s})",
                got[agree], want[agree]
            );
            if is_moe {
                let margin = fx
                    .router_margin
                    .get(&pi)
                    .and_then(|f| read_npy(&fx.dir.join(f)).ok())
                    .map(|m| m.data.iter().cloned().fold(f32::INFINITY, f32::min));
                let _ = write!(
                    msg,
                    "; MoE triage: the router-tie check needs xwen's router logits, which the engine \
                     does not expose, so this cannot be ruled a router tie (oracle's smallest top-k \
                     router margin on this sequence: {})",
                    margin.map_or("n/a".into(), |m| format!("{m:.2e}"))
                );
            }
            fails.push(msg);
        }
    }
    row.max_vs_llama = Some(worst_llama);
    row.max_vs_hf = worst_hf;
    row.max_decode = worst_decode;
    row.greedy = greedy_parts.join(" ");
    row.status = if fails.is_empty() {
        "ok".into()
    } else {
        "FAIL".into()
    };
    (row, fails)
}

/// Models the oracle generated (summary.json) whose fixtures are not committed (size budget):
/// a loud SKIP line each, saying whether xwen implements the architecture at all.
fn report_uncommitted_models(dirs: &[PathBuf]) {
    let root = repo_root().join("tests").join("fixtures").join("parity");
    let Ok(text) = std::fs::read_to_string(root.join("summary.json")) else { return };
    let Ok(summary) = serde_json::from_str::<serde_json::Value>(&text) else { return };
    let Some(models) = summary["models"].as_object() else { return };
    for key in models.keys() {
        if dirs.iter().any(|d| d.ends_with(key)) {
            continue;
        }
        let gguf_arch = match key.rsplit('/').next().unwrap_or("") {
            "qwen3_5" => "qwen35",
            "qwen3_5_moe" => "qwen35moe",
            "qwen3_next" => "qwen3next",
            "kimi_linear" => "kimi-linear",
            "kimi_k3" => "kimi-k3",
            other => other,
        };
        let engine = if xwen_engine::supported_archs().contains(&gguf_arch) {
            "implemented by the engine, checked on the committed fixtures of the other set"
        } else {
            "NOT implemented by the engine yet"
        };
        eprintln!(
            "SKIP parity {key}: generated by the oracle (llama.cpp vs transformers figures in summary.json), \
             not committed (size budget); `{gguf_arch}` is {engine} — NOT a pass"
        );
    }
}

fn fixture_dirs() -> Vec<PathBuf> {
    let root = repo_root().join("tests").join("fixtures").join("parity");
    let mut out = Vec::new();
    for set in std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display())) {
        let set = set.unwrap().path();
        if !set.is_dir() {
            continue;
        }
        for fx in std::fs::read_dir(&set).unwrap() {
            let fx = fx.unwrap().path();
            if fx.join("cases.txt").exists() {
                out.push(fx);
            }
        }
    }
    out.sort();
    out
}

/// Cases that fail today, each with what is known. They still run and print every failing
/// position (as XFAIL), and the suite fails if one of them starts passing (XPASS), so this list
/// can only shrink. Keep it empty unless a failure is understood well enough to write down.
const KNOWN_FAILURES: &[(&str, &str, &str)] = &[
    // Empty: every committed tier (f32, bf16, Q8_0, Q4_K_M; dense and MoE; random, conditioned
    // and trained) is bit-identical to llama.cpp in prefill and decode (docs/parity.md). A case
    // added here still runs, prints its failures as XFAIL, and fails the suite once it passes.
];

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.2e}"))
}

/// The committed llama.cpp references come from an AVX2 build (docs/parity.md), so on an
/// AVX-512 machine xwen is asked to reproduce that build's float orders (kernels and
/// reference-side choices alike: `dispatch::reference_avx512`), not the native build's.
fn reproduce_the_fixtures_build() {
    use xwen_kernels::dispatch::{self, Isa};
    if dispatch::detected() == Isa::Avx512 {
        eprintln!("note: AVX-512 CPU; parity runs xwen in the AVX2 build's orders the fixtures were made with");
        dispatch::set_max_isa(Some(Isa::Avx2));
    }
}

/// Every case whose GGUF is committed.
#[test]
fn parity_suite() {
    suite(Models::Committed);
}

/// The cases on the trained tiny models in ../shared beside the repository.
#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn parity_suite_trained_shared_models() {
    suite(Models::Shared);
}

#[derive(Clone, Copy, PartialEq)]
enum Models {
    Committed,
    Shared,
}

fn suite(models: Models) {
    reproduce_the_fixtures_build();
    let mut dirs = fixture_dirs();
    // PARITY_ONLY=<text>: only the fixture folders whose path contains it (bisecting one family)
    if let Ok(only) = std::env::var("PARITY_ONLY") {
        let root = repo_root().join("tests").join("fixtures").join("parity");
        dirs.retain(|d| d.strip_prefix(&root).unwrap_or(d).to_string_lossy().contains(&only));
        eprintln!("PARITY_ONLY={only}: {} fixture folder(s) — NOT the whole suite", dirs.len());
    }
    assert!(!dirs.is_empty(), "no parity fixtures found under tests/fixtures/parity (regenerate: tools/oracle/make_fixtures.py)");
    report_uncommitted_models(&dirs);
    let mut rows = Vec::new();
    let mut fails = Vec::new();
    for dir in &dirs {
        let text = std::fs::read_to_string(dir.join("cases.txt")).unwrap();
        let fx = match parse_cases(dir, &text) {
            Ok(f) => f,
            Err(e) => {
                fails.push(e);
                continue;
            }
        };
        for (tier, spec, tol) in &fx.cases {
            if spec.starts_with("@shared/") != (models == Models::Shared) {
                continue;
            }
            let (mut row, f) = run_case(&fx, tier, spec, *tol, 2);
            let known = KNOWN_FAILURES
                .iter()
                .find(|(n, t, _)| *n == row.fixture && t == tier);
            match known {
                Some((_, _, why)) if !f.is_empty() => {
                    row.status = format!("XFAIL ({why})");
                    for m in &f {
                        eprintln!("XFAIL {m}");
                    }
                }
                Some(_) if !row.status.starts_with("SKIP") => {
                    fails.push(format!(
                        "{} {tier}: XPASS — listed in KNOWN_FAILURES but passes; remove it",
                        row.fixture
                    ));
                }
                _ => fails.extend(f),
            }
            rows.push(row);
        }
    }
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{:<24} {:<7} {:>8} {:>13} {:>10} {:>11} {:<18} status",
        "fixture", "tier", "tol", "max vs llama", "max vs hf", "max decode", "greedy"
    );
    for r in &rows {
        let _ = writeln!(
            table,
            "{:<24} {:<7} {:>8.1e} {:>13} {:>10} {:>11} {:<18} {}",
            r.fixture,
            r.tier,
            r.tol,
            fmt_opt(r.max_vs_llama),
            fmt_opt(r.max_vs_hf),
            fmt_opt(r.max_decode),
            r.greedy,
            r.status
        );
    }
    eprintln!(
        "\nparity summary (rel-L2 is the worst single position; \"max decode\" is the prompt fed one \
         token per forward, against llama.cpp fed one token per decode):\n{table}"
    );
    let out = repo_root().join("target");
    let _ = std::fs::create_dir_all(&out);
    let name = if models == Models::Shared { "parity-summary-shared.txt" } else { "parity-summary.txt" };
    let _ = std::fs::write(out.join(name), &table);
    let ran = rows
        .iter()
        .filter(|r| !r.status.starts_with("SKIP"))
        .count();
    for f in &fails {
        eprintln!("FAIL {f}");
    }
    assert!(
        ran > 0 || std::env::var_os("PARITY_ONLY").is_some(),
        "every parity case was skipped: nothing was checked"
    );
    assert!(
        fails.is_empty(),
        "{} parity failures (first: {})",
        fails.len(),
        fails[0]
    );
}

// ---------- the harness's own checks ----------

#[test]
fn npy_parser_reads_f32_and_f16_and_rejects_garbage() {
    let mk = |descr: &str, shape: &str, body: &[u8]| {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut v = b"\x93NUMPY\x01\x00".to_vec();
        v.extend_from_slice(&(h.len() as u16).to_le_bytes());
        v.extend_from_slice(h.as_bytes());
        v.extend_from_slice(body);
        v
    };
    let body: Vec<u8> = [1.5f32, -2.0, 0.25, 8.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let n = parse_npy(&mk("<f4", "(2, 2)", &body)).unwrap();
    assert_eq!(n.shape, vec![2, 2]);
    assert_eq!(n.data, vec![1.5, -2.0, 0.25, 8.0]);
    // f16: 1.0, -2.0, 65504, smallest subnormal
    let h: Vec<u8> = [0x3c00u16, 0xc000, 0x7bff, 0x0001]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let n = parse_npy(&mk("<f2", "(4,)", &h)).unwrap();
    assert_eq!(n.data[..3], [1.0, -2.0, 65504.0]);
    assert_eq!(n.data[3], 2f32.powi(-24));
    assert!(
        parse_npy(&mk("<f4", "(3, 2)", &body)).is_err(),
        "short body must be rejected"
    );
    assert!(
        parse_npy(&mk("<f8", "(2,)", &body)).is_err(),
        "f64 is not a fixture dtype"
    );
    assert!(parse_npy(b"PK\x03\x04").is_err());
}

#[test]
fn cases_parser_rejects_unknown_lines_and_reads_known_ones() {
    let ok = "set cond\narch qwen3_5\ngguf_arch qwen35\nprompt 0 p 1 2 3\nlogits hf 0 hf.p0.npy\n\
              case f32 model-f32.gguf 1e-4\ngreedy llama-f32 0 5 6\ngap llama-f32 0 0.5 1\n";
    let f = parse_cases(Path::new("x"), ok).unwrap();
    assert_eq!(f.prompts[&0].1, vec![1, 2, 3]);
    assert_eq!(
        f.cases[0],
        ("f32".to_string(), "model-f32.gguf".to_string(), 1e-4)
    );
    assert_eq!(f.greedy[&("llama-f32".to_string(), 0)], vec![5, 6]);
    assert!(parse_cases(Path::new("x"), &format!("{ok}bogus line\n")).is_err());
    assert!(
        parse_cases(Path::new("x"), "set cond\n").is_err(),
        "no cases must be an error"
    );
}

#[test]
fn rel_l2_is_relative_to_the_reference() {
    assert_eq!(rel_l2(&[1.0, 0.0], &[1.0, 0.0]), 0.0);
    assert!((rel_l2(&[1.1, 0.0], &[1.0, 0.0]) - 0.1).abs() < 1e-6);
    assert!((rel_l2(&[0.0, 2.0], &[0.0, 1.0]) - 1.0).abs() < 1e-12);
}
