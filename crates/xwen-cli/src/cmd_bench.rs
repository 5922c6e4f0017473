//! `xwen bench`: prefill and decode throughput with llama-bench's meaning and output, so the two
//! can be run side by side (scripts/bench-vs-llamacpp, docs/bench.md "Method").
//!
//! As in llama-bench (tools/llama-bench/llama-bench.cpp, b11434): a `ppP` test prefills P random
//! tokens from an empty state; a `tgN` test decodes N random tokens one at a time, also from an
//! empty state; each repetition starts fresh; before the timed repetitions one warm-up runs (the
//! whole prompt for pp, a single token for tg). `--json` prints llama-bench's `-o json` fields.

use crate::cli::BenchArgs;
use crate::lcg::Lcg;
use crate::model_arg;
use crate::stats::{mean, median, stddev};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;
use xwen_engine::{LogitsMode, Model};

#[derive(Clone, Copy, PartialEq)]
enum Output {
    Markdown,
    Json,
}

struct TestResult {
    n_prompt: usize,
    n_gen: usize,
    /// Positions already in the sequence when the timed part starts (llama-bench's n_depth).
    n_depth: usize,
    samples_ns: Vec<u64>,
    test_time: String,
    /// The expert cache over the timed repetitions, when experts stream (`--ram-budget`).
    cache: Option<xwen_engine::ExpertCacheStats>,
}

impl TestResult {
    fn samples_ts(&self) -> Vec<f64> {
        let n = (self.n_prompt + self.n_gen) as f64;
        self.samples_ns.iter().map(|&t| 1e9 * n / t as f64).collect()
    }

    fn name(&self) -> String {
        let test = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}"),
            (p, n) => format!("pp{p}+tg{n}"),
        };
        match self.n_depth {
            0 => test,
            d => format!("{test} @ d{d}"),
        }
    }
}

