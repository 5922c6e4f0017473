//! Speculative decoding: a drafter proposes the next few tokens, the target model verifies them
//! all in one forward step, the longest prefix greedy decoding agrees with is kept.
//!
//! The verify runs its rows in the one-token (decode) order (`SeqStep::decode_order`), so each
//! row's logits are the bits plain one-token decode gives at that position; the sampler then
//! picks tokens in the same order with the same history. Drafted output is therefore plain
//! greedy output by construction. Rejected rows are rolled back with `SeqState::rollback` (KV
//! truncated, the recurrent layers' kept states restored): nothing runs twice.
//!
//! Drafters behind one seam (`Drafter`): `NgramDrafter` (prompt lookup: the continuation of the
//! latest earlier occurrence of the context's last n tokens — the win on code edits and
//! retrieval) and `ModelDrafter` (a smaller model with the same vocabulary, greedy). With
//! temperature > 0 each drafted row keeps its draft with the target's probability of it and
//! otherwise draws from the rest (`Sampler::sample_against`): the output follows the target's
//! distribution exactly (the random draws differ from plain sampling's, so a seed's text does).

use crate::error::Result;
use crate::model::{LogitsMode, Model, SeqStep};
use crate::runtime::cost_table::{read_cost, record, COST_MIN_SEEN};
use crate::runtime::generate::{GenStats, GenerateRequest, StopReason};
use crate::runtime::sampler::Sampler;
use crate::state::SeqState;
use std::sync::Arc;
use std::time::Instant;

/// Proposes up to `max` tokens that continue `context` (prompt and generated tokens, the last of
/// which the target has not fed yet).
pub trait Drafter: Send {
    fn name(&self) -> &'static str;
    fn propose(&mut self, context: &[u32], max: usize) -> Result<Vec<u32>>;
    /// `propose` for a drafter that runs on the target model itself (an MTP head).
    fn propose_with(&mut self, _target: &Model, context: &[u32], max: usize) -> Result<Vec<u32>> {
        self.propose(context, max)
    }
    /// Whether the target's steps should return their final hidden rows for `observe`.
    fn wants_hidden(&self) -> bool {
        false
    }
    /// Whether a proposal costs next to nothing (a lookup) rather than forward passes: a
    /// costly drafter that keeps proposing nothing is paused like one that is never right.
    fn proposes_cheaply(&self) -> bool {
        true
    }
    /// The target kept `tokens` at positions `pos..` (a prompt chunk, or a verify's accepted
    /// rows) and these are their final hidden rows (tokens × hidden).
    fn observe(&mut self, _target: &Model, _pos: usize, _tokens: &[u32], _hidden: &[f32]) -> Result<()> {
        Ok(())
    }
    /// A draft model's drafter, whose proposals a scheduler batches across its sequences
    /// (`ModelDrafter::propose_many`).
    fn as_model_drafter(&mut self) -> Option<&mut ModelDrafter> {
        None
    }
}

/// What drafting did — over one generation (`SpecStats::tally`) or every drafting sequence since
/// a scheduler started: verify steps with drafts, and per draft position (0: the first drafted
/// token of a step) the tokens drafted and accepted there — llama-server's `spec_decode_num_accepted_tokens_per_pos_total`. A draft at
/// position i is only accepted if those before it were, so `accepted_at` never grows with i.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraftTally {
    pub verify_steps: u64,
    pub drafted_at: Vec<u64>,
    pub accepted_at: Vec<u64>,
}

impl DraftTally {
    pub fn drafted(&self) -> u64 {
        self.drafted_at.iter().sum()
    }

    pub fn accepted(&self) -> u64 {
        self.accepted_at.iter().sum()
    }

    /// `other`'s counts added to these (repetitions of a benchmark, say).
    pub fn add(&mut self, other: &DraftTally) {
        self.verify_steps += other.verify_steps;
        for (sum, v) in [(&mut self.drafted_at, &other.drafted_at), (&mut self.accepted_at, &other.accepted_at)] {
            if sum.len() < v.len() {
                sum.resize(v.len(), 0);
            }
            for (a, b) in sum.iter_mut().zip(v) {
                *a += b;
            }
        }
    }

    /// One verify of `drafted` tokens of which the first `accepted` were kept.
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.verify_steps += 1;
        if self.drafted_at.len() < drafted {
            self.drafted_at.resize(drafted, 0);
            self.accepted_at.resize(drafted, 0);
        }
        for c in &mut self.drafted_at[..drafted] {
            *c += 1;
        }
        for c in &mut self.accepted_at[..accepted.min(drafted)] {
            *c += 1;
        }
    }
}

