//! Hyper-connections (qwen4exp; DeepSeek-V4's design with a low-rank mixer): the residual
//! stream is hc parallel copies, [rows × hc × n]; no layer norm exists. Before a block its
//! *mixer* reads the streams (llama.cpp b11434 `qwen4exp.cpp::build_hc_mix`):
//!   xn     = rms_norm(x_s)·γ_s per stream s          (γ: [hc × n], the converter's 1 + w)
//!   gate   = up(silu(down(xn) / hc))                  (down: hc·n → rank, up: rank → hc·n)
//!   input  = mean_s(xn_s ⊙ sigmoid(gate_s))           the block's n-wide input
//!   inject = inject(xn)                               (hc per row; none for the final mixer)
//! and after it the *combine* adds the block's output o to every stream, weighted:
//!   x_s += 2·sigmoid(inject_s / hc) · o              (build_hc_combine)
//! The layers' mixers and combines run as llama.cpp's fused ops (`ggml_dsv4_hc_pre_gated`,
//! `ggml_dsv4_hc_post`); the trunk's final mixer, the output norm, as its plain ops (sigmoid,
//! mul, the streams added in order, scaled) — the two sum in different orders. The MTP head's
//! final mixer has no injection but is a layer's (llama.cpp builds it with the head's layer
//! index), so it collapses with the fused op.

use crate::backend::Buf;
use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::error::Result;
use crate::weights::{Loader, Mat};

pub struct HcMixer {
    /// [hc × n] gammas, multiply-ready.
    pub norm: Vec<f32>,
    pub down: Mat,
    pub up: Mat,
    /// None for a final mixer (the output norm).
    pub inject: Option<Mat>,
    /// Collapse the streams with the fused op (a layer's mixer, the MTP head's final one), not
    /// with the plain ops (the trunk's output norm).
    pub fused: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct HcDims {
    pub hc: usize,
    pub rank: usize,
    pub n: usize,
    pub eps: f32,
}

impl HcMixer {
    /// `prefix` names the module: `blk.N.hc_attn`, `blk.N.hc_ffn` or `output_hc`.
    pub fn load(ld: &Loader, prefix: &str, d: &HcDims, inject: bool) -> Result<Self> {
        let w = d.hc * d.n;
        Ok(HcMixer {
            norm: ld.vec(&format!("{prefix}_norm.weight"), w)?,
            down: ld.mat(&format!("{prefix}_down.weight"), d.rank, w)?,
            up: ld.mat(&format!("{prefix}_up.weight"), w, d.rank)?,
            inject: if inject { Some(ld.mat(&format!("{prefix}_inject.weight"), d.hc, w)?) } else { None },
            fused: inject,
        })
    }
}

/// The mixer over the streams x (rows.n × hc × n): the block's input (rows.n × n) and, for a
/// layer's mixer, its scatter weights 2·sigmoid(inject / hc) (rows.n × hc).
pub fn mix<'a>(ctx: &Ctx<'a>, m: &HcMixer, d: &HcDims, x: &[f32], rows: &Rows) -> (Buf<'a>, Option<Buf<'a>>) {
    let (hc, n) = (d.hc, d.n);
    let be = ctx.backend;
    let mut xn = ctx.zeros(rows.n * hc * n);
    be.rms_norm_streams(x, &m.norm, n, d.eps, &mut xn);
    let mut lo = ctx.mm_rows1(&m.down, &xn, rows);
    be.scale(&mut lo, 1.0 / hc as f32);
    be.silu_rows(&mut lo, d.rank);
    let gate = ctx.mm_rows1(&m.up, &lo, rows);
    let mut input = ctx.zeros(rows.n * n);
    let weights = m.inject.as_ref().map(|inj| {
        let mut w = ctx.mm_rows1(inj, &xn, rows);
        be.scale(&mut w, 1.0 / hc as f32);
        be.sigmoid(&mut w);
        be.scale(&mut w, 2.0);
        w
    });
    if m.fused {
        be.hc_pre(&xn, &gate, hc, n, 1.0 / hc as f32, &mut input);
    } else {
        // the output norm: plain ops, the streams summed in order, then scaled
        be.mul_sigmoid(&mut xn, &gate);
        for t in 0..rows.n {
            let row = &mut input[t * n..(t + 1) * n];
            row.copy_from_slice(&xn[t * hc * n..][..n]);
            for s in 1..hc {
                be.add(row, &xn[(t * hc + s) * n..][..n]);
            }
        }
        be.scale(&mut input, 1.0 / hc as f32);
    }
    (input, weights)
}

/// The combine: every stream of x (rows × hc × n) adds the block's output o (rows × n) times
/// its row's weight.
pub fn combine(ctx: &Ctx, d: &HcDims, x: &mut [f32], o: &[f32], weights: &[f32]) {
    ctx.backend.hc_post(x, o, weights, d.hc);
}
