//! The MTP (NextN) draft head of Qwen3.8-Flash-Next (`qwen4exp`): one block after the trunk
//! (`nextn_predict_layers` 1, `blk.{n_layer}.*`) in the model file, or alone in a sidecar
//! (`convert_hf_to_gguf.py --mtp`). Reference: llama.cpp b11434 `src/models/qwen4exp.cpp`
//! `graph_mtp` (and `load_arch_tensors` for its tensors); transformers 5.23 drops `mtp.*` on
//! load and never runs it.
//!
//! Unlike qwen35's head it lives on the hc-wide residual: its h input is the trunk's residual
//! streams after the last layer and BEFORE the final mixer (llama.cpp's h_nextn, hc × hidden
//! wide), and its own output h' is its residual streams, which the next chained step reads.
//! For a token x_p at position p and the trunk's streams r_{p-1} (hc × hidden):
//!   e   = rms_norm(embed(x_p))·enorm                          [hidden], the same for every stream
//!   c_s = eh_proj · [e | rms_norm(r_{p-1,s})·hnorm_s]          per stream s, embedding first
//!   c   = one QSA (or dense) attention layer and MoE on the streams c, with the layer's own
//!         hyper-connection mixers and combines — a trunk layer's math, at block n_layer
//!   h'  = c                                                    [hc × hidden], chains
//!   logits = output · head_mix(c)    the head's own final mixer (`nextn.hc_head_*`), collapsed
//!                                    by the fused op, as llama.cpp builds it with a layer index

use super::hybrid::Config;
use super::qwen4exp::{self, Mixer};
use super::SpanOut;
use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::error::{EngineError, Result};
use crate::experts::store::ResidentExperts;
use crate::layers::attention::{self, AttnWeights};
use crate::layers::hyper_conn::{self, HcDims, HcMixer};
use crate::layers::moe::{self, MoeWeights};
use crate::layers::qsa::{self, QsaDims, QsaWeights};
use crate::profile::Op;
use crate::state::{KvCache, LayerState, SeqState};
use crate::weights::{Loader, Mat};
use std::ops::Range;
use std::sync::Arc;
use xwen_gguf::GgufFile;

pub struct Qwen4ExpMtp {
    cfg: Config,
    hc: HcDims,
    qsa: QsaDims,
    /// `n_layer`: the block index its tensors (and routed experts) carry.
    il: usize,
    eh_proj: Mat,
    enorm: Vec<f32>,
    /// Per-stream gammas [hc × hidden].
    hnorm: Vec<f32>,
    hc_attn: HcMixer,
    hc_ffn: HcMixer,
    mixer: Mixer,
    moe: MoeWeights,
    head_mix: HcMixer,
    store: ResidentExperts,
    file: Arc<GgufFile>,
    embed: Mat,
    output: Mat,
}

impl Qwen4ExpMtp {
    /// The head of `f` (a full file with a nextn block or an MTP-only sidecar); None when `f`
    /// has no nextn block.
    pub fn load(f: &Arc<GgufFile>) -> Result<Option<Qwen4ExpMtp>> {
        let (cfg, hc, qsa, ratios) = qwen4exp::dims(f)?;
        let il = cfg.n_layer;
        let p = |s: &str| format!("blk.{il}.{s}");
        let ld = Loader::new(f);
        if !ld.has(&p("nextn.eh_proj.weight")) {
            return Ok(None);
        }
        let h = cfg.hidden;
        let md = cfg.moe.ok_or_else(|| EngineError::BadHparams("qwen4exp MTP head without experts".into()))?;
        // the converter gives the MTP block the QSA layers' compress ratio; a file without the
        // entry runs it densely, as llama.cpp does
        let mixer = if ratios.get(il).is_some_and(|&r| r > 0) {
            Mixer::Qsa(QsaWeights::load(&ld, il, h, &cfg.attn, &qsa)?)
        } else {
            Mixer::Attn(AttnWeights::load(&ld, il, h, &cfg.attn)?)
        };
        let (moe, experts) = MoeWeights::load(&ld, il, h, &md)?;
        let mut head_mix = HcMixer::load(&ld, &p("nextn.hc_head"), &hc, false)?;
        head_mix.fused = true;
        let mut stacks: Vec<Option<[Mat; 3]>> = vec![None; il + 1];
        stacks[il] = Some(experts);
        let embed = ld.mat("token_embd.weight", cfg.n_vocab, h)?;
        let output = if ld.has("output.weight") { ld.mat("output.weight", cfg.n_vocab, h)? } else { embed.clone() };
        Ok(Some(Qwen4ExpMtp {
            il,
            eh_proj: ld.mat(&p("nextn.eh_proj.weight"), h, 2 * h)?,
            enorm: ld.vec(&p("nextn.enorm.weight"), h)?,
            hnorm: ld.vec(&p("nextn.hnorm.weight"), hc.hc * h)?,
            hc_attn: HcMixer::load(&ld, &p("hc_attn"), &hc, true)?,
            hc_ffn: HcMixer::load(&ld, &p("hc_ffn"), &hc, true)?,
            mixer,
            moe,
            head_mix,
            store: ResidentExperts::new(Arc::clone(f), stacks),
            file: Arc::clone(f),
            embed,
            output,
            cfg,
            hc,
            qsa,
        }))
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The width of the rows it reads and chains: hc streams of the trunk's width.
    pub fn hidden(&self) -> usize {
        self.hc.hc * self.cfg.hidden
    }

    pub fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }

    /// One sequence's head state at `max_ctx` positions: its layer's K and V, and a QSA
    /// layer's indexer keys.
    pub fn state_bytes(&self, max_ctx: usize, kv_types: (crate::config::KvType, crate::config::KvType)) -> u64 {
        let w = self.cfg.attn.kv_width();
        let idx = if matches!(self.mixer, Mixer::Qsa(_)) { kv_types.0.row_bytes(self.qsa.head_dim) } else { 0 };
        ((kv_types.0.row_bytes(w) + kv_types.1.row_bytes(w) + idx) as u64).saturating_mul(max_ctx as u64)
    }

    /// A fresh head state, position 0: the KV cache, then a QSA layer's indexer cache.
    pub fn new_state(&self, kv_types: (crate::config::KvType, crate::config::KvType)) -> SeqState {
        let mut layers = vec![LayerState::Attn(KvCache::new(kv_types))];
        if matches!(self.mixer, Mixer::Qsa(_)) {
            layers.push(LayerState::Attn(KvCache::new(kv_types)));
        }
        SeqState::new(layers)
    }

    /// Runs `tokens` at `state.pos`.., token k paired with row k of `h_in` (tokens × hc·hidden:
    /// the trunk's streams of the position before each token, or the head's own for a chained
    /// draft). Returns the logits of rows `logits` and every row's streams h'.
    pub fn forward(&self, ctx: &Ctx, state: &mut SeqState, tokens: &[u32], h_in: &[f32], logits: Range<usize>) -> Result<SpanOut> {
        self.run(ctx, state, tokens, h_in, logits, false)
    }

    /// The head's state over `tokens` as `forward` leaves it (the KV rows and the QSA
    /// indexer's pooled keys, which its mixer writes), without what follows the mixer: the
    /// MoE of 10 routed experts a row, the streams and the logits — what a drafter catching up
    /// on accepted rows needs.
    pub fn write_state(&self, ctx: &Ctx, state: &mut SeqState, tokens: &[u32], h_in: &[f32]) -> Result<()> {
        self.run(ctx, state, tokens, h_in, 0..0, true).map(|_| ())
    }

