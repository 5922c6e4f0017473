//! Speculative decoding: a drafter proposes the next few tokens, the target model verifies them
//! all in one forward step, the longest prefix greedy decoding agrees with is kept.
//!
//! The verify runs its rows in the one-token (decode) order (`SeqStep::decode_order`), so each
//! row's logits are the bits plain one-token decode gives at that position; the sampler then
//! picks tokens in the same order with the same history. Drafted output is therefore plain
//! greedy output by construction. Rejected rows are rolled back with `SeqState::rollback` (KV
//! truncated, the recurrent layers' kept states restored): nothing runs twice.
//!
//! Drafters behind one seam (`Drafter`): `NgramDrafter` (prompt lookup: the continuation of the
//! latest earlier occurrence of the context's last n tokens — the win on code edits and
//! retrieval) and `ModelDrafter` (a smaller model with the same vocabulary, greedy). With
//! temperature > 0 each drafted row keeps its draft with the target's probability of it and
//! otherwise draws from the rest (`Sampler::sample_against`): the output follows the target's
//! distribution exactly (the random draws differ from plain sampling's, so a seed's text does).
//!
//! One concern a file: the `Drafter` seam (here), the drafters (`lookup`: prompt lookup and the benchmark's known and
//! contrary drafters; `model_drafter`: a draft model; `mtp_drafter`: the target's MTP head;
//! `dflash_drafter`: a DFlash block drafter),
//! the sampling of a verify's rows against the drafts (`verify`), the drafting depth and its
//! cost model (`controller`), what drafting did (`tally`), and the one-sequence drafted
//! decode loop (`decode`). Rolling back rejected rows is the state's (`SeqState::rollback`).

mod controller;
mod decode;
mod dflash_drafter;
mod lookup;
mod model_drafter;
mod mtp_drafter;
mod tally;
mod verify;

pub(crate) use controller::Controller;
pub use controller::DraftMemory;
pub use decode::generate_speculative;
pub(crate) use decode::speculate;
pub use dflash_drafter::DflashDrafter;
pub use lookup::{ContraryDrafter, NgramDrafter, ReplayDrafter};
pub use model_drafter::ModelDrafter;
pub use mtp_drafter::MtpDrafter;
pub use tally::{DraftTally, SpecStats};
pub(crate) use verify::{greedy_verify_rows, sample_verify_rows};

use crate::error::Result;
use crate::model::Model;

/// Proposes up to `max` tokens that continue `context` (prompt and generated tokens, the last of
/// which the target has not fed yet).
pub trait Drafter: Send {
    fn name(&self) -> &'static str;
    fn propose(&mut self, context: &[u32], max: usize) -> Result<Vec<u32>>;
    /// `propose` for a drafter that runs on the target model itself (an MTP head).
    fn propose_with(&mut self, _target: &Model, context: &[u32], max: usize) -> Result<Vec<u32>> {
        self.propose(context, max)
    }
    /// Whether the target's steps should return their final hidden rows for `observe`.
    fn wants_hidden(&self) -> bool {
        false
    }
    /// Whether a proposal costs next to nothing (a lookup) rather than forward passes: a
    /// costly drafter that keeps proposing nothing is paused like one that is never right.
    fn proposes_cheaply(&self) -> bool {
        true
    }
    /// The target kept `tokens` at positions `pos..` (a prompt chunk, or a verify's accepted
    /// rows) and these are their final hidden rows (tokens × hidden).
    fn observe(&mut self, _target: &Model, _pos: usize, _tokens: &[u32], _hidden: &[f32]) -> Result<()> {
        Ok(())
    }
    /// A draft model's drafter, whose proposals a scheduler batches across its sequences
    /// (`ModelDrafter::propose_many`).
    fn as_model_drafter(&mut self) -> Option<&mut ModelDrafter> {
        None
    }
}

/// A paused drafter's shadow proposal (`Controller::shadow_wanted`): the first token it would
/// draft after `context`, never verified; a failed proposal says nothing (None), as an empty
/// one does.
pub(crate) fn shadow_token(d: &mut dyn Drafter, target: &Model, context: &[u32]) -> Option<u32> {
    d.propose_with(target, context, 1).ok().and_then(|p| p.first().copied())
}
