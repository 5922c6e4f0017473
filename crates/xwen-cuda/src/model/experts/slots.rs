//! A pool's slots: which expert each holds, least recently used first out, and a pass's
//! rounds (`SlotMap::plan_except`).

/// Which expert each slot of a layer's pool holds, and when each was last used.
#[derive(Clone, Debug)]
pub(crate) struct SlotMap {
    slot_of: Vec<i32>,
    expert_in: Vec<i32>,
    last_use: Vec<u64>,
}

/// One round of a layer's experts: the experts to copy up (expert, slot) before it, and each
/// routed (token, slot)'s pool slot, -1 where another round computes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Round {
    pub loads: Vec<(usize, usize)>,
    pub slot_ids: Vec<i32>,
}

impl SlotMap {
    /// Puts expert `e` into the least recently used slot (its old expert out), used at `now`;
    /// the slot. Nothing may be reading that slot (`ExpertCache::read_ahead`).
    pub(crate) fn take_lru(&mut self, e: usize, now: u64) -> usize {
        let victim = (0..self.slots()).min_by_key(|&x| (self.last_use[x], x)).unwrap_or(0);
        if let Ok(old) = usize::try_from(self.expert_in[victim]) {
            self.slot_of[old] = -1;
        }
        self.expert_in[victim] = e as i32;
        self.slot_of[e] = victim as i32;
        self.last_use[victim] = now;
        victim
    }

    /// A pool of `slots` slots for a layer of `n_expert` experts, holding experts 0.. at first.
    pub(crate) fn new(n_expert: usize, slots: usize) -> SlotMap {
        let slots = slots.min(n_expert).max(1);
        let mut slot_of = vec![-1; n_expert];
        for (s, e) in slot_of.iter_mut().enumerate().take(slots) {
            *e = s as i32;
        }
        SlotMap { slot_of, expert_in: (0..slots as i32).collect(), last_use: vec![0; slots] }
    }

    /// (expert, slot) of every slot.
    pub(crate) fn contents(&self) -> Vec<(usize, usize)> {
        self.expert_in.iter().enumerate().filter_map(|(s, &e)| usize::try_from(e).ok().map(|e| (e, s))).collect()
    }

    pub(crate) fn slots(&self) -> usize {
        self.expert_in.len()
    }

    /// The rounds that compute the routed `ids` (expert numbers, k a token), and the slots'
    /// new contents: the experts already held go in the first round, then the missing ones, at
    /// most `slots()` a round; a missing expert takes the least recently used slot that its
    /// round does not need. `tick` orders passes (later: more recent). Errors on an id outside
    /// the layer's experts.
    #[cfg(test)]
    pub(crate) fn plan(&mut self, ids: &[i32], tick: u64) -> std::result::Result<Vec<Round>, String> {
        self.plan_except(ids, tick, &[])
    }

    /// The routed experts not in the pool, each with the routed slots that picked it, in the
    /// order first picked. Errors on an id outside the layer's experts.
    pub(crate) fn missing(&self, ids: &[i32]) -> std::result::Result<Vec<(usize, usize)>, String> {
        let n_expert = self.slot_of.len();
        let mut uses = vec![0usize; n_expert];
        let mut out = Vec::new();
        for &e in ids {
            let Some(ix) = usize::try_from(e).ok().filter(|&x| x < n_expert) else {
                return Err(format!("the router picked expert {e} of {n_expert}"));
            };
            if self.slot_of[ix] < 0 {
                if uses[ix] == 0 {
                    out.push(ix);
                }
                uses[ix] += 1;
            }
        }
        Ok(out.into_iter().map(|e| (e, uses[e])).collect())
    }

