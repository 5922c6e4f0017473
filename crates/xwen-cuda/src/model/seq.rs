//! One sequence's state on the device — each attention layer's f16 KV rows for the whole
//! context, each DeltaNet layer's conv and delta states —
//! and the recurrent states kept before recent tokens for a speculative rollback.
//!
//! The host form is the CPU model's (`xwen_engine::state::LayerState`, same layouts: conv
//! [K−1][conv_dim] oldest first, S [H_v][S_v][S_k], KV rows [pos][kv_width] as f16 bits), so
//! a sequence moves between the two by copying bytes.

use super::*;
use std::collections::VecDeque;
use xwen_engine::state::{DeltaState, KvBuf, KvCache, LayerState};

/// The sizes of a sequence's buffers, layer by layer.
#[derive(Clone, Debug)]
pub(super) struct SeqShape {
    pub layers: Vec<LayerShape>,
    pub n_ctx: usize,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum LayerShape {
    /// conv and S values.
    Delta { conv: usize, s: usize },
    /// Values of a K (and of a V) row.
    Attn { kv_width: usize },
}

impl SeqShape {
    pub fn of(net: &Hybrid, n_ctx: usize) -> SeqShape {
        let (att, dd) = (&net.cfg.attn, &net.cfg.delta);
        let layers = net
            .layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Attn(_) => LayerShape::Attn { kv_width: att.kv_width() },
                _ => LayerShape::Delta { conv: dd.conv_state_len(), s: dd.state_len() },
            })
            .collect();
        SeqShape { layers, n_ctx }
    }
}

pub(super) enum SeqLayer {
    Delta { conv: DevBuf, s: DevBuf },
    Attn { k: DevBuf, v: DevBuf },
}

/// A DeltaNet layer's conv and S before the token at `pos` (`keep_history`).
struct Past {
    pos: usize,
    states: Vec<(DevBuf, DevBuf)>,
}

/// A sequence on the device.
pub struct DevSeq {
    gpu: Arc<Gpu>,
    shape: SeqShape,
    pub(super) layers: Vec<SeqLayer>,
    keep: usize,
    past: VecDeque<Past>,
    /// Kept states let go, for the next ones (at most `spare_cap`).
    spare: Vec<Vec<(DevBuf, DevBuf)>>,
    /// The most states kept at once since the sequence was last zeroed: spares are held up
    /// to it, so a drafter whose depth moves step by step, or that pauses and probes again,
    /// does not free and allocate a kept state (a recurrent layer's conv and S each, tens of MB
    /// on a full-size model) every time its depth changes.
    spare_cap: usize,
    /// Where collecting (`DeviceSeq::collect_hidden`): the final hidden rows (after the output
    /// norm) of the rows fed since they were last taken, rows × hidden.
    pub(super) hidden: Option<Vec<f32>>,
}

