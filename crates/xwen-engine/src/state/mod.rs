//! Per-sequence state, kept outside the model: a KV cache per attention layer and conv + delta
//! state per DeltaNet layer (llama.cpp's hybrid memory: `llama_memory_hybrid`, KV rows plus
//! recurrent cells). A [`SeqCheckpoint`] is what a rollback needs and nothing more: the recurrent
//! layers' states and the position. KV rows are never copied — restoring truncates the cache
//! to the checkpoint's length, since the rows below it are still the ones it was taken over
//! (the state's cut history proves it; a checkpoint the state has been cut below is refused).

pub mod codec;
pub mod kv;
pub mod on_device;
pub mod recurrent;

pub use kv::{KvBuf, KvCache};
pub use recurrent::{DeltaState, PastState};
use on_device::{DeviceSeq, DeviceSnapshot};
use crate::error::{EngineError, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub enum LayerState {
    Attn(KvCache),
    Delta(DeltaState),
}

/// Tells states apart so a checkpoint is only ever restored into the sequence it was taken
/// from (or a clone of it, whose rows below its position are the same).
static NEXT_LINEAGE: AtomicU64 = AtomicU64::new(1);

#[derive(Clone, Debug)]
pub struct SeqState {
    /// Positions consumed so far.
    pub pos: usize,
    /// The layers' states; while the state lives on a device (`is_on_device`), only their
    /// shapes: the contents are the device's (`to_host` brings them back).
    pub layers: Vec<LayerState>,
    lineage: u64,
    /// Every position the sequence was cut back to (truncate, restore), in order.
    cuts: Vec<usize>,
    /// Where the contents live: here, or on the device of a model with one attached.
    place: Place,
    /// Kept states a drafting sequence asked to have room for (`reserve_history`), made on
    /// its device when its contents move there (a device state is made at the first pass).
    reserve_kept: usize,
}

/// Where a sequence's state lives.
enum Place {
    Host,
    Device(Box<dyn DeviceSeq>),
    /// A copy the device could not make: every use reports why.
    Failed(String),
}

impl Clone for Place {
    fn clone(&self) -> Place {
        match self {
            Place::Host => Place::Host,
            Place::Device(d) => match d.try_clone() {
                Ok(c) => Place::Device(c),
                Err(e) => Place::Failed(format!("copying a sequence's state on the device failed: {e}")),
            },
            Place::Failed(m) => Place::Failed(m.clone()),
        }
    }
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Host => f.write_str("Host"),
            Place::Device(_) => f.write_str("Device"),
            Place::Failed(m) => write!(f, "Failed({m})"),
        }
    }
}

/// A saved copy of a sequence's whole state at a position (KV rows included).
#[derive(Clone, Debug)]
pub struct Snapshot(SeqState);

impl Snapshot {
    pub fn pos(&self) -> usize {
        self.0.pos
    }
}

/// A sequence's recurrent states at a position, and that position: restoring it into the same
/// sequence later truncates the KV cache and copies these back (`SeqState::restore_checkpoint`).
#[derive(Clone, Debug)]
pub struct SeqCheckpoint {
    pos: usize,
    lineage: u64,
    /// how many cuts the state had when this was taken
    cuts_before: usize,
    recurrent: Recurrent,
}

/// A checkpoint's recurrent states: in host memory, or copied on the device that holds the
/// sequence (a server takes one at every prompt's end; reading tens of MB back into fresh host
/// pages there cost more than the step's forward).
#[derive(Clone)]
enum Recurrent {
    /// (layer index, state) of every recurrent layer
    Host(Vec<(usize, DeltaState)>),
    Device(Arc<dyn DeviceSnapshot>),
}

impl std::fmt::Debug for Recurrent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Recurrent::Host(r) => write!(f, "Host({} layers)", r.len()),
            Recurrent::Device(s) => write!(f, "Device({} bytes)", s.bytes()),
        }
    }
}

impl Recurrent {
    fn layers(&self) -> Vec<usize> {
        match self {
            Recurrent::Host(r) => r.iter().map(|(i, _)| *i).collect(),
            Recurrent::Device(s) => s.layers(),
        }
    }
}

