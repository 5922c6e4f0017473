//! The runtime over the model: what `xwen serve`, `xwen chat`, `xwen run`, `xwen bench --parallel`
//! and the bindings call (the engine object).
//! - `engine`: the engine object (model, slots, step loop; requests in, outputs out), and
//!   `engine_thread`, the engine on a thread of its own with a handle to submit through;
//!   `slots`: the sessions kept between requests, the prefix cache, the drafters they keep;
//! - `session`: one conversation's sequence with prefix reuse (longest common prefix, then a
//!   checkpoint restore — recurrent state cannot be rewound);
//! - `scheduler`: many sequences stepped together through the batched forward; the engine's
//!   own, so every caller decodes through one loop (`Engine::step`);
//! - `generate`: the one-sequence generate loop; `sampler`: token choice;
//! - `speculative`: drafters and the verify loop (greedy output identical to `generate`);
//!   `cost_table`: the timings its controller weighs depths by, shared steps divided among
//!   their sequences;
//! - `ranks`: the ranks of a model split by its experts (`crate::shard`), run in lockstep.

pub(crate) mod cost_table;
pub mod engine;
pub mod engine_thread;
pub mod generate;
pub mod prefix_cache;
pub mod ranks;
pub mod sampler;
pub(crate) mod scheduler;
pub mod session;
pub mod slots;
pub mod speculative;
mod state_reads;