/// Counters of one speculative generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Whether drafting ran (false: `max_draft` 0, plain decoding).
    pub active: bool,
    /// Verify steps (target forward passes after the prefill).
    pub steps: usize,
    /// The drafts per draft position (the steps with drafts only).
    pub tally: DraftTally,
}

impl SpecStats {
    /// Tokens drafted (and verified).
    pub fn drafted(&self) -> usize {
        self.tally.drafted() as usize
    }

    /// Drafted tokens accepted.
    pub fn accepted(&self) -> usize {
        self.tally.accepted() as usize
    }

    pub fn acceptance(&self) -> f64 {
        match self.drafted() {
            0 => 0.0,
            d => self.accepted() as f64 / d as f64,
        }
    }
}

/// Prompt lookup: the tokens that followed the latest earlier occurrence of the context's last
/// n tokens, for n from `max_n` down to `min_n`.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter { min_n: 2, max_n: 4 }
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn propose(&mut self, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        let len = ctx.len();
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if len <= n {
                continue;
            }
            let key = &ctx[len - n..];
            // latest start j < len - n with ctx[j..j+n] == key and something after it
            if let Some(j) = (0..len - n).rev().find(|&j| &ctx[j..j + n] == key) {
                let from = j + n;
                let end = (from + max).min(len);
                if from < end {
                    return Ok(ctx[from..end].to_vec());
                }
            }
        }
        Ok(Vec::new())
    }
}

/// Proposes a known continuation (the target's own greedy output, from an earlier run): every
/// draft is right, so a run with it measures the verify machinery's upper bound at each depth —
/// what a perfect drafter could buy on this model, machine and budget. Stateless: the tokens
/// generated so far are the longest prefix of the continuation the context ends with.
pub struct ReplayDrafter {
    continuation: Vec<u32>,
}

impl ReplayDrafter {
    pub fn new(continuation: Vec<u32>) -> Self {
        ReplayDrafter { continuation }
    }
}

impl Drafter for ReplayDrafter {
    fn name(&self) -> &'static str {
        "replay"
    }

    fn propose(&mut self, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        let c = &self.continuation;
        // the longest g with ctx ending in c[..g] (g ≥ 1: the pending token is c[g − 1])
        let g = (1..=c.len().min(ctx.len())).rev().find(|&g| ctx.ends_with(&c[..g]));
        Ok(match g {
            Some(g) => c[g..(g + max).min(c.len())].to_vec(),
            None => Vec::new(),
        })
    }
}

/// Proposes tokens the target does not take — the last context token's successors in the
/// vocabulary, a different run each step — so nearly every draft is wrong: a run with it
/// measures what drafting costs when it never pays, which the controller's pause must keep
/// small (the bar: at most 3% slower than plain; docs/bench.md "Drafting"). Stateless and free to propose.
pub struct ContraryDrafter {
    n_vocab: u32,
}

impl ContraryDrafter {
    pub fn new(n_vocab: usize) -> Self {
        ContraryDrafter { n_vocab: n_vocab.clamp(1, u32::MAX as usize) as u32 }
    }
}

impl Drafter for ContraryDrafter {
    fn name(&self) -> &'static str {
        "contrary"
    }

    fn propose(&mut self, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        let last = ctx.last().copied().unwrap_or(0) as u64;
        Ok((0..max as u64).map(|i| ((last + 1 + i) % self.n_vocab as u64) as u32).collect())
    }
}

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
                    let (t, p) = top(lg);
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

/// The largest probability of a softmax over `logits`, and its index (first on ties).
fn top(logits: &[f32]) -> (u32, f32) {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    let m = logits[best];
    let sum: f64 = logits.iter().map(|&x| ((x - m) as f64).exp()).sum();
    (best as u32, (1.0 / sum) as f32)
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
            let (t, p) = top(&logits);
            if p < self.p_min && !out.is_empty() {
                break;
            }
            out.push(t);
            last = t;
        }
        Ok(out)
    }
}

