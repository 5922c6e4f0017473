//! Where a sharded model's bytes go (`xwen plan --gpus N`): the trunk on every rank, each MoE
//! layer's routed experts in blocks, one block a rank.

use super::ExpertPartition;
use crate::error::{EngineError, Result};
use crate::memory_plan::human_bytes;
use xwen_gguf::GgufFile;

/// The placement of a model over `ranks` ranks: expert parallel, the trunk replicated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    pub ranks: usize,
    pub partition: ExpertPartition,
    /// Every weight but the routed experts' (each rank holds all of it).
    pub trunk_bytes: u64,
    /// The routed experts' weights, all ranks together.
    pub expert_bytes: u64,
    /// What each rank holds besides weights (KV and state, scratch), 0 where not counted.
    pub per_rank_extra: u64,
}

/// Whether a tensor is a stack of routed experts (`blk.N.ffn_{gate,up,down}_exps.weight`, and
/// their fused or latent forms): what the ranks split.
fn is_routed_stack(name: &str) -> bool {
    name.ends_with("_exps.weight")
}

impl ShardPlan {
    /// The placement of weights totalling `trunk_bytes` + `expert_bytes` (the routed experts,
    /// `n_expert` a layer) over `ranks` ranks, each also holding `per_rank_extra`. Refused where
    /// it cannot split: no routed experts (a dense model needs its trunk split by heads, tensor
    /// parallelism, which xwen does not do), or more ranks than experts.
    pub fn new(ranks: usize, n_expert: usize, trunk_bytes: u64, expert_bytes: u64, per_rank_extra: u64) -> Result<ShardPlan> {
        if ranks == 0 {
            return Err(EngineError::Config("--gpus 0: give one or more".into()));
        }
        if ranks > 1 && (n_expert == 0 || expert_bytes == 0) {
            return Err(EngineError::Config(format!(
                "--gpus {ranks}: this model has no routed experts to split; a dense model would need its layers split by heads (tensor parallelism), which xwen does not do — it runs on one GPU"
            )));
        }
        if ranks > n_expert.max(1) {
            return Err(EngineError::Config(format!("--gpus {ranks}: more ranks than the {n_expert} experts a layer has to split among them")));
        }
        Ok(ShardPlan { ranks, partition: ExpertPartition { n_expert: n_expert.max(1), ranks }, trunk_bytes, expert_bytes, per_rank_extra })
    }

    /// The plan of `file`'s weights as stored (no device layout, nothing else counted).
    pub fn of_file(file: &GgufFile, ranks: usize) -> Result<ShardPlan> {
        let (mut trunk, mut experts, mut n_expert) = (0u64, 0u64, 0usize);
        for t in file.tensors() {
            if is_routed_stack(&t.name) {
                experts += t.n_bytes;
                n_expert = n_expert.max(t.dims.get(2).copied().unwrap_or(1) as usize);
            } else {
                trunk += t.n_bytes;
            }
        }
        ShardPlan::new(ranks, n_expert, trunk, experts, 0)
    }

    /// The experts' bytes rank `r` holds.
    pub fn rank_expert_bytes(&self, r: usize) -> u64 {
        let n = self.partition.n_expert as u128;
        (self.expert_bytes as u128 * self.partition.block(r).len() as u128 / n) as u64
    }

    /// Everything rank `r` holds.
    pub fn rank_bytes(&self, r: usize) -> u64 {
        self.trunk_bytes + self.rank_expert_bytes(r) + self.per_rank_extra
    }

    /// The most any rank holds: what each card must have room for.
    pub fn max_rank_bytes(&self) -> u64 {
        (0..self.ranks).map(|r| self.rank_bytes(r)).max().unwrap_or(0)
    }

    /// Whether every rank fits `card_bytes`; a refusal names the largest rank's parts.
    pub fn check_fits(&self, card_bytes: u64) -> std::result::Result<(), String> {
        let worst = (0..self.ranks).max_by_key(|&r| self.rank_bytes(r)).unwrap_or(0);
        if self.rank_bytes(worst) <= card_bytes {
            return Ok(());
        }
        Err(format!(
            "rank {worst} needs {} (trunk {} + its experts {} + KV, state and scratch {}), more than a card's {}{}",
            human_bytes(self.rank_bytes(worst)),
            human_bytes(self.trunk_bytes),
            human_bytes(self.rank_expert_bytes(worst)),
            human_bytes(self.per_rank_extra),
            human_bytes(card_bytes),
            if self.trunk_bytes > card_bytes { ": the trunk alone does not fit, which would need tensor parallelism (not in xwen)" } else { ": more GPUs split the experts finer" }
        ))
    }

    /// One line a rank: its experts and bytes.
    pub fn lines(&self) -> Vec<String> {
        (0..self.ranks)
            .map(|r| {
                let b = self.partition.block(r);
                format!(
                    "rank {r}: experts {}..{} of {} in every MoE layer ({}) + trunk {} (replicated){} = {}",
                    b.start,
                    b.end,
                    self.partition.n_expert,
                    human_bytes(self.rank_expert_bytes(r)),
                    human_bytes(self.trunk_bytes),
                    if self.per_rank_extra > 0 { format!(" + KV, state and scratch {}", human_bytes(self.per_rank_extra)) } else { String::new() },
                    human_bytes(self.rank_bytes(r))
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_split_the_experts_and_each_holds_the_trunk() {
        let p = ShardPlan::new(3, 256, 4_000, 256_000, 100).unwrap();
        let split: Vec<u64> = (0..3).map(|r| p.rank_expert_bytes(r)).collect();
        assert_eq!(split, vec![86_000, 85_000, 85_000]);
        assert_eq!(p.rank_bytes(0), 4_000 + 86_000 + 100);
        assert_eq!(p.max_rank_bytes(), 90_100);
        assert!(p.check_fits(90_100).is_ok());
        let e = p.check_fits(90_099).unwrap_err();
        assert!(e.contains("rank 0") && e.contains("more GPUs"), "{e}");
        assert!(p.check_fits(3_000).unwrap_err().contains("tensor parallelism"));
    }

    #[test]
    fn a_dense_model_or_too_many_ranks_is_refused_with_the_reason() {
        assert!(ShardPlan::new(1, 0, 1000, 0, 0).is_ok());
        assert!(ShardPlan::new(2, 0, 1000, 0, 0).unwrap_err().to_string().contains("no routed experts"));
        assert!(ShardPlan::new(9, 8, 1000, 8000, 0).unwrap_err().to_string().contains("more ranks than"));
        assert!(ShardPlan::new(0, 8, 1000, 8000, 0).is_err());
    }
}