    /// `plan`, leaving out the experts `elsewhere` lists (computed by the CPU): never copied
    /// up, their routed slots -1 in every round.
    pub(crate) fn plan_except(&mut self, ids: &[i32], tick: u64, elsewhere: &[usize]) -> std::result::Result<Vec<Round>, String> {
        let n_expert = self.slot_of.len();
        let mut seen = vec![false; n_expert];
        for &e in elsewhere.iter().filter(|&&e| e < n_expert) {
            seen[e] = true;
        }
        let (mut held, mut missing) = (Vec::new(), Vec::new());
        for &e in ids {
            let Some(ix) = usize::try_from(e).ok().filter(|&x| x < n_expert) else {
                return Err(format!("the router picked expert {e} of {n_expert}"));
            };
            if !seen[ix] {
                seen[ix] = true;
                if self.slot_of[ix] >= 0 {
                    held.push(ix);
                } else {
                    missing.push(ix);
                }
            }
        }
        let order: Vec<usize> = held.into_iter().chain(missing).collect();
        let s = self.slots();
        let mut rounds = Vec::with_capacity(order.len().div_ceil(s).max(1));
        let mut in_round = vec![false; n_expert];
        for (r, group) in order.chunks(s.max(1)).enumerate() {
            let now = tick * 1024 + r as u64 + 1;
            let mut busy = vec![false; s];
            for &e in group {
                in_round[e] = true;
                if self.slot_of[e] >= 0 {
                    busy[self.slot_of[e] as usize] = true;
                }
            }
            let mut loads = Vec::new();
            for &e in group {
                if self.slot_of[e] < 0 {
                    let victim = (0..s).filter(|&x| !busy[x]).min_by_key(|&x| (self.last_use[x], x)).expect("a round holds at most `slots` experts");
                    if let Ok(old) = usize::try_from(self.expert_in[victim]) {
                        self.slot_of[old] = -1;
                    }
                    self.expert_in[victim] = e as i32;
                    self.slot_of[e] = victim as i32;
                    busy[victim] = true;
                    loads.push((e, victim));
                }
                self.last_use[self.slot_of[e] as usize] = now;
            }
            let slot_ids = ids.iter().map(|&e| if in_round[e as usize] { self.slot_of[e as usize] } else { -1 }).collect();
            for &e in group {
                in_round[e] = false;
            }
            rounds.push(Round { loads, slot_ids });
        }
        if rounds.is_empty() {
            // every pick computed elsewhere: a round that computes nothing
            rounds.push(Round { loads: vec![], slot_ids: vec![-1; ids.len()] });
        }
        Ok(rounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_experts_are_hits_and_a_miss_takes_the_least_recently_used_slot() {
        let mut m = SlotMap::new(8, 3); // holds 0, 1, 2
        let r = m.plan(&[0, 1], 1).unwrap();
        assert_eq!(r, vec![Round { loads: vec![], slot_ids: vec![0, 1] }]);
        // 2 is the least recently used: 5 takes its slot
        let r = m.plan(&[5, 0], 2).unwrap();
        assert_eq!(r, vec![Round { loads: vec![(5, 2)], slot_ids: vec![2, 0] }]);
        // 1 is now the oldest; 0 and 5 are needed, so 7 takes slot 1
        let r = m.plan(&[0, 7, 5, 7], 3).unwrap();
        assert_eq!(r, vec![Round { loads: vec![(7, 1)], slot_ids: vec![0, 1, 2, 1] }]);
    }

    #[test]
    fn a_pass_wider_than_the_pool_runs_in_rounds_each_slot_once() {
        let mut m = SlotMap::new(16, 4);
        let ids: Vec<i32> = vec![9, 1, 2, 10, 11, 12, 13, 3, 14, 1, 9, 0];
        let rounds = m.plan(&ids, 1).unwrap();
        // distinct: 0, 1, 2, 3 held; 9..14 missing: 10 experts in rounds of 4
        assert_eq!(rounds.len(), 3);
        assert!(rounds[0].loads.is_empty(), "the held experts go first, without copies");
        let mut done = vec![false; ids.len()];
        for r in &rounds {
            let mut live = std::collections::HashMap::new();
            for (i, &s) in r.slot_ids.iter().enumerate() {
                if s >= 0 {
                    assert!(!done[i], "slot {i} computed twice");
                    done[i] = true;
                    // within a round a pool slot holds one expert
                    assert_eq!(*live.entry(s).or_insert(ids[i]), ids[i]);
                }
            }
            assert!(live.len() <= 4);
        }
        assert!(done.iter().all(|&d| d), "every routed slot computed in some round");
    }

    #[test]
    fn a_router_id_outside_the_layer_is_refused() {
        let mut m = SlotMap::new(4, 2);
        assert!(m.plan(&[0, 4], 1).is_err());
        assert!(m.plan(&[-1], 1).is_err());
    }

    #[test]
    fn experts_left_to_the_cpu_are_never_copied_and_their_slots_skipped() {
        let mut m = SlotMap::new(8, 2); // holds 0, 1
        assert_eq!(m.missing(&[0, 5, 6, 5]).unwrap(), vec![(5, 2), (6, 1)]);
        let r = m.plan_except(&[0, 5, 6, 5], 1, &[6]).unwrap();
        assert_eq!(r, vec![Round { loads: vec![(5, 1)], slot_ids: vec![0, 1, -1, 1] }]);
        // all picks elsewhere: one round that computes nothing
        let r = m.plan_except(&[7, 7], 2, &[7]).unwrap();
        assert_eq!(r, vec![Round { loads: vec![], slot_ids: vec![-1, -1] }]);
    }

    #[test]
    fn a_pool_as_large_as_the_layer_never_copies() {
        let mut m = SlotMap::new(6, 6);
        for t in 0..5 {
            let r = m.plan(&[5, 4, 3, 2, 1, 0], t).unwrap();
            assert_eq!(r.len(), 1);
            assert!(r[0].loads.is_empty());
        }
    }
}
