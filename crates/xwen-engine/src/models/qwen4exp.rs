//! Qwen3.8-Flash-Next — llama.cpp architecture `qwen4exp`.
//! Reference: llama.cpp b11434 `src/models/qwen4exp.cpp` (with `llama-memory-hybrid-idx.cpp`);
//! transformers 5.23.0 `models/qwen4_exp` for intent. docs/decisions.md, "qwen4exp: what the
//! architecture registry had to learn".
//!
//! The family's blocks (Gated DeltaNet with a sigmoid output gate, gated attention with QSA's
//! sparse selection, MoE with a sigmoid-gated shared expert) on an hc-wide residual:
//!   r = [embed(t)] × hc
//!   per layer:  (PLE layer: r += ple(r, n-grams of t))
//!               i, w = mix_attn(r);  r_s += w_s · mixer(i)
//!               i, w = mix_ffn(r);   r_s += w_s · moe(i)
//!   logits = output · mix_out(r)        (the final mixer is the output norm)

use super::hybrid::{self, Config, TrunkSpec};
use super::{Loaded, Network, PlanFigures, SpanIn, SpanOut};
use crate::ctx::Ctx;
use crate::error::{EngineError, Result};
use crate::experts::store::ExpertStore;
use crate::layers::attention::{self, AttnWeights};
use crate::layers::deltanet::{self, DeltaNetWeights, DeltaVariant, HeadPairing};
use crate::layers::hyper_conn::{self, HcDims, HcMixer};
use crate::layers::moe::{self, MoeWeights};
use crate::layers::ple::{self, PleDims, PleWeights};
use crate::layers::qsa::{self, QsaDims, QsaWeights};
use crate::profile::Op;
use crate::state::{DeltaState, KvCache, LayerState, SeqState};
use crate::weights::{Loader, Mat};
use xwen_gguf::GgufFile;

const SPEC: TrunkSpec = TrunkSpec { moe: true, shared_ff_from_ff: false, pairing: HeadPairing::Tiled, imrope: true, load_delta: DeltaNetWeights::load_split };

#[allow(clippy::large_enum_variant)] // one per layer, loaded once
pub enum Mixer {
    Delta(DeltaNetWeights),
    /// A full-attention layer with a compress ratio (and the indexer): sparse.
    Qsa(QsaWeights),
    /// A full-attention layer without one: dense.
    Attn(AttnWeights),
}

pub struct Layer {
    pub hc_attn: HcMixer,
    pub hc_ffn: HcMixer,
    pub mixer: Mixer,
    pub ple: Option<PleWeights>,
    pub moe: MoeWeights,
    /// Where this layer's extra state sits in a sequence state (past the layers' own): the
    /// PLE state of a PLE layer, the indexer cache of a QSA layer.
    pub extra: Option<usize>,
}

pub struct Qwen4Exp {
    pub cfg: Config,
    pub hc: HcDims,
    pub qsa: QsaDims,
    pub ple: Option<PleDims>,
    pub tok_embd: Mat,
    pub ple_table: Option<Mat>,
    pub layers: Vec<Layer>,
    pub output_hc: HcMixer,
    pub output: Mat,
}

fn u64s(f: &GgufFile, key: &str, n: usize) -> Result<Vec<u64>> {
    let a = f.get_array(key).ok_or_else(|| EngineError::MissingKey(key.to_string()))?;
    let v: Vec<u64> = a.iter().filter_map(|x| x.as_u64()).collect();
    if v.len() < n || a.len() != v.len() {
        return Err(EngineError::BadHparams(format!("{key}: {} integer entries, {n} needed", v.len())));
    }
    Ok(v)
}

/// The trunk's geometry of a qwen4exp file (a full one or an MTP-only sidecar): the hybrid
/// config, the hyper-connections, QSA, and every block's compress ratio (the MTP block's last).
pub(super) fn dims(f: &GgufFile) -> Result<(Config, HcDims, QsaDims, Vec<u64>)> {
    let mut cfg = Config::from_gguf(f, &SPEC)?;
    cfg.delta.variant = DeltaVariant::GdnSigmoid;
    let k = |s: &str| format!("qwen4exp.{s}");
    let req = |s: &str| f.get_u64(&k(s)).map(|v| v as usize).ok_or_else(|| EngineError::MissingKey(k(s)));
    let h = cfg.hidden;
    let hc = HcDims { hc: req("hyper_connection.count")?, rank: req("hyper_connection.low_rank")?, n: h, eps: cfg.eps };
    if hc.hc <= 1 || hc.rank == 0 {
        return Err(EngineError::BadHparams(format!("hyper-connections: {} streams of rank {}", hc.hc, hc.rank)));
    }
    let ratios = u64s(f, &k("attention.compress_ratios"), cfg.n_layer)?;
    let ratio = ratios.iter().copied().find(|&r| r > 0).unwrap_or(0) as usize;
    let qsa = QsaDims { n_head: req("attention.indexer.head_count")?, head_dim: req("attention.indexer.key_length")?, budget: req("attention.indexer.top_k")?, ratio };
    if ratios.iter().any(|&r| r != 0 && r as usize != ratio) || ratio == 1 || (ratio > 0 && !qsa.budget.is_multiple_of(ratio)) {
        return Err(EngineError::BadHparams(format!("QSA compress ratios {ratios:?} with a budget of {}", qsa.budget)));
    }
    Ok((cfg, hc, qsa, ratios))
}

