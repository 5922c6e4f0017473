//! The hybrid trunk of Qwen3.5 / 3.6 / 3.8 (`qwen35`, `qwen35moe`) and Qwen3-Next
//! (`qwen3next`): Gated DeltaNet layers with a gated full-attention layer every few, each followed
//! by a SwiGLU or an MoE with a gated shared expert. llama.cpp builds the two from one base
//! (`src/models/delta-net-base.cpp`); here the architectures differ only in what `TrunkSpec`
//! says — which FFN, how the DeltaNet projections are laid out, how V-heads pair with K-heads —
//! and their model files (qwen35.rs, qwen3next.rs) are that spec and a loader.
//! References: llama.cpp b11434 `src/models/qwen35.cpp`, `qwen35moe.cpp`, `qwen3next.cpp`;
//! HF transformers `models/qwen3_5`, `qwen3_5_moe`, `qwen3_next` (intent only: the GGUF has
//! conversion-baked deltas — norms multiply-ready, ssm_a = −exp(A_log), qwen35's tiled V order).
//!
//! Layer skeleton (post_attention_norm is the pre-FFN norm; there is no ffn_norm):
//!   h = x + mixer(rms_norm(x)·attn_norm)          mixer = GatedDeltaNet | gated attention
//!   x = h + ffn(rms_norm(h)·post_attention_norm)  ffn   = SwiGLU | MoE + shared expert
//! Kimi-Linear and Kimi K3 put KDA and MLA in the mixer slot; K3 also mixes the stream with the
//! banked checkpoints of its cross-layer residual attention (`layers/attn_res.rs`) before each
//! norm, and restarts it from the mixer's output on the layers that bank:
//!   h = (banks ? 0 : x) + mixer(rms_norm(mix_attn(x))·attn_norm)
//!   x = h + ffn(rms_norm(mix_ffn(h))·ffn_norm)

use crate::layers::attention::{self, AttnDims, AttnWeights};
use crate::state::KvCache;
use crate::layers::attn_res::{AttnRes, Bank, LayerRes};
use super::{Loaded, Network, PlanFigures, SpanIn, SpanOut};
use crate::memory_plan::{PREFILL_BATCH, SCRATCH_SLACK};
use crate::backend::Buf;
use crate::ctx::Ctx;
use crate::layers::deltanet::{self, DeltaDims, DeltaNetWeights, HeadPairing};
use crate::error::{EngineError, Result};
use crate::experts::store::ExpertStore;
use crate::layers::ffn::{self, FfnWeights};
use crate::layers::mla::{self, MlaDims, MlaWeights};
use crate::layers::moe::{self, MoeDims, MoeWeights};
use crate::profile::Op;
use crate::state::{DeltaState, LayerState, SeqState};
use crate::weights::{Loader, Mat};
use xwen_gguf::GgufFile;

/// `rope.dimension_sections` (four counts; absent: every pair turns, as NeoX), checked against
/// what ggml asserts (their sum at most the rope dims).
fn rope_sections(f: &GgufFile, key: &str) -> Result<Option<[u32; 4]>> {
    let Some(arr) = f.get_array(key) else { return Ok(None) };
    let mut s = [0u32; 4];
    for (i, v) in arr.iter().take(4).enumerate() {
        s[i] = v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| EngineError::BadHparams(format!("{key}: {v:?} is not a section size")))?;
    }
    Ok(Some(s))
}

/// What one architecture of the hybrid family is, beyond the keys they share.
pub struct TrunkSpec {
    /// Every layer's FFN is an MoE (qwen35moe, qwen3next) rather than a SwiGLU (qwen35).
    pub moe: bool,
    /// The shared expert's width where the file has no `expert_shared_feed_forward_length`:
    /// qwen3next takes `feed_forward_length` (llama.cpp's `n_ff(il)`); qwen35moe has no shared
    /// expert then.
    pub shared_ff_from_ff: bool,
    pub pairing: HeadPairing,
    /// Rope is llama.cpp's interleaved M-RoPE (LLAMA_ROPE_TYPE_IMROPE: qwen35, qwen35moe) over
    /// `rope.dimension_sections`, rather than plain NeoX (qwen3next).
    pub imrope: bool,
    /// Loads a DeltaNet layer's weights in this architecture's projection layout.
    pub load_delta: fn(&Loader, usize, usize, &DeltaDims) -> Result<DeltaNetWeights>,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub arch: String,
    pub n_layer: usize,
    pub hidden: usize,
    pub n_vocab: usize,
    pub eps: f32,
    /// true = Gated DeltaNet layer, false = full attention.
    pub recurrent: Vec<bool>,
    pub attn: AttnDims,
    pub delta: DeltaDims,
    /// Dense FFN width (qwen35, and kimi-linear's leading dense layers); 0 where none.
    pub ff: usize,
    pub moe: Option<MoeDims>,
    /// The full-attention layers' MLA geometry where they are MLA (kimi-linear), else None.
    pub mla: Option<MlaDims>,
}

