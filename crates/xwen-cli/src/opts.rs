//! Flag groups several commands share (the engine's settings, sampling) and the value parsers
//! that range-check them. A value out of range is refused by clap with the flag's name and the
//! allowed range; a value that is legal but cannot help (more threads than CPUs, `-ngl` on a
//! CPU engine) is adjusted with a one-line note.

use anyhow::Result;
use xwen_engine::{EngineConfig, SamplerConfig};

/// The largest `-c`: 16M positions (Qwen3.6 is trained at 256K); beyond it every KV cache
/// would be too large to plan.
pub const MAX_CTX: usize = 1 << 24;

#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Engine")]
pub struct EngineOpts {
    /// Compute threads (default: every CPU; more than the machine has is capped, with a note)
    #[arg(short = 't', long = "threads", value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub threads: Option<u32>,
    /// Positions per sequence, the KV cache's size (0: the model's trained context; default 32768)
    #[arg(short = 'c', long = "ctx-size", value_name = "N", value_parser = ctx_size)]
    pub ctx_size: Option<usize>,
    /// Logical batch: prompt tokens handed to the engine at once (llama.cpp's -b; caps -ub)
    #[arg(short = 'b', long = "batch-size", value_name = "N", allow_negative_numbers = true, value_parser = batch)]
    pub batch_size: Option<usize>,
    /// Physical batch: prompt tokens per forward step (also -ub; llama.cpp's n_ubatch, default 512)
    #[arg(long = "ubatch-size", value_name = "N", allow_negative_numbers = true, value_parser = batch)]
    pub ubatch_size: Option<usize>,
    /// Hard RAM ceiling; MoE experts (and qwen4exp's PLE table rows) stream from disk into bounded caches (e.g. 12G, 800M, auto = 3/4 of what this process may use: the cgroup limit, else MemAvailable)
    #[arg(long = "ram-budget", value_name = "SIZE", allow_hyphen_values = true, value_parser = ram_budget)]
    pub ram_budget: Option<u64>,
    /// Hard ceiling on what -ngl 99 holds on the GPU (e.g. 12G): where the whole model does not
    /// fit under it, routed experts live in a VRAM cache fed from host RAM (`xwen plan -ngl 99
    /// --vram-budget SIZE` shows the tiers); with --gpus, the ceiling of each GPU
    #[arg(long = "vram-budget", value_name = "SIZE", value_parser = vram_budget)]
    pub vram_budget: Option<u64>,
    /// With --ram-budget: do not read the next layer's likely experts ahead while a layer
    /// computes (on by default)
    #[arg(long = "no-prefetch")]
    pub no_prefetch: bool,
    /// With --ram-budget: prompt batches (of 512 tokens) each layer takes at once, so a streamed
    /// expert is read once for all of them (default: up to 4 where the plan affords it; 1 = batch by batch)
    #[arg(long = "prefill-wave", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub prefill_wave: Option<u16>,
    /// KV cache type of K (also -ctk; llama.cpp's default f16; q8_0 is not yet bit-identical to llama.cpp)
    #[arg(long = "cache-type-k", value_name = "TYPE", default_value = "f16", value_parser = ["f32", "f16", "q8_0"])]
    pub cache_type_k: String,
    /// KV cache type of V (also -ctv; llama.cpp's default f16)
    #[arg(long = "cache-type-v", value_name = "TYPE", default_value = "f16", value_parser = ["f32", "f16", "q8_0"])]
    pub cache_type_v: String,
    /// Flash attention, as llama.cpp's -fa (also -fa): auto is on for the CPU; off needs an f32 cache
    #[arg(long = "flash-attn", value_name = "WHEN", default_value = "auto", value_parser = ["on", "off", "auto", "1", "0"])]
    pub flash_attn: String,
    /// Read the whole file into memory instead of mapping it
    #[arg(long = "no-mmap")]
    pub no_mmap: bool,
    /// Layers on the GPU (also -ngl): 99 = the whole model on the CUDA backend (run, chat, serve, logits, bench; built with --features cuda), 0 = the CPU
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", value_name = "N", allow_hyphen_values = true)]
    pub n_gpu_layers: Option<String>,
    /// The device to compute on: cpu, cuda or cuda:N (with -ngl 99; alone it means the whole model there)
    #[arg(long = "device", value_name = "DEV")]
    pub device: Option<String>,
    /// Split the model over GPUs of this host by its routed experts (expert parallel: every GPU
    /// holds the trunk and a block of each MoE layer's experts): N (devices 0..N-1) or a list
    /// of ordinals (0,1,2,3; one given twice puts two ranks on one GPU). `xwen plan --gpus N`
    /// shows what each GPU holds
    #[arg(long = "gpus", value_name = "N|LIST", value_parser = gpu_list)]
    pub gpus: Option<GpuList>,
    /// Cap the kernel set
    #[arg(long = "isa", value_name = "ISA", value_parser = ["native", "avx512", "avx2", "neon", "scalar"])]
    pub isa: Option<String>,
    /// The DeltaNet prefill scan: recurrent (llama.cpp's order, default) or chunked
    #[arg(long = "prefill-scan", value_name = "SCAN", value_parser = ["chunked", "recurrent"])]
    pub prefill_scan: Option<String>,
    /// Scalar reference kernels everywhere (slow; for bisecting)
    #[arg(long = "reference-kernels")]
    pub reference_kernels: bool,
    /// Time every op and print a profile at the end
    #[arg(long = "profile")]
    pub profile: bool,
    /// Map the weights in 4 KiB pages (default: 2 MiB pages where the kernel offers them)
    #[arg(long = "no-huge-pages")]
    pub no_huge_pages: bool,
    /// Drop the file from the page cache and read it back in 2 MiB pages
    #[arg(long = "reread-huge-pages")]
    pub reread_huge_pages: bool,
    /// Only errors on stderr (also --log-disable)
    #[arg(short = 'q', long = "quiet", visible_alias = "log-disable")]
    pub quiet: bool,
    /// More detail on stderr: the kernel set, the memory plan, prompt reuse
    #[arg(short = 'v', long = "verbose", conflicts_with = "quiet")]
    pub verbose: bool,
}

