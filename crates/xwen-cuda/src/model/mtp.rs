//! The MTP (NextN) draft head on the device — what `xwen_engine::models::mtp` computes on the
//! CPU: [rms_norm(embed(token))·enorm | rms_norm(h)·hnorm] through eh_proj, one decoder layer
//! (gated attention over the head's own KV rows, then its FFN or MoE), the head's norm and its
//! output product, whose argmax is the draft.
//!
//! The head's rows run as a verify's rows do: consecutive positions of its one sequence, each
//! computed as a decode row, with the layer's state pointers in a table. A proposal is a chain
//! of draft steps (each step's token and hidden row feeding the next from device memory)
//! captured as one graph, like a decode step; it copies back each step's token and the
//! probability softmax gives it in one read, not a vocabulary's logits. Drafts decide only how fast output comes — the target's verify decides
//! what it is — so the head's bits need not be the CPU head's.

use super::forward::{Layout, Pass};
use super::*;
use xwen_engine::models::mtp::MtpWeights;

/// Where a graph of the head's pass of n rows is kept (`CudaModel::graphs`): beside the decode
/// batches' (0) and verifies' (1, 2).
const GRAPH_MTP: u8 = 8;
/// A draft chain's graph (by its first pass's rows and its steps: `chain_key`).
const GRAPH_CHAIN: u8 = 10;
/// Steps a draft chain takes at most (a drafter's depth; llama.cpp's --draft-max is 16 by default).
const CHAIN_MAX: usize = 16;
/// A later chain step's table: a word unused (its token comes from the step before), its
/// position (i32), then the head's K and V caches.
const CHAIN_TABLE: usize = 24;

/// The graph of a draft chain whose first pass takes `n` rows, of `depth` steps.
fn chain_key(n: usize, depth: usize) -> (usize, u8) {
    (n * (CHAIN_MAX + 1) + depth, GRAPH_CHAIN)
}

/// Where a head pass reads its tokens and hidden rows, its layer's state pointers, and where a
/// draft's answer goes.
#[derive(Clone, Copy)]
struct MtpIo {
    ids: u64,
    h_in: u64,
    st: super::forward::LayerPtrs,
    out: u64,
}

pub(super) struct MtpHead {
    eh_proj: DevMat,
    enorm: DevBuf,
    hnorm: DevBuf,
    /// The head's own token embedding and output product, where it has them (a sidecar's);
    /// None: the trunk's.
    embed: Option<DevMat>,
    head: Option<DevMat>,
    head_norm: DevBuf,
    layer: DevLayer,
    eh_kinds: Kinds,
    head_kinds: Kinds,
    /// A head state's shape: one attention layer.
    shape: SeqShape,
    /// A pass's hidden rows in (rows × hidden) and eh_proj's input rows (rows × 2·hidden).
    h_in: DevBuf,
    cat: DevBuf,
    /// A draft step's answer (`argmax_answer`): the head's hidden row, the draft's probability, its
    /// token — one a step of a draft chain (`CHAIN_MAX` of them, each `h + 2` floats).
    out: DevBuf,
    /// A draft chain's tables, one a step after its first (`CHAIN_TABLE` bytes).
    chain: DevBuf,
    /// The argmax blocks' online-softmax partials (max, sum) of a draft step (`argmax_answer`).
    part_ms: DevBuf,
    /// Rows a pass takes (the decode batch's, within the q8 scratch's room for 2·hidden).
    rows: usize,
}

