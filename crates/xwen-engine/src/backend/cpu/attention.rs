//! Attention over a batch's spans on the pool, one task per (sequence, query head): llama.cpp's
//! CPU flash-attention path (`flash_attn`) or its plain kq / softmax / kqv path, whose float
//! orders differ — the gated attention of Qwen and Kimi's MLA share both.

use crate::backend::cpu::flash_attn::{self, HeadAt};
use crate::backend::{AttnHeads, AttnMode, BlockAttn};
use crate::batch::Rows;
use crate::config::KvType;
use super::SharedMut;
use crate::ops;
use crate::state::{KvBuf, KvCache};
use xwen_kernels::Pool;

pub fn attend(pool: &Pool, q: &[f32], caches: &[&KvCache], rows: &Rows, a: &AttnHeads, mode: &AttnMode, out: &mut [f32]) {
    debug_assert_eq!(caches.len(), rows.spans.len(), "one KV cache per span");
    let (nh, kd, vd) = (a.n_head, a.k_dim, a.v_dim);
    let group = nh / a.n_head_kv.max(1);
    // where query head h's KV head sits in the cache rows
    let at = |h: usize| {
        let kvh = h / group;
        HeadAt { k_width: a.k_row, k_off: kvh * kd, v_width: a.v_row, v_off: kvh * vd }
    };
    let q_of = |t: usize, h: usize| &q[(t * nh + h) * kd..][..kd];
    let out_p = SharedMut::new(out);
    if mode.flash {
        // Rows off the tiled path run the query heads of a KV head together (each K and V row
        // read once for them), `per` heads to a task: the most that still leaves a task per
        // thread.
        let per = (1..=group).rev().find(|&g| group.is_multiple_of(g) && rows.spans.len() * (nh / g) >= mode.threads.max(1)).unwrap_or(1);
        pool.run(rows.spans.len() * nh, &|task| {
            let (si, h) = (task / nh, task % nh);
            let (s, kv) = (&rows.spans[si], caches[si]);
            // llama.cpp's KV view after this ubatch, and the path its rows take; a row in
            // decode order runs as the one-row ubatch it stands for
            let n_kv = flash_attn::n_kv(s.pos0 + s.len, mode.n_ctx);
            // ggml's tiled and split-KV paths take an f32 or f16 cache of one type
            let same = kv.k.ty() == kv.v.ty() && kv.k.ty() != KvType::Q8_0;
            if !s.decode_order && flash_attn::path(s.len, n_kv, same, mode.threads) == flash_attn::Path::Tiled {
                // all the span's rows of this head at once: each KV tile is widened once
                let qs: Vec<&[f32]> = (0..s.len).map(|i| q_of(s.start + i, h)).collect();
                // SAFETY: task (si, h) writes only head h's slice of its own span's rows.
                let mut outs: Vec<&mut [f32]> = (0..s.len).map(|i| unsafe { out_p.slice(((s.start + i) * nh + h) * vd, vd) }).collect();
                flash_attn::tiled_rows(&qs, kv.k.rows(), kv.v.rows(), at(h), s.pos0 + 1, n_kv, a.scale, None, &mut outs);
                return;
            }
            // this task's heads h..h + per (the first of them), sharing one KV head
            if h % per != 0 {
                return;
            }
            // each row's n_kv and path: a row in decode order runs as the one-row ubatch it
            // stands for, the rows of a prefill chunk as theirs
            let row_path = |i: usize| {
                let (rows_n, kv_n) = if s.decode_order { (1, flash_attn::n_kv(s.pos0 + i + 1, mode.n_ctx)) } else { (s.len, n_kv) };
                (flash_attn::path(rows_n, kv_n, same, mode.threads), kv_n)
            };
            // runs of rows on the same path and n_kv go together, each cached row read once
            // for all their heads (every row's bits are its own: `attend_rows`)
            let mut i0 = 0;
            while i0 < s.len {
                let (path, kv_n) = row_path(i0);
                let i1 = (i0 + 1..s.len).find(|&i| row_path(i) != (path, kv_n)).unwrap_or(s.len);
                let cells = || (i0..i1).flat_map(|i| (h..h + per).map(move |hh| (s.start + i, i, hh)));
                let qs: Vec<&[f32]> = cells().map(|(t, _, hh)| q_of(t, hh)).collect();
                let visible: Vec<usize> = cells().map(|(_, i, _)| s.pos0 + i + 1).collect();
                // SAFETY: task (si, h) writes only heads h..h + per of its own span's rows.
                let mut outs: Vec<&mut [f32]> = cells().map(|(t, _, hh)| unsafe { out_p.slice((t * nh + hh) * vd, vd) }).collect();
                flash_attn::attend_rows(&qs, &visible, kv.k.rows(), kv.v.rows(), at(h), kv_n, a.scale, path, &mut outs);
                i0 = i1;
            }
        });
        return;
    }
    // the plain path runs on an f32 cache (`Model` refuses another with flash attention off)
    let f32_rows = f32_caches(caches);
    pool.run(rows.spans.len() * nh, &|task| {
        let (si, h) = (task / nh, task % nh);
        let (s, (kc, vc)) = (&rows.spans[si], f32_rows[si]);
        let hat = at(h);
        let n_ctx = kc.len() / a.k_row.max(1);
        let mut scores = vec![0.0f32; n_ctx];
        let mut lanes = vec![0.0f32; 64 * vd];
        // kq = k·q: with one query head the permuted q of 2+ rows is contiguous, so ggml
        // hands it to tinyBLAS (n_kv, padded to 256, always fits its row rule); with more
        // heads q is a strided view and every score is a vec_dot
        let one_row = s.len == 1 || s.decode_order;
        let kq_dot = if nh == 1 && !one_row { xwen_kernels::f32ops::dot_tinyblas } else { ops::dot };
        for i in 0..s.len {
            let t = s.start + i;
            let visible = s.pos0 + i + 1;
            let qh = q_of(t, h);
            for (p, sc) in scores[..visible].iter_mut().enumerate() {
                *sc = kq_dot(qh, &kc[p * hat.k_width + hat.k_off..][..kd]) * a.scale;
            }
            // llama.cpp's kq row is n_kv long, the KV size padded to 256, masked past `visible`.
            ops::softmax_masked_inplace(&mut scores[..visible], visible.next_multiple_of(256));
            // SAFETY: task (si, h) writes only head h's slice of its own span's rows.
            let oh = unsafe { out_p.slice((t * nh + h) * vd, vd) };
            let v_at = |p: usize| &vc[p * hat.v_width + hat.v_off..][..vd];
            weighted_v_sum(&scores[..visible], v_at, one_row, &mut lanes, oh);
        }
    });
}

