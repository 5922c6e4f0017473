//! Expert-cache policies judged on a routing trace: the hit rate of LRU, of the shipped policy
//! (`experts::cache::ExpertCache`, the same code the streamed store runs) and of Belady's
//! optimum on the same sequence of lookups and the same number of cached experts.
//!
//! A trace is the order in which a run asks for experts: position by position, each MoE layer in
//! turn, the chosen experts in selection order (`Trace::from_routes`) — a decode's order. Every
//! expert record counts as one slot (a model's records are nearly one size), so a cache size is
//! a number of (layer, expert) records. Belady's optimum here may also decline to cache a missed
//! expert (bypass), as the shipped policy's admission does, so it bounds every online policy of
//! that kind from above. Between them sits the static top-k: the k records the trace uses most,
//! each missed once (its first use) and then kept — what a frequency-ordered cache that knew
//! the run's counts from the start would do. Where routing is independent from token to token
//! (the trained tiny MoE's is: an expert used at token t is used at t + 1 as often as its share
//! predicts), no demand-paging policy does better in expectation (Aho, Denning and Ullman's A0);
//! Belady's lead over it is knowledge of the future, which only prediction can buy.

use crate::experts::cache::{ExpertCache, ExpertKey};
use crate::experts::prefetch::GuessScore;
use std::collections::{BTreeSet, HashMap};

/// A MoE routing decision of a forward pass: sequence `seq` of its batch at position `pos`.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub seq: usize,
    pub pos: usize,
    pub layer: usize,
    /// Chosen experts, most probable first, and their renormalized weights.
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
    /// The last chosen expert's probability less the best unchosen one's.
    pub margin: f32,
    /// The next MoE layer and the experts guessed for it from this layer's input (what a
    /// streamed decode prefetches); None where no guess was made (prefill, the last layer).
    pub next_guess: Option<(usize, Vec<usize>)>,
}

/// The lookups of one run and the geometry they come from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// (layer, expert) in the order a decode asks for them.
    pub lookups: Vec<ExpertKey>,
    /// What a streamed decode prefetches, per layer step of a decode: (at, len, guess) —
    /// `lookups[at..at + len]` is the step, `guess` the experts the layer before guessed for
    /// it (`moe::Lookahead`), most likely first. Empty for a trace without guesses
    /// (prefill-only, or written before they were recorded).
    pub prefetch: Vec<(usize, usize, Vec<usize>)>,
    pub n_expert: usize,
    pub n_used: usize,
    /// MoE layers in the model.
    pub moe_layers: usize,
}

/// A cache policy the replay can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Lru,
    /// The streamed store's (expected reuse distance, with admission).
    Shipped,
    /// The k records the trace uses most, cached from their first use (knows the run's counts).
    StaticTopK,
    /// Belady's optimum with bypass: evict (or decline) the expert needed furthest ahead.
    Belady,
    /// What a streamed decode does: the shipped cache, with the layer before's guesses read
    /// into it ahead of their layer as deep as they have earned (`experts::prefetch`); a hit
    /// is an expert in RAM when its layer asks. Not a demand-paging policy (it reads what no
    /// lookup has asked for yet), so Belady's optimum does not bound it.
    ShippedPrefetch,
}

impl Policy {
    /// The policy's name as a JSON key.
    pub fn key(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Shipped => "shipped",
            Policy::StaticTopK => "static_top_k",
            Policy::Belady => "belady",
            Policy::ShippedPrefetch => "shipped_prefetch",
        }
    }

    pub const ALL: [Policy; 5] = [Policy::Lru, Policy::Shipped, Policy::StaticTopK, Policy::Belady, Policy::ShippedPrefetch];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "LRU",
            Policy::Shipped => "shipped",
            Policy::ShippedPrefetch => "shipped + prefetch",
            Policy::StaticTopK => "static top-k",
            Policy::Belady => "Belady",
        }
    }
}

impl Trace {
    /// A trace from routing records (any order): sorted by (sequence, position, layer), each
    /// record's experts in its selection order.
    pub fn from_routes(routes: &[Route], n_expert: usize, n_used: usize, moe_layers: usize) -> Trace {
        let mut r: Vec<&Route> = routes.iter().collect();
        r.sort_by_key(|x| (x.seq, x.pos, x.layer));
        let mut lookups = Vec::new();
        let mut prefetch = Vec::new();
        // guesses by the (sequence, position, layer) they are for
        let mut pending: HashMap<(usize, usize, usize), Vec<usize>> = HashMap::new();
        for x in r {
            if let Some(g) = pending.remove(&(x.seq, x.pos, x.layer)) {
                prefetch.push((lookups.len(), x.experts.len(), g));
            }
            if let Some((nl, g)) = &x.next_guess {
                pending.insert((x.seq, x.pos, *nl), g.clone());
            }
            lookups.extend(x.experts.iter().map(|&e| (x.layer, e)));
        }
        Trace { lookups, prefetch, n_expert, n_used, moe_layers }
    }

