//! The eviction policy of the streamed expert cache: evict the expert expected to be needed
//! furthest ahead, and serve a newcomer uncached when every cached expert is expected sooner
//! (Belady's rule with estimated instead of known futures, and TinyLFU-style admission).
//!
//! Decode visits the MoE layers in the same order every token, so an LRU cache smaller than one
//! token's working set (n_used experts × layers) evicts every expert before its next use and
//! serves no hits at all. Here every lookup counts toward its expert's frequency — cached or
//! not — and the counts halve every `AGING_TOKENS` tokens so the cache follows a shift of topic.
//! An expert's expected next use, in layer steps, is the steps until the pass reaches its layer
//! again plus a token's pass for every further token, a token choosing it with probability p =
//! its share of its layer's uses × the experts a layer uses per token: phase + layers·(1/p − 1).
//! That is the expected reuse distance when routing is independent from token to token, as the
//! trained tiny MoE's is (docs/bench.md "the expert cache by expected reuse distance"), and it ranks two experts of equal
//! popularity by how soon the pass comes back to their layers.
//! Measured on the trained tiny-qwen35moe (`xwen replay`, docs/bench.md "the expert cache by expected reuse distance"): 54–63%
//! hits at 25% cached against 53–62% for the frequency-then-recency order it replaced, 31–37%
//! for LRU, and 58–64% for the static top-k that knows the run's counts in advance.

use crate::experts::direct_read::AlignedBuf;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

/// (layer, expert)
pub type ExpertKey = (usize, usize);

/// Tokens between halvings of the use counts. 32 against 16 before: on the trained tiny MoE's
/// traces the shorter memory made experts of similar popularity trade places on noise
/// (docs/bench.md "reading the next layer's experts ahead; the cache policy retuned").
pub const AGING_TOKENS: u64 = 32;

/// A newcomer displaces a cached expert only if that one is expected at least this much later:
/// estimates from aged counts are noisy, and swapping two experts of nearly equal expected use
/// costs a read for nothing (+1 to +9 points on the tiny MoE's traces, docs/bench.md as above).
pub const ADMIT_MARGIN: f64 = 1.3;

/// A cached expert: its buffer (shared with the handles given out) and the place of its gate, up
/// and down inside it.
pub struct Cached {
    pub buf: Arc<AlignedBuf>,
    pub places: [Range<usize>; 3],
}

/// One cached entry: what it holds, the bytes it counts, when it was last used, and whether it
/// was read ahead (`insert_needed`) and not asked for yet.
struct Slot<P> {
    payload: P,
    size: u64,
    last_use: u64,
    prefetched: bool,
}

/// The policy over any payload: the streamed store keeps `Cached` buffers in it, the replay
/// tool (`experts::replay`) nothing at all — the same decisions either way.
pub struct ExpertCache<P = Cached> {
    map: HashMap<ExpertKey, Slot<P>>,
    bytes: u64,
    capacity: u64,
    /// lookups in one token's pass over the layers (n_used × MoE layers)
    window: u64,
    clock: u64,
    aged: u64,
    freq: HashMap<ExpertKey, u32>,
    /// Σ over a layer's experts of their use counts (aged with them)
    layer_uses: HashMap<usize, u64>,
    /// the MoE layers seen so far, in pass order
    layers: Vec<usize>,
    /// the layer of the latest lookup
    at_layer: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
    /// Prefetched entries asked for, and evicted without being asked for.
    prefetch_used: u64,
    prefetch_wasted: u64,
}

impl ExpertCache<Cached> {
    /// Offers a freshly read expert (its buffer's whole allocation counts); returns whether the
    /// cache kept it.
    pub fn insert(&mut self, key: ExpertKey, buf: Arc<AlignedBuf>, places: [Range<usize>; 3]) -> bool {
        let size = buf.allocated() as u64;
        self.insert_sized(key, size, Cached { buf, places })
    }
}

