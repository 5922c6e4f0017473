//! The architecture seam. One file per architecture, each reading like the math (config from
//! metadata beside the weights, a forward over a batch); the registry below is the only place
//! that names them. `Model`, the memory plan and `xwen inspect` reach a network through
//! [`Network`] and [`load`], never through an architecture's own types, so adding qwen3next or
//! kimi-linear is one model file plus one `REGISTRY` line, its shared blocks (attention, the
//! delta rule, MoE) reused.

pub mod qwen35;

use crate::batch::Rows;
use crate::compute::Ctx;
use crate::error::{EngineError, Result};
use crate::experts::store::ExpertStore;
pub use crate::experts::plan::PlanFigures;
use crate::state::SeqState;
use crate::weights::Mat;
use std::ops::Range;
use xwen_gguf::GgufFile;

/// A loaded network: its trunk's weights (views into the mapped file) and its forward.
pub trait Network: Send + Sync {
    /// llama.cpp's architecture name, as `general.architecture` says it.
    fn arch(&self) -> &str;
    fn n_vocab(&self) -> usize;
    /// A fresh sequence state (position 0) of this network's layers.
    fn new_state(&self) -> SeqState;
    /// One batched step: sequence i's `tokens[i]` at its own position in `states[i]`; returns
    /// per sequence the logits of rows `out_rows[i]`. Batch-invariant (`crate::batch`).
    fn forward(
        &self,
        ctx: &Ctx,
        store: &dyn ExpertStore,
        states: &mut [&mut SeqState],
        tokens: &[&[u32]],
        out_rows: &[Range<usize>],
    ) -> Result<Vec<Vec<f32>>>;
    /// Memory-plan figures at `max_ctx` positions per sequence.
    fn plan_figures(&self, max_ctx: usize) -> PlanFigures;
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
];

/// Architectures xwen recognizes but does not run yet (a clear error, not "unknown").
pub const KNOWN_UNIMPLEMENTED: &[&str] = &["qwen3next", "kimi-linear"];

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

/// `Rows` of a batch of `tokens` at the states' positions (what every architecture's forward
/// starts from).
pub fn batch_rows(states: &[&mut SeqState], tokens: &[&[u32]]) -> Rows {
    Rows::from_lens(tokens.iter().zip(states.iter()).map(|(t, s)| (t.len(), s.pos)))
}