pub fn run(a: BenchArgs) -> Result<()> {
    let prompts = a.n_prompt.clone().map(|l| l.0).unwrap_or_else(|| vec![if a.parallel.is_some() { 128 } else { 512 }]);
    let gens = a.n_gen.clone().map(|l| l.0).unwrap_or_else(|| vec![128]);
    let depths = a.n_depth.clone().map(|l| l.0).unwrap_or_else(|| vec![0]);
    if depths.iter().any(|&d| d > 0) && (a.parallel.is_some() || a.verify.is_some() || a.draft.draft.is_some() || a.draft.model_draft.is_some()) {
        bail!("-d (--n-depth) applies to the pp / tg tests; --parallel, --verify and --draft set their own contexts with -p");
    }
    let output = match a.output.as_deref() {
        Some("json") => Output::Json,
        Some(_) => Output::Markdown,
        None if a.json => Output::Json,
        None => Output::Markdown,
    };
    let no_warmup = a.no_warmup;
    let mut cfg = a.engine.engine_config()?;
    // a RAM plan holds the state of every sequence the test runs at once
    cfg.n_seq = a.parallel.as_ref().and_then(|p| p.0.iter().max().copied()).unwrap_or(1).max(1);
    // llama-batched-bench runs each configuration once; llama-bench five times
    let reps = a.repetitions.map_or(if a.parallel.is_some() { 1 } else { 5 }, |r| r as usize);
    if a.membw {
        return bench_membw(cfg.resolved_threads(), a.membw_mib as usize, reps, output);
    }
    let model_arg = a.model.clone();
    let Some(model_path) = model_arg else { bail!("-m MODEL is required (or --membw); see `xwen bench --help`") };

    // bench drafts only when asked (run and serve draft with the file's own head by default)
    let asked = a.draft.draft.is_some() || a.draft.model_draft.is_some();
    let mut draft_opts = a.draft.clone();
    if !asked {
        draft_opts.draft = Some("none".into());
    }
    if asked && (a.verify.is_some() || a.parallel.is_some()) {
        bail!("--draft runs its own test: give it without --verify and --parallel");
    }
    let mut draft = crate::draft_arg::prepare(&draft_opts, &mut cfg, 1)?;
    let mut loaded = model_arg::load(Some(&model_path), cfg, &a.engine)?;
    draft.attach(&mut loaded.model)?;
    // `--parallel`, `--verify` and `--draft` run the library's model and engine, which compute
    // where -ngl puts them (the pp / tg tests drive the CUDA model directly, below)
    // (a model split over several GPUs runs every test through the library's device seam)
    let n_gpus = a.engine.gpus.as_ref().map_or(1, |g| g.0.len());
    let multi_gpu = n_gpus > 1;
    let through_engine = a.parallel.is_some() || a.verify.is_some() || asked || multi_gpu;
    let on_device = through_engine && crate::gpu::place(&a.engine, &mut loaded.model)? != crate::gpu::Placement::Cpu;
    draft.place_model(&a.engine, &loaded.model)?;
    // shared with the engine `--parallel` runs its requests through
    let shared = Arc::new(loaded.model);
    let model: &Model = &shared;
    let t0 = Instant::now();
    let touched = if a.no_prefault || on_device { 0 } else { prefault(model) };
    eprintln!(
        "xwen bench: loaded {} in {:.2} s, {:.2} GB of weights paged in in {:.2} s, {} threads",
        model_path,
        loaded.load_secs,
        touched as f64 / 1e9,
        t0.elapsed().as_secs_f64(),
        model.threads()
    );
    if let Some(mut depths) = a.verify.clone().map(|l| l.0) {
        if depths.first() != Some(&1) {
            depths.insert(0, 1);
        }
        crate::bench_verify::run(model, &depths, prompts[0], reps, output == Output::Json)?;
        model_arg::print_profile(model);
        model_arg::print_expert_cache(model);
        return Ok(());
    }
    if asked {
        let max_draft = draft.max();
        let Some(mut drafter) = draft.drafter(model)? else {
            bail!("--draft none: nothing to compare; give a drafter (ngram, mtp, model:FILE, dflash:FILE, replay:FILE)");
        };
        let kind = drafter.name();
        let (prompt, prompt_desc) = crate::bench_draft::prompt(&loaded.tokenizer, a.draft_file.as_deref(), a.draft_prompt.as_deref(), prompts[0], model.n_vocab())?;
        for &n_gen in gens.iter().filter(|&&n| n > 0) {
            let c = crate::bench_draft::Config {
                prompt: prompt.clone(),
                prompt_desc: prompt_desc.clone(),
                n_gen,
                reps,
                warmup: !no_warmup,
                max_draft,
                json: output == Output::Json,
                prefill_chunk: a.engine.prefill_chunk(),
                model_filename: model_path.clone(),
            };
            crate::bench_draft::run(model, drafter.as_mut(), kind, &c)?;
        }
        model_arg::print_profile(model);
        model_arg::print_expert_cache(model);
        return Ok(());
    }
    if let Some(parallel) = a.parallel.clone().map(|l| l.0) {
        let c = crate::bench_parallel::Config { prompts: prompts.clone(), gens: gens.clone(), parallel, reps, json: output == Output::Json, warmup: !no_warmup };
        crate::bench_parallel::run(&shared, &c)?;
        model_arg::print_profile(model);
        model_arg::print_expert_cache(model);
        return Ok(());
    }
    let desc = ModelDesc::of(model, &model_path);
    let one_gpu = if multi_gpu { crate::gpu::Placement::Cpu } else { crate::gpu::placement(a.engine.n_gpu_layers.as_deref(), a.engine.device_arg().as_deref(), model_arg::n_layer(model))? };
    if let crate::gpu::Placement::Cuda(ordinal) = one_gpu {
        if depths.iter().any(|&d| d > 0) {
            bail!("-d is not on the GPU yet");
        }
        return bench_gpu(model, &desc, ordinal, &prompts, &gens, reps, !no_warmup, output, a.engine.prefill_chunk(), a.engine.profile, a.engine.vram_budget);
    }
    if !multi_gpu {
        a.engine.check_vram_budget_on_cpu()?;
    }
    eprintln!("xwen bench: a decoded token reads {:.3} GB of weights", desc.decode_bytes as f64 / 1e9);
    let mut rng = Lcg(1);
    let tests: Vec<(usize, usize, usize)> = depths
        .iter()
        .flat_map(|&d| {
            let pp = prompts.iter().filter(|&&p| p > 0).map(move |&p| (p, 0, d));
            pp.chain(gens.iter().filter(|&&n| n > 0).map(move |&n| (0, n, d)))
        })
        .collect();
    if let Some(&(p, n, d)) = tests.iter().find(|&&(p, n, d)| p + n + d > model.max_context()) {
        bail!("a test needs {} positions (depth {d} + {} tokens) but the context holds {}; raise -c", p + n + d, p + n, model.max_context());
    }
    // the state at each depth, prefilled once (untimed) and cloned for every repetition, as
    // llama-bench restores its saved sequence state
    let mut at_depth: Option<(usize, xwen_engine::SeqState)> = None;

    if output == Output::Markdown {
        print_md_header();
    }
    let mut json_tests = Vec::new();
    for (n_prompt, n_gen, n_depth) in tests {
        if !no_warmup {
            if n_prompt > 0 {
                run_prompt(model, model.new_state(), n_prompt, &mut rng)?;
            }
            if n_gen > 0 {
                run_gen(model, model.new_state(), 1, &mut rng)?;
            }
        }
        if n_depth > 0 && at_depth.as_ref().map(|(d, _)| *d) != Some(n_depth) {
            let mut state = model.new_state();
            let tokens: Vec<u32> = (0..n_depth).map(|_| rng.below(model.n_vocab() as u32)).collect();
            model.forward(&mut state, &tokens, LogitsMode::Last)?;
            at_depth = Some((n_depth, state));
        }
        let start = || match &at_depth {
            Some((d, state)) if *d == n_depth => state.clone(),
            _ => model.new_state(),
        };
        let mut r = TestResult { n_prompt, n_gen, n_depth, samples_ns: Vec::new(), test_time: rfc3339_now(), cache: None };
        model.reset_expert_cache_stats();
        model.reset_row_cache_stats();
        for _ in 0..reps {
            let ns = if n_prompt > 0 { run_prompt(model, start(), n_prompt, &mut rng)? } else { run_gen(model, start(), n_gen, &mut rng)? };
            r.samples_ns.push(ns);
        }
        r.cache = model.expert_cache_stats();
        if let Some(c) = model.row_cache_stats() {
            // a streamed table's reads over this test's timed repetitions, per token
            let tokens = ((n_prompt + n_gen) * reps).max(1) as f64;
            eprintln!(
                "xwen bench: {}: table rows {:.1} KB read per token ({:.1} reads), {:.1}% of distinct rows cached",
                if n_prompt > 0 { format!("pp{n_prompt}") } else { format!("tg{n_gen}") },
                c.bytes_read as f64 / tokens / 1e3,
                c.reads as f64 / tokens,
                100.0 * c.hit_rate()
            );
        }
        match output {
            Output::Markdown if multi_gpu => print_md_row_on(&desc, &format!("CUDA x{n_gpus}"), 1, &r),
            Output::Markdown => print_md_row(&desc, model.threads(), &r),
            Output::Json => json_tests.push(json_test(&desc, model.threads(), &r)),
        }
    }
    match output {
        Output::Markdown => println!("\nt/s: median ± sample stddev over {reps} repetitions; xwen {}", env!("CARGO_PKG_VERSION")),
        Output::Json => {
            // A reader that stops early (`| head`) is not an error worth a panic.
            let text = serde_json::to_string_pretty(&Value::Array(json_tests))?;
            match writeln!(std::io::stdout().lock(), "{text}") {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                r => r?,
            }
        }
    }
    model_arg::print_expert_cache(model);
    model_arg::print_row_cache(model);
    Ok(())
}

