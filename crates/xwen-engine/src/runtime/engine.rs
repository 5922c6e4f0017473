//! The engine: one object that owns the model, the slots and the step loop. Requests (token
//! ids, sampling, stop ids, a token limit, a logits processor, message boundaries to cache) are
//! queued with `submit`; each `step` admits queued requests into free slots, runs one batched
//! forward of every running sequence (`Scheduler::step`: plain, drafted and prefill rows
//! together) and turns what happened into each request's outputs, in order: `Started`,
//! `Token`…, then `Done` (with its usage) or `Failed`. `xwen serve` drives it from one thread
//! (`engine_thread`); `xwen chat`, `xwen run`, `xwen bench --parallel` and xwen-embed's
//! `generate_batch` step it themselves. Text (detokenizing, stop strings, the reply's split) is
//! the caller's, in xwen-chat, so the engine needs no tokenizer.

use crate::model::Model;
use crate::runtime::generate::{rate, StopReason};
use crate::runtime::prefix_cache::PrefixCache;
use crate::runtime::sampler::{Sampler, SamplingParams};
use crate::runtime::scheduler::{Event, LogitsProcessor, Request, Scheduler, SeqId, StepShape, TokenLogprobs};
use crate::runtime::slots::{request_drafter, DraftSettings, Picked, Slots};
use crate::runtime::speculative::{DraftTally, Drafter, SpecStats};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// A request's handle in the engine.
pub type RequestId = u64;

/// One generation request: token ids in, token ids out.
pub struct EngineRequest {
    pub prompt: Vec<u32>,
    /// Tokens to sample at most; 0 runs the prompt and samples nothing.
    pub max_tokens: usize,
    pub stop_ids: Vec<u32>,
    pub sampling: SamplingParams,
    /// Report each token's log-probability and this many alternatives.
    pub logprobs: Option<usize>,
    /// A grammar or other constraint on the logits (no drafting with one).
    pub processor: Option<Box<dyn LogitsProcessor>>,
    /// Prompt positions to checkpoint the slot's state at (message boundaries); the last of
    /// them is where the prefix cache keeps the state when the request ends.
    pub checkpoints: Vec<usize>,
    /// Prompt tokens per forward step (a caller's `-ub`); 0: the engine's `PREFILL_CHUNK`.
    pub prefill_chunk: usize,
    /// Report the prompt's progress after each step (`Output::Prefill`).
    pub progress: bool,
    /// The caller's own drafter and the most tokens it drafts a step (None: the engine's
    /// `EngineOptions::draft`, if any). It then follows the slot's session like the engine's
    /// own, and drafts on for later requests that bring none.
    pub draft: Option<(Box<dyn Drafter>, usize)>,
    /// The caller's sampler, continued (a conversation whose sampling goes on from its last
    /// turn) instead of a new one of `sampling`; `Engine::take_sampler` gives it back.
    pub sampler: Option<Sampler>,
    /// A prompt on its own: it starts from an empty state (no slot's or cache's prefix) and no
    /// later request continues it (no checkpoint before its last token), so the prompt runs in
    /// whole chunks with its last token in the last one, as the one-sequence loop (`generate`)
    /// runs it — the same bits as `xwen run` before the engine, whatever the slots held.
    pub one_shot: bool,
}

impl EngineRequest {
    pub fn new(prompt: Vec<u32>, max_tokens: usize, stop_ids: Vec<u32>, sampling: SamplingParams) -> EngineRequest {
        EngineRequest {
            prompt,
            max_tokens,
            stop_ids,
            sampling,
            logprobs: None,
            processor: None,
            checkpoints: Vec::new(),
            prefill_chunk: 0,
            progress: false,
            draft: None,
            sampler: None,
            one_shot: false,
        }
    }
}