impl EngineOpts {
    /// The engine configuration these flags ask for, with notes (unless quiet) for values the
    /// engine adjusts.
    pub fn engine_config(&self) -> Result<EngineConfig> {
        let mut cfg = EngineConfig::default();
        if let Some(t) = self.threads {
            let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            let t = t as usize;
            cfg.threads = if t > cpus {
                self.note(&format!("-t {t}: this machine has {cpus} CPUs; using {cpus} threads"));
                cpus
            } else {
                t
            };
        }
        if let Some(c) = self.ctx_size {
            cfg.max_ctx = c;
        }
        cfg.force_reference = self.reference_kernels;
        cfg.profile = self.profile;
        if self.no_huge_pages {
            cfg.map_pages = xwen_gguf::MapPages::Small;
        }
        cfg.reread_huge_pages = self.reread_huge_pages;
        cfg.ram_budget = self.ram_budget;
        cfg.expert_prefetch = !self.no_prefetch;
        cfg.prefill_wave = self.prefill_wave.map(usize::from);
        if let Some(isa) = &self.isa {
            use xwen_kernels::dispatch::{detected, Isa};
            cfg.max_isa = match isa.as_str() {
                "avx512" => Some(Isa::Avx512),
                "avx2" => Some(Isa::Avx2),
                "neon" => Some(Isa::Neon),
                "scalar" => Some(Isa::Scalar),
                _ => None,
            };
            // a kernel set of the other architecture is no set this CPU has: the cap takes its
            // rank (NEON's is AVX2's), which is worth saying
            let on_x86 = cfg!(any(target_arch = "x86_64", target_arch = "x86"));
            match cfg.max_isa {
                Some(Isa::Neon) if on_x86 => self.note(&format!("warning: --isa neon: an x86 CPU has no NEON kernels; capped as --isa avx2 instead (this CPU: {:?})", detected())),
                Some(Isa::Avx2 | Isa::Avx512) if !on_x86 => self.note(&format!("warning: --isa {isa}: this CPU has no x86 kernels; it runs {:?}", detected())),
                _ => {}
            }
        }
        if let Some(scan) = &self.prefill_scan {
            cfg.chunked_prefill = scan == "chunked";
        }
        let ty = |s: &str| s.parse::<xwen_engine::KvType>().map_err(anyhow::Error::msg);
        cfg.kv_types = (ty(&self.cache_type_k)?, ty(&self.cache_type_v)?);
        if [cfg.kv_types.0, cfg.kv_types.1].contains(&xwen_engine::KvType::Q8_0) {
            self.note("a q8_0 KV cache is not yet bit-identical to llama.cpp's (logits within ~1e-2 on the fixtures; f16 and f32 are)");
        }
        cfg.flash_attn = match self.flash_attn.as_str() {
            "on" | "1" => xwen_engine::FlashAttn::On,
            "off" | "0" => xwen_engine::FlashAttn::Off,
            _ => xwen_engine::FlashAttn::Auto,
        };
        Ok(cfg)
    }

