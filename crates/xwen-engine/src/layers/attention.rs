//! Gated full attention of Qwen3.5/3.6 (llama.cpp `qwen35.cpp::build_layer_attn`):
//! attn_q is double width, per head [q_h | gate_h]; RMSNorm on q and k heads; partial NeoX rope
//! over n_rot dims (IMROPE for text: NeoX but for the pairs no section claims); softmax(q·kᵀ/√d)
//! with causal mask and grouped KV heads; the output is multiplied by sigmoid(gate) before
//! attn_output.

use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::error::Result;
use crate::ops;
use crate::profile::Op;
use crate::weights::{Loader, Mat};
use crate::config::KvType;
use crate::state::kv::KvCache;
use crate::backend::{AttnHeads, Buf, Rope};

#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    /// Interleaved M-RoPE sections (t, h, w, e) where the architecture's rope is IMROPE; text
    /// positions are [p, p, p, 0], so only pairs whose sector no t/h/w section claims differ
    /// from NeoX (`ops::imrope_text_still`).
    pub rope_sections: Option<[u32; 4]>,
    pub eps: f32,
}

impl AttnDims {
    pub fn kv_width(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

pub struct AttnWeights {
    pub q: Mat, // [2·n_head·head_dim × hidden], per head [q | gate]
    pub k: Mat,
    pub v: Mat,
    pub o: Mat, // [hidden × n_head·head_dim]
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

impl AttnWeights {
    pub fn load(ld: &Loader, il: usize, hidden: usize, d: &AttnDims) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let hq = d.n_head * d.head_dim;
        Ok(AttnWeights {
            q: ld.mat(&p("attn_q.weight"), 2 * hq, hidden)?,
            k: ld.mat(&p("attn_k.weight"), d.kv_width(), hidden)?,
            v: ld.mat(&p("attn_v.weight"), d.kv_width(), hidden)?,
            o: ld.mat(&p("attn_output.weight"), hidden, hq)?,
            q_norm: ld.vec(&p("attn_q_norm.weight"), d.head_dim)?,
            k_norm: ld.vec(&p("attn_k_norm.weight"), d.head_dim)?,
        })
    }
}

/// Mixer output for the batch `rows` of normalized input x (rows.n × hidden); `kvs[i]` is the
/// KV cache of span i's sequence, which the span's keys and values are appended to. `il`
/// names the layer's taps.
pub fn forward<'a>(ctx: &Ctx<'a>, w: &AttnWeights, d: &AttnDims, x: &[f32], rows: &Rows, kvs: &mut [&mut KvCache], il: usize) -> Buf<'a> {
    assert_eq!(kvs.len(), rows.spans.len(), "one KV cache per span");
    let n = rows.n;
    let hd = d.head_dim;
    let hq = d.n_head * hd;
    let sp = ctx.span(Op::AttnProj);
    // qg [n × 2hq] (per head [q | gate]), k and v [n × kvw]
    let mut p = ctx.mm_rows(&[&w.q, &w.k, &w.v], x, rows).into_iter();
    let (qg, mut k, mut v) = (p.next().unwrap(), p.next().unwrap(), p.next().unwrap());
    drop(sp);
    let sp = ctx.span(Op::AttnCore);

    // Split q and gate (per head [q | gate]: n·n_head rows of 2·hd), normalize and rotate q
    // and k, each row at its own sequence's position.
    let mut q = ctx.zeros(n * hq);
    let mut gate = ctx.zeros(n * hq);
    ctx.backend.split_columns(&qg, n * d.n_head, &mut [&mut q, &mut gate]);
    norm_rope(ctx, d, &mut [(&mut q, &w.q_norm), (&mut k, &w.k_norm)], rows);
    let rot_v = append_kv(ctx, d, rows, kvs, Some(&mut q), &mut k, &mut v);

    // softmax(q kᵀ / √d) v per (row, head), each span against its own cache
    let kvw = d.kv_width();
    let heads = AttnHeads { n_head: d.n_head, n_head_kv: d.n_head_kv, k_dim: hd, v_dim: hd, k_row: kvw, v_row: kvw, scale: 1.0 / (hd as f32).sqrt() };
    let mut out = ctx.zeros(n * hq);
    let caches: Vec<&KvCache> = kvs.iter().map(|kv| &**kv).collect();
    ctx.backend.attend(&q, &caches, rows, &heads, &ctx.attn, &mut out);
    if let Some(r) = rot_v {
        ctx.backend.hadamard(&mut out, r);
    }
    ctx.tap("attn_pregate", Some(il), &out, hq);
    ctx.backend.mul_sigmoid(&mut out, &gate);
    // llama.cpp's name for attn_output's input
    ctx.tap("attn_gated", Some(il), &out, hq);
    drop(sp);
    let _sp = ctx.span(Op::AttnProj);
    ctx.mm_rows1(&w.o, &out, rows)
}