impl Qwen4Exp {
    #[allow(clippy::needless_range_loop)] // layer il's entries of several per-layer lists
    pub fn load(f: &GgufFile) -> Result<(Qwen4Exp, Vec<Option<[Mat; 3]>>)> {
        let (cfg, hc, qsa, ratios) = dims(f)?;
        let k = |s: &str| format!("qwen4exp.{s}");
        let req = |s: &str| f.get_u64(&k(s)).map(|v| v as usize).ok_or_else(|| EngineError::MissingKey(k(s)));
        let h = cfg.hidden;
        let ple_layers: Vec<usize> = f.get_array(&k("ple.layers")).map(|a| a.iter().filter_map(|v| v.as_u64()).map(|v| v as usize).collect()).unwrap_or_default();
        let ple = if ple_layers.is_empty() {
            None
        } else {
            if ple_layers.len() != 1 || ple_layers[0] >= cfg.n_layer || !cfg.recurrent[ple_layers[0]] {
                return Err(EngineError::BadHparams(format!("PLE layers {ple_layers:?}: one linear-attention layer is supported")));
            }
            let ngram = req("ple.ngram_size")?;
            let per = req("ple.heads_per_ngram")?;
            let n_heads = ngram.saturating_sub(1) * per;
            let d = PleDims {
                ngram,
                heads_per_ngram: per,
                head_dim: req("embedding_length_per_layer_input")?,
                kernel: req("ple.conv_kernel")?,
                eos: req("ple.eos_token_id")? as u32,
                multipliers: u64s(f, &k("ple.layer_multipliers"), ngram)?,
                offsets: u64s(f, &k("ple.head_offsets"), n_heads)?,
                vocab: u64s(f, &k("ple.head_vocab_sizes"), n_heads)?,
                hc: hc.hc,
                n: h,
                eps: cfg.eps,
            };
            if ngram < 2 || d.kernel == 0 || n_heads * d.head_dim != h || d.vocab.contains(&0) {
                return Err(EngineError::BadHparams(format!("PLE: {ngram}-grams, {n_heads} heads of {} for width {h}", d.head_dim)));
            }
            Some(d)
        };
        let ld = Loader::new(f);
        let tok_embd = ld.mat("token_embd.weight", cfg.n_vocab, h)?;
        let output = if ld.has("output.weight") { ld.mat("output.weight", cfg.n_vocab, h)? } else { tok_embd.clone() };
        let ple_table = match &ple {
            Some(d) => {
                let rows = ld.dims("per_layer_token_embd.weight").and_then(|dims| dims.get(1).copied()).unwrap_or(0) as usize;
                let need = (0..d.n_heads()).map(|i| (d.offsets[i] + d.vocab[i]) as usize).max().unwrap_or(0);
                if rows < need {
                    return Err(EngineError::BadHparams(format!("per_layer_token_embd has {rows} rows, the PLE heads need {need}")));
                }
                Some(ld.mat("per_layer_token_embd.weight", rows, d.head_dim)?)
            }
            None => None,
        };
        let md = cfg.moe.ok_or_else(|| EngineError::BadHparams("qwen4exp without experts".into()))?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        let mut experts = Vec::with_capacity(cfg.n_layer);
        let mut next_extra = cfg.n_layer;
        for il in 0..cfg.n_layer {
            let mut extra = None;
            let mixer = if cfg.recurrent[il] {
                Mixer::Delta(DeltaNetWeights::load_split(&ld, il, h, &cfg.delta)?)
            } else if ratios[il] > 0 {
                extra = Some(next_extra);
                next_extra += 1;
                Mixer::Qsa(QsaWeights::load(&ld, il, h, &cfg.attn, &qsa)?)
            } else {
                Mixer::Attn(AttnWeights::load(&ld, il, h, &cfg.attn)?)
            };
            let ple_w = match &ple {
                Some(d) if ple_layers[0] == il => {
                    extra = Some(next_extra);
                    next_extra += 1;
                    Some(PleWeights::load(&ld, il, d)?)
                }
                _ => None,
            };
            let (moe_w, ex) = MoeWeights::load(&ld, il, h, &md)?;
            experts.push(Some(ex));
            layers.push(Layer {
                hc_attn: HcMixer::load(&ld, &format!("blk.{il}.hc_attn"), &hc, true)?,
                hc_ffn: HcMixer::load(&ld, &format!("blk.{il}.hc_ffn"), &hc, true)?,
                mixer,
                ple: ple_w,
                moe: moe_w,
                extra,
            });
        }
        let output_hc = HcMixer::load(&ld, "output_hc", &hc, false)?;
        Ok((Qwen4Exp { cfg, hc, qsa, ple, tok_embd, ple_table, layers, output_hc, output }, experts))
    }

