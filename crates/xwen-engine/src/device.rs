//! A model whose passes run on another device (a GPU), seen from the engine: the seam the CUDA
//! crate implements and the engine calls, with no device type on this side.
//!
//! The seam is a whole pass, not an op: a device backend runs its own fused kernels, graphs
//! and launch order, which an op-by-op trait would dictate (docs/decisions.md, "The device
//! seam"). What the engine keeps is everything around the pass — the scheduler, the sessions,
//! the prefix cache, drafting and rollback, sampling — so every front end (run, chat, bench,
//! serve, the bindings) reaches the device through the same `Model`.
//!
//! A sequence's state lives on the device ([`DeviceSeq`], held by its `SeqState`) between
//! passes. Its host form is the CPU model's own (`LayerState`: f16 KV rows, f32 conv and delta
//! states in the same layouts), so a checkpoint, a prefix-cache entry or a state file taken
//! from a device sequence is an ordinary host state, and a host state is moved onto the device
//! by its first pass there.

use crate::error::Result;
use crate::state::LayerState;
use std::ops::Range;

pub use crate::state::on_device::{DeviceSeq, DeviceSnapshot};

/// A model computed by a device. `Model::attach_device` puts one behind a loaded model.
pub trait DeviceModel: Send + Sync {
    /// The device in words, for logs and `--version` (e.g. "cuda:0 (NVIDIA H100 80GB HBM3)").
    fn describe(&self) -> String;

    /// Bytes the model holds on the device (weights, scratch), sequences not counted.
    fn device_bytes(&self) -> u64;

    /// Whether the device takes its routed experts from the model's expert store where that
    /// streams them from disk under a RAM budget (`Model::expert_store`); a device that does
    /// not is refused a model with a RAM plan.
    fn takes_streamed_experts(&self) -> bool {
        false
    }

    /// A sequence's state moved onto the device from its host form: `layers` as the CPU model
    /// keeps them (`Model::new_state`'s shapes), holding `pos` positions.
    fn upload(&self, layers: &[LayerState], pos: usize) -> Result<Box<dyn DeviceSeq>>;

    /// Feeds `tokens` to `seq` from position `pos`, every row in the span's own order, or with
    /// `decode_order` each row in the one-token order (a verify then equals plain decode bit
    /// for bit). Returns the logits of the span's rows `logits`, back to back.
    fn forward(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], logits: Range<usize>, decode_order: bool) -> Result<Vec<f32>>;

    /// `forward` in the span's own order returning only the argmax of its last row's logits
    /// (the first of equal largest, as `ops::argmax`), skipping the tokens `banned`
    /// (`ops::argmax_except`): a greedy decode, where a device picks the token itself and
    /// copies back one id instead of a vocabulary's logits.
    fn forward_argmax(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], banned: &[u32]) -> Result<u32> {
        let n = tokens.len();
        let logits = self.forward(seq, pos, tokens, n.saturating_sub(1)..n, false)?;
        Ok(crate::ops::argmax_except(&logits, banned))
    }

    /// A greedy verify: `forward` of the span in decode order (each row in the one-token
    /// arithmetic), returning each row's argmax skipping `banned` (as `forward_argmax` picks)
    /// instead of every row's logits, which a device need not copy back.
    fn forward_verify_argmax(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], banned: &[u32]) -> Result<Vec<u32>> {
        let n = tokens.len();
        let logits = self.forward(seq, pos, tokens, 0..n, true)?;
        let v = logits.len() / n.max(1);
        Ok(logits.chunks(v.max(1)).take(n).map(|row| crate::ops::argmax_except(row, banned)).collect())
    }

    /// A decode batch: each row's one token through its own sequence (no sequence twice). A
    /// device computes the rows together where it can — one pass reads each weight once for
    /// all of them — and each row's output must be the bits `forward` / `forward_argmax` give
    /// it alone (batch invariance: a sequence's tokens do not depend on who else is served).
    /// By default, row after row.
    fn forward_rows(&self, rows: &mut [DeviceRow<'_>]) -> Result<Vec<RowOut>> {
        rows.iter_mut()
            .map(|r| match r.logits {
                true => self.forward(&mut *r.seq, r.pos, &[r.token], 0..1, false).map(RowOut::Logits),
                false => self.forward_argmax(&mut *r.seq, r.pos, &[r.token], r.banned).map(RowOut::Argmax),
            })
            .collect()
    }

    /// A step's prompt spans (several sequences' prompt chunks, no sequence twice), each in its
    /// own order; each span's output must be the bits `forward` / `forward_argmax` give it
    /// alone, so a device that runs them as one pass — each weight, above all each routed
    /// expert, read once for all of them, where a burst of new requests otherwise pays a pass
    /// a prompt — keeps every row's arithmetic its span's own. One result a span (an error
    /// fails its own span alone). By default, span after span (`prompts_one_by_one`).
    fn forward_prompts(&self, spans: &mut [DevicePrompt<'_>]) -> Vec<Result<RowOut>> {
        prompts_one_by_one(self, spans)
    }

    /// Rows `forward_rows` takes at once at most (the engine splits a larger batch).
    fn max_rows(&self) -> usize {
        1
    }

    /// Makes ready now what decode batches of 1 to `rows` rows will need, so that no request
    /// pays it when a batch of a new size first runs (a device that captures a step a batch
    /// size captures them here, as vLLM captures its CUDA graphs at start). By default nothing.
    fn prepare_rows(&self, rows: usize) -> Result<()> {
        let _ = rows;
        Ok(())
    }

    /// Makes the device ready for speculative verifies of 2 to `rows` rows (a drafter's depth
    /// + 1), as `prepare_rows` does for decode batches. By default nothing.
    fn prepare_verifies(&self, rows: usize) -> Result<()> {
        let _ = rows;
        Ok(())
    }

    /// Whether the device holds the model's MTP draft head (`mtp_forward`). By default none.
    fn has_mtp(&self) -> bool {
        false
    }

    /// A fresh state of the MTP head on the device (its one attention layer's KV rows), at
    /// position 0.
    fn mtp_new_seq(&self) -> Result<Box<dyn DeviceSeq>> {
        Err(crate::EngineError::Config(format!("{}: no MTP head on the device", self.describe())))
    }

    /// Feeds `tokens` from `pos` to the MTP head's state `seq`, token k paired with hidden row k
    /// of `h_in` (tokens × hidden: the target's final hidden of the position before it, or the
    /// head's own for a chained draft; `models::mtp`). With `draft`, returns the last row's
    /// most likely next token, its probability and the head's own hidden row (what the next
    /// draft step chains from); without, only the state advances (rows the head catches up on).
    fn mtp_forward(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], h_in: &[f32], draft: bool) -> Result<Option<MtpDraft>> {
        let _ = (seq, pos, tokens, h_in, draft);
        Err(crate::EngineError::Config(format!("{}: no MTP head on the device", self.describe())))
    }

    /// The MTP head catching up on `lead` (tokens from `pos`, token k paired with hidden row k
    /// of the second part: rows kept since its last draft), then `depth` draft steps chained
    /// from `token` at `pos + lead.len()` with the hidden row `h`, each step fed the one
    /// before it's draft and hidden row: every step's (token, probability). A device runs the
    /// catch-up and the chain on itself (one pass and one copy back); by default, pass by pass
    /// through `mtp_forward`.
    fn mtp_draft_chain(&self, seq: &mut dyn DeviceSeq, pos: usize, lead: (&[u32], &[f32]), token: u32, h: &[f32], depth: usize) -> Result<Vec<(u32, f32)>> {
        if !lead.0.is_empty() {
            self.mtp_forward(seq, pos, lead.0, lead.1, false)?;
        }
        let pos = pos + lead.0.len();
        let (mut tok, mut hid) = (token, h.to_vec());
        let mut out = Vec::with_capacity(depth);
        for i in 0..depth {
            let Some(d) = self.mtp_forward(seq, pos + i, &[tok], &hid, true)? else { break };
            out.push((d.token, d.prob));
            (tok, hid) = (d.token, d.hidden);
        }
        Ok(out)
    }
}