impl CudaModel {
    /// Uploads an MTP head (`w`, from the file `file`; `trunk`: the model's own file). Where
    /// the head's token embedding or output is the trunk's — the same tensor of the same file,
    /// or a sidecar's copy of its very bytes — it shares the trunk's on the device instead of a
    /// second copy (on a 35B-A3B the two are ~0.8 GB).
    pub(crate) fn load_mtp(&mut self, w: &MtpWeights<'_>, file: &GgufFile, trunk: &GgufFile) -> Result<()> {
        if self.shard.is_some() {
            return Err(CudaError::Unsupported("an MTP head on a model split over GPUs".into()));
        }
        self.gpu.ctx.bind_to_thread()?;
        let h = self.d.hidden;
        let (eh, emb, out) = (w.eh_proj, w.embed, w.head);
        if eh.rows != h || eh.cols != 2 * h || emb.cols != h || out.cols != h || out.rows != self.d.n_vocab || w.enorm.len() != h || w.hnorm.len() != h {
            return Err(CudaError::Unsupported(format!("an MTP head of eh_proj {}×{} for a trunk {h} wide", eh.rows, eh.cols)));
        }
        if !matches!(w.layer.mixer, Mixer::Attn(_)) {
            return Err(CudaError::Unsupported("an MTP head whose layer is not attention".into()));
        }
        let (own_embed, own_head) = plan::owns_embed_head(w, file, trunk);
        // what it takes, refused with the sizes where it does not fit
        let free_now = |g: &Gpu| g.ctx.mem_get_info().map_or(0, |(f, _)| f as u64);
        let before = free_now(&self.gpu);
        let kv_width = self.d.n_head_kv * self.d.hd;
        let need = plan::mtp_device_bytes(w, file, (own_embed, own_head), self.layers.len(), self.n_ctx * kv_width, self.n_seq);
        if need + (256 << 20) > before {
            return Err(CudaError::TooBig {
                need_mib: need >> 20,
                free_mib: before >> 20,
                device: format!("cuda:{} ({})", self.gpu.info.ordinal, self.gpu.info.name),
                what: format!("the MTP head, and its KV rows at -c {} for {} sequence(s), beside the model", self.n_ctx, self.n_seq.max(1)),
            });
        }
        let gpu = &self.gpu;
        let up = Uploader { gpu, file };
        let embed = if own_embed { Some(up.mat(emb)?) } else { None };
        let head = if own_head { Some(up.mat(out)?) } else { None };
        let experts = match w.experts {
            Some(ex) => Some([up.mat(&ex[0])?, up.mat(&ex[1])?, up.mat(&ex[2])?]),
            None => None,
        };
        let layer = dev_layer(&up, self.layers.len(), w.layer, experts)?;
        let eh_proj = up.mat(eh)?;
        let head_kinds = match &head {
            Some(m) => Kinds::of(&[m]),
            None => self.head_kinds,
        };
        // eh_proj's q8 input goes to the products' scratch (xq_b): rows that fit it
        let rows = self.decode_max.min(self.sc.xq_b.bytes() / (2 * h)).min(self.sc.xd_b.bytes() / ((2 * h).div_ceil(32) * 8)).max(1);
        let head = MtpHead {
            eh_kinds: Kinds::of(&[&eh_proj]),
            eh_proj,
            enorm: gpu.upload_f32(w.enorm)?,
            hnorm: gpu.upload_f32(w.hnorm)?,
            embed,
            head,
            head_norm: gpu.upload_f32(w.head_norm)?,
            layer,
            head_kinds,
            shape: SeqShape { layers: vec![seq::LayerShape::Attn { kv_width }], n_ctx: self.n_ctx },
            h_in: gpu.zeros(rows * h * 4)?,
            cat: gpu.zeros(rows * 2 * h * 4)?,
            out: gpu.zeros(CHAIN_MAX * (h + 2) * 4)?,
            chain: gpu.zeros(CHAIN_MAX * CHAIN_TABLE)?,
            part_ms: gpu.zeros(2 * forward::ARGMAX_BLOCKS * 4)?,
            rows,
        };
        gpu.sync()?;
        self.device_bytes += before.saturating_sub(free_now(gpu));
        self.mtp = Some(head);
        Ok(())
    }

    pub(crate) fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// The head, or the error of a model without one on the device.
    fn mtp_head(&self) -> Result<&MtpHead> {
        self.mtp.as_ref().ok_or_else(|| CudaError::Unsupported("this model has no MTP head on the device".into()))
    }

    /// A fresh head state: its attention layer's KV rows for the context, position 0.
    pub(crate) fn mtp_new_seq(&self) -> Result<DevSeq> {
        let m = self.mtp_head()?;
        self.gpu.ctx.bind_to_thread()?;
        DevSeq::zeroed(&self.gpu, &m.shape)
    }

