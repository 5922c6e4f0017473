//! Dense SwiGLU feed-forward: down(silu(gate·x) ⊙ up·x). Used by qwen35 layers and, with its
//! own tensors, as the MoE shared expert.

use crate::compute::Ctx;
use crate::error::Result;
use crate::ops;
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

pub fn forward(ctx: &Ctx, w: &FfnWeights, x: &[f32], n: usize) -> Vec<f32> {
    let mut p = ctx.mm_many(&[&w.gate, &w.up], x, n).into_iter();
    let h = swiglu(&p.next().unwrap(), &p.next().unwrap());
    ctx.mm(&w.down, &h, n)
}

pub fn swiglu(g: &[f32], u: &[f32]) -> Vec<f32> {
    g.iter().zip(u).map(|(&a, &b)| ops::silu(a) * b).collect()
}
