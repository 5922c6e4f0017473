//! The engine on a thread of its own, for hosts that take requests from many threads (a
//! server's connections, a binding's callers): `start` moves an `Engine` onto the thread and
//! returns a handle to submit requests through. Each request brings a sink its outputs go to
//! and a cancel flag; a request whose flag is set, or whose sink closed (its client went away),
//! is cancelled before the next step, so its slot is free at once. The thread blocks only when
//! there is nothing to run.

use crate::runtime::engine::{Engine, EngineObserver, EngineRequest, NoObserver, Output, RequestId, StepReport};
use crate::runtime::speculative::DraftTally;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

/// Where a request's outputs go.
pub trait OutputSink: Send {
    /// Delivers one output; a sink whose receiver went away may drop it.
    fn send(&self, out: Output);
    /// The receiver went away: the request is cancelled before the next step.
    fn is_closed(&self) -> bool {
        false
    }
}

impl OutputSink for mpsc::Sender<Output> {
    fn send(&self, out: Output) {
        let _ = mpsc::Sender::send(self, out);
    }
}

struct Submitted {
    req: EngineRequest,
    sink: Box<dyn OutputSink>,
    cancel: Arc<AtomicBool>,
}

enum Msg {
    Request(Box<Submitted>),
    Shutdown,
}

/// Why a request was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    QueueFull,
    ShuttingDown,
}

/// Requests in the system: `in_flight` counts every request from its submit until it ends
/// (queued or running), so a request submitted while a slot is free is never refused because
/// the engine thread has not admitted the one before it yet.
#[derive(Default)]
struct Counts {
    in_flight: AtomicUsize,
    running: AtomicUsize,
}

/// The submitting side's handle on the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Msg>,
    counts: Arc<Counts>,
    queue_limit: usize,
    parallel: usize,
    closed: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Queue a request; refused at once when every slot is busy and `queue_limit` requests
    /// wait. Its outputs go to `sink`; setting `cancel` stops it.
    pub fn submit(&self, req: EngineRequest, sink: Box<dyn OutputSink>, cancel: Arc<AtomicBool>) -> Result<(), SubmitError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        // reserve a place first, so concurrent submits cannot overshoot the limit
        let prev = self.counts.in_flight.fetch_add(1, Ordering::AcqRel);
        if prev >= self.parallel + self.queue_limit {
            self.counts.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::QueueFull);
        }
        if self.tx.send(Msg::Request(Box::new(Submitted { req, sink, cancel }))).is_err() {
            self.counts.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(())
    }

    /// The engine's slots (`Engine::parallel`).
    pub fn parallel(&self) -> usize {
        self.parallel
    }

    /// Requests waiting for a slot.
    pub fn queued(&self) -> usize {
        self.counts.in_flight.load(Ordering::Acquire).saturating_sub(self.counts.running.load(Ordering::Acquire))
    }

    /// Ends every running and queued request with `Output::Shutdown` and stops the thread.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.tx.send(Msg::Shutdown);
    }
}

/// Keeps the handle's running count with the engine's, and passes every count on.
struct Counting {
    counts: Arc<Counts>,
    inner: Box<dyn EngineObserver>,
}

impl EngineObserver for Counting {
    fn load(&mut self, queued: usize, running: usize) {
        self.counts.running.store(running, Ordering::Release);
        self.inner.load(queued, running);
    }
    fn step(&mut self, step: &StepReport) {
        self.inner.step(step);
    }
    fn prefix_hit(&mut self, from_disk: bool) {
        self.inner.prefix_hit(from_disk);
    }
    fn cached_tokens(&mut self, n: usize) {
        self.inner.cached_tokens(n);
    }
    fn cancelled(&mut self) {
        self.inner.cancelled();
    }
    fn drafts(&mut self, tally: &DraftTally) {
        self.inner.drafts(tally);
    }
    fn expert_cache(&mut self, hits: u64, misses: u64) {
        self.inner.expert_cache(hits, misses);
    }
}

/// Starts `engine` on its own thread, counting into `observer` (None: nothing counted); at most
/// `queue_limit` requests wait beyond the slots. Returns the handle and the thread (an error
/// if the system refuses the thread).
pub fn start(mut engine: Engine, queue_limit: usize, observer: Option<Box<dyn EngineObserver>>) -> std::io::Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel();
    let counts = Arc::new(Counts::default());
    let parallel = engine.parallel();
    engine.set_observer(Box::new(Counting { counts: counts.clone(), inner: observer.unwrap_or_else(|| Box::new(NoObserver)) }));
    let handle = EngineHandle { tx, counts: counts.clone(), queue_limit, parallel, closed: Arc::new(AtomicBool::new(false)) };
    let thread = std::thread::Builder::new().name("xwen-engine".into()).spawn(move || EngineLoop { engine, counts, clients: HashMap::new() }.run(rx))?;
    Ok((handle, thread))
}

struct Client {
    sink: Box<dyn OutputSink>,
    cancel: Arc<AtomicBool>,
}

struct EngineLoop {
    engine: Engine,
    counts: Arc<Counts>,
    clients: HashMap<RequestId, Client>,
}

impl EngineLoop {
    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        loop {
            // block only when there is nothing to do
            if !self.engine.has_work() {
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
            let outs = self.engine.step();
            self.deliver(outs);
        }
    }

    /// False on shutdown.
    fn take(&mut self, m: Msg) -> bool {
        match m {
            Msg::Request(s) => {
                let Submitted { req, sink, cancel } = *s;
                let id = self.engine.submit(req);
                self.clients.insert(id, Client { sink, cancel });
                true
            }
            Msg::Shutdown => false,
        }
    }

    fn deliver(&mut self, outs: Vec<(RequestId, Output)>) {
        for (id, out) in outs {
            let last = out.is_last();
            if let Some(c) = self.clients.get(&id) {
                c.sink.send(out);
            }
            if last && self.clients.remove(&id).is_some() {
                self.counts.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Requests that asked to stop or whose receiver went away: a running one hears its
    /// `Done`, a queued one loses its place before it costs any work.
    fn drop_cancelled(&mut self) {
        let gone: Vec<RequestId> = self.clients.iter().filter(|(_, c)| c.cancel.load(Ordering::Acquire) || c.sink.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            let done = self.engine.cancel(id);
            if let Some(c) = self.clients.remove(&id) {
                if let Some(done) = done {
                    c.sink.send(done);
                }
                self.counts.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    fn shutdown(&mut self) {
        let outs = self.engine.shutdown();
        self.deliver(outs);
    }
}