    /// Prompt tokens per forward step: llama.cpp's n_ubatch = min(-b, -ub), default 512.
    pub fn prefill_chunk(&self) -> usize {
        let ub = self.ubatch_size.unwrap_or(512);
        self.batch_size.map_or(ub, |b| b.min(ub))
    }

    pub fn note(&self, text: &str) {
        if !self.quiet {
            eprintln!("xwen: {text}");
        }
    }

    /// The device the model goes to: `--device`, or the one GPU `--gpus` names (`--gpus 1` is
    /// `--device cuda:0`; several GPUs go through `gpu::place`'s split instead).
    pub fn device_arg(&self) -> Option<String> {
        match (&self.device, &self.gpus) {
            (Some(d), _) => Some(d.clone()),
            (None, Some(g)) if g.0.len() == 1 => Some(format!("cuda:{}", g.0[0])),
            _ => None,
        }
    }

    /// For commands the CUDA backend does not run yet: a GPU flag is said to be set aside
    /// (llama.cpp habits pass -ngl 99 everywhere), and the command goes on on the CPU.
    pub fn cpu_only(&self, command: &str) {
        let gpu = self.n_gpu_layers.as_deref().is_some_and(|n| n != "0") || self.device.as_deref().is_some_and(|d| d != "cpu");
        if gpu || self.vram_budget.is_some() || self.gpus.is_some() {
            self.note(&format!("`{command}` computes on the CPU for now (the CUDA backend runs `run`, `chat`, `serve`, `logits`, `bench` and `plan`); -ngl / --device / --gpus / --vram-budget set aside"));
        }
    }

    /// `--vram-budget` where the command computes on the CPU: refused, as it bounds only what
    /// the GPU holds (the CPU's ceiling is --ram-budget).
    pub fn check_vram_budget_on_cpu(&self) -> anyhow::Result<()> {
        if self.vram_budget.is_some() {
            anyhow::bail!("--vram-budget bounds what the GPU holds: give it with -ngl 99 (or --device cuda); on the CPU the ceiling is --ram-budget");
        }
        Ok(())
    }
}