pub(super) fn req_u(f: &GgufFile, key: &str) -> Result<usize> {
    f.get_u64(key).map(|v| v as usize).ok_or_else(|| EngineError::MissingKey(key.to_string()))
}

/// A scalar key, or the first non-zero entry of a per-layer array.
pub(super) fn req_u_or_arr(f: &GgufFile, key: &str) -> Result<usize> {
    if let Some(v) = f.get_u64(key) {
        return Ok(v as usize);
    }
    f.get_array(key)
        .and_then(|a| a.iter().filter_map(|v| v.as_u64()).find(|&v| v > 0))
        .map(|v| v as usize)
        .ok_or_else(|| EngineError::MissingKey(key.to_string()))
}

impl Config {
    pub fn from_gguf(f: &GgufFile, spec: &TrunkSpec) -> Result<Config> {
        let arch = f.architecture().ok_or_else(|| EngineError::MissingKey("general.architecture".into()))?.to_string();
        let k = |s: &str| format!("{arch}.{s}");
        let n_layer_all = req_u(f, &k("block_count"))?;
        let n_nextn = f.get_u64(&k("nextn_predict_layers")).unwrap_or(0) as usize;
        let n_layer = n_layer_all.checked_sub(n_nextn).filter(|&n| n > 0).ok_or_else(|| {
            EngineError::BadHparams(format!("block_count {n_layer_all} with {n_nextn} MTP layers"))
        })?;
        let hidden = req_u(f, &k("embedding_length"))?;
        let eps = f
            .get_f32(&k("attention.layer_norm_rms_epsilon"))
            .ok_or_else(|| EngineError::MissingKey(k("attention.layer_norm_rms_epsilon")))?;
        let recurrent: Vec<bool> = match f.get_array(&k("attention.recurrent_layers")) {
            Some(arr) => {
                let v: Vec<bool> = arr.iter().map(|x| x.as_bool().or_else(|| x.as_u64().map(|u| u != 0)).unwrap_or(false)).collect();
                if v.len() < n_layer {
                    return Err(EngineError::BadHparams(format!("recurrent_layers has {} entries for {n_layer} layers", v.len())));
                }
                v[..n_layer].to_vec()
            }
            None => {
                let interval = f.get_u64(&k("full_attention_interval")).unwrap_or(4).max(1) as usize;
                (0..n_layer).map(|i| (i + 1) % interval != 0).collect()
            }
        };
        let head_dim = req_u(f, &k("attention.key_length"))?;
        if f.get_u64(&k("attention.value_length")).map(|v| v as usize).unwrap_or(head_dim) != head_dim {
            return Err(EngineError::BadHparams("attention key_length != value_length".into()));
        }
        let attn = AttnDims {
            n_head: req_u_or_arr(f, &k("attention.head_count"))?,
            n_head_kv: req_u_or_arr(f, &k("attention.head_count_kv"))?,
            head_dim,
            n_rot: f.get_u64(&k("rope.dimension_count")).map(|v| v as usize).unwrap_or(head_dim),
            rope_base: f.get_f32(&k("rope.freq_base")).unwrap_or(10000.0),
            rope_sections: if spec.imrope { rope_sections(f, &k("rope.dimension_sections"))? } else { None },
            eps,
        };
        if attn.n_head == 0 || attn.n_head_kv == 0 || !attn.n_head.is_multiple_of(attn.n_head_kv) {
            return Err(EngineError::BadHparams(format!("{} heads / {} kv heads", attn.n_head, attn.n_head_kv)));
        }
        if attn.n_rot == 0 || attn.n_rot > head_dim || !attn.n_rot.is_multiple_of(2) {
            return Err(EngineError::BadHparams(format!("rope dims {} for head dim {head_dim}", attn.n_rot)));
        }
        let n_k_heads = req_u(f, &k("ssm.group_count"))?;
        let n_v_heads = req_u(f, &k("ssm.time_step_rank"))?;
        let state = req_u(f, &k("ssm.state_size"))?;
        let inner = req_u(f, &k("ssm.inner_size"))?;
        let delta = DeltaDims { n_k_heads, n_v_heads, head_dim: state, conv_kernel: req_u(f, &k("ssm.conv_kernel"))?, eps, pairing: spec.pairing, variant: deltanet::DeltaVariant::Gdn, gate_lower_bound: None };
        if n_k_heads == 0 || n_v_heads % n_k_heads != 0 || inner != n_v_heads * state || delta.conv_kernel < 1 {
            return Err(EngineError::BadHparams(format!(
                "DeltaNet geometry: {n_k_heads} K-heads, {n_v_heads} V-heads, state {state}, inner {inner}"
            )));
        }
        let emb = f.tensor("token_embd.weight").ok_or_else(|| EngineError::MissingTensor("token_embd.weight".into()))?;
        let n_vocab = *emb.dims.get(1).ok_or_else(|| EngineError::BadHparams("token_embd is 1-D".into()))? as usize;
        let moe = if spec.moe {
            let shared_ff = match f.get_u64(&k("expert_shared_feed_forward_length")) {
                Some(v) => v as usize,
                None if spec.shared_ff_from_ff => req_u_or_arr(f, &k("feed_forward_length"))?,
                None => 0,
            };
            Some(MoeDims {
                n_expert: req_u(f, &k("expert_count"))?,
                n_used: req_u(f, &k("expert_used_count"))?,
                expert_ff: req_u(f, &k("expert_feed_forward_length"))?,
                shared_ff,
                gating: moe::Gating::Softmax,
                w_scale: 1.0,
                norm_w: true,
                act: ffn::Act::SwiGlu,
                latent: 0,
                eps,
            })
        } else {
            None
        };
        if let Some(m) = &moe {
            if m.n_used == 0 || m.n_used > m.n_expert {
                return Err(EngineError::BadHparams(format!("{} of {} experts used", m.n_used, m.n_expert)));
            }
        }
        let ff = if moe.is_some() { 0 } else { req_u_or_arr(f, &k("feed_forward_length"))? };
        Ok(Config { arch, n_layer, hidden, n_vocab, eps, recurrent, attn, delta, ff, moe, mla: None })
    }
}

