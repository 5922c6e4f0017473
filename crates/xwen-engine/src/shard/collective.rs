//! The collective calls the ranks of a sharded model make, behind a trait: NCCL between the GPUs
//! of one host implements it in the CUDA crate; [`LocalGroup`] implements it between threads of
//! one process, so the partitioning and its outputs are tested with N ranks on the CPU (and on
//! one GPU) where no second GPU exists.

use crate::error::{EngineError, Result};
use std::sync::{Arc, Condvar, Mutex};

/// One rank's end of a group of `size` ranks that run the same passes in lockstep and meet in
/// the same collective calls, in the same order.
pub trait Collective: Send + Sync {
    /// This rank's number, 0..size.
    fn rank(&self) -> usize;

    /// Ranks in the group.
    fn size(&self) -> usize;

    /// `buf` summed element-wise over the ranks, into every rank's `buf`, added in rank order
    /// (rank 0's, then 1's, …) so the result's bits do not depend on who arrived first. Every
    /// rank passes a buffer of the same length.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()>;

    /// Gives up on the group (a rank's pass failed and will not reach its next call): every
    /// rank waiting in a collective call, or entering one later, gets an error naming `why`
    /// instead of waiting forever.
    fn abort(&self, why: &str);
}

/// What a round of `LocalGroup::all_reduce_sum` is doing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Ranks are handing in their buffers.
    Gather,
    /// The sum is ready; ranks are copying it out.
    Scatter,
}

struct Round {
    phase: Phase,
    /// Which round this is (a rank waiting for the scatter of its own round, not a later one).
    number: u64,
    /// The ranks' buffers of this round, by rank.
    parts: Vec<Option<Vec<f32>>>,
    /// The sum, once every rank has handed in.
    sum: Vec<f32>,
    /// Ranks yet to copy the sum out.
    readers: usize,
    aborted: Option<String>,
}

struct Shared {
    size: usize,
    round: Mutex<Round>,
    moved: Condvar,
}

/// The in-process group: each rank a thread holding its `LocalGroup`, the reductions done in
/// shared memory. `LocalGroup::new(n)` gives the n ranks' ends.
pub struct LocalGroup {
    rank: usize,
    shared: Arc<Shared>,
}

impl LocalGroup {
    /// The ends of a group of `size` ranks (≥ 1), rank 0 first.
    pub fn new(size: usize) -> Vec<LocalGroup> {
        let size = size.max(1);
        let shared = Arc::new(Shared {
            size,
            round: Mutex::new(Round { phase: Phase::Gather, number: 0, parts: vec![None; size], sum: Vec::new(), readers: 0, aborted: None }),
            moved: Condvar::new(),
        });
        (0..size).map(|rank| LocalGroup { rank, shared: Arc::clone(&shared) }).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Round> {
        // a rank that panicked mid-call leaves the round as it was; `abort` is how it fails
        self.shared.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'g>(&self, g: std::sync::MutexGuard<'g, Round>) -> std::sync::MutexGuard<'g, Round> {
        self.shared.moved.wait(g).unwrap_or_else(|p| p.into_inner())
    }
}

fn aborted(why: &str) -> EngineError {
    EngineError::Collective(format!("the group was aborted: {why}"))
}

