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
use std::collections::{BTreeSet, HashMap};

/// The lookups of one run and the geometry they come from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// (layer, expert) in the order a decode asks for them.
    pub lookups: Vec<ExpertKey>,
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
}

impl Policy {
    pub const ALL: [Policy; 4] = [Policy::Lru, Policy::Shipped, Policy::StaticTopK, Policy::Belady];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "LRU",
            Policy::Shipped => "shipped",
            Policy::StaticTopK => "static top-k",
            Policy::Belady => "Belady",
        }
    }
}

impl Trace {
    /// A trace from routing records (any order): sorted by (sequence, position, layer), each
    /// record's experts in its selection order.
    pub fn from_routes(routes: &[crate::Route], n_expert: usize, n_used: usize, moe_layers: usize) -> Trace {
        let mut r: Vec<&crate::Route> = routes.iter().collect();
        r.sort_by_key(|x| (x.seq, x.pos, x.layer));
        let lookups = r.iter().flat_map(|x| x.experts.iter().map(move |&e| (x.layer, e))).collect();
        Trace { lookups, n_expert, n_used, moe_layers }
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
        }
    }

    /// Hit rate (0..1) of `policy` with `share` (0..1) of all records cached.
    pub fn hit_rate(&self, policy: Policy, share: f64) -> f64 {
        let slots = (share * self.all_records() as f64).round() as usize;
        self.hits(policy, slots) as f64 / self.lookups.len().max(1) as f64
    }
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
        Trace { lookups, n_expert: 8, n_used: 2, moe_layers: 2 }
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