    fn embed(&self, ctx: &Ctx, tokens: &[u32]) -> Result<Vec<f32>> {
        let h = self.cfg.hidden;
        let _sp = ctx.span(Op::Embed);
        let mut x = vec![0.0f32; tokens.len() * h];
        let emb = ctx.q(&self.tok_embd);
        let rb = self.tok_embd.row_bytes();
        for (t, &id) in tokens.iter().enumerate() {
            let id = id as usize;
            if id >= self.cfg.n_vocab {
                return Err(EngineError::TokenOutOfRange { id: id as u32, n_vocab: self.cfg.n_vocab });
            }
            xwen_kernels::dequantize(emb.ty, &emb.data[id * rb..(id + 1) * rb], &mut x[t * h..(t + 1) * h]).map_err(|e| EngineError::State(format!("embedding: {e}")))?;
        }
        Ok(x)
    }

    pub fn forward_batch(&self, ctx: &Ctx, store: &dyn ExpertStore, states: &mut [&mut SeqState], spans: &[SpanIn]) -> Result<Vec<SpanOut>> {
        let (h, hc) = (self.cfg.hidden, self.hc.hc);
        let n_state = self.new_state().layers.len();
        for (i, st) in states.iter().enumerate() {
            if st.layers.len() != n_state {
                return Err(EngineError::State(format!("sequence {i}: a state of {} layers for a model of {n_state}", st.layers.len())));
            }
        }
        let rows = super::batch_rows(states, spans);
        let tokens: Vec<u32> = spans.iter().flat_map(|sp| sp.tokens.iter().copied()).collect();
        let x0 = self.embed(ctx, &tokens)?;
        // the wide residual starts as hc copies of the embedding
        let mut res = vec![0.0f32; rows.n * hc * h];
        for t in 0..rows.n {
            for s in 0..hc {
                res[(t * hc + s) * h..][..h].copy_from_slice(&x0[t * h..(t + 1) * h]);
            }
        }
        // the PLE layer's table rows depend on the tokens alone: a streamed table's are read
        // while the layers before the PLE layer compute (the mapped table's when it comes)
        let ple_ids = match (&self.ple, &self.ple_table, self.layers.iter().find(|l| l.ple.is_some()).and_then(|l| l.extra)) {
            (Some(d), Some(tab), Some(e)) => {
                let ps: Vec<&DeltaState> = states
                    .iter()
                    .map(|st| match &st.layers[e] {
                        LayerState::Delta(p) => Ok(p),
                        _ => Err(EngineError::State(format!("state {e}: not the PLE layer's"))),
                    })
                    .collect::<Result<_>>()?;
                Some(ple::row_ids(d, tab.rows, &tokens, &rows, &ps)?)
            }
            _ => None,
        };
        let streamed = ctx.rows.zip(self.ple_table.as_ref()).and_then(|(s, tab)| s.table_of(tab).map(|t| (s, t)));
        std::thread::scope(|sc| -> Result<()> {
            let mut early = match (streamed, &ple_ids, &self.ple) {
                (Some((s, t)), Some(idx), Some(d)) => Some(sc.spawn(move || {
                    let mut e = vec![0.0f32; idx.len() * d.head_dim];
                    let failed = s.gather(t, idx, &mut e);
                    (e, failed)
                })),
                _ => None,
            };
            for (il, l) in self.layers.iter().enumerate() {
                if let (Some(w), Some(d), Some(tab), Some(e), Some(idx)) = (&l.ple, &self.ple, &self.ple_table, l.extra, &ple_ids) {
                    let emb = match early.take() {
                        Some(h) => {
                            let (mut emb, failed) = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                            ple::settle_rows(ctx, d, &mut emb, failed?)?;
                            emb
                        }
                        None => ple::read_rows(ctx, tab, d, idx)?,
                    };
                    let mut ps = pick(states, e, |s| match s {
                        LayerState::Delta(d) => Some(d),
                        _ => None,
                    })?;
                    ple::forward(ctx, w, d, &emb, &mut res, &tokens, &rows, &mut ps)?;
                }
                let (input, inj) = hyper_conn::mix(ctx, &l.hc_attn, &self.hc, &res, &rows);
                ctx.tap("attn_norm", Some(il), &input, h);
                let out = match &l.mixer {
                    Mixer::Delta(w) => {
                        let mut ds = pick(states, il, delta_of)?;
                        deltanet::forward(ctx, w, &self.cfg.delta, &input, &rows, &mut ds, il)
                    }
                    Mixer::Attn(w) => {
                        let mut kvs = pick(states, il, kv_of)?;
                        attention::forward(ctx, w, &self.cfg.attn, &input, &rows, &mut kvs, il)
                    }
                    Mixer::Qsa(w) => {
                        let e = l.extra.expect("a QSA layer has its indexer cache");
                        let (mut kvs, mut idx) = pick2(states, il, e)?;
                        qsa::forward(ctx, w, &self.cfg.attn, &self.qsa, &input, &rows, &mut kvs, &mut idx, il)?
                    }
                };
                ctx.tap("attn_output", Some(il), &out, h);
                hyper_conn::combine(ctx, &self.hc, &mut res, &out, inj.as_deref().expect("a layer's mixer injects"));
                let (input, inj) = hyper_conn::mix(ctx, &l.hc_ffn, &self.hc, &res, &rows);
                let md = self.cfg.moe.as_ref().expect("moe dims");
                let next = self.layers.get(il + 1).map(|n| moe::Lookahead { layer: il + 1, weights: &n.moe });
                let f = moe::forward_rows(ctx, &l.moe, md, store, il, &input, &rows, h, next)?;
                ctx.tap("ffn_out", Some(il), &f, h);
                hyper_conn::combine(ctx, &self.hc, &mut res, &f, inj.as_deref().expect("a layer's mixer injects"));
                ctx.tap("l_out", Some(il), &res, hc * h);
            }
            Ok(())
        })?;
        for (st, sp) in states.iter_mut().zip(spans) {
            st.pos += sp.tokens.len();
        }
        // the MTP head reads the hc-wide residual before the final mixer (llama.cpp's h_nextn)
        let w = hc * h;
        let hidden: Vec<Vec<f32>> = rows.spans.iter().zip(spans).map(|(s, sp)| if sp.hidden { res[s.start * w..(s.start + s.len) * w].to_vec() } else { Vec::new() }).collect();
        // the lm head over the rows asked for, after the final mixer (the output norm)
        let _sp = ctx.span(Op::LmHead);
        let wanted: Vec<usize> = rows.spans.iter().zip(spans).flat_map(|(s, sp)| sp.logits.clone().map(move |i| s.start + i)).collect();
        let v = self.cfg.n_vocab;
        let logits = if wanted.is_empty() {
            Vec::new()
        } else {
            let sel = crate::batch::gather(&res, hc * h, &wanted);
            let head_rows = super::head_rows(spans);
            let (normed, _) = hyper_conn::mix(ctx, &self.output_hc, &self.hc, &sel, &head_rows);
            ctx.tap("result_norm", None, &normed, h);
            ctx.mm_rows1(&self.output, &normed, &head_rows).to_vec()
        };
        let mut at = 0;
        Ok(spans
            .iter()
            .zip(hidden)
            .map(|(sp, hidden)| {
                let n = sp.logits.len();
                let part = logits.get(at * v..(at + n) * v).map(<[f32]>::to_vec).unwrap_or_default();
                at += n;
                SpanOut { logits: part, hidden, argmax: None, picks: Vec::new() }
            })
            .collect())
    }
}

