//! The engine thread: owns the model and the scheduler, admits queued jobs into free slots,
//! steps every running sequence in one batched forward (continuous batching), and sends each
//! job its tokens. Slots are `Session`s kept between requests: a new request takes the idle
//! session holding the longest prefix of its prompt, so a conversation's next turn prefills only
//! its new tokens (recurrent state restored from the session's checkpoint where the rendering
//! departs). A job whose client went away (its receiver dropped) or that asked to stop is
//! cancelled before the next step; its slot is free at once.

use crate::metrics::Metrics;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;
use crate::{DraftConfig, DraftSource};
use xwen_engine::{DraftMemory, Drafter, Ended, ModelDrafter, MtpDrafter, NgramDrafter};
use xwen_engine::{Event, LogitsProcessor, Model, PrefixCache, Request, Sampler, SamplingParams, Scheduler, SeqId, Session, StopReason, TokenLogprobs};

/// One generation request as the engine sees it: token ids in, token ids out.
pub struct Job {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub stop_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub logprobs: Option<usize>,
    pub processor: Option<Box<dyn LogitsProcessor>>,
    /// Prompt positions to checkpoint the slot's state at (message boundaries).
    pub checkpoints: Vec<usize>,
    pub out: UnboundedSender<Out>,
    /// Set by the request's side to stop the sequence (a stop string matched).
    pub cancel: Arc<AtomicBool>,
}

/// What a job hears back, in order: Started, Token…, then Done or Failed.
#[derive(Debug)]
pub enum Out {
    /// Admitted into a slot; `cached` prompt tokens were already in its state.
    Started { cached: usize },
    Token { id: u32, logprobs: Option<Box<TokenLogprobs>> },
    Done { stop: StopReason },
    /// The server is shutting down: the reply ends here.
    Shutdown,
    Failed(String),
}

enum Msg {
    Job(Box<Job>),
    Shutdown,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    QueueFull,
    ShuttingDown,
}

/// The request side's handle on the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Msg>,
    counts: Arc<Counts>,
    queue_limit: usize,
    parallel: usize,
    closed: Arc<AtomicBool>,
}

/// Jobs in the system: `in_flight` counts every job from its submit until it ends (queued or
/// running), so a job that is submitted while a slot is free is never refused because the engine
/// thread has not admitted the one before it yet.
#[derive(Default)]
struct Counts {
    in_flight: AtomicUsize,
    running: AtomicUsize,
}

impl EngineHandle {
    /// Queue a job; refused at once when every slot is busy and `queue_limit` jobs wait.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        // reserve a place first, so concurrent submits cannot overshoot the limit
        let prev = self.counts.in_flight.fetch_add(1, Ordering::AcqRel);
        if prev >= self.parallel + self.queue_limit {
            self.counts.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::QueueFull);
        }
        if self.tx.send(Msg::Job(Box::new(job))).is_err() {
            self.counts.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(())
    }

    /// Slots: `start`'s `parallel`, capped by the sequences the model's RAM plan holds.
    pub fn parallel(&self) -> usize {
        self.parallel
    }

    /// Jobs waiting for a slot.
    pub fn queued(&self) -> usize {
        self.counts.in_flight.load(Ordering::Acquire).saturating_sub(self.counts.running.load(Ordering::Acquire))
    }

    /// Ends every running and queued job with `Out::Shutdown` and stops the thread.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.tx.send(Msg::Shutdown);
    }
}

/// A drafter that followed a slot's session, with what its controller learned there.
type KeptDrafter = (Box<dyn Drafter>, Option<DraftMemory>);

/// A request's drafter with its greatest depth, and what a controller learned before (None:
/// a new drafter).
type RequestDrafter = ((Box<dyn Drafter>, usize), Option<DraftMemory>);

struct Slot {
    session: Session,
    /// The drafter of the slot's last request, which followed its session, with what its
    /// controller learned.
    drafter: Option<KeptDrafter>,
    last_used: u64,
}

