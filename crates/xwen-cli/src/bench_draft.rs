//! `xwen bench --draft KIND`: what a drafter buys. Each repetition decodes `-n` tokens greedily
//! after the same prompt twice — plainly, then with the drafter (the path `xwen run --draft`
//! takes) — and the two continuations must be the same tokens: a drafted run that differs is
//! an error, not a figure. Reported per test: both decode rates (medians of -r), the speedup,
//! acceptance, tokens per verify step and the drafted / accepted counts per draft position.
//! The prompt is `--draft-file` / `--draft-prompt` (acceptance depends on the text: an edit or
//! retrieval prompt is what n-gram drafting is for), else `-p` random tokens as llama-bench's.
//! One warm-up pair runs first unless --no-warmup; the drafter is kept across repetitions, as a
//! server slot keeps its drafter across requests.

use crate::stats::median;
use crate::lcg::Lcg;
use anyhow::{bail, Result};
use serde_json::json;
use std::io::Write;
use xwen_engine::{generate_speculative, Drafter, GenerateRequest, Model, NgramDrafter, Sampler, SamplerConfig, SpecStats};

pub struct Config {
    pub prompt: Vec<u32>,
    /// What the prompt is, for the table: "random 128" or the file / text given.
    pub prompt_desc: String,
    pub n_gen: usize,
    pub reps: usize,
    pub warmup: bool,
    pub max_draft: usize,
    pub json: bool,
    /// Prompt tokens per forward step (-ub)
    pub prefill_chunk: usize,
    pub model_filename: String,
}

