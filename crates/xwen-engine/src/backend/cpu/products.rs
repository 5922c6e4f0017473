//! Matrix products on the pool: one token as matrix × vector, several as a batched matmul with
//! the activations quantized once, and a batch's decode rows in the token-lane kernels where
//! they keep the one-token order (the integer sums are exact; each row keeps its own float
//! epilogue) — what makes the batched forward batch-invariant.

use crate::backend::{Buf, MvJob, Scratch};
use crate::batch::{self, Rows};
use super::SharedMut;
use xwen_gguf::GgmlType;
use xwen_kernels::{Pool, QMatrix};

/// Products of several matrices with the same input rows (q/k/v, gate/up): one parallel job
/// for a single token, batched matmuls otherwise.
fn mm_many<'s>(pool: &Pool, scratch: &'s Scratch, ws: &[QMatrix], x: &[f32], n: usize) -> Vec<Buf<'s>> {
    let mut ys: Vec<Buf> = ws.iter().map(|w| scratch.zeros(n * w.rows)).collect();
    if n == 1 {
        let mut jobs: Vec<MvJob> = ws.iter().zip(ys.iter_mut()).map(|(w, y)| MvJob { w: *w, x, y }).collect();
        mv_batch(pool, &mut jobs);
    } else {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            mm_into(pool, *w, x, n, y);
        }
    }
    ys
}

fn mm_into(pool: &Pool, w: QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
    debug_assert_eq!(x.len(), n * w.cols);
    debug_assert_eq!(y.len(), n * w.rows);
    if n == 1 {
        pool.matvec(w, x, y);
    } else {
        pool.matmul(w, x, n, y);
    }
}

/// `mm_many` over a batch of several sequences (`Rows`), batch-invariantly: the decode rows
/// of all sequences share one pass over each matrix, every row in the one-token order (the
/// bits `mm_many` gives it alone), and each longer span takes the product of its own row
/// count, as if it ran alone. One sequence: exactly `mm_many`.
pub fn mm_rows<'s>(pool: &Pool, scratch: &'s Scratch, ws: &[QMatrix], x: &[f32], rows: &Rows) -> Vec<Buf<'s>> {
    if rows.is_single() {
        return mm_many(pool, scratch, ws, x, rows.n);
    }
    let cols = ws.first().map_or(0, |w| w.cols);
    debug_assert!(ws.iter().all(|w| w.cols == cols));
    let mut ys: Vec<Buf> = ws.iter().map(|w| scratch.zeros(rows.n * w.rows)).collect();
    let dec = rows.decode_rows();
    if dec.len() == rows.n {
        // every row is a decode row (ascending, so in place): no gather, no scatter
        decode_products(pool, ws, x, cols, &mut ys);
    } else if !dec.is_empty() {
        let xd = batch::gather(x, cols, &dec);
        let mut yd: Vec<Buf> = ws.iter().map(|w| scratch.zeros(dec.len() * w.rows)).collect();
        decode_products(pool, ws, &xd, cols, &mut yd);
        for ((w, y), src) in ws.iter().zip(ys.iter_mut()).zip(&yd) {
            batch::scatter(src, w.rows, &dec, y);
        }
    }
    for s in rows.multi_row_spans() {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            let r = s.rows();
            mm_into(pool, *w, &x[r.start * cols..r.end * cols], s.len, &mut y[r.start * w.rows..r.end * w.rows]);
        }
    }
    ys
}

/// The products of decode rows `xd` (each `cols` wide) with every matrix, each row in the
/// one-token order: matrices whose token-lane kernels keep that order run on them (8 rows in
/// the vector lanes); the rest share one job of per-row kernels.
fn decode_products(pool: &Pool, ws: &[QMatrix], xd: &[f32], cols: usize, yd: &mut [Buf]) {
    let nd = xd.len() / cols.max(1);
    let lanes = |w: &QMatrix| xwen_kernels::tokens_on_lanes(w.ty, w.rows, nd);
    let mut jobs = Vec::new();
    // the rows quantized once per activation format (q/k/v, gate/up share theirs)
    let mut quantized: Vec<(GgmlType, Vec<u8>)> = Vec::new();
    for (w, y) in ws.iter().zip(yd.iter_mut()) {
        if lanes(w) {
            let vd = xwen_kernels::vec_dot_type(w.ty);
            let i = match quantized.iter().position(|(t, _)| *t == vd) {
                Some(i) => i,
                None => {
                    let mut xq = Vec::new();
                    quantize_rows(w.ty, xd.chunks_exact(cols), &mut xq);
                    quantized.push((vd, xq));
                    quantized.len() - 1
                }
            };
            pool.matvec_tokens_q(*w, &quantized[i].1, nd, y);
        } else {
            jobs.push(MvJob { w: *w, x: xd, y });
        }
    }
    mv_batch(pool, &mut jobs);
}