/// The target's own MTP (NextN) head (`models::mtp`; the file's nextn block or a sidecar
/// attached with `Model::attach_mtp`), driven as llama.cpp's draft-mtp drives it
/// (`common/speculative.cpp`): the head's KV row at position p holds token p with the target's
/// hidden p−1 — `observe` feeds every kept row so, one sync point owning the shift — and a draft
/// chains from the pending token with the hidden of the last kept row, each next step fed the
/// head's own hidden. Where the head missed positions (a state restored from a prefix cache),
/// they are filled with zero hiddens: drafts there are poorer, output is unchanged.
pub struct MtpDrafter {
    state: Option<SeqState>,
    /// Kept rows the head has not run yet (position of the first, tokens, hidden rows): fed in
    /// one batched head pass when a draft is next asked for, so a paused drafter costs nothing.
    buf_pos: usize,
    buf_tokens: Vec<u32>,
    buf_hidden: Vec<f32>,
    /// The target's hidden at position `h_pos` (pairs with the token at `h_pos + 1`).
    last_h: Vec<f32>,
    h_pos: Option<usize>,
    /// Stop drafting when the head's top probability falls below this (llama.cpp's p_min).
    pub p_min: f32,
}

impl Default for MtpDrafter {
    fn default() -> Self {
        MtpDrafter { state: None, buf_pos: 0, buf_tokens: Vec::new(), buf_hidden: Vec::new(), last_h: Vec::new(), h_pos: None, p_min: 0.0 }
    }
}