#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Sampling")]
pub struct SamplingOpts {
    /// Temperature; 0 is greedy (default: the model card's, 1.0 thinking / 0.7 not)
    #[arg(long = "temp", visible_alias = "temperature", value_name = "T", allow_negative_numbers = true, value_parser = temperature)]
    pub temp: Option<f32>,
    /// Keep the K most likely tokens; 0 keeps all (default 20)
    #[arg(long = "top-k", value_name = "K", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(0..=100_000_000))]
    pub top_k: Option<u32>,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches P (default 0.95 / 0.8)
    #[arg(long = "top-p", value_name = "P", allow_negative_numbers = true, value_parser = unit_interval)]
    pub top_p: Option<f32>,
    /// Drop tokens below P times the most likely one's probability (default 0)
    #[arg(long = "min-p", value_name = "P", allow_negative_numbers = true, value_parser = unit_interval)]
    pub min_p: Option<f32>,
    /// Divide the logits of recent tokens by this (1 = off)
    #[arg(long = "repeat-penalty", value_name = "X", allow_negative_numbers = true, value_parser = repeat_penalty)]
    pub repeat_penalty: Option<f32>,
    /// Subtract this from the logits of tokens seen recently (0 = off)
    #[arg(long = "presence-penalty", value_name = "X", allow_negative_numbers = true, value_parser = penalty)]
    pub presence_penalty: Option<f32>,
    /// Subtract this times its count from each recent token's logit (0 = off)
    #[arg(long = "frequency-penalty", value_name = "X", allow_negative_numbers = true, value_parser = penalty)]
    pub frequency_penalty: Option<f32>,
    /// How many recent tokens the penalties see (0 = off, -1 = the whole context; default 64)
    #[arg(long = "repeat-last-n", value_name = "N", allow_negative_numbers = true, value_parser = last_n)]
    pub repeat_last_n: Option<usize>,
    /// Seed of the sampler (-1 or none: a random one, printed so a run can be repeated)
    #[arg(short = 's', long = "seed", value_name = "N", allow_negative_numbers = true, value_parser = seed)]
    pub seed: Option<u64>,
}

impl SamplingOpts {
    /// The sampler configuration, with a seed always set: the one given, or a fresh random one
    /// (returned as well, so it can be printed).
    pub fn sampler_config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k.map(|k| k as usize),
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            logit_bias: Vec::new(),
            seed: Some(self.seed.unwrap_or_else(random_seed)),
        }
    }
}

/// A seed no two runs share: the clock's nanoseconds mixed with the process id.
pub fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ ((std::process::id() as u64) << 32);
    // SplitMix64's finalizer, so close clocks give unrelated seeds
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    // llama.cpp prints seeds as 32-bit numbers; keep ours short enough to retype
    (x ^ (x >> 31)) & 0xffff_ffff
}

/// A byte count: `auto` or 0 (the engine picks), a number with an optional binary unit
/// (K, M, G, T; `GiB` and `GB` read the same), e.g. `12G`, `1.5G`, `800M`, `4096`.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("auto") {
        return Ok(0);
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches('B').trim_end_matches('I') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        u => anyhow::bail!("unknown unit `{u}`"),
    };
    let v: f64 = num.parse().map_err(|_| anyhow::anyhow!("`{num}` is not a number"))?;
    let bytes = v * (1u64 << shift) as f64;
    anyhow::ensure!(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64, "out of range");
    Ok(bytes as u64)
}

// ---- value parsers (each error names the allowed range; clap adds the flag) ---------------

fn float(s: &str) -> Result<f32, String> {
    let v: f32 = s.trim().parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !v.is_finite() {
        return Err(format!("`{s}` is not a finite number"));
    }
    Ok(v)
}

fn temperature(s: &str) -> Result<f32, String> {
    let v = float(s)?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{v} is outside the allowed range 0..=100 (0 is greedy)"));
    }
    Ok(v)
}

/// `--draft`: none, ngram, model, mtp, model:FILE / mtp:FILE (the file as `-md` takes it),
/// dflash:FILE (a DFlash sidecar GGUF), or
/// replay:FILE (token ids of a known continuation), or contrary (every draft wrong).
pub fn draft_kind(s: &str) -> Result<String, String> {
    let (kind, file) = match s.split_once(':') {
        Some((k, f)) => (k, Some(f)),
        None => (s, None),
    };
    match (kind, file) {
        ("none" | "ngram" | "contrary", None) | ("model" | "mtp", None) => Ok(s.to_string()),
        ("model" | "mtp" | "replay" | "dflash", Some(f)) if !f.is_empty() => Ok(s.to_string()),
        ("model" | "mtp" | "replay" | "dflash", Some(_)) => Err(format!("`{s}`: give the file after the colon ({kind}:FILE)")),
        ("dflash", None) => Err("`dflash` needs its sidecar GGUF: dflash:FILE".into()),
        ("replay", None) => Err("`replay` needs the continuation's token ids: replay:FILE (`xwen run --print-ids` writes them)".into()),
        ("none" | "ngram" | "contrary", Some(_)) => Err(format!("`{s}`: {kind} takes no file")),
        _ => Err(format!("unknown drafter `{s}` (none, ngram, model:FILE, mtp, mtp:FILE, dflash:FILE, replay:FILE, contrary)")),
    }
}

