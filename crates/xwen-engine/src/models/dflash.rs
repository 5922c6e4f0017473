//! The DFlash block drafter (llama.cpp arch `dflash`): a small non-causal transformer that
//! denoises a whole block of drafted tokens in one forward, conditioned on the target's hidden
//! states through K/V rows injected into its own cache.
//! Reference: llama.cpp b11434 `src/models/dflash.cpp` (`graph<false>`: the embd batch injects,
//! the token batch denoises) and `common/speculative.cpp` `common_speculative_impl_draft_dflash`
//! (what is injected where, the block's layout), which `runtime::speculative::DflashDrafter`
//! follows. Only the plain DFlash backbone: the DSV4 (DSpark), DFlash2 (conv, selector),
//! reduced-vocabulary (d2t) and Markov-head variants are refused at load with their names.
//!
//! Injection, for the target's row at position p (features f = the inputs of the target layers
//! `target_layers` names, concatenated in that order — pre-norm residual streams, not h_nextn):
//!   g = rms_norm(fc · f)·enc.output_norm                     [n_tap·H_t → hidden]
//!   per layer: K_p = rope(rms_norm_head(wk · g)·k_norm, p), V_p = wv · g   (no Q: nobody reads g)
//! Denoising a block [x_n, mask, …, mask] at positions n.. (x_n the pending token):
//!   x = embed(tokens)  (the target's token_embd where the sidecar has none)
//!   per layer: a = rms_norm(x)·attn_norm; q, k, v = wq·a, wk·a, wv·a, q/k head-normed and roped;
//!              attention over the cache's rows 0..n (sliding window on SWA layers) and the
//!              block's own rows, all of them (non-causal); x = wo·attn + x; x = ffn(rms_norm(x)·ffn_norm) + x
//!   logits = output · rms_norm(x)·output_norm   (the target's output where the sidecar has none)
//! Row i of the block predicts the token at n + i; row 0's is x_n itself, never read.

use super::hybrid::req_u;
use crate::backend::{BlockAttn, Rope};
use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::error::{EngineError, Result};
use crate::layers::ffn::{self, FfnWeights};
use crate::weights::{Loader, Mat};
use std::sync::Arc;
use xwen_gguf::GgufFile;

/// The sidecar's hyperparameters.
#[derive(Clone, Debug)]
pub struct DflashConfig {
    pub hidden: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    pub eps: f32,
    pub ff: usize,
    /// Target layers whose inputs condition the drafts (GGUF `dflash.target_layers`: llama.cpp's
    /// `t_layer_inp` index, the HF id + 1).
    pub taps: Vec<usize>,
    pub block_size: usize,
    pub mask_token: u32,
    /// Sliding window per layer (None: full attention).
    pub window: Vec<Option<usize>>,
    pub causal: bool,
    pub kq_scale: f32,
    pub embed_scale: Option<f32>,
}

struct DflashLayer {
    attn_norm: Vec<f32>,
    q: Mat,
    k: Mat,
    v: Mat,
    o: Mat,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    ffn: FfnWeights,
}

/// A loaded DFlash sidecar beside its target.
pub struct DflashHead {
    pub cfg: DflashConfig,
    file: Arc<GgufFile>,
    fc: Mat,
    enc_norm: Vec<f32>,
    out_norm: Vec<f32>,
    layers: Vec<DflashLayer>,
    /// token_embd and the lm head, each in the sidecar (true) or the target's file (false).
    embed: (Mat, bool),
    output: (Mat, bool),
    target_hidden: usize,
    n_vocab: usize,
}

/// One sequence's DFlash cache: per layer the K and V rows of the injected positions 0..len.
#[derive(Clone, Debug, Default)]
pub struct DflashCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    pub len: usize,
}

impl DflashCache {
    /// Drops the rows from position `pos` on.
    pub fn truncate(&mut self, pos: usize, kv_width: usize) {
        if pos < self.len {
            for l in self.k.iter_mut().chain(self.v.iter_mut()) {
                l.truncate(pos * kv_width);
            }
            self.len = pos;
        }
    }
}

/// Tensor names of the DFlash variants this head does not compute.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("hc_head_fn.weight", "DSpark's DeepSeek-V4 backbone"),
    ("selector_hidden.weight", "DFlash2's selector"),
    ("markov_w1.weight", "DSpark's Markov head"),
    ("d2t", "a reduced draft vocabulary (d2t)"),
    ("fc.scale", "a scaled fc"),
    ("blk.0.attn_conv_proj.weight", "DFlash2's convolutions"),
    ("blk.0.attn_sinks.weight", "attention sinks"),
    ("blk.0.post_attention_norm.weight", "post-attention norms"),
    ("blk.0.post_ffw_norm.weight", "post-FFN norms"),
    ("blk.0.layer_output_scale.weight", "layer output scales"),
    ("rope_freqs.weight", "rope frequency factors"),
    ("blk.0.rope_freqs.weight", "rope frequency factors"),
];

