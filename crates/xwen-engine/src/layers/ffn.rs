//! Dense gated feed-forward: down(act(gate·x, up·x)). Used by the dense layers and, with its own
//! tensors, as the MoE shared expert. The activation is SwiGLU (Qwen, Kimi-Linear) or Kimi K3's
//! situ (`Act`).

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
pub fn forward(ctx: &Ctx, w: &FfnWeights, x: &[f32], rows: &Rows) -> Vec<f32> {
    let mut p = ctx.mm_rows(&[&w.gate, &w.up], x, rows).into_iter();
    let h = act_rows(w.act, &p.next().unwrap(), &p.next().unwrap(), w.gate.rows);
    ctx.mm_rows1(&w.down, &h, rows)
}

/// `act` over consecutive rows of `row` elements (one per token).
pub fn act_rows(act: Act, g: &[f32], u: &[f32], row: usize) -> Vec<f32> {
    match act {
        Act::SwiGlu => swiglu_rows(g, u, row),
        Act::Situ { beta, linear_beta } => situ(g, u, beta, linear_beta),
    }
}

/// situ elementwise, in the order of llama.cpp's ggml ops, each rounded to f32:
/// a = tanh(g·(1/β))·β; a = a·sigmoid(g); u' = tanh(u·(1/λ))·λ (λ > 0); y = a·u'. ggml's tanh
/// and sigmoid are libm's tanhf and 1/(1+expf(−x)) per element (unary-ops.cpp), no vector path,
/// so the row length does not enter.
pub fn situ(g: &[f32], u: &[f32], beta: f32, linear_beta: f32) -> Vec<f32> {
    assert_eq!(g.len(), u.len());
    let inv_beta = 1.0f32 / beta;
    let inv_lb = 1.0f32 / linear_beta;
    g.iter()
        .zip(u)
        .map(|(&g, &u)| {
            let a = (g * inv_beta).tanh() * beta;
            let a = a * crate::ops::sigmoid(g);
            let up = if linear_beta > 0.0 { (u * inv_lb).tanh() * linear_beta } else { u };
            a * up
        })
        .collect()
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
