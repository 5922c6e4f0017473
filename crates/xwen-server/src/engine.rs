//! The server's side of the library's engine thread (`xwen_engine::runtime::engine_thread`):
//! starts it over the served model, delivers each request's outputs into the tokio channel its
//! route reads, and counts the engine's work into `/metrics`. Slots, the queue, prefix reuse,
//! drafting and the step loop are the library's (`xwen_engine::Engine`).

use crate::metrics::Metrics;
use crate::DraftConfig;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;
use xwen_engine::{DraftTally, Engine, EngineObserver, EngineOptions, Model, OutputSink, PrefixCache, StepReport};

pub use xwen_engine::{EngineHandle, Output as Out, SubmitError};

/// A request's outputs into the channel its route awaits; a dropped receiver is a client that
/// went away.
pub struct ChannelSink(pub UnboundedSender<Out>);

impl OutputSink for ChannelSink {
    fn send(&self, out: Out) {
        let _ = self.0.send(out);
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// The engine's counts as Prometheus metrics.
struct MetricsObserver(Arc<Metrics>);

impl EngineObserver for MetricsObserver {
    fn load(&mut self, queued: usize, running: usize) {
        self.0.set_load(queued, running);
    }
    fn step(&mut self, step: &StepReport) {
        self.0.record_step(step);
    }
    fn prefix_hit(&mut self, from_disk: bool) {
        self.0.prefix_hits.inc();
        if from_disk {
            self.0.prefix_disk_hits.inc();
        }
    }
    fn cached_tokens(&mut self, n: usize) {
        self.0.cached_tokens.inc_by(n as u64);
    }
    fn cancelled(&mut self) {
        self.0.cancelled.inc();
    }
    fn drafts(&mut self, tally: &DraftTally) {
        self.0.set_drafts(tally);
    }
    fn expert_cache(&mut self, hits: u64, misses: u64) {
        self.0.set_expert_cache(hits, misses);
    }
    fn note(&mut self, msg: &str) {
        // the server's log is its stderr
        eprintln!("xwen serve: {msg}");
    }
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
    let engine = Engine::new(model, EngineOptions { parallel, draft, prefix });
    xwen_engine::runtime::engine_thread::start(engine, queue_limit, Some(Box::new(MetricsObserver(metrics))))
}