impl DflashHead {
    /// The DFlash sidecar `f` for `target` (its token_embd and lm head serve where `f` has none).
    pub fn load(f: &Arc<GgufFile>, target: &GgufFile, target_hidden: usize, target_layers: usize, n_vocab: usize) -> Result<DflashHead> {
        let bad = |m: String| EngineError::Config(m);
        if f.architecture() != Some("dflash") {
            return Err(bad(format!("not a DFlash sidecar (general.architecture {:?})", f.architecture().unwrap_or(""))));
        }
        let ld = Loader::new(f);
        for (name, what) in UNSUPPORTED {
            if ld.has(name) {
                return Err(bad(format!("a DFlash variant with {what} ({name}), which xwen does not run")));
            }
        }
        if f.get("dflash.hyper_connection_count").is_some() {
            return Err(bad("a DFlash variant with DSpark's DeepSeek-V4 backbone, which xwen does not run".into()));
        }
        let k = |s: &str| format!("dflash.{s}");
        let hidden = req_u(f, &k("embedding_length"))?;
        let n_layer = req_u(f, &k("block_count"))?;
        let n_head = req_u(f, &k("attention.head_count"))?;
        let n_head_kv = f.get_u64(&k("attention.head_count_kv")).map_or(n_head, |v| v as usize);
        let head_dim = f.get_u64(&k("attention.key_length")).map_or(hidden / n_head.max(1), |v| v as usize);
        let n_rot = f.get_u64(&k("rope.dimension_count")).map_or(head_dim, |v| v as usize);
        if n_layer == 0 || n_layer > 256 || n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) || head_dim == 0 || n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(bad(format!("DFlash geometry out of range: {n_layer} layers, {n_head}/{n_head_kv} heads of {head_dim}, rope over {n_rot}")));
        }
        if f.get_u64(&k("attention.value_length")).is_some_and(|v| v as usize != head_dim) {
            return Err(bad("DFlash K and V head sizes differ".into()));
        }
        if let Some(act) = f.get_str(&k("hidden_act")).filter(|a| *a != "silu") {
            return Err(bad(format!("DFlash hidden activation {act:?}: only silu is run")));
        }
        if f.get_array(&k("rope.dimension_sections")).is_some_and(|s| s.iter().skip(1).any(|v| v.as_u64() != Some(0))) {
            return Err(bad("DFlash M-RoPE sections beyond the temporal one".into()));
        }
        let taps: Vec<usize> = f
            .get_array(&k("target_layers"))
            .ok_or_else(|| bad("a DFlash sidecar without dflash.target_layers".into()))?
            .iter()
            .map(|v| v.as_i64().filter(|&i| i >= 0 && (i as usize) < target_layers).map(|i| i as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(format!("dflash.target_layers names a layer outside the target's {target_layers}")))?;
        if taps.is_empty() {
            return Err(bad("dflash.target_layers is empty".into()));
        }
        let block_size = f.get_u64(&k("block_size")).map_or(16, |v| v as usize);
        if !(2..=64).contains(&block_size) {
            return Err(bad(format!("dflash.block_size {block_size} out of range")));
        }
        let mask_token = f.get_u64("tokenizer.ggml.mask_token_id").ok_or_else(|| bad("a DFlash sidecar without tokenizer.ggml.mask_token_id".into()))?;
        if mask_token >= n_vocab as u64 {
            return Err(bad(format!("mask token {mask_token} outside the vocabulary of {n_vocab}")));
        }
        let window = match f.get_u64(&k("attention.sliding_window")).filter(|&w| w > 0) {
            Some(w) => {
                let pat = f.get_array(&k("attention.sliding_window_pattern")).ok_or_else(|| bad("a sliding window without its per-layer pattern".into()))?;
                if pat.len() < n_layer {
                    return Err(bad("dflash.attention.sliding_window_pattern is shorter than the layers".into()));
                }
                pat[..n_layer].iter().map(|p| p.as_bool().unwrap_or(false).then_some(w as usize)).collect()
            }
            None => vec![None; n_layer],
        };
        let kq_scale = f.get_f32(&k("attention.scale")).filter(|&s| s != 0.0).unwrap_or(1.0 / (head_dim as f32).sqrt());
        if f.get_f32(&k("attention.value_scale")).is_some_and(|s| s != 0.0) {
            return Err(bad("a DFlash attention value scale, which xwen does not run".into()));
        }
        let cfg = DflashConfig {
            hidden,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_base: f.get_f32(&k("rope.freq_base")).unwrap_or(10000.0),
            eps: f.get_f32(&k("attention.layer_norm_rms_epsilon")).ok_or_else(|| EngineError::MissingKey(k("attention.layer_norm_rms_epsilon")))?,
            ff: req_u(f, &k("feed_forward_length"))?,
            taps,
            block_size,
            mask_token: mask_token as u32,
            window,
            causal: f.get_bool(&k("attention.causal")).unwrap_or(false),
            kq_scale,
            embed_scale: f.get_f32(&k("embedding_scale")).filter(|&s| s != 0.0),
        };
        let (h, hq, kvw) = (hidden, n_head * head_dim, n_head_kv * head_dim);
        let mut layers = Vec::with_capacity(n_layer);
        for il in 0..n_layer {
            let p = |s: &str| format!("blk.{il}.{s}");
            if !ld.has(&p("attn_v.weight")) {
                return Err(bad(format!("{}: a DFlash layer with shared K/V, which xwen does not run", p("attn_v.weight"))));
            }
            layers.push(DflashLayer {
                attn_norm: ld.vec(&p("attn_norm.weight"), h)?,
                q: ld.mat(&p("attn_q.weight"), hq, h)?,
                k: ld.mat(&p("attn_k.weight"), kvw, h)?,
                v: ld.mat(&p("attn_v.weight"), kvw, h)?,
                o: ld.mat(&p("attn_output.weight"), h, hq)?,
                q_norm: ld.vec(&p("attn_q_norm.weight"), head_dim)?,
                k_norm: ld.vec(&p("attn_k_norm.weight"), head_dim)?,
                ffn_norm: ld.vec(&p("ffn_norm.weight"), h)?,
                ffn: FfnWeights::load(&ld, il, h, cfg.ff, "")?,
            });
        }
        let tl = Loader::new(target);
        let embed = if ld.has("token_embd.weight") { (ld.mat("token_embd.weight", n_vocab, h)?, true) } else { (tl.mat("token_embd.weight", n_vocab, h)?, false) };
        let output = if ld.has("output.weight") {
            (ld.mat("output.weight", n_vocab, h)?, true)
        } else if ld.has("token_embd.weight") {
            (ld.mat("token_embd.weight", n_vocab, h)?, true)
        } else if tl.has("output.weight") {
            (tl.mat("output.weight", n_vocab, h)?, false)
        } else {
            (tl.mat("token_embd.weight", n_vocab, h)?, false)
        };
        if (!embed.1 || !output.1) && target_hidden != h {
            return Err(bad(format!("a DFlash sidecar of width {h} sharing the embeddings of a target of width {target_hidden}")));
        }
        Ok(DflashHead {
            fc: ld.mat("fc.weight", h, cfg.taps.len() * target_hidden)?,
            enc_norm: ld.vec("enc.output_norm.weight", h)?,
            out_norm: ld.vec("output_norm.weight", h)?,
            cfg,
            file: Arc::clone(f),
            layers,
            embed,
            output,
            target_hidden,
            n_vocab,
        })
    }

    /// The file the head's own weights live in.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// Width of one injected row: the tapped layers' inputs side by side.
    pub fn feature_width(&self) -> usize {
        self.cfg.taps.len() * self.target_hidden
    }

    pub fn kv_width(&self) -> usize {
        self.cfg.n_head_kv * self.cfg.head_dim
    }

    /// Bytes of one sequence's cache at `max_ctx` positions (f32 K and V, every layer).
    pub fn state_bytes(&self, max_ctx: usize) -> u64 {
        (2 * self.cfg.n_layer * self.kv_width() * 4) as u64 * max_ctx as u64
    }

    pub fn new_cache(&self) -> DflashCache {
        DflashCache { k: vec![Vec::new(); self.cfg.n_layer], v: vec![Vec::new(); self.cfg.n_layer], len: 0 }
    }

    fn rope(&self) -> Rope<'static> {
        Rope { n_rot: self.cfg.n_rot, base: self.cfg.rope_base, still: None }
    }

    /// Injects `n` target rows (`feats`: n × feature_width) at positions `cache.len`.. —
    /// llama.cpp's embd batch: fc, the encoder norm, then each layer's K and V of the result.
    pub fn inject(&self, ctx: &Ctx, cache: &mut DflashCache, feats: &[f32], n: usize) -> Result<()> {
        let (h, fw) = (self.cfg.hidden, self.feature_width());
        if feats.len() != n * fw {
            return Err(EngineError::State(format!("DFlash features: {} values for {n} rows of {fw}", feats.len())));
        }
        if n == 0 {
            return Ok(());
        }
        let rows = Rows::single(n, cache.len);
        let g0 = ctx.mm_rows1(&self.fc, feats, &rows);
        let mut g = ctx.zeros(n * h);
        ctx.backend.rms_norm(&g0, &self.enc_norm, self.cfg.eps, &mut g);
        let positions = rows.positions();
        for (il, l) in self.layers.iter().enumerate() {
            let mut kv = ctx.mm_rows(&[&l.k, &l.v], &g, &rows).into_iter();
            let (mut k, v) = (kv.next().expect("two products"), kv.next().expect("two products"));
            ctx.backend.norm_rope_heads(&mut [(&mut k, &l.k_norm)], self.cfg.eps, &self.rope(), &positions);
            cache.k[il].extend_from_slice(&k);
            cache.v[il].extend_from_slice(&v);
        }
        cache.len += n;
        Ok(())
    }

    /// Denoises the block `tokens` (the pending token, then masks) at positions `cache.len`..;
    /// returns every block row's logits (tokens × n_vocab). The cache is read, not extended.
    pub fn block(&self, ctx: &Ctx, target: &GgufFile, cache: &DflashCache, tokens: &[u32]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let (h, hd, n) = (c.hidden, c.head_dim, tokens.len());
        let (hq, kvw) = (c.n_head * hd, self.kv_width());
        let pos0 = cache.len;
        let rows = Rows::single(n, pos0);
        let positions = rows.positions();
        let mut x = vec![0.0f32; n * h];
        let (emb, own) = &self.embed;
        let q = emb.q(if *own { &self.file } else { target });
        let rb = emb.row_bytes();
        for (t, &id) in tokens.iter().enumerate() {
            let id = id as usize;
            if id >= self.n_vocab {
                return Err(EngineError::TokenOutOfRange { id: id as u32, n_vocab: self.n_vocab });
            }
            xwen_kernels::dequantize(q.ty, &q.data[id * rb..(id + 1) * rb], &mut x[t * h..(t + 1) * h]).map_err(|e| EngineError::State(format!("DFlash embedding: {e}")))?;
        }
        if let Some(s) = c.embed_scale {
            x.iter_mut().for_each(|v| *v *= s);
        }
        let mut a = vec![0.0f32; n * h];
        for (il, l) in self.layers.iter().enumerate() {
            ctx.backend.rms_norm(&x, &l.attn_norm, c.eps, &mut a);
            let mut p = ctx.mm_rows(&[&l.q, &l.k, &l.v], &a, &rows).into_iter();
            let (mut qh, mut kh, vh) = (p.next().expect("q"), p.next().expect("k"), p.next().expect("v"));
            ctx.backend.norm_rope_heads(&mut [(&mut qh, &l.q_norm), (&mut kh, &l.k_norm)], c.eps, &self.rope(), &positions);
            // keys and values: the cache's rows then the block's
            let (mut keys, mut vals) = (Vec::with_capacity((pos0 + n) * kvw), Vec::with_capacity((pos0 + n) * kvw));
            keys.extend_from_slice(&cache.k[il][..pos0 * kvw]);
            keys.extend_from_slice(&kh[..n * kvw]);
            vals.extend_from_slice(&cache.v[il][..pos0 * kvw]);
            vals.extend_from_slice(&vh[..n * kvw]);
            let blk = BlockAttn { n_head: c.n_head, n_head_kv: c.n_head_kv, head_dim: hd, pos0, scale: c.kq_scale, causal: c.causal, window: c.window[il] };
            let mut att = vec![0.0f32; n * hq];
            ctx.backend.attend_block(&qh, &keys, &vals, &blk, &mut att);
            let o = ctx.mm_rows1(&l.o, &att, &rows);
            x.iter_mut().zip(o.iter()).for_each(|(xi, oi)| *xi += oi);
            ctx.backend.rms_norm(&x, &l.ffn_norm, c.eps, &mut a);
            let f = ffn::forward(ctx, &l.ffn, &a, &rows);
            x.iter_mut().zip(f.iter()).for_each(|(xi, fi)| *xi += fi);
        }
        ctx.backend.rms_norm(&x.clone(), &self.out_norm, c.eps, &mut x);
        let (out, own) = &self.output;
        let mut logits = vec![0.0f32; n * self.n_vocab];
        ctx.mm_into(out.q(if *own { &self.file } else { target }), &x, n, &mut logits);
        Ok(logits)
    }
}