    /// Feeds `tokens` from `pos` to the head's state `seq`, token k with hidden row k of
    /// `h_in`, in passes of up to the head's rows; with `draft`, the last row's draft: its
    /// token, its probability and the head's hidden row after its norm.
    pub(crate) fn mtp_feed(&mut self, seq: &mut DevSeq, pos: usize, tokens: &[u32], h_in: &[f32], draft: bool) -> Result<Option<(u32, f32, Vec<f32>)>> {
        self.gpu.ctx.bind_to_thread()?;
        let h = self.d.hidden;
        let rows = self.mtp_head()?.rows;
        if tokens.is_empty() || h_in.len() != tokens.len() * h {
            return Err(CudaError::Unsupported(format!("an MTP pass of {} tokens with {} hidden values (width {h})", tokens.len(), h_in.len())));
        }
        if !matches!(seq.layers.as_slice(), [SeqLayer::Attn { .. }]) {
            return Err(CudaError::Unsupported("not a state of the MTP head".into()));
        }
        self.check(pos, tokens)?;
        let chunks = tokens.len().div_ceil(rows);
        for (c, (toks, hs)) in tokens.chunks(rows).zip(h_in.chunks(rows * h)).enumerate() {
            let last = draft && c + 1 == chunks;
            self.write_mtp_rows(seq, pos + c * rows, toks, hs)?;
            let n = toks.len();
            let io = self.rows_io(n)?;
            self.run_graph((n, GRAPH_MTP + last as u8), |m| m.record_mtp(n, last, io))?;
        }
        if !draft {
            return Ok(None);
        }
        let mut hidden = self.gpu.read_f32_at(&self.mtp_head()?.out, 0, h + 2)?;
        let token = hidden.pop().map_or(0, f32::to_bits);
        let prob = hidden.pop().unwrap_or(0.0);
        Ok(Some((token, prob, hidden)))
    }

    /// The head catching up on `lead` (tokens from `pos` with their hidden rows: the rows kept
    /// since its last draft), then `depth` draft steps from `token` at `pos + lead.len()` with
    /// the hidden row `h`: the catch-up rows and the first step are one pass of the head (the
    /// step its last row), each later step fed the token and hidden row of the one before it
    /// without a copy to the host, the whole one graph, its drafts and their probabilities
    /// read back at once. (Every step runs; the drafter cuts the chain where a probability
    /// falls below its p_min.)
    pub(crate) fn mtp_chain(&mut self, seq: &mut DevSeq, pos: usize, lead: (&[u32], &[f32]), token: u32, h: &[f32], depth: usize) -> Result<Vec<(u32, f32)>> {
        self.gpu.ctx.bind_to_thread()?;
        let hd = self.d.hidden;
        let depth = depth.min(CHAIN_MAX);
        let rows = self.mtp_head()?.rows;
        if depth == 0 || h.len() != hd || lead.1.len() != lead.0.len() * hd {
            return Err(CudaError::Unsupported(format!("a draft chain of {depth} from a hidden row of {} (width {hd}) after {} rows", h.len(), lead.0.len())));
        }
        let [SeqLayer::Attn { k, v }] = seq.layers.as_slice() else {
            return Err(CudaError::Unsupported("not a state of the MTP head".into()));
        };
        let (k, v) = (k.ptr, v.ptr);
        self.check(pos, &vec![token; lead.0.len() + depth])?;
        // catch-up rows beyond one pass's room first, on their own
        let first = lead.0.len().saturating_sub(rows - 1);
        if first > 0 {
            self.mtp_feed(seq, pos, &lead.0[..first], &lead.1[..first * hd], false)?;
        }
        let (pos, lead, lead_h) = (pos + first, &lead.0[first..], &lead.1[first * hd..]);
        let n = lead.len() + 1;
        let tokens: Vec<u32> = lead.iter().copied().chain([token]).collect();
        let h_in: Vec<f32> = lead_h.iter().chain(h).copied().collect();
        self.write_mtp_rows(seq, pos, &tokens, &h_in)?;
        // the later steps' tables: their positions and the head's K and V caches
        let pos0 = pos + lead.len();
        let mut bytes = vec![0u8; (depth - 1) * CHAIN_TABLE];
        for (i, t) in bytes.chunks_exact_mut(CHAIN_TABLE).enumerate() {
            t[4..8].copy_from_slice(&((pos0 + 1 + i) as i32).to_le_bytes());
            t[8..16].copy_from_slice(&k.to_le_bytes());
            t[16..24].copy_from_slice(&v.to_le_bytes());
        }
        let m = self.mtp.as_mut().expect("checked above");
        self.gpu.write(&mut m.chain, &bytes)?;
        let (io, ios) = (self.rows_io(n)?, self.chain_ios(depth)?);
        self.run_graph(chain_key(n, depth), |m| m.record_chain(n, io, &ios))?;
        let all = self.gpu.read_f32_at(&self.mtp_head()?.out, 0, depth * (hd + 2))?;
        Ok(all.chunks_exact(hd + 2).map(|a| (a[hd + 1].to_bits(), a[hd])).collect())
    }