/// The pp / tg tests on the CUDA backend (`-ngl 99`), printed as the CPU's are.
#[allow(clippy::too_many_arguments)]
fn bench_gpu(
    model: &Model,
    desc: &ModelDesc,
    ordinal: usize,
    prompts: &[usize],
    gens: &[usize],
    reps: usize,
    warmup: bool,
    output: Output,
    ubatch: usize,
    a_profile: bool,
    vram_budget: Option<u64>,
) -> Result<()> {
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (model, desc, ordinal, prompts, gens, reps, warmup, output, ubatch, a_profile, vram_budget);
        Err(crate::gpu::not_built())
    }
    #[cfg(feature = "cuda")]
    {
        let need = prompts.iter().chain(gens).copied().max().unwrap_or(1);
        // under --ram-budget the engine's streamed store is the VRAM expert cache's host tier
        let store = model.streams_experts().then(|| model.expert_store());
        let mut m = crate::gpu::load(model.gguf(), ordinal, need.max(512) + 1, ubatch, vram_budget, store)?;
        if output == Output::Markdown {
            print_md_header();
        }
        let mut json_tests = Vec::new();
        let tests: Vec<(usize, usize)> = prompts.iter().filter(|&&p| p > 0).map(|&p| (p, 0)).chain(gens.iter().filter(|&&n| n > 0).map(|&n| (0, n))).collect();
        for (n_prompt, n_gen) in tests {
            let samples_ns = crate::gpu::bench_test(&mut m, n_prompt, n_gen, reps, warmup)?;
            let r = TestResult { n_prompt, n_gen, n_depth: 0, samples_ns, test_time: rfc3339_now(), cache: None };
            match output {
                Output::Markdown => print_md_row_on(desc, "CUDA", 1, &r),
                Output::Json => {
                    let mut v = json_test(desc, 1, &r);
                    v["n_gpu_layers"] = json!(99);
                    v["backend"] = json!("CUDA");
                    v["gpu_info"] = json!(m.device().to_string());
                    json_tests.push(v);
                }
            }
        }
        if a_profile {
            crate::gpu::print_profile(&mut m, prompts.iter().copied().max().unwrap_or(0))?;
        }
        if let Some(c) = m.expert_cache_stats() {
            eprintln!(
                "xwen: VRAM expert cache ({} of {} experts a layer): {:.1}% of the experts a pass needed were on the device; {} copied up ({:.2} GB), {} computed on the CPU ({} threads), {} rounds; {} read ahead, {} of them used",
                c.slots,
                c.n_expert,
                100.0 * c.hit_rate(),
                c.loads,
                c.bytes_up as f64 / 1e9,
                c.on_cpu,
                c.cpu_threads,
                c.rounds,
                c.read_ahead,
                c.read_ahead_used
            );
            if c.split_steps > 0 {
                let per = |us: u64| us as f64 / c.split_steps as f64;
                eprintln!(
                    "xwen: VRAM expert cache: {} decode MoE layer steps split with the CPU, each {:.1} µs of CPU products beside {:.1} µs of the GPU's routed part; {:.1} µs waiting for the router's picks a step",
                    c.split_steps,
                    per(c.cpu_us),
                    per(c.gpu_us),
                    per(c.wait_us)
                );
            }
        }
        match output {
            Output::Markdown => println!("\nt/s: median ± sample stddev over {reps} repetitions; xwen {} on {}", env!("CARGO_PKG_VERSION"), m.device()),
            Output::Json => println!("{}", serde_json::to_string_pretty(&Value::Array(json_tests))?),
        }
        Ok(())
    }
}