/// Only the keys and values of the batch `rows` (normalized input x), appended to `kvs` as
/// `forward` appends them — the same bits — without the queries, the attention or the output
/// projection: for rows whose output nobody reads (an MTP head catching up on kept rows).
pub fn write_kv(ctx: &Ctx, w: &AttnWeights, d: &AttnDims, x: &[f32], rows: &Rows, kvs: &mut [&mut KvCache]) {
    assert_eq!(kvs.len(), rows.spans.len(), "one KV cache per span");
    let sp = ctx.span(Op::AttnProj);
    let mut p = ctx.mm_rows(&[&w.k, &w.v], x, rows).into_iter();
    let (mut k, mut v) = (p.next().unwrap(), p.next().unwrap());
    drop(sp);
    let _sp = ctx.span(Op::AttnCore);
    norm_rope(ctx, d, &mut [(&mut k, &w.k_norm)], rows);
    append_kv(ctx, d, rows, kvs, None, &mut k, &mut v);
}

/// Each (heads, norm) of `heads` RMS-normed per head and rotated, each row at its own
/// sequence's position (NeoX rope, or interleaved M-RoPE's text positions where the layer has
/// rope sections).
pub(crate) fn norm_rope(ctx: &Ctx, d: &AttnDims, heads: &mut [(&mut [f32], &[f32])], rows: &Rows) {
    let still = d.rope_sections.map(|s| ops::imrope_text_still(s, d.n_rot));
    let rope = Rope { n_rot: d.n_rot, base: d.rope_base, still: still.as_deref() };
    ctx.backend.norm_rope_heads(heads, d.eps, &rope, &rows.positions());
}

/// Appends each span's keys and values to its sequence's cache. A quantized cache is written
/// and read in a rotated basis (llama.cpp's attention rotation): q and k rotated alike keep
/// their dot products, v's rotation is undone on the output — returned, for the caller to
/// undo. Every sequence of a batch shares the model's cache types.
pub(crate) fn append_kv(ctx: &Ctx, d: &AttnDims, rows: &Rows, kvs: &mut [&mut KvCache], q: Option<&mut [f32]>, k: &mut [f32], v: &mut [f32]) -> Option<usize> {
    let (hd, kvw) = (d.head_dim, d.kv_width());
    let (k_ty, v_ty) = kvs.first().map_or((KvType::F32, KvType::F32), |kv| (kv.k.ty(), kv.v.ty()));
    let (rot_k, rot_v) = (rotation_k(k_ty, hd), rotation_v(v_ty, hd));
    if let Some(r) = rot_k {
        if let Some(q) = q {
            ctx.backend.hadamard(q, r);
        }
        ctx.backend.hadamard(k, r);
    }
    if let Some(r) = rot_v {
        ctx.backend.hadamard(v, r);
    }
    for (s, kv) in rows.spans.iter().zip(kvs.iter_mut()) {
        debug_assert_eq!(kv.len(kvw), s.pos0, "a sequence's KV holds its positions");
        debug_assert_eq!((kv.k.ty(), kv.v.ty()), (k_ty, v_ty), "the batch's caches share their types");
        kv.append(&k[s.start * kvw..(s.start + s.len) * kvw], &v[s.start * kvw..(s.start + s.len) * kvw], kvw, kvw);
    }
    rot_v
}

/// The size of the Hadamard rotation llama.cpp applies to q and k for a K cache of `ty`
/// (llama-kv-cache.cpp, "attn_rot_k"): quantized caches of heads a multiple of 64 wide rotate
/// in blocks of 64, doubled while the head width allows; None for f32 / f16, or where the
/// environment sets llama.cpp's `LLAMA_ATTN_ROT_DISABLE`.
pub fn rotation_k(ty: KvType, head_dim: usize) -> Option<usize> {
    if !ty.is_quantized() || !head_dim.is_multiple_of(64) || rotation_disabled() {
        return None;
    }
    let mut n = 64;
    while head_dim.is_multiple_of(2 * n) {
        n *= 2;
    }
    Some(n)
}

/// The rotation of v (and of the attention output) for a V cache of `ty`: blocks of 64
/// ("using smaller rotation matrices for V seems beneficial", llama.cpp PR 21038).
pub fn rotation_v(ty: KvType, head_dim: usize) -> Option<usize> {
    (ty.is_quantized() && head_dim.is_multiple_of(64) && !rotation_disabled()).then_some(64)
}

/// llama.cpp reads `LLAMA_ATTN_ROT_DISABLE` once per cache; read here once per process.
fn rotation_disabled() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISABLED.get_or_init(|| std::env::var("LLAMA_ATTN_ROT_DISABLE").ok().and_then(|v| v.trim().parse::<i64>().ok()).is_some_and(|v| v != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's rule: quantized caches only, heads a multiple of 64, K blocks as wide as the
    /// head allows (powers of two), V blocks of 64.
    #[test]
    fn the_rotation_follows_the_cache_type_and_head_width() {
        assert_eq!(rotation_k(KvType::F16, 128), None);
        assert_eq!(rotation_k(KvType::F32, 256), None);
        assert_eq!(rotation_k(KvType::Q8_0, 64), Some(64));
        assert_eq!(rotation_k(KvType::Q8_0, 128), Some(128));
        assert_eq!(rotation_k(KvType::Q8_0, 256), Some(256));
        assert_eq!(rotation_k(KvType::Q8_0, 192), Some(64));
        assert_eq!(rotation_k(KvType::Q8_0, 96), None);
        assert_eq!(rotation_v(KvType::Q8_0, 256), Some(64));
        assert_eq!(rotation_v(KvType::F16, 256), None);
    }
}
