//! `-ngl` / `--device`: which backend a command computes on, and the GPU paths of `bench` and
//! `run` (the CUDA backend, crate xwen-cuda, built with `--features cuda`).

use anyhow::{bail, Result};

/// Where a command computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Cpu,
    /// The whole model on CUDA device N.
    Cuda(usize),
}

/// `-ngl N` and `--device cuda:N` to a placement: 0 (or none) is the CPU; every layer on the
/// GPU is `-ngl 99` or any N ≥ the layer count (llama.cpp's meaning); a partial split is
/// refused until it exists.
pub fn placement(ngl: Option<&str>, device: Option<&str>, n_layer: usize) -> Result<Placement> {
    let ordinal = match device {
        None => 0,
        Some("cpu") => return Ok(Placement::Cpu),
        Some(d) => match d.strip_prefix("cuda:").or_else(|| (d == "cuda").then_some("0")).map(str::parse::<usize>) {
            Some(Ok(n)) => n,
            _ => bail!("--device {d}: give cpu, cuda or cuda:N"),
        },
    };
    let layers = match ngl {
        None if device.is_some() => return Ok(Placement::Cuda(ordinal)),
        None => return Ok(Placement::Cpu),
        Some("all") | Some("auto") => usize::MAX,
        Some(s) => match s.parse::<i64>() {
            Ok(n) if n < 0 => usize::MAX,
            Ok(n) => n as usize,
            Err(_) => bail!("-ngl {s}: give a layer count (99 = all)"),
        },
    };
    if layers == 0 {
        return Ok(Placement::Cpu);
    }
    if layers < n_layer + 1 && layers != usize::MAX && layers < 99 {
        bail!("-ngl {layers}: a split of the model's {} layers between the GPU and the CPU is not supported yet; -ngl 99 puts every layer on the GPU, -ngl 0 none", n_layer + 1);
    }
    Ok(Placement::Cuda(ordinal))
}

/// Puts `model`'s passes where `-ngl` / `--device` say: on a CUDA device (the whole model,
/// loaded there now, within `--vram-budget`), or left on the CPU. Every command that runs the
/// library's `Engine` (run, chat, serve) computes on the device from then on.
pub fn place(opts: &crate::opts::EngineOpts, model: &mut xwen_engine::Model) -> Result<Placement> {
    if let Some(list) = opts.gpus.as_ref().filter(|l| l.0.len() > 1) {
        return place_group(opts, model, &list.0);
    }
    let placement = placement(opts.n_gpu_layers.as_deref(), opts.device_arg().as_deref(), crate::model_arg::n_layer(model))?;
    let Placement::Cuda(ordinal) = placement else {
        opts.check_vram_budget_on_cpu()?;
        return Ok(placement);
    };
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, model);
        Err(not_built())
    }
    #[cfg(feature = "cuda")]
    {
        let t0 = std::time::Instant::now();
        let cuda = cuda_options(opts, model, ordinal);
        let on = xwen_cuda::attach(model, &cuda).map_err(|e| anyhow::anyhow!("{e}"))?;
        opts.note(&format!("on {on} in {:.2} s", t0.elapsed().as_secs_f64()));
        Ok(placement)
    }
}

/// `--gpus` with several ranks: the model split over those GPUs by its routed experts, each
/// rank on its own (`xwen_cuda::attach_group`), the engine driving them as one device.
fn place_group(opts: &crate::opts::EngineOpts, model: &mut xwen_engine::Model, devices: &[usize]) -> Result<Placement> {
    if matches!(opts.device.as_deref(), Some("cpu")) || opts.n_gpu_layers.as_deref().is_some_and(|n| n.trim() == "0") {
        bail!("--gpus {} splits the model over GPUs: drop -ngl 0 / --device cpu", devices.len());
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = model;
        Err(not_built())
    }
    #[cfg(feature = "cuda")]
    {
        let t0 = std::time::Instant::now();
        let cuda = cuda_options(opts, model, devices[0]);
        let on = xwen_cuda::attach_group(model, &cuda, devices).map_err(|e| anyhow::anyhow!("{e}"))?;
        opts.note(&format!("on {on} in {:.2} s", t0.elapsed().as_secs_f64()));
        Ok(Placement::Cuda(devices[0]))
    }
}