/// `--membw`: read bandwidth of a `mib` MiB buffer with `threads` threads, `passes` passes;
/// prints the best (the floor's denominator, docs/bench.md) and the median.
fn bench_membw(threads: usize, mib: usize, passes: usize, output: Output) -> Result<()> {
    if mib < 64 {
        bail!("--membw-mib {mib}: below 64 MiB the buffer may fit in a cache");
    }
    let buf = xwen_kernels::membw::buffer(mib << 20);
    let pool = xwen_kernels::Pool::new(threads);
    let samples = xwen_kernels::membw::read_bandwidth(&pool, &buf, passes);
    let best = samples.iter().cloned().fold(0.0, f64::max);
    let med = median(&samples);
    match output {
        Output::Markdown => println!("memory read bandwidth: {threads} threads, {mib} MiB, {passes} passes: best {best:.2} GB/s, median {med:.2} GB/s"),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "test": "membw", "n_threads": threads, "buffer_bytes": buf.len(),
                "best_gbs": best, "median_gbs": med, "samples_gbs": samples,
            }))?
        ),
    }
    Ok(())
}

/// Reads one byte of every page of every tensor, so the timed runs do not include page faults
/// that fetch weights from disk. llama.cpp maps with MAP_POPULATE (and copies repacked tensors to
/// RAM) at load, outside llama-bench's timings; this is the same. Returns the bytes covered.
/// Routed experts that stream under `--ram-budget` are left alone: they are read into the
/// bounded cache, never through the mapping, and paging all of them in would fill the page
/// cache (inside a memory cgroup, evicting the trunk's pages) with what the budget keeps out.
fn prefault(model: &Model) -> u64 {
    const PAGE: usize = 4096;
    let f = model.gguf();
    let mut sum = 0u8;
    let mut bytes = 0u64;
    for t in f.tensors().iter().filter(|t| !model.streams_tensor(&t.name)) {
        let d = f.tensor_data(t);
        bytes += d.len() as u64;
        for i in (0..d.len()).step_by(PAGE) {
            sum = sum.wrapping_add(d[i]);
        }
    }
    std::hint::black_box(sum);
    bytes
}

