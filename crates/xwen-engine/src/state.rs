//! Per-sequence state, kept outside the model: a KV cache per attention layer and conv + delta
//! state per DeltaNet layer. Snapshots are plain clones; prefix caching and speculative rollback
//! restore them (recurrent state cannot be "un-advanced", so rollback = restore + re-advance).

use crate::attention::KvCache;
use crate::deltanet::DeltaState;
use crate::error::{EngineError, Result};

#[derive(Clone, Debug)]
pub enum LayerState {
    Attn(KvCache),
    Delta(DeltaState),
}

#[derive(Clone, Debug)]
pub struct SeqState {
    /// Positions consumed so far.
    pub pos: usize,
    pub layers: Vec<LayerState>,
}

/// A saved copy of a sequence's state at a position.
#[derive(Clone, Debug)]
pub struct Snapshot(SeqState);

impl Snapshot {
    pub fn pos(&self) -> usize {
        self.0.pos
    }
}

impl SeqState {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.clone())
    }

    pub fn restore(&mut self, snap: &Snapshot) {
        *self = snap.0.clone();
    }

    /// Cut the sequence back to `pos` positions. Attention layers drop KV rows; recurrent layers
    /// cannot be rewound, so this is only possible when every layer is attention or `pos` equals
    /// the current position — otherwise restore a snapshot taken at `pos` (the error says so).
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        if pos == self.pos {
            return Ok(());
        }
        if pos > self.pos {
            return Err(EngineError::State(format!("cannot truncate forward to {pos} (at {})", self.pos)));
        }
        if self.layers.iter().any(|l| matches!(l, LayerState::Delta(_))) {
            return Err(EngineError::State(format!(
                "recurrent layers cannot be rewound from {} to {pos}: restore a snapshot taken at {pos}",
                self.pos
            )));
        }
        for l in &mut self.layers {
            if let LayerState::Attn(kv) = l {
                let w = kv.k.len() / self.pos.max(1);
                kv.k.truncate(pos * w);
                kv.v.truncate(pos * w);
            }
        }
        self.pos = pos;
        Ok(())
    }

    /// Bytes this state holds (KV grows with position; recurrent state is constant).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attn(kv) => (kv.k.len() + kv.v.len()) * 4,
                LayerState::Delta(d) => (d.conv.len() + d.s.len()) * 4,
            })
            .sum()
    }
}