/// State `il` of every sequence, as the kind `f` takes.
fn pick<'s, T>(states: &'s mut [&mut SeqState], il: usize, f: impl Fn(&'s mut LayerState) -> Option<&'s mut T>) -> Result<Vec<&'s mut T>> {
    states
        .iter_mut()
        .enumerate()
        .map(|(i, st)| f(&mut st.layers[il]).ok_or_else(|| EngineError::State(format!("sequence {i}, state {il}: kind does not match the model"))))
        .collect()
}

/// A QSA layer's KV cache (`il`) and indexer cache (`e`) of every sequence.
fn pick2<'s>(states: &'s mut [&mut SeqState], il: usize, e: usize) -> Result<(Vec<&'s mut KvCache>, Vec<&'s mut KvCache>)> {
    let mut kvs = Vec::with_capacity(states.len());
    let mut idx = Vec::with_capacity(states.len());
    for (i, st) in states.iter_mut().enumerate() {
        let (lo, hi) = st.layers.split_at_mut(e);
        match (&mut lo[il], &mut hi[0]) {
            (LayerState::Attn(a), LayerState::Attn(b)) => {
                kvs.push(a);
                idx.push(b);
            }
            _ => return Err(EngineError::State(format!("sequence {i}: QSA layer {il}'s caches do not match the model"))),
        }
    }
    Ok((kvs, idx))
}

