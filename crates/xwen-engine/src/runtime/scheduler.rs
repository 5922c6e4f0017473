//! Many sequences stepped together through the batched forward (continuous batching): each
//! step runs every decoding sequence's next token and prefill chunks of sequences still taking
//! their prompt, samples for those whose logits came back, and lets sequences join and leave
//! between steps. A sequence's prompt is cut into chunks of `PREFILL_CHUNK` whatever else runs,
//! and the forward is batch-invariant, so each sequence's tokens are those it would get alone
//! (fed in the same chunks) — tested token for token. Where the model streams its experts and
//! one prompt is all there is to run, a step feeds it several chunks as a prefill wave (the
//! same chunks, each expert read once for them all).

use crate::error::{EngineError, Result};
use crate::memory_plan::PREFILL_BATCH;
use crate::model::{LogitsMode, Model, SeqStep};
use crate::models::SpanOut;
use crate::runtime::cost_table::{shares, StepCosts};
use crate::runtime::generate::{fits_context, StopReason, StopRule};
use crate::runtime::sampler::Sampler;
use crate::runtime::session::Session;
use crate::runtime::speculative::{greedy_verify_rows, sample_verify_rows, shadow_token, Controller, DraftMemory, DraftTally, Drafter, ModelDrafter, SpecStats};
use std::collections::HashMap;

/// Prompt tokens one sequence feeds per step (llama.cpp's micro-batch).
pub const PREFILL_CHUNK: usize = PREFILL_BATCH;

/// Rows one step runs at most on a mapped model (llama.cpp's logical batch, -b 2048).
pub const MAX_STEP_ROWS: usize = 2048;
/// The largest step `StepCosts` learns a row's time from: decode rows and their drafts.
const DECODE_STEP_ROWS: usize = 64;

pub type SeqId = u64;

pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub stop_ids: Vec<u32>,
    pub sampler: Sampler,
    /// A conversation to continue (a server's slot): the prompt reuses what its state holds
    /// (`Session`'s prefix reuse), a checkpoint is taken before the prompt's last token, and
    /// the session comes back with `Scheduler::take_session` once the sequence ends — its
    /// tokens generated exactly as `Session::generate` would. None: a fresh sequence.
    pub session: Option<Session>,
    /// Report the sampled token's log-probability and this many most likely alternatives
    /// (OpenAI's `logprobs` / `top_logprobs`), from the model's distribution before sampling.
    pub logprobs: Option<usize>,
    /// Constrains or edits the logits before sampling (a grammar, a tool-call format) and
    /// sees every sampled token.
    pub processor: Option<Box<dyn LogitsProcessor>>,
    /// More positions of the prompt to checkpoint the session at (with a session): the
    /// message boundaries where a later turn's rendering stops agreeing with this one (a
    /// template that renders the reply differently from its generation prompt departs there).
    pub checkpoint_at: Vec<usize>,
    /// Speculative decoding for this sequence: a drafter and the most tokens it drafts per
    /// step. Its decode steps then verify drafts in decode-order spans (the output is what it
    /// would be without: `runtime::speculative`). Ignored with a processor or logprobs.
    pub draft: Option<(Box<dyn Drafter>, usize)>,
    /// What the drafter's controller learned on an earlier request (`Ended::draft_memory`);
    /// used when it drafted to the same depth.
    pub draft_memory: Option<DraftMemory>,
    /// Prompt tokens per forward step (llama.cpp's n_ubatch, a caller's `-ub`); 0: `PREFILL_CHUNK`.
    /// The chunks decide a prompt's bits, so a caller matching another path's chunks sets them.
    pub prefill_chunk: usize,
    /// With a session: checkpoint before the prompt's last token, where a next turn most often
    /// departs (the last token then runs alone). False for a prompt no turn continues: it
    /// runs in whole chunks, its last token in the last, as `generate` runs a prompt.
    pub checkpoint_last: bool,
}

impl Request {
    /// A fresh sequence (no session), no logprobs, no processor, no drafter.
    pub fn new(prompt: Vec<u32>, max_tokens: usize, stop_ids: Vec<u32>, sampler: Sampler) -> Request {
        Request {
            prompt,
            max_tokens,
            stop_ids,
            sampler,
            session: None,
            logprobs: None,
            processor: None,
            checkpoint_at: Vec::new(),
            draft: None,
            draft_memory: None,
            prefill_chunk: 0,
            checkpoint_last: true,
        }
    }
}

