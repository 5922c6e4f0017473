//! Multi-head latent attention in its absorbed form, as Kimi-Linear and Kimi K3 have it: no rope
//! anywhere, one shared latent KV head (llama.cpp `kimi-linear.cpp`, `kimi-k3.cpp`, "MLA KV
//! cache enabled"; the converter splits kv_b into per-head `attn_k_b` and `attn_v_b`).
//!
//! Per token (r = kv_lora_rank, e = qk_rope_head_dim, n = qk_nope_head_dim, dv = v_head_dim):
//!   q_h = (W_q x)_h = [q_nope_h (n) | q_pe_h (e)]          per head h
//!         (compressed q: W_q x = W_q_b · (rms_norm(W_q_a x)·q_a_norm))
//!   [c | k_pe] = W_kv_a x;  c ← rms_norm(c)·kv_a_norm          c: r, k_pe: e
//!   Q_h = [W_k_b,h q_nope_h (r) | q_pe_h]    K = [c | k_pe]    V = c   (one KV head, r + e / r)
//!   o_h = W_v_b,h · softmax(Q_h Kᵀ / √(n + e)) V              (dv)
//!   out = W_o [o_1 … o_H]                        (K3: W_o ([o_1 … o_H] ⊙ sigmoid(W_g x)))
//! The cache holds K (r + e per position) and V (r, the same values as K's first r: llama.cpp's
//! V is a view of its K cache, so an f16 cache rounds them alike).

use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::state::KvCache;
use crate::backend::{AttnHeads, Buf, Cols};
use crate::profile::Op;
use crate::weights::{Loader, Mat};
use crate::error::Result;

#[derive(Clone, Copy, Debug)]
pub struct MlaDims {
    pub n_head: usize,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_head: usize,
    pub eps: f32,
    /// The compressed q's rank (`q_lora_rank`), 0 = an uncompressed W_q.
    pub q_lora: usize,
}

impl MlaDims {
    /// A query head's width as W_q writes it (nope + rope).
    pub fn q_head(&self) -> usize {
        self.nope + self.rope
    }
    /// K row width in the cache (rank + rope).
    pub fn k_width(&self) -> usize {
        self.kv_lora + self.rope
    }
}

/// How the queries are projected.
pub enum MlaQ {
    /// `attn_q` [H·(n + e) × hidden].
    Full(Mat),
    /// `attn_q_a` [q_lora × hidden], `attn_q_a_norm`, `attn_q_b` [H·(n + e) × q_lora].
    Lora { a: Mat, norm: Vec<f32>, b: Mat },
}

pub struct MlaWeights {
    pub q: MlaQ,
    pub kv_a: Mat,      // [(r + e) × hidden]
    pub kv_a_norm: Vec<f32>,
    pub k_b: Mat,       // H × [r × n]
    pub v_b: Mat,       // H × [dv × r]
    pub o: Mat,         // [hidden × H·dv]
    /// K3's output gate `attn_gate` [H·dv × hidden] on the normed layer input.
    pub gate: Option<Mat>,
}

impl MlaWeights {
    pub fn load(ld: &Loader, il: usize, hidden: usize, d: &MlaDims) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let q = if d.q_lora > 0 {
            MlaQ::Lora {
                a: ld.mat(&p("attn_q_a.weight"), d.q_lora, hidden)?,
                norm: ld.vec(&p("attn_q_a_norm.weight"), d.q_lora)?,
                b: ld.mat(&p("attn_q_b.weight"), d.n_head * d.q_head(), d.q_lora)?,
            }
        } else {
            MlaQ::Full(ld.mat(&p("attn_q.weight"), d.n_head * d.q_head(), hidden)?)
        };
        let gate = if ld.has(&p("attn_gate.weight")) { Some(ld.mat(&p("attn_gate.weight"), d.n_head * d.v_head, hidden)?) } else { None };
        Ok(MlaWeights {
            q,
            kv_a: ld.mat(&p("attn_kv_a_mqa.weight"), d.k_width(), hidden)?,
            kv_a_norm: ld.vec(&p("attn_kv_a_norm.weight"), d.kv_lora)?,
            k_b: ld.mats(&p("attn_k_b.weight"), d.n_head, d.kv_lora, d.nope)?,
            v_b: ld.mats(&p("attn_v_b.weight"), d.n_head, d.v_head, d.kv_lora)?,
            o: ld.mat(&p("attn_output.weight"), hidden, d.n_head * d.v_head)?,
            gate,
        })
    }
}

/// Positions a cache holds.
pub fn cache_len(kv: &KvCache, d: &MlaDims) -> usize {
    kv.k.len() / d.k_width()
}