    /// Enqueues a draft chain: the head's pass of `n` rows (its last row the first step), then
    /// the later steps (`chain_ios`).
    fn record_chain(&self, n: usize, io: MtpIo, ios: &[MtpIo]) -> Result<()> {
        self.record_mtp(n, true, io)?;
        ios.iter().try_for_each(|&io| self.record_mtp(1, true, io))
    }

    /// A draft chain's steps after its first, of `depth` in all: step i (from 1) reads its
    /// position and the head's caches from table i − 1, its token and hidden row from the
    /// answer of the step before it.
    fn chain_ios(&self, depth: usize) -> Result<Vec<MtpIo>> {
        let m = self.mtp_head()?;
        let hd = self.d.hidden;
        let (chain, out) = (m.chain.ptr, m.out.ptr);
        let step = (hd + 2) * 4;
        Ok((1..depth)
            .map(|i| {
                let at = |b: usize| chain + ((i - 1) * CHAIN_TABLE + b) as u64;
                let prev = out + ((i - 1) * step) as u64;
                let st = super::forward::LayerPtrs::one_sequence(at(8), at(4));
                MtpIo { ids: prev + (4 * (hd + 1)) as u64, h_in: prev, st, out: out + (i * step) as u64 }
            })
            .collect())
    }

    /// The head's passes of 1 to `rows` rows (catching up on a verify's kept rows where a
    /// drafter is paused) and its draft chains of 1 to `rows − 1` steps after 0 to `rows`
    /// kept rows captured now, where the model has a head on the device, so that a drafted
    /// request's first steps of each size do not pay a capture (on a small model a capture
    /// costs more than the steps it serves: tens of steps of ~0.2 ms).
    pub(crate) fn capture_mtp(&mut self, rows: usize) -> Result<()> {
        let Some(head_rows) = self.mtp.as_ref().map(|m| m.rows) else { return Ok(()) };
        if !self.use_graph {
            return Ok(());
        }
        self.gpu.ctx.bind_to_thread()?;
        for n in 1..=rows.min(head_rows) {
            let io = self.rows_io(n)?;
            self.capture_with((n, GRAPH_MTP), |m| m.record_mtp(n, false, io))?;
        }
        for n in 1..=(rows + 1).min(head_rows) {
            for depth in 1..=rows.saturating_sub(1).min(CHAIN_MAX) {
                let (io, ios) = (self.rows_io(n)?, self.chain_ios(depth)?);
                self.capture_with(chain_key(n, depth), |m| m.record_chain(n, io, &ios))?;
            }
        }
        Ok(())
    }

    /// The head pass of `n` rows as its table put it (`write_mtp_rows`): its io.
    fn rows_io(&self, n: usize) -> Result<MtpIo> {
        let m = self.mtp_head()?;
        let st = self.layer_ptrs(Pass::Verify { n, hist: false }, 0)?;
        Ok(MtpIo { ids: self.sc.rows.ptr, h_in: m.h_in.ptr, st, out: m.out.ptr })
    }

