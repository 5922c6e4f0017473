//! Many sequences stepped together through the batched forward (continuous batching): each
//! step runs every decoding sequence's next token and prefill chunks of sequences still taking
//! their prompt, samples for those whose logits came back, and lets sequences join and leave
//! between steps. A sequence's prompt is cut into chunks of `PREFILL_CHUNK` whatever else runs,
//! and the forward is batch-invariant, so each sequence's tokens are those it would get alone
//! (fed in the same chunks) — tested token for token.

use crate::error::{EngineError, Result};
use crate::experts::plan::PREFILL_BATCH;
use crate::model::{LogitsMode, Model, SeqStep};
use crate::runtime::generate::StopReason;
use crate::runtime::sampler::Sampler;
use crate::state::SeqState;

/// Prompt tokens one sequence feeds per step (llama.cpp's micro-batch).
pub const PREFILL_CHUNK: usize = PREFILL_BATCH;

/// Rows one step runs at most on a mapped model (llama.cpp's logical batch, -b 2048).
pub const MAX_STEP_ROWS: usize = 2048;

pub type SeqId = u64;

pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub stop_ids: Vec<u32>,
    pub sampler: Sampler,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A sampled token (stop ids included).
    Token { id: SeqId, token: u32 },
    /// The sequence ended and left the scheduler.
    Done { id: SeqId, stop: StopReason, generated: usize },
}

struct Running {
    id: SeqId,
    state: SeqState,
    /// Prompt tokens not fed yet; once the prompt is in, the one sampled token to feed next.
    pending: Vec<u32>,
    prompt_left: bool,
    sampler: Sampler,
    generated: usize,
    max_tokens: usize,
    stop_ids: Vec<u32>,
}

pub struct Scheduler {
    running: Vec<Running>,
    max_seqs: usize,
    next_id: SeqId,
}

impl Scheduler {
    /// A scheduler of at most `max_seqs` sequences at once.
    pub fn new(max_seqs: usize) -> Scheduler {
        Scheduler { running: Vec::new(), max_seqs: max_seqs.max(1), next_id: 1 }
    }

    pub fn len(&self) -> usize {
        self.running.len()
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
        let id = self.next_id;
        self.next_id += 1;
        self.running.push(Running {
            id,
            state: model.new_state(),
            pending: req.prompt,
            prompt_left: true,
            sampler: req.sampler,
            generated: 0,
            max_tokens: req.max_tokens,
            stop_ids: req.stop_ids,
        });
        Ok(id)
    }

    /// Drop a sequence (a client that went away); false if it is not running.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        let before = self.running.len();
        self.running.retain(|r| r.id != id);
        self.running.len() != before
    }

    /// One batched forward over the running sequences; returns what happened.
    pub fn step(&mut self, model: &Model) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        // sequences with nothing to generate or no room left end before the step
        let max_ctx = model.max_context();
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            let next = if r.prompt_left { r.pending.len().min(PREFILL_CHUNK) } else { 1 };
            let stop = if r.max_tokens == 0 {
                Some(StopReason::Length)
            } else if r.state.pos + next > max_ctx {
                Some(StopReason::ContextFull)
            } else {
                None
            };
            match stop {
                Some(stop) => {
                    events.push(Event::Done { id: r.id, stop, generated: r.generated });
                    self.running.remove(i);
                }
                None => i += 1,
            }
        }
        // decode rows first (one row each), then whole prefill chunks while rows remain: a
        // chunk never shrinks to fit, so a sequence's spans do not depend on the others
        let budget = model.max_batch_rows().min(MAX_STEP_ROWS);
        let mut rows = self.running.iter().filter(|r| !r.prompt_left).count();
        let mut take: Vec<usize> = self.running.iter().map(|r| usize::from(!r.prompt_left)).collect();
        for (t, r) in take.iter_mut().zip(&self.running) {
            if r.prompt_left {
                let chunk = r.pending.len().min(PREFILL_CHUNK);
                if rows + chunk <= budget || rows == 0 {
                    *t = chunk;
                    rows += chunk;
                }
            }
        }
        let mut idx = Vec::new();
        let mut steps = Vec::new();
        for (k, (r, &n)) in self.running.iter_mut().zip(&take).enumerate() {
            if n == 0 {
                continue;
            }
            let last_chunk = !r.prompt_left || n == r.pending.len();
            idx.push((k, n));
            steps.push(SeqStep::new(&mut r.state, &r.pending[..n], if last_chunk { LogitsMode::Last } else { LogitsMode::None }));
        }
        if steps.is_empty() {
            return Ok(events);
        }
        let mut logits = model.forward_batch(&mut steps)?;
        let mut finished = Vec::new();
        for ((k, n), lg) in idx.into_iter().zip(logits.iter_mut()) {
            let r = &mut self.running[k];
            r.pending.drain(..n);
            if r.prompt_left && !r.pending.is_empty() {
                continue;
            }
            r.prompt_left = false;
            let tok = r.sampler.sample(lg);
            r.sampler.accept(tok);
            r.generated += 1;
            events.push(Event::Token { id: r.id, token: tok });
            let stop = if r.stop_ids.contains(&tok) {
                Some(StopReason::StopToken)
            } else if r.generated >= r.max_tokens {
                Some(StopReason::Length)
            } else {
                None
            };
            match stop {
                Some(stop) => {
                    events.push(Event::Done { id: r.id, stop, generated: r.generated });
                    finished.push(r.id);
                }
                None => r.pending.push(tok),
            }
        }
        self.running.retain(|r| !finished.contains(&r.id));
        Ok(events)
    }
}