impl DevSeq {
    /// A sequence at position 0: states zero (the KV rows are written before they are read).
    pub(super) fn zeroed(gpu: &Arc<Gpu>, shape: &SeqShape) -> Result<DevSeq> {
        let layers = shape
            .layers
            .iter()
            .map(|l| {
                Ok(match *l {
                    LayerShape::Delta { conv, s } => SeqLayer::Delta { conv: gpu.zeros(conv * 4)?, s: gpu.zeros(s * 4)? },
                    LayerShape::Attn { kv_width } => SeqLayer::Attn { k: gpu.zeros(shape.n_ctx * kv_width * 2)?, v: gpu.zeros(shape.n_ctx * kv_width * 2)? },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DevSeq { gpu: Arc::clone(gpu), shape: shape.clone(), layers, keep: 0, past: VecDeque::new(), spare: Vec::new(), spare_cap: 0, hidden: None })
    }

    /// Back to position 0: the recurrent states zeroed, nothing kept.
    pub(super) fn zero(&mut self) -> Result<()> {
        for l in &mut self.layers {
            if let SeqLayer::Delta { conv, s } = l {
                self.gpu.zero(conv)?;
                self.gpu.zero(s)?;
            }
        }
        self.past.clear();
        self.spare.clear();
        self.spare_cap = 0;
        Ok(())
    }

    /// A sequence holding `layers` (the host form, `pos` positions).
    pub(super) fn upload(gpu: &Arc<Gpu>, shape: &SeqShape, layers: &[LayerState], pos: usize) -> Result<DevSeq> {
        if layers.len() != shape.layers.len() {
            return Err(CudaError::Unsupported(format!("a state of {} layers for a model of {}", layers.len(), shape.layers.len())));
        }
        if pos > shape.n_ctx {
            return Err(CudaError::ContextFull { pos, n_ctx: shape.n_ctx });
        }
        let mut seq = DevSeq::zeroed(gpu, shape)?;
        for (i, (host, dev)) in layers.iter().zip(&mut seq.layers).enumerate() {
            match (host, dev) {
                (LayerState::Delta(d), SeqLayer::Delta { conv, s }) => {
                    // a host state not yet written (empty) is the zero state
                    if !d.conv.is_empty() || !d.s.is_empty() {
                        if d.conv.len() * 4 != conv.bytes() || d.s.len() * 4 != s.bytes() {
                            return Err(CudaError::Unsupported(format!("layer {i}: a recurrent state of {} + {} values for {} + {}", d.conv.len(), d.s.len(), conv.bytes() / 4, s.bytes() / 4)));
                        }
                        gpu.write(conv, as_bytes(&d.conv))?;
                        gpu.write(s, as_bytes(&d.s))?;
                    }
                }
                (LayerState::Attn(kv), SeqLayer::Attn { k, v }) => {
                    let LayerShape::Attn { kv_width } = shape.layers[i] else { unreachable!("shapes follow the layers") };
                    for (host, dev) in [(&kv.k, k), (&kv.v, v)] {
                        match host {
                            KvBuf::F16(bits) if bits.is_empty() && pos == 0 => {}
                            KvBuf::F16(bits) if bits.len() == pos * kv_width => gpu.write(dev, u16_bytes(bits))?,
                            KvBuf::F16(bits) => {
                                return Err(CudaError::Unsupported(format!("layer {i}: {} KV values for {pos} positions of {kv_width}", bits.len())));
                            }
                            _ if host.is_empty() && pos == 0 => {}
                            _ => return Err(CudaError::Unsupported(format!("layer {i}: a {} KV cache; the device keeps f16", host.ty().name()))),
                        }
                    }
                }
                _ => return Err(CudaError::Unsupported(format!("layer {i}: the state's kind is not the model's"))),
            }
        }
        Ok(seq)
    }

    /// The host form of the first `pos` positions into `layers`.
    pub(crate) fn download(&self, layers: &mut [LayerState], pos: usize, recurrent: bool) -> Result<()> {
        if layers.len() != self.layers.len() || pos > self.shape.n_ctx {
            return Err(CudaError::Unsupported(format!("a state of {} layers at {pos} from a sequence of {}", layers.len(), self.layers.len())));
        }
        for (i, (host, dev)) in layers.iter_mut().zip(&self.layers).enumerate() {
            match (host, dev) {
                (LayerState::Delta(_), SeqLayer::Delta { .. }) if !recurrent => {}
                (LayerState::Delta(d), SeqLayer::Delta { conv, s }) => {
                    d.conv = self.gpu.read_f32(conv, conv.bytes() / 4)?;
                    d.s = self.gpu.read_f32(s, s.bytes() / 4)?;
                }
                (LayerState::Attn(kv), SeqLayer::Attn { k, v }) => {
                    let LayerShape::Attn { kv_width } = self.shape.layers[i] else { unreachable!("shapes follow the layers") };
                    let n = pos * kv_width;
                    *kv = KvCache { k: KvBuf::F16(self.gpu.read_u16(k, n)?), v: KvBuf::F16(self.gpu.read_u16(v, n)?), max_rows: kv.max_rows };
                }
                _ => return Err(CudaError::Unsupported(format!("layer {i}: the state's kind is not the model's"))),
            }
        }
        Ok(())
    }

    /// The recurrent layers' states now, by layer index.
    pub(crate) fn recurrent(&self) -> Result<Vec<(usize, DeltaState)>> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            if let SeqLayer::Delta { conv, s } = l {
                let d = DeltaState::of(self.gpu.read_f32(conv, conv.bytes() / 4)?, self.gpu.read_f32(s, s.bytes() / 4)?);
                out.push((i, d));
            }
        }
        Ok(out)
    }

    pub(crate) fn set_recurrent(&mut self, states: &[(usize, DeltaState)]) -> Result<()> {
        for (i, d) in states {
            match self.layers.get_mut(*i) {
                Some(SeqLayer::Delta { conv, s }) if d.conv.len() * 4 == conv.bytes() && d.s.len() * 4 == s.bytes() => {
                    self.gpu.write(conv, as_bytes(&d.conv))?;
                    self.gpu.write(s, as_bytes(&d.s))?;
                }
                _ => return Err(CudaError::Unsupported(format!("layer {i}: not a recurrent layer of this shape"))),
            }
        }
        Ok(())
    }

    /// Every recurrent layer's conv and S copied into new device buffers (a checkpoint kept on
    /// the device), where the model's room for them allows (`Gpu::snapshots`); None where not.
    pub(crate) fn snapshot(&self) -> Result<Option<DevSnapshot>> {
        let bytes: usize = self.layers.iter().map(|l| if let SeqLayer::Delta { conv, s } = l { conv.bytes() + s.bytes() } else { 0 }).sum();
        if !self.gpu.snapshots.take(bytes as u64) {
            return Ok(None);
        }
        // the room goes back when `room` drops, a failed copy's too
        let room = Room { gpu: Arc::clone(&self.gpu), bytes: bytes as u64 };
        let mut states = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            if let SeqLayer::Delta { conv, s } = l {
                states.push((i, self.gpu.duplicate(conv)?, self.gpu.duplicate(s)?));
            }
        }
        let ready = self.gpu.stream.record_event(None)?;
        Ok(Some(DevSnapshot { states, ready, room }))
    }