#[allow(clippy::large_enum_variant)] // one per layer, loaded once: boxing buys nothing
pub enum Mixer {
    Attn(AttnWeights),
    Delta(DeltaNetWeights),
    Mla(MlaWeights),
}

#[allow(clippy::large_enum_variant)] // one per layer, loaded once: boxing buys nothing
pub enum Ffn {
    Dense(FfnWeights),
    Moe(MoeWeights),
}

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub mixer: Mixer,
    pub ffn: Ffn,
    /// The layer's cross-layer residual scores (Kimi K3), where the model has them.
    pub res: Option<LayerRes>,
}

/// A loaded hybrid network.
pub struct Hybrid {
    pub cfg: Config,
    pub tok_embd: Mat,
    pub layers: Vec<Layer>,
    pub output_norm: Vec<f32>,
    pub output: Mat,
    /// Cross-layer residual attention (Kimi K3), else None.
    pub res: Option<AttnRes>,
}

impl Hybrid {
    /// Loads the trunk; routed-expert stacks are returned separately for the expert store.
    pub fn load(f: &GgufFile, spec: &TrunkSpec) -> Result<(Hybrid, Vec<Option<[Mat; 3]>>)> {
        let cfg = Config::from_gguf(f, spec)?;
        let ld = Loader::new(f);
        let h = cfg.hidden;
        let tok_embd = ld.mat("token_embd.weight", cfg.n_vocab, h)?;
        let output = if ld.has("output.weight") { ld.mat("output.weight", cfg.n_vocab, h)? } else { tok_embd.clone() };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        let mut experts = Vec::with_capacity(cfg.n_layer);
        for il in 0..cfg.n_layer {
            let mixer = if cfg.recurrent[il] {
                Mixer::Delta((spec.load_delta)(&ld, il, h, &cfg.delta)?)
            } else {
                Mixer::Attn(AttnWeights::load(&ld, il, h, &cfg.attn)?)
            };
            let ffn = match &cfg.moe {
                Some(md) => {
                    let (w, ex) = MoeWeights::load(&ld, il, h, md)?;
                    experts.push(Some(ex));
                    Ffn::Moe(w)
                }
                None => {
                    experts.push(None);
                    Ffn::Dense(FfnWeights::load(&ld, il, h, cfg.ff, "")?)
                }
            };
            layers.push(Layer {
                attn_norm: ld.vec(&format!("blk.{il}.attn_norm.weight"), h)?,
                post_attn_norm: ld.vec(&format!("blk.{il}.post_attention_norm.weight"), h)?,
                mixer,
                ffn,
                res: None,
            });
        }
        let output_norm = ld.vec("output_norm.weight", h)?;
        Ok((Hybrid { cfg, tok_embd, layers, output_norm, output, res: None }, experts))
    }

