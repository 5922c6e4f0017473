//! The prefix cache's copies of ended requests' states whose recurrent parts a device still
//! holds (`HostAt::Pending`): read back on a thread of their own, so that a server's step does
//! not wait on tens of MB a request (reading a 35B-A3B's 63 MB of recurrent state into fresh
//! host pages took ~30 ms, a quarter of a loaded server's step time). `Slots` inserts each
//! into the cache once it is read, and waits for one only where a new request's prompt would
//! take it — so what a request finds in the cache is what it found before.

use crate::runtime::prefix_cache::PrefixCache;
use crate::state::{HostAt, SeqState};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

type Job = (Arc<[u32]>, HostAt);
type Done = (Arc<[u32]>, Option<SeqState>);

#[derive(Default)]
pub(crate) struct StateReads {
    /// The reading thread's queue and its answers, made at the first read.
    worker: Option<(Sender<Job>, Receiver<Done>)>,
    /// The tokens of the reads sent and not yet collected.
    pending: Vec<Arc<[u32]>>,
}

impl StateReads {
    /// The host form `at` of the state after `tokens`, read back off this thread and then
    /// inserted into `cache` (`settle`); finished here where no thread can take it.
    pub(crate) fn send(&mut self, tokens: Vec<u32>, at: HostAt, cache: &mut PrefixCache) {
        let tokens: Arc<[u32]> = tokens.into();
        if self.worker.is_none() {
            self.worker = spawn();
        }
        let unsent = match &self.worker {
            Some((tx, _)) => match tx.send((Arc::clone(&tokens), at)) {
                Ok(()) => {
                    self.pending.push(tokens);
                    return;
                }
                Err(e) => e.0 .1,
            },
            None => at,
        };
        if let Ok(st) = unsent.finish() {
            cache.insert(&tokens, st);
        }
    }

    /// The reads done so far inserted into `cache`; then, where `want` is a prompt and the
    /// longest prefix of it that the caller has elsewhere, each pending read that would give
    /// more of that prompt waited for and inserted.
    pub(crate) fn settle(&mut self, cache: &mut PrefixCache, want: Option<(&[u32], usize)>) {
        let Some((_, rx)) = &self.worker else { return };
        let mut done = Vec::new();
        while let Ok(d) = rx.try_recv() {
            done.push(d);
        }
        for d in done {
            self.insert(d, cache);
        }
        while let Some((prompt, have)) = want {
            if !self.pending.iter().any(|t| t.len() > have && t.len() < prompt.len() && prompt.starts_with(t)) {
                break;
            }
            let Some((_, rx)) = &self.worker else { return };
            match rx.recv() {
                Ok(d) => self.insert(d, cache),
                // the thread is gone (it only ends when this does): nothing more will come
                Err(_) => {
                    self.pending.clear();
                    break;
                }
            }
        }
    }

    /// Every pending read waited for and inserted into `cache`.
    pub(crate) fn finish_all(&mut self, cache: &mut PrefixCache) {
        while !self.pending.is_empty() {
            let Some((_, rx)) = &self.worker else { return };
            match rx.recv() {
                Ok(d) => self.insert(d, cache),
                Err(_) => self.pending.clear(),
            }
        }
    }

    /// A finished read into `cache` (a failed one is not kept: a later request recomputes).
    fn insert(&mut self, (tokens, state): Done, cache: &mut PrefixCache) {
        if let Some(i) = self.pending.iter().position(|t| Arc::ptr_eq(t, &tokens)) {
            self.pending.swap_remove(i);
        }
        if let Some(st) = state {
            cache.insert(&tokens, st);
        }
    }
}

/// The reading thread: each job's host form finished in turn, until the queue closes.
fn spawn() -> Option<(Sender<Job>, Receiver<Done>)> {
    let (tx, jobs) = channel::<Job>();
    let (done, rx) = channel::<Done>();
    std::thread::Builder::new()
        .name("xwen-state-reads".into())
        .spawn(move || {
            for (tokens, at) in jobs {
                if done.send((tokens, at.finish().ok())).is_err() {
                    break;
                }
            }
        })
        .ok()?;
    Some((tx, rx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::on_device::DeviceSnapshot;
    use crate::state::{DeltaState, LayerState};
    use crate::{EngineConfig, LogitsMode, Model};
    use std::time::{Duration, Instant};

    /// A device snapshot that takes its time to read back.
    struct SlowSnapshot(Vec<(usize, DeltaState)>);

    impl DeviceSnapshot for SlowSnapshot {
        fn download(&self) -> crate::Result<Vec<(usize, DeltaState)>> {
            std::thread::sleep(Duration::from_millis(800));
            Ok(self.0.clone())
        }
        fn layers(&self) -> Vec<usize> {
            self.0.iter().map(|(i, _)| *i).collect()
        }
        fn bytes(&self) -> usize {
            0
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    #[test]
    fn a_pending_read_is_waited_for_only_by_a_prompt_it_would_serve() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond/qwen3_5/model-q4_k_m.gguf");
        let model = Model::load(&path, &EngineConfig { threads: 1, max_ctx: 128, ..Default::default() }).unwrap();
        let tokens: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % model.n_vocab() as u32).collect();
        let mut st = model.new_state();
        model.forward(&mut st, &tokens, LogitsMode::None).unwrap();
        // the snapshot holds the recurrent states
        let recurrent = st.host_recurrent();
        let mut cache = PrefixCache::new(&model, 1 << 30, None).unwrap();
        let mut reads = StateReads::default();
        reads.send(tokens.clone(), HostAt::Pending { state: st.clone(), snap: Arc::new(SlowSnapshot(recurrent)) }, &mut cache);
        // another conversation's prompt does not wait
        let t0 = Instant::now();
        let other: Vec<u32> = (0..20).map(|i| (i * 11 + 3) % model.n_vocab() as u32).collect();
        reads.settle(&mut cache, Some((&other, 0)));
        assert!(t0.elapsed() < Duration::from_millis(400), "an unrelated prompt waited {:?}", t0.elapsed());
        // nor one the slots already serve further
        let mut longer = tokens.clone();
        longer.extend([1, 2, 3]);
        reads.settle(&mut cache, Some((&longer, 13)));
        assert!(t0.elapsed() < Duration::from_millis(400), "a prompt served further elsewhere waited");
        // one it would serve waits, then finds it
        reads.settle(&mut cache, Some((&longer, 0)));
        let hit = cache.lookup(&model, &longer, 0).expect("the read entered the cache");
        assert_eq!(hit.len, tokens.len());
        assert_eq!(hit.state.layers.len(), st.layers.len());
        for (a, b) in hit.state.layers.iter().zip(&st.layers) {
            if let (LayerState::Delta(a), LayerState::Delta(b)) = (a, b) {
                assert_eq!(a.s, b.s, "the recurrent states are the snapshot's");
            }
        }
        reads.finish_all(&mut cache);
    }
}
