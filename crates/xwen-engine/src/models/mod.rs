//! The architecture seam. One file per architecture, each reading like the math (config from
//! metadata beside the weights, a forward over a batch); the registry below is the only place
//! that names them. `Model`, the memory plan and `xwen inspect` reach a network through
//! [`Network`] and [`load`], never through an architecture's own types, so adding qwen3next or
//! kimi-linear is one model file plus one `REGISTRY` line, its shared blocks (attention, the
//! delta rule, MoE) reused.

pub mod dflash;
pub mod hybrid;
pub mod kimi_k3;
pub mod kimi_linear;
pub mod mtp;
pub mod qwen35;
pub mod qwen3next;
pub mod qwen4exp;
pub mod qwen4exp_mtp;

use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::error::{EngineError, Result};
use crate::experts::store::ExpertStore;
pub use crate::memory_plan::PlanFigures;
use crate::state::SeqState;
use crate::weights::Mat;
use std::ops::Range;
use xwen_gguf::GgufFile;

/// A loaded network: its trunk's weights (views into the mapped file) and its forward.
pub trait Network: Send + Sync {
    /// llama.cpp's architecture name, as `general.architecture` says it.
    fn arch(&self) -> &str;
    fn n_vocab(&self) -> usize;
    /// The width of the final hidden (the rows `SpanIn::hidden` returns).
    fn hidden(&self) -> usize;
    /// A fresh sequence state (position 0) of this network's layers.
    fn new_state(&self) -> SeqState;
    /// One batched step: sequence i's `spans[i].tokens` at its own position in `states[i]`;
    /// returns per sequence the logits of its rows `spans[i].logits`. Batch-invariant
    /// (`crate::batch`).
    fn forward(&self, ctx: &Ctx, store: &dyn ExpertStore, states: &mut [&mut SeqState], spans: &[SpanIn]) -> Result<Vec<SpanOut>>;
    /// One sequence's prompt in `chunks` (consecutive runs of its tokens), every chunk through
    /// a layer before any goes on to the next, so a streamed MoE layer reads each expert once
    /// for all of them; each chunk's logits the bits feeding them one by one gives. None where
    /// the architecture cannot (the caller feeds the chunks one by one).
    fn forward_wave(&self, ctx: &Ctx, store: &dyn ExpertStore, state: &mut SeqState, chunks: &[SpanIn]) -> Result<Option<Vec<SpanOut>>>;
    /// Memory-plan figures at `max_ctx` positions per sequence, KV caches of `kv_types`.
    fn plan_figures(&self, max_ctx: usize, kv_types: (crate::config::KvType, crate::config::KvType)) -> PlanFigures;
    /// The lookup tables whose rows a budgeted model reads from disk on demand instead of
    /// keeping them resident (qwen4exp's PLE n-gram table), each with the rows a token reads;
    /// the forward asks for their rows through `Ctx::table_rows`.
    fn row_tables(&self) -> Vec<crate::experts::rows::RowTable> {
        Vec::new()
    }
}

/// A network and its routed-expert stacks per layer (None for layers without), which the
/// expert store serves — mapped or streamed.
pub struct Loaded {
    pub net: Box<dyn Network>,
    pub experts: Vec<Option<[Mat; 3]>>,
}

pub struct Architecture {
    /// `general.architecture` values this entry loads.
    pub name: &'static str,
    pub load: fn(&GgufFile) -> Result<Loaded>,
}

/// Every architecture xwen runs.
pub const REGISTRY: &[Architecture] = &[
    Architecture { name: "qwen35", load: qwen35::load },
    Architecture { name: "qwen35moe", load: qwen35::load },
    Architecture { name: "qwen3next", load: qwen3next::load },
    Architecture { name: "kimi-linear", load: kimi_linear::load },
    Architecture { name: "kimi-k3", load: kimi_k3::load },
    Architecture { name: "qwen4exp", load: qwen4exp::load },
];

/// Architectures xwen recognizes but does not run yet (a clear error, not "unknown").
pub const KNOWN_UNIMPLEMENTED: &[&str] = &[];

/// The registry entry for `arch`.
pub fn find(arch: &str) -> Option<&'static Architecture> {
    REGISTRY.iter().find(|a| a.name == arch)
}

/// Names of every architecture in the registry.
pub fn supported() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|a| a.name)
}

/// Loads the network `f`'s `general.architecture` names.
pub fn load(f: &GgufFile) -> Result<Loaded> {
    let arch = f.architecture().unwrap_or("");
    match find(arch) {
        Some(a) => (a.load)(f),
        None => Err(EngineError::UnsupportedArchitecture(arch.to_string())),
    }
}

/// One sequence's input to a batched step.
#[derive(Clone, Debug)]
pub struct SpanIn<'a> {
    pub tokens: &'a [u32],
    /// Rows (within the span) whose logits come back.
    pub logits: Range<usize>,
    /// Every row in the one-token (decode) order (`batch::Span::decode_order`).
    pub decode_order: bool,
    /// Return every row's final hidden (after output_norm), as an MTP head reads it.
    pub hidden: bool,
}

/// One sequence's output of a batched step.
#[derive(Clone, Debug, Default)]
pub struct SpanOut {
    /// The logits of the rows `SpanIn::logits` (rows × n_vocab).
    pub logits: Vec<f32>,
    /// Every row's final hidden (rows × hidden) where `SpanIn::hidden`, else empty.
    pub hidden: Vec<f32>,
    /// The last row's argmax where a device picked it (`LogitsMode::LastArgmax`; the logits
    /// are then empty).
    pub argmax: Option<u32>,
    /// Every row's pick where a device made them (`LogitsMode::AllArgmax`; the logits are
    /// then empty).
    pub picks: Vec<u32>,
}

/// `Rows` of a batch at the states' positions (what every architecture's forward starts from).
pub fn batch_rows(states: &[&mut SeqState], spans: &[SpanIn]) -> Rows {
    Rows::from_spans(spans.iter().zip(states.iter()).map(|(sp, s)| (sp.tokens.len(), s.pos, sp.decode_order)))
}

/// The rows of the lm head's batch: each sequence's logits rows as one span, in the decode
/// order (one row each) for a decode-order span.
pub fn head_rows(spans: &[SpanIn]) -> Rows {
    let mut out = Vec::new();
    for sp in spans {
        let n = sp.logits.len();
        if sp.decode_order {
            out.extend((0..n).map(|_| (1, 0, false)));
        } else if n > 0 {
            out.push((n, 0, false));
        }
    }
    Rows::from_spans(out)
}