    pub fn new_state_of_layers(&self) -> SeqState {
        let layers = self
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Attn(_) | Mixer::Mla(_) => LayerState::Attn(KvCache::default()),
                Mixer::Delta(_) => LayerState::Delta(self.cfg.delta.zero_state()),
            })
            .collect();
        SeqState::new(layers)
    }

    /// The first MoE layer after layer `il`, whose experts layer `il`'s decode guesses.
    fn next_moe(&self, il: usize) -> Option<moe::Lookahead<'_>> {
        self.layers.iter().enumerate().skip(il + 1).find_map(|(j, l)| match &l.ffn {
            Ffn::Moe(w) => Some(moe::Lookahead { layer: j, weights: w }),
            Ffn::Dense(_) => None,
        })
    }

    /// Embedding rows dequantized from token_embd, every span's tokens back to back:
    /// x [n × hidden].
    fn embed(&self, ctx: &Ctx, spans: &[SpanIn]) -> Result<Vec<f32>> {
        let h = self.cfg.hidden;
        let _sp = ctx.span(Op::Embed);
        let n: usize = spans.iter().map(|sp| sp.tokens.len()).sum();
        let mut x = vec![0.0f32; n * h];
        let emb = ctx.q(&self.tok_embd);
        let rb = self.tok_embd.row_bytes();
        for (t, &id) in spans.iter().flat_map(|sp| sp.tokens.iter()).enumerate() {
            let id = id as usize;
            if id >= self.cfg.n_vocab {
                return Err(EngineError::TokenOutOfRange { id: id as u32, n_vocab: self.cfg.n_vocab });
            }
            xwen_kernels::dequantize(emb.ty, &emb.data[id * rb..(id + 1) * rb], &mut x[t * h..(t + 1) * h])
                .map_err(|e| EngineError::State(format!("embedding: {e}")))?;
        }
        Ok(x)
    }

    /// One sequence's prompt `chunks` (consecutive runs of its tokens from `state.pos`), as a
    /// prefill wave: every chunk passes a layer before any passes the next. The mixer runs
    /// chunk after chunk (each in its own order, the state flowing from one to the next, as
    /// when the chunks are fed one by one); the FFN takes the chunks' rows together as spans
    /// of one batch, so an MoE layer fetches an expert at most once for the whole wave
    /// (`moe::forward_spans`). Each chunk's logits are the bits feeding the chunks one by one
    /// gives. K3's residual attention mixes and banks each row on its own, so the wave mixes
    /// and banks all its rows before the chunks' mixers run, as the FFN does after them.
    pub fn forward_wave(&self, ctx: &Ctx, store: &dyn ExpertStore, state: &mut SeqState, chunks: &[SpanIn]) -> Result<Option<Vec<SpanOut>>> {
        if state.layers.len() != self.layers.len() {
            return Err(EngineError::State(format!("a state of {} layers for a model of {}", state.layers.len(), self.layers.len())));
        }
        if chunks.iter().any(|c| c.decode_order || c.tokens.is_empty()) {
            return Err(EngineError::State("a prefill wave takes non-empty chunks in their own order".into()));
        }
        let h = self.cfg.hidden;
        // the chunks back to back, each at the position the one before leaves
        let rows = crate::batch::Rows::from_lens(chunks.iter().scan(state.pos, |pos, c| {
            let at = *pos;
            *pos += c.tokens.len();
            Some((c.tokens.len(), at))
        }));
        let mut x = self.embed(ctx, chunks)?;
        let mut xn = ctx.zeros(rows.n * h);
        let mut bank = Bank::default();
        for (il, layer) in self.layers.iter().enumerate() {
            let at = Placed { store_layer: il, state_layer: il };
            let pass = LayerPass { ctx, cfg: &self.cfg, attn_res: self.res.as_ref(), store, at, layer, next_moe: self.next_moe(il) };
            let (mixed, banks) = pass.mixer_input(&x, &mut bank);
            for s in &rows.spans {
                let r = s.start * h..(s.start + s.len) * h;
                let alone = crate::batch::Rows::single(s.len, s.pos0);
                pass.mixer_rows(&mut x[r.clone()], mixed.as_ref().map(|m| &m[r.clone()]), banks, &mut xn[r], &mut [&mut *state], &alone)?;
            }
            pass.ffn_half(&mut x, &mut xn, &rows, &mut bank)?;
        }
        if let Some(r) = &self.res {
            x = bank.mix(ctx.backend, &x, &r.output, self.cfg.eps);
        }
        state.pos += rows.n;
        Ok(Some(head(ctx, &x, &rows, chunks, &self.output_norm, &self.output, &self.cfg)))
    }

    /// Runs a batch through the trunk: sequence i's `tokens[i]` at its own position in
    /// `states[i]`. Returns per sequence the logits of its rows `out_rows[i]` (row-major,
    /// rows × n_vocab). Batch-invariant (see `crate::batch`): each sequence's logits are the
    /// bits it would get alone.
    pub fn forward_batch(&self, ctx: &Ctx, store: &dyn ExpertStore, states: &mut [&mut SeqState], spans: &[SpanIn]) -> Result<Vec<SpanOut>> {
        assert_eq!(states.len(), spans.len(), "one state per span");
        let h = self.cfg.hidden;
        let rows = super::batch_rows(states, spans);
        let n = rows.n;
        for (i, st) in states.iter().enumerate() {
            if st.layers.len() != self.layers.len() {
                return Err(EngineError::State(format!("sequence {i}: a state of {} layers for a model of {}", st.layers.len(), self.layers.len())));
            }
        }

        let mut x = self.embed(ctx, spans)?;
        let mut xn = ctx.zeros(n * h);
        let eps = self.cfg.eps;
        // K3's checkpoints of this pass (cross-layer residual attention); empty otherwise
        let mut bank = Bank::default();
        // a DFlash drafter's features: the tapped layers' inputs of the rows that ask for hidden,
        // side by side in the sidecar's target_layers order (llama.cpp's concat order)
        let taps = ctx.layer_inputs;
        let mut feats: Vec<Vec<f32>> =
            spans.iter().map(|sp| if sp.hidden && !taps.is_empty() { vec![0.0; sp.tokens.len() * taps.len() * h] } else { Vec::new() }).collect();
        for (il, layer) in self.layers.iter().enumerate() {
            for (k, _) in taps.iter().enumerate().filter(|&(_, &t)| t == il) {
                let w = taps.len() * h;
                for (s, f) in rows.spans.iter().zip(feats.iter_mut()).filter(|(_, f)| !f.is_empty()) {
                    for r in 0..s.len {
                        f[r * w + k * h..r * w + (k + 1) * h].copy_from_slice(&x[(s.start + r) * h..(s.start + r + 1) * h]);
                    }
                }
            }
            let at = Placed { store_layer: il, state_layer: il };
            let pass = LayerPass { ctx, cfg: &self.cfg, attn_res: self.res.as_ref(), store, at, layer, next_moe: self.next_moe(il) };
            pass.forward(&mut x, &mut xn, states, &rows, &mut bank)?;
        }
        if let Some(r) = &self.res {
            x = bank.mix(ctx.backend, &x, &r.output, eps);
        }
        for (st, sp) in states.iter_mut().zip(spans) {
            st.pos += sp.tokens.len();
        }

        let mut out = head(ctx, &x, &rows, spans, &self.output_norm, &self.output, &self.cfg);
        for (o, f) in out.iter_mut().zip(feats).filter(|(_, f)| !f.is_empty()) {
            o.hidden = f;
        }
        Ok(out)
    }
}

