//! `xwen bench --parallel 1,2,4,8`: batched decode with llama-batched-bench's meaning
//! (tools/batched-bench/batched-bench.cpp, b11434), so the two run side by side
//! (scripts/bench-batched-vs-llamacpp). For each (pp, tg, pl): pl sequences, each from an empty
//! state, prefill pp tokens (together: the scheduler's steps of at most 2048 rows — llama's
//! n_batch — or the RAM plan's rows, whole 512-token chunks per sequence), then decode tg tokens
//! together, one row per sequence per step, greedy — all through the library's `Engine`, what
//! a server runs. Reported as llama-batched-bench does (PP, TG, B, N_KV, T_PP, S_PP,
//! T_TG, S_TG, T, S) plus the decode rate per sequence; `--json` prints its jsonl fields.

use crate::lcg::Lcg;
use crate::stats::median;
use anyhow::Result;
use serde_json::json;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;
use xwen_engine::{Engine, EngineOptions, EngineRequest, Model, Output, SamplerConfig};

/// llama-batched-bench's default logical batch (-b 2048).
const N_BATCH: usize = 2048;

pub struct Config {
    pub prompts: Vec<usize>,
    pub gens: Vec<usize>,
    pub parallel: Vec<usize>,
    pub reps: usize,
    pub json: bool,
    pub warmup: bool,
}

struct Run {
    t_pp: f64,
    t_tg: f64,
}

/// One configuration through the library's engine (continuous batching, as a server runs it):
/// pl one-shot requests of pp prompt tokens and tg + 1 greedy tokens each — the first comes out
/// of the prefill, as in llama-batched-bench, then tg batched decode steps. The sequences'
/// states are allocated (admitted) before the clock starts, as llama-batched-bench allocates
/// its context first. T_PP ends with the step in which the last sequence got its first token.
fn one_run(model: &Arc<Model>, pp: usize, tg: usize, pl: usize, toks: &mut Lcg) -> Result<Run> {
    let mut engine = Engine::new(model.clone(), EngineOptions { parallel: pl, draft: None, prefix: None });
    let greedy = SamplerConfig::greedy().resolve(false);
    for _ in 0..pl {
        let prompt: Vec<u32> = (0..pp).map(|_| toks.below(model.n_vocab() as u32)).collect();
        engine.submit(EngineRequest { one_shot: true, ..EngineRequest::new(prompt, tg + 1, Vec::new(), greedy.clone()) });
    }
    let admitted = engine.admit();
    let t0 = Instant::now();
    let mut started = std::collections::HashSet::new();
    let mut t_pp = None;
    for (_, out) in admitted {
        check(out)?;
    }
    while engine.has_work() {
        for (id, out) in engine.step() {
            if matches!(out, Output::Token { .. }) {
                started.insert(id);
            }
            check(out)?;
        }
        if t_pp.is_none() && started.len() == pl {
            t_pp = Some(t0.elapsed().as_secs_f64());
        }
    }
    let total = t0.elapsed().as_secs_f64();
    let t_pp = t_pp.unwrap_or(total);
    Ok(Run { t_pp, t_tg: total - t_pp })
}

/// A request that failed (an expert read, a refused admission) fails the bench.
fn check(out: Output) -> Result<()> {
    match out {
        Output::Failed(error) => Err(anyhow::anyhow!("{error}")),
        Output::Shutdown => Err(anyhow::anyhow!("the engine shut down")),
        _ => Ok(()),
    }
}

pub fn run(model: &Arc<Model>, c: &Config) -> Result<()> {
    let mut toks = Lcg(7);
    let max_ctx = model.max_context();
    let mut out = std::io::stdout().lock();
    let mut emit = |line: String| -> Result<()> {
        match writeln!(out, "{line}") {
            // a reader that stops early (`| head`) ends the bench, not with a panic
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            r => Ok(r?),
        }
    };
    if c.prompts.contains(&0) {
        anyhow::bail!("--parallel needs -p of at least 1: every sequence starts from a prompt");
    }
    if c.warmup {
        // llama-batched-bench decodes one warm-up batch first
        one_run(model, 1, 1, 1, &mut toks)?;
    }
    if !c.json {
        emit(format!(
            "|{:>6} | {:>6} | {:>4} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} | {:>10} | {:>8} | {:>8} |",
            "PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "S_TG/seq", "T s", "S t/s"
        ))?;
        emit(format!("|{}|", ["-------", "--------", "------", "--------", "----------", "----------", "----------", "----------", "------------", "----------", "----------"].join("|")))?;
    }
    for &pp in &c.prompts {
        for &tg in &c.gens {
            for &pl in &c.parallel {
                if pp + tg > max_ctx {
                    anyhow::bail!("pp {pp} + tg {tg} exceeds the context of {max_ctx} positions per sequence (-c)");
                }
                if c.warmup && model.device().is_some() {
                    // a device captures a decode step for each batch size at its first use: the
                    // configuration's sizes once, untimed, as a server that has run a while has them
                    one_run(model, pp.min(8), tg.min(4), pl, &mut toks)?;
                }
                let runs: Vec<Run> = (0..c.reps).map(|_| one_run(model, pp, tg, pl, &mut toks)).collect::<Result<_>>()?;
                let t_pp = median(&runs.iter().map(|r| r.t_pp).collect::<Vec<_>>());
                let t_tg = median(&runs.iter().map(|r| r.t_tg).collect::<Vec<_>>());
                let t = t_pp + t_tg;
                let n_kv = pl * (pp + tg);
                let rate = |n: usize, t: f64| if t > 0.0 { n as f64 / t } else { 0.0 };
                let (speed_pp, speed_tg, speed) = (rate(pl * pp, t_pp), rate(pl * tg, t_tg), rate(n_kv, t));
                if c.json {
                    emit(
                        json!({
                            "engine": "xwen", "n_kv_max": max_ctx * pl, "n_batch": N_BATCH.min(model.max_batch_rows()),
                            "n_threads": model.threads(), "is_pp_shared": 0, "pp": pp, "tg": tg, "pl": pl, "n_kv": n_kv,
                            "t_pp": t_pp, "speed_pp": speed_pp, "t_tg": t_tg, "speed_tg": speed_tg,
                            "speed_tg_per_seq": speed_tg / pl as f64, "t": t, "speed": speed, "repetitions": c.reps,
                        })
                        .to_string(),
                    )?;
                } else {
                    emit(format!(
                        "|{pp:>6} | {tg:>6} | {pl:>4} | {n_kv:>6} | {t_pp:>8.3} | {speed_pp:>8.2} | {t_tg:>8.3} | {speed_tg:>8.2} | {:>10.2} | {t:>8.3} | {speed:>8.2} |",
                        speed_tg / pl as f64
                    ))?;
                }
            }
        }
    }
    Ok(())
}