    /// Whether the trace holds the guesses a prefetching decode reads ahead.
    pub fn has_guesses(&self) -> bool {
        !self.prefetch.is_empty()
    }

    /// All (layer, expert) records of the model.
    pub fn all_records(&self) -> usize {
        self.n_expert * self.moe_layers
    }

    /// Hits of `policy` with room for `slots` records, out of `self.lookups.len()` lookups.
    pub fn hits(&self, policy: Policy, slots: usize) -> u64 {
        match policy {
            Policy::Lru => lru_hits(&self.lookups, slots),
            Policy::Shipped => shipped_hits(&self.lookups, slots, (self.n_used * self.moe_layers) as u64),
            Policy::StaticTopK => static_top_k_hits(&self.lookups, slots),
            Policy::Belady => belady_hits(&self.lookups, slots),
            Policy::ShippedPrefetch => self.prefetch_replay(slots).hits,
        }
    }

    /// The shipped cache with the decode's prefetch (`Policy::ShippedPrefetch`) in room for
    /// `slots` records: before each decode layer step its guesses are read into the cache as
    /// deep as the streamed store reads them (`experts::prefetch::GuessScore`), then the step's
    /// lookups run. The same cache and score code the store runs; reads land at once here.
    pub fn prefetch_replay(&self, slots: usize) -> PrefetchReplay {
        let mut c: ExpertCache<()> = ExpertCache::new(slots as u64, (self.n_used * self.moe_layers) as u64);
        let mut score = GuessScore::default();
        let mut out = PrefetchReplay::default();
        let mut next = self.prefetch.iter().peekable();
        // the layer step whose guess waits to be judged: (layer, its lookups)
        let mut judge: Option<(usize, std::ops::Range<usize>)> = None;
        for (i, &k) in self.lookups.iter().enumerate() {
            if let Some((layer, r)) = judge.take_if(|(_, r)| i == r.end) {
                let chosen: Vec<usize> = self.lookups[r].iter().map(|&(_, e)| e).collect();
                score.routed(layer, &chosen);
            }
            while let Some((at, len, guess)) = next.next_if(|(at, _, _)| *at <= i) {
                let layer = k.0;
                score.guessed(layer, guess);
                for &e in &guess[..score.depth(guess.len())] {
                    if !c.contains(&(layer, e)) {
                        out.reads += 1;
                        c.insert_needed((layer, e), 1, ());
                    }
                }
                judge = Some((layer, *at..at + len));
            }
            if c.lookup(k).is_some() {
                out.hits += 1;
            } else {
                out.reads += 1;
                c.insert_sized(k, 1, ());
            }
        }
        (out.prefetched_hits, out.wasted) = c.prefetch_counters();
        out
    }

    /// Hit rate (0..1) of `policy` with `share` (0..1) of all records cached.
    pub fn hit_rate(&self, policy: Policy, share: f64) -> f64 {
        let slots = (share * self.all_records() as f64).round() as usize;
        self.hits(policy, slots) as f64 / self.lookups.len().max(1) as f64
    }
}

/// Where a two-tier replay (`Trace::two_tier`) found each lookup, and the bounds Belady's
/// optimum sets on the same trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TwoTier {
    /// Lookups the VRAM cache held.
    pub vram_hits: u64,
    /// Lookups the VRAM cache missed and the RAM cache held (copied up, no disk read).
    pub ram_hits: u64,
    /// Lookups neither held: read from disk into RAM, then copied up.
    pub disk_reads: u64,
    /// Belady's optimum for the VRAM tier alone (its room, every lookup).
    pub belady_vram: u64,
    /// Belady's optimum for one cache with both tiers' room: a bound on the lookups any
    /// two-tier arrangement serves without the disk.
    pub belady_both: u64,
}

impl Trace {
    /// The expert hierarchy of a GPU run larger than its card: a VRAM cache of `vram` records
    /// above a RAM cache of `ram`, each the shipped policy (`ExpertCache`, admission included).
    /// A lookup the VRAM cache misses goes to the RAM cache — which sees only the VRAM tier's
    /// misses, as it would — and from disk where that misses too; the record is then offered to
    /// the VRAM cache (its admission may decline it: the expert is then computed from where it
    /// is). The RAM cache keeps what it copies up (it is the larger tier).
    pub fn two_tier(&self, vram: usize, ram: usize) -> TwoTier {
        let window = (self.n_used * self.moe_layers) as u64;
        let mut v: ExpertCache<()> = ExpertCache::new(vram as u64, window);
        let mut r: ExpertCache<()> = ExpertCache::new(ram as u64, window);
        let mut out = TwoTier::default();
        for &k in &self.lookups {
            if v.lookup(k).is_some() {
                out.vram_hits += 1;
                continue;
            }
            if r.lookup(k).is_some() {
                out.ram_hits += 1;
            } else {
                out.disk_reads += 1;
                r.insert_sized(k, 1, ());
            }
            v.insert_sized(k, 1, ());
        }
        out.belady_vram = belady_hits(&self.lookups, vram);
        out.belady_both = belady_hits(&self.lookups, vram + ram);
        out
    }
}