/// The CUDA backend's options for `model` on device `ordinal` as the engine flags set them
/// (a split's ranks take theirs from these too).
#[cfg(feature = "cuda")]
fn cuda_options(opts: &crate::opts::EngineOpts, model: &xwen_engine::Model, ordinal: usize) -> xwen_cuda::CudaOptions {
    xwen_cuda::CudaOptions {
        device: ordinal,
        n_ctx: model.max_context(),
        graph: std::env::var_os("XWEN_CUDA_NO_GRAPH").is_none(),
        ubatch: opts.prefill_chunk(),
        vram_budget: opts.vram_budget,
        n_seq: model.config().n_seq.max(1),
        cpu_experts: opts.threads.map_or_else(xwen_cuda::model::default_cpu_experts, |t| t as usize),
        read_ahead: xwen_cuda::model::default_read_ahead(),
        shard: None,
    }
}

/// What the CUDA backend would hold on the device (`xwen plan -ngl 99`): the bytes, and the
/// device's name and free memory where one is present (else why not).
pub struct VramPlan {
    /// Everything: the model's parts and the MTP head's (`mtp_bytes`).
    pub bytes: u64,
    /// What the MTP head a run would draft with adds (0: none).
    pub mtp_bytes: u64,
    pub device: std::result::Result<(String, u64), String>,
    /// The parts (`xwen_cuda::DevicePlan`), where the backend was built in.
    #[cfg(feature = "cuda")]
    pub parts: xwen_cuda::DevicePlan,
}

