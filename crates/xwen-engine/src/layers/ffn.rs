//! Dense gated feed-forward: down(act(gate·x, up·x)). Used by the dense layers and, with its own
//! tensors, as the MoE shared expert. The activation is SwiGLU (Qwen, Kimi-Linear) or Kimi K3's
//! situ (`Act`).

pub use crate::backend::Act;
use crate::backend::Buf;
use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::error::Result;
use crate::weights::{Loader, Mat};

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

/// act(g, u) over rows of `row` values (one per token), into a buffer of the backend's arena.
pub fn act_rows_buf<'a>(ctx: &Ctx<'a>, act: Act, g: &[f32], u: &[f32], row: usize) -> Buf<'a> {
    let mut y = ctx.zeros(g.len());
    ctx.backend.glu(act, g, u, row, &mut y);
    y
}
