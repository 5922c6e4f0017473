//! QSA, qwen4exp's sparse gated attention (llama.cpp b11434 `qwen4exp.cpp::build_qsa_sel`,
//! `build_attn_qsa`, and the k-pool inputs of `llama-memory-hybrid-idx.cpp`): Qwen3.5's gated
//! attention (`layers/attention.rs`), each query attending only to a selection of cells:
//!   - an indexer keeps a raw key per position, k_raw = W_k x (one head of d_i, no norm, no
//!     rope: its own cache, in the K cache's type);
//!   - positions form blocks of r (the compress ratio) in sequence order; a complete block's
//!     pooled key is ((k_0 + k_1) + …)/r, RMS-normed and rotated to the block's first position;
//!   - a query at position p with indexer heads q_h = rope(norm(W_q x)_h) scores each block it
//!     can see ((p + 1)/r complete ones) Σ_h max(q_h·k_b, 0)/√d_i (an FMA chain over the heads);
//!     the rest score −inf, among min(n_pool, budget/r) picks (n_pool the padded block count,
//!     at least 64) made by ggml_top_k — libstdc++'s heap selection, whose choice among equal
//!     scores is reproduced here;
//!   - it attends to the picked blocks that it can see, plus the (p + 1) mod r newest
//!     positions (the incomplete tail), within its causal range.
//!
//! A query that sees no more than budget/r blocks attends to every position (dense).

use crate::backend::AttnHeads;
use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::error::{EngineError, Result};
use crate::layers::attention::{self, AttnDims, AttnWeights};
use crate::state::{KvBuf, KvCache};
use crate::weights::{Loader, Mat};

#[derive(Clone, Copy, Debug)]
pub struct QsaDims {
    pub n_head: usize,
    pub head_dim: usize,
    pub budget: usize,
    pub ratio: usize,
}

pub struct QsaWeights {
    pub attn: AttnWeights,
    pub q: Mat,
    pub k: Mat,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

impl QsaWeights {
    pub fn load(ld: &Loader, il: usize, hidden: usize, a: &AttnDims, d: &QsaDims) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.{s}");
        Ok(QsaWeights {
            attn: AttnWeights::load(ld, il, hidden, a)?,
            q: ld.mat(&p("indexer.q_proj.weight"), d.n_head * d.head_dim, hidden)?,
            k: ld.mat(&p("indexer.k_proj.weight"), d.head_dim, hidden)?,
            q_norm: ld.vec(&p("indexer.q_norm.weight"), d.head_dim)?,
            k_norm: ld.vec(&p("indexer.k_norm.weight"), d.head_dim)?,
        })
    }
}

/// Row `p` of an indexer cache, as f32 (ggml_get_rows of the cache's type).
fn raw_key(kv: &KvCache, p: usize, dim: usize, out: &mut [f32]) -> Result<()> {
    match &kv.k {
        KvBuf::F32(v) => out.copy_from_slice(&v[p * dim..(p + 1) * dim]),
        KvBuf::F16(v) => {
            for (o, &h) in out.iter_mut().zip(&v[p * dim..(p + 1) * dim]) {
                *o = xwen_kernels::half::f16_to_f32(h);
            }
        }
        KvBuf::Q8_0(v) => {
            let rb = dim / 32 * 34;
            xwen_kernels::dequantize(xwen_kernels::GgmlType::Q8_0, &v[p * rb..(p + 1) * rb], out).map_err(|e| EngineError::State(format!("QSA indexer cache: {e}")))?;
        }
    }
    Ok(())
}

/// A pooled key as it comes back from llama.cpp's indexer cache: its row is [raw | pooled] in
/// the K cache's type, so the pooled key is stored (rounded to f16, quantized to Q8_0) after
/// its norm and rotation and read back before it is scored.
fn through_cache(kv: &KvCache, key: &mut [f32]) -> Result<()> {
    let mut row = KvBuf::empty(kv.k.ty());
    row.extend(key);
    match &row {
        KvBuf::F32(_) => {}
        KvBuf::F16(v) => {
            for (o, &h) in key.iter_mut().zip(v) {
                *o = xwen_kernels::half::f16_to_f32(h);
            }
        }
        KvBuf::Q8_0(v) => xwen_kernels::dequantize(xwen_kernels::GgmlType::Q8_0, v, key).map_err(|e| EngineError::State(format!("QSA indexer cache: {e}")))?,
    }
    Ok(())
}

