//! A sequence's state held by a device (`crate::device`): what `SeqState` owns once a pass on
//! the device has run it, and asks for its checkpoints, clones, rollbacks and host form. Here
//! beside the state rather than with the device seam, so the state knows nothing of devices
//! beyond this trait.

use crate::error::Result;
use crate::state::{DeltaState, LayerState};
use std::any::Any;

/// One sequence's state on a device: KV rows and recurrent states, and the recurrent states
/// kept for a rollback.
pub trait DeviceSeq: Send + Sync + Any {
    /// A second sequence with the same state (a device-to-device copy).
    fn try_clone(&self) -> Result<Box<dyn DeviceSeq>>;

    /// The host form of the first `pos` positions into `layers` (the model's state shapes):
    /// KV rows as f16, conv and delta states as f32.
    fn download(&self, layers: &mut [LayerState], pos: usize) -> Result<()>;

    /// `download` of the KV rows only, where a checkpoint supplies the recurrent states (the
    /// prefix cache's copy of a state at a message boundary): the layers' recurrent states may
    /// be left as they were. The default reads everything.
    fn download_kv(&self, layers: &mut [LayerState], pos: usize) -> Result<()> {
        self.download(layers, pos)
    }

    /// Every recurrent layer's state now, by layer index (a checkpoint's content).
    fn recurrent(&self) -> Result<Vec<(usize, DeltaState)>>;

    /// The recurrent layers' states replaced (a checkpoint restored).
    fn set_recurrent(&mut self, states: &[(usize, DeltaState)]) -> Result<()>;

    /// Every recurrent layer's state copied on the device (a checkpoint that stays there: no
    /// read-back, and a restore is a device copy), where the device has room for it; None
    /// where it has not, and the caller reads the states back (`recurrent`). The default
    /// keeps none.
    fn snapshot(&self) -> Result<Option<Box<dyn DeviceSnapshot>>> {
        Ok(None)
    }

    /// The recurrent layers' states replaced by `snap`'s, on the device; false where `snap` is
    /// not this device's (the caller restores its host form).
    fn restore_snapshot(&mut self, snap: &dyn DeviceSnapshot) -> Result<bool> {
        let _ = snap;
        Ok(false)
    }

    /// Keep the recurrent states before each of the last `k` rows fed one by one (single-row
    /// spans and decode-order spans), so `rollback` returns to them; 0 keeps none.
    fn keep_history(&mut self, k: usize);

    /// Make room now for `k` kept states (what `keep_history(k)` and a verify of k + 1 rows
    /// will hold), so the first verify does not allocate them: a drafting sequence reserves
    /// before its decode starts. Nothing by default.
    fn reserve_history(&mut self, k: usize) -> Result<()> {
        let _ = k;
        Ok(())
    }

    /// Back from position `from` to `to`, one of the kept positions: the recurrent states taken
    /// from before the token at `to` (KV rows past it are simply overwritten later).
    fn rollback(&mut self, from: usize, to: usize) -> Result<()>;

    /// From now on (`on`) or no longer, collect the final hidden rows (after the output norm:
    /// what an MTP head reads) of every row the passes feed this sequence, for `take_hidden`;
    /// false where the device returns none (the default).
    fn collect_hidden(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// The hidden rows collected since the last call (rows × hidden, in the order fed).
    fn take_hidden(&mut self) -> Vec<f32> {
        Vec::new()
    }

    /// Device bytes the state holds, kept states included.
    fn bytes(&self) -> usize;

    /// Device bytes of the kept states (`keep_history`).
    fn history_bytes(&self) -> usize;

    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A sequence's recurrent states copied on its device (`DeviceSeq::snapshot`): a checkpoint's
/// content kept in device memory until the host needs it.
pub trait DeviceSnapshot: Send + Sync + Any {
    /// The host form, by layer index (what `DeviceSeq::recurrent` gave when it was taken).
    fn download(&self) -> Result<Vec<(usize, DeltaState)>>;

    /// The recurrent layers it holds, by index.
    fn layers(&self) -> Vec<usize>;

    /// Device bytes it holds.
    fn bytes(&self) -> usize;

    fn as_any(&self) -> &dyn Any;
}