impl MtpDrafter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the buffered rows through the head: token q with the hidden of q−1 (the row before
    /// it in the buffer, or the last hidden before the buffer), in batches the model takes —
    /// their KV rows only: no draft is asked of them (the chain starts from the pending token).
    fn flush(&mut self, target: &Model) -> Result<()> {
        if self.buf_tokens.is_empty() {
            return Ok(());
        }
        let h = target.hidden_width();
        if self.state.is_none() {
            self.state = Some(target.new_mtp_state()?);
        }
        let st = self.state.as_mut().expect("set above");
        let pos = self.buf_pos;
        if st.pos > pos {
            st.truncate(pos)?;
        }
        if st.pos < pos {
            // positions the head never saw (restored from a cache): zero hiddens, token 0
            let gap = pos - st.pos;
            target.mtp_write_kv(st, &vec![0; gap], &vec![0.0; gap * h])?;
        }
        let m = self.buf_tokens.len();
        let mut h_in = Vec::with_capacity(m * h);
        match self.h_pos {
            Some(p) if p + 1 == pos && self.last_h.len() == h => h_in.extend_from_slice(&self.last_h),
            _ => h_in.resize(h, 0.0),
        }
        h_in.extend_from_slice(&self.buf_hidden[..(m - 1) * h]);
        let batch = target.max_batch_rows().max(1);
        let mut at = 0;
        while at < m {
            let end = (at + batch).min(m);
            target.mtp_write_kv(st, &self.buf_tokens[at..end], &h_in[at * h..end * h])?;
            at = end;
        }
        self.last_h = self.buf_hidden[(m - 1) * h..].to_vec();
        self.h_pos = Some(pos + m - 1);
        self.buf_tokens.clear();
        self.buf_hidden.clear();
        Ok(())
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn propose(&mut self, _context: &[u32], _max: usize) -> Result<Vec<u32>> {
        // the head runs on the target model: see propose_with
        Ok(Vec::new())
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn proposes_cheaply(&self) -> bool {
        false
    }

    fn observe(&mut self, target: &Model, pos: usize, tokens: &[u32], hidden: &[f32]) -> Result<()> {
        let h = target.hidden_width();
        let m = tokens.len();
        if m == 0 || hidden.len() != m * h {
            return Ok(());
        }
        let end = self.buf_pos + self.buf_tokens.len();
        if self.buf_tokens.is_empty() || pos < self.buf_pos || pos > end {
            // not a continuation of the buffer: run what it holds, start a new one
            self.flush(target)?;
            self.buf_pos = pos;
        } else {
            // rows from `pos` on were cut (a rejected tail): drop them
            self.buf_tokens.truncate(pos - self.buf_pos);
            self.buf_hidden.truncate((pos - self.buf_pos) * h);
        }
        self.buf_tokens.extend_from_slice(tokens);
        self.buf_hidden.extend_from_slice(hidden);
        // a long pause or prompt: run it in batches rather than keep it all
        if self.buf_tokens.len() >= 4096 {
            self.flush(target)?;
        }
        Ok(())
    }

    fn propose_with(&mut self, target: &Model, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        self.flush(target)?;
        let (Some(st), Some(hp)) = (self.state.as_mut(), self.h_pos) else {
            return Ok(Vec::new());
        };
        let Some(&pending) = ctx.last() else {
            return Ok(Vec::new());
        };
        // the pending token sits at h_pos + 1; the head's rows past that are last step's drafts
        let pos0 = hp + 1;
        if st.pos > pos0 {
            st.truncate(pos0)?;
        }
        if st.pos != pos0 {
            return Ok(Vec::new());
        }
        let max = max.min(target.max_context().saturating_sub(pos0 + 1));
        let mut out = Vec::with_capacity(max);
        let (mut tok, mut h) = (pending, self.last_h.clone());
        while out.len() < max {
            let o = target.mtp_forward(st, &[tok], &h, 0..1)?;
            let (t, p) = top(&o.logits);
            if p < self.p_min {
                break;
            }
            out.push(t);
            tok = t;
            h = o.hidden;
        }
        Ok(out)
    }
}

/// What a drafting sequence's controller learned — step and proposal costs, acceptance by
/// position, pauses — handed back when the sequence ends (`Scheduler::take_ended`) so the next
/// request drafting with the same drafter starts from it, as the drafter itself carries on
/// (`Request::draft_memory`). A server request of a hundred tokens is over before a fresh
/// controller has measured enough to pause a drafter that does not pay.
pub struct DraftMemory(pub(crate) Controller);

/// How deep to draft: the depth follows what the last verify accepted (all accepted: one
/// deeper; else one past what was), and while the recent acceptance stays below
/// `PAUSE_BELOW` drafting pauses for `PAUSE_STEPS` steps — a drafter that never agrees then
/// costs almost nothing over plain decoding. Where steps are timed (`observe_cost`), the depth
/// is also capped at the one that pays most: the expected tokens of a verify of k drafts over
/// its measured cost relative to a plain step (`Costs`) — on a MoE model a verify's rows route
/// to more experts, and under a RAM budget those are reads. Output never depends on it.
pub(crate) struct Controller {
    pub(crate) max: usize,
    costs: Costs,
    /// Plain steps asked for to time one (`depth`).
    probes: u32,
    depth: usize,
    /// Exponential average of the accepted share of drafted tokens.
    rate: f64,
    /// Costly proposals in a row that came back empty (`observe_empty`).
    empty: usize,
    /// The next pause's length: doubled by each pause that ends without an accepted draft.
    pause_len: usize,
    drafted_steps: usize,
    pause: usize,
    /// The next pause for cost (no depth pays for its verify and its proposal): doubled by
    /// each cost verdict in a row, back to `PAUSE_STEPS` when a depth pays again.
    cost_pause_len: usize,
    /// Verifies left after a cost pause in which the depth ignores the cost verdict, so the
    /// acceptance counts see current drafts before the next one.
    probation: usize,
}

const PAUSE_BELOW: f64 = 0.25;
/// A cost verdict below this gain pauses drafting (plain decoding is 1).
const PAYS_ABOVE: f64 = 0.98;
const PAUSE_STEPS: usize = 24;
/// The longest pause (pauses in a row double up to it).
const LONGEST_PAUSE: usize = PAUSE_STEPS << 5;
/// Empty costly proposals in a row before a pause.
const EMPTY_RUN: usize = 4;

impl Controller {
    pub(crate) fn new(max: usize) -> Self {
        Controller {
            max,
            costs: Costs::new(max),
            probes: 0,
            depth: max,
            rate: 0.5,
            empty: 0,
            pause_len: PAUSE_STEPS,
            drafted_steps: 0,
            pause: 0,
            cost_pause_len: PAUSE_STEPS,
            probation: 0,
        }
    }

    /// The most tokens it drafts per step.
    pub(crate) fn max_depth(&self) -> usize {
        self.max
    }

    /// The depth for this step (0 while paused).
    pub(crate) fn depth(&mut self) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        if !self.costs.timed {
            return self.depth;
        }
        // the plain step's cost is the yardstick: measure it directly, twice, once drafting has
        // run a while (a greedy run's output does not depend on it)
        // (at most twice: a step shared with other sequences is not timed)
        if self.drafted_steps >= PROBE_AFTER && self.costs.plain_seen() < COST_MIN_SEEN && self.probes < COST_MIN_SEEN {
            self.probes += 1;
            return 0;
        }
        if self.probation > 0 {
            return self.depth.max(1);
        }
        match self.costs.best_depth(self.max) {
            // no depth pays for its verify and its proposal: plain decoding for a while (pauses
            // in a row double, so a drafter that never pays costs ever less), then drafts again
            // on probation to see whether that still holds
            Some((0, _)) if self.costs.best_drafting_gain(self.max) < PAYS_ABOVE => {
                // a drafter that would not pay even if every draft were accepted cannot start
                // paying with better drafts, only with cheaper steps: the longest pause at once
                if self.costs.best_ceiling(self.max) < PAYS_ABOVE {
                    self.cost_pause_len = LONGEST_PAUSE;
                }
                self.pause = self.cost_pause_len - 1;
                self.cost_pause_len = (self.cost_pause_len * 2).min(LONGEST_PAUSE);
                self.probation = EMPTY_RUN;
                0
            }
            Some((k, _)) => {
                self.cost_pause_len = PAUSE_STEPS;
                self.depth.min(k.max(1))
            }
            None => self.depth,
        }
    }

    /// Choose depths by measured cost (`observe_cost`): only where the output cannot depend on
    /// the depth — greedy decoding. A sampled run draws its random numbers step by step, so a
    /// depth chosen by wall time would make a seed's text vary between runs.
    pub(crate) fn set_timed(&mut self, timed: bool) {
        self.costs.timed = timed;
    }

    /// A step of `rows` rows (1 + its drafts) took `secs`.
    pub(crate) fn observe_cost(&mut self, rows: usize, secs: f64) {
        if self.costs.timed {
            self.costs.observe_step(rows, secs);
        }
    }

    /// A proposal of `drafted` tokens (and what the drafter did for it since the last one)
    /// took `secs`: the drafter's share of a drafted step's cost.
    pub(crate) fn observe_draft_cost(&mut self, drafted: usize, secs: f64) {
        if self.costs.timed {
            self.costs.observe_draft(drafted, secs);
        }
    }

    /// The depth the cost model picks and its expected gain over plain decoding (None before
    /// it has measured enough).
    #[cfg(test)]
    fn cost_choice(&self) -> Option<(usize, f64)> {
        self.costs.best_depth(self.max)
    }

    /// A costly drafter proposed nothing (below p_min from its first token): it paid a
    /// forward for it, so a run of these pauses drafting as low acceptance does.
    pub(crate) fn observe_empty(&mut self) {
        self.empty += 1;
        // a drafter that has already been paused without an accepted draft since is paused
        // again by its first empty proposal (the pauses keep doubling), not after a new run
        let run = if self.pause_len > PAUSE_STEPS { 1 } else { EMPTY_RUN };
        if self.empty >= run {
            self.empty = 0;
            self.start_pause();
        }
    }

    /// Pauses drafting; pauses in a row without an accepted draft grow (24, 48, … 768 steps),
    /// so a drafter that is never right costs ever less.
    fn start_pause(&mut self) {
        self.pause = self.pause_len;
        self.pause_len = (self.pause_len * 2).min(LONGEST_PAUSE);
    }

    pub(crate) fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.costs.observe_accept(drafted, accepted);
        self.probation = self.probation.saturating_sub(1);
        self.empty = 0;
        self.drafted_steps += 1;
        if accepted > 0 {
            self.pause_len = PAUSE_STEPS;
        }
        self.rate = 0.7 * self.rate + 0.3 * (accepted as f64 / drafted as f64);
        self.depth = if accepted == drafted { (self.depth + 1).min(self.max) } else { (accepted + 1).min(self.max) };
        if self.drafted_steps >= 4 && self.rate < PAUSE_BELOW {
            self.start_pause();
            // on probation after the pause
            self.rate = 0.5;
            self.depth = 1;
        }
    }
}