/// The first `k` indices of 0..scores.len() by descending score as libstdc++'s
/// `std::partial_sort` leaves them (its heap selection; ggml_top_k's CPU body).
pub fn top_k_libstdcxx(scores: &[f32], k: usize) -> Vec<usize> {
    let mut a: Vec<usize> = (0..scores.len()).collect();
    if k == 0 {
        return Vec::new();
    }
    // comp(x, y) = scores[x] > scores[y]: a max-heap under comp keeps the smallest on top
    let comp = |x: usize, y: usize| scores[x] > scores[y];
    fn adjust(a: &mut [usize], mut hole: usize, len: usize, value: usize, comp: &dyn Fn(usize, usize) -> bool) {
        let top = hole;
        let mut second = hole;
        while len > 0 && second < (len - 1) / 2 {
            second = 2 * (second + 1);
            if comp(a[second], a[second - 1]) {
                second -= 1;
            }
            a[hole] = a[second];
            hole = second;
        }
        if len & 1 == 0 && len >= 2 && second == (len - 2) / 2 {
            second = 2 * (second + 1);
            a[hole] = a[second - 1];
            hole = second - 1;
        }
        // push_heap
        let mut parent = if hole > 0 { (hole - 1) / 2 } else { 0 };
        while hole > top && comp(a[parent], value) {
            a[hole] = a[parent];
            hole = parent;
            parent = if hole > 0 { (hole - 1) / 2 } else { 0 };
        }
        a[hole] = value;
    }
    let len = k;
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let v = a[parent];
            adjust(&mut a, parent, len, v, &comp);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    for i in k..a.len() {
        if comp(a[i], a[0]) {
            // pop_heap(first, middle, i): *i takes the top, the old *i sifts in from the root
            let v = a[i];
            a[i] = a[0];
            adjust(&mut a, 0, len, v, &comp);
        }
    }
    a.truncate(k);
    a
}

