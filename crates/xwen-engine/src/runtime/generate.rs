//! The generate loop: prefill a prompt, then decode token by token until a stop id, the token
//! limit, or the caller says stop. Timing is measured here so every host reports the same
//! prefill / decode rates.

use crate::error::Result;
use crate::model::{LogitsMode, Model};
use crate::runtime::sampler::Sampler;
use crate::state::SeqState;
use std::time::Instant;

#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub prefill_secs: f64,
    pub generated: usize,
    pub decode_secs: f64,
    /// Why generation ended.
    pub stop: StopReason,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopReason {
    #[default]
    Length,
    StopToken,
    Caller,
    /// The sequence reached the context size (`EngineConfig::max_ctx`).
    ContextFull,
    /// A logits processor (a grammar) said the output is complete.
    Constraint,
}

/// The one stop rule every decode loop applies after a sampled token (plain, session,
/// speculative and batched decoding alike): a stop id ends generation first, then the caller or
/// a grammar saying it is done (`ended`), then the token limit. Whether the next step still fits
/// the context is [`fits_context`], asked before the step.
#[derive(Clone, Copy, Debug)]
pub struct StopRule<'a> {
    pub stop_ids: &'a [u32],
    /// Tokens to generate at most.
    pub limit: usize,
}

impl StopRule<'_> {
    /// Why generation ends with `token`, the `generated`-th sampled token, or None to go on.
    pub fn after(&self, token: u32, generated: usize, ended: Option<StopReason>) -> Option<StopReason> {
        if self.stop_ids.contains(&token) {
            Some(StopReason::StopToken)
        } else if ended.is_some() {
            ended
        } else if generated >= self.limit {
            Some(StopReason::Length)
        } else {
            None
        }
    }
}

/// Whether `next` more positions fit a sequence holding `pos` under a context of `max_ctx`
/// (otherwise it ends: [`StopReason::ContextFull`]).
pub fn fits_context(pos: usize, next: usize, max_ctx: usize) -> bool {
    pos + next <= max_ctx
}

impl GenStats {
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_secs)
    }
    pub fn decode_tps(&self) -> f64 {
        // The first token comes out of prefill; decode rate counts the steps after it.
        rate(self.generated.saturating_sub(1), self.decode_secs)
    }
}

/// n per second, 0 where no time passed.
pub(crate) fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

pub struct GenerateRequest<'a> {
    pub prompt: &'a [u32],
    /// Tokens to sample at most; `None`: until a stop id or the context is full.
    pub max_tokens: Option<usize>,
    pub stop_ids: &'a [u32],
    /// Prompt tokens per forward step (llama.cpp's n_ubatch: a long prompt runs in steps of
    /// this many, the last step giving the logits); 0 runs the whole prompt in one step.
    pub prefill_chunk: usize,
}