/// The lm head over the final residual stream x: per span the logits of the rows it asks for
/// and, where it asks (`SpanIn::hidden`), every row's rms_norm(x)·output_norm — llama.cpp's
/// `h_nextn`, what an MTP head reads.
pub(super) fn head(ctx: &Ctx, x: &[f32], rows: &crate::batch::Rows, spans: &[SpanIn], norm: &[f32], output: &Mat, cfg: &Config) -> Vec<SpanOut> {
    let h = cfg.hidden;
    let _sp = ctx.span(Op::LmHead);
    let hidden: Vec<Vec<f32>> = rows
        .spans
        .iter()
        .zip(spans)
        .map(|(s, sp)| {
            if !sp.hidden {
                return Vec::new();
            }
            let mut out = vec![0.0f32; sp.tokens.len() * h];
            ctx.backend.rms_norm(&x[s.start * h..(s.start + sp.tokens.len()) * h], norm, cfg.eps, &mut out);
            out
        })
        .collect();
    // logits of the rows asked for: each sequence's rows one span of the head's batch
    let wanted: Vec<usize> = rows.spans.iter().zip(spans).flat_map(|(s, sp)| sp.logits.clone().map(move |i| s.start + i)).collect();
    let logits = if wanted.is_empty() {
        Buf::owned(Vec::new())
    } else {
        let mut hn = ctx.zeros(wanted.len() * h);
        ctx.backend.rms_norm(&crate::batch::gather(x, h, &wanted), norm, cfg.eps, &mut hn);
        ctx.tap("result_norm", None, &hn, h);
        ctx.mm_rows1(output, &hn, &super::head_rows(spans))
    };
    let v = cfg.n_vocab;
    let mut at = 0;
    spans
        .iter()
        .zip(hidden)
        .map(|(sp, hidden)| {
            let n = sp.logits.len();
            let part = logits.get(at * v..(at + n) * v).map(<[f32]>::to_vec).unwrap_or_default();
            at += n;
            SpanOut { logits: part, hidden, argmax: None, picks: Vec::new() }
        })
        .collect()
}