/// One greedy decode of `n_gen` tokens after `prompt`; (tokens, decode seconds, drafting's counts).
fn decode(model: &Model, prompt: &[u32], chunk: usize, n_gen: usize, drafter: &mut dyn Drafter, max_draft: usize) -> Result<(Vec<u32>, f64, SpecStats)> {
    let mut state = model.new_state();
    let mut sampler = Sampler::new(SamplerConfig::greedy().resolve(false));
    let req = GenerateRequest { prompt, max_tokens: Some(n_gen), stop_ids: &[], prefill_chunk: chunk };
    let mut out = Vec::with_capacity(n_gen);
    let (stats, spec) = generate_speculative(model, &mut state, &req, drafter, max_draft, &mut sampler, &mut |_, _| true, &mut |t| {
        out.push(t);
        true
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((out, stats.decode_secs, spec))
}

pub fn run(model: &Model, drafter: &mut dyn Drafter, kind: &str, c: &Config) -> Result<()> {
    if c.n_gen < 2 {
        bail!("--draft: decode at least 2 tokens (-n), or no step drafts anything");
    }
    let max_ctx = model.max_context();
    if c.prompt.len() + c.n_gen > max_ctx {
        bail!("--draft: the prompt ({} tokens) and -n {} do not fit the context of {max_ctx} positions: raise -c", c.prompt.len(), c.n_gen);
    }
    let mut plain = NgramDrafter::default();
    if c.warmup {
        decode(model, &c.prompt, c.prefill_chunk, c.n_gen.min(16), &mut plain, 0)?;
        decode(model, &c.prompt, c.prefill_chunk, c.n_gen.min(16), drafter, c.max_draft)?;
    }
    let (mut plain_s, mut draft_s) = (Vec::new(), Vec::new());
    let mut total = SpecStats { active: true, ..Default::default() };
    let mut generated = 0;
    for rep in 0..c.reps {
        let (want, s0, _) = decode(model, &c.prompt, c.prefill_chunk, c.n_gen, &mut plain, 0)?;
        let (got, s1, spec) = decode(model, &c.prompt, c.prefill_chunk, c.n_gen, drafter, c.max_draft)?;
        if let Some(i) = want.iter().zip(&got).position(|(a, b)| a != b).or((want.len() != got.len()).then(|| want.len().min(got.len()))) {
            bail!("--draft {kind}: repetition {rep} parted from plain greedy decoding at generated token {i} — a bug; please report it with the model and prompt");
        }
        plain_s.push(s0);
        draft_s.push(s1);
        generated += got.len();
        total.add(&spec);
    }
    // decode rates exclude the first token (it comes from the prefill's logits)
    let rate = |s: &[f64]| (c.n_gen - 1) as f64 / median(s).max(1e-12);
    let (plain_ts, draft_ts) = (rate(&plain_s), rate(&draft_s));
    let tokens_per_step = (generated - c.reps) as f64 / total.steps.max(1) as f64;
    let mut out = std::io::stdout().lock();
    // a drafted step's verify and proposal, and a step without drafts (µs, mean)
    let (drafted_us, plain_us) = total.step_micros();
    let r = if c.json {
        let v = json!({
            "engine": "xwen",
            "model_filename": c.model_filename,
            "n_threads": model.threads(),
            "n_prompt": c.prompt.len(),
            "prompt": c.prompt_desc,
            "n_gen": c.n_gen,
            "repetitions": c.reps,
            "draft": kind,
            "draft_max": c.max_draft,
            "plain_samples_s": plain_s,
            "draft_samples_s": draft_s,
            "plain_median_ts": plain_ts,
            "draft_median_ts": draft_ts,
            "speedup": draft_ts / plain_ts,
            "identical": true,
            "steps": total.steps,
            "drafted": total.drafted(),
            "accepted": total.accepted(),
            "acceptance": total.acceptance(),
            "tokens_per_step": tokens_per_step,
            "drafted_per_pos": total.tally.drafted_at,
            "accepted_per_pos": total.tally.accepted_at,
            "verify_us": drafted_us.map(|(v, _)| v),
            "drafting_us": drafted_us.map(|(_, d)| d),
            "plain_step_us": plain_us,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)
    } else {
        let per_pos: Vec<String> = total
            .tally
            .drafted_at
            .iter()
            .zip(&total.tally.accepted_at)
            .map(|(&d, &a)| format!("{:.0}%", 100.0 * a as f64 / d.max(1) as f64))
            .collect();
        writeln!(out, "| drafter | prompt | test | plain t/s | drafted t/s | speedup | accepted | tokens/step | by position |")
            .and_then(|_| writeln!(out, "|---|---|---|--:|--:|--:|--:|--:|---|"))
            .and_then(|_| {
                writeln!(
                    out,
                    "| {kind} (max {}) | {} | tg{} | {plain_ts:.2} | {draft_ts:.2} | {:.2}× | {} / {} ({:.0}%) | {tokens_per_step:.2} | {} |",
                    c.max_draft,
                    c.prompt_desc,
                    c.n_gen,
                    draft_ts / plain_ts,
                    total.accepted(),
                    total.drafted(),
                    100.0 * total.acceptance(),
                    per_pos.join(" ")
                )
            })
            .and_then(|_| match drafted_us {
                Some((v, d)) => writeln!(
                    out,
                    "\na drafted step {:.0} µs on average (verify {v:.0}, drafting {d:.0}){}",
                    v + d,
                    plain_us.map_or(String::new(), |p| format!("; a step without drafts {p:.0} µs"))
                ),
                None => Ok(()),
            })
            .and_then(|_| writeln!(out, "\nt/s: median over {} repetitions of greedy decoding, plain and drafted alternately; the drafted tokens equal the plain ones in every repetition", c.reps))
    };
    match r {
        // a reader that stops early (`| head`) is not an error worth reporting
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// The test's prompt: a file's or the text's tokens, else `n` random tokens.
pub fn prompt(tok: &xwen_chat::Tokenizer, file: Option<&str>, text: Option<&str>, n: usize, n_vocab: usize) -> Result<(Vec<u32>, String)> {
    use anyhow::Context;
    let (ids, desc) = match (file, text) {
        (Some(f), _) => {
            let bytes = std::fs::read(f).with_context(|| format!("--draft-file {f}"))?;
            (tok.encode(&crate::opts::llama_lossy_utf8(&bytes)), f.rsplit('/').next().unwrap_or(f).to_string())
        }
        (None, Some(t)) => (tok.encode(t), format!("{:?}", t.chars().take(24).collect::<String>())),
        (None, None) => {
            let mut rng = Lcg(3);
            ((0..n.max(1)).map(|_| rng.below(n_vocab as u32)).collect(), format!("random {}", n.max(1)))
        }
    };
    if ids.is_empty() {
        bail!("--draft: the prompt tokenizes to nothing");
    }
    Ok((ids, desc))
}
