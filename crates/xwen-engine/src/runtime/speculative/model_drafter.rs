//! A draft model: a smaller model with the target's vocabulary, drafting greedily from its own
//! state; a scheduler's drafting sequences propose together through one batched forward.

use super::Drafter;
use crate::error::Result;
use crate::model::{LogitsMode, Model, SeqStep};
use crate::state::SeqState;
use std::sync::Arc;

/// Tokens a resuming draft model is fed at most to catch up with a context it did not follow
/// (`ModelDrafter::rewind`).
const CATCH_UP_WINDOW: usize = 64;

/// A smaller model with the target's vocabulary drafting greedily from its own state, which
/// follows the accepted context (rolled back over rejected drafts, re-fed where it departs).
/// The model is shared: a server's slots each hold a drafter (its own state) over one draft
/// model.
pub struct ModelDrafter {
    model: Arc<Model>,
    state: SeqState,
    /// The tokens `state` holds: the context's from index `base` on (0 unless a long stretch
    /// the drafter did not follow made it start over near the end, `rewind`).
    fed: Vec<u32>,
    base: usize,
    /// Stop drafting when the draft's top probability falls below this (llama.cpp's p_min).
    pub p_min: f32,
    kept: usize,
}

impl ModelDrafter {
    pub fn new(model: impl Into<Arc<Model>>, max_draft: usize) -> Self {
        let model = model.into();
        let mut state = model.new_state();
        state.keep_history(max_draft + 1);
        ModelDrafter { model, state, fed: Vec::new(), base: 0, p_min: 0.75, kept: max_draft + 1 }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Brings the state to hold `ctx` minus its last token, reusing what it can.
    fn sync(&mut self, ctx: &[u32]) -> Result<()> {
        let start = self.rewind(ctx);
        let head = &ctx[..ctx.len() - 1];
        if start < head.len() {
            self.model.forward(&mut self.state, &head[start..], LogitsMode::None)?;
            self.fed.extend_from_slice(&head[start..]);
        }
        Ok(())
    }

    /// `sync`'s first half: rolls the state back to the longest prefix of `ctx` minus its last
    /// token that it holds (or starts over), and returns the index in `ctx` of the first token
    /// it does not hold — the rest is what the state must be fed.
    ///
    /// A drafter the controller paused has not followed the tokens generated meanwhile, and
    /// feeding it all of them when drafting resumes cost more than the pause saved (a 768-step
    /// pause: a 768-token prefill of the draft model, ~20% of a tiny model's decode time). So
    /// where more than `CATCH_UP_WINDOW` tokens are missing past what it already followed, it
    /// starts over on the last `CATCH_UP_WINDOW` of them: its drafts see a shorter context, the
    /// output cannot change (every draft is verified). A first sync (the prompt) feeds it all.
    fn rewind(&mut self, ctx: &[u32]) -> usize {
        let head = &ctx[..ctx.len() - 1];
        let common = match head.get(self.base..) {
            Some(rest) => self.fed.iter().zip(rest).take_while(|(a, b)| a == b).count(),
            None => 0,
        };
        if common < self.fed.len() && (common == 0 || self.state.rollback(common).is_err()) {
            // departed further back than the kept states reach: start over
            self.start_over(0);
        }
        self.fed.truncate(self.state.pos);
        if self.fed.is_empty() {
            self.base = 0;
        }
        let missing = head.len() - (self.base + self.fed.len());
        if !self.fed.is_empty() && missing > CATCH_UP_WINDOW {
            self.start_over(head.len() - CATCH_UP_WINDOW);
        }
        self.base + self.fed.len()
    }

    /// A fresh state that will hold the context from index `base` on.
    fn start_over(&mut self, base: usize) {
        self.state = self.model.new_state();
        self.state.keep_history(self.kept);
        self.fed.clear();
        self.base = base;
    }

    /// The most tokens a proposal of up to `max` for `ctx` may draft (the draft's own context).
    fn room(&self, ctx: &[u32], max: usize) -> usize {
        if ctx.is_empty() {
            return 0;
        }
        max.min(self.model.max_context().saturating_sub(ctx.len()))
    }

    /// Proposals of several drafters over one draft model (a server's slots), their forwards
    /// batched: each catch-up span and each draft step of all of them in one `forward_batch`.
    /// By the engine's batch invariance every drafter's logits — hence its proposal — are the
    /// bits `propose` gives it alone (each span keeps its size: the catch-up, then one token a
    /// step). `jobs[i]` is (context, max) for `drafters[i]`; drafters over another model, or
    /// spans the model's RAM plan cannot batch, propose on their own.
    pub fn propose_many(drafters: &mut [&mut ModelDrafter], jobs: &[(&[u32], usize)]) -> Result<Vec<Vec<u32>>> {
        assert_eq!(drafters.len(), jobs.len(), "one job per drafter");
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); drafters.len()];
        let Some(first) = drafters.first() else { return Ok(out) };
        let model = first.model.clone();
        // (drafter index, its max) of those that draft here together
        let mut live: Vec<(usize, usize)> = Vec::new();
        for (i, (d, &(ctx, max))) in drafters.iter_mut().zip(jobs).enumerate() {
            let max = d.room(ctx, max);
            if max == 0 {
                continue;
            }
            if !Arc::ptr_eq(&d.model, &model) {
                out[i] = d.propose(ctx, max)?;
                continue;
            }
            live.push((i, max));
        }
        let group = model.max_sequences().max(1);
        // catch-up: every drafter's missing context in one batch (as large as the plan allows)
        let mut feeds: Vec<(usize, usize)> = Vec::new(); // (drafter, first token to feed)
        for &(i, _) in &live {
            let start = drafters[i].rewind(jobs[i].0);
            if start + 1 < jobs[i].0.len() {
                feeds.push((i, start));
            }
        }
        let rows_cap = model.max_batch_rows();
        let mut at = 0;
        while at < feeds.len() {
            let mut end = at;
            let mut rows = 0usize;
            while end < feeds.len() && end - at < group {
                let (i, start) = feeds[end];
                let n = jobs[i].0.len() - 1 - start;
                if rows + n > rows_cap && end > at {
                    break;
                }
                rows += n;
                end += 1;
            }
            if end == at + 1 && rows > rows_cap {
                // a catch-up longer than one batch: `forward` splits it as it would alone
                let (i, _) = feeds[at];
                drafters[i].sync(jobs[i].0)?;
                at = end;
                continue;
            }
            let mut picked: Vec<Option<&mut ModelDrafter>> = drafters.iter_mut().map(|d| Some(&mut **d)).collect();
            let mut steps = Vec::with_capacity(end - at);
            for &(i, start) in &feeds[at..end] {
                let d = picked[i].take().expect("a drafter feeds once");
                let head = &jobs[i].0[start..jobs[i].0.len() - 1];
                d.fed.extend_from_slice(head);
                steps.push(SeqStep::new(&mut d.state, head, LogitsMode::None));
            }
            model.forward_batch(&mut steps)?;
            at = end;
        }
        // draft steps: one token per still-drafting drafter per batch
        let mut last: Vec<u32> = live.iter().map(|&(i, _)| *jobs[i].0.last().expect("non-empty")).collect();
        let mut going: Vec<bool> = vec![true; live.len()];
        loop {
            let active: Vec<usize> = (0..live.len()).filter(|&j| going[j]).collect();
            if active.is_empty() {
                break;
            }
            for part in active.chunks(group) {
                let mut picked: Vec<Option<&mut ModelDrafter>> = drafters.iter_mut().map(|d| Some(&mut **d)).collect();
                let mut steps = Vec::with_capacity(part.len());
                for &j in part {
                    let d = picked[live[j].0].take().expect("a drafter steps once");
                    d.fed.push(last[j]);
                    steps.push(SeqStep::new(&mut d.state, std::slice::from_ref(&last[j]), LogitsMode::Last));
                }
                let logits = model.forward_batch(&mut steps)?;
                drop(steps);
                for (&j, lg) in part.iter().zip(&logits) {
                    let (i, max) = live[j];
                    let (t, p) = crate::ops::top(lg);
                    if p < drafters[i].p_min && !out[i].is_empty() {
                        going[j] = false;
                        continue;
                    }
                    out[i].push(t);
                    last[j] = t;
                    if out[i].len() >= max {
                        going[j] = false;
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Drafter for ModelDrafter {
    fn name(&self) -> &'static str {
        "model"
    }

    fn as_model_drafter(&mut self) -> Option<&mut ModelDrafter> {
        Some(self)
    }

    fn proposes_cheaply(&self) -> bool {
        false
    }

    fn propose(&mut self, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        let max = self.room(ctx, max);
        if max == 0 {
            return Ok(Vec::new());
        }
        self.sync(ctx)?;
        let mut out = Vec::with_capacity(max);
        let mut last = ctx[ctx.len() - 1];
        while out.len() < max {
            let logits = self.model.forward(&mut self.state, &[last], LogitsMode::Last)?;
            self.fed.push(last);
            let (t, p) = crate::ops::top(&logits);
            if p < self.p_min && !out.is_empty() {
                break;
            }
            out.push(t);
            last = t;
        }
        Ok(out)
    }
}