fn kv_of(l: &mut LayerState) -> Option<&mut KvCache> {
    match l {
        LayerState::Attn(kv) => Some(kv),
        _ => None,
    }
}

fn delta_of(l: &mut LayerState) -> Option<&mut DeltaState> {
    match l {
        LayerState::Delta(d) => Some(d),
        _ => None,
    }
}

/// The registry's loader for `qwen4exp`.
pub fn load(f: &GgufFile) -> Result<Loaded> {
    let (net, experts) = Qwen4Exp::load(f)?;
    Ok(Loaded { net: Box::new(net), experts })
}

impl Network for Qwen4Exp {
    fn arch(&self) -> &str {
        &self.cfg.arch
    }

    fn n_vocab(&self) -> usize {
        self.cfg.n_vocab
    }

    fn hidden(&self) -> usize {
        self.cfg.hidden * self.hc.hc
    }

    /// The layers' states, then the extras in layer order: a PLE layer's n-gram window and conv
    /// history (a recurrent state), a QSA layer's indexer cache (rows of raw indexer keys).
    fn new_state(&self) -> SeqState {
        let mut layers: Vec<LayerState> = self
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Attn(_) | Mixer::Qsa(_) => LayerState::Attn(KvCache::default()),
                Mixer::Delta(_) => LayerState::Delta(self.cfg.delta.zero_state()),
            })
            .collect();
        for l in &self.layers {
            if l.extra.is_some() {
                match (&l.mixer, &self.ple) {
                    (Mixer::Qsa(_), _) => layers.push(LayerState::Attn(KvCache::default())),
                    (_, Some(d)) => layers.push(LayerState::Delta(d.zero_state())),
                    _ => {}
                }
            }
        }
        SeqState::new(layers)
    }

    fn forward(&self, ctx: &Ctx, store: &dyn ExpertStore, states: &mut [&mut SeqState], spans: &[SpanIn]) -> Result<Vec<SpanOut>> {
        self.forward_batch(ctx, store, states, spans)
    }

    fn forward_wave(&self, _ctx: &Ctx, _store: &dyn ExpertStore, _state: &mut SeqState, _chunks: &[SpanIn]) -> Result<Option<Vec<SpanOut>>> {
        Ok(None)
    }

    fn plan_figures(&self, max_ctx: usize, kv_types: (crate::config::KvType, crate::config::KvType)) -> PlanFigures {
        let md = self.cfg.moe.as_ref();
        let n_qsa = self.layers.iter().filter(|l| matches!(l.mixer, Mixer::Qsa(_))).count() as u64;
        let idx = n_qsa * (kv_types.0.row_bytes(self.qsa.head_dim) as u64).saturating_mul(max_ctx as u64);
        let ple = self.ple.as_ref().map_or(0, |d| d.state_len() as u64 * 4);
        let wide = (self.hc.hc * self.cfg.hidden) as u64;
        PlanFigures {
            state_bytes: hybrid::state_bytes(&self.cfg, max_ctx, kv_types).saturating_add(idx + ple),
            scratch_bytes: hybrid::scratch_bytes(&self.cfg) + crate::memory_plan::PREFILL_BATCH as u64 * 8 * wide * 4,
            wave_row_bytes: hybrid::wave_row_bytes(&self.cfg) + 3 * wide * 4,
            n_expert: md.map_or(0, |m| m.n_expert),
            n_used: md.map_or(0, |m| m.n_used),
        }
    }

    /// The PLE n-gram table: a token reads one row per head.
    fn row_tables(&self) -> Vec<crate::experts::rows::RowTable> {
        match (&self.ple_table, &self.ple) {
            (Some(t), Some(d)) => vec![crate::experts::rows::RowTable { mat: t.clone(), per_token: d.n_heads() }],
            _ => Vec::new(),
        }
    }
}
