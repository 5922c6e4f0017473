//! The target's own MTP (NextN) head as a drafter.

use super::Drafter;
use crate::error::Result;
use crate::model::Model;
use crate::state::SeqState;

/// The target's own MTP (NextN) head (`models::mtp`; the file's nextn block or a sidecar
/// attached with `Model::attach_mtp`), driven as llama.cpp's draft-mtp drives it
/// (`common/speculative.cpp`): the head's KV row at position p holds token p with the target's
/// hidden p−1 — `observe` feeds every kept row so, one sync point owning the shift — and a draft
/// chains from the pending token with the hidden of the last kept row, each next step fed the
/// head's own hidden. Where the head missed positions (a state restored from a prefix cache),
/// they are filled with zero hiddens: drafts there are poorer, output is unchanged.
pub struct MtpDrafter {
    state: Option<SeqState>,
    /// Kept rows the head has not run yet (position of the first, tokens, hidden rows): fed in
    /// one batched head pass when a draft is next asked for, so a paused drafter costs nothing.
    buf_pos: usize,
    buf_tokens: Vec<u32>,
    buf_hidden: Vec<f32>,
    /// The target's hidden at position `h_pos` (pairs with the token at `h_pos + 1`).
    last_h: Vec<f32>,
    h_pos: Option<usize>,
    /// Stop drafting when the head's top probability falls below this (llama.cpp's p_min).
    pub p_min: f32,
}

impl Default for MtpDrafter {
    fn default() -> Self {
        MtpDrafter { state: None, buf_pos: 0, buf_tokens: Vec::new(), buf_hidden: Vec::new(), last_h: Vec::new(), h_pos: None, p_min: 0.0 }
    }
}

impl MtpDrafter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the buffered rows through the head (`take_buffer`) — their KV rows only: no draft
    /// is asked of them.
    fn flush(&mut self, target: &Model) -> Result<()> {
        let Some((tokens, h_in)) = self.take_buffer(target)? else { return Ok(()) };
        target.mtp_catch_up(self.state.as_mut().expect("made by take_buffer"), &tokens, &h_in)
    }

    /// The buffered rows as the head takes them, the head's state made ready for them: token q
    /// with the hidden of q−1 (the row before it in the buffer, or the last hidden before the
    /// buffer); the state cut back to the buffer's first position, or filled up to it. None
    /// where the buffer is empty.
    fn take_buffer(&mut self, target: &Model) -> Result<Option<(Vec<u32>, Vec<f32>)>> {
        if self.buf_tokens.is_empty() {
            return Ok(None);
        }
        let h = target.hidden_width();
        if self.state.is_none() {
            self.state = Some(target.new_mtp_state()?);
        }
        let st = self.state.as_mut().expect("set above");
        let pos = self.buf_pos;
        if st.pos > pos {
            st.truncate(pos)?;
        }
        if st.pos < pos {
            // positions the head never saw (restored from a cache): zero hiddens, token 0
            let gap = pos - st.pos;
            target.mtp_write_kv(st, &vec![0; gap], &vec![0.0; gap * h])?;
        }
        let m = self.buf_tokens.len();
        let mut h_in = Vec::with_capacity(m * h);
        match self.h_pos {
            Some(p) if p + 1 == pos && self.last_h.len() == h => h_in.extend_from_slice(&self.last_h),
            _ => h_in.resize(h, 0.0),
        }
        h_in.extend_from_slice(&self.buf_hidden[..(m - 1) * h]);
        self.last_h = self.buf_hidden[(m - 1) * h..].to_vec();
        self.h_pos = Some(pos + m - 1);
        self.buf_hidden.clear();
        Ok(Some((std::mem::take(&mut self.buf_tokens), h_in)))
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn propose(&mut self, _context: &[u32], _max: usize) -> Result<Vec<u32>> {
        // the head runs on the target model: see propose_with
        Ok(Vec::new())
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn proposes_cheaply(&self) -> bool {
        false
    }

    fn observe(&mut self, target: &Model, pos: usize, tokens: &[u32], hidden: &[f32]) -> Result<()> {
        let h = target.hidden_width();
        let m = tokens.len();
        if m == 0 || hidden.len() != m * h {
            return Ok(());
        }
        let end = self.buf_pos + self.buf_tokens.len();
        if self.buf_tokens.is_empty() || pos < self.buf_pos || pos > end {
            // not a continuation of the buffer: run what it holds, start a new one
            self.flush(target)?;
            self.buf_pos = pos;
        } else {
            // rows from `pos` on were cut (a rejected tail): drop them
            self.buf_tokens.truncate(pos - self.buf_pos);
            self.buf_hidden.truncate((pos - self.buf_pos) * h);
        }
        self.buf_tokens.extend_from_slice(tokens);
        self.buf_hidden.extend_from_slice(hidden);
        // a long pause or prompt: run it in batches rather than keep it all
        if self.buf_tokens.len() >= 4096 {
            self.flush(target)?;
        }
        Ok(())
    }

    fn propose_with(&mut self, target: &Model, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        // the rows kept since the last draft run in the same pass as the draft's first step
        let (lead, lead_h) = self.take_buffer(target)?.unwrap_or_default();
        let (Some(st), Some(hp)) = (self.state.as_mut(), self.h_pos) else {
            return Ok(Vec::new());
        };
        // the pending token sits at h_pos + 1 (take_buffer left the state where the rows it
        // took end there); without new rows, the head's rows past it are last step's drafts
        let pos0 = hp + 1;
        if lead.is_empty() && st.pos > pos0 {
            st.truncate(pos0)?;
        }
        let pending = ctx.last().copied().filter(|_| st.pos + lead.len() == pos0);
        let Some(pending) = pending else {
            // (no draft to make: the rows still go in)
            target.mtp_drafts(st, (&lead, &lead_h), 0, &[], 0, self.p_min)?;
            return Ok(Vec::new());
        };
        let max = max.min(target.max_context().saturating_sub(pos0 + 1));
        target.mtp_drafts(st, (&lead, &lead_h), pending, &self.last_h, max, self.p_min)
    }
}