pub fn unit_interval(s: &str) -> Result<f32, String> {
    let v = float(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{v} is outside the allowed range 0..=1"));
    }
    Ok(v)
}

fn repeat_penalty(s: &str) -> Result<f32, String> {
    let v = float(s)?;
    if !(v > 0.0 && v <= 100.0) {
        return Err(format!("{v} is outside the allowed range (0, 100] (1 is off)"));
    }
    Ok(v)
}

fn penalty(s: &str) -> Result<f32, String> {
    let v = float(s)?;
    if !(-100.0..=100.0).contains(&v) {
        return Err(format!("{v} is outside the allowed range -100..=100 (0 is off)"));
    }
    Ok(v)
}

fn last_n(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(MAX_CTX),
        Ok(n) if (0..=MAX_CTX as i64).contains(&n) => Ok(n as usize),
        _ => Err(format!("`{s}` is outside the allowed range -1..={MAX_CTX} (-1 is the whole context)")),
    }
}

fn seed(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i128>() {
        Ok(-1) => Ok(random_seed()),
        Ok(n) if (0..=u64::MAX as i128).contains(&n) => Ok(n as u64),
        _ => Err(format!("`{s}` is outside the allowed range -1..={} (-1 is random)", u64::MAX)),
    }
}

/// `-n`: a count of tokens or -1 (no limit but the context).
pub fn n_predict(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if (-1..=MAX_CTX as i64).contains(&n) => Ok(n),
        _ => Err(format!("`{s}` is outside the allowed range -1..={MAX_CTX} (-1: until end of text or a full context)")),
    }
}

/// `-n` resolved: `None` for no limit.
pub fn token_limit(n: i64) -> Option<usize> {
    usize::try_from(n).ok()
}

fn ctx_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n <= MAX_CTX as u64 => Ok(n as usize),
        _ => Err(format!("`{s}` is outside the allowed range 0..={MAX_CTX} (0: the model's trained context)")),
    }
}

fn batch(s: &str) -> Result<usize, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if (1..=MAX_CTX as u64).contains(&n) => Ok(n as usize),
        _ => Err(format!("`{s}` is outside the allowed range 1..={MAX_CTX}")),
    }
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| format!("`{s}` is not a size (e.g. 12G, 800M, auto): {e}"))
}

/// `--ram-budget`: a size or `auto` (kept as 0); a size of 0 bytes is refused rather than
/// read as `auto`.
fn ram_budget(s: &str) -> Result<u64, String> {
    match size(s)? {
        0 if !s.trim().eq_ignore_ascii_case("auto") => Err(format!("`{s}` is no budget: give a size (e.g. 12G, 800M) or auto")),
        n => Ok(n),
    }
}

/// The GPUs `--gpus` names, one rank each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuList(pub Vec<usize>);

/// `--gpus N` (devices 0..N-1) or `--gpus 0,2,3`.
fn gpu_list(s: &str) -> Result<GpuList, String> {
    let list: Vec<usize> = if s.contains(',') {
        s.split(',').map(|d| d.trim().parse::<usize>().map_err(|_| format!("`{d}` in `{s}` is no device number"))).collect::<Result<_, _>>()?
    } else {
        match s.trim().parse::<usize>() {
            Ok(n) if n >= 1 => (0..n).collect(),
            _ => return Err(format!("`{s}`: give a GPU count (1 or more) or a list of device numbers (0,1)")),
        }
    };
    if list.len() > 64 || list.iter().any(|&d| d > 255) {
        return Err(format!("`{s}`: at most 64 ranks, device numbers below 256"));
    }
    Ok(GpuList(list))
}

