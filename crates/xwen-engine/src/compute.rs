//! The compute context a forward pass runs in: the worker pool and the mapped file the weights
//! live in. Matrix products go through here so every block uses the same dispatch rule
//! (one token: matrix × vector; several: batched matrix × matrix, activations quantized once).

use crate::ops::SharedMut;
use crate::profile::{Op, Profiler, Span};
use crate::weights::Mat;
use xwen_gguf::{GgmlType, GgufFile};
use xwen_kernels::{Pool, QMatrix};

pub struct Ctx<'a> {
    pub pool: &'a Pool,
    pub file: &'a GgufFile,
    pub prof: &'a Profiler,
    /// Use the chunked DeltaNet form for multi-token prefill.
    pub chunked_scan: bool,
}

/// One matrix × vector product of a batch: y = W·x.
pub struct MvJob<'b> {
    pub w: QMatrix<'b>,
    pub x: &'b [f32],
    pub y: &'b mut [f32],
}

impl<'a> Ctx<'a> {
    pub fn span(&self, op: Op) -> Span<'_> {
        self.prof.span(op)
    }

    /// y = x · Wᵀ for `n` rows of x (each `w.cols` long); returns n × w.rows.
    pub fn mm(&self, w: &Mat, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; n * w.rows];
        self.mm_into(w.q(self.file), x, n, &mut y);
        y
    }

    /// Products of several matrices with the same input rows (q/k/v, gate/up): one parallel
    /// job for a single token, batched matmuls otherwise.
    pub fn mm_many(&self, ws: &[&Mat], x: &[f32], n: usize) -> Vec<Vec<f32>> {
        let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0f32; n * w.rows]).collect();
        if n == 1 {
            let mut jobs: Vec<MvJob> =
                ws.iter().zip(ys.iter_mut()).map(|(w, y)| MvJob { w: w.q(self.file), x, y }).collect();
            self.mv_batch(&mut jobs);
        } else {
            for (w, y) in ws.iter().zip(ys.iter_mut()) {
                self.mm_into(w.q(self.file), x, n, y);
            }
        }
        ys
    }

    pub fn mm_into(&self, w: QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
        debug_assert_eq!(x.len(), n * w.cols);
        debug_assert_eq!(y.len(), n * w.rows);
        if n == 1 {
            self.pool.matvec(w, x, y);
        } else {
            self.pool.matmul(w, x, n, y);
        }
    }

    /// Several independent matrix × vector products in ONE parallel job. Decode issues a few
    /// hundred small products per token; batching the ones that are ready together (q/k/v, the
    /// routed experts of a layer) divides the dispatch count and lets threads balance across
    /// matrices. Activations are quantized once per distinct (input, activation format).
    pub fn mv_batch(&self, jobs: &mut [MvJob]) {
        let mut acts: Vec<(usize, GgmlType, Vec<u8>)> = Vec::new();
        let mut act_of = Vec::with_capacity(jobs.len());
        for j in jobs.iter() {
            debug_assert_eq!(j.x.len(), j.w.cols);
            debug_assert_eq!(j.y.len(), j.w.rows);
            let vd = xwen_kernels::vec_dot_type(j.w.ty);
            let key = (j.x.as_ptr() as usize, vd);
            let idx = match acts.iter().position(|a| (a.0, a.1) == key) {
                Some(i) => i,
                None => {
                    let mut buf = Vec::new();
                    xwen_kernels::quantize_activations(j.w.ty, j.x, &mut buf);
                    acts.push((key.0, key.1, buf));
                    acts.len() - 1
                }
            };
            act_of.push(idx);
        }
        // Split rows into tasks of similar byte size, several per thread for balance.
        let total: usize = jobs.iter().map(|j| j.w.data.len()).sum();
        let target = (total / (self.pool.n_threads() * 6)).max(32 << 10);
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
        let dots: Vec<_> = mats
            .iter()
            .map(|w| xwen_kernels::dispatch::row_kernel(w.ty, w.rows).expect("weight type validated at load"))
            .collect();
        let outs: Vec<SharedMut<f32>> = jobs.iter_mut().map(|j| SharedMut::new(j.y)).collect();
        self.pool.run(tasks.len(), &|ti| {
            let (ji, r0, r1) = tasks[ti];
            let w = &mats[ji];
            let act = &acts[act_of[ji]].2;
            // SAFETY: rows r0..r1 of job ji belong to this task alone.
            let y = unsafe { outs[ji].slice(r0, r1 - r0) };
            xwen_kernels::dot_rows(w, dots[ji], act, r0, y);
        });
    }
}
