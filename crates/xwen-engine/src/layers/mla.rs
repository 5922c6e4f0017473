//! Multi-head latent attention in its absorbed form, as Kimi-Linear has it: no rope anywhere,
//! no q compression, one shared latent KV head (llama.cpp `kimi-linear.cpp`, "MLA KV cache
//! enabled"; the converter splits kv_b into per-head `attn_k_b` and `attn_v_b`).
//!
//! Per token (r = kv_lora_rank, e = qk_rope_head_dim, n = qk_nope_head_dim, dv = v_head_dim):
//!   q_h = (W_q x)_h = [q_nope_h (n) | q_pe_h (e)]          per head h
//!   [c | k_pe] = W_kv_a x;  c ← rms_norm(c)·kv_a_norm          c: r, k_pe: e
//!   Q_h = [W_k_b,h q_nope_h (r) | q_pe_h]    K = [c | k_pe]    V = c   (one KV head, r + e / r)
//!   o_h = W_v_b,h · softmax(Q_h Kᵀ / √(n + e)) V              (dv)
//!   out = W_o [o_1 … o_H]
//! The cache holds K (r + e per position) and V (r, the same values as K's first r: llama.cpp's
//! V is a view of its K cache, so an f16 cache rounds them alike).

use crate::batch::Rows;
use crate::compute::Ctx;
use crate::config::KvType;
use crate::layers::attention::{KvBuf, KvCache};
use crate::layers::flash_attn::{self, HeadAt};
use crate::ops::{self, SharedMut};
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

pub struct MlaWeights {
    pub q: Mat,         // [H·(n + e) × hidden]
    pub kv_a: Mat,      // [(r + e) × hidden]
    pub kv_a_norm: Vec<f32>,
    pub k_b: Mat,       // H × [r × n]
    pub v_b: Mat,       // H × [dv × r]
    pub o: Mat,         // [hidden × H·dv]
}

impl MlaWeights {
    pub fn load(ld: &Loader, il: usize, hidden: usize, d: &MlaDims) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.{s}");
        Ok(MlaWeights {
            q: ld.mat(&p("attn_q.weight"), d.n_head * d.q_head(), hidden)?,
            kv_a: ld.mat(&p("attn_kv_a_mqa.weight"), d.k_width(), hidden)?,
            kv_a_norm: ld.vec(&p("attn_kv_a_norm.weight"), d.kv_lora)?,
            k_b: ld.mats(&p("attn_k_b.weight"), d.n_head, d.kv_lora, d.nope)?,
            v_b: ld.mats(&p("attn_v_b.weight"), d.n_head, d.v_head, d.kv_lora)?,
            o: ld.mat(&p("attn_output.weight"), hidden, d.n_head * d.v_head)?,
        })
    }
}

/// Positions a cache holds.
pub fn cache_len(kv: &KvCache, d: &MlaDims) -> usize {
    kv.k.len() / d.k_width()
}

/// Head `h`'s matrix of a per-head stack applied to each span's rows of `x` (rows × cols) as
/// llama.cpp's batched mul_mat does it per head: a span's rows as one product of its row count,
/// a decode-order span's rows one at a time (the one-token kernels).
///
/// llama.cpp repacks a Q4_K matrix (row count a multiple of 8) only when it is 2-D
/// (ggml-cpu repack.cpp `supports_op`); these stacks are 3-D, so their products take the plain
/// Q4_K kernels. xwen's dispatch decides repacking by row count, so the head's matrix is run in
/// pieces of 7 rows, which it never repacks — every output element is one row's dot product,
/// the same bits whatever the pieces.
fn per_head_mm(ctx: &Ctx, w: &Mat, h: usize, x: &[f32], rows: &Rows, y: &mut [f32]) {
    const PLAIN_PIECE: usize = 7;
    let q = w.q_sub(ctx.file, h);
    let pieces: Vec<(usize, usize)> = if q.ty == xwen_gguf::GgmlType::Q4_K && q.rows.is_multiple_of(8) {
        (0..q.rows).step_by(PLAIN_PIECE).map(|r0| (r0, (r0 + PLAIN_PIECE).min(q.rows))).collect()
    } else {
        vec![(0, q.rows)]
    };
    let rb = q.row_bytes();
    let mut run = |t0: usize, n: usize| {
        let xs = &x[t0 * w.cols..(t0 + n) * w.cols];
        if pieces.len() == 1 {
            ctx.mm_into(q, xs, n, &mut y[t0 * w.rows..(t0 + n) * w.rows]);
            return;
        }
        for &(r0, r1) in &pieces {
            let piece = xwen_kernels::QMatrix { ty: q.ty, rows: r1 - r0, cols: q.cols, data: &q.data[r0 * rb..r1 * rb] };
            let mut yp = vec![0.0f32; n * (r1 - r0)];
            ctx.mm_into(piece, xs, n, &mut yp);
            for t in 0..n {
                y[(t0 + t) * w.rows + r0..(t0 + t) * w.rows + r1].copy_from_slice(&yp[t * (r1 - r0)..(t + 1) * (r1 - r0)]);
            }
        }
    };
    for s in &rows.spans {
        if s.decode_order {
            for t in s.rows() {
                run(t, 1);
            }
        } else {
            run(s.start, s.len);
        }
    }
}