/// What verifies cost and how often each draft position is accepted, measured as drafting
/// runs: a step's seconds by its row count (exponential averages), and per draft position the
/// share of the steps that reached it (every earlier draft accepted) that accepted it too.
/// From them, for k drafts: expected tokens E(k) = 1 + Σ_{i<k} Π_{j≤i} p_j against the cost
/// c(k) = t(1 + k) / t(1), a row count not measured yet read off the line through the measured
/// ones.
struct Costs {
    /// Whether depths are chosen by cost at all (`Controller::set_timed`).
    timed: bool,
    /// (average seconds, steps seen) by row count (index = rows).
    secs: Vec<(f64, u32)>,
    /// (average seconds, proposals seen) of a proposal by its drafted tokens (index = tokens).
    draft_secs: Vec<(f64, u32)>,
    /// Per draft position: steps that reached it, and those that accepted it (decayed counts).
    reached: Vec<f64>,
    accepted: Vec<f64>,
}

/// Decay of the acceptance counts per verify: recent behaviour counts more.
const ACCEPT_DECAY: f64 = 0.97;
/// Verifies before choosing by cost (a row count's average needs `COST_MIN_SEEN` steps).
const ACCEPT_MIN_STEPS: f64 = 4.0;
/// Verifies after which a timed controller measures a plain step, if none has run.
const PROBE_AFTER: usize = 8;