/// `Backend::attend_block` on the pool, a task per query head: ggml's non-flash attention bit
/// for bit — kq rows as long as the keys padded to 256 with masked cells −inf, the softmax's
/// reduction shaped by that length, kqv as the transposed-V product (`weighted_v_sum`, in the
/// one-token order for a block of one row).
pub fn attend_block(pool: &Pool, q: &[f32], k: &[f32], v: &[f32], b: &BlockAttn, out: &mut [f32]) {
    let (nh, hd) = (b.n_head, b.head_dim);
    let (hq, kvw) = (nh * hd, b.n_head_kv * hd);
    let n = q.len() / hq.max(1);
    let n_keys = b.pos0 + n;
    debug_assert!(k.len() >= n_keys * kvw && v.len() >= n_keys * kvw && out.len() >= n * hq);
    let group = nh / b.n_head_kv.max(1);
    let out_p = SharedMut::new(out);
    pool.run(nh, &|hh| {
        let kvh = hh / group;
        let mut s = vec![0.0f32; n_keys];
        let mut lanes = vec![0.0f32; 64 * hd];
        for t in 0..n {
            let qp = b.pos0 + t;
            let qv = &q[t * hq + hh * hd..][..hd];
            for (j, sj) in s.iter_mut().enumerate() {
                *sj = if b.visible(qp, j) { ops::dot(qv, &k[j * kvw + kvh * hd..][..hd]) * b.scale } else { f32::NEG_INFINITY };
            }
            ops::softmax_masked_inplace(&mut s, n_keys.next_multiple_of(256));
            // SAFETY: task hh writes only head hh's slice of each row.
            let o = unsafe { out_p.slice(t * hq + hh * hd, hd) };
            weighted_v_sum(&s, |j| &v[j * kvw + kvh * hd..][..hd], n == 1, &mut lanes, o);
        }
    });
}