/// `--vram-budget`: a size of more than 0 bytes.
fn vram_budget(s: &str) -> Result<u64, String> {
    match size(s)? {
        0 => Err(format!("`{s}` is no budget: give a size (e.g. 12G, 800M)")),
        n => Ok(n),
    }
}

/// llama.cpp's `string_process_escapes`: `\n \r \t \' \" \\` and `\xHH` become the character
/// (or byte) they name; any other backslash stays as written. Bytes that `\xHH` makes and that
/// are not UTF-8 become U+FFFD, as a prompt file's do.
pub fn process_escapes(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'\'' | b'"' | b'\\' => out.push(c),
            b'x' if i + 2 <= b.len() && b[i..i + 2].iter().all(u8::is_ascii_hexdigit) => {
                let hex = std::str::from_utf8(&b[i..i + 2]).unwrap_or("0");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                i += 2;
            }
            _ => out.extend_from_slice(&[b'\\', c]),
        }
    }
    llama_lossy_utf8(&out)
}

/// UTF-8 decoding as llama.cpp's `unicode_cpts_from_utf8` does it: a byte that does not start
/// a well-formed character becomes one U+FFFD and decoding resumes at the next byte.
pub fn llama_lossy_utf8(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                break;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                out.push(char::REPLACEMENT_CHARACTER);
                rest = &bad[1..];
            }
        }
    }
    out
}

/// `-e` / `--no-escape` (llama.cpp's): escapes in the text flags are processed unless
/// `--no-escape` is given.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EscapeOpts {
    /// Process escapes (\n, \r, \t, \', \", \\, \xHH) in -p, --stop and --system (the default)
    #[arg(short = 'e', long = "escape", overrides_with = "no_escape")]
    pub escape: bool,
    /// Take -p, --stop and --system literally, backslashes and all
    #[arg(long = "no-escape", overrides_with = "escape")]
    pub no_escape: bool,
}

impl EscapeOpts {
    pub fn apply(&self, s: &str) -> String {
        if self.no_escape {
            s.to_string()
        } else {
            process_escapes(s)
        }
    }
}

/// `--out` of a command that writes a file by replacing it (a temporary file renamed over the
/// path): only a new path or a regular file. Replacing a device, a FIFO, a symbolic link or a
/// directory entry would destroy it (as root, `--out /dev/null` would replace the device).
pub fn refuse_non_regular_out(path: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() => {
            let what = if m.file_type().is_symlink() {
                "a symbolic link"
            } else if m.is_dir() {
                "a directory"
            } else {
                "not a regular file (a device, FIFO or socket)"
            };
            anyhow::bail!("--out {}: {what}; give the path of a regular file to write", path.display())
        }
        _ => Ok(()),
    }
}

/// The bytes of an input file, `-` being standard input.
pub fn read_input(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    use std::io::Read;
    if path.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::stdin().lock().read_to_end(&mut v).context("reading standard input")?;
        Ok(v)
    } else {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    }
}

pub fn nonzero_size(s: &str) -> Result<u64, String> {
    match size(s)? {
        0 => Err("must be above 0".into()),
        n => Ok(n),
    }
}

/// A comma-separated list of numbers, one flag value (`-p 128,512`).
#[derive(Clone, Debug, PartialEq)]
pub struct List(pub Vec<usize>);

/// A comma-separated list of counts (`512,1024`), each 0..=MAX_CTX.
pub fn count_list(s: &str) -> Result<List, String> {
    s.split(',')
        .map(|x| match x.trim().parse::<u64>() {
            Ok(n) if n <= MAX_CTX as u64 => Ok(n as usize),
            _ => Err(format!("`{x}` is outside the allowed range 0..={MAX_CTX}")),
        })
        .collect::<Result<_, _>>()
        .map(List)
}

/// A comma-separated list of percentages, each 0..=100.
pub fn percent_list(s: &str) -> Result<List, String> {
    s.split(',')
        .map(|x| match x.trim().parse::<u64>() {
            Ok(n) if n <= 100 => Ok(n as usize),
            _ => Err(format!("`{x}` is outside the allowed range 0..=100 (percent)")),
        })
        .collect::<Result<_, _>>()
        .map(List)
}