/// Loads a hybrid network of `spec` for the registry.
pub fn load(f: &GgufFile, spec: &TrunkSpec) -> Result<Loaded> {
    let (net, experts) = Hybrid::load(f, spec)?;
    Ok(Loaded { net: Box::new(net), experts })
}

impl Network for Hybrid {
    fn arch(&self) -> &str {
        &self.cfg.arch
    }

    fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }

    fn hidden(&self) -> usize {
        self.cfg.hidden
    }

    fn new_state(&self) -> SeqState {
        self.new_state_of_layers()
    }

    fn forward(&self, ctx: &Ctx, store: &dyn ExpertStore, states: &mut [&mut SeqState], spans: &[SpanIn]) -> Result<Vec<SpanOut>> {
        self.forward_batch(ctx, store, states, spans)
    }

    fn forward_wave(&self, ctx: &Ctx, store: &dyn ExpertStore, state: &mut SeqState, chunks: &[SpanIn]) -> Result<Option<Vec<SpanOut>>> {
        Hybrid::forward_wave(self, ctx, store, state, chunks)
    }

    fn plan_figures(&self, max_ctx: usize, kv_types: (crate::config::KvType, crate::config::KvType)) -> PlanFigures {
        let (n_expert, n_used) = self.cfg.moe.as_ref().map_or((0, 0), |m| (m.n_expert, m.n_used));
        PlanFigures { state_bytes: state_bytes(&self.cfg, max_ctx, kv_types), scratch_bytes: scratch_bytes(&self.cfg), wave_row_bytes: wave_row_bytes(&self.cfg), n_expert, n_used }
    }
}

/// One sequence's state at `max_ctx` positions: K and V of their types per attention layer,
/// conv and delta state (f32) per DeltaNet layer.
pub fn state_bytes(cfg: &Config, max_ctx: usize, kv_types: (crate::config::KvType, crate::config::KvType)) -> u64 {
    let n_attn = cfg.recurrent.iter().filter(|&&r| !r).count() as u64;
    let n_delta = cfg.recurrent.len() as u64 - n_attn;
    // K and V widths per position: the heads' (gated attention) or MLA's latent K and V
    let (wk, wv) = match &cfg.mla {
        Some(m) => (m.k_width(), m.kv_lora),
        None => (cfg.attn.kv_width(), cfg.attn.kv_width()),
    };
    let per_pos = (kv_types.0.row_bytes(wk) + kv_types.1.row_bytes(wv)) as u64;
    // saturating: an absurd max_ctx gives a figure no budget holds, never a wrapped small one
    let kv = (n_attn * per_pos).saturating_mul(max_ctx as u64);
    let d = cfg.delta.zero_state();
    kv.saturating_add(n_delta * (d.conv.len() + d.s.len()) as u64 * 4)
}

/// Scratch of a `PREFILL_BATCH`-token forward pass: the residual stream and its normed copy, the
/// widest mixer projections, the FFN's gate/up/activation (for MoE the routed slots of every
/// token), the quantized activations, and last-position logits, plus `SCRATCH_SLACK`.
pub fn scratch_bytes(cfg: &Config) -> u64 {
    let h = cfg.hidden as u64;
    let d = &cfg.delta;
    let mut mixer = ((d.conv_dim() + d.value_dim()) as u64 * 2).max((4 * cfg.attn.n_head + 2 * cfg.attn.n_head_kv) as u64 * cfg.attn.head_dim as u64);
    if let Some(m) = &cfg.mla {
        // q, the latent K row, the absorbed queries and the per-head attention outputs
        mixer = mixer.max((m.n_head * (m.q_head() + 2 * m.k_width() + m.v_head) + m.k_width()) as u64);
    }
    let ffn = match &cfg.moe {
        Some(m) => (m.n_used * m.expert_ff).max(m.shared_ff) as u64,
        None => cfg.ff as u64,
    };
    let per_token = 6 * h + mixer + 3 * ffn;
    PREFILL_BATCH as u64 * per_token * 4 + 2 * cfg.n_vocab as u64 * 4 + SCRATCH_SLACK
}

