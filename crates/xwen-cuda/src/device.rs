//! The CUDA model behind the engine's device seam (`xwen_engine::device`): `attach` puts a
//! loaded `Model`'s passes on a GPU, so the engine's scheduler, sessions, prefix cache and
//! drafting — and every front end built on them — run it there.

use crate::error::CudaError;
use crate::model::{CudaModel, CudaOptions, DevSeq, DevSnapshot, PromptSpan};
use std::any::Any;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use xwen_engine::state::{DeltaState, LayerState};
use xwen_engine::{DeviceModel, DevicePrompt, DeviceRow, DeviceSeq, DeviceSnapshot, EngineError, Model, MtpDraft, RowOut};

/// Loads `model`'s file onto device `opts.device` and puts the model's passes there; the
/// context is the model's (`EngineConfig::max_ctx`). Returns what the device is, in words.
pub fn attach(model: &mut Model, opts: &CudaOptions) -> crate::Result<String> {
    let opts = CudaOptions { n_ctx: model.max_context(), ..opts.clone() };
    // under --ram-budget the engine streams experts from disk into a bounded RAM cache: that
    // cache is the VRAM expert cache's host tier
    let store = model.streams_experts().then(|| model.expert_store());
    let takes = store.is_some();
    let mut cuda = CudaModel::load_with_store(model.gguf(), &opts, store)?;
    // the model's MTP head (its file's nextn block, or the sidecar it loaded) goes with it
    if let Some(xwen_engine::models::mtp::MtpHead::Qwen35(head)) = model.mtp() {
        cuda.load_mtp(&head.weights(), head.file(), model.gguf())?;
    }
    let mut dev = CudaDevice::new(cuda);
    dev.takes_streamed = takes;
    let dev = Arc::new(dev);
    let describe = dev.describe();
    model.attach_device(dev)?;
    Ok(describe)
}

/// Loads `model`'s file onto the GPUs `devices` — one rank each, every rank the trunk and a
/// block of every MoE layer's routed experts (`xwen_engine::shard`) — and puts the model's
/// passes on them as one device. Ranks on different GPUs reduce through NCCL where it is
/// installed (`XWEN_NCCL=0`: through host memory); ranks sharing a GPU (an ordinal given twice,
/// for tests) through host memory. One device is `attach`.
pub fn attach_group(model: &mut Model, opts: &CudaOptions, devices: &[usize]) -> crate::Result<String> {
    match devices {
        [] => return Err(CudaError::Unsupported("no GPUs given".into())),
        [d] => return attach(model, &CudaOptions { device: *d, ..opts.clone() }),
        _ => {}
    }
    if model.streams_experts() {
        return Err(CudaError::Unsupported("--ram-budget streams experts to one GPU's cache; a model split over GPUs holds every expert on one of them".into()));
    }
    let n = devices.len();
    let plan = xwen_engine::shard::ShardPlan::of_file(model.gguf(), n)?;
    // NCCL refuses ranks sharing a GPU (and is refused where it is missing): host memory then
    let nccl_off = std::env::var("XWEN_NCCL").is_ok_and(|v| v == "0");
    let (comms, how) = match (!nccl_off).then(|| crate::collective::Nccl::clique(devices)) {
        Some(Ok(c)) => (c, "NCCL".to_string()),
        Some(Err(e)) => (crate::collective::host_staged(n), format!("host memory ({e})")),
        None => (crate::collective::host_staged(n), "host memory".to_string()),
    };
    let mut ranks: Vec<Arc<dyn DeviceModel>> = Vec::with_capacity(n);
    for (r, (&dev, comm)) in devices.iter().zip(&comms).enumerate() {
        let shard = crate::model::DeviceShard { experts: plan.partition.block(r), comm: Arc::clone(comm) };
        let o = CudaOptions { device: dev, n_ctx: model.max_context(), shard: Some(shard), ..opts.clone() };
        ranks.push(Arc::new(CudaDevice::new(CudaModel::load(model.gguf(), &o)?)));
    }
    let abort: xwen_engine::runtime::ranks::AbortFn = Arc::new(move |r: usize, why: &str| comms[r].abort(why));
    let group = xwen_engine::runtime::ranks::DeviceGroup::new(ranks, abort)?;
    let describe = format!("{}; reductions through {how}", group.describe());
    model.attach_device(Arc::new(group))?;
    Ok(describe)
}

/// A `CudaModel` as the engine's `DeviceModel`: its passes take turns on the one stream.
pub struct CudaDevice {
    model: Mutex<CudaModel>,
    describe: String,
    bytes: u64,
    max_rows: usize,
    /// Whether the model's experts come from the engine's streamed store.
    takes_streamed: bool,
    /// Whether the model's MTP head is on the device.
    mtp: bool,
}