impl Costs {
    fn new(max: usize) -> Costs {
        Costs { timed: false, secs: vec![(0.0, 0); max + 2], draft_secs: vec![(0.0, 0); max + 1], reached: vec![0.0; max], accepted: vec![0.0; max] }
    }

    /// Plain (one-row) steps measured.
    fn plain_seen(&self) -> u32 {
        self.secs.get(1).map_or(0, |c| c.1)
    }

    fn observe_step(&mut self, rows: usize, secs: f64) {
        record(&mut self.secs, rows, secs);
    }

    fn observe_draft(&mut self, drafted: usize, secs: f64) {
        record(&mut self.draft_secs, drafted, secs);
    }

    fn observe_accept(&mut self, drafted: usize, accepted: usize) {
        for (r, a) in self.reached.iter_mut().zip(self.accepted.iter_mut()) {
            *r *= ACCEPT_DECAY;
            *a *= ACCEPT_DECAY;
        }
        // positions 0..=accepted were reached (all before them accepted); 0..accepted accepted
        for i in 0..=accepted.min(drafted.saturating_sub(1)) {
            if let Some(r) = self.reached.get_mut(i) {
                *r += 1.0;
            }
        }
        for a in self.accepted.iter_mut().take(accepted) {
            *a += 1.0;
        }
    }

    /// The cost of a step of `rows` rows: its average where measured, else the least-squares
    /// line through the measured row counts (None with fewer than two). A plain step's is
    /// always measured, never read off the line.
    fn cost(&self, rows: usize) -> Option<f64> {
        if rows == 1 && self.plain_seen() < COST_MIN_SEEN {
            return None;
        }
        read_cost(&self.secs, rows)
    }

    /// What proposing `k` tokens costs: its average, the line through the measured counts, the
    /// one measured count's average — 0 where no proposal was timed (a lookup drafter's are
    /// timed too, and next to nothing).
    fn draft_cost(&self, k: usize) -> f64 {
        read_cost(&self.draft_secs, k).or_else(|| self.draft_secs.iter().find(|c| c.1 >= COST_MIN_SEEN).map(|c| c.0)).unwrap_or(0.0)
    }

    /// The best gain over depths 1..=max (what drafting at its best depth would give).
    fn best_drafting_gain(&self, max: usize) -> f64 {
        (1..=max).filter_map(|k| self.gain(k)).fold(0.0, f64::max)
    }

    /// The best gain over depths 1..=max if every draft were accepted: an upper bound no
    /// acceptance can beat (0 until measured).
    fn best_ceiling(&self, max: usize) -> f64 {
        let Some(base) = self.cost(1) else { return 0.0 };
        (1..=max)
            .filter_map(|k| Some((k + 1) as f64 / ((self.cost(1 + k)? + self.draft_cost(k)) / base)))
            .fold(0.0, f64::max)
    }

    /// E(k) / c(k) for depth k: expected tokens per plain-step cost of verifying 1 + k rows and
    /// proposing k (None until measured).
    fn gain(&self, k: usize) -> Option<f64> {
        let base = self.cost(1)?;
        let (mut expected, mut chain, mut last_p) = (1.0f64, 1.0f64, 0.5f64);
        for i in 0..k.min(self.reached.len()) {
            // Laplace-smoothed; a position never reached takes the one before it, at most even
            let p = if self.reached[i] >= 1.0 { (self.accepted[i] + 0.5) / (self.reached[i] + 1.0) } else { last_p.min(0.5) };
            last_p = p;
            chain *= p;
            expected += chain;
        }
        Some(expected / ((self.cost(1 + k)? + self.draft_cost(k)) / base))
    }

