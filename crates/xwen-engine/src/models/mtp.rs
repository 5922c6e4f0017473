//! The MTP (NextN) draft heads: [`MtpHead`] is the one the drafter drives, whichever family's
//! head a file carries (qwen4exp's is `models::qwen4exp_mtp`, on the hc-wide residual).
//!
//! The MTP (NextN) draft head of Qwen3.5 / 3.6 (`qwen35`, `qwen35moe`): the "-MTP" GGUFs carry
//! one extra block after the trunk (`nextn_predict_layers` 1, `blk.{n_layer}.*`), or a sidecar
//! GGUF carries it alone (`convert_hf_to_gguf.py --mtp`).
//! Reference: llama.cpp b11434 `src/models/qwen35.cpp` / `qwen35moe.cpp` `graph_mtp`; the
//! drafting semantics (which hidden pairs with which token) are `common/speculative.cpp`'s
//! `common_speculative_impl_draft_mtp`, which `runtime::speculative::MtpDrafter` follows.
//!
//! For a token x_p at position p and the trunk's final hidden h_{p-1} (after output_norm):
//!   e   = embed(x_p)                                     [hidden]  nextn.embed_tokens or token_embd
//!   c   = eh_proj · [rms_norm(e)·enorm | rms_norm(h)·hnorm]   [2·hidden → hidden]  embedding first
//!   c   = decoder layer (gated full attention over the head's own KV cache, then the FFN or MoE),
//!         both residuals anchored on eh_proj's output
//!   h'  = rms_norm(c)·(nextn.shared_head_norm or output_norm)  the head's own h_nextn (chains)
//!   logits = (nextn.shared_head_head or output) · h'       predicts x_{p+1}

use super::hybrid::{self, Config, Ffn, Layer, Mixer, Placed};
use super::{SpanIn, SpanOut};
use crate::backend::Cols;
use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::error::{EngineError, Result};
use crate::experts::store::ResidentExperts;
use crate::layers::attention::AttnWeights;
use crate::state::KvCache;
use crate::layers::attn_res::Bank;
use crate::layers::ffn::FfnWeights;
use crate::layers::moe::MoeWeights;
use crate::profile::Op;
use crate::state::{LayerState, SeqState};
use crate::weights::{Loader, Mat};
use std::ops::Range;
use std::sync::Arc;
use xwen_gguf::GgufFile;

/// The qwen35 / qwen35moe head.
pub struct Qwen35Mtp {
    /// The trunk's geometry (the head's attention and FFN have the trunk's dims).
    cfg: Config,
    /// `n_layer`: the block index its tensors (and routed experts) carry.
    il: usize,
    eh_proj: Mat,
    enorm: Vec<f32>,
    hnorm: Vec<f32>,
    layer: Layer,
    /// Routed experts of an MoE head (at block `il`), served from the mapping.
    store: ResidentExperts,
    /// Their gate, up and down stacks (what a device uploads).
    experts: Option<[Mat; 3]>,
    /// The file the head's weights live in (the model's own, or a sidecar).
    file: Arc<GgufFile>,
    embed: Mat,
    head_norm: Vec<f32>,
    head: Mat,
}

