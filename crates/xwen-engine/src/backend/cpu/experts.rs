//! Routed experts' FFNs on the pool, one expert per task on one thread (gate, up, the
//! activation, down): an expert has ~16 tokens at pp512, too little work to split its products
//! across threads — per-matrix parallel jobs left the second core spinning through every
//! expert's serial quantize/interleave steps (docs/bench.md "Prefill: one task per routed expert"). Every token's
//! activations take MUL_MAT_ID's row quantizer, as llama.cpp's.

use crate::backend::cpu::products::quantize_rows;
use crate::backend::cpu::elementwise::glu_serial;
use crate::backend::{Act, Buf, ExpertFfn, Scratch};
use super::SharedMut;
use xwen_kernels::{Pool, QMatrix};

thread_local! {
    /// A pool of one (no worker threads: it runs tasks on the calling thread) for products done
    /// inside another pool's task.
    static SOLO: Pool = Pool::new(1);
}

pub fn ffns<'s>(pool: &Pool, scratch: &'s Scratch, jobs: &[ExpertFfn], act: Act, ff: usize, ys: &mut [Buf<'s>]) {
    debug_assert_eq!(jobs.len(), ys.len());
    let ys_out = SharedMut::new(ys);
    pool.run(jobs.len(), &|i| {
        let y = ffn(scratch, &jobs[i], act, ff);
        // SAFETY: slot i of `ys` is written by this task alone; `ys` outlives the job.
        unsafe { ys_out.slice(i, 1)[0] = y };
    });
}

/// One expert, whole, on this thread; its buffers from the arena (which any thread may use).
fn ffn<'s>(scratch: &'s Scratch, j: &ExpertFfn, act: Act, ff: usize) -> Buf<'s> {
    SOLO.with(|solo| {
        let (m, ew) = (j.tokens.len(), j.width);
        let row = |t: usize| &j.x[t * ew..(t + 1) * ew];
        let (gw, uw) = (j.gate, j.up);
        let mut g = scratch.zeros(m * ff);
        let mut u = scratch.zeros(m * ff);
        let mut xq = Vec::new();
        if m > 1 && gw.ty == uw.ty && gw.rows == uw.rows {
            // gate and up take the same rows: quantized and laid out once for both
            quantize_rows(gw.ty, j.tokens.iter().map(|&t| row(t)), &mut xq);
            solo.matmul_q_id_shared(&[gw, uw], &xq, m, &mut [&mut g, &mut u]);
        } else {
            let xt: Vec<f32> = j.tokens.iter().flat_map(|&t| row(t)).copied().collect();
            expert_mm(solo, gw, &xt, m, &mut g, &mut xq);
            expert_mm(solo, uw, &xt, m, &mut u, &mut xq);
        }
        let mut h = scratch.zeros(m * ff);
        glu_serial(act, &g, &u, ff, &mut h);
        let mut y = scratch.zeros(m * j.down.rows);
        expert_mm(solo, j.down, &h, m, &mut y, &mut xq);
        y
    })
}

/// An expert's product over its m routed tokens. llama.cpp's MUL_MAT_ID quantizes every
/// token with the row quantizer (no 4-row repack grouping), so do the same and hand the
/// pre-quantized rows to the batched kernel.
fn expert_mm(pool: &Pool, w: QMatrix, x: &[f32], m: usize, y: &mut [f32], xq: &mut Vec<u8>) {
    if m == 1 {
        pool.matvec(w, x, y);
        return;
    }
    quantize_rows(w.ty, x.chunks_exact(w.cols), xq);
    pool.matmul_q_id(w, xq, m, y);
}
