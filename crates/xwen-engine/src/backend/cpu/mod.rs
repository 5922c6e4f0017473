//! The CPU backend: a worker pool and the kernels of `xwen-kernels`, in llama.cpp's CPU float
//! orders. Each op's task split lives here — products by row blocks of similar bytes,
//! attention by (sequence, head), the delta rule by (sequence, V-head), experts one per task —
//! so the layers above state only the math.

pub mod attention;
pub mod delta;
pub mod experts;
pub mod flash_attn;
pub mod products;

use crate::backend::{ActFn, AttnHeads, AttnMode, Backend, Buf, DeltaScan, ExpertFfn, MvJob, ScanState, Scratch};
use crate::batch::Rows;
use crate::state::KvCache;
use xwen_kernels::{Pool, QMatrix};

pub struct Cpu {
    pool: Pool,
    scratch: Scratch,
}

impl Cpu {
    pub fn new(pool: Pool) -> Cpu {
        Cpu { pool, scratch: Scratch::new() }
    }
}

impl Backend for Cpu {
    fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    fn matvec(&self, w: QMatrix, x: &[f32], y: &mut [f32]) {
        self.pool.matvec(w, x, y);
    }

    fn matmul(&self, w: QMatrix, x: &[f32], n: usize, y: &mut [f32]) {
        self.pool.matmul(w, x, n, y);
    }

    fn scratch(&self) -> &Scratch {
        &self.scratch
    }

    fn mm_rows(&self, ws: &[QMatrix], x: &[f32], rows: &Rows) -> Vec<Buf<'_>> {
        products::mm_rows(&self.pool, &self.scratch, ws, x, rows)
    }

    fn mv_batch(&self, jobs: &mut [MvJob]) {
        products::mv_batch(&self.pool, jobs);
    }

    fn attend(&self, q: &[f32], caches: &[&KvCache], rows: &Rows, heads: &AttnHeads, mode: &AttnMode, out: &mut [f32]) {
        attention::attend(&self.pool, q, caches, rows, heads, mode, out);
    }

    fn delta_scan(&self, scan: &DeltaScan, states: &mut [ScanState], o: &mut [f32]) {
        delta::scan(&self.pool, scan, states, o);
    }

    fn expert_ffns<'s>(&'s self, jobs: &[ExpertFfn], act: ActFn, ff: usize, ys: &mut [Buf<'s>]) {
        experts::ffns(&self.pool, &self.scratch, jobs, act, ff, ys);
    }

    fn for_row_chunks(&self, n: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        // the per-token element-wise steps around the scan (convolution, norms, gates) are a
        // few percent of a prefill each, serial otherwise
        const ROWS_PER_TASK: usize = 16;
        if n <= ROWS_PER_TASK {
            f(0, n);
            return;
        }
        self.pool.run(n.div_ceil(ROWS_PER_TASK), &|i| f(i * ROWS_PER_TASK, ((i + 1) * ROWS_PER_TASK).min(n)));
    }
}