/// Mixer output for the batch `rows` of normalized input x (rows.n × hidden); `kvs[i]` is span
/// i's sequence's cache, which its K and V rows are appended to.
pub fn forward(ctx: &Ctx, w: &MlaWeights, d: &MlaDims, x: &[f32], rows: &Rows, kvs: &mut [&mut KvCache]) -> Vec<f32> {
    assert_eq!(kvs.len(), rows.spans.len(), "one KV cache per span");
    let n = rows.n;
    let (nh, r, e, nope, dv) = (d.n_head, d.kv_lora, d.rope, d.nope, d.v_head);
    let (qh, kw) = (d.q_head(), d.k_width());
    let sp = ctx.span(Op::AttnProj);
    let mut p = ctx.mm_rows(&[&w.q, &w.kv_a], x, rows).into_iter();
    let (q, mut kv) = (p.next().expect("q"), p.next().expect("kv_a"));
    // c ← rms_norm(c)·kv_a_norm, per token
    for row in kv.chunks_exact_mut(kw) {
        ops::rms_norm_inplace(&mut row[..r], &w.kv_a_norm, d.eps);
    }
    // the absorbed queries: Q_h = [W_k_b,h q_nope_h | q_pe_h], [n × H × (r + e)]
    let mut qa = vec![0.0f32; n * nh * kw];
    {
        let mut nope_h = vec![0.0f32; n * nope];
        let mut abs_h = vec![0.0f32; n * r];
        for h in 0..nh {
            for t in 0..n {
                nope_h[t * nope..(t + 1) * nope].copy_from_slice(&q[(t * nh + h) * qh..][..nope]);
            }
            per_head_mm(ctx, &w.k_b, h, &nope_h, rows, &mut abs_h);
            for t in 0..n {
                let dst = &mut qa[(t * nh + h) * kw..][..kw];
                dst[..r].copy_from_slice(&abs_h[t * r..(t + 1) * r]);
                dst[r..].copy_from_slice(&q[(t * nh + h) * qh + nope..][..e]);
            }
        }
    }
    drop(sp);
    let sp = ctx.span(Op::AttnCore);
    for (s, cache) in rows.spans.iter().zip(kvs.iter_mut()) {
        debug_assert_eq!(cache_len(cache, d), s.pos0, "a sequence's KV holds its positions");
        for t in s.rows() {
            let row = &kv[t * kw..(t + 1) * kw];
            cache.k.extend(row);
            cache.v.extend(&row[..r]);
        }
    }

    // softmax(Q_h Kᵀ · scale) V per (token, head), one task per (sequence, head)
    let scale = 1.0 / (qh as f32).sqrt();
    let mut att = vec![0.0f32; n * nh * r];
    let att_p = SharedMut::new(&mut att);
    let qa = &qa;
    if ctx.attn.flash {
        let caches: Vec<&KvCache> = kvs.iter().map(|c| &**c).collect();
        ctx.pool.run(rows.spans.len() * nh, &|task| {
            let (si, h) = (task / nh, task % nh);
            let (s, c) = (&rows.spans[si], caches[si]);
            let at = HeadAt { k_width: kw, k_off: 0, v_width: r, v_off: 0 };
            let n_kv = flash_attn::n_kv(s.pos0 + s.len, ctx.attn.n_ctx);
            let same = c.k.ty() == c.v.ty() && c.k.ty() != KvType::Q8_0;
            if !s.decode_order && flash_attn::path(s.len, n_kv, same, ctx.attn.threads) == flash_attn::Path::Tiled {
                let qs: Vec<&[f32]> = (0..s.len).map(|i| &qa[((s.start + i) * nh + h) * kw..][..kw]).collect();
                // SAFETY: task (si, h) writes only head h's slice of its own span's rows.
                let mut outs: Vec<&mut [f32]> = (0..s.len).map(|i| unsafe { att_p.slice(((s.start + i) * nh + h) * r, r) }).collect();
                flash_attn::tiled_rows(&qs, c.k.rows(), c.v.rows(), at, s.pos0 + 1, n_kv, scale, &mut outs);
                return;
            }
            for i in 0..s.len {
                let t = s.start + i;
                let (rows_n, kv_n) = if s.decode_order { (1, flash_attn::n_kv(s.pos0 + i + 1, ctx.attn.n_ctx)) } else { (s.len, n_kv) };
                let path = flash_attn::path(rows_n, kv_n, same, ctx.attn.threads);
                // SAFETY: task (si, h) writes only head h's slice of its own span's rows.
                let oh = unsafe { att_p.slice((t * nh + h) * r, r) };
                flash_attn::attend(&qa[(t * nh + h) * kw..][..kw], c.k.rows(), c.v.rows(), at, s.pos0 + i + 1, kv_n, scale, path, oh);
            }
        });
    } else {
        let caches: Vec<(&[f32], &[f32])> = kvs
            .iter()
            .map(|c| match (&c.k, &c.v) {
                (KvBuf::F32(k), KvBuf::F32(v)) => (&k[..], &v[..]),
                _ => (&[][..], &[][..]),
            })
            .collect();
        ctx.pool.run(rows.spans.len() * nh, &|task| {
            let (si, h) = (task / nh, task % nh);
            let (s, (kc, vc)) = (&rows.spans[si], caches[si]);
            let n_ctx = kc.len() / kw;
            let mut scores = vec![0.0f32; n_ctx];
            let mut lanes = vec![0.0f32; 32 * r];
            for i in 0..s.len {
                let t = s.start + i;
                let visible = s.pos0 + i + 1;
                let qt = &qa[(t * nh + h) * kw..][..kw];
                for (p, sc) in scores[..visible].iter_mut().enumerate() {
                    *sc = ops::dot(qt, &kc[p * kw..(p + 1) * kw]) * scale;
                }
                ops::softmax_masked_inplace(&mut scores[..visible], visible.next_multiple_of(256));
                // SAFETY: task (si, h) writes only head h's slice of its own span's rows.
                let oh = unsafe { att_p.slice((t * nh + h) * r, r) };
                let v_at = |p: usize| &vc[p * r..(p + 1) * r];
                crate::layers::attention::weighted_v_sum(&scores[..visible], v_at, s.len == 1 || s.decode_order, &mut lanes, oh);
            }
        });
    }
    drop(sp);
    let _sp = ctx.span(Op::AttnProj);
    // decompress each head: o_h = W_v_b,h · att_h, then W_o
    let mut o = vec![0.0f32; n * nh * dv];
    {
        let mut att_h = vec![0.0f32; n * r];
        let mut o_h = vec![0.0f32; n * dv];
        for h in 0..nh {
            for t in 0..n {
                att_h[t * r..(t + 1) * r].copy_from_slice(&att[(t * nh + h) * r..][..r]);
            }
            per_head_mm(ctx, &w.v_b, h, &att_h, rows, &mut o_h);
            for t in 0..n {
                o[(t * nh + h) * dv..][..dv].copy_from_slice(&o_h[t * dv..(t + 1) * dv]);
            }
        }
    }
    ctx.mm_rows1(&w.o, &o, rows)
}