/// Edits a sequence's next-token logits before sampling (e.g. masks tokens a grammar forbids).
pub trait LogitsProcessor: Send {
    /// Called with the raw logits of the next position; may set entries to -inf.
    fn process(&mut self, logits: &mut [f32]);
    /// The token that was sampled; false ends the sequence (the constraint is complete).
    fn accept(&mut self, token: u32) -> bool;
}

/// A sampled token's log-probability and the most likely alternatives, most likely first.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// Log-softmax of `logits` at `token`, and the `top` most likely tokens.
    pub fn of(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let lse = max as f64 + sum.ln();
        let lp = |l: f32| (l as f64 - lse) as f32;
        let mut best: Vec<(u32, f32)> = Vec::new();
        if top > 0 {
            let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
            let k = top.min(idx.len());
            idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
            idx.truncate(k);
            idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
            best = idx.into_iter().map(|i| (i, lp(logits[i as usize]))).collect();
        }
        TokenLogprobs { logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l)), top: best }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A sampled token (stop ids included), with its logprobs when the request asked.
    Token { id: SeqId, token: u32, logprobs: Option<Box<TokenLogprobs>> },
    /// The sequence ended and left the scheduler.
    Done { id: SeqId, stop: StopReason, generated: usize },
    /// An expert read the sequence's rows needed failed (`Model::forward_batch_each`): it left
    /// the scheduler without its session (the state is past repair), the step's other
    /// sequences went on.
    Failed { id: SeqId, error: String },
}

struct Running {
    id: SeqId,
    session: Session,
    /// The caller gets the session back (`take_session`).
    keep_session: bool,
    /// Positions still to checkpoint at, ascending (the last is before the prompt's last token).
    checkpoint_at: Vec<usize>,
    /// Prompt tokens not fed yet; once the prompt is in, the one sampled token to feed next.
    pending: Vec<u32>,
    prompt_left: bool,
    sampler: Sampler,
    generated: usize,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    logprobs: Option<usize>,
    processor: Option<Box<dyn LogitsProcessor>>,
    /// Prompt tokens the session already held at admission (not computed again).
    cached: usize,
    draft: Option<(Box<dyn Drafter>, Controller)>,
    /// This step's drafts (verified with the pending token).
    drafts: Vec<u32>,
    /// A paused drafter's shadow proposal for this step (`Controller::shadow_wanted`), judged
    /// against the step's token.
    shadow: Option<u32>,
    /// Prompt tokens per forward step (`Request::prefill_chunk`, within a batch's rows).
    chunk: usize,
    /// This sequence's drafting: its decode steps and its drafts per position.
    spec: SpecStats,
    /// Where its sampler is greedy but for banned tokens (`Sampler::greedy_bans`): those, so a
    /// device's argmax skips them and copies back one id instead of the logits.
    greedy_bans: Option<Vec<u32>>,
}

/// What an ended sequence that came with a session leaves (`take_ended`).
pub struct Ended {
    pub session: Session,
    /// Its drafter, if it drafted: it follows the session (a draft model's state holds the
    /// conversation so far).
    pub drafter: Option<Box<dyn Drafter>>,
    /// What its drafting controller learned, for the drafter's next request.
    pub draft_memory: Option<DraftMemory>,
    /// Its sampler, as the last token left it (a caller continuing a conversation's sampling).
    pub sampler: Sampler,
    /// Its drafting, if it drafted.
    pub spec: Option<SpecStats>,
}

pub struct Scheduler {
    running: Vec<Running>,
    max_seqs: usize,
    next_id: SeqId,
    /// Sessions (and their drafters) of ended sequences that came with a session.
    ended: HashMap<SeqId, Ended>,
    tally: DraftTally,
    /// Whole steps' times by row count (decode-sized steps only: a prefill chunk's rows cost
    /// less each than a decode row's): how a shared step's time divides among its sequences.
    step_costs: StepCosts,
    /// What the last step ran and where its time went.
    last: StepShape,
}

/// What a step ran and where its time went (`Scheduler::last_step`): how a server's steps
/// divide between its decode rows, the prompts that join them and the checkpoints they take.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepShape {
    /// Rows the forward computed: decode rows, prompt tokens and verify rows.
    pub rows: usize,
    /// Sequences that fed prompt tokens in the step, and the tokens they fed.
    pub prompts: usize,
    pub prompt_tokens: usize,
    /// Seconds in the forward, and in the checkpoints taken after it (a device state's
    /// recurrent states are read back to host memory there).
    pub forward_secs: f64,
    pub checkpoint_secs: f64,
}