/// Each span's K and V rows of an f32 cache (empty for another type, which the plain path is
/// never given).
fn f32_caches<'c>(caches: &[&'c KvCache]) -> Vec<(&'c [f32], &'c [f32])> {
    caches
        .iter()
        .map(|kv| match (&kv.k, &kv.v) {
            (KvBuf::F32(k), KvBuf::F32(v)) => (&k[..], &v[..]),
            _ => (&[][..], &[][..]),
        })
        .collect()
}

/// `attend` with a selection mask: batch row t sees the positions p of its causal range with
/// `sel[t][p]`; the others are −inf in the mask (llama.cpp adds QSA's 0 / −inf selection to the
/// causal mask). On the plain path they take no weight and add exact zeros to kqv's lanes; on
/// the flash path each row runs the path ggml picks for its ubatch over its unmasked cells.
pub fn attend_selected(pool: &Pool, q: &[f32], caches: &[&KvCache], rows: &Rows, a: &AttnHeads, mode: &AttnMode, sel: &[Vec<bool>], out: &mut [f32]) {
    debug_assert_eq!(caches.len(), rows.spans.len(), "one KV cache per span");
    let (nh, kd, vd) = (a.n_head, a.k_dim, a.v_dim);
    let group = nh / a.n_head_kv.max(1);
    let q_of = |t: usize, h: usize| &q[(t * nh + h) * kd..][..kd];
    let out_p = SharedMut::new(out);
    if mode.flash {
        pool.run(rows.spans.len() * nh, &|task| {
            let (si, h) = (task / nh, task % nh);
            let (s, kv) = (&rows.spans[si], caches[si]);
            let kvh = h / group;
            let at = HeadAt { k_width: a.k_row, k_off: kvh * kd, v_width: a.v_row, v_off: kvh * vd };
            let same = kv.k.ty() == kv.v.ty() && kv.k.ty() != KvType::Q8_0;
            for i in 0..s.len {
                let t = s.start + i;
                let visible = s.pos0 + i + 1;
                // a row in decode order runs as the one-row ubatch it stands for
                let (rows_n, used) = if s.decode_order { (1, visible) } else { (s.len, s.pos0 + s.len) };
                let kv_n = flash_attn::n_kv(used, mode.n_ctx);
                let path = flash_attn::path(rows_n, kv_n, same, mode.threads);
                let keep: Vec<bool> = (0..visible).map(|p| sel[t].get(p).copied().unwrap_or(false)).collect();
                // SAFETY: task (si, h) writes only head h's slice of its own span's rows.
                let oh = unsafe { out_p.slice((t * nh + h) * vd, vd) };
                flash_attn::attend_masked(q_of(t, h), kv.k.rows(), kv.v.rows(), at, &keep, kv_n, a.scale, path, oh);
            }
        });
        return;
    }
    let f32_rows = f32_caches(caches);
    pool.run(rows.spans.len() * nh, &|task| {
        let (si, h) = (task / nh, task % nh);
        let (s, (kc, vc)) = (&rows.spans[si], f32_rows[si]);
        let kvh = h / group;
        let n_ctx = kc.len() / a.k_row.max(1);
        let mut scores = vec![0.0f32; n_ctx];
        let mut lanes = vec![0.0f32; 64 * vd];
        let one_row = s.len == 1 || s.decode_order;
        let kq_dot = if nh == 1 && !one_row { xwen_kernels::f32ops::dot_tinyblas } else { ops::dot };
        for i in 0..s.len {
            let t = s.start + i;
            let visible = s.pos0 + i + 1;
            let qh = q_of(t, h);
            let keep = &sel[t];
            for (p, sc) in scores[..visible].iter_mut().enumerate() {
                *sc = if keep.get(p).copied().unwrap_or(false) {
                    kq_dot(qh, &kc[p * a.k_row + kvh * kd..][..kd]) * a.scale
                } else {
                    f32::NEG_INFINITY
                };
            }
            ops::softmax_masked_inplace(&mut scores[..visible], visible.next_multiple_of(256));
            // SAFETY: task (si, h) writes only head h's slice of its own span's rows.
            let oh = unsafe { out_p.slice((t * nh + h) * vd, vd) };
            let v_at = |p: usize| &vc[p * a.v_row + kvh * vd..][..vd];
            weighted_v_sum(&scores[..visible], v_at, one_row, &mut lanes, oh);
        }
    });
}