/// What one row of a prefill wave beyond its first batch holds (`Hybrid::forward_wave`): the
/// residual stream, its normed copy and the FFN's output; an MoE's experts' input (the latent
/// one where it has one), every routed slot's output and their sum; a dense FFN's gate, up and
/// activation.
pub fn wave_row_bytes(cfg: &Config) -> u64 {
    let h = cfg.hidden as u64;
    let ffn = match &cfg.moe {
        Some(m) => {
            let ew = m.expert_width(cfg.hidden) as u64;
            (m.n_used as u64 + 1) * ew + if ew == h { 0 } else { ew }
        }
        None => 0,
    };
    let dense = 3 * cfg.ff as u64;
    (3 * h + ffn.max(dense)) * 4
}

/// Where a layer sits: its index in the expert store (MoE layers) and in the sequence state.
/// The trunk's layers are both `il`; the MTP head's one layer is the store's `n_layer` and its
/// own state's 0.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub store_layer: usize,
    pub state_layer: usize,
}

/// One layer as a pass runs it: the layer's weights, where it sits, and what its blocks call —
/// what `forward`, `mixer_half` and `ffn_half` share.
pub struct LayerPass<'a> {
    pub ctx: &'a Ctx<'a>,
    pub cfg: &'a Config,
    /// K3's cross-layer residual attention (None elsewhere).
    pub attn_res: Option<&'a AttnRes>,
    pub store: &'a dyn ExpertStore,
    pub at: Placed,
    pub layer: &'a Layer,
    /// The next MoE layer, whose experts a streamed decode reads ahead.
    pub next_moe: Option<moe::Lookahead<'a>>,
}