    /// The recurrent layers' states replaced by `snap`'s (device copies, on the stream); false
    /// where `snap` was taken on another device (nothing done).
    pub(crate) fn restore_snapshot(&mut self, snap: &DevSnapshot) -> Result<bool> {
        if !snap.is_on(&self.gpu) {
            return Ok(false);
        }
        for (i, c, t) in &snap.states {
            match self.layers.get_mut(*i) {
                Some(SeqLayer::Delta { conv, s }) if conv.bytes() == c.bytes() && s.bytes() == t.bytes() => {
                    self.gpu.copy(conv, c)?;
                    self.gpu.copy(s, t)?;
                }
                _ => return Err(CudaError::Unsupported(format!("layer {i}: not a recurrent layer of this shape"))),
            }
        }
        Ok(true)
    }

    /// A second sequence with this one's state (no kept states).
    pub(crate) fn try_clone(&self) -> Result<DevSeq> {
        let mut c = DevSeq::zeroed(&self.gpu, &self.shape)?;
        for (dst, src) in c.layers.iter_mut().zip(&self.layers) {
            match (dst, src) {
                (SeqLayer::Delta { conv: c0, s: s0 }, SeqLayer::Delta { conv, s }) => {
                    self.gpu.copy(c0, conv)?;
                    self.gpu.copy(s0, s)?;
                }
                (SeqLayer::Attn { k: k0, v: v0 }, SeqLayer::Attn { k, v }) => {
                    self.gpu.copy(k0, k)?;
                    self.gpu.copy(v0, v)?;
                }
                _ => unreachable!("a clone has its source's shape"),
            }
        }
        Ok(c)
    }