/// How one request ran: its times and how its prompt met the slot's state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestStats {
    /// From admission to the first token (the prompt's computed part and the first sample).
    pub prefill_secs: f64,
    /// From the first token to the last.
    pub decode_secs: f64,
    /// The slot's state held tokens past what the prompt shares with it and was rolled back
    /// (to a checkpoint, or to nothing).
    pub restored: bool,
    /// Its drafting, if it drafted.
    pub drafts: Option<SpecStats>,
}

impl RequestStats {
    /// Prompt tokens a second over the prefill (the whole prompt, as `GenStats::prefill_tps`).
    pub fn prefill_tps(&self, usage: &Usage) -> f64 {
        rate(usage.prompt_tokens, self.prefill_secs)
    }

    /// Tokens a second after the first (which comes out of the prefill).
    pub fn decode_tps(&self, usage: &Usage) -> f64 {
        rate(usage.completion_tokens.saturating_sub(1), self.decode_secs)
    }
}


/// What one request consumed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens the slot's state already held (not computed again).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// What a request hears back, in order: Started, Token…, then Done, Failed or Shutdown.
#[derive(Debug)]
pub enum Output {
    /// Admitted into a slot; `cached` prompt tokens were already in its state.
    Started {
        cached: usize,
    },
    /// `done` of the `total` prompt tokens to compute are in (only for requests that ask:
    /// `EngineRequest::progress`; after each step that leaves some still to feed).
    Prefill {
        done: usize,
        total: usize,
    },
    Token {
        id: u32,
        logprobs: Option<Box<TokenLogprobs>>,
    },
    Done {
        stop: StopReason,
        usage: Usage,
        stats: RequestStats,
    },
    /// The engine is shutting down: the reply ends here.
    Shutdown,
    Failed(String),
}

impl Output {
    /// The request's last output.
    pub fn is_last(&self) -> bool {
        matches!(self, Output::Done { .. } | Output::Shutdown | Output::Failed(_))
    }
}

/// What an engine's host may count (a server's metrics); every method has a default that
/// ignores it.
pub trait EngineObserver: Send {
    /// Requests waiting for a slot, and running.
    fn load(&mut self, _queued: usize, _running: usize) {}
    /// One step: what it ran and where its time went.
    fn step(&mut self, _step: &StepReport) {}
    /// A request's prompt found its prefix in the prefix cache.
    fn prefix_hit(&mut self, _from_disk: bool) {}
    /// Prompt tokens a request found in its slot's state.
    fn cached_tokens(&mut self, _n: usize) {}
    /// A request was cancelled (running or queued).
    fn cancelled(&mut self) {}
    /// The drafting tally so far (when the slots draft).
    fn drafts(&mut self, _tally: &DraftTally) {}
    /// The expert cache's hits and misses so far (a streamed model).
    fn expert_cache(&mut self, _hits: u64, _misses: u64) {}
    /// Something went wrong that cost nothing but a cache entry (a prefix-cache file that could
    /// not be written, or was dropped as damaged): the library never prints it, its host may.
    fn note(&mut self, _msg: &str) {}
}

/// One engine step as its observer sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepReport {
    /// Sequences it ran, and the tokens it sampled for them.
    pub sequences: usize,
    pub tokens: u64,
    /// Its seconds, all of it.
    pub secs: f64,
    /// Rows the forward computed, the sequences that fed prompt tokens and how many, the
    /// forward's seconds and the checkpoints' after it (`Scheduler::last_step`).
    pub shape: StepShape,
    /// Seconds in releasing the slots of requests that ended (the prefix cache's copies of
    /// their states: a device state's KV rows read back).
    pub release_secs: f64,
}

/// An observer that counts nothing.
pub struct NoObserver;
impl EngineObserver for NoObserver {}

/// How an engine serves: its slots, how they draft and the prefix cache beyond them.
pub struct EngineOptions {
    /// Sequences decoded together (capped by the sequences the model's RAM plan holds).
    pub parallel: usize,
    /// How the slots draft, for requests without a processor or logprobs (None: they do not).
    pub draft: Option<DraftSettings>,
    /// States at message boundaries, beyond the slots' own.
    pub prefix: Option<PrefixCache>,
}