/// One draft step of an MTP head (`DeviceModel::mtp_forward`): the token it proposes, the
/// probability it gives it, and its own hidden row after its output norm.
#[derive(Clone, Debug, PartialEq)]
pub struct MtpDraft {
    pub token: u32,
    pub prob: f32,
    pub hidden: Vec<f32>,
}

/// One row of a decode batch (`DeviceModel::forward_rows`): a sequence's next token at its
/// position, and whether its logits come back (else only their argmax, skipping `banned`).
pub struct DeviceRow<'a> {
    pub seq: &'a mut dyn DeviceSeq,
    pub pos: usize,
    pub token: u32,
    pub logits: bool,
    pub banned: &'a [u32],
}

/// `DeviceModel::forward_prompts` span after span: each through `forward`, or `forward_argmax`
/// where only its last row's argmax is asked (the default, for a device that runs every span
/// as a pass of its own).
pub fn prompts_one_by_one<D: DeviceModel + ?Sized>(dev: &D, spans: &mut [DevicePrompt<'_>]) -> Vec<Result<RowOut>> {
    spans
        .iter_mut()
        .map(|s| match s.want {
            PromptOut::Logits(ref rows) => dev.forward(&mut *s.seq, s.pos, s.tokens, rows.clone(), false).map(RowOut::Logits),
            PromptOut::Argmax(banned) => dev.forward_argmax(&mut *s.seq, s.pos, s.tokens, banned).map(RowOut::Argmax),
        })
        .collect()
}

/// One sequence's prompt span of a step (`DeviceModel::forward_prompts`): its tokens from
/// `pos` on, in the span's own order, and what comes back.
pub struct DevicePrompt<'a> {
    pub seq: &'a mut dyn DeviceSeq,
    pub pos: usize,
    pub tokens: &'a [u32],
    pub want: PromptOut<'a>,
}

/// What a prompt span gives back: the logits of its rows in the range (back to back; an empty
/// range for none), or the argmax of its last row's skipping the banned tokens.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptOut<'a> {
    Logits(Range<usize>),
    Argmax(&'a [u32]),
}

/// What a decode row gives back: its logits (n_vocab), or their argmax where none were asked.
#[derive(Clone, Debug, PartialEq)]
pub enum RowOut {
    Logits(Vec<f32>),
    Argmax(u32),
}