    /// Collect the final hidden rows of the rows fed from now on (`on`), or no longer.
    pub(crate) fn collect_hidden(&mut self, on: bool) {
        match (on, &self.hidden) {
            (true, None) => self.hidden = Some(Vec::new()),
            (false, _) => self.hidden = None,
            (true, Some(_)) => {}
        }
    }

    /// The hidden rows collected since the last call.
    pub(crate) fn take_hidden(&mut self) -> Vec<f32> {
        self.hidden.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub(crate) fn keep_history(&mut self, k: usize) {
        self.keep = k;
        self.spare_cap = self.spare_cap.max(k);
        while self.past.len() > k {
            if let Some(p) = self.past.pop_front() {
                self.spare.push(p.states);
            }
        }
        self.spare.truncate(self.spare_cap);
    }

    /// Spare kept states allocated now up to `k` in all (kept and spare), and held as spares
    /// from now on (`spare_cap`): a verify of k + 1 rows then takes them instead of allocating
    /// its states on the step (a 35B-A3B's are 63 MB each, sixty buffers).
    pub(crate) fn reserve_kept(&mut self, k: usize) -> Result<()> {
        self.spare_cap = self.spare_cap.max(k);
        while self.spare.len() + self.past.len() < k {
            let s = self.new_kept()?;
            self.spare.push(s);
        }
        Ok(())
    }

    /// Whether rows fed one by one keep their states before them.
    pub(super) fn keeps(&self) -> bool {
        self.keep > 0
    }

    /// Whether one pass of a verify of `n` rows keeps what feeding them one by one keeps:
    /// nothing, or the states before its last `keep` rows where those are at least every row
    /// but the first — a verify's rollback targets (its first row, the pending token, is
    /// always kept), which the engine keeps exactly (`keep_history(drafts)`).
    pub(super) fn keeps_at_least(&self, n: usize) -> bool {
        self.keep == 0 || self.keep + 1 >= n
    }

    /// A verify's kept states, as `save` before each of its `n` rows would keep them: the state
    /// before row 0 copied now where `keep` reaches back to it; for each later row, a kept
    /// state (recycled or new) that the pass's kernels write — returned as each row's recurrent
    /// layers' (conv, S) addresses, for rows 1 … n − 1. Needs `keeps_at_least(n)`.
    pub(super) fn reserve_history(&mut self, pos: usize, n: usize) -> Result<Vec<Vec<(u64, u64)>>> {
        if self.keep >= n {
            self.save(pos)?;
        }
        let mut out = Vec::with_capacity(n.saturating_sub(1));
        for i in 1..n {
            let states = self.free_kept()?;
            out.push(states.iter().map(|(c, s)| (c.ptr, s.ptr)).collect());
            self.past.push_back(Past { pos: pos + i, states });
        }
        Ok(out)
    }

    /// Buffers for one more kept state (contents unset): the oldest kept let go while `keep`
    /// are held, then a spare one, or new ones.
    fn free_kept(&mut self) -> Result<Vec<(DevBuf, DevBuf)>> {
        while self.past.len() >= self.keep {
            if let Some(p) = self.past.pop_front() {
                self.spare.push(p.states);
            }
        }
        match self.spare.pop() {
            Some(s) => Ok(s),
            None => self.new_kept(),
        }
    }

    /// A kept state's buffers (each recurrent layer's conv and S), contents unset.
    fn new_kept(&self) -> Result<Vec<(DevBuf, DevBuf)>> {
        self.layers
            .iter()
            .filter_map(|l| match l {
                SeqLayer::Delta { conv, s } => Some((conv.bytes(), s.bytes())),
                SeqLayer::Attn { .. } => None,
            })
            .map(|(c, s)| Ok((self.gpu.zeros(c)?, self.gpu.zeros(s)?)))
            .collect()
    }

    /// Keeps the recurrent states as they are now, before the token at `pos` (the oldest kept
    /// let go past `keep`).
    pub(super) fn save(&mut self, pos: usize) -> Result<()> {
        if self.keep == 0 {
            return Ok(());
        }
        self.past.retain(|p| p.pos < pos);
        let mut states = self.free_kept()?;
        let live = self.layers.iter().filter_map(|l| match l {
            SeqLayer::Delta { conv, s } => Some((conv, s)),
            SeqLayer::Attn { .. } => None,
        });
        for ((c, s), (conv, st)) in states.iter_mut().zip(live) {
            self.gpu.copy(c, conv)?;
            self.gpu.copy(s, st)?;
        }
        self.past.push_back(Past { pos, states });
        Ok(())
    }

    /// Back to the states kept before the token at `to`.
    pub(crate) fn rollback(&mut self, from: usize, to: usize) -> Result<()> {
        let Some(i) = self.past.iter().position(|p| p.pos == to) else {
            return Err(CudaError::Unsupported(format!("position {to} is not among the kept states (at {from}; keep_history keeps the last rows fed one by one)")));
        };
        // the kept buffers become the live ones (each pass reads its state's addresses from
        // its table, so no graph holds the old ones), the live ones spares: no copies — a
        // 35B-A3B's are 60 of them, ~60 MB, a rejected verify
        let live = self.layers.iter_mut().filter_map(|l| match l {
            SeqLayer::Delta { conv, s } => Some((conv, s)),
            SeqLayer::Attn { .. } => None,
        });
        for ((conv, s), (c, st)) in live.zip(self.past[i].states.iter_mut()) {
            std::mem::swap(conv, c);
            std::mem::swap(s, st);
        }
        for p in self.past.drain(i..) {
            self.spare.push(p.states);
        }
        self.spare.truncate(self.spare_cap);
        Ok(())
    }

    pub(crate) fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                SeqLayer::Delta { conv, s } => conv.bytes() + s.bytes(),
                SeqLayer::Attn { k, v } => k.bytes() + v.bytes(),
            })
            .sum::<usize>()
            + self.history_bytes()
    }

    pub(crate) fn history_bytes(&self) -> usize {
        self.past.iter().map(|p| &p.states).chain(&self.spare).flatten().map(|(c, s)| c.bytes() + s.bytes()).sum()
    }
}