struct Running {
    req: RequestId,
    seq: SeqId,
    /// The prompt's message boundary (its last checkpoint position), where the prefix cache
    /// keeps the state when the request ends.
    boundary: Option<usize>,
    usage: Usage,
    admitted: Instant,
    first_token: Option<Instant>,
    restored: bool,
    progress: bool,
    /// The caller's sampler goes back to it (`take_sampler`).
    keep_sampler: bool,
}

impl Running {
    fn stats(&self, drafts: Option<SpecStats>) -> RequestStats {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        RequestStats { prefill_secs: first.duration_since(self.admitted).as_secs_f64(), decode_secs: now.duration_since(first).as_secs_f64(), restored: self.restored, drafts }
    }
}

pub struct Engine {
    /// Shared where a host keeps using the model between engines (a binding's calls, a bench's
    /// runs); the engine only reads it.
    model: Arc<Model>,
    parallel: usize,
    sched: Scheduler,
    queue: VecDeque<(RequestId, EngineRequest)>,
    running: Vec<Running>,
    slots: Slots,
    draft: Option<DraftSettings>,
    next_id: RequestId,
    observer: Box<dyn EngineObserver>,
    /// Callers' samplers of ended requests, until taken back.
    samplers: HashMap<RequestId, Sampler>,
}

impl Engine {
    /// An engine over `model` (a `Model`, or an `Arc` the host keeps a handle to).
    pub fn new(model: impl Into<Arc<Model>>, opts: EngineOptions) -> Engine {
        let model = model.into();
        let parallel = opts.parallel.max(1).min(model.max_sequences().max(1));
        // the decode batches the slots will run, made ready before any request waits on them;
        // a failure here comes back at the batch's first use, as the error of its requests
        let _ = model.prepare_decode_batches(parallel);
        Engine {
            sched: Scheduler::new(parallel),
            model,
            parallel,
            queue: VecDeque::new(),
            running: Vec::new(),
            slots: Slots::new(parallel, opts.prefix),
            draft: opts.draft.filter(|d| d.max > 0),
            next_id: 1,
            observer: Box::new(NoObserver),
            samplers: HashMap::new(),
        }
    }

