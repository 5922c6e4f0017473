//! The VRAM expert cache (`--vram-budget` below the whole model): each MoE layer's routed
//! experts live in a pool of `slots` device slots; all of them stay in host RAM in their device
//! layout (page-locked where the driver allows, so a copy runs at the bus's speed). A pass's
//! router picks the experts on the device; the host reads the picks (one sync a MoE layer),
//! copies the missing experts up into the least recently used slots not needed by the pass, and
//! hands the kernels slot numbers instead of expert numbers. The products are the same kernels
//! on the same bytes, so the logits are those of the model held whole.
//!
//! A pass that needs more experts of a layer than the pool holds (a long prompt, a wide decode
//! batch) runs that layer's experts in rounds of at most `slots` experts: each round's slots
//! computed, the others marked -1 (the kernels skip them), every slot's output where the
//! whole-model pass puts it, then one weighted sum.

use super::*;
use crate::gpu::HostBuf;

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
    /// A pool of `slots` slots for a layer of `n_expert` experts, holding experts 0.. at first.
    pub(crate) fn new(n_expert: usize, slots: usize) -> SlotMap {
        let slots = slots.min(n_expert).max(1);
        let mut slot_of = vec![-1; n_expert];
        for (s, e) in slot_of.iter_mut().enumerate().take(slots) {
            *e = s as i32;
        }
        SlotMap { slot_of, expert_in: (0..slots as i32).collect(), last_use: vec![0; slots] }
    }

    pub(crate) fn slots(&self) -> usize {
        self.expert_in.len()
    }

    /// The rounds that compute the routed `ids` (expert numbers, k a token), and the slots'
    /// new contents: the experts already held go in the first round, then the missing ones, at
    /// most `slots()` a round; a missing expert takes the least recently used slot that its
    /// round does not need. `tick` orders passes (later: more recent). Errors on an id outside
    /// the layer's experts.
    pub(crate) fn plan(&mut self, ids: &[i32], tick: u64) -> std::result::Result<Vec<Round>, String> {
        let n_expert = self.slot_of.len();
        let mut seen = vec![false; n_expert];
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
            rounds.push(Round { loads: vec![], slot_ids: vec![] });
        }
        Ok(rounds)
    }
}

/// Counts since load: experts a pass found in VRAM, experts copied up, bytes copied, rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertCacheStats {
    pub slots: usize,
    pub n_expert: usize,
    pub hits: u64,
    pub loads: u64,
    pub bytes_up: u64,
    pub rounds: u64,
    /// Whether the host copy is page-locked (copies at the bus's speed).
    pub pinned: bool,
}

impl ExpertCacheStats {
    pub fn hit_rate(&self) -> f64 {
        let all = self.hits + self.loads;
        if all == 0 {
            0.0
        } else {
            self.hits as f64 / all as f64
        }
    }
}

/// A layer's experts in host RAM, gate, up and down each a stack in the device layout.
pub(super) struct HostExperts {
    mats: [HostBuf; 3],
    mat_bytes: [usize; 3],
}

/// The pools' bookkeeping and the host copies of every MoE layer's experts.
pub(super) struct ExpertCache {
    maps: std::sync::Mutex<(Vec<Option<SlotMap>>, u64, ExpertCacheStats)>,
    host: Vec<Option<HostExperts>>,
}

impl ExpertCache {
    /// The host copies of `experts` (per layer, None for a dense one) and pools of `slots`.
    pub(super) fn new(gpu: &Gpu, file: &GgufFile, experts: &[Option<[Mat; 3]>], n_expert: usize, slots: usize) -> Result<ExpertCache> {
        let mut host = Vec::with_capacity(experts.len());
        let mut maps = Vec::with_capacity(experts.len());
        let mut pinned = true;
        for ex in experts {
            let Some(ex) = ex else {
                host.push(None);
                maps.push(None);
                continue;
            };
            let mut one = |m: &Mat| -> Result<(HostBuf, usize)> {
                let data = crate::layout::device_layout(m.ty, file.tensor_data(&m.info));
                let mut buf = gpu.host_buf(data.len())?;
                buf.bytes_mut().copy_from_slice(&data);
                pinned &= buf.pinned();
                Ok((buf, data.len() / m.n_mats.max(1)))
            };
            let (g, gb) = one(&ex[0])?;
            let (u, ub) = one(&ex[1])?;
            let (d, db) = one(&ex[2])?;
            host.push(Some(HostExperts { mats: [g, u, d], mat_bytes: [gb, ub, db] }));
            maps.push(Some(SlotMap::new(n_expert, slots)));
        }
        let stats = ExpertCacheStats { slots, n_expert, pinned, ..Default::default() };
        Ok(ExpertCache { maps: std::sync::Mutex::new((maps, 0, stats)), host })
    }

    /// Fills layer `il`'s pool with the experts its map starts with (0..slots).
    pub(super) fn fill(&self, gpu: &Gpu, il: usize, pool: &Glu) -> Result<()> {
        let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        let Some(Some(map)) = maps.0.get(il) else { return Ok(()) };
        let loads: Vec<(usize, usize)> = map.expert_in.iter().enumerate().map(|(s, &e)| (e as usize, s)).collect();
        drop(maps);
        self.copy_up(gpu, il, pool, &loads).map(|_| ())
    }

    /// The rounds of layer `il` for the routed `ids`, the counts updated.
    pub(super) fn plan(&self, il: usize, ids: &[i32]) -> Result<Vec<Round>> {
        let mut guard = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        let (maps, tick, stats) = &mut *guard;
        *tick += 1;
        let map = maps.get_mut(il).and_then(|m| m.as_mut()).ok_or_else(|| CudaError::Unsupported(format!("layer {il} has no expert pool")))?;
        let rounds = map.plan(ids, *tick).map_err(CudaError::Unsupported)?;
        let distinct = {
            let mut v: Vec<i32> = ids.to_vec();
            v.sort_unstable();
            v.dedup();
            v.len() as u64
        };
        let loads: u64 = rounds.iter().map(|r| r.loads.len() as u64).sum();
        stats.loads += loads;
        stats.hits += distinct - loads;
        stats.rounds += rounds.len() as u64;
        Ok(rounds)
    }

    /// Copies `loads` (expert, slot) of layer `il` into `pool` on the stream; the bytes copied.
    pub(super) fn copy_up(&self, gpu: &Gpu, il: usize, pool: &Glu, loads: &[(usize, usize)]) -> Result<u64> {
        let Some(Some(h)) = self.host.get(il) else {
            return Err(CudaError::Unsupported(format!("layer {il} has no host experts")));
        };
        let mut bytes = 0u64;
        for &(e, s) in loads {
            for (i, m) in [&pool.gate, &pool.up, &pool.down].into_iter().enumerate() {
                let mb = h.mat_bytes[i];
                let src = &h.mats[i].bytes()[e * mb..(e + 1) * mb];
                gpu.write_at(m.buf.ptr + (s * mb) as u64, src)?;
                bytes += mb as u64;
            }
        }
        let mut guard = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        guard.2.bytes_up += bytes;
        Ok(bytes)
    }

    pub(super) fn stats(&self) -> ExpertCacheStats {
        self.maps.lock().unwrap_or_else(|e| e.into_inner()).2
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
    fn a_pool_as_large_as_the_layer_never_copies() {
        let mut m = SlotMap::new(6, 6);
        for t in 0..5 {
            let r = m.plan(&[5, 4, 3, 2, 1, 0], t).unwrap();
            assert_eq!(r.len(), 1);
            assert!(r[0].loads.is_empty());
        }
    }
}