/// out = Σ_p a[p] · v(p), in the rounding of llama.cpp's CPU kqv = mul_mat(vᵀ, kq), whose
/// reduction runs over the KV positions separately for every output element, with the lane
/// width L of the build reproduced (`f32ops::tinyblas_lanes`: 8 for AVX2, 16 for AVX-512):
/// - batches of 2+ tokens go through llamafile's tinyBLAS (sgemm.cpp gemm_bloc): L lane
///   accumulators, position p into lane p % L by FMA, then its hsum (AVX2: (l_i + l_{i+4})
///   pairs, then movehl, then movehdup; AVX-512: GCC's `_mm512_reduce_add_ps` tree);
/// - a single token (tinyBLAS refuses n < 2) goes through ggml_vec_dot_f32: 4 × L lane
///   accumulators over steps of 4L positions, then GGML_F32x8_REDUCE / GGML_F32x16_REDUCE.
///
/// Positions past `a.len()` are masked to 0 there and add nothing (llama.cpp's kq row is padded
/// to 256, a multiple of 4L). `lanes` is scratch of 64 × out.len(). Each lane is an FMA chain
/// vectorized across the head dimension.
pub(crate) fn weighted_v_sum<'a>(a: &[f32], v: impl Fn(usize) -> &'a [f32], single: bool, lanes: &mut [f32], out: &mut [f32]) {
    let hd = out.len();
    let width = xwen_kernels::f32ops::tinyblas_lanes();
    let n_lanes = if single { 4 * width } else { width };
    let lanes = &mut lanes[..n_lanes * hd];
    lanes.fill(0.0);
    for (p, &w) in a.iter().enumerate() {
        ops::axpy(w, v(p), &mut lanes[(p % n_lanes) * hd..][..hd]);
    }
    let l = |i: usize, d: usize| lanes[i * hd + d];
    for (d, o) in out.iter_mut().enumerate() {
        *o = if width == 16 {
            // one 16-wide register x: the chain (tinyBLAS) or the reduced accumulators
            // (acc_j holds positions 16j..16j+16 of every 64): (x0 + x2) + (x1 + x3)
            let x: [f32; 16] = if single {
                std::array::from_fn(|k| (l(k, d) + l(32 + k, d)) + (l(16 + k, d) + l(48 + k, d)))
            } else {
                std::array::from_fn(|k| l(k, d))
            };
            // GCC's _mm512_reduce_add_ps: 256-bit halves, 128-bit halves, then 0+2 / 1+3
            let t3: [f32; 8] = std::array::from_fn(|i| x[i + 8] + x[i]);
            let t6: [f32; 4] = std::array::from_fn(|i| t3[i + 4] + t3[i]);
            (t6[0] + t6[2]) + (t6[1] + t6[3])
        } else {
            // one 8-wide register x: lane k of x is l(k, d) (tinyBLAS) or the reduced accumulator
            let x: [f32; 8] = if single {
                // x[j] (accumulator j holds positions 8j..8j+8 of every 32): x0+x2, x1+x3, then sum
                std::array::from_fn(|k| (l(k, d) + l(16 + k, d)) + (l(8 + k, d) + l(24 + k, d)))
            } else {
                std::array::from_fn(|k| l(k, d))
            };
            let h: [f32; 4] = std::array::from_fn(|i| x[i] + x[i + 4]);
            if single {
                // _mm_hadd_ps twice: (h0 + h1) + (h2 + h3)
                (h[0] + h[1]) + (h[2] + h[3])
            } else {
                // movehl then movehdup: (h0 + h2) + (h1 + h3)
                (h[0] + h[2]) + (h[1] + h[3])
            }
        };
    }
}
