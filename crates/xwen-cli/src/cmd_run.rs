//! `xwen run`: complete a prompt (text, a file, or token ids) and stream the continuation, one
//! request to the library's `Engine` (on the CPU, or on the GPU with `-ngl 99`: the same engine, its passes on the device). The prompt runs in forward steps of `-ub` tokens (llama.cpp's n_ubatch), with a progress
//! line when it is long; the run ends with its rates and why it stopped.

use crate::cli::RunArgs;
use crate::draft_arg::draft_line;
use crate::prefill_progress::PrefillProgress;
use crate::{model_arg, opts};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::io::Write;
use xwen_chat::TextStream;
use xwen_engine::{Engine, EngineOptions, EngineRequest, GenStats, Output, Sampler, SpecStats, StopReason};

pub fn run(mut a: RunArgs) -> Result<()> {
    let quiet = a.engine.quiet;
    a.prompt = a.prompt.as_deref().map(|p| a.escape.apply(p));
    a.stop = a.stop.iter().map(|s| a.escape.apply(s)).collect();
    let mut cfg = a.engine.engine_config()?;
    let mut draft = crate::draft_arg::prepare(&a.draft, &mut cfg, 1)?;
    let prompt_file = match &a.file {
        Some(f) => Some(opts::llama_lossy_utf8(&opts::read_input(f.as_ref()).with_context(|| format!("-f {f}"))?)),
        None => None,
    };
    if a.model.is_some() && a.prompt.is_none() && a.file.is_none() && a.ids.is_none() {
        bail!("no prompt: give -p TEXT, -f FILE or --ids 1,2,3");
    }
    if a.model.is_none() && !quiet {
        eprintln!("{}", model_arg::DEMO_NOTE);
    }
    let mut loaded = model_arg::load(a.model.as_deref(), cfg, &a.engine)?;
    draft.attach(&mut loaded.model)?;
    if !quiet {
        eprintln!(
            "xwen: loaded {} ({}) in {:.2}s: {:.1} MiB of weights ({}), {} threads",
            loaded.model.name().unwrap_or("model"),
            loaded.model.architecture(),
            loaded.load_secs,
            loaded.model.weight_bytes() as f64 / (1 << 20) as f64,
            if a.engine.no_mmap { "read into memory" } else { "memory-mapped" },
            loaded.model.threads()
        );
    }
    let tok = &loaded.tokenizer;
    let mut prompt = a.prompt.clone().or(prompt_file);
    if prompt.is_none() && a.ids.is_none() && loaded.is_demo {
        prompt = Some(xwen_embed::DEMO_PROMPT.to_string());
    }
    let prompt_ids = match (&prompt, &a.ids) {
        (_, Some(s)) => model_arg::parse_ids(s)?,
        (Some(p), None) => tok.encode(p),
        (None, None) => bail!("no prompt: give -p TEXT, -f FILE or --ids 1,2,3"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    if let Some(&bad) = prompt_ids.iter().find(|&&t| t as usize >= loaded.model.n_vocab()) {
        bail!("--ids: token {bad} is outside the vocabulary (0..{})", loaded.model.n_vocab());
    }
    let max_ctx = loaded.model.max_context();
    if prompt_ids.len() >= max_ctx {
        bail!("the prompt ({} tokens) does not fit the context of {max_ctx} positions with room to generate: raise -c", prompt_ids.len());
    }
    let mut scfg = a.sampling.sampler_config();
    // The demo is a code model: greedy unless asked otherwise.
    if loaded.is_demo && a.sampling.temp.is_none() {
        scfg.temperature = Some(0.0);
    }
    let params = scfg.resolve(!a.no_think);
    if params.temperature > 0.0 && !quiet {
        eprintln!("xwen: seed {} (--seed {} repeats this run)", params.seed, params.seed);
    }
    let seed = params.seed;
    let sampler = Sampler::new(params);
    let stop_ids = if a.ignore_eos { Vec::new() } else { tok.eos_ids() };
    let eos = tok.eos_ids();
    crate::gpu::place(&a.engine, &mut loaded.model)?;
    draft.place_model(&a.engine, &loaded.model)?;
    let device = loaded.model.device();
    // the drafter first: a refused --draft says so before any text is written
    let drafter = draft.drafter(&loaded.model)?;
    let draft_name: &'static str = drafter.as_ref().map_or("none", |d| d.name());
    let mut out = std::io::stdout().lock();
    let stream_text = !a.print_ids && !a.json;
    if let (true, Some(p)) = (stream_text, &prompt) {
        write!(out, "{p}")?;
        out.flush()?;
    }
    let mut generated = Vec::new();
    let mut text = String::new();
    let mut stream = TextStream::new(a.stop.clone());
    let mut progress = PrefillProgress::new(quiet);
    let mut write_err = None;
    let mut emit = |s: &str, text: &mut String, out: &mut std::io::StdoutLock| {
        text.push_str(s);
        if stream_text && write_err.is_none() {
            if let Err(e) = write!(out, "{s}").and_then(|_| out.flush()) {
                write_err = Some(e);
            }
        }
    };
    // one request to an engine of one slot; it runs the prompt in the -ub chunks the
    // one-sequence loop used, its last token with the rest (nothing continues it)
    let req = EngineRequest {
        prefill_chunk: a.engine.prefill_chunk(),
        progress: true,
        one_shot: true,
        draft: drafter.map(|d| (d, a.draft.draft_max as usize)),
        ..EngineRequest::new(prompt_ids.clone(), opts::token_limit(a.n_predict).unwrap_or(usize::MAX), stop_ids.clone(), sampler.params().clone())
    };
    let mut engine = Engine::new(loaded.model, EngineOptions { parallel: 1, draft: None, prefix: None });
    let id = engine.submit(req);
    let mut end = None;
    // a stop string ends the reply at the token that completes it: later tokens of the same
    // (drafted) step are not the reply's
    let mut cut = false;
    while end.is_none() {
        if !engine.has_work() {
            bail!("the engine dropped the request");
        }
        for (_, o) in engine.step() {
            match o {
                Output::Started { .. } => {}
                Output::Prefill { done, total } => progress.update(done, total),
                Output::Token { id: t, .. } if !cut => {
                    progress.finish();
                    generated.push(t);
                    if eos.contains(&t) && !a.ignore_eos {
                        continue;
                    }
                    let kept = stream.push(tok, t);
                    emit(&kept, &mut text, &mut out);
                    cut = stream.stop().is_some();
                }
                Output::Token { .. } => {}
                Output::Done { stop, stats, .. } => end = Some((if cut { StopReason::Caller } else { stop }, stats)),
                Output::Failed(e) => bail!("{e}"),
                Output::Shutdown => bail!("the engine shut down"),
            }
        }
        if cut && end.is_none() {
            if let Some(Output::Done { stats, .. }) = engine.cancel(id) {
                end = Some((StopReason::Caller, stats));
            }
        }
    }
    let (stop, rstats) = end.expect("the loop ends with an end");
    let stats = GenStats { prompt_tokens: prompt_ids.len(), prefill_secs: rstats.prefill_secs, generated: generated.len(), decode_secs: rstats.decode_secs, stop };
    let spec: SpecStats = rstats.drafts.unwrap_or_default();
    progress.finish();
    let tail = stream.finish();
    emit(&tail, &mut text, &mut out);
    if let Some(e) = write_err {
        return Err(e.into());
    }
    let stop = match stats.stop {
        StopReason::StopToken => "eos",
        StopReason::Length => "length",
        StopReason::ContextFull => "context_full",
        StopReason::Caller if stream.stop().is_some() => "stop_string",
        StopReason::Caller | StopReason::Constraint => "stopped",
    };
    // a drafted step's verify and proposal, and a step without drafts (µs, mean)
    let (drafted_us, plain_us) = spec.step_micros();
    let json_reply = || {
        json!({
            "text": text,
            "ids": generated,
            "prompt_tokens": stats.prompt_tokens,
            "generated_tokens": stats.generated,
            "stop": stop,
            "stop_string": stream.stop(),
            "seed": seed,
            "device": device,
            "draft": spec.active.then(|| json!({
                "kind": draft_name,
                "steps": spec.steps,
                "drafted": spec.drafted(),
                "accepted": spec.accepted(),
                "acceptance": spec.acceptance(),
                "tokens_per_step": crate::draft_arg::tokens_per_step(&spec, stats.generated),
                // per draft position (0: a step's first drafted token), as llama-server's
                // spec_decode_num_{drafted,accepted}_tokens_per_pos_total
                "drafted_per_pos": spec.tally.drafted_at,
                "accepted_per_pos": spec.tally.accepted_at,
                "verify_us": drafted_us.map(|(v, _)| v),
                "drafting_us": drafted_us.map(|(_, d)| d),
                "plain_step_us": plain_us,
            })),
            "timings": {
                "load_s": loaded.load_secs,
                "prefill_s": stats.prefill_secs,
                "prefill_tok_per_s": stats.prefill_tps(),
                "decode_s": stats.decode_secs,
                "decode_tok_per_s": stats.decode_tps(),
            },
        })
    };
    write_reply(&mut out, &a, json_reply, &generated)?;
    if !quiet {
        let why = match stats.stop {
            StopReason::StopToken => "end of text".to_string(),
            StopReason::Length => format!("the token limit (-n {})", a.n_predict),
            StopReason::ContextFull => format!("the end of the context (-c {max_ctx}; recurrent state cannot be shifted: raise -c)"),
            StopReason::Caller if stream.stop().is_some() => format!("the stop string {:?}", stream.stop().unwrap_or_default()),
            StopReason::Caller | StopReason::Constraint => "stopped".into(),
        };
        eprintln!(
            "xwen: prefill {} tok at {}, decode {} tok at {}; stopped at {why}{}",
            stats.prompt_tokens,
            rate_text(stats.prompt_tokens, stats.prefill_tps()),
            stats.generated,
            rate_text(stats.generated.saturating_sub(1), stats.decode_tps()),
            draft_line(draft_name, &spec, stats.generated)
        );
    }
    model_arg::print_profile(engine.model());
    if !quiet {
        model_arg::print_expert_cache(engine.model());
        model_arg::print_row_cache(engine.model());
    }
    Ok(())
}

/// A rate for the status line: `n/a` where it counts no tokens (one generated token is the
/// prefill's, so its decode rate has nothing to divide) rather than a misleading 0.0.
pub fn rate_text(counted: usize, per_s: f64) -> String {
    if counted == 0 || !per_s.is_finite() || per_s <= 0.0 {
        "n/a".into()
    } else {
        format!("{per_s:.1} tok/s")
    }
}

/// The reply's last words on stdout: the JSON record (`--json`), the ids (`--print-ids`), or
/// the newline after the streamed text.
fn write_reply(out: &mut impl Write, a: &RunArgs, json_reply: impl FnOnce() -> serde_json::Value, ids: &[u32]) -> Result<()> {
    if a.json {
        writeln!(out, "{}", json_reply())?;
    } else if a.print_ids {
        let s: Vec<String> = ids.iter().map(|t| t.to_string()).collect();
        writeln!(out, "{}", s.join(" "))?;
    } else {
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_of_nothing_counted_is_not_zero() {
        assert_eq!(rate_text(0, 0.0), "n/a");
        assert_eq!(rate_text(3, 12.345), "12.3 tok/s");
    }
}