/// Prefill of `n` random tokens on top of `state` (empty, or at a depth); returns nanoseconds.
fn run_prompt(model: &Model, mut state: xwen_engine::SeqState, n: usize, rng: &mut Lcg) -> Result<u64> {
    let n_vocab = model.n_vocab() as u32;
    let tokens: Vec<u32> = (0..n).map(|_| rng.below(n_vocab)).collect();
    let t0 = Instant::now();
    // as llama-bench, nothing reads the logits: a device picks the argmax and copies back one id
    model.forward(&mut state, &tokens, LogitsMode::LastArgmax)?;
    Ok(t0.elapsed().as_nanos() as u64)
}

/// Decode of `n` random tokens one at a time on top of `state`; returns nanoseconds.
fn run_gen(model: &Model, mut state: xwen_engine::SeqState, n: usize, rng: &mut Lcg) -> Result<u64> {
    let n_vocab = model.n_vocab() as u32;
    let mut token = rng.below(n_vocab);
    let t0 = Instant::now();
    for _ in 0..n {
        model.forward(&mut state, &[token], LogitsMode::LastArgmax)?;
        token = rng.below(n_vocab);
    }
    Ok(t0.elapsed().as_nanos() as u64)
}

/// What llama-bench reports about the model.
struct ModelDesc {
    filename: String,
    /// llama.cpp's `llama_model_desc`: "{arch} {size type} {file type}".
    model_type: String,
    size: u64,
    n_params: u64,
    /// Weight bytes one decoded token reads (see `decode_weight_bytes`).
    decode_bytes: u64,
}

impl ModelDesc {
    fn of(model: &Model, filename: &str) -> ModelDesc {
        let f = model.gguf();
        let arch = model.architecture();
        let n_layer = f.get_u64(&f.arch_key("block_count")).unwrap_or(0).saturating_sub(f.get_u64(&f.arch_key("nextn_predict_layers")).unwrap_or(0));
        let n_embd = f.get_u64(&f.arch_key("embedding_length")).unwrap_or(0);
        // llama.cpp's load_arch_hparams size names for these architectures.
        let size = match (arch, n_layer, n_embd) {
            ("qwen35", 24, 1024) => "0.8B",
            ("qwen35", 24, _) => "2B",
            ("qwen35", 32, 2560) => "4B",
            ("qwen35", 32, _) => "9B",
            ("qwen35", 64, _) => "27B",
            ("qwen35moe", 40, _) => "35B.A3B",
            ("qwen35moe", 48, _) => "122B.A10B",
            ("qwen35moe", 60, _) => "397B.A17B",
            _ => "?B",
        };
        let ftype = f.get_u32("general.file_type").map_or("(unknown file type)", ftype_name);
        ModelDesc {
            filename: filename.to_string(),
            model_type: format!("{arch} {size} {ftype}"),
            size: model.weight_bytes(),
            n_params: f.tensors().iter().map(|t| t.n_elements()).sum(),
            decode_bytes: decode_weight_bytes(f, &model.row_tables()),
        }
    }
}