/// The VRAM plan of `file` at `n_ctx` positions and prompt passes of `ubatch`, with the MTP
/// head `mtp` a run would draft with (its KV for `n_seq` sequences).
#[cfg(feature = "cuda")]
pub fn vram_plan(file: &xwen_gguf::GgufFile, ordinal: usize, n_ctx: usize, ubatch: usize, mtp: Option<&xwen_engine::models::mtp::MtpHead>, n_seq: usize) -> Result<VramPlan> {
    let opts = xwen_cuda::CudaOptions { device: ordinal, n_ctx, graph: true, ubatch, vram_budget: None, n_seq: 1, cpu_experts: xwen_cuda::model::default_cpu_experts(), read_ahead: xwen_cuda::model::default_read_ahead(), shard: None };
    let parts = xwen_cuda::device_plan(file, &opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mtp_bytes = match mtp {
        Some(h) => xwen_cuda::mtp_plan_bytes(h, file, &xwen_cuda::CudaOptions { n_seq, ..opts }).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => 0,
    };
    let device = xwen_cuda::device_info(ordinal).map(|d| (d.to_string(), d.free_bytes)).map_err(|e| e.to_string());
    Ok(VramPlan { bytes: parts.total() + mtp_bytes, mtp_bytes, device, parts })
}

#[cfg(not(feature = "cuda"))]
pub fn vram_plan(_file: &xwen_gguf::GgufFile, _ordinal: usize, _n_ctx: usize, _ubatch: usize, _mtp: Option<&xwen_engine::models::mtp::MtpHead>, _n_seq: usize) -> Result<VramPlan> {
    Err(not_built())
}

/// What the CUDA backend would hold on a GPU for `file` at `n_ctx` positions (`xwen inspect`):
/// read off the file alone, no device needed; why not where it cannot say.
pub fn vram_estimate(file: &xwen_gguf::GgufFile, n_ctx: usize) -> std::result::Result<u64, String> {
    #[cfg(feature = "cuda")]
    {
        let opts = xwen_cuda::CudaOptions { device: 0, n_ctx, graph: true, ubatch: 512, vram_budget: None, n_seq: 1, cpu_experts: xwen_cuda::model::default_cpu_experts(), read_ahead: xwen_cuda::model::default_read_ahead(), shard: None };
        xwen_cuda::device_bytes_needed(file, &opts).map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (file, n_ctx);
        Err("this xwen was built without the CUDA backend".into())
    }
}

/// The device line of `xwen --version` (only asked for there: opening the driver takes time).
pub fn version_line() -> String {
    #[cfg(feature = "cuda")]
    {
        // prompts take cuBLAS where it opens, xwen's own tensor-core kernel (slower) elsewhere
        let blas = if xwen_cuda::blas::available() { "cuBLAS found" } else { "cuBLAS not found: prompts use xwen's slower GEMM" };
        match xwen_cuda::device_info(0) {
            Ok(d) => format!("cuda: {d}; {blas}"),
            Err(e) => format!("cuda: built in; {e}"),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        "cuda: not built in (cargo build --release --features cuda)".to_string()
    }
}

#[cfg(not(feature = "cuda"))]
pub fn not_built() -> anyhow::Error {
    anyhow::anyhow!("this xwen was built without the CUDA backend: build it with `cargo build --release --features cuda` (no toolkit needed), or run with -ngl 0")
}

#[cfg(feature = "cuda")]
pub use with_cuda::*;

#[cfg(feature = "cuda")]
mod with_cuda {
    use crate::lcg::Lcg;
    use anyhow::{Context, Result};
    use std::time::Instant;
    use xwen_cuda::{CudaModel, CudaOptions};
    use xwen_gguf::GgufFile;

    /// Loads `file` onto CUDA device `ordinal` with room for `n_ctx` positions, prompts in
    /// passes of up to `ubatch` tokens, within `vram_budget` bytes where one is given.
    /// `store`: the engine's streamed expert store (under --ram-budget), the host tier of a
    /// VRAM expert cache.
    pub fn load(file: &GgufFile, ordinal: usize, n_ctx: usize, ubatch: usize, vram_budget: Option<u64>, store: Option<std::sync::Arc<dyn xwen_engine::ExpertStore>>) -> Result<CudaModel> {
        let t0 = Instant::now();
        let m = CudaModel::load_with_store(file, &CudaOptions { device: ordinal, n_ctx, graph: std::env::var_os("XWEN_CUDA_NO_GRAPH").is_none(), ubatch, vram_budget, n_seq: 1, cpu_experts: xwen_cuda::model::default_cpu_experts(), read_ahead: xwen_cuda::model::default_read_ahead(), shard: None }, store)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        eprintln!("xwen: on {} in {:.2} s, {:.0} MiB on the device", m.device(), t0.elapsed().as_secs_f64(), m.device_bytes() as f64 / 1048576.0);
        if let Some(c) = m.expert_cache_stats() {
            eprintln!(
                "xwen: VRAM expert cache: {} of {} experts a layer; {}{}",
                c.slots,
                c.n_expert,
                if c.streamed { "missed experts from the RAM cache --ram-budget bounds (read from disk when it lacks them)" } else { "every routed expert in host RAM" },
                if c.pinned { ", copied up from page-locked memory" } else { " (not page-locked: the driver refused; copies are staged)" }
            );
        }
        Ok(m)
    }

    /// `--profile` on the GPU: each kernel's device time in one decode step and in one prefill
    /// pass of `n_prompt` tokens (each launch timed alone, so the sum exceeds a graph's step).
    pub fn print_profile(m: &mut CudaModel, n_prompt: usize) -> Result<()> {
        let mut rng = Lcg(7);
        let n_vocab = m.n_vocab() as u32;
        let mut runs = vec![("decode step", 1usize)];
        if n_prompt > 1 {
            runs.push(("prefill pass", n_prompt.min(m.ubatch())));
        }
        for (what, n) in runs {
            m.reset().map_err(|e| anyhow::anyhow!("{e}"))?;
            let toks: Vec<u32> = (0..n).map(|_| rng.below(n_vocab)).collect();
            let table = m.profile(&toks).map_err(|e| anyhow::anyhow!("{e}"))?;
            print_table(&format!("{what} of {n} token(s)"), table);
        }
        // decode batches: a server's slots decoding at once, and a verify's size at depth 4
        let max_rows = m.max_decode_rows();
        for b in [5usize, 8, 16].into_iter().filter(|&b| b <= max_rows) {
            let table = m.profile_batch(b).map_err(|e| anyhow::anyhow!("{e}"))?;
            print_table(&format!("decode batch of {b} rows"), table);
        }
        Ok(())
    }

    fn print_table(what: &str, table: Vec<(String, f64, u64)>) {
        let total: f64 = table.iter().map(|r| r.1).sum();
        eprintln!("xwen profile: {what}: {total:.3} ms of kernels");
        for (name, ms, calls) in table {
            eprintln!("  {name:<14} {ms:>9.3} ms {:>5.1}%  {calls:>5} launches", 100.0 * ms / total.max(1e-12));
        }
    }

    /// One llama-bench test on the GPU: ppP prefills P random tokens from an empty sequence,
    /// tgN decodes N one at a time; one warm-up, then `reps` timed runs. Returns each run's ns.
    pub fn bench_test(m: &mut CudaModel, n_prompt: usize, n_gen: usize, reps: usize, warmup: bool) -> Result<Vec<u64>> {
        let mut rng = Lcg(42);
        let n_vocab = m.n_vocab() as u32;
        let mut once = |m: &mut CudaModel| -> Result<u64> {
            m.reset()?;
            let prompt: Vec<u32> = (0..n_prompt).map(|_| rng.below(n_vocab)).collect();
            let t0 = Instant::now();
            m.prefill(&prompt)?;
            let mut tok = rng.below(n_vocab);
            for _ in 0..n_gen {
                m.step(tok)?;
                tok = rng.below(n_vocab);
            }
            Ok(t0.elapsed().as_nanos() as u64)
        };
        if warmup {
            once(m).context("warm-up")?;
        }
        (0..reps).map(|_| once(m)).collect::<Result<Vec<_>>>().map_err(|e| anyhow::anyhow!("{e}"))
    }
}
