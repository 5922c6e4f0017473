//! The compute context a forward pass runs in: the worker pool and the mapped file the weights
//! live in. Matrix products go through here so every block uses the same dispatch rule
//! (one token: matrix × vector; several: batched matrix × matrix, activations quantized once).

use crate::profile::{Op, Profiler, Span};
use crate::weights::Mat;
use xwen_gguf::GgufFile;
use xwen_kernels::{Pool, QMatrix};

pub struct Ctx<'a> {
    pub pool: &'a Pool,
    pub file: &'a GgufFile,
    pub prof: &'a Profiler,
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

    pub fn mm_into(&self, w: QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
        debug_assert_eq!(x.len(), n * w.cols);
        debug_assert_eq!(y.len(), n * w.rows);
        if n == 1 {
            self.pool.matvec(w, x, y);
        } else {
            self.pool.matmul(w, x, n, y);
        }
    }
}