impl CudaDevice {
    pub fn new(model: CudaModel) -> CudaDevice {
        let mut describe = model.device().to_string();
        if let Some(c) = model.expert_cache_stats() {
            describe += &format!(", a VRAM expert cache of {} of {} experts a layer", c.slots, c.n_expert);
        }
        let bytes = model.device_bytes();
        let max_rows = model.max_decode_rows();
        let mtp = model.has_mtp();
        CudaDevice { model: Mutex::new(model), describe, bytes, max_rows, takes_streamed: false, mtp }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CudaModel> {
        // a pass that failed left nothing half-written the next one reads (its sequence is
        // the one that reports the error)
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn engine_error(e: CudaError) -> EngineError {
    match e {
        CudaError::Engine(e) => e,
        CudaError::ContextFull { pos, n_ctx } => EngineError::ContextFull { need: pos, max: n_ctx },
        CudaError::TokenOutOfRange { id, n_vocab } => EngineError::TokenOutOfRange { id, n_vocab },
        e => EngineError::Device(e.to_string()),
    }
}

/// One engine sequence's state on the device.
struct CudaSeq(DevSeq);

impl DeviceModel for CudaDevice {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn device_bytes(&self) -> u64 {
        self.bytes
    }

    fn takes_streamed_experts(&self) -> bool {
        self.takes_streamed
    }

    fn upload(&self, layers: &[LayerState], pos: usize) -> xwen_engine::Result<Box<dyn DeviceSeq>> {
        let m = self.lock();
        Ok(Box::new(CudaSeq(m.upload_seq(layers, pos).map_err(engine_error)?)))
    }

    fn forward(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], logits: Range<usize>, decode_order: bool) -> xwen_engine::Result<Vec<f32>> {
        let seq = seq.as_any_mut().downcast_mut::<CudaSeq>().ok_or_else(|| EngineError::Device("a sequence state of another device".into()))?;
        let mut m = self.lock();
        m.feed(&mut seq.0, pos, tokens, decode_order, logits).map_err(engine_error)
    }

    fn forward_argmax(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], banned: &[u32]) -> xwen_engine::Result<u32> {
        let seq = seq.as_any_mut().downcast_mut::<CudaSeq>().ok_or_else(|| EngineError::Device("a sequence state of another device".into()))?;
        let mut m = self.lock();
        m.feed_argmax(&mut seq.0, pos, tokens, banned).map_err(engine_error)
    }

    fn forward_verify_argmax(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], banned: &[u32]) -> xwen_engine::Result<Vec<u32>> {
        let seq = seq.as_any_mut().downcast_mut::<CudaSeq>().ok_or_else(|| EngineError::Device("a sequence state of another device".into()))?;
        let mut m = self.lock();
        m.feed_verify_argmax(&mut seq.0, pos, tokens, banned).map_err(engine_error)
    }

