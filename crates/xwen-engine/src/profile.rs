//! Per-op wall-time accounting for a forward pass (`EngineConfig::profile`). Categories are
//! fixed so a report from two runs lines up; timing costs two clock reads per op when on and a
//! branch when off.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Embed,
    Norms,
    AttnProj,
    AttnCore,
    DeltaProj,
    DeltaConv,
    DeltaScan,
    DeltaOut,
    FfnDense,
    MoeRouter,
    MoeExperts,
    MoeShared,
    LmHead,
}

pub const OPS: [Op; 13] = [
    Op::Embed,
    Op::Norms,
    Op::AttnProj,
    Op::AttnCore,
    Op::DeltaProj,
    Op::DeltaConv,
    Op::DeltaScan,
    Op::DeltaOut,
    Op::FfnDense,
    Op::MoeRouter,
    Op::MoeExperts,
    Op::MoeShared,
    Op::LmHead,
];

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Embed => "embed",
            Op::Norms => "norms+residual",
            Op::AttnProj => "attn.proj (q,k,v,o)",
            Op::AttnCore => "attn.core (norm,rope,softmax·v)",
            Op::DeltaProj => "deltanet.proj (qkv,z,β,α)",
            Op::DeltaConv => "deltanet.conv+l2norm",
            Op::DeltaScan => "deltanet.scan",
            Op::DeltaOut => "deltanet.gated-norm+out",
            Op::FfnDense => "ffn.dense",
            Op::MoeRouter => "moe.router",
            Op::MoeExperts => "moe.experts",
            Op::MoeShared => "moe.shared",
            Op::LmHead => "output_norm+lm_head",
        }
    }
}

#[derive(Default)]
pub struct Profiler {
    enabled: bool,
    nanos: [AtomicU64; 13],
    calls: [AtomicU64; 13],
}

pub struct Span<'a> {
    p: &'a Profiler,
    op: Op,
    t0: Option<Instant>,
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        if let Some(t0) = self.t0 {
            let i = self.op as usize;
            self.p.nanos[i].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            self.p.calls[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Profiler {
    pub fn new(enabled: bool) -> Self {
        Profiler { enabled, ..Default::default() }
    }

    pub fn span(&self, op: Op) -> Span<'_> {
        Span { p: self, op, t0: self.enabled.then(Instant::now) }
    }

    /// (op name, seconds, calls) for every op that ran, in a fixed order.
    pub fn report(&self) -> Vec<(&'static str, f64, u64)> {
        OPS.iter()
            .map(|&op| {
                let i = op as usize;
                (op.name(), self.nanos[i].load(Ordering::Relaxed) as f64 * 1e-9, self.calls[i].load(Ordering::Relaxed))
            })
            .filter(|r| r.2 > 0)
            .collect()
    }

    pub fn reset(&self) {
        for i in 0..OPS.len() {
            self.nanos[i].store(0, Ordering::Relaxed);
            self.calls[i].store(0, Ordering::Relaxed);
        }
    }
}