impl Scheduler {
    /// A scheduler of at most `max_seqs` sequences at once.
    pub fn new(max_seqs: usize) -> Scheduler {
        Scheduler {
            running: Vec::new(),
            max_seqs: max_seqs.max(1),
            next_id: 1,
            ended: HashMap::new(),
            tally: DraftTally::default(),
            step_costs: StepCosts::new(DECODE_STEP_ROWS),
            last: StepShape::default(),
        }
    }

    /// What the last `step` ran and where its time went (all zero for a step that ran nothing).
    pub fn last_step(&self) -> StepShape {
        self.last
    }

    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Admit a request; refused when `max_seqs` run already (or the sequences a RAM plan holds
    /// state for, `Model::max_sequences`) or the prompt is empty.
    pub fn add(&mut self, model: &Model, mut req: Request) -> Result<SeqId> {
        let cap = self.max_seqs.min(model.max_sequences());
        if self.running.len() >= cap {
            return Err(EngineError::State(format!("all {cap} sequences are busy")));
        }
        if req.prompt.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        for &t in &req.prompt {
            req.sampler.accept(t);
        }
        let keep_session = req.session.is_some();
        let (mut session, pending, checkpoint_at, cached) = match req.session.take() {
            Some(mut s) => {
                let held = s.prepare(model, &req.prompt)?;
                let last = req.prompt.len() - 1;
                let mut at: Vec<usize> = req.checkpoint_at.iter().copied().filter(|&p| p >= held && p < last).chain(req.checkpoint_last.then_some(last)).collect();
                at.sort_unstable();
                at.dedup();
                if at.first() == Some(&held) {
                    // the state is at a checkpoint position already: it is due now
                    s.checkpoint();
                    at.remove(0);
                }
                (s, req.prompt[held..].to_vec(), at, held)
            }
            None => (Session::new(model), req.prompt, Vec::new(), 0),
        };
        let id = self.next_id;
        self.next_id += 1;
        let draft = match req.draft.take() {
            Some((d, k)) if k > 0 && req.processor.is_none() && req.logprobs.is_none() => {
                let mut ctl = match req.draft_memory.take() {
                    Some(DraftMemory(c)) if c.max_depth() == k => c,
                    _ => Controller::new(k),
                };
                ctl.set_timed(req.sampler.params().temperature <= 0.0);
                ctl.set_shadowed(d.proposes_cheaply());
                // a device makes its verifies ready at the first such request, not mid-request,
                // and this sequence's kept states at its admission, not at its first verify
                model.prepare_verifies(k + 1)?;
                session.state_mut().reserve_history(k)?;
                Some((d, ctl))
            }
            _ => None,
        };
        let chunk = match req.prefill_chunk {
            0 => PREFILL_CHUNK,
            n => n.min(model.max_batch_rows()),
        };
        let spec = SpecStats { active: draft.is_some(), ..Default::default() };
        let greedy_bans = req.sampler.greedy_bans();
        self.running.push(Running {
            id,
            session,
            keep_session,
            checkpoint_at,
            pending,
            prompt_left: true,
            sampler: req.sampler,
            generated: 0,
            max_tokens: req.max_tokens,
            stop_ids: req.stop_ids,
            logprobs: req.logprobs,
            processor: req.processor,
            cached,
            draft,
            drafts: Vec::new(),
            shadow: None,
            chunk,
            spec,
            greedy_bans,
        });
        Ok(id)
    }

    /// Verify steps and the drafted / accepted tokens per draft position so far.
    pub fn draft_tally(&self) -> &DraftTally {
        &self.tally
    }

    /// How many of a running sequence's prompt tokens its session already held when it was
    /// admitted (the prefix reused, not computed again).
    pub fn cached_tokens(&self, id: SeqId) -> Option<usize> {
        self.running.iter().find(|r| r.id == id).map(|r| r.cached)
    }

    /// Prompt tokens a running sequence has still to feed (None once its prompt is in, or
    /// when it is not running): a caller's prefill progress.
    pub fn prompt_left(&self, id: SeqId) -> Option<usize> {
        self.running.iter().find(|r| r.id == id).filter(|r| r.prompt_left).map(|r| r.pending.len())
    }

    /// Drop a sequence (a client that went away); false if it is not running. Its session,
    /// if it came with one, can still be taken back (holding what was fed).
    pub fn cancel(&mut self, id: SeqId) -> bool {
        match self.running.iter().position(|r| r.id == id) {
            Some(i) => {
                self.end(i);
                true
            }
            None => false,
        }
    }

    /// The session of an ended sequence that came with one (`Request::session`).
    pub fn take_session(&mut self, id: SeqId) -> Option<Session> {
        self.take_ended(id).map(|e| e.session)
    }

    /// `take_session` with the sequence's drafter and what its controller learned, if it
    /// drafted: the drafter follows its session (a draft model's state holds the conversation
    /// so far), so the next request on that session drafts without feeding the draft model the
    /// whole conversation again, and without learning its costs again.
    pub fn take_ended(&mut self, id: SeqId) -> Option<Ended> {
        self.ended.remove(&id)
    }

    fn end(&mut self, i: usize) {
        let mut r = self.running.remove(i);
        if r.draft.is_some() {
            // kept states cost a copy per token: not for the slot's next, maybe undrafted, request
            r.session.state_mut().keep_history(0);
        }
        if r.keep_session {
            let (drafter, draft_memory) = match r.draft {
                Some((d, c)) => (Some(d), Some(DraftMemory(c))),
                None => (None, None),
            };
            let spec = drafter.is_some().then_some(r.spec);
            self.ended.insert(r.id, Ended { session: r.session, drafter, draft_memory, sampler: r.sampler, spec });
        }
    }

    /// A drafting sequence's verify: `rows` holds the logits of its `n` fed tokens (the pending
    /// token and the drafts). Tokens are sampled row by row against the drafts; the state is
    /// rolled back to the tokens whose logits were used. Returns the stop reason if it ended.
    /// Also returns the drafts verified and accepted.
    fn verify(model: &Model, r: &mut Running, n: usize, (rows, picks): (&mut [f32], &[u32]), hidden: &[f32], events: &mut Vec<Event>) -> Result<(Option<StopReason>, usize, usize)> {
        let n_vocab = model.n_vocab();
        let pos0 = r.session.state().pos - n;
        let drafts = std::mem::take(&mut r.drafts);
        let span: Vec<u32> = r.pending.drain(..n).collect();
        let id = r.id;
        let rule = StopRule { stop_ids: &r.stop_ids, limit: r.max_tokens };
        let generated = &mut r.generated;
        let mut emit = |tok| {
            *generated += 1;
            events.push(Event::Token { id, token: tok, logprobs: None });
            rule.after(tok, *generated, None)
        };
        // a device's picks where it made them (a greedy verify), else the rows' logits sampled
        let (i, tok, stop) =
            if picks.len() == n { greedy_verify_rows(picks, &drafts, &mut r.sampler, &mut emit) } else { sample_verify_rows(rows, n_vocab, &drafts, &mut r.sampler, &mut emit) };
        // keep span[..=i]: the tokens whose logits were used
        r.session.state_mut().rollback(pos0 + i + 1)?;
        if let Some((d, ctl)) = r.draft.as_mut() {
            ctl.observe(drafts.len(), i);
            if d.wants_hidden() {
                let h = model.step_hidden_width();
                d.observe(model, pos0, &span[..=i], &hidden[..(i + 1) * h])?;
            }
        }
        r.session.record_fed(&span[..=i]);
        if stop.is_none() {
            r.pending.push(tok);
        }
        Ok((stop, drafts.len(), i))
    }

    /// Prompt tokens sequence `r` feeds next: a whole chunk, cut at the checkpoint position.
    fn chunk(r: &Running) -> usize {
        Self::prompt_piece(r, r.chunk)
    }

    /// Up to `most` of sequence `r`'s pending prompt tokens, cut at its next checkpoint position.
    fn prompt_piece(r: &Running, most: usize) -> usize {
        let mut n = r.pending.len().min(most);
        let pos = r.session.state().pos;
        if let Some(&c) = r.checkpoint_at.iter().find(|&&c| c > pos) {
            n = n.min(c - pos);
        }
        n
    }

    /// Where a streamed model (`Model::wave_tokens`) has one sequence's prompt and nothing
    /// else to run this step: that sequence and the prompt tokens it feeds as one prefill
    /// wave — whole chunks, each expert read once for all of them, stopping where a chunk
    /// would (a checkpoint position, the context) so its chunks are the steps' one by one.
    /// Only with nothing else to run: a wave takes several chunks' time, and a decoding
    /// sequence would wait through it for one token. Not for a drafter that reads hidden rows.
    fn lone_prompt_wave(&self, model: &Model, take: &[usize]) -> Option<(usize, usize)> {
        let mut busy = take.iter().enumerate().filter(|&(_, &n)| n > 0);
        let (k, _) = busy.next()?;
        if busy.next().is_some() {
            return None;
        }
        let r = &self.running[k];
        let per_wave = model.wave_tokens(r.chunk);
        if per_wave <= r.chunk {
            return None;
        }
        if !r.prompt_left || r.draft.as_ref().is_some_and(|(d, _)| d.wants_hidden()) {
            return None;
        }
        let room = model.max_context().saturating_sub(r.session.state().pos);
        let n = Self::prompt_piece(r, per_wave).min(room);
        (n > Self::chunk(r)).then_some((k, n))
    }

    /// One batched forward over the running sequences; returns what happened. The phases, in
    /// order: sequences that cannot run end, drafting sequences propose, the step's rows are
    /// chosen, the forward runs, its time is shared out, and each sequence's logits become its
    /// tokens.
    pub fn step(&mut self, model: &Model) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        self.last = StepShape::default();
        self.end_unrunnable(model, &mut events);
        self.propose_drafts(model)?;
        let (take, wave) = self.schedule_rows(model);
        let Some(ran) = self.run(model, &take, wave)? else { return Ok(events) };
        self.share_step_cost(&ran);
        self.postprocess(model, ran, &mut events)?;
        Ok(events)
    }