struct Running {
    id: SeqId,
    out: UnboundedSender<Out>,
    cancel: Arc<AtomicBool>,
    /// The prompt's message boundary (its last checkpoint position), where the prefix cache
    /// keeps the state when the request ends.
    boundary: Option<usize>,
}

/// Starts the engine thread with `parallel` slots; returns its handle and the thread (an error
/// if the system refuses the thread).
pub fn start(
    model: Model,
    parallel: usize,
    queue_limit: usize,
    draft: Option<DraftConfig>,
    prefix: Option<PrefixCache>,
    metrics: Arc<Metrics>,
) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let counts = Arc::new(Counts::default());
    let parallel = parallel.max(1).min(model.max_sequences().max(1));
    let handle = EngineHandle { tx, counts: counts.clone(), queue_limit, parallel, closed: Arc::new(AtomicBool::new(false)) };
    let thread = std::thread::Builder::new()
        .name("xwen-engine".into())
        .spawn(move || EngineLoop::new(model, parallel, draft, prefix, counts, metrics).run(rx))?;
    Ok((handle, thread))
}

struct EngineLoop {
    model: Model,
    parallel: usize,
    sched: Scheduler,
    queue: VecDeque<Box<Job>>,
    counts: Arc<Counts>,
    running: Vec<Running>,
    idle: Vec<Slot>,
    /// Sessions in existence (idle or running), at most `parallel`.
    sessions: usize,
    clock: u64,
    metrics: Arc<Metrics>,
    /// How the slots draft (None: they do not).
    draft: Option<DraftConfig>,
    /// States at message boundaries, beyond the slots' own (RAM, and disk across restarts).
    prefix: Option<PrefixCache>,
}

