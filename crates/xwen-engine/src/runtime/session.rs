//! One conversation's sequence: its state, exactly the tokens that state holds, and checkpoints
//! to roll back to. A new prompt (the whole rendered transcript) reuses the longest common
//! prefix with what the state holds: the state continues when it holds only that prefix;
//! otherwise the latest checkpoint at or below the prefix is restored (recurrent layers cannot
//! be rewound, and KV rows are truncated, never copied — `SeqState::restore_checkpoint`), else
//! the sequence starts over. The tokens are those fed, so a reply's last sampled token, which
//! generation does not feed, is fed with the next prompt: every turn's state holds exactly the
//! transcript's tokens.

use crate::error::{EngineError, Result};
use crate::model::{LogitsMode, Model};
use crate::runtime::generate::{GenStats, StopReason};
use crate::runtime::sampler::Sampler;
use crate::state::{HostAt, SeqCheckpoint, SeqState};
use std::time::Instant;

/// Checkpoints a session keeps (the oldest is dropped past it): one per turn is what chat
/// needs (the end of each prompt, before its reply), a few cover templates that re-render the
/// last turns differently.
pub const MAX_CHECKPOINTS: usize = 4;

pub struct Session {
    state: SeqState,
    tokens: Vec<u32>,
    checkpoints: Vec<SeqCheckpoint>,
    /// Prompt tokens per forward step (0: a prompt in one step); see `set_prefill_chunk`.
    prefill_chunk: usize,
}

/// How a prompt met the session's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reuse {
    /// Positions the state already held (kept or restored), not run again.
    pub reused: usize,
    /// Positions run for this prompt.
    pub computed: usize,
    /// Whether a checkpoint was restored (the state held tokens past the common prefix).
    pub restored: bool,
}

impl Session {
    pub fn new(model: &Model) -> Session {
        Session { state: model.new_state(), tokens: Vec::new(), checkpoints: Vec::new(), prefill_chunk: 0 }
    }

    /// A session resuming `state`, which holds exactly `tokens` (a prefix cache's entry).
    pub fn resume(tokens: Vec<u32>, state: SeqState) -> Result<Session> {
        if state.pos != tokens.len() {
            return Err(EngineError::State(format!("a state at position {} for {} tokens", state.pos, tokens.len())));
        }
        Ok(Session { state, tokens, checkpoints: Vec::new(), prefill_chunk: 0 })
    }

    /// A copy of the state as it was at `pos`, from a checkpoint taken there: KV rows past it
    /// dropped, the recurrent states of the checkpoint (what a prefix cache keeps of a message
    /// boundary). None where the session has no checkpoint at `pos` any more.
    pub fn state_at(&self, pos: usize) -> Option<(Vec<u32>, SeqState)> {
        let (tokens, at) = self.host_at(pos)?;
        Some((tokens, at.finish().ok()?))
    }

    /// `state_at` with a device checkpoint's recurrent states left to read back
    /// (`HostAt::finish`).
    pub(crate) fn host_at(&self, pos: usize) -> Option<(Vec<u32>, HostAt)> {
        let ck = self.checkpoints.iter().find(|c| c.pos() == pos)?;
        // in host memory: what the prefix cache keeps (a device state's KV rows are read back)
        let at = self.state.host_at(ck).ok()?;
        Some((self.tokens.get(..pos)?.to_vec(), at))
    }

    /// Run prompts in forward steps of at most `n` tokens (llama.cpp's n_ubatch), which bounds
    /// the scratch a long prompt takes and lets `generate_observed` report progress; 0 (the
    /// default) runs a prompt in one step.
    pub fn set_prefill_chunk(&mut self, n: usize) {
        self.prefill_chunk = n;
    }