/// What `Trace::prefetch_replay` counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchReplay {
    /// Lookups the cache held (prefetched ones among them).
    pub hits: u64,
    /// Hits on experts a prefetch had read.
    pub prefetched_hits: u64,
    /// Records read (misses and prefetches), and prefetched ones evicted unasked.
    pub reads: u64,
    pub wasted: u64,
}

fn lru_hits(lookups: &[ExpertKey], slots: usize) -> u64 {
    let mut last: HashMap<ExpertKey, usize> = HashMap::new();
    let mut order: BTreeSet<(usize, ExpertKey)> = BTreeSet::new();
    let mut hits = 0;
    for (t, &k) in lookups.iter().enumerate() {
        if let Some(prev) = last.insert(k, t) {
            order.remove(&(prev, k));
            hits += 1;
        } else if slots == 0 {
            last.remove(&k);
            continue;
        } else if order.len() == slots {
            let (_, old) = order.pop_first().expect("a full cache has a least recent entry");
            last.remove(&old);
        }
        order.insert((t, k));
    }
    hits
}

fn shipped_hits(lookups: &[ExpertKey], slots: usize, window: u64) -> u64 {
    let mut c: ExpertCache<()> = ExpertCache::new(slots as u64, window);
    for &k in lookups {
        if c.lookup(k).is_none() {
            c.insert_sized(k, 1, ());
        }
    }
    c.counters().0
}

fn static_top_k_hits(lookups: &[ExpertKey], slots: usize) -> u64 {
    let mut count: HashMap<ExpertKey, u64> = HashMap::new();
    for &k in lookups {
        *count.entry(k).or_insert(0) += 1;
    }
    let mut c: Vec<u64> = count.into_values().collect();
    c.sort_unstable_by(|a, b| b.cmp(a));
    c.iter().take(slots).map(|n| n - 1).sum()
}