/// Weight bytes a decode step must read: every tensor, except that token_embd contributes one
/// row (unless it is also the lm_head: no output.weight), a lookup table (`tables`: qwen4exp's
/// PLE table) the rows a token reads, and each routed-expert tensor (`*_exps`) only
/// `expert_used_count / expert_count` of itself. Divided by the memory bandwidth this is
/// the decode floor (docs/bench.md "Floors").
fn decode_weight_bytes(f: &xwen_gguf::GgufFile, tables: &[xwen_engine::experts::rows::RowTable]) -> u64 {
    let n_expert = f.get_u64(&f.arch_key("expert_count")).unwrap_or(0);
    let n_used = f.get_u64(&f.arch_key("expert_used_count")).unwrap_or(0);
    let tied = f.tensor("output.weight").is_none();
    f.tensors()
        .iter()
        .map(|t| {
            if t.name == "token_embd.weight" && !tied {
                t.n_bytes / t.rows().max(1)
            } else if let Some(r) = tables.iter().find(|r| r.mat.info.name == t.name) {
                // a lookup table: the rows a token reads (qwen4exp's PLE: one per head)
                (r.mat.row_bytes() * r.per_token) as u64
            } else if t.name.contains("_exps.") && n_expert > 0 {
                t.n_bytes / n_expert * n_used
            } else {
                t.n_bytes
            }
        })
        .sum()
}

/// llama_ftype_name (src/llama-model-loader.cpp) for the file types xwen can load.
fn ftype_name(ft: u32) -> &'static str {
    match ft {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        25 => "IQ4_NL - 4.5 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        32 => "BF16",
        _ => "unknown, may not work",
    }
}

fn json_test(d: &ModelDesc, threads: usize, r: &TestResult) -> Value {
    let ns: Vec<f64> = r.samples_ns.iter().map(|&x| x as f64).collect();
    let ts = r.samples_ts();
    // Names and types as llama-bench's json_printer writes them; `engine`, `median_ns`,
    // `median_ts` and `decode_weight_bytes` are ours.
    json!({
        "build_commit": format!("xwen-{}", env!("CARGO_PKG_VERSION")),
        "build_number": 0,
        "cpu_info": cpu_info(),
        "gpu_info": "",
        "backends": "CPU",
        "engine": "xwen",
        "model_filename": d.filename,
        "model_type": d.model_type,
        "model_size": d.size,
        "model_n_params": d.n_params,
        "decode_weight_bytes": d.decode_bytes,
        "n_threads": threads,
        "n_gpu_layers": 0,
        "n_prompt": r.n_prompt,
        "n_gen": r.n_gen,
        "n_depth": r.n_depth,
        "test_time": r.test_time,
        "avg_ns": mean(&ns) as u64,
        "stddev_ns": stddev(&ns) as u64,
        "median_ns": median(&ns) as u64,
        "avg_ts": mean(&ts),
        "stddev_ts": stddev(&ts),
        "median_ts": median(&ts),
        "samples_ns": r.samples_ns,
        "samples_ts": ts,
        // ours, with --ram-budget: the expert cache over this test's timed repetitions
        "expert_cache": r.cache.map(|c| {
            let tokens = ((r.n_prompt + r.n_gen) * r.samples_ns.len()).max(1) as u64;
            json!({
                "hits": c.hits,
                "misses": c.misses,
                "hit_rate": c.hit_rate(),
                "prefetch_used": c.prefetch_used,
                "prefetch_waited": c.prefetch_waited,
                "prefetch_reads": c.prefetch_reads,
                "prefetch_wasted": c.prefetch_wasted,
                "bytes_read": c.bytes_read,
                "bytes_read_per_token": c.bytes_read / tokens,
                "reads": c.reads,
                "expert_bytes": c.expert_bytes,
                "capacity_bytes": c.capacity_bytes,
                "direct_io": c.direct_io,
            })
        }),
    })
}