impl SeqCheckpoint {
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes this checkpoint holds (the recurrent states: constant in the position), in host
    /// or in device memory (`on_device`).
    pub fn bytes(&self) -> usize {
        match &self.recurrent {
            Recurrent::Host(r) => r.iter().map(|(_, d)| (d.conv.len() + d.s.len()) * 4).sum(),
            Recurrent::Device(s) => s.bytes(),
        }
    }

    /// Whether its states are kept on the device (a restore there is a device copy).
    pub fn on_device(&self) -> bool {
        matches!(self.recurrent, Recurrent::Device(_))
    }
}

/// A checkpoint's recurrent states copied into host `layers` (in place where they hold states
/// of the same size; a KV-only read's layers may hold none).
fn put_recurrent(layers: &mut [LayerState], recurrent: &[(usize, DeltaState)]) {
    for (i, r) in recurrent {
        if let Some(LayerState::Delta(cur)) = layers.get_mut(*i) {
            cur.conv.clone_from(&r.conv);
            cur.s.clone_from(&r.s);
        }
    }
}

/// A state's host form at a checkpoint (`SeqState::host_at`): whole, or waiting for its
/// recurrent states to be read back from the device's snapshot.
pub enum HostAt {
    Ready(SeqState),
    Pending { state: SeqState, snap: Arc<dyn DeviceSnapshot> },
}

impl HostAt {
    /// The whole host form (a pending one's states read back into its layers).
    pub fn finish(self) -> Result<SeqState> {
        match self {
            HostAt::Ready(st) => Ok(st),
            HostAt::Pending { mut state, snap } => {
                // read back straight into the copy's layers (one host copy of the states)
                take_recurrent(&mut state.layers, snap.download()?);
                Ok(state)
            }
        }
    }
}

/// A layer's shape with no contents (its KV cache empty, its recurrent state unset; the kept
/// states' count stays).
fn emptied(l: &LayerState) -> LayerState {
    match l {
        LayerState::Attn(kv) => LayerState::Attn(KvCache { max_rows: kv.max_rows, ..KvCache::new((kv.k.ty(), kv.v.ty())) }),
        LayerState::Delta(d) => LayerState::Delta(DeltaState { keep: d.keep, ..DeltaState::of(Vec::new(), Vec::new()) }),
    }
}

/// `put_recurrent` for states the caller no longer needs: moved in, not copied.
fn take_recurrent(layers: &mut [LayerState], recurrent: Vec<(usize, DeltaState)>) {
    for (i, r) in recurrent {
        if let Some(LayerState::Delta(cur)) = layers.get_mut(i) {
            cur.conv = r.conv;
            cur.s = r.s;
        }
    }
}

impl SeqState {
    /// A fresh sequence at position 0 over `layers`.
    pub fn new(layers: Vec<LayerState>) -> SeqState {
        SeqState { pos: 0, layers, lineage: NEXT_LINEAGE.fetch_add(1, Ordering::Relaxed), cuts: Vec::new(), place: Place::Host, reserve_kept: 0 }
    }

    /// Whether the contents live on a device (a model with one attached has fed it).
    pub fn is_on_device(&self) -> bool {
        !matches!(self.place, Place::Host)
    }

    /// The device part, for the model that owns it (`Model::forward_batch_each`, which has
    /// moved the state there); an error where an earlier copy failed or the state is (back) on
    /// the host.
    pub(crate) fn device_mut(&mut self) -> Result<&mut (dyn DeviceSeq + 'static)> {
        match &mut self.place {
            Place::Host => Err(EngineError::State("a sequence state left the device".into())),
            Place::Device(d) => Ok(d.as_mut()),
            Place::Failed(m) => Err(EngineError::State(m.clone())),
        }
    }

    /// Moves the contents onto a device: `seq` holds them from now on; the host copies are
    /// let go (the layers keep their shapes for `to_host`).
    pub(crate) fn put_on_device(&mut self, mut seq: Box<dyn DeviceSeq>) {
        // the kept states asked for before the move (`keep_history`) go with it
        let keep = self.layers.iter().find_map(|l| match l {
            LayerState::Delta(d) => Some(d.keep),
            LayerState::Attn(_) => None,
        });
        if let Some(k) = keep.filter(|&k| k > 0) {
            seq.keep_history(k);
        }
        // and the room reserved for them; a device that cannot make it now allocates them at
        // the first verify, as without a reservation, and reports a failure there
        if self.reserve_kept > 0 {
            let _ = seq.reserve_history(self.reserve_kept);
        }
        self.clear_contents();
        self.place = Place::Device(seq);
    }