    fn forward_prompts(&self, spans: &mut [DevicePrompt<'_>]) -> Vec<xwen_engine::Result<RowOut>> {
        let mut out: Vec<Option<xwen_engine::Result<RowOut>>> = (0..spans.len()).map(|_| None).collect();
        let mut ours = Vec::with_capacity(spans.len());
        let mut members = Vec::with_capacity(spans.len());
        for (i, s) in spans.iter_mut().enumerate() {
            match s.seq.as_any_mut().downcast_mut::<CudaSeq>() {
                Some(seq) => {
                    ours.push(PromptSpan { seq: &mut seq.0, pos: s.pos, tokens: s.tokens, want: s.want.clone() });
                    members.push(i);
                }
                None => out[i] = Some(Err(EngineError::Device("a sequence state of another device".into()))),
            }
        }
        let results = self.lock().feed_spans(&mut ours);
        for (i, r) in members.into_iter().zip(results) {
            out[i] = Some(r.map_err(engine_error));
        }
        out.into_iter().map(|r| r.unwrap_or_else(|| Err(EngineError::Device("a prompt span with no result".into())))).collect()
    }

    fn forward_rows(&self, rows: &mut [DeviceRow<'_>]) -> xwen_engine::Result<Vec<RowOut>> {
        let mut batch = Vec::with_capacity(rows.len());
        for r in rows.iter_mut() {
            let seq = r.seq.as_any_mut().downcast_mut::<CudaSeq>().ok_or_else(|| EngineError::Device("a sequence state of another device".into()))?;
            batch.push((&mut seq.0, r.pos, r.token));
        }
        let mut m = self.lock();
        m.decode_batch(&mut batch).map_err(engine_error)?;
        // the greedy rows' picks (a logits row's is not used: it bans nothing)
        let bans: Vec<&[u32]> = rows.iter().map(|r| if r.logits { &[][..] } else { r.banned }).collect();
        let ids = m.greedy_picks(&bans).map_err(engine_error)?;
        rows.iter()
            .zip(ids)
            .enumerate()
            .map(|(i, (r, id))| if r.logits { m.batch_logits(i).map(RowOut::Logits).map_err(engine_error) } else { Ok(RowOut::Argmax(id)) })
            .collect()
    }

    fn max_rows(&self) -> usize {
        self.max_rows
    }

    fn prepare_rows(&self, rows: usize) -> xwen_engine::Result<()> {
        self.lock().capture_decode_batches(rows).map_err(engine_error)
    }

    fn prepare_verifies(&self, rows: usize) -> xwen_engine::Result<()> {
        self.lock().capture_verifies(rows).map_err(engine_error)
    }

    fn has_mtp(&self) -> bool {
        self.mtp
    }

    fn mtp_new_seq(&self) -> xwen_engine::Result<Box<dyn DeviceSeq>> {
        Ok(Box::new(CudaSeq(self.lock().mtp_new_seq().map_err(engine_error)?)))
    }

    fn mtp_forward(&self, seq: &mut dyn DeviceSeq, pos: usize, tokens: &[u32], h_in: &[f32], draft: bool) -> xwen_engine::Result<Option<MtpDraft>> {
        let seq = seq.as_any_mut().downcast_mut::<CudaSeq>().ok_or_else(|| EngineError::Device("a sequence state of another device".into()))?;
        let out = self.lock().mtp_feed(&mut seq.0, pos, tokens, h_in, draft).map_err(engine_error)?;
        Ok(out.map(|(token, prob, hidden)| MtpDraft { token, prob, hidden }))
    }

    /// The catch-up and the chain on the GPU as one graph, of at most 16 steps
    /// (`CudaModel::mtp_chain`; a drafter asking for more gets that many).
    fn mtp_draft_chain(&self, seq: &mut dyn DeviceSeq, pos: usize, lead: (&[u32], &[f32]), token: u32, h: &[f32], depth: usize) -> xwen_engine::Result<Vec<(u32, f32)>> {
        let seq = seq.as_any_mut().downcast_mut::<CudaSeq>().ok_or_else(|| EngineError::Device("a sequence state of another device".into()))?;
        self.lock().mtp_chain(&mut seq.0, pos, lead, token, h, depth).map_err(engine_error)
    }
}

impl DeviceSeq for CudaSeq {
    fn try_clone(&self) -> xwen_engine::Result<Box<dyn DeviceSeq>> {
        Ok(Box::new(CudaSeq(self.0.try_clone().map_err(engine_error)?)))
    }

    fn download(&self, layers: &mut [LayerState], pos: usize) -> xwen_engine::Result<()> {
        self.0.download(layers, pos, true).map_err(engine_error)
    }

    fn download_kv(&self, layers: &mut [LayerState], pos: usize) -> xwen_engine::Result<()> {
        self.0.download(layers, pos, false).map_err(engine_error)
    }

    fn recurrent(&self) -> xwen_engine::Result<Vec<(usize, DeltaState)>> {
        self.0.recurrent().map_err(engine_error)
    }

    fn set_recurrent(&mut self, states: &[(usize, DeltaState)]) -> xwen_engine::Result<()> {
        self.0.set_recurrent(states).map_err(engine_error)
    }

    fn snapshot(&self) -> xwen_engine::Result<Option<Box<dyn DeviceSnapshot>>> {
        Ok(self.0.snapshot().map_err(engine_error)?.map(|s| Box::new(CudaSnapshot(s)) as Box<dyn DeviceSnapshot>))
    }

    fn restore_snapshot(&mut self, snap: &dyn DeviceSnapshot) -> xwen_engine::Result<bool> {
        match snap.as_any().downcast_ref::<CudaSnapshot>() {
            Some(s) => self.0.restore_snapshot(&s.0).map_err(engine_error),
            None => Ok(false),
        }
    }

    fn keep_history(&mut self, k: usize) {
        self.0.keep_history(k);
    }

    fn reserve_history(&mut self, k: usize) -> xwen_engine::Result<()> {
        self.0.reserve_kept(k).map_err(engine_error)
    }

    fn rollback(&mut self, from: usize, to: usize) -> xwen_engine::Result<()> {
        self.0.rollback(from, to).map_err(engine_error)
    }

    fn collect_hidden(&mut self, on: bool) -> bool {
        self.0.collect_hidden(on);
        true
    }

    fn take_hidden(&mut self) -> Vec<f32> {
        self.0.take_hidden()
    }

    fn bytes(&self) -> usize {
        self.0.bytes()
    }

    fn history_bytes(&self) -> usize {
        self.0.history_bytes()
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// A checkpoint's recurrent states kept on the GPU (`DevSeq::snapshot`).
struct CudaSnapshot(DevSnapshot);

impl DeviceSnapshot for CudaSnapshot {
    fn download(&self) -> xwen_engine::Result<Vec<(usize, DeltaState)>> {
        self.0.download().map_err(engine_error)
    }

    fn layers(&self) -> Vec<usize> {
        self.0.layers()
    }

    fn bytes(&self) -> usize {
        self.0.bytes()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