/// Several independent matrix × vector products in ONE parallel job. Decode issues a few
/// hundred small products per token; batching the ones that are ready together (q/k/v, the
/// routed experts of a layer) divides the dispatch count and lets threads balance across
/// matrices. Activations are quantized once per distinct (input, activation format).
pub fn mv_batch(pool: &Pool, jobs: &mut [MvJob]) {
    // (input address, its length, activation format) → its quantized rows, back to back
    let mut acts: Vec<(usize, usize, GgmlType, Vec<u8>)> = Vec::new();
    let mut act_of = Vec::with_capacity(jobs.len());
    for j in jobs.iter() {
        let n_tok = j.n_tok();
        debug_assert_eq!(j.x.len(), n_tok * j.w.cols);
        debug_assert_eq!(j.y.len(), n_tok * j.w.rows);
        let vd = xwen_kernels::vec_dot_type(j.w.ty);
        let key = (j.x.as_ptr() as usize, j.x.len(), vd);
        let idx = match acts.iter().position(|a| (a.0, a.1, a.2) == key) {
            Some(i) => i,
            None => {
                // every row with the one-token quantizer (matvec's), never the 4-row one
                let mut buf = Vec::new();
                quantize_rows(j.w.ty, j.x.chunks_exact(j.w.cols), &mut buf);
                acts.push((key.0, key.1, key.2, buf));
                acts.len() - 1
            }
        };
        act_of.push(idx);
    }
    // Split rows into tasks of similar byte size, several per thread for balance.
    let total: usize = jobs.iter().map(|j| j.w.data.len()).sum();
    let target = (total / (pool.n_threads() * 6)).max(32 << 10);
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for (ji, j) in jobs.iter().enumerate() {
        let rb = j.w.row_bytes().max(1);
        let chunk = (target / rb).clamp(1, j.w.rows.max(1));
        let mut r = 0;
        while r < j.w.rows {
            tasks.push((ji, r, (r + chunk).min(j.w.rows)));
            r += chunk;
        }
    }
    let mats: Vec<QMatrix> = jobs.iter().map(|j| j.w).collect();
    let n_toks: Vec<usize> = jobs.iter().map(|j| j.n_tok()).collect();
    let kernels: Vec<_> = mats
        .iter()
        .map(|w| xwen_kernels::dispatch::row_kernel(w.ty, w.rows).expect("weight type validated at load"))
        .collect();
    let outs: Vec<SharedMut<f32>> = jobs.iter_mut().map(|j| SharedMut::new(j.y)).collect();
    pool.run(tasks.len(), &|ti| {
        let (ji, r0, r1) = tasks[ti];
        let w = &mats[ji];
        let act = &acts[act_of[ji]].3;
        let n_tok = n_toks[ji];
        if n_tok == 1 {
            // SAFETY: rows r0..r1 of job ji belong to this task alone.
            let y = unsafe { outs[ji].slice(r0, r1 - r0) };
            xwen_kernels::dot_rows(w, kernels[ji], act, r0, y);
            return;
        }
        // several decode rows: one read of each weight row for all of them, then each
        // token's results to its own row of y (token-major)
        let mut tile = xwen_kernels::scratch::take_f32((r1 - r0) * n_tok);
        xwen_kernels::dot_rows_tokens(w, kernels[ji], act, n_tok, r0, &mut tile);
        for t in 0..n_tok {
            // SAFETY: rows r0..r1 of every token of job ji belong to this task alone.
            let y = unsafe { outs[ji].slice(t * w.rows + r0, r1 - r0) };
            for (i, yi) in y.iter_mut().enumerate() {
                *yi = tile[i * n_tok + t];
            }
        }
        xwen_kernels::scratch::give_f32(tile);
    });
}

/// Rows quantized one by one with the row (matvec) quantizer for a `ty` matrix — MUL_MAT_ID's
/// activations and every decode row's — appended into `out` (cleared first).
pub fn quantize_rows<'a>(ty: GgmlType, rows: impl Iterator<Item = &'a [f32]>, out: &mut Vec<u8>) {
    out.clear();
    let mut row = Vec::new();
    for r in rows {
        xwen_kernels::quantize_activations(ty, r, &mut row);
        out.extend_from_slice(&row);
    }
}