impl Qwen35Mtp {
    /// The head of `f` (a full "-MTP" GGUF or an MTP-only sidecar) for the trunk geometry `cfg`
    /// of `f`'s own metadata; None when `f` has no nextn block.
    pub fn load(f: &Arc<GgufFile>, cfg: &Config) -> Result<Option<Qwen35Mtp>> {
        let il = cfg.n_layer;
        let p = |s: &str| format!("blk.{il}.{s}");
        let ld = Loader::new(f);
        if !ld.has(&p("nextn.eh_proj.weight")) {
            return Ok(None);
        }
        let h = cfg.hidden;
        let (ffn, experts) = match &cfg.moe {
            Some(md) => {
                let (w, ex) = MoeWeights::load(&ld, il, h, md)?;
                (Ffn::Moe(w), Some(ex))
            }
            None => (Ffn::Dense(FfnWeights::load(&ld, il, h, cfg.ff, "")?), None),
        };
        let layer = Layer {
            attn_norm: ld.vec(&p("attn_norm.weight"), h)?,
            post_attn_norm: ld.vec(&p("post_attention_norm.weight"), h)?,
            mixer: Mixer::Attn(AttnWeights::load(&ld, il, h, &cfg.attn)?),
            ffn,
            res: None,
        };
        let embed = if ld.has(&p("nextn.embed_tokens.weight")) {
            ld.mat(&p("nextn.embed_tokens.weight"), cfg.n_vocab, h)?
        } else {
            ld.mat("token_embd.weight", cfg.n_vocab, h)?
        };
        let head_norm =
            if ld.has(&p("nextn.shared_head_norm.weight")) { ld.vec(&p("nextn.shared_head_norm.weight"), h)? } else { ld.vec("output_norm.weight", h)? };
        let head = if ld.has(&p("nextn.shared_head_head.weight")) {
            ld.mat(&p("nextn.shared_head_head.weight"), cfg.n_vocab, h)?
        } else if ld.has("output.weight") {
            ld.mat("output.weight", cfg.n_vocab, h)?
        } else {
            ld.mat("token_embd.weight", cfg.n_vocab, h)?
        };
        let mut stacks: Vec<Option<[Mat; 3]>> = vec![None; il + 1];
        stacks[il] = experts.clone();
        Ok(Some(Qwen35Mtp {
            cfg: cfg.clone(),
            il,
            experts,
            store: ResidentExperts::new(Arc::clone(f), stacks),
            file: Arc::clone(f),
            eh_proj: ld.mat(&p("nextn.eh_proj.weight"), h, 2 * h)?,
            enorm: ld.vec(&p("nextn.enorm.weight"), h)?,
            hnorm: ld.vec(&p("nextn.hnorm.weight"), h)?,
            layer,
            embed,
            head_norm,
            head,
        }))
    }