    /// Counts go to `observer` from now on.
    pub fn set_observer(&mut self, observer: Box<dyn EngineObserver>) {
        self.observer = observer;
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Slots: the options' `parallel`, capped by the sequences the model's RAM plan holds.
    pub fn parallel(&self) -> usize {
        self.parallel
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Whether a `step` has anything to do.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.queue.is_empty()
    }

    /// Queue a request; it is admitted at a step when a slot is free.
    pub fn submit(&mut self, req: EngineRequest) -> RequestId {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back((id, req));
        id
    }

    /// The sampler a caller gave request `id` (`EngineRequest::sampler`), as it was when the
    /// request ended.
    pub fn take_sampler(&mut self, id: RequestId) -> Option<Sampler> {
        self.samplers.remove(&id)
    }

    /// The idle slots' sessions forget what they hold (a caller starting a new conversation);
    /// drafters that followed them stay.
    pub fn reset_sessions(&mut self) {
        self.slots.reset_sessions(&self.model);
    }

    /// Stop a request: a running one ends with `Done { stop: Caller }` (returned, its slot is
    /// free at once), a queued one leaves the queue (None). None too for one that already ended.
    pub fn cancel(&mut self, id: RequestId) -> Option<Output> {
        if let Some(i) = self.running.iter().position(|r| r.req == id) {
            let r = self.running.remove(i);
            self.sched.cancel(r.seq);
            let mut ended = self.sched.take_ended(r.seq);
            let stats = r.stats(ended.as_mut().and_then(|e| e.spec.take()));
            self.keep_sampler(&r, ended.as_ref());
            self.slots.release(ended, None);
            self.observer.cancelled();
            return Some(Output::Done { stop: StopReason::Caller, usage: r.usage, stats });
        }
        let before = self.queue.len();
        self.queue.retain(|(q, _)| *q != id);
        if self.queue.len() < before {
            self.observer.cancelled();
        }
        None
    }

    /// One turn of the loop: admit queued requests into free slots, run one batched forward,
    /// and return each request's outputs in order.
    pub fn step(&mut self) -> Vec<(RequestId, Output)> {
        let mut out = self.admit();
        if !self.sched.is_empty() {
            self.run(&mut out);
            self.publish();
        }
        out
    }

    /// Admit queued requests into free slots without running them (their `Started` or
    /// `Failed`): a caller that times its requests' run apart from their states' allocation
    /// (`xwen bench --parallel`, as llama-batched-bench allocates before its clock starts).
    /// `step` admits too.
    pub fn admit(&mut self) -> Vec<(RequestId, Output)> {
        let mut out = Vec::new();
        self.admit_into(&mut out);
        self.publish();
        out
    }

    /// Every running and queued request ends with `Output::Shutdown`; the prefix cache's
    /// states reach the disk.
    pub fn shutdown(&mut self) -> Vec<(RequestId, Output)> {
        let mut out = Vec::new();
        for r in std::mem::take(&mut self.running) {
            self.sched.cancel(r.seq);
            out.push((r.req, Output::Shutdown));
        }
        for (id, _) in std::mem::take(&mut self.queue) {
            out.push((id, Output::Shutdown));
        }
        self.publish();
        self.slots.flush();
        out
    }

    fn keep_sampler(&mut self, r: &Running, ended: Option<&crate::runtime::scheduler::Ended>) {
        if let (true, Some(e)) = (r.keep_sampler, ended) {
            self.samplers.insert(r.req, e.sampler.clone());
        }
    }

    fn publish(&mut self) {
        self.observer.load(self.queue.len(), self.running.len());
        for n in self.slots.take_notes() {
            self.observer.note(&n);
        }
    }

    fn admit_into(&mut self, out: &mut Vec<(RequestId, Output)>) {
        while self.running.len() < self.parallel {
            let Some((id, req)) = self.queue.pop_front() else { break };
            let (session, kept_drafter, picked) = if req.one_shot { self.slots.pick_empty(&self.model) } else { self.slots.pick(&self.model, &req.prompt) };
            // as `Session::prefill` counts it: the state held more than the prompt's head shares
            let head = &req.prompt[..req.prompt.len().saturating_sub(1)];
            let restored = session.tokens().iter().zip(head).take_while(|(a, b)| a == b).count() < session.tokens().len();
            if let Picked::Cache { from_disk } = picked {
                self.observer.prefix_hit(from_disk);
            }
            // the scheduler checkpoints the boundaries before the prompt's last token, and that
            // last position itself (a boundary at the prompt's end is taken there)
            let last = req.prompt.len().saturating_sub(1);
            let boundary = req.checkpoints.iter().map(|&b| b.min(last)).filter(|&b| b > 0).max();
            // drafting where nothing watches each token's logits (a grammar, logprobs)
            let (draft, draft_memory) = match (req.processor.is_none() && req.logprobs.is_none(), req.draft) {
                (true, Some(d)) => (Some(d), None),
                (true, None) => request_drafter(self.draft.as_ref(), kept_drafter).map_or((None, None), |(d, m)| (Some(d), m)),
                (false, _) => (None, None),
            };
            let prompt_tokens = req.prompt.len();
            let keep_sampler = req.sampler.is_some();
            let sampler = req.sampler.unwrap_or_else(|| Sampler::new(req.sampling));
            let sreq = Request {
                session: Some(session),
                logprobs: req.logprobs,
                processor: req.processor,
                checkpoint_at: req.checkpoints,
                draft,
                draft_memory,
                prefill_chunk: req.prefill_chunk,
                checkpoint_last: !req.one_shot,
                ..Request::new(req.prompt, req.max_tokens, req.stop_ids, sampler)
            };
            match self.sched.add(&self.model, sreq) {
                Ok(seq) => {
                    let cached = self.sched.cached_tokens(seq).unwrap_or(0);
                    self.observer.cached_tokens(cached);
                    out.push((id, Output::Started { cached }));
                    let usage = Usage { prompt_tokens, cached_tokens: cached, completion_tokens: 0 };
                    let (admitted, progress) = (Instant::now(), req.progress);
                    self.running.push(Running { req: id, seq, boundary, usage, admitted, first_token: None, restored, progress, keep_sampler });
                }
                Err(e) => {
                    // the session went with the request; a fresh one is made when needed
                    self.slots.lost();
                    out.push((id, Output::Failed(e.to_string())));
                }
            }
        }
    }

    fn run(&mut self, out: &mut Vec<(RequestId, Output)>) {
        let t0 = Instant::now();
        let sequences = self.running.len();
        let events = match self.sched.step(&self.model) {
            Ok(events) => events,
            Err(e) => {
                // an engine error fails every sequence of the step; the slots are rebuilt
                let msg = e.to_string();
                for r in std::mem::take(&mut self.running) {
                    self.sched.cancel(r.seq);
                    let _ = self.sched.take_session(r.seq);
                    self.slots.lost();
                    out.push((r.req, Output::Failed(msg.clone())));
                }
                return;
            }
        };
        if self.draft.is_some() {
            self.observer.drafts(self.sched.draft_tally());
        }
        let mut tokens = 0u64;
        let mut release_secs = 0.0;
        for e in events {
            self.postprocess(e, out, &mut tokens, &mut release_secs);
        }
        for r in self.running.iter().filter(|r| r.progress) {
            if let Some(left) = self.sched.prompt_left(r.seq).filter(|&n| n > 0) {
                let total = r.usage.prompt_tokens - r.usage.cached_tokens;
                out.push((r.req, Output::Prefill { done: total.saturating_sub(left), total }));
            }
        }
        let report = StepReport { sequences, tokens, secs: t0.elapsed().as_secs_f64(), shape: self.sched.last_step(), release_secs };
        self.observer.step(&report);
        if let Some(s) = self.model.expert_cache_stats() {
            self.observer.expert_cache(s.hits, s.misses);
        }
    }

    /// One scheduler event as its request's output; an ended sequence's slot goes back.
    fn postprocess(&mut self, e: Event, out: &mut Vec<(RequestId, Output)>, tokens: &mut u64, release_secs: &mut f64) {
        match e {
            Event::Token { id, token, logprobs } => {
                *tokens += 1;
                if let Some(r) = self.running.iter_mut().find(|r| r.seq == id) {
                    r.usage.completion_tokens += 1;
                    r.first_token.get_or_insert_with(Instant::now);
                    out.push((r.req, Output::Token { id: token, logprobs }));
                }
            }
            Event::Done { id, stop, .. } => {
                let mut boundary = None;
                let mut ended = self.sched.take_ended(id);
                if let Some(i) = self.running.iter().position(|r| r.seq == id) {
                    let r = self.running.remove(i);
                    boundary = r.boundary;
                    let stats = r.stats(ended.as_mut().and_then(|e| e.spec.take()));
                    self.keep_sampler(&r, ended.as_ref());
                    out.push((r.req, Output::Done { stop, usage: r.usage, stats }));
                }
                let t = Instant::now();
                self.slots.release(ended, boundary);
                *release_secs += t.elapsed().as_secs_f64();
            }
            Event::Failed { id, error } => {
                // an expert read this request needed failed: it fails alone, the step's other
                // requests went on (its slot is rebuilt)
                if let Some(i) = self.running.iter().position(|r| r.seq == id) {
                    let r = self.running.remove(i);
                    out.push((r.req, Output::Failed(error)));
                }
                let ended = self.sched.take_ended(id);
                self.slots.release(ended, None);
            }
        }
    }
}