/// The gated attention with QSA's selection over the batch `rows` of the mixer input x;
/// `kvs[i]` and `idx[i]` are span i's KV and indexer caches, both appended to.
#[allow(clippy::too_many_arguments)]
pub fn forward<'a>(ctx: &Ctx<'a>, w: &QsaWeights, a: &AttnDims, d: &QsaDims, x: &[f32], rows: &Rows, kvs: &mut [&mut KvCache], idx: &mut [&mut KvCache], il: usize) -> Result<crate::backend::Buf<'a>> {
    let n = rows.n;
    let (di, r) = (d.head_dim, d.ratio);
    let be = ctx.backend;
    // a q8_0 cache holds [raw | pooled] rows in blocks of 32: an indexer head of another width
    // would share blocks between the two keys
    if !di.is_multiple_of(32) && idx.iter().any(|c| c.k.ty() == crate::config::KvType::Q8_0) {
        return Err(EngineError::State(format!("QSA's indexer keys of {di} in a q8_0 cache: the width must be a multiple of 32")));
    }
    let mut p = ctx.mm_rows(&[&w.k, &w.q], x, rows).into_iter();
    let (k_raw, mut q_idx) = (p.next().unwrap(), p.next().unwrap());
    for (s, c) in rows.spans.iter().zip(idx.iter_mut()) {
        c.append(&k_raw[s.start * di..(s.start + s.len) * di], &[], di, 0);
    }
    // the indexer's queries, normed and rotated like q (its dims: d_i-wide heads)
    let ia = AttnDims { head_dim: di, ..*a };
    attention::norm_rope(ctx, &ia, &mut [(&mut q_idx, &w.q_norm)], rows);

    // which cached positions every row attends to
    let mut sel: Vec<Vec<bool>> = Vec::with_capacity(n);
    let mut dense = true;
    let scale = 1.0f32 / (di as f32).sqrt();
    for (s, c) in rows.spans.iter().zip(idx.iter()) {
        let end = s.pos0 + s.len;
        let n_blocks = end / r;
        // every complete block's pooled key, normed and rotated to its first position
        let mut pooled = vec![0.0f32; n_blocks * di];
        let mut row = vec![0.0f32; di];
        for b in 0..n_blocks {
            let pk = &mut pooled[b * di..(b + 1) * di];
            for m in 0..r {
                raw_key(c, b * r + m, di, &mut row)?;
                if m == 0 {
                    pk.copy_from_slice(&row);
                } else {
                    be.add(pk, &row);
                }
            }
            be.scale(pk, 1.0 / r as f32);
        }
        if n_blocks > 0 {
            let positions: Vec<usize> = (0..n_blocks).map(|b| b * r).collect();
            let rope_a = AttnDims { head_dim: di, ..*a };
            let mut heads = [(&mut pooled[..], &w.k_norm[..])];
            // a pooled key turns at M-RoPE position [p, p, p, p] (the cell's 2-D ext is the text
            // position, section e the block's first position): no pair stays still, unlike
            // a text q / k at [p, p, p, 0]
            let rope = crate::backend::Rope { n_rot: rope_a.n_rot, base: rope_a.rope_base, still: None };
            be.norm_rope_heads(&mut heads, a.eps, &rope, &positions);
            for pk in pooled.chunks_exact_mut(di) {
                through_cache(c, pk)?;
            }
        }
        // llama.cpp's pool count: the complete blocks padded past one spare to a multiple of 64
        let n_pool = 64usize.max((n_blocks + 1).next_multiple_of(64));
        let n_top = n_pool.min(d.budget / r);
        for i in 0..s.len {
            let t = s.start + i;
            let pos = s.pos0 + i;
            let n_vis = (pos + 1) / r;
            let mut keep = vec![false; pos + 1];
            if n_vis <= n_top {
                keep.fill(true);
            } else {
                dense = false;
                let mut scores = vec![f32::NEG_INFINITY; n_pool];
                for (b, sc) in scores[..n_vis].iter_mut().enumerate() {
                    let mut acc = 0.0f32;
                    for h in 0..d.n_head {
                        let qk = crate::ops::dot(&q_idx[(t * d.n_head + h) * di..][..di], &pooled[b * di..(b + 1) * di]);
                        let relu = if qk > 0.0 { qk } else { 0.0 };
                        acc = relu.mul_add(scale, acc);
                    }
                    *sc = acc + 0.0;
                }
                for b in top_k_libstdcxx(&scores, n_top) {
                    if b < n_vis {
                        keep[b * r..(b + 1) * r].fill(true);
                    }
                }
                let n_tail = (pos + 1) % r;
                for k in 0..n_tail {
                    keep[pos - k] = true;
                }
            }
            sel.push(keep);
        }
    }
    ctx.tap("indexer_q", Some(il), &q_idx, d.n_head * di);

    // q / k / v as the gated attention computes them
    let hd = a.head_dim;
    let hq = a.n_head * hd;
    let mut pr = ctx.mm_rows(&[&w.attn.q, &w.attn.k, &w.attn.v], x, rows).into_iter();
    let (qg, mut k, mut v) = (pr.next().unwrap(), pr.next().unwrap(), pr.next().unwrap());
    let mut q = ctx.zeros(n * hq);
    let mut gate = ctx.zeros(n * hq);
    be.split_columns(&qg, n * a.n_head, &mut [&mut q, &mut gate]);
    attention::norm_rope(ctx, a, &mut [(&mut q, &w.attn.q_norm), (&mut k, &w.attn.k_norm)], rows);
    let rot_v = attention::append_kv(ctx, a, rows, kvs, Some(&mut q), &mut k, &mut v);
    let kvw = a.kv_width();
    let heads = AttnHeads { n_head: a.n_head, n_head_kv: a.n_head_kv, k_dim: hd, v_dim: hd, k_row: kvw, v_row: kvw, scale: 1.0 / (hd as f32).sqrt() };
    let mut out = ctx.zeros(n * hq);
    let caches: Vec<&KvCache> = kvs.iter().map(|kv| &**kv).collect();
    if dense {
        be.attend(&q, &caches, rows, &heads, &ctx.attn, &mut out);
    } else {
        be.attend_selected(&q, &caches, rows, &heads, &ctx.attn, &sel, &mut out);
    }
    if let Some(rv) = rot_v {
        be.hadamard(&mut out, rv);
    }
    ctx.tap("attn_pregate", Some(il), &out, hq);
    be.mul_sigmoid(&mut out, &gate);
    Ok(ctx.mm_rows1(&w.attn.o, &out, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The selection std::partial_sort makes: the k largest; an element only enters the heap
    /// when strictly greater than its top, so with all scores equal the first k stay. (Which
    /// of several equal scores at the boundary stay in general is the heap's business: the
    /// qwen4exp parity fixture holds it — chat24 position 21 picks among equal block scores,
    /// and a stable sort there differs from llama.cpp by rel-L2 1.4e-2.)
    #[test]
    fn top_k_keeps_the_largest() {
        let s = [0.5f32, 3.0, 1.0, 2.0, f32::NEG_INFINITY, 4.0];
        let mut t = top_k_libstdcxx(&s, 3);
        t.sort();
        assert_eq!(t, vec![1, 3, 5]);
        let s = [1.0f32; 6];
        let mut t = top_k_libstdcxx(&s, 2);
        t.sort();
        assert_eq!(t, vec![0, 1]);
        let s = [0.0f32, 0.0, 5.0, 0.0, 7.0, 0.0, 0.0];
        let mut t = top_k_libstdcxx(&s, 3);
        t.sort();
        assert!(t.contains(&2) && t.contains(&4) && t.len() == 3);
    }
}
