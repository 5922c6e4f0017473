//! The ranks of a sharded model in one process, driven in lockstep: every pass runs on every
//! rank at once, each rank a thread with its own workers and its own copy of each sequence's
//! state, and they meet in the MoE layers' reductions. Rank 0's logits are the pass's (every
//! rank's are the same bits; a pass checks that they are).

use super::lockstep::{agree, on_ranks, same_bits};
use crate::shard::{Collective, ExpertPartition, LocalGroup, Shard, ShardPlan};
use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::model::{LogitsMode, Model, SeqStep};
use crate::models::SpanOut;
use crate::state::SeqState;
use std::path::Path;
use std::sync::Arc;
use xwen_gguf::GgufFile;

/// A model split over ranks by its routed experts (`crate::shard`), the ranks CPU models.
pub struct ShardGroup {
    ranks: Vec<Model>,
    comms: Vec<Arc<dyn Collective>>,
}

/// One sequence's state in a group: a copy on every rank, all at the same position.
pub struct GroupState {
    pub ranks: Vec<SeqState>,
}

impl GroupState {
    /// Positions the sequence holds.
    pub fn pos(&self) -> usize {
        self.ranks.first().map_or(0, |s| s.pos)
    }
}

/// One sequence's part of a group's batched step (a `SeqStep` on every rank).
pub type GroupStep<'a> = SeqStep<'a, GroupState>;

impl ShardGroup {
    /// `ranks` ranks of the model at `path`, in this process, meeting through a `LocalGroup`;
    /// the file mapped once for all of them, each rank with `cfg`'s threads.
    pub fn load(path: &Path, cfg: &EngineConfig, ranks: usize) -> Result<ShardGroup> {
        let file = Arc::new(Model::open_file(path, cfg)?);
        let comms = LocalGroup::new(ranks).into_iter().map(|g| Arc::new(g) as Arc<dyn Collective>).collect();
        ShardGroup::with_comms(file, Some(path), cfg, comms)
    }

    /// The ranks of `file` over the given ends of a collective, one rank each, in rank order
    /// (`comms[r].rank() == r`).
    pub fn with_comms(file: Arc<GgufFile>, path: Option<&Path>, cfg: &EngineConfig, comms: Vec<Arc<dyn Collective>>) -> Result<ShardGroup> {
        let n = comms.len();
        if let Some((r, c)) = comms.iter().enumerate().find(|(r, c)| c.rank() != *r || c.size() != n) {
            return Err(EngineError::Config(format!("the collective's end {r} is rank {} of {}, not rank {r} of {n}", c.rank(), c.size())));
        }
        let plan = ShardPlan::of_file(&file, n)?;
        let ranks = comms
            .iter()
            .map(|c| {
                let mut m = Model::from_gguf_at(Arc::clone(&file), path, cfg)?;
                if n > 1 {
                    m.join_shard(Shard { comm: Arc::clone(c), experts: plan.partition.block(c.rank()) })?;
                }
                Ok(m)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ShardGroup { ranks, comms })
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// The experts each rank computes.
    pub fn partition(&self) -> Option<ExpertPartition> {
        self.ranks[0].moe_geometry().map(|(n_expert, _, _)| ExpertPartition { n_expert, ranks: self.size() })
    }

    /// Rank `r`'s model (its expert cache counters, its profile).
    pub fn rank(&self, r: usize) -> &Model {
        &self.ranks[r]
    }

    /// A new sequence at position 0.
    pub fn new_state(&self) -> GroupState {
        GroupState { ranks: self.ranks.iter().map(|m| m.new_state()).collect() }
    }

    /// `Model::forward` on every rank.
    pub fn forward(&self, state: &mut GroupState, tokens: &[u32], mode: LogitsMode) -> Result<Vec<f32>> {
        self.check_state(state)?;
        self.ranks[0].check_feed(&state.ranks[0], tokens)?;
        let outs = self.on_ranks(state.ranks.iter_mut().collect(), |m, s| m.forward(s, tokens, mode))?;
        agree(outs, |a, b| same_bits(a, b))
    }

    /// `Model::forward_chunks` on every rank.
    pub fn forward_chunks(&self, state: &mut GroupState, tokens: &[u32], chunk: usize, mode: LogitsMode) -> Result<Vec<f32>> {
        self.check_state(state)?;
        self.ranks[0].check_feed(&state.ranks[0], tokens)?;
        let outs = self.on_ranks(state.ranks.iter_mut().collect(), |m, s| m.forward_chunks(s, tokens, chunk, mode))?;
        agree(outs, |a, b| same_bits(a, b))
    }

    /// `Model::forward_batch_out` on every rank: several sequences' decode rows and prompt
    /// chunks in one step.
    pub fn forward_batch_out(&self, steps: &mut [GroupStep]) -> Result<Vec<SpanOut>> {
        for s in steps.iter() {
            self.check_state(s.state)?;
            self.ranks[0].check_feed(&s.state.ranks[0], s.tokens)?;
        }
        let n = self.size();
        let mut per_rank: Vec<Vec<SeqStep>> = (0..n).map(|_| Vec::with_capacity(steps.len())).collect();
        for s in steps.iter_mut() {
            for (r, st) in s.state.ranks.iter_mut().enumerate() {
                per_rank[r].push(SeqStep { state: st, tokens: s.tokens, logits: s.logits, decode_order: s.decode_order, hidden: s.hidden, banned: s.banned });
            }
        }
        let outs = self.on_ranks(per_rank, |m, mut v| m.forward_batch_out(&mut v))?;
        agree(outs, |a, b| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_bits(&x.logits, &y.logits) && same_bits(&x.hidden, &y.hidden)))
    }

    /// `f` on every rank at once (`lockstep::on_ranks`). A failure inside a pass fails the
    /// group for good (a rank may have stopped between two reductions); what a request can get
    /// wrong is checked before any rank starts (`Model::check_feed`).
    fn on_ranks<A: Send, T: Send>(&self, args: Vec<A>, f: impl Fn(&Model, A) -> Result<T> + Sync) -> Result<Vec<T>> {
        let abort = |r: usize, why: &str| self.comms[r].abort(why);
        on_ranks(&self.ranks, args, &abort, f)
    }

    fn check_state(&self, s: &GroupState) -> Result<()> {
        if s.ranks.len() != self.size() || s.ranks.iter().any(|r| r.pos != s.pos()) {
            return Err(EngineError::State(format!("a group state of {} rank copies (positions differing or not {} of them)", s.ranks.len(), self.size())));
        }
        Ok(())
    }
}