/// Each head's matrix of a per-head stack (`w`: H matrices rows × cols) applied to that head's
/// rows: `xs` is n × H × cols (token-major, heads within), `ys` n × H × rows. As llama.cpp's
/// batched mul_mat does it per head: a span's rows as one product of its row count; a decode
/// row (or a decode-order span's rows) one at a time in the one-token kernels — all heads' and
/// all decode rows' products in one parallel job (`Ctx::mv_batch`), not one dispatch each.
///
/// llama.cpp repacks a Q4_K, Q4_0 or IQ4_NL matrix (AVX-512: also Q2_K; row count a multiple
/// of 8) only when it is 2-D (ggml-cpu repack.cpp `supports_op`); these stacks are 3-D, so
/// their products take the plain kernels (found with `xwen logits --dump-tensors` against
/// llama_dump: Qcur of Q4_0; kqv_out of Q2_K in an AVX-512 build). xwen's dispatch decides repacking by row count, so a head's matrix is run in
/// pieces of 7 rows, which it never repacks — every output element is one row's dot product,
/// the same bits whatever the pieces.
///
/// `src_contiguous`: whether llama.cpp's activations for this product are a contiguous tensor.
/// They are not for W_k_b (a permuted view of q) nor for W_v_b after flash attention, and an F32
/// matrix against a non-contiguous F32 input skips llamafile's sgemm (ggml-cpu's mul_mat tries
/// it only on contiguous input or after converting to another vec_dot type): every product is
/// then `ggml_vec_dot_f32`, the one-token order, whatever the row count.
fn heads_mm(ctx: &Ctx, w: &Mat, xs: &[f32], rows: &Rows, ys: &mut [f32], src_contiguous: bool) {
    const PLAIN_PIECE: usize = 7;
    let nh = w.n_mats;
    let (wr, wc) = (w.rows, w.cols);
    let q0 = w.q_sub(ctx.file, 0);
    let rb = q0.row_bytes();
    // ggml-cpu repacks only 2-D matrices (repack.cpp supports_op: ggml_n_dims, which does not
    // count a trailing 1), so these 3-D ones keep the plain kernels of every type xwen would
    // otherwise repack by row count — unless there is one head
    let repackable = nh > 1 && xwen_kernels::q4k_repack::repacked_by_reference(q0.ty, wr);
    let pieces: Vec<(usize, usize)> = if repackable {
        (0..wr).step_by(PLAIN_PIECE).map(|r0| (r0, (r0 + PLAIN_PIECE).min(wr))).collect()
    } else {
        vec![(0, wr)]
    };
    let piece = |h: usize, (r0, r1): (usize, usize)| {
        let q = w.q_sub(ctx.file, h);
        xwen_kernels::QMatrix { ty: q.ty, rows: r1 - r0, cols: q.cols, data: &q.data[r0 * rb..r1 * rb] }
    };
    // decode rows: one job of every (row, head, piece) product
    let one_token_order = q0.ty == xwen_gguf::GgmlType::F32 && !src_contiguous;
    let single: Vec<bool> = {
        let mut v = vec![one_token_order; rows.n];
        for s in rows.spans.iter().filter(|s| s.decode_order || s.len == 1) {
            v[s.rows()].iter_mut().for_each(|x| *x = true);
        }
        v
    };
    {
        let mut jobs = Vec::new();
        for (t, y_t) in ys.chunks_exact_mut(nh * wr).enumerate() {
            if !single[t] {
                continue;
            }
            for (h, mut y_h) in y_t.chunks_exact_mut(wr).enumerate() {
                let x = &xs[(t * nh + h) * wc..][..wc];
                for &(r0, r1) in &pieces {
                    let (y_p, rest) = y_h.split_at_mut(r1 - r0);
                    y_h = rest;
                    jobs.push(crate::backend::MvJob { w: piece(h, (r0, r1)), x, y: y_p });
                }
            }
        }
        if !jobs.is_empty() {
            ctx.mv_batch(&mut jobs);
        }
    }
    // prefill spans: per head, the span's rows as one product
    for s in rows.spans.iter().filter(|s| !(s.decode_order || s.len == 1 || one_token_order)) {
        let mut x_h = vec![0.0f32; s.len * wc];
        for h in 0..nh {
            for (i, t) in s.rows().enumerate() {
                x_h[i * wc..(i + 1) * wc].copy_from_slice(&xs[(t * nh + h) * wc..][..wc]);
            }
            for &(r0, r1) in &pieces {
                let mut y_p = vec![0.0f32; s.len * (r1 - r0)];
                ctx.mm_into(piece(h, (r0, r1)), &x_h, s.len, &mut y_p);
                for (i, t) in s.rows().enumerate() {
                    ys[(t * nh + h) * wr + r0..(t * nh + h) * wr + r1].copy_from_slice(&y_p[i * (r1 - r0)..(i + 1) * (r1 - r0)]);
                }
            }
        }
    }
}

