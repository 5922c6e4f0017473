//! A stand-in device for the device seam's tests: it computes its passes with a CPU model over
//! states it keeps to itself, as a GPU keeps its own (`tests/device_seam.rs`; `tests/shard.rs`
//! makes each rank of a group one).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use xwen_engine::state::{DeltaState, LayerState};
use std::sync::Arc;
use xwen_engine::{DeviceModel, DevicePrompt, DeviceRow, DeviceSeq, DeviceSnapshot, Engine, EngineOptions, EngineRequest, LogitsMode, Model, MtpDraft, Output, PrefixCache, RowOut, SeqState, SeqStep};

pub struct HostDevice {
    pub model: Model,
    pub passes: AtomicUsize,
    /// The most rows a decode batch (`forward_rows`) brought.
    pub widest: AtomicUsize,
    /// Decode rows whose logits came back (the others: their argmax alone).
    pub logit_rows: AtomicUsize,
    /// The widest decode batch the engine asked the device to make ready (`prepare_rows`).
    pub prepared: AtomicUsize,
    /// The most prompt spans one `forward_prompts` call brought.
    pub widest_prompts: AtomicUsize,
    /// The widest verify the engine asked the device to make ready (`prepare_verifies`).
    pub prepared_verifies: AtomicUsize,
    /// The room its sequences' checkpoints may take on it (`DeviceSeq::snapshot`).
    pub room: Arc<Room>,
}

/// What a stand-in device lets checkpoints keep on it, and what they did.
#[derive(Default)]
pub struct Room {
    /// Bytes still free for snapshots.
    pub left: AtomicUsize,
    pub taken: AtomicUsize,
    /// Snapshots restored by a device copy.
    pub restored: AtomicUsize,
    /// The most kept states a sequence reserved room for (`DeviceSeq::reserve_history`).
    pub reserved_kept: AtomicUsize,
}

impl HostDevice {
    pub fn new(model: Model) -> HostDevice {
        HostDevice {
            model,
            passes: AtomicUsize::new(0),
            widest: AtomicUsize::new(0),
            logit_rows: AtomicUsize::new(0),
            prepared: AtomicUsize::new(0),
            widest_prompts: AtomicUsize::new(0),
            prepared_verifies: AtomicUsize::new(0),
            room: Arc::new(Room { left: AtomicUsize::new(usize::MAX), ..Room::default() }),
        }
    }
}

/// Rows the stand-in's decode batches take at most (the engine splits wider ones).
pub const MAX_ROWS: usize = 2;

/// Verifies (passes of several rows in the one-token order) and rollbacks, over all devices.
pub static VERIFIES: AtomicUsize = AtomicUsize::new(0);
pub static ROLLBACKS: AtomicUsize = AtomicUsize::new(0);
/// Greedy verifies whose rows came back as picks (`forward_verify_argmax`), over all devices.
pub static PICKED_VERIFIES: AtomicUsize = AtomicUsize::new(0);

/// A sequence on the stand-in: its state, the device's room, and the final hidden rows collected
/// for an MTP drafter (`collect_hidden`; None: not collecting).
pub struct HostSeq(pub SeqState, Arc<Room>, Option<Vec<f32>>);

impl HostSeq {
    /// The KV rows past `pos` dropped, as a device overwrites them.
    fn at(&mut self, pos: usize) {
        let st = &mut self.0;
        for l in &mut st.layers {
            if let LayerState::Attn(kv) = l {
                let (wk, wv) = (kv.k.len() / st.pos.max(1), kv.v.len() / st.pos.max(1));
                kv.k.truncate(pos * wk);
                kv.v.truncate(pos * wv);
            }
        }
        st.pos = pos;
    }
}

impl DeviceModel for HostDevice {
    fn describe(&self) -> String {
        "a stand-in device".into()
    }

    fn device_bytes(&self) -> u64 {
        0
    }

    fn upload(&self, layers: &[LayerState], pos: usize) -> xwen_engine::Result<Box<dyn DeviceSeq>> {
        let mut st = self.model.new_state();
        assert_eq!(st.layers.len(), layers.len());
        // empty recurrent states are the zero state (a fresh state's, which the engine does
        // not fill on the host for a device)
        for (mine, given) in st.layers.iter_mut().zip(layers) {
            match (mine, given) {
                (LayerState::Delta(_), LayerState::Delta(d)) if d.conv.is_empty() && d.s.is_empty() => {}
                (m, g) => *m = g.clone(),
            }
        }
        st.pos = pos;
        Ok(Box::new(HostSeq(st, self.room.clone(), None)))
    }

