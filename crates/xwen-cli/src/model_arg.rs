//! Resolving `-m MODEL` to an open model: a path, an official checkpoint name, or — with no
//! `-m` at all — the demo model embedded in this binary.

use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Arc;
use xwen_engine::{EngineConfig, Model};

use crate::opts::EngineOpts;
use xwen_gguf::GgufFile;

/// tiny-qwen35 (6 M parameters, trained on CPython's standard library), Q4_K_M: the library's.
pub static DEMO_GGUF: &[u8] = xwen_embed::DEMO_GGUF;

pub const DEMO_NOTE: &str = "xwen: no -m given: running the embedded demo model tiny-qwen35 (6M params, \
writes Python). For a real checkpoint: xwen run -m path/to/model.gguf (e.g. Qwen3.6-35B-A3B Q4_K_M)";

pub struct Loaded {
    pub model: Model,
    pub tokenizer: xwen_chat::Tokenizer,
    pub load_secs: f64,
    pub is_demo: bool,
}

/// Opens MODEL (`opts`: `--no-mmap`, `-c 0` for the trained context, quiet / verbose), builds
/// the tokenizer, identifies the checkpoint and (for files over 256 MiB, unless quiet)
/// pre-faults the weights with a progress line on stderr.
pub fn load(model: Option<&str>, mut cfg: EngineConfig, opts: &EngineOpts) -> Result<Loaded> {
    let quiet = opts.quiet;
    let t0 = std::time::Instant::now();
    let (file, is_demo, file_name, path) = match model {
        None => (GgufFile::from_bytes(DEMO_GGUF.to_vec()).context("embedded demo model")?, true, None, None),
        Some(m) => {
            let path = xwen_hub::hub::resolve(m)?;
            let name = path.file_name().map(|n| n.to_string_lossy().to_string());
            let file = if opts.no_mmap {
                let bytes = std::fs::read(&path).with_context(|| display(&path))?;
                GgufFile::from_bytes(bytes).with_context(|| display(&path))?
            } else {
                Model::open_file(&path, &cfg).with_context(|| display(&path))?
            };
            (file, false, name, Some(path))
        }
    };
    let trained = file.architecture().and_then(|a| file.get_u64(&format!("{a}.context_length")));
    match (opts.ctx_size, trained) {
        (Some(0), Some(t)) => cfg.max_ctx = usize::try_from(t).unwrap_or(crate::opts::MAX_CTX).min(crate::opts::MAX_CTX),
        (Some(0), None) => {
            opts.note(&format!("-c 0: the model states no trained context; using {}", EngineConfig::default().max_ctx));
            cfg.max_ctx = EngineConfig::default().max_ctx;
        }
        (Some(c), Some(t)) if c as u64 > t => opts.note(&format!("warning: -c {c} is beyond the {t} positions the model was trained on; quality may fall past them")),
        // the default context stops at the trained one: going past it takes an explicit -c
        (None, Some(t)) if cfg.max_ctx as u64 > t && t > 0 => {
            if opts.verbose {
                eprintln!("xwen: context {t} positions, the model's trained context (the default is {}; -c N to go past it)", cfg.max_ctx);
            }
            cfg.max_ctx = t as usize;
        }
        _ => {}
    }
    let file = Arc::new(file);
    let tokenizer = xwen_chat::Tokenizer::from_gguf(&file).context("tokenizer")?;
    let model = Model::from_gguf_at(file, path.as_deref(), &cfg)?;
    if opts.verbose {
        eprintln!(
            "xwen: kernels {:?} (CPU offers {:?}), {} threads, context {} positions",
            xwen_kernels::dispatch::active(),
            xwen_kernels::dispatch::detected(),
            model.threads(),
            model.max_context()
        );
    }
    if let (Some(plan), false) = (model.memory_plan(), quiet) {
        eprintln!("xwen: {}", plan.summary());
        if model.streams_experts() {
            match model.expert_pack_status() {
                (Some(p), _) => eprintln!("xwen: experts read from the pack {} (one read per expert)", p.display()),
                (None, Some(why)) => eprintln!("xwen: note: {why}"),
                (None, None) => {}
            }
        }
        if model.streams_experts() {
            let direct = model.expert_cache_stats().is_some_and(|s| s.direct_io);
            eprintln!(
                "xwen: routed experts stream from disk into the cache{}",
                if direct { " (direct I/O, past the page cache)" } else { " (this filesystem refuses direct I/O: buffered reads, dropped from the page cache after each)" }
            );
        }
    }
    let checkpoint = model.checkpoint(file_name.as_deref());
    if !quiet && !is_demo {
        match checkpoint {
            Some(c) => eprintln!("xwen: checkpoint {}", c.full_name()),
            None if opts.verbose => eprintln!("xwen: `{}` is not an official checkpoint; running it as {}", model.name().unwrap_or("(unnamed)"), model.architecture()),
            None => {}
        }
    }
    if !quiet && model.weight_bytes() > 256 << 20 {
        // A live percentage on a terminal; one line when stderr is a file or pipe.
        use std::io::IsTerminal;
        let tty = std::io::stderr().is_terminal();
        let mut last = u64::MAX;
        let total = model.prefault(&mut |done, total| {
            let pct = done * 100 / total.max(1);
            if tty && pct != last {
                last = pct;
                eprint!("\rxwen: loading weights {pct:3}% of {:.2} GiB", total as f64 / (1u64 << 30) as f64);
            }
        });
        if tty {
            eprintln!();
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        match model.gguf().huge_mapped_bytes() {
            Some(huge) => {
                eprintln!("xwen: loaded weights: {:.2} GiB paged in, {:.2} GiB of it in 2 MiB pages", gib(total), gib(huge));
                let small = total.saturating_sub(huge);
                let pct = small as f64 * 100.0 / total.max(1) as f64;
                if cfg.map_pages == xwen_gguf::MapPages::Huge && small > total / 10 {
                    if cfg.reread_huge_pages {
                        // the eviction is only a hint (Model::open_file): say that it did not take
                        // rather than suggest the switch that was given
                        eprintln!(
                            "xwen: {pct:.0}% of the weights are still in small pages after --reread-huge-pages: the \
                             file could not be dropped from the page cache (another process maps it?) or this \
                             filesystem does not keep 2 MiB folios; decode streams them slower"
                        );
                    } else {
                        eprintln!(
                            "xwen: {pct:.0}% of the weights sit in the page cache in small pages (another program \
                             read them in), which decode streams slower (a MoE model up to ~1.4x); \
                             --reread-huge-pages drops the file from the cache and reads it back in 2 MiB pages"
                        );
                    }
                }
            }
            None => eprintln!("xwen: loaded weights: {:.2} GiB paged in", gib(total)),
        }
    }
    Ok(Loaded { model, tokenizer, load_secs: t0.elapsed().as_secs_f64(), is_demo })
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

/// The expert cache's counters after a run that streamed experts (stderr), else nothing.
pub fn print_expert_cache(model: &xwen_engine::Model) {
    if let Some(s) = model.expert_cache_stats() {
        eprintln!(
            "xwen: expert cache: {} hits, {} misses ({:.1}% hit rate), read ahead: {} experts, {} used ({} of them waited for), {} evicted unused; {} evictions, {:.1} MB read from disk in {} reads, {:.0} of {:.0} MB held",
            s.hits,
            s.misses,
            100.0 * s.hit_rate(),
            s.prefetch_reads,
            s.prefetch_used,
            s.prefetch_waited,
            s.prefetch_wasted,
            s.evictions,
            s.bytes_read as f64 / 1e6,
            s.reads,
            s.cached_bytes as f64 / 1e6,
            s.capacity_bytes as f64 / 1e6
        );
    }
}

/// The row cache's counters after a run that streamed a table's rows (stderr), else nothing.
pub fn print_row_cache(model: &xwen_engine::Model) {
    if let Some(s) = model.row_cache_stats() {
        eprintln!(
            "xwen: row cache: {} rows asked, {} distinct: {} hits, {} misses ({:.1}% hit rate); {} evictions, {:.2} MB read from disk in {} reads, {:.1} of {:.1} MB held",
            s.rows_asked,
            s.hits + s.misses,
            s.hits,
            s.misses,
            100.0 * s.hit_rate(),
            s.evictions,
            s.bytes_read as f64 / 1e6,
            s.reads,
            s.cached_bytes as f64 / 1e6,
            s.capacity_bytes as f64 / 1e6
        );
    }
}

pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(|c: char| c == ',' || c.is_whitespace()).filter(|x| !x.is_empty()).map(|x| x.parse::<u32>().with_context(|| format!("--ids: `{x}` is not a token id"))).collect()
}

/// Prints the per-op profile (if enabled) to stderr, largest first.
pub fn print_profile(model: &xwen_engine::Model) {
    let mut rep = model.profile_report();
    if rep.is_empty() {
        return;
    }
    rep.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = rep.iter().map(|r| r.1).sum();
    eprintln!("{:<34} {:>9} {:>6} {:>8}", "op", "ms", "%", "calls");
    for (name, secs, calls) in rep {
        eprintln!("{:<34} {:>9.1} {:>5.1}% {:>8}", name, secs * 1e3, 100.0 * secs / total, calls);
    }
}

/// The model's trunk layers (`{arch}.block_count`), what `-ngl` counts against.
pub fn n_layer(model: &xwen_engine::Model) -> usize {
    let f = model.gguf();
    f.architecture().and_then(|a| f.get_u64(&format!("{a}.block_count"))).unwrap_or(0) as usize
}
