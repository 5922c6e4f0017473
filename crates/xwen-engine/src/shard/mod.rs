//! A model split across ranks (the GPUs of one host, or threads standing in for them): expert
//! parallelism — what a rank is (`Shard`, its block of experts and its end of the group's
//! `Collective`), the partition and the placement plan. What drives the ranks in lockstep is
//! the runtime's (`runtime::ranks`: `ShardGroup` on this process's CPUs, `DeviceGroup` on
//! devices). Each rank holds the trunk — attention, DeltaNet, the shared expert, embeddings
//! and head, a few GB where the routed experts are tens to hundreds — and its own block of
//! every MoE layer's routed experts; every rank runs every token through the trunk, computes
//! the picks that fall in its block, and one reduction per MoE layer hands every rank all the
//! picks' outputs. Replicating the trunk costs its compute N times but no traffic; splitting it
//! by heads (tensor parallelism) is what a trunk too large for one card would need, and no
//! model of the families xwen runs has one (`ShardPlan` says when that would be).
//!
//! The reduction carries each (row, pick)'s unweighted output, not the weighted sum, and each
//! pick has one owner: every value is its owner's bits plus zeros, so after it each rank forms
//! the weighted sum in the pick order the one-rank model uses, and N ranks' logits are the bits
//! of one (`tests/shard.rs`).

mod collective;
mod plan;

pub use collective::{Collective, LocalGroup};
pub use plan::ShardPlan;

use std::ops::Range;
use std::sync::Arc;

/// Which routed experts each of `ranks` ranks holds: contiguous blocks, as even as the count
/// allows (the first `n_expert % ranks` ranks one more). Routing is close to uniform over a
/// trained model's experts, so equal counts are equal work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertPartition {
    pub n_expert: usize,
    pub ranks: usize,
}

impl ExpertPartition {
    /// The experts of rank `r`.
    pub fn block(&self, r: usize) -> Range<usize> {
        let (base, extra) = (self.n_expert / self.ranks, self.n_expert % self.ranks);
        let start = r * base + r.min(extra);
        start..start + base + usize::from(r < extra)
    }

    /// The rank holding expert `e`.
    pub fn owner(&self, e: usize) -> usize {
        (0..self.ranks).find(|&r| self.block(r).contains(&e)).unwrap_or(self.ranks - 1)
    }
}

/// A rank's place in a sharded model: its end of the group's collective and the experts it
/// computes. A model given one (`Model::join_shard`) computes only its block of each MoE
/// layer's picks and reduces the picks' outputs over the group.
#[derive(Clone)]
pub struct Shard {
    pub comm: Arc<dyn Collective>,
    /// The experts this rank computes, the same block in every MoE layer.
    pub experts: Range<usize>,
}

impl Shard {
    /// Whether this rank computes expert `e`.
    pub fn owns(&self, e: usize) -> bool {
        self.experts.contains(&e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_every_expert_once_and_differ_by_at_most_one() {
        for n_expert in [1, 7, 8, 64, 256, 512] {
            for ranks in 1..=8usize.min(n_expert) {
                let p = ExpertPartition { n_expert, ranks };
                let blocks: Vec<_> = (0..ranks).map(|r| p.block(r)).collect();
                assert_eq!(blocks[0].start, 0);
                assert_eq!(blocks[ranks - 1].end, n_expert);
                for w in blocks.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                let (lo, hi) = (blocks.iter().map(|b| b.len()).min().unwrap(), blocks.iter().map(|b| b.len()).max().unwrap());
                assert!(hi - lo <= 1 && lo >= 1, "{n_expert} over {ranks}: {blocks:?}");
                for e in 0..n_expert {
                    assert!(blocks[p.owner(e)].contains(&e));
                }
            }
        }
    }
}