    /// The file the head's weights live in.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The head's weights as loaded, for a device that computes it (the CUDA backend's).
    pub fn weights(&self) -> MtpWeights<'_> {
        MtpWeights {
            eh_proj: &self.eh_proj,
            enorm: &self.enorm,
            hnorm: &self.hnorm,
            layer: &self.layer,
            experts: self.experts.as_ref(),
            embed: &self.embed,
            head_norm: &self.head_norm,
            head: &self.head,
        }
    }

    pub fn hidden(&self) -> usize {
        self.cfg.hidden
    }

    pub fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }

    /// Whether a trunk of geometry `trunk` can take this head's drafts: the same width and
    /// vocabulary.
    pub fn fits(&self, trunk_hidden: usize, trunk_vocab: usize) -> bool {
        self.cfg.hidden == trunk_hidden && self.cfg.n_vocab == trunk_vocab
    }

    /// One sequence's head state at `max_ctx` positions: its one attention layer's K and V.
    pub fn state_bytes(&self, max_ctx: usize, kv_types: (crate::config::KvType, crate::config::KvType)) -> u64 {
        let w = self.cfg.attn.kv_width();
        ((kv_types.0.row_bytes(w) + kv_types.1.row_bytes(w)) as u64).saturating_mul(max_ctx as u64)
    }

    /// A fresh head state (its one KV cache), position 0.
    pub fn new_state(&self, kv_types: (crate::config::KvType, crate::config::KvType)) -> SeqState {
        SeqState::new(vec![LayerState::Attn(KvCache::new(kv_types))])
    }

    /// Runs `tokens` at `state.pos`.., token k paired with the hidden row k of `h_in`
    /// (tokens × hidden: the trunk's hidden of the position before each token, or the head's
    /// own for a chained draft). Returns the logits of rows `logits` and every row's h'.
    /// `ctx.file` must be `self.file()`.
    pub fn forward(&self, ctx: &Ctx, state: &mut SeqState, tokens: &[u32], h_in: &[f32], logits: Range<usize>) -> Result<SpanOut> {
        let h = self.cfg.hidden;
        let n = tokens.len();
        self.check(state, tokens, h_in)?;
        let cat = self.eh_input(ctx, tokens, h_in)?;
        let rows = Rows::from_spans([(n, state.pos, false)]);
        // c = eh_proj · concat   [n × hidden]
        let mut x = ctx.mm_rows1(&self.eh_proj, &cat, &rows);
        let mut xn = vec![0.0f32; n * h];
        let pass =
            hybrid::LayerPass { ctx, cfg: &self.cfg, attn_res: None, store: &self.store, at: Placed { store_layer: self.il, state_layer: 0 }, layer: &self.layer, next_moe: None };
        pass.forward(&mut x, &mut xn, &mut [&mut *state], &rows, &mut Bank::default())?;
        state.pos += n;
        let span = SpanIn { tokens, logits, decode_order: false, hidden: true };
        let out = hybrid::head(ctx, &x, &rows, std::slice::from_ref(&span), &self.head_norm, &self.head, &self.cfg);
        Ok(out.into_iter().next().unwrap_or_default())
    }

    /// Only the head's KV rows for `tokens` at `state.pos`.. (as `forward` writes them: the
    /// same bits), without the attention, the FFN or the logits — for kept rows whose output
    /// nobody reads (a drafter catching up on the rows a verify accepted; only the last one
    /// drafts). On an MoE head this also skips routing those rows to experts.
    pub fn write_kv(&self, ctx: &Ctx, state: &mut SeqState, tokens: &[u32], h_in: &[f32]) -> Result<()> {
        let (h, n) = (self.cfg.hidden, tokens.len());
        self.check(state, tokens, h_in)?;
        let cat = self.eh_input(ctx, tokens, h_in)?;
        let rows = Rows::from_spans([(n, state.pos, false)]);
        let x = ctx.mm_rows1(&self.eh_proj, &cat, &rows);
        let mut xn = vec![0.0f32; n * h];
        ctx.backend.rms_norm(&x, &self.layer.attn_norm, self.cfg.eps, &mut xn);
        let (Mixer::Attn(w), [LayerState::Attn(kv)]) = (&self.layer.mixer, state.layers.as_mut_slice()) else {
            return Err(EngineError::State("MTP head: not a state of this head".into()));
        };
        crate::layers::attention::write_kv(ctx, w, &self.cfg.attn, &xn, &rows, &mut [kv]);
        state.pos += n;
        Ok(())
    }

    fn check(&self, state: &SeqState, tokens: &[u32], h_in: &[f32]) -> Result<()> {
        let (h, n) = (self.cfg.hidden, tokens.len());
        if n == 0 || h_in.len() != n * h {
            return Err(EngineError::State(format!("MTP head: {n} tokens with {} hidden values (width {h})", h_in.len())));
        }
        if !matches!(state.layers.as_slice(), [LayerState::Attn(_)]) {
            return Err(EngineError::State("MTP head: not a state of this head".into()));
        }
        Ok(())
    }

    /// eh_proj's input: [rms_norm(e)·enorm | rms_norm(h)·hnorm] per row, the embedding first.
    fn eh_input(&self, ctx: &Ctx, tokens: &[u32], h_in: &[f32]) -> Result<Vec<f32>> {
        let (h, eps) = (self.cfg.hidden, self.cfg.eps);
        let _sp = ctx.span(Op::Embed);
        let emb = ctx.q(&self.embed);
        let rb = self.embed.row_bytes();
        let n = tokens.len();
        // the tokens' embeddings [n × hidden]
        let mut e = ctx.zeros(n * h);
        for (&id, er) in tokens.iter().zip(e.chunks_exact_mut(h)) {
            let id = id as usize;
            if id >= self.cfg.n_vocab {
                return Err(EngineError::TokenOutOfRange { id: id as u32, n_vocab: self.cfg.n_vocab });
            }
            xwen_kernels::dequantize(emb.ty, &emb.data[id * rb..(id + 1) * rb], er).map_err(|err| EngineError::State(format!("MTP embedding: {err}")))?;
        }
        let (mut en, mut hn) = (ctx.zeros(n * h), ctx.zeros(n * h));
        ctx.backend.rms_norm(&e, &self.enorm, eps, &mut en);
        ctx.backend.rms_norm(h_in, &self.hnorm, eps, &mut hn);
        // [en | hn] per row
        let mut cat = vec![0.0f32; n * 2 * h];
        for (part, to) in [(&en, 0), (&hn, h)] {
            ctx.backend.gather_columns(part, n, &[Cols { from: 0, out: 0, to, len: h }], &mut [&mut cat]);
        }
        Ok(cat)
    }
}

