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

impl GenStats {
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_secs)
    }
    pub fn decode_tps(&self) -> f64 {
        // The first token comes out of prefill; decode rate counts the steps after it.
        rate(self.generated.saturating_sub(1), self.decode_secs)
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

pub struct GenerateRequest<'a> {
    pub prompt: &'a [u32],
    pub max_tokens: usize,
    pub stop_ids: &'a [u32],
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
    let mut stats = GenStats { prompt_tokens: req.prompt.len(), ..Default::default() };
    for &t in req.prompt {
        sampler.accept(t);
    }
    if req.max_tokens == 0 {
        if !req.prompt.is_empty() {
            let t0 = Instant::now();
            model.forward(state, req.prompt, LogitsMode::None)?;
            stats.prefill_secs = t0.elapsed().as_secs_f64();
        }
        return Ok(stats);
    }
    let t0 = Instant::now();
    let mut logits = model.forward(state, req.prompt, LogitsMode::Last)?;
    stats.prefill_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    loop {
        let tok = sampler.sample(&mut logits);
        sampler.accept(tok);
        stats.generated += 1;
        let go_on = on_token(tok);
        if req.stop_ids.contains(&tok) {
            stats.stop = StopReason::StopToken;
            break;
        }
        if !go_on {
            stats.stop = StopReason::Caller;
            break;
        }
        if stats.generated >= req.max_tokens {
            stats.stop = StopReason::Length;
            break;
        }
        logits = model.forward(state, &[tok], LogitsMode::Last)?;
    }
    stats.decode_secs = t1.elapsed().as_secs_f64();
    Ok(stats)
}