/// Mixer output for the batch `rows` of normalized input x (rows.n × hidden); `kvs[i]` is span
/// i's sequence's cache, which its K and V rows are appended to.
pub fn forward<'a>(ctx: &Ctx<'a>, w: &MlaWeights, d: &MlaDims, x: &[f32], rows: &Rows, kvs: &mut [&mut KvCache], il: usize) -> Buf<'a> {
    assert_eq!(kvs.len(), rows.spans.len(), "one KV cache per span");
    let n = rows.n;
    let (nh, r, e, nope, dv) = (d.n_head, d.kv_lora, d.rope, d.nope, d.v_head);
    let (qh, kw) = (d.q_head(), d.k_width());
    let sp = ctx.span(Op::AttnProj);
    // the products of x in one weight pass: q (or its compression), the latent KV, K3's gate
    let first = match &w.q {
        MlaQ::Full(q) => q,
        MlaQ::Lora { a, .. } => a,
    };
    let mut ws = vec![first, &w.kv_a];
    ws.extend(w.gate.as_ref());
    let mut p = ctx.mm_rows(&ws, x, rows).into_iter();
    let (q1, mut kv, gate) = (p.next().expect("q"), p.next().expect("kv_a"), p.next());
    let q = match &w.q {
        MlaQ::Full(_) => q1,
        MlaQ::Lora { norm, b, .. } => {
            let mut qc = q1;
            ctx.backend.rms_norm_inplace(&mut qc, d.q_lora, norm, d.eps);
            ctx.mm_rows1(b, &qc, rows)
        }
    };
    // c ← rms_norm(c)·kv_a_norm, per token
    ctx.backend.rms_norm_inplace(&mut kv, kw, &w.kv_a_norm, d.eps);
    // the absorbed queries: Q_h = [W_k_b,h q_nope_h | q_pe_h], [n × H × (r + e)]
    let mut qa = ctx.zeros(n * nh * kw);
    {
        // per (row, head): q's first `nope` columns, W_k_b's product of them, then q's rope part
        let mut nope_all = ctx.zeros(n * nh * nope);
        ctx.backend.gather_columns(&q, n * nh, &[Cols { from: 0, out: 0, to: 0, len: nope }], &mut [&mut nope_all]);
        let mut abs = ctx.zeros(n * nh * r);
        heads_mm(ctx, &w.k_b, &nope_all, rows, &mut abs, false);
        ctx.backend.gather_columns(&abs, n * nh, &[Cols { from: 0, out: 0, to: 0, len: r }], &mut [&mut qa]);
        ctx.backend.gather_columns(&q, n * nh, &[Cols { from: nope, out: 0, to: r, len: e }], &mut [&mut qa]);
    }
    drop(sp);
    // llama.cpp's names (kimi-linear.cpp): the absorbed queries and the latent keys
    ctx.tap("Qcur", Some(il), &qa, kw);
    ctx.tap("Kcur", Some(il), &kv, kw);
    let sp = ctx.span(Op::AttnCore);
    for (s, cache) in rows.spans.iter().zip(kvs.iter_mut()) {
        debug_assert_eq!(cache_len(cache, d), s.pos0, "a sequence's KV holds its positions");
        for t in s.rows() {
            let row = &kv[t * kw..(t + 1) * kw];
            cache.append(row, &row[..r], kw, r);
        }
    }

    // softmax(Q_h Kᵀ · scale) V per (row, head): one latent KV head, V the first r of the K row
    let heads = AttnHeads { n_head: nh, n_head_kv: 1, k_dim: kw, v_dim: r, k_row: kw, v_row: r, scale: 1.0 / (qh as f32).sqrt() };
    let mut att = ctx.zeros(n * nh * r);
    let caches: Vec<&KvCache> = kvs.iter().map(|c| &**c).collect();
    ctx.backend.attend(&qa, &caches, rows, &heads, &ctx.attn, &mut att);
    drop(sp);
    let _sp = ctx.span(Op::AttnProj);
    // decompress each head: o_h = W_v_b,h · att_h, then W_o
    let mut o = ctx.zeros(n * nh * dv);
    // without flash attention the attention output is a product's (contiguous) result; flash
    // attention's [r, H, n] output permuted to [r, n, H] is contiguous only for one head
    heads_mm(ctx, &w.v_b, &att, rows, &mut o, !ctx.attn.flash || nh == 1);
    ctx.tap("kqv_out", Some(il), &o, nh * dv);
    if let Some(g) = gate {
        // K3: o ⊙ sigmoid(W_g x) (ggml_sigmoid, then ggml_mul)
        ctx.backend.mul_sigmoid(&mut o, &g);
    }
    ctx.mm_rows1(&w.o, &o, rows)
}