fn u16_bytes(v: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// A sequence's recurrent states copied on the device (`DevSeq::snapshot`): a checkpoint that
/// needs no read-back until the host asks for it, and restores by a device copy.
pub struct DevSnapshot {
    /// (layer index, conv, S)
    states: Vec<(usize, DevBuf, DevBuf)>,
    /// Recorded on the model's stream after the copies: a read on another stream waits for it.
    ready: cudarc::driver::CudaEvent,
    room: Room,
}

/// The snapshot room a snapshot holds, given back when it drops.
struct Room {
    gpu: Arc<Gpu>,
    bytes: u64,
}

impl Drop for Room {
    fn drop(&mut self) {
        self.gpu.snapshots.give_back(self.bytes);
    }
}

impl DevSnapshot {
    /// The host form, by layer index (as `DevSeq::recurrent` gives it), read on the device's
    /// reads stream: callable from another thread while the model's stream computes.
    pub(crate) fn download(&self) -> Result<Vec<(usize, DeltaState)>> {
        let bufs: Vec<&DevBuf> = self.states.iter().flat_map(|(_, c, t)| [c, t]).collect();
        let mut host = self.room.gpu.read_f32_after(&bufs, &self.ready)?.into_iter();
        // (a layer's two reads, in order: read_f32_after answers each buffer asked)
        Ok(self.states.iter().map_while(|(i, _, _)| Some((*i, DeltaState::of(host.next()?, host.next()?)))).collect())
    }

    pub(crate) fn layers(&self) -> Vec<usize> {
        self.states.iter().map(|(i, _, _)| *i).collect()
    }

    pub(crate) fn bytes(&self) -> usize {
        self.room.bytes as usize
    }

    /// Whether it was taken on `gpu` (a restore into a sequence of another device goes
    /// through the host).
    pub(crate) fn is_on(&self, gpu: &Arc<Gpu>) -> bool {
        Arc::ptr_eq(&self.room.gpu, gpu)
    }
}