    /// A head pass's table (`forward::rows_table_at` with the head's layer as layer 0): the
    /// rows' tokens, positions and the head state's K and V caches; and its hidden rows.
    fn write_mtp_rows(&mut self, seq: &DevSeq, pos: usize, tokens: &[u32], h_in: &[f32]) -> Result<()> {
        let b = tokens.len();
        let [SeqLayer::Attn { k, v }] = seq.layers.as_slice() else {
            return Err(CudaError::Unsupported("not a state of the MTP head".into()));
        };
        let (at_pos, at, _) = forward::rows_table_at(b, 0, self.layers.len());
        let mut bytes = vec![0u8; at + 16 * b];
        for (r, &t) in tokens.iter().enumerate() {
            bytes[4 * r..4 * r + 4].copy_from_slice(&(t as i32).to_le_bytes());
            bytes[at_pos + 4 * r..at_pos + 4 * r + 4].copy_from_slice(&((pos + r) as i32).to_le_bytes());
            bytes[at + 16 * r..at + 16 * r + 8].copy_from_slice(&k.ptr.to_le_bytes());
            bytes[at + 16 * r + 8..at + 16 * r + 16].copy_from_slice(&v.ptr.to_le_bytes());
        }
        self.gpu.write(&mut self.sc.rows, &bytes)?;
        let m = self.mtp.as_mut().ok_or_else(|| CudaError::Unsupported("this model has no MTP head on the device".into()))?;
        self.gpu.write(&mut m.h_in, as_bytes(h_in))
    }

    /// Enqueues the head's pass of `n` rows (its table written): the input rows, eh_proj, the
    /// layer into x; with `draft`, the last row's head, argmax (into `token`) and probability.
    fn record_mtp(&self, n: usize, draft: bool, io: MtpIo) -> Result<()> {
        let m = self.mtp_head()?;
        let (g, sc, d) = (&self.gpu, &self.sc, &self.d);
        let h = d.hidden;
        let embed = m.embed.as_ref().unwrap_or(&self.tok_embd);
        let args = [
            Arg::Ptr(embed.ptr),
            Arg::I32(embed.ty),
            Arg::I64(embed.row_bytes as i64),
            Arg::Ptr(io.ids),
            Arg::Ptr(io.h_in),
            Arg::Ptr(m.enorm.ptr),
            Arg::Ptr(m.hnorm.ptr),
            Arg::Ptr(m.cat.ptr),
            Arg::I32(h as i32),
            Arg::F32(d.eps),
        ];
        g.launch("mtp_concat_norm", (n as u32, 2), 256, 0, &args)?;
        let cat = self.input(m.cat.ptr, 2 * h, n, true, m.eh_kinds)?;
        self.proj(&m.eh_proj, cat, sc.x.ptr, None, n, Layout::Rows)?;
        // the layer, as a verify's rows: the head's state pointers are the table's layer 0
        let l = &m.layer;
        let DevMixer::Attn(w) = &l.mixer else { return Err(CudaError::Unsupported("an MTP head whose layer is not attention".into())) };
        let xn = self.rms_norm(sc.x.ptr, l.attn_norm.ptr, n, true, l.kinds.mix_in)?;
        self.attention(w, io.st, xn, l.kinds.mix_out, n, Layout::Rows, None)?;
        let xn = self.rms_norm(sc.x.ptr, l.post_norm.ptr, n, true, l.kinds.ffn_in)?;
        match &l.ffn {
            DevFfn::Dense(w) => {
                self.glu(w, xn, sc.ffn_h.ptr, n, Layout::Rows)?;
                let hin = self.input(sc.ffn_h.ptr, w.down.cols, n, true, l.kinds.ffn_mid)?;
                self.proj_residual(&w.down, hin, n, Layout::Rows, None)?;
            }
            DevFfn::Moe(w) => {
                // (layer index past the trunk's: its experts are resident, not the VRAM cache's)
                self.moe(self.layers.len(), w, xn, &l.kinds, n, Layout::Rows, None)?;
            }
        }
        if !draft {
            return Ok(());
        }
        // the last row's head: its norm into xn's row 0 (the hidden row a draft chains from)
        let xn = self.rms_norm(sc.x.at((n - 1) * h * 4), m.head_norm.ptr, 1, true, m.head_kinds)?;
        self.proj(m.head.as_ref().unwrap_or(&self.output), xn, sc.logits.ptr, None, 1, Layout::Rows)?;
        // the argmax, its probability and the hidden row into the step's answer, in one launch
        let (blocks, [a0, a1, a2, a3, a4, a5]) = self.argmax_grid();
        let args = [a0, a1, a2, a3, a4, a5, Arg::Ptr(sc.xn.ptr), Arg::I32(h as i32), Arg::Ptr(io.out), Arg::Ptr(m.part_ms.ptr)];
        g.launch("argmax_answer", (blocks, 1), 1024, 0, &args)
    }
}
