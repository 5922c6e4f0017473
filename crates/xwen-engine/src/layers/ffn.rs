//! Dense gated feed-forward: down(act(gate·x, up·x)). Used by the dense layers and, with its own
//! tensors, as the MoE shared expert. The activation is SwiGLU (Qwen, Kimi-Linear) or Kimi K3's
//! situ (`Act`).

use crate::backend::Buf;
use crate::batch::Rows;
use crate::compute::Ctx;
use crate::error::Result;
use crate::weights::{Loader, Mat};

/// The gated activation of an FFN or expert: act(g, u) elementwise over a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    /// silu(g)·u (`ggml_swiglu_split`).
    SwiGlu,
    /// Kimi K3's situ (llama.cpp `kimi_k3_situ`, `LLM_FFN_SITU`):
    /// β·tanh(g/β)·sigmoid(g) · λ·tanh(u/λ), the up branch left as is when λ ≤ 0.
    Situ { beta: f32, linear_beta: f32 },
}

pub struct FfnWeights {
    pub gate: Mat, // [ff × hidden]
    pub up: Mat,   // [ff × hidden]
    pub down: Mat, // [hidden × ff]
    pub act: Act,
}

impl FfnWeights {
    /// `suffix` is "" for the dense FFN and "_shexp" for the MoE shared expert.
    pub fn load(ld: &Loader, il: usize, hidden: usize, ff: usize, suffix: &str) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.ffn_{s}{suffix}.weight");
        Ok(FfnWeights {
            gate: ld.mat(&p("gate"), ff, hidden)?,
            up: ld.mat(&p("up"), ff, hidden)?,
            down: ld.mat(&p("down"), hidden, ff)?,
            act: Act::SwiGlu,
        })
    }

    pub fn with_act(self, act: Act) -> Self {
        FfnWeights { act, ..self }
    }
}

/// The FFN of the batch `rows` of normalized input x (rows.n × hidden).
pub fn forward<'a>(ctx: &Ctx<'a>, w: &FfnWeights, x: &[f32], rows: &Rows) -> Buf<'a> {
    let mut p = ctx.mm_rows(&[&w.gate, &w.up], x, rows).into_iter();
    let h = act_rows_buf(ctx, w.act, &p.next().unwrap(), &p.next().unwrap(), w.gate.rows);
    ctx.mm_rows1(&w.down, &h, rows)
}

/// [`act_rows`] into a buffer of the backend's arena.
pub fn act_rows_buf<'a>(ctx: &Ctx<'a>, act: Act, g: &[f32], u: &[f32], row: usize) -> Buf<'a> {
    let mut y = ctx.zeros(g.len());
    act_rows_into(act, g, u, row, &mut y);
    y
}

/// `act` over consecutive rows of `row` elements (one per token).
pub fn act_rows(act: Act, g: &[f32], u: &[f32], row: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; g.len()];
    act_rows_into(act, g, u, row, &mut y);
    y
}

/// [`act_rows`] into `y` (g's length).
pub fn act_rows_into(act: Act, g: &[f32], u: &[f32], row: usize, y: &mut [f32]) {
    match act {
        Act::SwiGlu => swiglu_rows_into(g, u, row, y),
        Act::Situ { beta, linear_beta } => situ_into(g, u, beta, linear_beta, y),
    }
}

/// situ elementwise into `y`, in the order of llama.cpp's ggml ops, each rounded to f32:
/// a = tanh(g·(1/β))·β; a = a·sigmoid(g); u' = tanh(u·(1/λ))·λ (λ > 0); y = a·u'. ggml's tanh
/// and sigmoid are libm's tanhf and 1/(1+expf(−x)) per element (unary-ops.cpp), no vector path,
/// so the row length does not enter.
pub fn situ_into(g: &[f32], u: &[f32], beta: f32, linear_beta: f32, y: &mut [f32]) {
    assert!(g.len() == u.len() && y.len() == g.len());
    let inv_beta = 1.0f32 / beta;
    let inv_lb = 1.0f32 / linear_beta;
    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
        let a = (g * inv_beta).tanh() * beta;
        let a = a * crate::ops::sigmoid(g);
        let up = if linear_beta > 0.0 { (u * inv_lb).tanh() * linear_beta } else { u };
        *y = a * up;
    }
}

/// silu(g)·u into `y` over consecutive rows of `row` elements (one per token), each row as
/// llama.cpp's `ggml_swiglu_split(gate, up)` runs it (ggml's vector expf on full chunks, libm on
/// the tail: rows back to back give the same bits only chunked per row).
pub fn swiglu_rows_into(g: &[f32], u: &[f32], row: usize, y: &mut [f32]) {
    assert!(row > 0 && g.len().is_multiple_of(row) && u.len() == g.len() && y.len() == g.len());
    for ((gr, ur), yr) in g.chunks_exact(row).zip(u.chunks_exact(row)).zip(y.chunks_exact_mut(row)) {
        xwen_kernels::f32ops::swiglu(gr, ur, yr);
    }
}