    fn forward(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], logits: Range<usize>, decode_order: bool) -> xwen_engine::Result<Vec<f32>> {
        self.passes.fetch_add(1, Ordering::Relaxed);
        if decode_order && tokens.len() > 1 {
            VERIFIES.fetch_add(1, Ordering::Relaxed);
        }
        let seq = seq.as_any_mut().downcast_mut::<HostSeq>().expect("this device's sequence");
        seq.at(pos);
        let hidden = seq.2.is_some();
        let mut step = [SeqStep { state: &mut seq.0, tokens, logits: LogitsMode::All, decode_order, hidden, banned: &[] }];
        let out = self.model.forward_batch_each(&mut step)?.pop().unwrap()?;
        if let Some(h) = seq.2.as_mut() {
            h.extend(out.hidden);
        }
        let v = self.model.n_vocab();
        Ok(out.logits[logits.start * v..logits.end * v].to_vec())
    }

    /// The verify's logits, each row picked here (the seam's default, counted).
    fn forward_verify_argmax(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], banned: &[u32]) -> xwen_engine::Result<Vec<u32>> {
        PICKED_VERIFIES.fetch_add(1, Ordering::Relaxed);
        let logits = self.forward(seq, pos, tokens, 0..tokens.len(), true)?;
        Ok(logits.chunks(self.model.n_vocab()).map(|row| xwen_engine::ops::argmax_except(row, banned)).collect())
    }

    /// The rows as one CPU batch (whose rows are each as computed alone).
    fn prepare_rows(&self, rows: usize) -> xwen_engine::Result<()> {
        self.prepared.fetch_max(rows, Ordering::Relaxed);
        Ok(())
    }

    fn prepare_verifies(&self, rows: usize) -> xwen_engine::Result<()> {
        self.prepared_verifies.fetch_max(rows, Ordering::Relaxed);
        Ok(())
    }

    /// Span after span (as the seam's default), counting how many came together.
    fn forward_prompts(&self, spans: &mut [DevicePrompt<'_>]) -> Vec<xwen_engine::Result<RowOut>> {
        self.widest_prompts.fetch_max(spans.len(), Ordering::Relaxed);
        xwen_engine::prompts_one_by_one(self, spans)
    }

    fn forward_rows(&self, rows: &mut [DeviceRow<'_>]) -> xwen_engine::Result<Vec<RowOut>> {
        assert!(rows.len() <= MAX_ROWS, "a decode batch wider than max_rows");
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.widest.fetch_max(rows.len(), Ordering::Relaxed);
        let toks: Vec<[u32; 1]> = rows.iter().map(|r| [r.token]).collect();
        let mut seqs: Vec<&mut HostSeq> = Vec::new();
        for r in rows.iter_mut() {
            let s = r.seq.as_any_mut().downcast_mut::<HostSeq>().expect("this device's sequence");
            s.at(r.pos);
            seqs.push(s);
        }
        let mut collected: Vec<&mut Option<Vec<f32>>> = Vec::new();
        let mut steps: Vec<SeqStep> = Vec::new();
        for (s, t) in seqs.into_iter().zip(&toks) {
            let hidden = s.2.is_some();
            collected.push(&mut s.2);
            steps.push(SeqStep { state: &mut s.0, tokens: t, logits: LogitsMode::All, decode_order: false, hidden, banned: &[] });
        }
        let out = self.model.forward_batch_each(&mut steps)?.into_iter().collect::<xwen_engine::Result<Vec<_>>>()?;
        drop(steps);
        for (c, o) in collected.into_iter().zip(&out) {
            if let Some(h) = c.as_mut() {
                h.extend_from_slice(&o.hidden);
            }
        }
        self.logit_rows.fetch_add(rows.iter().filter(|r| r.logits).count(), Ordering::Relaxed);
        Ok(rows.iter().zip(out).map(|(r, o)| if r.logits { RowOut::Logits(o.logits) } else { RowOut::Argmax(xwen_engine::ops::argmax_except(&o.logits, r.banned)) }).collect())
    }

    fn max_rows(&self) -> usize {
        MAX_ROWS
    }

    /// The CPU model's own MTP head, over head states the stand-in keeps.
    fn has_mtp(&self) -> bool {
        self.model.has_mtp()
    }

    fn mtp_new_seq(&self) -> xwen_engine::Result<Box<dyn DeviceSeq>> {
        Ok(Box::new(HostSeq(self.model.new_mtp_state()?, self.room.clone(), None)))
    }

    fn mtp_forward(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], h_in: &[f32], draft: bool) -> xwen_engine::Result<Option<MtpDraft>> {
        MTP_PASSES.fetch_add(1, Ordering::Relaxed);
        let seq = seq.as_any_mut().downcast_mut::<HostSeq>().expect("this device's sequence");
        seq.at(pos);
        let h = self.model.hidden_width();
        let n = tokens.len();
        if !draft {
            return self.model.mtp_write_kv(&mut seq.0, tokens, h_in).map(|_| None);
        }
        if n > 1 {
            self.model.mtp_write_kv(&mut seq.0, &tokens[..n - 1], &h_in[..(n - 1) * h])?;
        }
        self.model.mtp_draft(&mut seq.0, tokens[n - 1], &h_in[(n - 1) * h..]).map(Some)
    }
}

/// Passes of MTP heads on stand-in devices, over all of them.
pub static MTP_PASSES: AtomicUsize = AtomicUsize::new(0);

