//! Dense SwiGLU feed-forward: down(silu(gate·x) ⊙ up·x). Used by qwen35 layers and, with its
//! own tensors, as the MoE shared expert.

use crate::batch::Rows;
use crate::compute::Ctx;
use crate::error::Result;
use crate::weights::{Loader, Mat};

pub struct FfnWeights {
    pub gate: Mat, // [ff × hidden]
    pub up: Mat,   // [ff × hidden]
    pub down: Mat, // [hidden × ff]
}

impl FfnWeights {
    /// `suffix` is "" for the dense FFN and "_shexp" for the MoE shared expert.
    pub fn load(ld: &Loader, il: usize, hidden: usize, ff: usize, suffix: &str) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.ffn_{s}{suffix}.weight");
        Ok(FfnWeights {
            gate: ld.mat(&p("gate"), ff, hidden)?,
            up: ld.mat(&p("up"), ff, hidden)?,
            down: ld.mat(&p("down"), hidden, ff)?,
        })
    }
}

/// The FFN of the batch `rows` of normalized input x (rows.n × hidden).
pub fn forward(ctx: &Ctx, w: &FfnWeights, x: &[f32], rows: &Rows) -> Vec<f32> {
    let mut p = ctx.mm_rows(&[&w.gate, &w.up], x, rows).into_iter();
    let h = swiglu_rows(&p.next().unwrap(), &p.next().unwrap(), w.gate.rows);
    ctx.mm_rows1(&w.down, &h, rows)
}

/// silu(g)·u over ONE row, as llama.cpp's `ggml_swiglu_split(gate, up)` (ggml's vector expf on
/// full chunks, libm on the tail). Several rows back to back give the same bits only when the
/// row width is a multiple of 16; otherwise use [`swiglu_rows`].
pub fn swiglu(g: &[f32], u: &[f32]) -> Vec<f32> {
    let mut y = vec![0.0f32; g.len()];
    xwen_kernels::f32ops::swiglu(g, u, &mut y);
    y
}

/// [`swiglu`] over consecutive rows of `row` elements (one per token), chunked per row as ggml.
pub fn swiglu_rows(g: &[f32], u: &[f32], row: usize) -> Vec<f32> {
    assert!(row > 0 && g.len().is_multiple_of(row) && u.len() == g.len());
    let mut y = vec![0.0f32; g.len()];
    for ((gr, ur), yr) in g.chunks_exact(row).zip(u.chunks_exact(row)).zip(y.chunks_exact_mut(row)) {
        xwen_kernels::f32ops::swiglu(gr, ur, yr);
    }
    y
}
