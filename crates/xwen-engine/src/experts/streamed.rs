//! Routed experts streamed from the GGUF on demand into a cache bounded in bytes: the store
//! that lets a MoE model larger than RAM run (docs/architecture.md "A streamed expert's path"). The trunk stays in
//! the memory map; an expert's gate, up and down matrices are three ranges of the file, read
//! together with direct I/O (`direct_read`) into one buffer the cache owns.
//!
//! Eviction is by use counts then recency, with admission (`expert_cache`). A handle keeps its
//! buffer alive after an eviction (the buffer is shared), so the cache may drop an expert a layer
//! is still using, or serve one uncached; the RAM beyond the cache is then at most the experts
//! one layer holds at once, which the memory plan counts (`memory_plan`).

use crate::experts::direct_read::{AlignedBuf, DirectFile};
use crate::experts::cache::{Cached, ExpertCache};
use crate::error::{EngineError, Result};
pub use crate::experts::store::ExpertCacheStats;
use crate::experts::store::{expert_stacks, ExpertBytes, ExpertHandle, ExpertStore, MatShape};
use crate::weights::Mat;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use crate::experts::cache::ExpertKey;
use crate::experts::prefetch::{GuessScore, PREFETCH_READERS};
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Condvar, Mutex};

pub struct StreamedExperts {
    src: Arc<Source>,
    capacity: u64,
    cache: Arc<Mutex<ExpertCache>>,
    bytes_read: Arc<AtomicU64>,
    /// Experts being read ahead of their layer (`ExpertStore::prefetch`); each goes into the
    /// cache when its read lands.
    in_flight: Arc<InFlight>,
    /// Misses that waited for a read ahead in flight, and experts read ahead.
    waited: AtomicU64,
    /// Experts the layers' lookups read themselves.
    demand_reads: AtomicU64,
    read_ahead: Arc<AtomicU64>,
    /// How right the guesses of each rank have been: how deep to read ahead.
    score: Mutex<GuessScore>,
    /// Where prefetch requests wait for a reader (None without prefetch); closed on drop.
    queue: Option<Arc<GuessQueue>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// Where the experts' bytes are: the GGUF (three ranges per expert) or its packed sidecar (one
/// record). Shared with the prefetch threads.
struct Source {
    file: DirectFile,
    /// The expert-packed sidecar beside the GGUF, where one matches it: one read per miss.
    pack: Option<crate::experts::pack::Pack>,
    /// Why a sidecar beside the GGUF is not used (it does not match), for the caller to say.
    pack_note: Option<String>,
    data_offset: u64,
    /// Per layer: (gate, up, down) stacks; None for layers without experts.
    layers: Vec<Option<[Mat; 3]>>,
}

impl Source {
    /// One expert's gate, up and down, read into one buffer, and their places in it.
    fn read(&self, layer: usize, expert: usize) -> Result<(AlignedBuf, [Range<usize>; 3])> {
        let mats = expert_stacks(&self.layers, layer, expert)?;
        match &self.pack {
            Some(pack) => pack.read(layer, expert),
            None => {
                let ranges: Vec<Range<u64>> = mats
                    .iter()
                    .map(|m| {
                        let b = m.mat_bytes() as u64;
                        let start = self.data_offset + m.info.offset + expert as u64 * b;
                        start..start + b
                    })
                    .collect();
                let (buf, places) = self.file.read_ranges(&ranges).map_err(|e| {
                    EngineError::ExpertStore(format!("reading expert {expert} of layer {layer} from the model file: {e}"))
                })?;
                Ok((buf, places.try_into().expect("three ranges read")))
            }
        }
    }
}

/// Guesses waiting for a prefetch reader: sure ones (`prefetch::SURE_ACCURACY`) first, a
/// marginal one only while no read ahead is in flight.
#[derive(Default)]
struct GuessQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    sure: std::collections::VecDeque<ExpertKey>,
    marginal: std::collections::VecDeque<ExpertKey>,
    /// reads ahead in flight
    busy: usize,
    closed: bool,
}