impl Collective for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let n = self.shared.size;
        if n == 1 {
            return Ok(());
        }
        let mut g = self.lock();
        // the previous round's sum still being copied out: wait for it to finish
        while g.phase == Phase::Scatter && g.aborted.is_none() {
            g = self.wait(g);
        }
        if let Some(why) = &g.aborted {
            return Err(aborted(why));
        }
        let mine = g.number;
        if g.parts.iter().flatten().any(|p| p.len() != buf.len()) {
            let why = format!("rank {} reduces {} values where another rank reduces a different count", self.rank, buf.len());
            g.aborted = Some(why.clone());
            self.shared.moved.notify_all();
            return Err(EngineError::Collective(why));
        }
        g.parts[self.rank] = Some(buf.to_vec());
        if g.parts.iter().all(|p| p.is_some()) {
            let parts: Vec<Vec<f32>> = g.parts.iter_mut().map(|p| p.take().expect("every part is in")).collect();
            let mut sum = parts[0].clone();
            for p in &parts[1..] {
                for (s, v) in sum.iter_mut().zip(p) {
                    *s += v;
                }
            }
            g.sum = sum;
            g.phase = Phase::Scatter;
            g.readers = n;
            self.shared.moved.notify_all();
        }
        while !(g.phase == Phase::Scatter && g.number == mine) && g.aborted.is_none() {
            g = self.wait(g);
        }
        if let Some(why) = &g.aborted {
            return Err(aborted(why));
        }
        buf.copy_from_slice(&g.sum);
        g.readers -= 1;
        if g.readers == 0 {
            g.phase = Phase::Gather;
            g.number += 1;
            g.sum = Vec::new();
            self.shared.moved.notify_all();
        }
        Ok(())
    }

    fn abort(&self, why: &str) {
        let mut g = self.lock();
        if g.aborted.is_none() {
            g.aborted = Some(format!("rank {}: {why}", self.rank));
        }
        self.shared.moved.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send>(n: usize, f: impl Fn(&LocalGroup) -> T + Sync) -> Vec<T> {
        let ends = LocalGroup::new(n);
        std::thread::scope(|s| {
            let hs: Vec<_> = ends.iter().map(|e| s.spawn(|| f(e))).collect();
            hs.into_iter().map(|h| h.join().expect("a rank thread")).collect()
        })
    }

    #[test]
    fn every_rank_gets_the_sum_in_rank_order_over_many_rounds() {
        for n in [1, 2, 3, 5] {
            let got = run(n, |g| {
                let mut out = Vec::new();
                for round in 0..50 {
                    // values whose sum depends on the order of the adds: the rank-order sum
                    let mut b: Vec<f32> = (0..7).map(|i| ((g.rank() + 1) as f32 * 1e7 + round as f32 + i as f32 * 0.3).recip() * if g.rank() % 2 == 0 { 1.0 } else { -0.999 }).collect();
                    g.all_reduce_sum(&mut b).expect("a round");
                    out.push(b);
                }
                out
            });
            for round in 0..50 {
                let want: Vec<f32> = (0..7)
                    .map(|i| {
                        let mut s = 0.0f32;
                        for r in 0..n {
                            let v = ((r + 1) as f32 * 1e7 + round as f32 + i as f32 * 0.3).recip() * if r % 2 == 0 { 1.0 } else { -0.999 };
                            s = if r == 0 { v } else { s + v };
                        }
                        s
                    })
                    .collect();
                for (r, g) in got.iter().enumerate() {
                    assert_eq!(g[round].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "rank {r} of {n}, round {round}");
                }
            }
        }
    }

    #[test]
    fn an_abort_wakes_the_ranks_waiting_and_fails_later_calls() {
        let got = run(3, |g| {
            if g.rank() == 2 {
                std::thread::sleep(std::time::Duration::from_millis(30));
                g.abort("its pass failed");
                return Err("aborted it".to_string());
            }
            let mut b = vec![1.0f32; 4];
            match g.all_reduce_sum(&mut b) {
                Ok(()) => Ok(()),
                Err(e) => {
                    let mut again = vec![0.0f32; 4];
                    assert!(g.all_reduce_sum(&mut again).is_err(), "a later call fails too");
                    Err(e.to_string())
                }
            }
        });
        for r in &got[..2] {
            let e = r.as_ref().expect_err("the waiting ranks fail");
            assert!(e.contains("rank 2: its pass failed"), "{e}");
        }
    }

    #[test]
    fn buffers_of_different_lengths_are_an_error_not_a_hang() {
        let got = run(2, |g| {
            let mut b = vec![1.0f32; 3 + g.rank()];
            g.all_reduce_sum(&mut b).map_err(|e| e.to_string())
        });
        assert!(got.iter().all(|r| r.is_err()), "{got:?}");
    }
}