    /// Sequences with nothing to generate or no room left end before the step.
    fn end_unrunnable(&mut self, model: &Model, events: &mut Vec<Event>) {
        let max_ctx = model.max_context();
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            let next = if r.prompt_left { Self::chunk(r) } else { 1 };
            let stop = if r.max_tokens == 0 && !r.prompt_left {
                Some(StopReason::Length)
            } else if !fits_context(r.session.state().pos, next, max_ctx) {
                Some(StopReason::ContextFull)
            } else {
                None
            };
            match stop {
                Some(stop) => {
                    events.push(Event::Done { id: r.id, stop, generated: r.generated });
                    self.end(i);
                }
                None => i += 1,
            }
        }
    }

    /// Drafting sequences propose this step's drafts (within the context and the token limit);
    /// draft models' drafters together, their forwards batched across sequences. Each
    /// controller learns what its proposal cost.
    fn propose_drafts(&mut self, model: &Model) -> Result<()> {
        let max_ctx = model.max_context();
        let mut asks: Vec<(usize, Vec<u32>, usize)> = Vec::new(); // (running index, context, depth)
        for (i, r) in self.running.iter_mut().enumerate() {
            r.drafts.clear();
            r.shadow = None;
            if r.prompt_left {
                continue;
            }
            if let Some((d, ctl)) = r.draft.as_mut() {
                let pos = r.session.state().pos;
                let room = max_ctx.saturating_sub(pos + 1);
                let left = r.max_tokens.saturating_sub(r.generated);
                let k = ctl.depth().min(room).min(left.saturating_sub(1));
                let shadow = k == 0 && ctl.shadow_wanted();
                if k > 0 || shadow {
                    let mut ctx: Vec<u32> = r.session.tokens().to_vec();
                    ctx.extend_from_slice(&r.pending);
                    if k > 0 {
                        asks.push((i, ctx, k));
                    } else {
                        // paused: what it would draft, judged against this step's token
                        // (a cheap drafter's, so outside the proposals' timing)
                        r.shadow = shadow_token(d.as_mut(), model, &ctx);
                    }
                }
            }
        }
        let mut proposals: Vec<Option<Vec<u32>>> = vec![None; self.running.len()];
        // every proposal of this step, timed together (shared out below)
        let t_draft = std::time::Instant::now();
        {
            let mut batched: Vec<(usize, &mut ModelDrafter)> = Vec::new();
            let mut asked = asks.iter().peekable();
            for (i, r) in self.running.iter_mut().enumerate() {
                let Some((_, ctx, k)) = asked.next_if(|a| a.0 == i) else { continue };
                let (d, _) = r.draft.as_mut().expect("asked only of drafting sequences");
                if d.as_model_drafter().is_some() {
                    batched.push((i, d.as_model_drafter().expect("checked")));
                } else {
                    proposals[i] = Some(d.propose_with(model, ctx, *k)?);
                }
            }
            if !batched.is_empty() {
                let jobs: Vec<(&[u32], usize)> = batched
                    .iter()
                    .map(|(i, _)| asks.iter().find(|a| a.0 == *i).map(|a| (&a.1[..], a.2)).expect("asked"))
                    .collect();
                let (idx, mut ds): (Vec<usize>, Vec<&mut ModelDrafter>) = batched.into_iter().unzip();
                for (i, p) in idx.into_iter().zip(ModelDrafter::propose_many(&mut ds, &jobs)?) {
                    proposals[i] = Some(p);
                }
            }
        }
        let draft_secs = t_draft.elapsed().as_secs_f64();
        for (i, _, k) in &asks {
            let r = &mut self.running[*i];
            r.drafts = proposals[*i].take().unwrap_or_default();
            r.drafts.truncate(*k);
        }
        // proposals made together share their time by drafted tokens (a sequence alone pays
        // all of it)
        let drafted_total: usize = asks.iter().map(|(i, _, _)| self.running[*i].drafts.len()).sum();
        for (i, _, _) in &asks {
            let r = &mut self.running[*i];
            let (d, ctl) = r.draft.as_mut().expect("asked only of drafting sequences");
            let share = if drafted_total > 0 {
                draft_secs * r.drafts.len() as f64 / drafted_total as f64
            } else {
                draft_secs / asks.len() as f64
            };
            ctl.observe_draft_cost(r.drafts.len(), share);
            r.spec.draft_secs += share;
            if r.drafts.is_empty() && !d.proposes_cheaply() {
                ctl.observe_empty();
            }
        }
        Ok(())
    }

    /// The rows each sequence runs this step (0: it waits): decode rows first (one row each,
    /// plus its drafts), then whole prefill chunks while rows remain — a chunk never shrinks to
    /// fit, so a sequence's spans do not depend on the others — and a lone prompt's wave.
    fn schedule_rows(&self, model: &Model) -> (Vec<usize>, Option<(usize, usize)>) {
        let budget = model.max_batch_rows().min(MAX_STEP_ROWS);
        let mut rows = self.running.iter().filter(|r| !r.prompt_left).map(|r| 1 + r.drafts.len()).sum::<usize>();
        let mut take: Vec<usize> = self.running.iter().map(|r| usize::from(!r.prompt_left)).collect();
        for (t, r) in take.iter_mut().zip(&self.running) {
            if r.prompt_left {
                let chunk = Self::chunk(r);
                if rows + chunk <= budget || rows == 0 {
                    *t = chunk;
                    rows += chunk;
                }
            }
        }
        let wave = self.lone_prompt_wave(model, &take);
        if let Some((k, n)) = wave {
            take[k] = n;
        }
        (take, wave)
    }

    /// The forward over the scheduled rows: a drafted sequence's verify span (the pending token,
    /// then its drafts), a decode row, or a prompt chunk each. None when nothing runs.
    fn run(&mut self, model: &Model, take: &[usize], wave: Option<(usize, usize)>) -> Result<Option<Ran>> {
        let wave_chunk = wave.map_or(PREFILL_CHUNK, |(k, _)| self.running[k].chunk);
        let mut idx = Vec::new();
        let mut steps = Vec::new();
        let mut shape = StepShape::default();
        for r in self.running.iter_mut() {
            if !r.prompt_left && !r.drafts.is_empty() {
                // the verify span: the pending token, then the drafts
                let d = std::mem::take(&mut r.drafts);
                r.pending.extend_from_slice(&d);
                r.drafts = d;
            }
        }
        for (k, (r, &n)) in self.running.iter_mut().zip(take).enumerate() {
            if n == 0 {
                continue;
            }
            if r.draft.is_some() {
                // a verify rolls back within its span only, to the state before a draft: keep
                // those, none for a prefill chunk or an undrafted row (no copies while paused)
                let k = if r.prompt_left { 0 } else { r.drafts.len() };
                r.session.state_mut().keep_history(k);
            }
            // an MTP drafter reads the final hidden of every row its sequence keeps
            let hidden = r.draft.as_ref().is_some_and(|(d, _)| d.wants_hidden());
            if !r.prompt_left && !r.drafts.is_empty() {
                let n = r.pending.len();
                idx.push((k, n));
                // a greedy verify needs each row's pick alone (a device copies back a token a row)
                let greedy = r.processor.is_none() && r.logprobs.is_none() && r.greedy_bans.is_some();
                let (logits, banned) = if greedy { (LogitsMode::AllArgmax, r.greedy_bans.as_deref().unwrap_or(&[])) } else { (LogitsMode::All, &[][..]) };
                steps.push(SeqStep { state: r.session.state_mut(), tokens: &r.pending[..n], logits, decode_order: true, hidden, banned });
                continue;
            }
            let last_chunk = !r.prompt_left || n == r.pending.len();
            idx.push((k, n));
            if r.prompt_left {
                shape.prompts += 1;
                shape.prompt_tokens += n;
            }
            // a pure-greedy token needs the argmax alone (a device then copies back one id), as
            // does one greedy but for banned tokens (the argmax skips them)
            let greedy = r.processor.is_none() && r.logprobs.is_none() && r.greedy_bans.is_some();
            let mode = match (last_chunk && r.max_tokens > 0, greedy) {
                (false, _) => LogitsMode::None,
                (true, true) => LogitsMode::LastArgmax,
                (true, false) => LogitsMode::Last,
            };
            let mut step = SeqStep::new(r.session.state_mut(), &r.pending[..n], mode);
            step.hidden = hidden;
            if mode == LogitsMode::LastArgmax {
                step.banned = r.greedy_bans.as_deref().unwrap_or(&[]);
            }
            steps.push(step);
        }
        if steps.is_empty() {
            return Ok(None);
        }
        let positions: Vec<usize> = steps.iter().map(|s| s.state.pos).collect();
        let t_step = std::time::Instant::now();
        let outs = match wave {
            // the wave's chunks one after another through each layer (their bits are the
            // steps' one by one); a failed read fails this sequence alone, as in a batch
            Some(_) => {
                let s = &mut steps[0];
                vec![model.forward_chunks(&mut *s.state, s.tokens, wave_chunk, s.logits).map(|logits| SpanOut { logits, hidden: Vec::new(), argmax: None, picks: Vec::new() })]
            }
            None => model.forward_batch_each(&mut steps)?,
        };
        let secs = t_step.elapsed().as_secs_f64();
        shape.rows = idx.iter().map(|&(_, n)| n).sum();
        shape.forward_secs = secs;
        self.last = shape;
        Ok(Some(Ran { idx, outs, positions, secs }))
    }

    /// What the step cost each decoding sequence, for its drafting controller: all of it when
    /// it ran alone, else its share (`cost_table::shares`) once a row's time is known from the
    /// steps so far.
    fn share_step_cost(&mut self, ran: &Ran) {
        let total_rows: usize = ran.idx.iter().map(|&(_, n)| n).sum();
        self.step_costs.observe(total_rows, ran.secs);
        let decoding: Vec<(usize, usize)> = ran.idx.iter().copied().filter(|&(k, _)| !self.running[k].prompt_left).collect();
        let costs: Vec<(usize, usize, f64)> = if ran.idx.len() == 1 {
            decoding.iter().map(|&(k, n)| (k, n, ran.secs)).collect()
        } else if let Some(row_secs) = self.step_costs.row_secs() {
            let extra: Vec<usize> = decoding.iter().map(|&(_, n)| n - 1).collect();
            let other = total_rows - decoding.iter().map(|&(_, n)| n).sum::<usize>();
            decoding.iter().zip(shares(ran.secs, row_secs, &extra, other)).map(|(&(k, n), c)| (k, n, c)).collect()
        } else {
            Vec::new()
        };
        for (k, n, secs) in costs {
            let r = &mut self.running[k];
            if let Some((_, ctl)) = r.draft.as_mut() {
                ctl.observe_cost(n, secs);
                r.spec.time_step(n, secs);
            }
        }
    }

    /// Each sequence's logits become its tokens: a verify's rows sampled against its drafts, a
    /// finished prompt's or a decode row's last row sampled (after its processor), checkpoints
    /// taken, the stop rule applied. Ended sequences leave; failed ones leave without their
    /// session.
    fn postprocess(&mut self, model: &Model, ran: Ran, events: &mut Vec<Event>) -> Result<()> {
        let Ran { idx, mut outs, positions, .. } = ran;
        let mut finished = Vec::new();
        let mut failed = Vec::new();
        for (((k, n), out), pos) in idx.into_iter().zip(outs.iter_mut()).zip(positions) {
            let r = &mut self.running[k];
            let out = match out {
                Ok(out) => out,
                Err(e) => {
                    events.push(Event::Failed { id: r.id, error: e.to_string() });
                    failed.push(r.id);
                    continue;
                }
            };
            let lg = &mut out.logits;
            if !r.drafts.is_empty() {
                let (stop, drafted, accepted) = Self::verify(model, r, n, (lg, &out.picks), &out.hidden, events)?;
                self.tally.record(drafted, accepted);
                r.spec.steps += 1;
                r.spec.tally.record(drafted, accepted);
                if let Some(stop) = stop {
                    events.push(Event::Done { id: r.id, stop, generated: r.generated });
                    finished.push(r.id);
                }
                continue;
            }
            if r.draft.is_some() && !r.prompt_left {
                // a decode step without drafts counts as one of its verify steps
                r.spec.steps += 1;
            }
            if let Some((d, _)) = r.draft.as_mut().filter(|(d, _)| d.wants_hidden()) {
                d.observe(model, pos, &r.pending[..n], &out.hidden)?;
            }
            r.session.record_fed(&r.pending[..n]);
            r.pending.drain(..n);
            if r.checkpoint_at.first() == Some(&r.session.state().pos) {
                let t = std::time::Instant::now();
                r.session.checkpoint();
                self.last.checkpoint_secs += t.elapsed().as_secs_f64();
                r.checkpoint_at.remove(0);
            }
            if r.prompt_left && !r.pending.is_empty() {
                continue;
            }
            r.prompt_left = false;
            if r.max_tokens == 0 {
                // the prompt was all there was to run (a prefill measured, a state warmed)
                events.push(Event::Done { id: r.id, stop: StopReason::Length, generated: 0 });
                finished.push(r.id);
                continue;
            }
            if let Some(p) = r.processor.as_mut() {
                p.process(lg);
            }
            let raw = r.logprobs.map(|_| lg.clone());
            let tok = match out.argmax {
                Some(t) if lg.is_empty() => t,
                _ => r.sampler.sample(lg),
            };
            r.sampler.accept(tok);
            if let (Some(s), Some((_, ctl))) = (r.shadow.take(), r.draft.as_mut()) {
                ctl.observe_shadow(s == tok);
            }
            let done = r.processor.as_mut().is_some_and(|p| !p.accept(tok));
            r.generated += 1;
            let logprobs = raw.zip(r.logprobs).map(|(l, k)| Box::new(TokenLogprobs::of(&l, tok, k)));
            events.push(Event::Token { id: r.id, token: tok, logprobs });
            let stop = StopRule { stop_ids: &r.stop_ids, limit: r.max_tokens }.after(tok, r.generated, done.then_some(StopReason::Constraint));
            match stop {
                Some(stop) => {
                    events.push(Event::Done { id: r.id, stop, generated: r.generated });
                    finished.push(r.id);
                }
                None => r.pending.push(tok),
            }
        }
        for id in finished {
            if let Some(i) = self.running.iter().position(|r| r.id == id) {
                self.end(i);
            }
        }
        for id in failed {
            // its session's state holds part of a step: not for another request
            self.running.retain(|r| r.id != id);
        }
        Ok(())
    }
}

/// What a step's forward gave: per sequence that ran, (running index, rows), its output and
/// its position before the step; the forward's seconds.
struct Ran {
    idx: Vec<(usize, usize)>,
    outs: Vec<Result<SpanOut>>,
    positions: Vec<usize>,
    secs: f64,
}

#[cfg(test)]
mod tests {
    use super::DraftTally;

    #[test]
    fn the_tally_counts_each_draft_position() {
        let mut t = DraftTally::default();
        t.record(3, 1);
        t.record(1, 1);
        t.record(0, 0);
        t.record(4, 4);
        assert_eq!(t.verify_steps, 3, "a step with no drafts is not a verify");
        assert_eq!(t.drafted_at, vec![3, 2, 2, 1]);
        assert_eq!(t.accepted_at, vec![3, 1, 1, 1]);
        assert_eq!((t.drafted(), t.accepted()), (8, 6));
    }
}