impl GuessQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, key: ExpertKey, sure: bool) {
        let mut s = self.lock();
        if sure {
            s.sure.push_back(key);
        } else {
            s.marginal.push_back(key);
        }
        self.ready.notify_all();
    }

    /// The next guess for a reader, counted in flight until `done`; None once closed.
    fn take(&self) -> Option<ExpertKey> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return None;
            }
            let next = match s.sure.pop_front() {
                Some(k) => Some(k),
                None if s.busy == 0 => s.marginal.pop_front(),
                None => None,
            };
            if let Some(k) = next {
                s.busy += 1;
                return Some(k);
            }
            s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn done(&self) {
        self.lock().busy -= 1;
        self.ready.notify_all();
    }

    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

/// The experts a prefetch asked for: queued (no reader has taken them yet) or being read. A
/// lookup that misses a queued one takes it over and reads it itself — a queue of guesses must
/// not stand between a layer and its own expert — and waits for one being read.
#[derive(Default)]
struct InFlight {
    keys: Mutex<HashMap<ExpertKey, bool>>, // true: a reader has started it
    landed: Condvar,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ExpertKey, bool>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StreamedExperts {
    /// Experts of `layers` read from the GGUF at `path` (whose tensor data starts at
    /// `data_offset`), cached up to `capacity` bytes.
    /// A sidecar pack beside `path` that matches `gguf` (`experts::pack`) is read instead.
    /// With `prefetch`, reader threads serve `ExpertStore::prefetch`; without, it does nothing.
    /// Up to `recycled` finished reads' buffers are kept for the next reads (`Recycler`).
    #[allow(clippy::too_many_arguments)] // the file, its experts and the cache's three bounds
    pub fn open(path: &Path, gguf: &xwen_gguf::GgufFile, layers: Vec<Option<[Mat; 3]>>, n_used: usize, capacity: u64, prefetch: bool, recycled: usize) -> Result<Self> {
        let data_offset = gguf.data_offset();
        let mut file = DirectFile::open(path)
            .map_err(|e| EngineError::ExpertStore(format!("cannot open {} to stream experts: {e}", path.display())))?;
        file.recycle(recycled);
        // lookups in one token's pass over the layers
        let window = layers.iter().flatten().count() as u64 * n_used as u64;
        let sidecar = crate::experts::pack::sidecar_path(path);
        let (pack, pack_note) = if sidecar.exists() {
            match crate::experts::pack::Pack::open(&sidecar, gguf, &layers) {
                Ok(mut p) => {
                    p.recycle(recycled);
                    (Some(p), None)
                }
                Err(e) => (None, Some(format!("{e}; reading the experts from the GGUF"))),
            }
        } else {
            (None, None)
        };
        let src = Arc::new(Source { file, pack, pack_note, data_offset, layers });
        let bytes_read = Arc::new(AtomicU64::new(0));
        let cache = Arc::new(Mutex::new(ExpertCache::new(capacity, window)));
        let in_flight = Arc::new(InFlight::default());
        let read_ahead = Arc::new(AtomicU64::new(0));
        let queue = Arc::new(GuessQueue::default());
        let readers = (0..if prefetch { PREFETCH_READERS } else { 0 })
            .map(|i| {
                let (src, cache, in_flight, queue) = (src.clone(), cache.clone(), in_flight.clone(), queue.clone());
                let (bytes_read, read_ahead) = (bytes_read.clone(), read_ahead.clone());
                std::thread::Builder::new()
                    .name(format!("xwen-prefetch-{i}"))
                    .spawn(move || prefetch_reader(&src, &cache, &in_flight, [&bytes_read, &read_ahead], &queue))
                    .map_err(|e| EngineError::ExpertStore(format!("cannot start an expert reader thread: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(StreamedExperts {
            src,
            capacity,
            cache,
            bytes_read,
            in_flight,
            waited: AtomicU64::new(0),
            demand_reads: AtomicU64::new(0),
            read_ahead,
            score: Mutex::new(GuessScore::default()),
            queue: prefetch.then_some(queue),
            readers,
        })
    }

    /// RAM one cached expert takes (its three ranges widened to 4 KiB blocks, plus alignment).
    pub fn record_bytes(mats: &[Mat; 3]) -> u64 {
        let b = crate::experts::direct_read::BLOCK;
        mats.iter().map(|m| (m.mat_bytes() as u64).div_ceil(b) * b + b).sum::<u64>() + b
    }

    /// The sidecar in use, if any, and why one beside the GGUF was not (None: none there).
    pub fn pack_status(&self) -> (Option<&Path>, Option<&str>) {
        (self.src.pack.as_ref().map(|p| p.path()), self.src.pack_note.as_deref())
    }

    pub fn stats(&self) -> ExpertCacheStats {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let (hits, misses, evictions) = cache.counters();
        let (used, wasted) = cache.prefetch_counters();
        ExpertCacheStats {
            hits,
            misses,
            evictions,
            prefetch_used: used,
            prefetch_waited: self.waited.load(Ordering::Relaxed),
            prefetch_reads: self.read_ahead.load(Ordering::Relaxed),
            prefetch_wasted: wasted,
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            reads: self.demand_reads.load(Ordering::Relaxed) + self.read_ahead.load(Ordering::Relaxed),
            expert_bytes: self.src.layers.iter().flatten().map(|m| m.iter().map(|x| x.mat_bytes() as u64).sum::<u64>()).max().unwrap_or(0),
            cached_bytes: cache.bytes(),
            capacity_bytes: self.capacity,
            direct_io: self.src.file.is_direct(),
        }
    }

    pub fn reset_stats(&self) {
        self.bytes_read.store(0, Ordering::Relaxed);
        self.waited.store(0, Ordering::Relaxed);
        self.demand_reads.store(0, Ordering::Relaxed);
        self.read_ahead.store(0, Ordering::Relaxed);
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).reset_counters();
    }

    fn mats(&self, layer: usize, expert: usize) -> Result<&[Mat; 3]> {
        expert_stacks(&self.src.layers, layer, expert)
    }

    fn handle(mats: &[Mat; 3], buf: Arc<AlignedBuf>, places: [Range<usize>; 3]) -> ExpertHandle<'static> {
        ExpertHandle { bytes: ExpertBytes::Shared(buf, places), shapes: MatShape::of_expert(mats) }
    }

    /// The cached copy of an expert, its use counted; None on a miss (counted either way).
    fn lookup(&self, layer: usize, expert: usize, mats: &[Mat; 3]) -> Option<ExpertHandle<'static>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.lookup((layer, expert)).map(|c| Self::handle(mats, c.buf.clone(), c.places.clone()))
    }

    /// Reads a missed expert from the file and offers it to the cache (without holding the lock
    /// while reading: two threads missing the same expert both read it, the second insert wins).
    /// One a prefetch is reading is waited for instead; if that read failed, the lookup reads
    /// it itself (and meets the fault itself if it persists).
    fn fetch(&self, layer: usize, expert: usize, mats: &[Mat; 3]) -> Result<ExpertHandle<'static>> {
        let key = (layer, expert);
        {
            let mut reading = self.in_flight.lock();
            if reading.get(&key) == Some(&false) {
                // queued, not started: this lookup reads it (the reader will skip it)
                reading.remove(&key);
            } else if reading.contains_key(&key) {
                while reading.contains_key(&key) {
                    reading = self.in_flight.landed.wait(reading).unwrap_or_else(|p| p.into_inner());
                }
                drop(reading);
                // the reader put it in the cache before it left the in-flight set
                if let Some(c) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get_waited(&key) {
                    self.waited.fetch_add(1, Ordering::Relaxed);
                    return Ok(Self::handle(mats, c.buf.clone(), c.places.clone()));
                }
            }
        }
        // one read of the packed record, or the three ranges of the GGUF
        let (buf, places) = self.src.read(layer, expert)?;
        self.bytes_read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.demand_reads.fetch_add(1, Ordering::Relaxed);
        let buf = Arc::new(buf);
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(key, buf.clone(), places.clone());
        Ok(Self::handle(mats, buf, places))
    }
}