fn belady_hits(lookups: &[ExpertKey], slots: usize) -> u64 {
    // next[t]: the index of the next lookup of lookups[t]'s key (len() if none)
    let n = lookups.len();
    let mut next = vec![n; n];
    let mut seen: HashMap<ExpertKey, usize> = HashMap::new();
    for t in (0..n).rev() {
        if let Some(&u) = seen.get(&lookups[t]) {
            next[t] = u;
        }
        seen.insert(lookups[t], t);
    }
    // cached keys by their next use, furthest last
    let mut cached: HashMap<ExpertKey, usize> = HashMap::new();
    let mut by_next: BTreeSet<(usize, ExpertKey)> = BTreeSet::new();
    let mut hits = 0;
    for (t, &k) in lookups.iter().enumerate() {
        if let Some(at) = cached.remove(&k) {
            by_next.remove(&(at, k));
            hits += 1;
        } else if slots == 0 || next[t] == n {
            continue; // never needed again (or no room at all): not worth a slot
        } else if cached.len() == slots {
            let &(far, victim) = by_next.last().expect("a full cache has a furthest entry");
            if far <= next[t] {
                continue; // every cached expert is needed before this one: bypass
            }
            by_next.remove(&(far, victim));
            cached.remove(&victim);
        }
        if next[t] < n {
            cached.insert(k, next[t]);
            by_next.insert((next[t], k));
        }
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(lookups: Vec<ExpertKey>) -> Trace {
        Trace { lookups, prefetch: Vec::new(), n_expert: 8, n_used: 2, moe_layers: 2 }
    }

    #[test]
    fn perfect_guesses_make_every_miss_ready_and_wrong_ones_cost_reads() {
        // 2 layers × one expert per token, a new expert every token: no cache can hit
        let n_tok = 50;
        let mut tr = Trace { n_expert: 64, n_used: 1, moe_layers: 2, ..Default::default() };
        for t in 0..n_tok {
            for l in 0..2 {
                tr.lookups.push((l, t));
            }
        }
        let slots = 4;
        assert_eq!(tr.hits(Policy::Shipped, slots), 0);
        // guessed right one layer early (layer 1 from layer 0 of the same token)
        let mut right = tr.clone();
        right.prefetch = (0..n_tok).map(|t| (2 * t + 1, 1, vec![t])).collect();
        let r = right.prefetch_replay(slots);
        assert_eq!((r.hits, r.prefetched_hits, r.wasted), (n_tok as u64, n_tok as u64, 0));
        assert_eq!(r.reads, 2 * n_tok as u64, "each record read once, half of them ahead");
        assert!(right.has_guesses() && !tr.has_guesses());
        // guessed wrong: every guess read for nothing
        let mut wrong = tr.clone();
        wrong.prefetch = (0..n_tok).map(|t| (2 * t + 1, 1, vec![100 + t])).collect();
        let w = wrong.prefetch_replay(slots);
        // the first wrong guess is read; judged wrong, the rank is not read ahead again (the
        // wrong record stays cached until a miss needs its room: evicted, or still there)
        assert_eq!((w.hits, w.prefetched_hits, w.reads), (0, 0, 2 * n_tok as u64 + 1));
        assert!(w.wasted <= 1);
    }

    #[test]
    fn belady_bounds_lru_and_shipped_and_all_agree_with_room_for_everything() {
        // a skewed routing: expert 0 of each layer most of the time, then a rotating second one
        let mut l = Vec::new();
        for t in 0..200usize {
            for layer in 0..2 {
                l.push((layer, 0));
                l.push((layer, 1 + (t * 3 + layer) % 7));
            }
        }
        let tr = trace(l);
        for slots in [2, 4, 8, 16] {
            let (lru, shipped, opt) = (tr.hits(Policy::Lru, slots), tr.hits(Policy::Shipped, slots), tr.hits(Policy::Belady, slots));
            assert!(opt >= lru && opt >= shipped, "slots {slots}: Belady {opt} < LRU {lru} or shipped {shipped}");
        }
        // room for all 16 records: everyone misses each record once
        let cold = tr.lookups.iter().collect::<std::collections::HashSet<_>>().len() as u64;
        assert_eq!(cold, 16);
        for p in Policy::ALL {
            assert_eq!(tr.hits(p, 16), tr.lookups.len() as u64 - cold, "{}", p.name());
        }
        // no room: no hits
        for p in Policy::ALL {
            assert_eq!(tr.hits(p, 0), 0, "{}", p.name());
        }
    }

    #[test]
    fn two_tiers_reduce_to_one_and_stay_under_beladys_bounds() {
        // a skewed random trace: 4 layers × 32 experts, 4 a token, popular experts favoured
        let mut s = 12345u64;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as usize
        };
        let mut lookups = Vec::new();
        for _ in 0..400 {
            for l in 0..4 {
                for _ in 0..4 {
                    let e = (next() % 32).min(next() % 32);
                    lookups.push((l, e));
                }
            }
        }
        let tr = Trace { lookups, prefetch: Vec::new(), n_expert: 32, n_used: 4, moe_layers: 4 };
        let n = tr.lookups.len() as u64;
        for (v, r) in [(0, 40), (20, 0), (10, 40), (30, 60), (128, 0)] {
            let t = tr.two_tier(v, r);
            assert_eq!(t.vram_hits + t.ram_hits + t.disk_reads, n, "every lookup served once ({v}, {r})");
            assert!(t.vram_hits <= t.belady_vram, "VRAM hits over Belady's at {v}: {t:?}");
            assert!(t.vram_hits + t.ram_hits <= t.belady_both, "hits over Belady's for both tiers' room ({v}, {r}): {t:?}");
            if v == 0 {
                assert_eq!(t.ram_hits, tr.hits(Policy::Shipped, r), "no VRAM tier: the RAM cache alone");
            }
            if r == 0 {
                assert_eq!(t.vram_hits, tr.hits(Policy::Shipped, v), "no RAM tier: the VRAM cache alone");
            }
        }
        // room for everything in VRAM: only first uses come from disk
        let all = tr.two_tier(128, 0);
        let distinct = tr.lookups.iter().collect::<std::collections::HashSet<_>>().len() as u64;
        assert_eq!(all.disk_reads, distinct);
    }

    #[test]
    fn belady_is_optimal_on_a_small_case() {
        // the textbook sequence with 3 slots: OPT misses 7 of 12 without bypass, fewer with it
        let seq: Vec<ExpertKey> = [1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5].iter().map(|&e| (0, e)).collect();
        let tr = trace(seq);
        let opt = tr.hits(Policy::Belady, 3);
        assert!(opt >= 5, "Belady hits {opt}");
        // LRU on it: 2 hits
        assert_eq!(tr.hits(Policy::Lru, 3), 2);
    }

    #[test]
    fn lru_is_lru() {
        let seq: Vec<ExpertKey> = [1, 2, 1, 3, 2, 1].iter().map(|&e| (0, e)).collect();
        // 2 slots: 1 2 | 1 hit | 3 evicts 2 | 2 miss evicts 1 | 1 miss
        assert_eq!(trace(seq).hits(Policy::Lru, 2), 1);
    }
}