impl EngineLoop {
    fn new(model: Model, parallel: usize, draft: Option<DraftConfig>, prefix: Option<PrefixCache>, counts: Arc<Counts>, metrics: Arc<Metrics>) -> Self {
        EngineLoop {
            draft: draft.filter(|d| d.max > 0),
            prefix,
            sched: Scheduler::new(parallel),
            model,
            parallel,
            queue: VecDeque::new(),
            counts,
            running: Vec::new(),
            idle: Vec::new(),
            sessions: 0,
            clock: 0,
            metrics,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        loop {
            // block only when there is nothing to do
            if self.running.is_empty() && self.queue.is_empty() {
                match rx.recv() {
                    Ok(m) => {
                        if !self.take(m) {
                            return self.shutdown();
                        }
                    }
                    Err(_) => return,
                }
            }
            while let Ok(m) = rx.try_recv() {
                if !self.take(m) {
                    return self.shutdown();
                }
            }
            self.drop_cancelled();
            self.admit();
            self.publish();
            if self.sched.is_empty() {
                continue;
            }
            self.step();
            self.publish();
        }
    }

    /// False on shutdown.
    fn take(&mut self, m: Msg) -> bool {
        match m {
            Msg::Job(j) => {
                self.queue.push_back(j);
                true
            }
            Msg::Shutdown => false,
        }
    }

    /// The running count for the handle, the load for /metrics.
    fn publish(&self) {
        self.counts.running.store(self.running.len(), Ordering::Release);
        self.metrics.set_load(self.queue.len(), self.running.len());
    }

    /// A job left the system (ended, failed or cancelled).
    fn job_ended(&self) {
        self.counts.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn shutdown(&mut self) {
        for r in std::mem::take(&mut self.running) {
            self.sched.cancel(r.id);
            let _ = r.out.send(Out::Shutdown);
            self.job_ended();
        }
        for j in std::mem::take(&mut self.queue) {
            let _ = j.out.send(Out::Shutdown);
            self.job_ended();
        }
        self.publish();
        // the states written so far reach the disk before the process ends
        if let Some(p) = &self.prefix {
            p.flush();
        }
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            if r.cancel.load(Ordering::Acquire) || r.out.is_closed() {
                let r = self.running.remove(i);
                self.sched.cancel(r.id);
                self.release(r.id, None);
                let _ = r.out.send(Out::Done { stop: StopReason::Caller });
                self.metrics.cancelled.inc();
                self.job_ended();
            } else {
                i += 1;
            }
        }
        // a queued job whose client went away loses its place before it costs any work
        let before = self.queue.len();
        self.queue.retain(|j| !(j.cancel.load(Ordering::Acquire) || j.out.is_closed()));
        for _ in self.queue.len()..before {
            self.metrics.cancelled.inc();
            self.job_ended();
        }
    }

    /// The session of an ended sequence goes back to the idle slots; its state at the prompt's
    /// message `boundary` goes to the prefix cache.
    fn release(&mut self, id: SeqId, boundary: Option<usize>) {
        match self.sched.take_ended(id) {
            Some(Ended { session, drafter, draft_memory }) => {
                let drafter = drafter.map(|d| (d, draft_memory));
                if let (Some(cache), Some(b)) = (self.prefix.as_mut(), boundary) {
                    if let Some((tokens, state)) = session.state_at(b) {
                        cache.insert(&tokens, state);
                    }
                }
                self.clock += 1;
                self.idle.push(Slot { session, drafter, last_used: self.clock });
            }
            None => self.sessions -= 1,
        }
    }

    /// The idle session sharing the longest prefix with `prompt`, or the prefix cache's state
    /// where that holds more of it; on a tie (or none shared), the least recently used, so a long
    /// conversation's slot survives short one-off requests. An idle slot comes with the drafter
    /// that followed its session.
    fn pick_session(&mut self, prompt: &[u32]) -> (Session, Option<KeptDrafter>) {
        let common = |s: &Session| s.tokens().iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let best_idle = self.idle.iter().map(|s| common(&s.session)).max().unwrap_or(0);
        if let Some(hit) = self.prefix.as_mut().and_then(|c| c.lookup(&self.model, prompt, best_idle)) {
            if let Ok(session) = Session::resume(prompt[..hit.len].to_vec(), hit.state) {
                self.metrics.prefix_hits.inc();
                if hit.from_disk {
                    self.metrics.prefix_disk_hits.inc();
                }
                // the resumed state takes a fresh slot, or the least recently used idle one
                if self.sessions < self.parallel {
                    self.sessions += 1;
                } else if let Some(lru) = self.idle.iter().enumerate().min_by_key(|(_, s)| s.last_used).map(|(i, _)| i) {
                    self.idle.swap_remove(lru);
                }
                return (session, None);
            }
        }
        if self.idle.is_empty() {
            self.sessions += 1;
            return (Session::new(&self.model), None);
        }
        let mut best = 0;
        let mut key = (0, u64::MAX);
        for (i, slot) in self.idle.iter().enumerate() {
            let c = common(&slot.session);
            let k = (c, u64::MAX - slot.last_used);
            if i == 0 || k > key {
                best = i;
                key = k;
            }
        }
        // nothing shared: a fresh session if one more fits, so cached conversations stay
        if key.0 == 0 && self.sessions < self.parallel {
            self.sessions += 1;
            return (Session::new(&self.model), None);
        }
        let slot = self.idle.swap_remove(best);
        (slot.session, slot.drafter)
    }

    /// A drafter for a new request: the slot's own where it has one of this kind, else a new one.
    fn drafter(&self, kept: Option<KeptDrafter>) -> Option<RequestDrafter> {
        let cfg = self.draft.as_ref()?;
        let d: Box<dyn Drafter> = match (&cfg.source, kept) {
            (_, Some((d, memory))) => return Some(((d, cfg.max), memory)),
            (DraftSource::Ngram, None) => Box::new(NgramDrafter::default()),
            (DraftSource::Mtp, None) => {
                let mut d = MtpDrafter::new();
                d.p_min = cfg.p_min;
                Box::new(d)
            }
            (DraftSource::Model(m), None) => {
                let mut d = ModelDrafter::new(m.clone(), cfg.max);
                d.p_min = cfg.p_min;
                Box::new(d)
            }
        };
        Some(((d, cfg.max), None))
    }

    fn admit(&mut self) {
        while self.running.len() < self.parallel {
            let Some(job) = self.queue.pop_front() else { break };
            let job = *job;
            let (session, kept_drafter) = self.pick_session(&job.prompt);
            // the scheduler checkpoints the boundaries before the prompt's last token, and that
            // last position itself (a boundary at the prompt's end is taken there)
            let last = job.prompt.len().saturating_sub(1);
            let boundary = job.checkpoints.iter().map(|&b| b.min(last)).filter(|&b| b > 0).max();
            // drafting where nothing watches each token's logits (a grammar, logprobs)
            let (draft, draft_memory) = match job.processor.is_none() && job.logprobs.is_none() {
                true => self.drafter(kept_drafter).map_or((None, None), |(d, m)| (Some(d), m)),
                false => (None, None),
            };
            let req = Request {
                session: Some(session),
                logprobs: job.logprobs,
                processor: job.processor,
                checkpoint_at: job.checkpoints,
                draft,
                draft_memory,
                ..Request::new(job.prompt, job.max_tokens, job.stop_ids, Sampler::new(job.sampling))
            };
            match self.sched.add(&self.model, req) {
                Ok(id) => {
                    let cached = self.sched.cached_tokens(id).unwrap_or(0);
                    self.metrics.cached_tokens.inc_by(cached as u64);
                    let _ = job.out.send(Out::Started { cached });
                    self.running.push(Running { id, out: job.out, cancel: job.cancel, boundary });
                }
                Err(e) => {
                    // the session went with the request; a fresh one is made when needed
                    self.sessions -= 1;
                    let _ = job.out.send(Out::Failed(e.to_string()));
                    self.job_ended();
                }
            }
        }
    }

    fn step(&mut self) {
        let t0 = Instant::now();
        let decoding = self.running.len();
        match self.sched.step(&self.model) {
            Ok(events) => {
                if self.draft.is_some() {
                    self.metrics.set_drafts(self.sched.draft_tally());
                }
                let mut tokens = 0u64;
                for e in events {
                    match e {
                        Event::Token { id, token, logprobs } => {
                            tokens += 1;
                            if let Some(r) = self.running.iter().find(|r| r.id == id) {
                                let _ = r.out.send(Out::Token { id: token, logprobs });
                            }
                        }
                        Event::Done { id, stop, .. } => {
                            let mut boundary = None;
                            if let Some(i) = self.running.iter().position(|r| r.id == id) {
                                let r = self.running.remove(i);
                                boundary = r.boundary;
                                let _ = r.out.send(Out::Done { stop });
                                self.job_ended();
                            }
                            self.release(id, boundary);
                        }
                        Event::Failed { id, error } => {
                            // an expert read this request needed failed: it fails alone, the
                            // step's other requests went on (its slot is rebuilt)
                            if let Some(i) = self.running.iter().position(|r| r.id == id) {
                                let r = self.running.remove(i);
                                let _ = r.out.send(Out::Failed(error));
                                self.job_ended();
                            }
                            self.release(id, None);
                        }
                    }
                }
                self.metrics.record_step(decoding, tokens, t0.elapsed().as_secs_f64());
                if let Some(s) = self.model.expert_cache_stats() {
                    self.metrics.set_expert_cache(s.hits, s.misses);
                }
            }
            Err(e) => {
                // an engine error fails every sequence of the step; the slots are rebuilt
                let msg = e.to_string();
                for r in std::mem::take(&mut self.running) {
                    self.sched.cancel(r.id);
                    let _ = self.sched.take_session(r.id);
                    self.sessions -= 1;
                    let _ = r.out.send(Out::Failed(msg.clone()));
                    self.job_ended();
                }
            }
        }
    }
}