    /// The depth k in 0..=max with the most expected tokens per unit of cost, and that gain
    /// (E(k) / c(k); 1 for plain decoding); None until enough is measured. (The controller
    /// drafts at least one token while drafting: pausing is the acceptance rule's call.)
    fn best_depth(&self, max: usize) -> Option<(usize, f64)> {
        if self.reached.first().copied().unwrap_or(0.0) < ACCEPT_MIN_STEPS {
            return None;
        }
        self.cost(1)?;
        let mut best = (0, 1.0);
        for k in 1..=max.min(self.reached.len()) {
            let gain = self.gain(k)?;
            if gain > best.1 {
                best = (k, gain);
            }
        }
        Some(best)
    }
}

/// Samples a verify's rows (`rows`: n_vocab logits each, the pending token's row first) in
/// order against `drafts`: a drafted row keeps its draft with its probability (greedy: when it
/// is the argmax). `emit` sees each sampled token and says whether generation ends with it.
/// Stops at the first row whose token is not its draft (the last row has none) or that ends
/// generation; returns that row's index i — drafts[..i] were accepted — its token and the stop.
pub(crate) fn sample_verify_rows(
    rows: &mut [f32],
    n_vocab: usize,
    drafts: &[u32],
    sampler: &mut Sampler,
    emit: &mut dyn FnMut(u32) -> Option<StopReason>,
) -> (usize, u32, Option<StopReason>) {
    let n = rows.len() / n_vocab;
    for i in 0..n {
        let row = &mut rows[i * n_vocab..(i + 1) * n_vocab];
        let (y, agrees) = match drafts.get(i) {
            Some(&d) => sampler.sample_against(row, d),
            None => (sampler.sample(row), false),
        };
        sampler.accept(y);
        let stop = emit(y);
        if stop.is_some() || !agrees || i + 1 == n {
            return (i, y, stop);
        }
    }
    unreachable!("a verify has at least one row")
}

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
    let mut ctl = Controller::new(max_draft);
    ctl.set_timed(sampler.params().temperature <= 0.0);
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
        if k > 0 {
            ctl.observe_draft_cost(drafts.len().min(k), observe_secs + t_draft.elapsed().as_secs_f64());
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
            let mut step = [SeqStep { state: &mut *state, tokens: &span, logits: LogitsMode::All, decode_order: true, hidden: wants_hidden }];
            model.forward_batch_out(&mut step)?.pop().unwrap_or_default()
        };
        ctl.observe_cost(span.len(), t_step.elapsed().as_secs_f64());
        let (mut rows, hidden) = (out.logits, out.hidden);
        spec.steps += 1;
        let (i, y, stop) = sample_verify_rows(&mut rows, n_vocab, drafts, sampler, &mut |y| emit(y, &mut stats, on_token));
        spec.tally.record(drafts.len(), i);
        context.extend_from_slice(&drafts[..i]);
        ctl.observe(drafts.len(), i);
        // the state keeps span[..=i]: the tokens whose logits were used
        state.rollback(pos + i + 1)?;
        if wants_hidden {
            let h = model.hidden_width();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_costly_drafter_that_proposes_nothing_is_paused() {
        let mut c = Controller::new(4);
        for _ in 0..EMPTY_RUN - 1 {
            assert_eq!(c.depth(), 4);
            c.observe_empty();
        }
        assert_eq!(c.depth(), 4, "not paused before the run is long enough");
        c.observe_empty();
        assert!((0..PAUSE_STEPS).all(|_| c.depth() == 0), "paused for PAUSE_STEPS steps");
        assert_eq!(c.depth(), 4);
        // still never agreeing after the pause: its first empty pauses it again, twice as long
        c.observe_empty();
        assert!((0..2 * PAUSE_STEPS).all(|_| c.depth() == 0), "paused again at once, for 2 × PAUSE_STEPS");
        assert!(c.depth() > 0);
        // an accepted draft restores the run rule: EMPTY_RUN − 1 empties leave it drafting
        c.observe(2, 1);
        for _ in 0..EMPTY_RUN - 1 {
            c.observe_empty();
        }
        assert!(c.depth() > 0);
        c.observe_empty();
        assert!((0..PAUSE_STEPS).all(|_| c.depth() == 0), "the pause is back to PAUSE_STEPS");
        assert!(c.depth() > 0);
    }

    /// The depth that pays: deep where a verify's rows are cheap and drafts are right, shallow
    /// where each row costs nearly a step, none where no depth pays for itself.
    #[test]
    fn the_cost_model_picks_the_depth_that_pays() {
        // cost of a step of r rows: 1 + slope·(r − 1); each draft accepted with probability p
        let run = |slope: f64, p: f64| {
            let mut c = Controller::new(8);
            c.set_timed(true);
            // deterministic acceptance runs with the right frequencies
            let mut acc = 0.0f64;
            for step in 0..200 {
                let k = (step % 8) + 1;
                let mut a = 0;
                while a < k {
                    acc += p;
                    if acc >= 1.0 {
                        acc -= 1.0;
                        a += 1;
                    } else {
                        break;
                    }
                }
                c.costs.observe_accept(k, a);
                c.costs.observe_step(1 + k, 1.0 + slope * k as f64);
                c.costs.observe_step(1, 1.0);
            }
            c.cost_choice().expect("measured")
        };
        let (k, g) = run(0.05, 0.9);
        assert!(k >= 6 && g > 3.0, "cheap rows, right drafts: deep ({k}, {g})");
        let (k, g) = run(0.6, 0.7);
        assert!((1..=3).contains(&k) && g > 1.0, "costly rows: shallow ({k}, {g})");
        let (k, g) = run(1.0, 0.4);
        assert_eq!((k, g), (0, 1.0), "a verify row costs a step and drafts are poor: none pays");
        // where no depth pays the controller pauses drafting — for PAUSE_STEPS, then drafts on
        // probation (the cost verdict set aside for EMPTY_RUN verifies), then pauses twice as
        // long; an untimed one (sampling) ignores costs altogether
        let mut c = Controller::new(8);
        c.set_timed(true);
        for _ in 0..20 {
            c.costs.observe_accept(4, 1);
            c.costs.observe_step(5, 5.0);
            c.costs.observe_step(1, 1.0);
            c.costs.observe_step(2, 2.2);
        }
        c.depth = 4;
        assert!((0..PAUSE_STEPS).all(|_| c.depth() == 0), "no depth pays: paused");
        for _ in 0..EMPTY_RUN {
            assert!(c.depth() >= 1, "on probation after the pause");
            c.observe(1, 1);
            c.costs.observe_accept(4, 1);
        }
        assert!((0..2 * PAUSE_STEPS).all(|_| c.depth() == 0), "still not paying: paused twice as long");
        c.set_timed(false);
        c.pause = 0;
        assert_eq!(c.depth(), c.depth, "untimed: no cost verdicts");
    }

    /// The drafter's own time counts: a draft model as costly as the target is paused even
    /// when every draft is right and verify rows are cheap; the same acceptance with a free
    /// proposal drafts deep.
    #[test]
    fn a_proposal_that_costs_more_than_it_saves_pauses_drafting() {
        let run = |draft_secs_per_token: f64| {
            let mut c = Controller::new(4);
            c.set_timed(true);
            for _ in 0..30 {
                c.costs.observe_accept(4, 4);
                for k in 0..=4 {
                    c.costs.observe_step(1 + k, 1.0 + 0.1 * k as f64);
                    c.costs.observe_draft(k, draft_secs_per_token * k as f64);
                }
            }
            c.depth = 4;
            c
        };
        let mut cheap = run(0.0);
        assert_eq!(cheap.depth(), 4, "free proposals, every draft right: deep");
        let mut costly = run(1.0);
        assert_eq!(costly.depth(), 0, "each drafted token costs a whole step: paused");
        assert!(costly.costs.best_drafting_gain(4) < 1.0);
        // it would not pay with every draft accepted either: the longest pause at once, then
        // probation
        assert!(costly.costs.best_ceiling(4) < PAYS_ABOVE);
        assert!((0..LONGEST_PAUSE - 1).all(|_| costly.depth() == 0), "the longest pause");
        assert!(costly.depth() >= 1, "then drafts on probation");
    }

    #[test]
    fn ngram_proposes_the_latest_continuation() {
        let mut d = NgramDrafter { min_n: 2, max_n: 3 };
        // ... 1 2 3 [4 5] ... 1 2 3 [7 8] ... 2 3 → the latest: 7 8
        let ctx = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 2, 3];
        assert_eq!(d.propose(&ctx, 2).unwrap(), vec![7, 8]);
        assert_eq!(d.propose(&ctx, 10).unwrap(), vec![7, 8, 6, 2, 3]);
        assert_eq!(d.propose(&[1, 2, 3], 4).unwrap(), Vec::<u32>::new());
        assert_eq!(d.propose(&[5, 5, 5, 5], 2).unwrap(), vec![5]);
    }
}