/// Generate from `state` (which may already hold earlier turns). `on_token` sees every
/// generated id (stop ids included) and returns false to stop.
pub fn generate(
    model: &Model,
    state: &mut SeqState,
    req: &GenerateRequest,
    sampler: &mut Sampler,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<GenStats> {
    generate_observed(model, state, req, sampler, &mut |_, _| true, on_token)
}

/// The prompt in forward steps of `req.prefill_chunk`, timed into `stats.prefill_secs`: the
/// last step's logits, or None when generation ends here — nothing to generate
/// (`max_tokens` 0) or `on_prefill` said stop (`StopReason::Caller`).
pub(crate) fn prefill(
    model: &Model,
    state: &mut SeqState,
    req: &GenerateRequest,
    stats: &mut GenStats,
    on_prefill: &mut dyn FnMut(usize, usize) -> bool,
) -> Result<Option<Vec<f32>>> {
    prefill_observed(model, state, req, stats, on_prefill, None)
}

/// Where a prefill's final hidden rows go: (position of the chunk, its tokens, its rows).
pub(crate) type HiddenSink<'a> = &'a mut dyn FnMut(usize, &[u32], &[f32]) -> Result<()>;

/// `prefill`, each step's final hidden rows handed to `hidden` (an MTP drafter's `observe`).
pub(crate) fn prefill_observed(
    model: &Model,
    state: &mut SeqState,
    req: &GenerateRequest,
    stats: &mut GenStats,
    on_prefill: &mut dyn FnMut(usize, usize) -> bool,
    mut hidden: Option<HiddenSink>,
) -> Result<Option<Vec<f32>>> {
    let limit = req.max_tokens.unwrap_or(usize::MAX);
    let n = req.prompt.len();
    if n == 0 {
        // nothing to feed: fine when nothing is to be generated either
        return if limit == 0 { Ok(None) } else { Err(crate::error::EngineError::EmptyInput) };
    }
    let t0 = Instant::now();
    let mut chunk = if req.prefill_chunk == 0 { n } else { req.prefill_chunk };
    if hidden.is_some() {
        // one forward_batch per chunk: within what a budgeted model's scratch holds
        chunk = chunk.min(model.max_batch_rows());
    }
    // without a hidden sink a prompt goes to the model a wave at a time (its chunks pass each
    // layer together where the experts stream); progress is told per wave
    let per_call = if hidden.is_some() { chunk } else { model.wave_tokens(chunk) };
    let mut logits = Vec::new();
    let mut at = 0;
    while at < n {
        let end = (at + per_call).min(n);
        let mode = if end == n && limit > 0 { LogitsMode::Last } else { LogitsMode::None };
        match hidden.as_mut() {
            None => logits = model.forward_chunks(state, &req.prompt[at..end], chunk, mode)?,
            Some(sink) => {
                let pos = state.pos;
                let toks = &req.prompt[at..end];
                let mut step = [crate::model::SeqStep { state: &mut *state, tokens: toks, logits: mode, decode_order: false, hidden: true, banned: &[] }];
                let out = model.forward_batch_out(&mut step)?.pop().unwrap_or_default();
                sink(pos, toks, &out.hidden)?;
                logits = out.logits;
            }
        }
        at = end;
        if !on_prefill(at, n) && at < n {
            stats.prefill_secs = t0.elapsed().as_secs_f64();
            stats.stop = StopReason::Caller;
            return Ok(None);
        }
    }
    stats.prefill_secs = t0.elapsed().as_secs_f64();
    Ok((limit > 0).then_some(logits))
}

/// `generate`, with `on_prefill(done, total)` called after each prefill step (return false to
/// stop before sampling: the state then holds the prompt tokens fed so far, and the stop
/// reason is `Caller`). A sequence that reaches the context's end stops with `ContextFull`.
pub fn generate_observed(
    model: &Model,
    state: &mut SeqState,
    req: &GenerateRequest,
    sampler: &mut Sampler,
    on_prefill: &mut dyn FnMut(usize, usize) -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<GenStats> {
    let mut stats = GenStats { prompt_tokens: req.prompt.len(), ..Default::default() };
    for &t in req.prompt {
        sampler.accept(t);
    }
    let limit = req.max_tokens.unwrap_or(usize::MAX);
    let Some(mut logits) = prefill(model, state, req, &mut stats, on_prefill)? else {
        return Ok(stats);
    };
    let t1 = Instant::now();
    let rule = StopRule { stop_ids: req.stop_ids, limit };
    loop {
        let tok = sampler.sample(&mut logits);
        sampler.accept(tok);
        stats.generated += 1;
        let go_on = on_token(tok);
        if let Some(stop) = rule.after(tok, stats.generated, (!go_on).then_some(StopReason::Caller)) {
            stats.stop = stop;
            break;
        }
        if !fits_context(state.pos, 1, model.max_context()) {
            stats.stop = StopReason::ContextFull;
            break;
        }
        logits = model.forward(state, &[tok], LogitsMode::Last)?;
    }
    stats.decode_secs = t1.elapsed().as_secs_f64();
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_rule_takes_a_stop_id_then_the_caller_then_the_limit() {
        let rule = StopRule { stop_ids: &[7, 9], limit: 3 };
        assert_eq!(rule.after(1, 1, None), None);
        assert_eq!(rule.after(9, 1, None), Some(StopReason::StopToken));
        // a stop id wins over the caller and the limit at the same token
        assert_eq!(rule.after(7, 3, Some(StopReason::Caller)), Some(StopReason::StopToken));
        assert_eq!(rule.after(1, 3, Some(StopReason::Constraint)), Some(StopReason::Constraint));
        assert_eq!(rule.after(1, 3, None), Some(StopReason::Length));
        assert_eq!(rule.after(1, 2, Some(StopReason::Caller)), Some(StopReason::Caller));
        assert!(fits_context(4095, 1, 4096));
        assert!(!fits_context(4096, 1, 4096));
        assert!(!fits_context(4000, 97, 4096));
    }
}
