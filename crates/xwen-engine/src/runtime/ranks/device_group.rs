//! The ranks of a sharded model on devices (one GPU each, or several ranks on one for tests),
//! seen from the engine as one device: `Model::attach_device(DeviceGroup)` puts every pass on
//! all of them in lockstep — each rank a thread driving its device, meeting the others in the
//! MoE layers' reductions — so the scheduler, sessions, prefix cache, drafting and every front
//! end run a multi-GPU model unchanged.

use super::lockstep::{agree, on_ranks, same_bits};
use crate::device::{DeviceModel, DeviceRow, DeviceSeq, RowOut};
use crate::error::{EngineError, Result};
use crate::state::{DeltaState, LayerState};
use std::ops::Range;
use std::sync::Arc;

/// Called with (rank, why) when a rank's pass fails: fails the group's collective, so the
/// other ranks stop waiting in a reduction for it.
pub type AbortFn = Arc<dyn Fn(usize, &str) + Send + Sync>;

/// Devices each computing one rank of a sharded model (`crate::shard`), as one device.
pub struct DeviceGroup {
    ranks: Vec<Arc<dyn DeviceModel>>,
    abort: AbortFn,
    describe: String,
}

impl DeviceGroup {
    /// The group of `ranks`, rank r computing its block of the experts and meeting the others
    /// through a collective that `abort` fails.
    pub fn new(ranks: Vec<Arc<dyn DeviceModel>>, abort: AbortFn) -> Result<DeviceGroup> {
        if ranks.is_empty() {
            return Err(EngineError::Config("a device group of no ranks".into()));
        }
        let describe = format!("{} ranks, expert parallel: {}", ranks.len(), ranks.iter().map(|r| r.describe()).collect::<Vec<_>>().join("; "));
        Ok(DeviceGroup { ranks, abort, describe })
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// A pass on every rank at once. A failure inside it fails the group for good (a rank may
    /// have stopped between two reductions, and NCCL's communicators do not survive an abort);
    /// what a request can get wrong the engine checks before the device sees it
    /// (`Model::check_feed`).
    fn on_ranks<A: Send, T: Send>(&self, args: Vec<A>, f: impl Fn(&Arc<dyn DeviceModel>, A) -> Result<T> + Sync) -> Result<Vec<T>> {
        let abort = |r: usize, why: &str| (self.abort)(r, why);
        on_ranks(&self.ranks, args, &abort, f)
    }
}

/// A sequence's state in a group: its copy on every rank.
struct GroupSeq(Vec<Box<dyn DeviceSeq>>);

fn group_seq(seq: &mut dyn DeviceSeq) -> Result<&mut GroupSeq> {
    seq.as_any_mut().downcast_mut::<GroupSeq>().ok_or_else(|| EngineError::Device("a sequence state of another device".into()))
}

impl DeviceModel for DeviceGroup {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn device_bytes(&self) -> u64 {
        self.ranks.iter().map(|r| r.device_bytes()).sum()
    }

    /// Each rank's copy, rank after rank: no reduction, so a failure (a full device) fails
    /// this sequence, not the group.
    fn upload(&self, layers: &[LayerState], pos: usize) -> Result<Box<dyn DeviceSeq>> {
        let seqs = self.ranks.iter().map(|r| r.upload(layers, pos)).collect::<Result<Vec<_>>>()?;
        Ok(Box::new(GroupSeq(seqs)))
    }

    fn forward(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], logits: Range<usize>, decode_order: bool) -> Result<Vec<f32>> {
        let seqs = group_seq(seq)?.0.iter_mut().collect();
        let outs = self.on_ranks(seqs, |r, s| r.forward(&mut **s, pos, tokens, logits.clone(), decode_order))?;
        agree(outs, |a, b| same_bits(a, b))
    }

    fn forward_argmax(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], banned: &[u32]) -> Result<u32> {
        let seqs = group_seq(seq)?.0.iter_mut().collect();
        let outs = self.on_ranks(seqs, |r, s| r.forward_argmax(&mut **s, pos, tokens, banned))?;
        agree(outs, |a, b| a == b)
    }

    fn forward_rows(&self, rows: &mut [DeviceRow<'_>]) -> Result<Vec<RowOut>> {
        let n = self.size();
        let mut per_rank: Vec<Vec<DeviceRow>> = (0..n).map(|_| Vec::with_capacity(rows.len())).collect();
        for row in rows.iter_mut() {
            let (pos, token, logits, banned) = (row.pos, row.token, row.logits, row.banned);
            for (r, s) in group_seq(&mut *row.seq)?.0.iter_mut().enumerate() {
                per_rank[r].push(DeviceRow { seq: &mut **s, pos, token, logits, banned });
            }
        }
        let outs = self.on_ranks(per_rank, |r, mut rows| r.forward_rows(&mut rows))?;
        agree(outs, |a, b| {
            a.len() == b.len()
                && a.iter().zip(b).all(|(x, y)| match (x, y) {
                    (RowOut::Logits(x), RowOut::Logits(y)) => same_bits(x, y),
                    (x, y) => x == y,
                })
        })
    }

    fn max_rows(&self) -> usize {
        self.ranks.iter().map(|r| r.max_rows()).min().unwrap_or(1)
    }

    fn prepare_rows(&self, rows: usize) -> Result<()> {
        self.ranks.iter().try_for_each(|r| r.prepare_rows(rows))
    }

    fn prepare_verifies(&self, rows: usize) -> Result<()> {
        self.ranks.iter().try_for_each(|r| r.prepare_verifies(rows))
    }
}

/// Runs `f` on every rank's copy, rank after rank (state moves, not passes: no reduction).
fn each(seqs: &mut [Box<dyn DeviceSeq>], mut f: impl FnMut(&mut dyn DeviceSeq) -> Result<()>) -> Result<()> {
    seqs.iter_mut().try_for_each(|s| f(&mut **s))
}

impl DeviceSeq for GroupSeq {
    fn try_clone(&self) -> Result<Box<dyn DeviceSeq>> {
        Ok(Box::new(GroupSeq(self.0.iter().map(|s| s.try_clone()).collect::<Result<_>>()?)))
    }

    /// Every rank holds the same state: rank 0's.
    fn download(&self, layers: &mut [LayerState], pos: usize) -> Result<()> {
        self.0[0].download(layers, pos)
    }

    fn download_kv(&self, layers: &mut [LayerState], pos: usize) -> Result<()> {
        self.0[0].download_kv(layers, pos)
    }

    fn recurrent(&self) -> Result<Vec<(usize, DeltaState)>> {
        self.0[0].recurrent()
    }

    fn set_recurrent(&mut self, states: &[(usize, DeltaState)]) -> Result<()> {
        each(&mut self.0, |s| s.set_recurrent(states))
    }

    fn keep_history(&mut self, k: usize) {
        for s in &mut self.0 {
            s.keep_history(k);
        }
    }

    fn reserve_history(&mut self, k: usize) -> Result<()> {
        self.0.iter_mut().try_for_each(|s| s.reserve_history(k))
    }

    fn rollback(&mut self, from: usize, to: usize) -> Result<()> {
        each(&mut self.0, |s| s.rollback(from, to))
    }

    fn bytes(&self) -> usize {
        self.0.iter().map(|s| s.bytes()).sum()
    }

    fn history_bytes(&self) -> usize {
        self.0.iter().map(|s| s.history_bytes()).sum()
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