/// A comma-separated list of sequence counts, each 1..=256.
pub fn parallel_list(s: &str) -> Result<List, String> {
    bounded_count_list(s, "a count of sequences")
}

/// A comma-separated list of verify depths (tokens drafted), each 1..=256.
pub fn depth_list(s: &str) -> Result<List, String> {
    bounded_count_list(s, "a verify depth (tokens drafted)")
}

fn bounded_count_list(s: &str, what: &str) -> Result<List, String> {
    s.split(',')
        .map(|x| match x.trim().parse::<u64>() {
            Ok(n) if (1..=256).contains(&n) => Ok(n as usize),
            _ => Err(format!("`{x}` is not {what} in the allowed range 1..=256")),
        })
        .collect::<Result<_, _>>()
        .map(List)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_bytes_become_one_replacement_each() {
        assert_eq!(llama_lossy_utf8(b"a\xE4\xB8b"), "a\u{FFFD}\u{FFFD}b");
        assert_eq!(llama_lossy_utf8("é😀".as_bytes()), "é😀");
        assert_eq!(llama_lossy_utf8(b"\xF0\x9F\x98A"), "\u{FFFD}\u{FFFD}\u{FFFD}A");
        assert_eq!(llama_lossy_utf8(b""), "");
    }

    #[test]
    fn escapes_are_llama_cpps() {
        assert_eq!(process_escapes(r#"a\nb\tc\r\\d\'e\"f"#), "a\nb\tc\r\\d'e\"f");
        assert_eq!(process_escapes(r"\x41\x7e"), "A~");
        // what is not an escape stays as written: unknown letters, a short \x, a last backslash
        assert_eq!(process_escapes(r#"\q \x4 \xZZ end\"#), r#"\q \x4 \xZZ end\"#);
        // a byte that is no UTF-8 on its own becomes U+FFFD, as in a prompt file
        assert_eq!(process_escapes(r"\xff"), "\u{FFFD}");
        assert_eq!(process_escapes("é\\n"), "é\n");
        assert_eq!(ram_budget("auto"), Ok(0));
        assert!(ram_budget("0").is_err() && ram_budget("0M").is_err() && ram_budget("8G").is_ok());
    }

    #[test]
    fn ranges_are_checked() {
        assert!(temperature("-1").is_err() && temperature("nan").is_err() && temperature("0.7").is_ok());
        assert!(unit_interval("2").is_err() && unit_interval("1").is_ok() && unit_interval("0").is_ok());
        assert!(repeat_penalty("0").is_err() && repeat_penalty("1.1").is_ok());
        assert_eq!(n_predict("-1"), Ok(-1));
        assert!(n_predict("-2").is_err() && n_predict("4611686018427387904").is_err());
        assert!(ctx_size("4611686018427387904").is_err());
        assert_eq!(ctx_size("0"), Ok(0));
        assert_eq!(last_n("-1"), Ok(MAX_CTX));
        assert!(seed("-2").is_err());
        assert_eq!(seed("42"), Ok(42));
        assert_eq!(count_list("0,512"), Ok(List(vec![0, 512])));
        assert!(parallel_list("0").is_err() && parallel_list("1,x").is_err());
        assert!(depth_list("257").unwrap_err().contains("verify depth"));
        assert_eq!(depth_list("1, 8").unwrap().0, vec![1, 8]);
        assert_eq!(token_limit(-1), None);
        assert_eq!(token_limit(5), Some(5));
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("auto").unwrap(), 0);
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("800M").unwrap(), 800 << 20);
        assert_eq!(parse_size("12G").unwrap(), 12 << 30);
        assert_eq!(parse_size("12GiB").unwrap(), 12 << 30);
        assert_eq!(parse_size("12 gb").unwrap(), 12 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
        for bad in ["", "G", "12X", "-1G", "1.2.3M", "lots"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn random_seeds_differ_and_stay_retypeable() {
        let a = random_seed();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = random_seed();
        assert_ne!(a, b);
        assert!(a <= u32::MAX as u64 && b <= u32::MAX as u64);
    }
}