/// A qwen35 / qwen35moe head's weights (`Qwen35Mtp::weights`), in the file's block formats:
/// `embed` and `head` are the head's own or, where it has none, the trunk's (token_embd,
/// output) as its file names them.
pub struct MtpWeights<'a> {
    pub eh_proj: &'a Mat,
    pub enorm: &'a [f32],
    pub hnorm: &'a [f32],
    pub layer: &'a Layer,
    /// An MoE head's routed experts' gate, up and down stacks.
    pub experts: Option<&'a [Mat; 3]>,
    pub embed: &'a Mat,
    pub head_norm: &'a [f32],
    pub head: &'a Mat,
}

/// An MTP draft head of any family that has one.
pub enum MtpHead {
    Qwen35(Box<Qwen35Mtp>),
    Qwen4Exp(Box<super::qwen4exp_mtp::Qwen4ExpMtp>),
}

impl MtpHead {
    /// The head `f` carries (a full file with a nextn block or an MTP-only sidecar), by its
    /// architecture; None when it has none, an error for an architecture without MTP heads.
    pub fn load_any(f: &Arc<GgufFile>) -> Result<Option<MtpHead>> {
        match f.architecture().unwrap_or("") {
            "qwen35" | "qwen35moe" => Ok(Qwen35Mtp::load(f, &super::qwen35::config(f)?)?.map(|m| MtpHead::Qwen35(Box::new(m)))),
            "qwen4exp" => Ok(super::qwen4exp_mtp::Qwen4ExpMtp::load(f)?.map(|m| MtpHead::Qwen4Exp(Box::new(m)))),
            arch => Err(EngineError::Config(format!("an MTP head of architecture '{arch}' (xwen reads qwen35, qwen35moe and qwen4exp heads)"))),
        }
    }

    /// The file the head's weights live in.
    pub fn file(&self) -> &GgufFile {
        match self {
            MtpHead::Qwen35(m) => m.file(),
            MtpHead::Qwen4Exp(m) => m.file(),
        }
    }

    /// The width of the hidden rows it reads and chains (the trunk's `Network::hidden`).
    pub fn hidden(&self) -> usize {
        match self {
            MtpHead::Qwen35(m) => m.hidden(),
            MtpHead::Qwen4Exp(m) => m.hidden(),
        }
    }

    pub fn n_vocab(&self) -> usize {
        match self {
            MtpHead::Qwen35(m) => m.n_vocab(),
            MtpHead::Qwen4Exp(m) => m.n_vocab(),
        }
    }

    /// Whether a trunk whose hidden rows are `trunk_hidden` wide, of vocabulary `trunk_vocab`,
    /// can take this head's drafts.
    pub fn fits(&self, trunk_hidden: usize, trunk_vocab: usize) -> bool {
        self.hidden() == trunk_hidden && self.n_vocab() == trunk_vocab
    }

    pub fn state_bytes(&self, max_ctx: usize, kv_types: (crate::config::KvType, crate::config::KvType)) -> u64 {
        match self {
            MtpHead::Qwen35(m) => m.state_bytes(max_ctx, kv_types),
            MtpHead::Qwen4Exp(m) => m.state_bytes(max_ctx, kv_types),
        }
    }

    pub fn new_state(&self, kv_types: (crate::config::KvType, crate::config::KvType)) -> SeqState {
        match self {
            MtpHead::Qwen35(m) => m.new_state(kv_types),
            MtpHead::Qwen4Exp(m) => m.new_state(kv_types),
        }
    }

    /// `Qwen35Mtp::forward`, `Qwen4ExpMtp::forward`.
    pub fn forward(&self, ctx: &Ctx, state: &mut SeqState, tokens: &[u32], h_in: &[f32], logits: Range<usize>) -> Result<SpanOut> {
        match self {
            MtpHead::Qwen35(m) => m.forward(ctx, state, tokens, h_in, logits),
            MtpHead::Qwen4Exp(m) => m.forward(ctx, state, tokens, h_in, logits),
        }
    }

    /// The head's state over `tokens` as `forward` leaves it, without the logits: qwen35's
    /// writes the KV rows alone; qwen4exp's QSA layer keeps pooled indexer keys beside its KV,
    /// so its rows run the mixer (not the MoE after it).
    pub fn write_kv(&self, ctx: &Ctx, state: &mut SeqState, tokens: &[u32], h_in: &[f32]) -> Result<()> {
        match self {
            MtpHead::Qwen35(m) => m.write_kv(ctx, state, tokens, h_in),
            MtpHead::Qwen4Exp(m) => m.write_state(ctx, state, tokens, h_in),
        }
    }
}