/// A prefetch reader thread: reads the experts asked for into the cache until the store is
/// dropped. A failed read leaves nothing behind: the layer's lookup reads the expert itself.
/// It adds to the store's counts of bytes read and of experts read ahead.
fn prefetch_reader(src: &Source, cache: &Mutex<ExpertCache>, in_flight: &InFlight, [bytes_read, read_ahead]: [&AtomicU64; 2], queue: &GuessQueue) {
    while let Some(key) = queue.take() {
        match in_flight.lock().get_mut(&key) {
            Some(started) => *started = true,
            None => {
                // its layer came first: read it, or routed elsewhere and dropped it
                queue.done();
                continue;
            }
        }
        if let Ok((buf, places)) = src.read(key.0, key.1) {
            bytes_read.fetch_add(buf.len() as u64, Ordering::Relaxed);
            read_ahead.fetch_add(1, Ordering::Relaxed);
            let size = buf.allocated() as u64;
            cache.lock().unwrap_or_else(|p| p.into_inner()).insert_needed(key, size, Cached { buf: Arc::new(buf), places });
        }
        in_flight.lock().remove(&key);
        in_flight.landed.notify_all();
        queue.done();
    }
}

impl Drop for StreamedExperts {
    fn drop(&mut self) {
        // closing the queue ends the readers once their current read is done
        if let Some(q) = &self.queue {
            q.close();
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

impl ExpertStore for StreamedExperts {
    fn expert(&self, layer: usize, expert: usize) -> Result<ExpertHandle<'_>> {
        let mats = self.mats(layer, expert)?;
        match self.lookup(layer, expert, mats) {
            Some(h) => Ok(h),
            None => self.fetch(layer, expert, mats),
        }
    }

    fn experts_each(&self, layer: usize, ids: &[usize]) -> Vec<Result<ExpertHandle<'_>>> {
        let mut out: Vec<Option<Result<ExpertHandle<'_>>>> = (0..ids.len()).map(|_| None).collect();
        let done = self.experts_as_landed(layer, ids, &mut |landed| {
            for (i, h) in landed {
                out[i] = Some(h);
            }
            Ok(())
        });
        // a read that ended without a result (its thread died) is that expert's error
        let lost = |e: &EngineError| Err(e.duplicate());
        out.into_iter()
            .map(|h| h.unwrap_or_else(|| done.as_ref().err().map_or_else(|| Err(EngineError::ExpertStore(format!("a read of layer {layer} gave no result"))), lost)))
            .collect()
    }

    fn experts_as_landed<'s>(&'s self, layer: usize, ids: &[usize], f: &mut dyn FnMut(Vec<(usize, Result<ExpertHandle<'s>>)>) -> Result<()>) -> Result<()> {
        let mut mats: Vec<Option<&[Mat; 3]>> = vec![None; ids.len()];
        let (mut at_hand, mut missed): (Vec<(usize, Result<ExpertHandle<'_>>)>, Vec<usize>) = (Vec::new(), Vec::new());
        for (i, &e) in ids.iter().enumerate() {
            match self.mats(layer, e) {
                Ok(m) => {
                    mats[i] = Some(m);
                    match self.lookup(layer, e, m) {
                        Some(h) => at_hand.push((i, Ok(h))),
                        None => missed.push(i),
                    }
                }
                Err(err) => at_hand.push((i, Err(err))),
            }
        }
        if missed.is_empty() {
            return f(at_hand);
        }
        let fetch = |i: usize| -> Result<ExpertHandle<'static>> {
            let m = mats[i].expect("a missed expert has its matrices");
            self.fetch(layer, ids[i], m)
        };
        if missed.len() == 1 && at_hand.is_empty() {
            // nothing to compute meanwhile: read it on this thread
            return f(vec![(missed[0], fetch(missed[0]))]);
        }
        // one reader thread per missed expert (the disk overlaps the requests: one direct 1.7
        // MB read at a time 0.58 GB/s, four at once 0.90 GB/s on the first VM's disk), each result
        // sent as it lands; the experts at hand are computed while they read
        std::thread::scope(|sc| {
            let (tx, rx) = mpsc::channel();
            for &i in &missed {
                let (tx, fetch) = (tx.clone(), &fetch);
                sc.spawn(move || {
                    let _ = tx.send((i, fetch(i)));
                });
            }
            drop(tx);
            if !at_hand.is_empty() {
                f(at_hand)?;
            }
            let mut left = missed.len();
            while left > 0 {
                let first = rx.recv().map_err(|_| EngineError::ExpertStore(format!("a read of layer {layer} ended without a result")))?;
                let landed: Vec<(usize, Result<ExpertHandle<'static>>)> = std::iter::once(first).chain(rx.try_iter()).collect();
                left -= landed.len();
                f(landed)?;
            }
            Ok(())
        })
    }

    fn streams(&self) -> bool {
        true
    }

    fn prefetch(&self, layer: usize, chosen: &[usize], next: Option<(usize, &[usize])>) {
        let Some(queue) = &self.queue else { return };
        let (layer, ids, sure) = {
            let mut score = self.score.lock().unwrap_or_else(|p| p.into_inner());
            score.routed(layer, chosen);
            let Some((nl, guess)) = next else { return };
            score.guessed(nl, guess);
            let depth = score.depth(guess.len());
            (nl, &guess[..depth], score.sure(depth))
        };
        for (rank, &e) in ids.iter().enumerate() {
            let key = (layer, e);
            if self.mats(layer, e).is_err() || self.cache.lock().unwrap_or_else(|p| p.into_inner()).contains(&key) {
                continue;
            }
            if self.in_flight.lock().insert(key, false).is_some() {
                continue;
            }
            queue.push(key, rank < sure);
        }
    }

    fn routed(&self, layer: usize, chosen: &[usize]) {
        // a queued guess has no waiter (a lookup takes a queued key over); the reader that
        // dequeues a dropped one finds it gone and skips it
        self.in_flight.lock().retain(|&(l, e), started| *started || l != layer || chosen.contains(&e));
    }

    fn resident_bytes(&self) -> u64 {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).bytes()
    }

    fn read_in_all(&self, stop: &dyn Fn() -> bool) -> Result<usize> {
        let mut n = 0;
        for (il, l) in self.src.layers.iter().enumerate() {
            let Some(mats) = l else { continue };
            for e in 0..mats[0].n_mats {
                if stop() {
                    return Ok(n);
                }
                if self.cache.lock().unwrap_or_else(|p| p.into_inner()).contains(&(il, e)) {
                    continue;
                }
                self.fetch(il, e, mats)?;
                n += 1;
            }
        }
        Ok(n)
    }
    fn pack_status(&self) -> (Option<std::path::PathBuf>, Option<String>) {
        let (p, note) = StreamedExperts::pack_status(self);
        (p.map(Path::to_path_buf), note.map(str::to_string))
    }
    fn cache_stats(&self) -> Option<ExpertCacheStats> {
        Some(self.stats())
    }

    fn reset_cache_stats(&self) {
        self.reset_stats()
    }
}

#[cfg(test)]
mod tests {
    use super::GuessQueue;

    #[test]
    fn sure_guesses_go_first_and_a_marginal_one_only_when_no_read_ahead_is_in_flight() {
        let q = GuessQueue::default();
        q.push((1, 7), false);
        q.push((1, 3), true);
        q.push((1, 4), true);
        assert_eq!(q.take(), Some((1, 3)), "sure guesses before the marginal one queued first");
        assert_eq!(q.take(), Some((1, 4)));
        {
            // two reads in flight: the marginal guess waits
            let s = q.lock();
            assert_eq!((s.busy, s.marginal.len()), (2, 1));
        }
        q.done();
        q.done();
        assert_eq!(q.take(), Some((1, 7)), "taken once nothing else is in flight");
        q.done();
        // a reader waiting on an empty queue is woken by close
        std::thread::scope(|sc| {
            let h = sc.spawn(|| q.take());
            q.close();
            assert_eq!(h.join().unwrap(), None);
        });
    }
}