    /// The tokens the state holds, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn state(&self) -> &SeqState {
        &self.state
    }

    /// Forget everything (a new conversation).
    pub fn reset(&mut self, model: &Model) {
        let chunk = self.prefill_chunk;
        *self = Session::new(model);
        self.prefill_chunk = chunk;
    }

    /// Bring the state to hold exactly `prompt` minus its last token, reusing what it can,
    /// then run that last token and return its logits (the next token's distribution). A
    /// checkpoint is taken before the last token: the end of this prompt is where the next
    /// turn's transcript most often departs from what this turn generates.
    pub fn prefill(&mut self, model: &Model, prompt: &[u32]) -> Result<(Vec<f32>, Reuse)> {
        self.prefill_observed(model, prompt, &mut |_, _| true).map(|(l, r)| (l.unwrap_or_default(), r))
    }

    /// `prefill`, calling `progress(done, total)` after each forward step of the part that is
    /// computed; when it returns false the prefill stops there (None: the state holds the
    /// tokens fed so far, no logits).
    pub fn prefill_observed(
        &mut self,
        model: &Model,
        prompt: &[u32],
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<(Option<Vec<f32>>, Reuse)> {
        let Some((&last, head)) = prompt.split_last() else { return Err(EngineError::EmptyInput) };
        let (reuse, complete) = self.advance_observed(model, head, 1, progress)?;
        if !complete {
            return Ok((None, reuse));
        }
        self.checkpoint();
        let logits = self.feed(model, &[last], LogitsMode::Last)?;
        progress(reuse.computed + 1, reuse.computed + 1);
        Ok((Some(logits), Reuse { computed: reuse.computed + 1, ..reuse }))
    }

    /// Make the state hold exactly `ids` (no logits).
    pub fn advance_to(&mut self, model: &Model, ids: &[u32]) -> Result<Reuse> {
        self.advance_observed(model, ids, 0, &mut |_, _| true).map(|(r, _)| r)
    }

    /// `advance_to` in forward steps of `prefill_chunk`; `progress(done, total)` counts the
    /// computed tokens, `extra` more being computed after these. Returns whether it finished.
    fn advance_observed(
        &mut self,
        model: &Model,
        ids: &[u32],
        extra: usize,
        progress: &mut dyn FnMut(usize, usize) -> bool,
    ) -> Result<(Reuse, bool)> {
        let common = self.tokens.iter().zip(ids).take_while(|(a, b)| a == b).count();
        let mut restored = false;
        if common < self.tokens.len() {
            self.rewind(model, common)?;
            restored = true;
        }
        let reused = self.tokens.len();
        let total = ids.len() - reused + extra;
        let chunk = if self.prefill_chunk == 0 { ids.len().max(1) } else { self.prefill_chunk };
        // a wave of chunks at a time (they pass each layer together where the experts stream)
        let per_call = model.wave_tokens(chunk);
        let mut at = reused;
        while at < ids.len() {
            let end = (at + per_call).min(ids.len());
            self.feed_chunks(model, &ids[at..end], chunk, LogitsMode::None)?;
            at = end;
            if !progress(at - reused, total) {
                let complete = at == ids.len();
                return Ok((Reuse { reused, computed: at - reused, restored }, complete));
            }
        }
        Ok((Reuse { reused, computed: ids.len() - reused, restored }, true))
    }

    /// For the scheduler: roll back so the state holds a prefix of `prompt` minus its last
    /// token (the longest it can keep); returns how many of `prompt`'s tokens it holds — the
    /// rest is fed through the batched forward, the last token after a checkpoint.
    pub(crate) fn prepare(&mut self, model: &Model, prompt: &[u32]) -> Result<usize> {
        let head = &prompt[..prompt.len().saturating_sub(1)];
        let common = self.tokens.iter().zip(head).take_while(|(a, b)| a == b).count();
        if common < self.tokens.len() {
            self.rewind(model, common)?;
        }
        Ok(self.tokens.len())
    }

    pub(crate) fn state_mut(&mut self) -> &mut SeqState {
        &mut self.state
    }

    /// For the scheduler: `ids` were fed to the state through the batched forward.
    pub(crate) fn record_fed(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
    }

    /// Roll the state back to at most `pos` positions: the latest checkpoint at or below it,
    /// or the empty state.
    fn rewind(&mut self, model: &Model, pos: usize) -> Result<()> {
        while let Some(ck) = self.checkpoints.pop() {
            if ck.pos() <= pos && self.state.restore_checkpoint(&ck).is_ok() {
                self.tokens.truncate(ck.pos());
                self.checkpoints.push(ck);
                return Ok(());
            }
        }
        self.reset(model);
        Ok(())
    }

    /// Advance over `ids`, recording them; returns the requested logits.
    pub fn feed(&mut self, model: &Model, ids: &[u32], mode: LogitsMode) -> Result<Vec<f32>> {
        self.feed_chunks(model, ids, ids.len(), mode)
    }

    /// `feed` in chunks of `chunk` tokens (`Model::forward_chunks`).
    fn feed_chunks(&mut self, model: &Model, ids: &[u32], chunk: usize, mode: LogitsMode) -> Result<Vec<f32>> {
        let logits = model.forward_chunks(&mut self.state, ids, chunk, mode)?;
        self.tokens.extend_from_slice(ids);
        Ok(logits)
    }

    /// A checkpoint at the current position (kept with the latest few).
    pub fn checkpoint(&mut self) {
        if self.checkpoints.last().is_some_and(|c| c.pos() == self.state.pos) {
            return;
        }
        // a checkpoint the device could not give is skipped: a later rewind past it recomputes
        let Ok(ck) = self.state.checkpoint() else { return };
        self.checkpoints.push(ck);
        if self.checkpoints.len() > MAX_CHECKPOINTS {
            self.checkpoints.remove(0);
        }
    }

    /// Prefill `prompt` (with reuse), then sample up to `max_tokens` tokens until a stop id or
    /// `on_token` returns false. The last sampled token is not fed (nothing needs its logits);
    /// the next prompt feeds it. `sampler` sees the whole prompt as history.
    pub fn generate(
        &mut self,
        model: &Model,
        prompt: &[u32],
        max_tokens: usize,
        stop_ids: &[u32],
        sampler: &mut Sampler,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<(GenStats, Reuse)> {
        self.generate_observed(model, prompt, max_tokens, stop_ids, sampler, &mut |_, _| true, on_token)
    }

    /// `generate_observed` with a drafter (`runtime::speculative`): the prompt is brought in as
    /// `prefill` does (prefix reuse, a checkpoint before its last token), then drafted tokens
    /// are verified in decode-order spans — the greedy reply is the one `generate` gives. The
    /// state then holds the prompt and every reply token but the last, as after `generate`.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_drafted(
        &mut self,
        model: &Model,
        prompt: &[u32],
        max_tokens: usize,
        stop_ids: &[u32],
        sampler: &mut Sampler,
        drafter: &mut dyn crate::runtime::speculative::Drafter,
        max_draft: usize,
        on_prefill: &mut dyn FnMut(usize, usize) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<(GenStats, Reuse, crate::runtime::speculative::SpecStats)> {
        let Some((&last, head)) = prompt.split_last() else { return Err(EngineError::EmptyInput) };
        for &t in head {
            sampler.accept(t);
        }
        let t0 = Instant::now();
        let (reuse, complete) = self.advance_observed(model, head, 1, on_prefill)?;
        if !complete {
            let stats = GenStats { prompt_tokens: prompt.len(), prefill_secs: t0.elapsed().as_secs_f64(), stop: StopReason::Caller, ..Default::default() };
            return Ok((stats, reuse, Default::default()));
        }
        self.checkpoint();
        let head_secs = t0.elapsed().as_secs_f64();
        let req = crate::runtime::generate::GenerateRequest { prompt: &[last], max_tokens: Some(max_tokens), stop_ids, prefill_chunk: 0 };
        let mut generated = Vec::new();
        let history = self.tokens.clone();
        let (mut stats, spec) = crate::runtime::speculative::speculate(model, &mut self.state, &history, &req, drafter, max_draft, sampler, &mut |_, _| true, &mut |t| {
            generated.push(t);
            on_token(t)
        })?;
        // the state holds the last prompt token and every reply token but the last sampled one
        self.tokens.push(last);
        let fed = generated.len().saturating_sub(1);
        self.tokens.extend_from_slice(&generated[..fed]);
        debug_assert_eq!(self.tokens.len(), self.state.pos);
        self.tokens.truncate(self.state.pos);
        stats.prompt_tokens = prompt.len();
        stats.prefill_secs += head_secs;
        Ok((stats, Reuse { computed: reuse.computed + 1, ..reuse }, spec))
    }

    /// `generate`, with `on_prefill(done, total)` after each prefill step (false stops before
    /// any token: stop reason `Caller`, the state holding what was fed). A reply that reaches
    /// the context's end stops with `ContextFull`.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_observed(
        &mut self,
        model: &Model,
        prompt: &[u32],
        max_tokens: usize,
        stop_ids: &[u32],
        sampler: &mut Sampler,
        on_prefill: &mut dyn FnMut(usize, usize) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<(GenStats, Reuse)> {
        let mut stats = GenStats { prompt_tokens: prompt.len(), ..Default::default() };
        for &t in prompt {
            sampler.accept(t);
        }
        let t0 = Instant::now();
        let (logits, reuse) = self.prefill_observed(model, prompt, on_prefill)?;
        stats.prefill_secs = t0.elapsed().as_secs_f64();
        let Some(mut logits) = logits else {
            stats.stop = StopReason::Caller;
            return Ok((stats, reuse));
        };
        let t1 = Instant::now();
        let rule = crate::runtime::generate::StopRule { stop_ids, limit: max_tokens };
        while stats.generated < max_tokens {
            let tok = sampler.sample(&mut logits);
            sampler.accept(tok);
            stats.generated += 1;
            let go_on = on_token(tok);
            if let Some(stop) = rule.after(tok, stats.generated, (!go_on).then_some(StopReason::Caller)) {
                stats.stop = stop;
                break;
            }
            if !crate::runtime::generate::fits_context(self.state.pos, 1, model.max_context()) {
                stats.stop = StopReason::ContextFull;
                break;
            }
            logits = self.feed(model, &[tok], LogitsMode::Last)?;
        }
        stats.decode_secs = t1.elapsed().as_secs_f64();
        Ok((stats, reuse))
    }
}