impl DeviceSeq for HostSeq {
    fn try_clone(&self) -> xwen_engine::Result<Box<dyn DeviceSeq>> {
        Ok(Box::new(HostSeq(self.0.clone(), self.1.clone(), None)))
    }

    fn download(&self, layers: &mut [LayerState], pos: usize) -> xwen_engine::Result<()> {
        let mut c = HostSeq(self.0.clone(), self.1.clone(), None);
        c.at(pos);
        layers.clone_from_slice(&c.0.layers);
        Ok(())
    }

    /// The KV rows; the recurrent states come back as NaN, so a caller that should have taken
    /// them from a checkpoint and did not is seen.
    fn download_kv(&self, layers: &mut [LayerState], pos: usize) -> xwen_engine::Result<()> {
        self.download(layers, pos)?;
        for l in layers {
            if let LayerState::Delta(d) = l {
                d.conv.fill(f32::NAN);
                d.s.fill(f32::NAN);
            }
        }
        Ok(())
    }

    fn recurrent(&self) -> xwen_engine::Result<Vec<(usize, DeltaState)>> {
        Ok(self.0.host_recurrent())
    }

    fn set_recurrent(&mut self, states: &[(usize, DeltaState)]) -> xwen_engine::Result<()> {
        for (i, d) in states {
            let LayerState::Delta(cur) = &mut self.0.layers[*i] else { panic!("layer {i} is not recurrent") };
            cur.conv.clone_from(&d.conv);
            cur.s.clone_from(&d.s);
        }
        Ok(())
    }

    fn snapshot(&self) -> xwen_engine::Result<Option<Box<dyn DeviceSnapshot>>> {
        let states = self.recurrent()?;
        let bytes = states.iter().map(|(_, d)| (d.conv.len() + d.s.len()) * 4).sum::<usize>();
        if self.1.left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(bytes)).is_err() {
            return Ok(None);
        }
        self.1.taken.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Box::new(HostSnapshot { states, bytes, room: self.1.clone() })))
    }

    fn restore_snapshot(&mut self, snap: &dyn DeviceSnapshot) -> xwen_engine::Result<bool> {
        let Some(s) = snap.as_any().downcast_ref::<HostSnapshot>() else { return Ok(false) };
        if !Arc::ptr_eq(&s.room, &self.1) {
            return Ok(false);
        }
        self.set_recurrent(&s.states)?;
        self.1.restored.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    fn keep_history(&mut self, k: usize) {
        self.0.keep_history(k);
    }

    fn reserve_history(&mut self, k: usize) -> xwen_engine::Result<()> {
        self.1.reserved_kept.fetch_max(k, Ordering::Relaxed);
        Ok(())
    }

    fn rollback(&mut self, from: usize, to: usize) -> xwen_engine::Result<()> {
        assert_eq!(self.0.pos, from);
        ROLLBACKS.fetch_add(1, Ordering::Relaxed);
        self.0.rollback(to)
    }

    fn collect_hidden(&mut self, on: bool) -> bool {
        match (on, &self.2) {
            (true, None) => self.2 = Some(Vec::new()),
            (false, _) => self.2 = None,
            _ => {}
        }
        true
    }

    fn take_hidden(&mut self) -> Vec<f32> {
        self.2.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn bytes(&self) -> usize {
        self.0.bytes()
    }

    fn history_bytes(&self) -> usize {
        self.0.history_bytes()
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// A checkpoint kept by the stand-in device: its recurrent states, the room they take given
/// back when it drops.
pub struct HostSnapshot {
    states: Vec<(usize, DeltaState)>,
    bytes: usize,
    room: Arc<Room>,
}

impl DeviceSnapshot for HostSnapshot {
    fn download(&self) -> xwen_engine::Result<Vec<(usize, DeltaState)>> {
        Ok(self.states.clone())
    }

    fn layers(&self) -> Vec<usize> {
        self.states.iter().map(|(i, _)| *i).collect()
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for HostSnapshot {
    fn drop(&mut self) {
        self.room.left.fetch_add(self.bytes, Ordering::Relaxed);
    }
}

/// Every request of `reqs` through an engine of `parallel` slots over `m` (a stand-in device's
/// model or the CPU's): each request's tokens, in submission order.
pub fn run_engine(m: Model, reqs: Vec<EngineRequest>, parallel: usize, prefix: Option<PrefixCache>) -> Vec<Vec<u32>> {
    let n = reqs.len();
    let mut e = Engine::new(m, EngineOptions { parallel, draft: None, prefix });
    for r in reqs {
        e.submit(r);
    }
    let mut outs: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut steps = 0;
    while e.has_work() {
        for (id, o) in e.step() {
            match o {
                Output::Token { id: t, .. } => outs[id as usize - 1].push(t),
                Output::Failed(m) => panic!("request {id} failed: {m}"),
                _ => {}
            }
        }
        steps += 1;
        assert!(steps < 10_000, "the engine never drains");
    }
    outs
}