    fn run(&self, ctx: &Ctx, state: &mut SeqState, tokens: &[u32], h_in: &[f32], logits: Range<usize>, state_only: bool) -> Result<SpanOut> {
        let (h, hc, n) = (self.cfg.hidden, self.hc.hc, tokens.len());
        let w = hc * h;
        if n == 0 || h_in.len() != n * w || logits.end > n {
            return Err(EngineError::State(format!("MTP head: {n} tokens with {} hidden values (width {w}), logits of rows {logits:?}", h_in.len())));
        }
        let rows = Rows::from_spans([(n, state.pos, false)]);
        let mut res = self.eh_proj_streams(ctx, tokens, h_in)?;
        let (input, inj) = hyper_conn::mix(ctx, &self.hc_attn, &self.hc, &res, &rows);
        let out = match (&self.mixer, state.layers.as_mut_slice()) {
            (Mixer::Qsa(wq), [LayerState::Attn(kv), LayerState::Attn(ix)]) => qsa::forward(ctx, wq, &self.cfg.attn, &self.qsa, &input, &rows, &mut [kv], &mut [ix], self.il)?,
            (Mixer::Attn(wa), [LayerState::Attn(kv)]) => attention::forward(ctx, wa, &self.cfg.attn, &input, &rows, &mut [kv], self.il),
            _ => return Err(EngineError::State("MTP head: not a state of this head".into())),
        };
        if state_only {
            state.pos += n;
            return Ok(SpanOut { logits: Vec::new(), hidden: Vec::new(), argmax: None, picks: Vec::new() });
        }
        hyper_conn::combine(ctx, &self.hc, &mut res, &out, inj.as_deref().expect("a layer's mixer injects"));
        let (input, inj) = hyper_conn::mix(ctx, &self.hc_ffn, &self.hc, &res, &rows);
        let md = self.cfg.moe.as_ref().expect("loaded with experts");
        let f = moe::forward_rows(ctx, &self.moe, md, &self.store, self.il, &input, &rows, h, None)?;
        hyper_conn::combine(ctx, &self.hc, &mut res, &f, inj.as_deref().expect("a layer's mixer injects"));
        state.pos += n;
        let _sp = ctx.span(Op::LmHead);
        let k = logits.len();
        let logits = if k == 0 {
            Vec::new()
        } else {
            let head_rows = Rows::from_spans([(k, 0, false)]);
            let (normed, _) = hyper_conn::mix(ctx, &self.head_mix, &self.hc, &res[logits.start * w..logits.end * w], &head_rows);
            ctx.mm_rows1(&self.output, &normed, &head_rows).to_vec()
        };
        Ok(SpanOut { logits, hidden: res, argmax: None, picks: Vec::new() })
    }

    /// eh_proj over every stream of every row: [rms_norm(e)·enorm | rms_norm(r_s)·hnorm_s]
    /// (rows × hc × 2·hidden) → the head's residual streams (rows × hc × hidden).
    fn eh_proj_streams(&self, ctx: &Ctx, tokens: &[u32], h_in: &[f32]) -> Result<Vec<f32>> {
        let (h, hc, eps, n) = (self.cfg.hidden, self.hc.hc, self.cfg.eps, tokens.len());
        let mut e = ctx.zeros(n * h);
        {
            let _sp = ctx.span(Op::Embed);
            let emb = ctx.q(&self.embed);
            let rb = self.embed.row_bytes();
            for (&id, er) in tokens.iter().zip(e.chunks_exact_mut(h)) {
                let id = id as usize;
                if id >= self.cfg.n_vocab {
                    return Err(EngineError::TokenOutOfRange { id: id as u32, n_vocab: self.cfg.n_vocab });
                }
                xwen_kernels::dequantize(emb.ty, &emb.data[id * rb..(id + 1) * rb], er).map_err(|err| EngineError::State(format!("MTP embedding: {err}")))?;
            }
        }
        let _sp = ctx.span(Op::Norms);
        let (mut en, mut hn) = (ctx.zeros(n * h), ctx.zeros(n * hc * h));
        ctx.backend.rms_norm(&e, &self.enorm, eps, &mut en);
        ctx.backend.rms_norm_streams(h_in, &self.hnorm, h, eps, &mut hn);
        // [en_t | hn_{t,s}] per (row, stream)
        let mut cat = vec![0.0f32; n * hc * 2 * h];
        for (t, c) in cat.chunks_exact_mut(hc * 2 * h).enumerate() {
            for (s, cs) in c.chunks_exact_mut(2 * h).enumerate() {
                cs[..h].copy_from_slice(&en[t * h..(t + 1) * h]);
                cs[h..].copy_from_slice(&hn[(t * hc + s) * h..][..h]);
            }
        }
        Ok(ctx.mm_rows1(&self.eh_proj, &cat, &Rows::single(n * hc, 0)).to_vec())
    }
}