impl<P> ExpertCache<P> {
    pub fn new(capacity: u64, window: u64) -> ExpertCache<P> {
        ExpertCache {
            map: HashMap::new(),
            bytes: 0,
            capacity,
            window: window.max(1),
            clock: 0,
            aged: 0,
            freq: HashMap::new(),
            layer_uses: HashMap::new(),
            layers: Vec::new(),
            at_layer: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            prefetch_used: 0,
            prefetch_wasted: 0,
        }
    }

    /// Counts a use of `key` and returns its cached copy, if any.
    pub fn lookup(&mut self, key: ExpertKey) -> Option<&P> {
        self.clock += 1;
        let period = self.window * AGING_TOKENS;
        if self.clock / period != self.aged {
            self.aged = self.clock / period;
            self.freq.retain(|_, f| {
                *f /= 2;
                *f > 0
            });
            self.layer_uses.clear();
            for (&(l, _), &f) in &self.freq {
                *self.layer_uses.entry(l).or_insert(0) += f as u64;
            }
        }
        let f = self.freq.entry(key).or_insert(0);
        *f = f.saturating_add(1);
        *self.layer_uses.entry(key.0).or_insert(0) += 1;
        if let Err(i) = self.layers.binary_search(&key.0) {
            self.layers.insert(i, key.0);
        }
        self.at_layer = key.0;
        let now = self.clock;
        match self.map.get_mut(&key) {
            Some(c) => {
                self.hits += 1;
                c.last_use = now;
                self.prefetch_used += std::mem::take(&mut c.prefetched) as u64;
                Some(&c.payload)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Offers an entry of `size` bytes; returns whether the cache kept it. Evicts until it
    /// fits, unless the victim is expected to be needed before the newcomer.
    pub fn insert_sized(&mut self, key: ExpertKey, size: u64, payload: P) -> bool {
        self.place(key, size, payload, false)
    }

    /// Inserts `key` when it fits, evicting victims in order: for a newcomer (`prefetched`
    /// false) only while each victim is expected at least `ADMIT_MARGIN` × later than it; for
    /// an expert read ahead, whatever their estimates. A key already cached keeps its copy
    /// (another thread read it too and got it in first).
    fn place(&mut self, key: ExpertKey, size: u64, payload: P, prefetched: bool) -> bool {
        if self.map.contains_key(&key) {
            return true;
        }
        if size > self.capacity {
            return false;
        }
        let mine = self.next_use(&key);
        while self.bytes + size > self.capacity {
            let Some(victim) = self.victim() else { break };
            if !prefetched && self.next_use(&victim) < mine * ADMIT_MARGIN {
                return false;
            }
            self.evict(&victim);
        }
        self.bytes += size;
        self.map.insert(key, Slot { payload, size, last_use: self.clock, prefetched });
        true
    }

    fn evict(&mut self, key: &ExpertKey) {
        if let Some(c) = self.map.remove(key) {
            self.bytes -= c.size;
            self.evictions += 1;
            self.prefetch_wasted += c.prefetched as u64;
        }
    }

    /// The cached copy of `key` without counting a use: for a lookup that missed while a
    /// prefetch of it was in flight and waited for it. A prefetched entry counts as used.
    pub fn get_waited(&mut self, key: &ExpertKey) -> Option<&P> {
        let c = self.map.get_mut(key)?;
        self.prefetch_used += std::mem::take(&mut c.prefetched) as u64;
        Some(&c.payload)
    }

    /// Prefetched entries asked for and evicted unasked, since creation or the last reset.
    pub fn prefetch_counters(&self) -> (u64, u64) {
        (self.prefetch_used, self.prefetch_wasted)
    }

    /// Inserts an entry read ahead for the next layer (a guess of a rank that has earned it,
    /// `experts::prefetch`): it is expected within a layer step, sooner than anything cached,
    /// so the furthest-expected experts make room whatever their estimates. Returns whether it
    /// is cached (false only when it is larger than the cache).
    pub fn insert_needed(&mut self, key: ExpertKey, size: u64, payload: P) -> bool {
        self.place(key, size, payload, true)
    }

    /// The cached expert expected to be needed furthest ahead; ties to the least recently used.
    /// An expert read ahead for the next layer step, not asked for yet, goes last while that
    /// step can still come (two layer steps of lookups); a wrong guess is then an expert like
    /// any other.
    fn victim(&self) -> Option<ExpertKey> {
        let step = self.window / self.layers.len().max(1) as u64;
        let awaited = |s: &Slot<P>| s.prefetched && self.clock - s.last_use <= 2 * step;
        self.map
            .iter()
            .max_by(|(ka, a), (kb, b)| {
                awaited(b)
                    .cmp(&awaited(a))
                    .then(self.next_use(ka).total_cmp(&self.next_use(kb)))
                    .then(b.last_use.cmp(&a.last_use))
            })
            .map(|(k, _)| *k)
    }

    /// How many layer steps ahead `key` is expected to be needed next: the steps until the pass
    /// reaches its layer again, then a token's pass per further token, a token using it with
    /// probability p = its share of its layer's uses × the experts a layer uses per token.
    fn next_use(&self, key: &ExpertKey) -> f64 {
        let nl = self.layers.len().max(1);
        let pos = |l: usize| self.layers.binary_search(&l).unwrap_or(0);
        let (at, mine) = (pos(self.at_layer), pos(key.0));
        let phase = if mine > at { mine - at } else { nl - at + mine } as f64;
        let per_token = self.window as f64 / nl as f64;
        let total = self.layer_uses.get(&key.0).copied().unwrap_or(0) as f64;
        let p = if total > 0.0 { (per_token * self.uses(key) as f64 / total).clamp(1e-3, 1.0) } else { 1e-3 };
        phase + nl as f64 * (1.0 / p - 1.0)
    }

    fn uses(&self, key: &ExpertKey) -> u32 {
        self.freq.get(key).copied().unwrap_or(0)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// (hits, misses, evictions) since creation or the last `reset_counters`.
    pub fn counters(&self) -> (u64, u64, u64) {
        (self.hits, self.misses, self.evictions)
    }

    pub fn reset_counters(&mut self) {
        (self.hits, self.misses, self.evictions) = (0, 0, 0);
        (self.prefetch_used, self.prefetch_wasted) = (0, 0);
    }

    pub fn contains(&self, key: &ExpertKey) -> bool {
        self.map.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REC: usize = 4096; // AlignedBuf::new(REC) allocates REC + one block

    type ExpertCache = super::ExpertCache<Cached>;

    fn rec() -> (Arc<AlignedBuf>, [Range<usize>; 3]) {
        (Arc::new(AlignedBuf::new(REC)), [0..1, 1..2, 2..3])
    }

    fn rec_bytes() -> u64 {
        rec().0.allocated() as u64
    }

    /// Runs `tokens` decode passes over `layers` layers, each token using `popular` (always) and
    /// one expert that is new every token; returns (hits, misses).
    fn cyclic(cache: &mut ExpertCache, layers: usize, popular: &[usize], tokens: usize) -> (u64, u64) {
        let (mut hits, mut misses) = (0, 0);
        for t in 0..tokens {
            for l in 0..layers {
                for e in popular.iter().copied().chain([100 + t]) {
                    if cache.lookup((l, e)).is_some() {
                        hits += 1;
                    } else {
                        misses += 1;
                        let (b, p) = rec();
                        cache.insert((l, e), b, p);
                    }
                }
            }
        }
        (hits, misses)
    }

    #[test]
    fn popular_experts_survive_a_cache_smaller_than_a_token() {
        // 4 layers × 3 experts per token = 12 lookups; room for 8 records: an LRU would thrash
        let mut c = ExpertCache::new(8 * rec_bytes(), 12);
        let (hits, misses) = cyclic(&mut c, 4, &[1, 2], 40);
        assert_eq!((c.counters().0, c.counters().1), (hits, misses), "the cache counts what the caller saw");
        assert!(c.bytes() <= 8 * rec_bytes());
        // after warm-up every popular lookup hits: 8 popular (layer, expert) pairs fit exactly
        assert!(hits >= 8 * 38, "hits {hits} misses {misses}");
        for l in 0..4 {
            assert!(c.contains(&(l, 1)) && c.contains(&(l, 2)), "popular experts of layer {l} evicted");
        }
    }

    #[test]
    fn a_one_off_expert_does_not_displace_a_popular_one() {
        let mut c = ExpertCache::new(2 * rec_bytes(), 2);
        for _ in 0..5 {
            for e in [1, 2] {
                if c.lookup((0, e)).is_none() {
                    let (b, p) = rec();
                    assert!(c.insert((0, e), b, p));
                }
            }
        }
        assert!(c.lookup((0, 9)).is_none());
        let (b, p) = rec();
        assert!(!c.insert((0, 9), b, p), "a first use displaced an expert used five times");
        assert!(c.contains(&(0, 1)) && c.contains(&(0, 2)) && !c.contains(&(0, 9)));
        assert_eq!(c.counters().2, 0, "no eviction");
    }

    #[test]
    fn use_counts_age_so_the_cache_follows_a_new_topic() {
        // room for one record per layer; expert 1 popular for a long time, then only expert 2
        let mut c = ExpertCache::new(rec_bytes(), 1);
        let mut step = |e: usize| {
            if c.lookup((0, e)).is_none() {
                let (b, p) = rec();
                c.insert((0, e), b, p);
            }
        };
        for _ in 0..200 {
            step(1);
        }
        for _ in 0..200 {
            step(2);
        }
        assert!(c.contains(&(0, 2)), "the new topic's expert never got in");
    }

    /// Two experts equally popular: the one whose layer the pass reaches sooner is kept.
    #[test]
    fn of_equally_popular_experts_the_one_needed_sooner_stays() {
        // 3 layers, one lookup each per token; room for 2 records
        let mut c = ExpertCache::new(2 * rec_bytes(), 3);
        for _ in 0..4 {
            for l in 0..3 {
                if c.lookup((l, 0)).is_none() {
                    let (b, p) = rec();
                    c.insert((l, 0), b, p);
                }
            }
        }
        // the pass is at layer 2: layer 0's expert is needed next, layer 1's after it
        assert!(c.contains(&(0, 0)), "the expert needed next was evicted");
        assert!(c.next_use(&(0, 0)) < c.next_use(&(1, 0)));
    }

    #[test]
    fn a_second_read_of_a_cached_expert_keeps_the_first_copy() {
        // two threads missing the same expert both read it; the later insert must not drop it
        let mut c = ExpertCache::new(2 * rec_bytes(), 1);
        for _ in 0..3 {
            c.lookup((0, 1));
        }
        let (first, p) = rec();
        assert!(c.insert((0, 1), first.clone(), p));
        c.lookup((0, 2));
        let (b, p) = rec();
        assert!(c.insert((0, 2), b, p));
        let (second, p) = rec();
        assert!(c.insert((0, 1), second, p));
        assert_eq!(c.bytes(), 2 * rec_bytes());
        assert!(Arc::ptr_eq(&c.lookup((0, 1)).expect("still cached").buf, &first));
    }

    #[test]
    fn bytes_stay_within_capacity_and_oversized_records_are_refused() {
        let mut c = ExpertCache::new(3 * rec_bytes() + 100, 6);
        for t in 0..50 {
            let (b, p) = rec();
            c.lookup((t % 7, t % 5));
            c.insert((t % 7, t % 5), b, p);
            assert!(c.bytes() <= 3 * rec_bytes() + 100);
        }
        let mut small = ExpertCache::new(10, 1);
        let (b, p) = rec();
        assert!(!small.insert((0, 0), b, p));
        assert_eq!(small.bytes(), 0);
    }
}
