//! The one-sequence drafted decode loop (`xwen run --draft`, `Session::generate_drafted`):
//! propose, verify in one forward, keep the accepted prefix, roll the rest back.

use super::controller::Controller;
use super::tally::SpecStats;
use super::verify::{greedy_verify_rows, sample_verify_rows};
use super::Drafter;
use crate::error::Result;
use crate::model::{LogitsMode, Model, SeqStep};
use crate::runtime::generate::{GenStats, GenerateRequest, StopReason};
use crate::runtime::sampler::Sampler;
use crate::state::SeqState;
use std::time::Instant;

/// `generate` with a drafter: greedy output identical to plain decoding, sampled output with
/// the target's distribution; fewer target steps when drafts are accepted. `max_draft` bounds
/// the tokens verified per step (0: plain decoding, `SpecStats::active` false).
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative(
    model: &Model,
    state: &mut SeqState,
    req: &GenerateRequest,
    drafter: &mut dyn Drafter,
    max_draft: usize,
    sampler: &mut Sampler,
    on_prefill: &mut dyn FnMut(usize, usize) -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(GenStats, SpecStats)> {
    speculate(model, state, &[], req, drafter, max_draft, sampler, on_prefill, on_token)
}

/// `generate_speculative` on a state that already holds `history` (a conversation's earlier
/// tokens): the drafter sees `history` + the prompt + what is generated. The sampler is
/// expected to have seen `history` already.
#[allow(clippy::too_many_arguments)]
pub(crate) fn speculate(
    model: &Model,
    state: &mut SeqState,
    history: &[u32],
    req: &GenerateRequest,
    drafter: &mut dyn Drafter,
    max_draft: usize,
    sampler: &mut Sampler,
    on_prefill: &mut dyn FnMut(usize, usize) -> bool,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<(GenStats, SpecStats)> {
    if max_draft == 0 {
        let st = crate::runtime::generate::generate_observed(model, state, req, sampler, on_prefill, on_token)?;
        return Ok((st, SpecStats::default()));
    }
    // a device makes its verifies (and an MTP head its passes) ready now, before anything is
    // timed: a GPU captures each size's graph once, as a server does at start
    model.prepare_verifies(max_draft + 1)?;
    state.reserve_history(max_draft)?;
    let mut spec = SpecStats { active: true, ..Default::default() };
    let mut stats = GenStats { prompt_tokens: req.prompt.len(), ..Default::default() };
    for &t in req.prompt {
        sampler.accept(t);
    }
    let limit = req.max_tokens.unwrap_or(usize::MAX);
    let wants_hidden = drafter.wants_hidden();
    let prefilled = if wants_hidden {
        let mut sink = |pos: usize, toks: &[u32], h: &[f32]| drafter.observe(model, pos, toks, h);
        crate::runtime::generate::prefill_observed(model, state, req, &mut stats, on_prefill, Some(&mut sink))?
    } else {
        crate::runtime::generate::prefill(model, state, req, &mut stats, on_prefill)?
    };
    let Some(mut logits) = prefilled else {
        return Ok((stats, spec));
    };
    let t1 = Instant::now();
    let mut context: Vec<u32> = history.iter().chain(req.prompt).copied().collect();
    // `emit` a sampled token: Some(stop reason) when generation ends with it
    let rule = crate::runtime::generate::StopRule { stop_ids: req.stop_ids, limit };
    let emit = |tok: u32, stats: &mut GenStats, on_token: &mut dyn FnMut(u32) -> bool| -> Option<StopReason> {
        stats.generated += 1;
        let go_on = on_token(tok);
        rule.after(tok, stats.generated, (!go_on).then_some(StopReason::Caller))
    };
    let mut tok = sampler.sample(&mut logits);
    sampler.accept(tok);
    if let Some(r) = emit(tok, &mut stats, on_token) {
        stats.stop = r;
        stats.decode_secs = t1.elapsed().as_secs_f64();
        return Ok((stats, spec));
    }
    let n_vocab = model.n_vocab();
    // a greedy sampler's rows need their picks alone: a device then copies back a token a row
    // instead of a vocabulary's logits (and skips the bans itself)
    let greedy_bans = sampler.greedy_bans();
    let mode = if greedy_bans.is_some() { LogitsMode::AllArgmax } else { LogitsMode::All };
    let banned = greedy_bans.unwrap_or_default();
    let mut ctl = Controller::new(max_draft);
    ctl.set_timed(sampler.params().temperature <= 0.0);
    ctl.set_shadowed(drafter.proposes_cheaply());
    // what the drafter spent following the kept rows since its last proposal (an MTP head's
    // KV rows): part of what drafting costs
    let mut observe_secs = 0.0f64;
    loop {
        let pos = state.pos;
        if !crate::runtime::generate::fits_context(pos, 1, model.max_context()) {
            stats.stop = StopReason::ContextFull;
            break;
        }
        context.push(tok);
        // drafts fit in the context and in what is left to generate
        let room = model.max_context() - pos - 1;
        let left = limit - stats.generated;
        let k = ctl.depth().min(room).min(left.saturating_sub(1));
        let t_draft = Instant::now();
        let drafts = if k > 0 { drafter.propose_with(model, &context, k)? } else { Vec::new() };
        // paused: what the drafter would have drafted, judged against this step's token
        let shadow = if k == 0 && ctl.shadow_wanted() { super::shadow_token(drafter, model, &context) } else { None };
        if k > 0 {
            let secs = observe_secs + t_draft.elapsed().as_secs_f64();
            ctl.observe_draft_cost(drafts.len().min(k), secs);
            spec.draft_secs += secs;
            observe_secs = 0.0;
        }
        if k > 0 && drafts.is_empty() && !drafter.proposes_cheaply() {
            ctl.observe_empty();
        }
        let drafts = &drafts[..drafts.len().min(k)];
        // a rollback reaches back within this step's span only, to the state before a draft:
        // keep those, and none on a step without drafts (a paused drafter then costs no state
        // copies: 48 MB a token on a 4B)
        state.keep_history(drafts.len());
        let mut span = Vec::with_capacity(1 + drafts.len());
        span.push(tok);
        span.extend_from_slice(drafts);
        let t_step = Instant::now();
        let out = {
            let mut step = [SeqStep { state: &mut *state, tokens: &span, logits: mode, decode_order: true, hidden: wants_hidden, banned: &banned }];
            model.forward_batch_out(&mut step)?.pop().unwrap_or_default()
        };
        let step_secs = t_step.elapsed().as_secs_f64();
        ctl.observe_cost(span.len(), step_secs);
        spec.time_step(span.len(), step_secs);
        let (mut rows, hidden) = (out.logits, out.hidden);
        spec.steps += 1;
        let (i, y, stop) = if out.picks.len() == span.len() {
            greedy_verify_rows(&out.picks, drafts, sampler, &mut |y| emit(y, &mut stats, on_token))
        } else {
            sample_verify_rows(&mut rows, n_vocab, drafts, sampler, &mut |y| emit(y, &mut stats, on_token))
        };
        spec.tally.record(drafts.len(), i);
        context.extend_from_slice(&drafts[..i]);
        ctl.observe(drafts.len(), i);
        if let Some(s) = shadow {
            ctl.observe_shadow(s == y);
        }
        // the state keeps span[..=i]: the tokens whose logits were used
        state.rollback(pos + i + 1)?;
        if wants_hidden {
            let h = model.step_hidden_width();
            let t_obs = Instant::now();
            drafter.observe(model, pos, &span[..=i], &hidden[..(i + 1) * h])?;
            observe_secs += t_obs.elapsed().as_secs_f64();
        }
        if let Some(r) = stop {
            stats.stop = r;
            break;
        }
        tok = y;
    }
    stats.decode_secs = t1.elapsed().as_secs_f64();
    state.keep_history(0);
    Ok((stats, spec))
}