    /// A state on a device holding `src`'s contents — `seq`, which the caller uploaded from
    /// them — at `src`'s position, with a lineage of its own: `src` is not copied on the host
    /// (a prefix cache's entry goes straight to the device).
    pub(crate) fn uploaded_from(src: &SeqState, seq: Box<dyn DeviceSeq>) -> SeqState {
        let mut s = src.empty_like();
        s.pos = src.pos;
        s.put_on_device(seq);
        s
    }

    /// A fresh host state (position 0, a lineage of its own) with this one's layer shapes and
    /// no contents — empty KV caches and recurrent states, which a device reads as its zero
    /// states at the first pass. (The contents are not copied only to be let go.)
    pub(crate) fn empty_like(&self) -> SeqState {
        SeqState::new(self.layers.iter().map(emptied).collect())
    }

    fn clear_contents(&mut self) {
        for l in &mut self.layers {
            *l = emptied(l);
        }
    }

    /// Copies of the recurrent layers' states held in host memory, by layer index (what a
    /// host state's checkpoint keeps; a state on a device holds none here).
    pub fn host_recurrent(&self) -> Vec<(usize, DeltaState)> {
        self.layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match l {
                LayerState::Delta(d) => Some((i, DeltaState::of(d.conv.clone(), d.s.clone()))),
                LayerState::Attn(_) => None,
            })
            .collect()
    }

    /// The same state with its contents in host memory: a copy of a host state, a download of
    /// a device one (what the prefix cache keeps and the state codec writes).
    pub fn to_host(&self) -> Result<SeqState> {
        match &self.place {
            Place::Host => Ok(self.clone()),
            Place::Device(d) => {
                let mut layers = self.layers.clone();
                d.download(&mut layers, self.pos)?;
                Ok(SeqState { pos: self.pos, layers, lineage: self.lineage, cuts: self.cuts.clone(), place: Place::Host, reserve_kept: self.reserve_kept })
            }
            Place::Failed(m) => Err(EngineError::State(m.clone())),
        }
    }

    /// `to_host` that leaves a host state as it is.
    pub fn into_host(self) -> Result<SeqState> {
        match self.place {
            Place::Host => Ok(self),
            _ => self.to_host(),
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.clone())
    }

    pub fn restore(&mut self, snap: &Snapshot) {
        *self = snap.0.clone();
    }

    /// The recurrent states at the current position (no KV rows); on a device, copied there
    /// where it has room, else read back (the error is the device's).
    pub fn checkpoint(&self) -> Result<SeqCheckpoint> {
        let recurrent = match &self.place {
            Place::Host => Recurrent::Host(self.host_recurrent()),
            // a snapshot the device could not take (no room, a failed copy) is read back instead
            Place::Device(d) => match d.snapshot() {
                Ok(Some(snap)) => Recurrent::Device(Arc::from(snap)),
                _ => Recurrent::Host(d.recurrent()?),
            },
            Place::Failed(m) => return Err(EngineError::State(m.clone())),
        };
        Ok(SeqCheckpoint { pos: self.pos, lineage: self.lineage, cuts_before: self.cuts.len(), recurrent })
    }

    /// This state as it was at checkpoint `ck`, in host memory (what the prefix cache keeps of
    /// a message boundary): `to_host` then `restore_checkpoint`, but a device's recurrent
    /// states are not read back only to be replaced by the checkpoint's — only the KV rows up
    /// to its position are.
    pub fn to_host_at(&self, ck: &SeqCheckpoint) -> Result<SeqState> {
        self.host_at(ck)?.finish()
    }

    /// `to_host_at` in two halves: the KV rows read back now, and a checkpoint's recurrent
    /// states that its device still holds left to `HostAt::finish`, which may run on another
    /// thread while the device computes (the server's prefix cache takes its copies so).
    pub fn host_at(&self, ck: &SeqCheckpoint) -> Result<HostAt> {
        let Place::Device(d) = &self.place else {
            let mut st = self.to_host()?;
            st.restore_checkpoint(ck)?;
            return Ok(HostAt::Ready(st));
        };
        self.check_checkpoint(ck)?;
        let mut layers = self.layers.clone();
        d.download_kv(&mut layers, ck.pos)?;
        let mut cuts = self.cuts.clone();
        if ck.pos < self.pos {
            cuts.push(ck.pos);
        }
        let mut state = SeqState { pos: ck.pos, layers, lineage: self.lineage, cuts, place: Place::Host, reserve_kept: self.reserve_kept };
        match &ck.recurrent {
            Recurrent::Host(r) => {
                put_recurrent(&mut state.layers, r);
                Ok(HostAt::Ready(state))
            }
            Recurrent::Device(snap) => Ok(HostAt::Pending { state, snap: Arc::clone(snap) }),
        }
    }

    /// Back to `ck`'s position: KV rows past it are dropped, the recurrent states copied back.
    /// Refused for a checkpoint of another sequence, one ahead of this state, or one this state
    /// has since been cut below (its KV rows there may now hold other tokens).
    pub fn restore_checkpoint(&mut self, ck: &SeqCheckpoint) -> Result<()> {
        self.check_checkpoint(ck)?;
        match (&mut self.place, &ck.recurrent) {
            (Place::Host, Recurrent::Host(r)) => put_recurrent(&mut self.layers, r),
            (Place::Host, Recurrent::Device(snap)) => take_recurrent(&mut self.layers, snap.download()?),
            (Place::Device(dev), Recurrent::Host(r)) => dev.set_recurrent(r)?,
            (Place::Device(dev), Recurrent::Device(snap)) => {
                // a device copy where the snapshot is this device's, else through the host
                if !dev.restore_snapshot(&**snap)? {
                    dev.set_recurrent(&snap.download()?)?;
                }
            }
            (Place::Failed(m), _) => return Err(EngineError::State(m.clone())),
        }
        self.cut_kv(ck.pos);
        Ok(())
    }

    /// Why `ck` cannot be restored into this state, if it cannot (`restore_checkpoint`).
    fn check_checkpoint(&self, ck: &SeqCheckpoint) -> Result<()> {
        if ck.lineage != self.lineage {
            return Err(EngineError::State("this checkpoint was taken from another sequence".into()));
        }
        if ck.pos > self.pos {
            return Err(EngineError::State(format!("checkpoint at {} is ahead of the sequence (at {})", ck.pos, self.pos)));
        }
        if let Some(&low) = self.cuts.get(ck.cuts_before..).and_then(|c| c.iter().min()) {
            if low < ck.pos {
                return Err(EngineError::State(format!(
                    "the sequence was cut back to {low} after this checkpoint at {} was taken",
                    ck.pos
                )));
            }
        }
        if let Some(i) = ck.recurrent.layers().into_iter().find(|i| !matches!(self.layers.get(*i), Some(LayerState::Delta(_)))) {
            return Err(EngineError::State(format!("checkpoint layer {i} is not recurrent in this state")));
        }
        Ok(())
    }

    /// Make room for `k` kept states where they are costly to allocate mid-decode (a device's:
    /// tens of MB of recurrent state each on a 35B-A3B), before a drafted decode starts, so the
    /// first verify of each depth does not pay for them; a state whose device part is not made
    /// yet (it is at the first pass) makes them then. The host's are allocated as needed.
    pub fn reserve_history(&mut self, k: usize) -> Result<()> {
        self.reserve_kept = self.reserve_kept.max(k);
        match &mut self.place {
            Place::Device(d) => d.reserve_history(k),
            _ => Ok(()),
        }
    }

    /// Keep the recurrent states before each of the last `k` tokens fed (k × the recurrent
    /// state's bytes), so `rollback` can return to any of those positions without a re-run —
    /// what a speculative verify needs. 0 (the default) keeps none.
    pub fn keep_history(&mut self, k: usize) {
        if let Place::Device(d) = &mut self.place {
            d.keep_history(k);
        }
        for l in &mut self.layers {
            if let LayerState::Delta(d) = l {
                d.keep = k;
                while d.past.len() > k {
                    if let Some(p) = d.past.pop_front() {
                        d.recycle(p.s);
                    }
                }
                d.trim_spare();
            }
        }
    }

    /// Back to `pos`, a position among the last kept ones (`keep_history`) or the current one:
    /// KV rows past it are dropped, each recurrent layer takes its kept state from before the
    /// token at `pos`.
    pub fn rollback(&mut self, pos: usize) -> Result<()> {
        if pos == self.pos {
            return Ok(());
        }
        if pos > self.pos {
            return Err(EngineError::State(format!("cannot roll forward to {pos} (at {})", self.pos)));
        }
        match &mut self.place {
            Place::Host => {}
            Place::Device(d) => {
                d.rollback(self.pos, pos)?;
                self.cut_kv(pos);
                return Ok(());
            }
            Place::Failed(m) => return Err(EngineError::State(m.clone())),
        }
        let kept = self.layers.iter().all(|l| match l {
            LayerState::Delta(d) => d.past.iter().any(|p| p.pos == pos),
            LayerState::Attn(_) => true,
        });
        if !kept {
            return Err(EngineError::State(format!(
                "position {pos} is not among the kept states (at {}; keep_history keeps the last k)",
                self.pos
            )));
        }
        for l in &mut self.layers {
            if let LayerState::Delta(d) = l {
                let i = d.past.iter().position(|p| p.pos == pos).expect("checked above");
                let p = d.past.remove(i).expect("in range");
                for later in d.past.split_off(i) {
                    d.recycle(later.s);
                }
                d.conv = p.conv;
                let now = std::mem::replace(&mut d.s, p.s);
                d.recycle(now);
            }
        }
        self.cut_kv(pos);
        Ok(())
    }

    /// Cut the sequence back to `pos` positions. Attention layers drop KV rows; recurrent layers
    /// cannot be rewound, so this is only possible when every layer is attention or `pos` equals
    /// the current position — otherwise restore a checkpoint taken at `pos` (the error says so).
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        if pos == self.pos {
            return Ok(());
        }
        if pos > self.pos {
            return Err(EngineError::State(format!("cannot truncate forward to {pos} (at {})", self.pos)));
        }
        if self.layers.iter().any(|l| matches!(l, LayerState::Delta(_))) {
            return Err(EngineError::State(format!(
                "recurrent layers cannot be rewound from {} to {pos}: restore a checkpoint taken at {pos}",
                self.pos
            )));
        }
        self.cut_kv(pos);
        Ok(())
    }

    /// Gives every attention layer an empty cache of these (K, V) types; for a fresh state.
    pub fn set_kv_types(&mut self, types: (crate::config::KvType, crate::config::KvType)) {
        for l in &mut self.layers {
            if let LayerState::Attn(kv) = l {
                *kv = KvCache { max_rows: kv.max_rows, ..KvCache::new(types) };
            }
        }
    }

    /// The positions every KV cache reserves room for at its first append (`KvCache::max_rows`:
    /// the context the RAM plan counts).
    pub fn set_kv_rows(&mut self, max_rows: usize) {
        for l in &mut self.layers {
            if let LayerState::Attn(kv) = l {
                kv.max_rows = max_rows;
            }
        }
    }

    fn cut_kv(&mut self, pos: usize) {
        for l in &mut self.layers {
            if let LayerState::Attn(kv) = l {
                // K and V rows may differ in width (MLA keeps kv_lora_rank + rope of K, the
                // rank of V)
                let (wk, wv) = (kv.k.len() / self.pos.max(1), kv.v.len() / self.pos.max(1));
                kv.k.truncate(pos * wk);
                kv.v.truncate(pos * wv);
            }
        }
        if pos < self.pos {
            self.cuts.push(pos);
        }
        self.pos = pos;
    }

    /// Bytes held for rollbacks: the recurrent layers' kept states (`keep_history`) and the
    /// spare state buffers the next verify's kept states reuse — at most twice `keep` states
    /// per layer.
    pub fn history_bytes(&self) -> usize {
        if let Place::Device(d) = &self.place {
            return d.history_bytes();
        }
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Delta(d) => d.past.iter().map(|p| (p.conv.len() + p.s.len()) * 4).sum::<usize>() + d.spare_count() * d.s.len() * 4,
                LayerState::Attn(_) => 0,
            })
            .sum()
    }

    /// Bytes this state holds (KV grows with position; recurrent state is constant): device
    /// bytes for a state on a device.
    pub fn bytes(&self) -> usize {
        if let Place::Device(d) = &self.place {
            return d.bytes();
        }
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attn(kv) => kv.k.bytes() + kv.v.bytes(),
                LayerState::Delta(d) => (d.conv.len() + d.s.len()) * 4,
            })
            .sum()
    }
}