impl LayerPass<'_> {
    /// One decoder layer over the batch `rows` of the residual stream x (rows.n × hidden):
    ///   h = x + mixer(rms_norm(x)·attn_norm);  x = h + ffn(rms_norm(h)·post_attention_norm)
    /// (K3: mixed with the bank of its cross-layer residual attention). `xn` is scratch.
    pub fn forward(&self, x: &mut [f32], xn: &mut [f32], states: &mut [&mut SeqState], rows: &crate::batch::Rows, bank: &mut Bank) -> Result<()> {
        self.mixer_half(x, xn, states, rows, bank)?;
        self.ffn_half(x, xn, rows, bank)
    }

    /// The layer's first half, h = x + mixer(rms_norm(x)·attn_norm), in place in x: the part
    /// that reads and writes the sequences' states. `xn` is scratch.
    fn mixer_half(&self, x: &mut [f32], xn: &mut [f32], states: &mut [&mut SeqState], rows: &crate::batch::Rows, bank: &mut Bank) -> Result<()> {
        let (mixed, banks) = self.mixer_input(x, bank);
        self.mixer_rows(x, mixed.as_deref(), banks, xn, states, rows)
    }

    /// K3: the mixer's input, x mixed with the bank (None: x itself, no residual attention),
    /// and whether this layer banks — then its raw input goes into the bank here and the
    /// stream restarts from the mixer's output. Row by row, so a wave mixes all its rows at once.
    fn mixer_input(&self, x: &[f32], bank: &mut Bank) -> (Option<Vec<f32>>, bool) {
        let LayerPass { ctx, cfg, attn_res, at, layer, .. } = *self;
        let _sp = ctx.span(Op::Norms);
        let res = attn_res.zip(layer.res.as_ref());
        let mixed = res.map(|(_, lr)| bank.mix(ctx.backend, x, &lr.attn, cfg.eps));
        let banks = res.is_some_and(|(r, _)| at.store_layer.is_multiple_of(r.block));
        if banks {
            bank.push(x);
        }
        (mixed, banks)
    }

    /// The mixer over `rows` and the residual, in place in x: `mixed` is its input where K3's
    /// residual attention mixed one (`mixer_input`), and a banking layer restarts the stream
    /// from the mixer's output.
    #[allow(clippy::too_many_arguments)] // the rows, their mixed input and the states
    fn mixer_rows(&self, x: &mut [f32], mixed: Option<&[f32]>, banks: bool, xn: &mut [f32], states: &mut [&mut SeqState], rows: &crate::batch::Rows) -> Result<()> {
        let LayerPass { ctx, cfg, at, layer, .. } = *self;
        let h = cfg.hidden;
        let eps = cfg.eps;
        let il = at.state_layer;
        let sp = ctx.span(Op::Norms);
        ctx.backend.rms_norm(mixed.unwrap_or(x), &layer.attn_norm, eps, xn);
        drop(sp);
        ctx.tap("attn_norm", Some(il), xn, h);
        let mix = match &layer.mixer {
            Mixer::Attn(w) => {
                let mut kvs = layer_states(states, il, kv_of)?;
                attention::forward(ctx, w, &cfg.attn, xn, rows, &mut kvs, il)
            }
            Mixer::Delta(w) => {
                let mut ds = layer_states(states, il, delta_of)?;
                deltanet::forward(ctx, w, &cfg.delta, xn, rows, &mut ds, il)
            }
            Mixer::Mla(w) => {
                let mut kvs = layer_states(states, il, kv_of)?;
                let d = cfg.mla.as_ref().ok_or_else(|| EngineError::State("an MLA layer without MLA dims".into()))?;
                mla::forward(ctx, w, d, xn, rows, &mut kvs, il)
            }
        };
        // llama.cpp's names for the mixer's output: qwen35's attention / linear attention,
        // kimi-linear's KDA / MLA
        let mix_name = match (&layer.mixer, cfg.delta.variant) {
            (Mixer::Attn(_), _) => "attn_output",
            (Mixer::Delta(_), deltanet::DeltaVariant::Gdn | deltanet::DeltaVariant::GdnSigmoid) => "linear_attn_out",
            (Mixer::Delta(_), deltanet::DeltaVariant::Kda) => "kda_out",
            (Mixer::Mla(_), _) => "mla_out",
        };
        ctx.tap(mix_name, Some(il), &mix, h);
        if banks {
            x.copy_from_slice(&mix);
        } else {
            ctx.backend.add(x, &mix);
        }
        ctx.tap("attn_residual", Some(il), x, h);
        Ok(())
    }

    /// The layer's second half, x = h + ffn(rms_norm(h)·post_attention_norm), in place in x:
    /// row by row, no state — so the rows of several spans pass it together. `xn` is scratch.
    fn ffn_half(&self, x: &mut [f32], xn: &mut [f32], rows: &crate::batch::Rows, bank: &mut Bank) -> Result<()> {
        let LayerPass { ctx, cfg, attn_res, store, at, layer, .. } = *self;
        let h = cfg.hidden;
        let eps = cfg.eps;
        let il = at.state_layer;
        let sp = ctx.span(Op::Norms);
        let res = attn_res.zip(layer.res.as_ref());
        let mixed = res.map(|(_, lr)| bank.mix(ctx.backend, x, &lr.ffn, eps));
        ctx.backend.rms_norm(mixed.as_deref().unwrap_or(x), &layer.post_attn_norm, eps, xn);
        drop(sp);
        ctx.tap("attn_post_norm", Some(il), xn, h);
        let f = match &layer.ffn {
            Ffn::Dense(w) => {
                let _sp = ctx.span(Op::FfnDense);
                ffn::forward(ctx, w, xn, rows)
            }
            Ffn::Moe(w) => moe::forward_rows(ctx, w, cfg.moe.as_ref().expect("moe dims"), store, at.store_layer, xn, rows, h, self.next_moe)?,
        };
        ctx.tap("ffn_out", Some(il), &f, h);
        ctx.backend.add(x, &f);
        ctx.tap("l_out", Some(il), x, h);
        Ok(())
    }
}

/// Layer `il`'s state of every sequence, as the kind `pick` takes (None = a state that does
/// not match the model's layer).
fn layer_states<'s, T>(
    states: &'s mut [&mut SeqState],
    il: usize,
    pick: impl Fn(&'s mut LayerState) -> Option<&'s mut T>,
) -> Result<Vec<&'s mut T>> {
    states
        .iter_mut()
        .enumerate()
        .map(|(i, st)| pick(&mut st.layers[il]).ok_or_else(|| EngineError::State(format!("sequence {i}, layer {il}: state kind does not match the model"))))
        .collect()
}

/// The KV cache of an attention or MLA layer's state (None for another kind).
fn kv_of(l: &mut LayerState) -> Option<&mut KvCache> {
    match l {
        LayerState::Attn(kv) => Some(kv),
        _ => None,
    }
}

/// The recurrent state of a delta-rule layer's state (None for another kind).
fn delta_of(l: &mut LayerState) -> Option<&mut DeltaState> {
    match l {
        LayerState::Delta(d) => Some(d),
        _ => None,
    }
}