/// (header, width): negative widths are left-aligned, as in llama-bench's markdown printer.
const COLUMNS: [(&str, i32); 6] = [("model", -30), ("size", 10), ("params", 10), ("backend", -10), ("threads", 7), ("test", 15)];

fn print_md_header() {
    let mut head = String::from("|");
    let mut rule = String::from("|");
    for (name, w) in COLUMNS.iter().copied().chain([("t/s", 20)]) {
        head += &format!(" {} |", pad(name, w));
        rule += &format!(" {}{} |", "-".repeat(w.unsigned_abs() as usize - 1), if w > 0 { ':' } else { '-' });
    }
    println!("{head}\n{rule}");
}

fn print_md_row(d: &ModelDesc, threads: usize, r: &TestResult) {
    print_md_row_on(d, "CPU", threads, r)
}

fn print_md_row_on(d: &ModelDesc, backend: &str, threads: usize, r: &TestResult) {
    let size = if d.size < 1 << 30 { format!("{:.2} MiB", d.size as f64 / (1u64 << 20) as f64) } else { format!("{:.2} GiB", d.size as f64 / (1u64 << 30) as f64) };
    let params = if d.n_params < 1_000_000_000 { format!("{:.2} M", d.n_params as f64 / 1e6) } else { format!("{:.2} B", d.n_params as f64 / 1e9) };
    let ts = r.samples_ts();
    let values = [d.model_type.clone(), size, params, backend.into(), threads.to_string(), r.name()];
    let mut line = String::from("|");
    for ((_, w), v) in COLUMNS.iter().zip(values) {
        line += &format!(" {} |", pad(&v, *w));
    }
    line += &format!(" {} |", pad(&format!("{:.2} ± {:.2}", median(&ts), stddev(&ts)), 20));
    println!("{line}");
}

fn pad(s: &str, w: i32) -> String {
    let width = w.unsigned_abs() as usize;
    if w < 0 {
        format!("{s:<width$}")
    } else {
        format!("{s:>width$}")
    }
}

fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Now as RFC 3339 UTC ("2026-01-31T12:00:00Z"), llama-bench's test_time format.
fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm), valid for every date after 1970.
    let z = days as i64 + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_match_llama_bench_definitions() {
        let v = [1.0, 2.0, 4.0];
        assert_eq!(mean(&v), 7.0 / 3.0);
        assert!((stddev(&v) - (7.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(stddev(&[5.0]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn test_names_follow_llama_bench() {
        let r = |p, n| TestResult { n_prompt: p, n_gen: n, n_depth: 0, samples_ns: vec![2_000_000_000], test_time: String::new(), cache: None };
        assert_eq!(r(512, 0).name(), "pp512");
        assert_eq!(r(0, 128).name(), "tg128");
        assert_eq!(r(0, 128).samples_ts(), vec![64.0]);
    }

    #[test]
    fn decode_reads_one_embedding_row_and_the_used_share_of_experts() {
        use xwen_gguf::{GgmlType, GgufFile, GgufWriter, Value};
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", "qwen35moe".into());
        w.add_kv("qwen35moe.expert_count", Value::U32(4));
        w.add_kv("qwen35moe.expert_used_count", Value::U32(1));
        let mut add = |name: &str, dims: &[u64]| {
            let n = GgmlType::F32.row_bytes(dims.iter().product()).unwrap() as usize;
            w.add_tensor(name, GgmlType::F32, dims, vec![0; n]).unwrap();
        };
        add("token_embd.weight", &[8, 100]); // 3200 B, one row 32 B
        add("output.weight", &[8, 100]); // 3200 B
        add("blk.0.ffn_up_exps.weight", &[8, 16, 4]); // 2048 B, one expert 512 B
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(decode_weight_bytes(&f, &[]), 32 + 3200 + 512);

        // Tied embeddings: token_embd is the lm_head too, read whole.
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", "qwen35".into());
        w.add_tensor("token_embd.weight", GgmlType::F32, &[8, 100], vec![0; 3200]).unwrap();
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(decode_weight_bytes(&f, &[]), 3200);
    }

    #[test]
    fn rfc3339_has_the_right_shape() {
        let s = rfc3339_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z') && &s[10..11] == "T");
    }
}
