//! The runtime over the model: what `xwen chat`, `xwen bench --parallel` and a server call.
//! - `session`: one conversation's sequence with prefix reuse (longest common prefix, then a
//!   checkpoint restore — recurrent state cannot be rewound);
//! - `scheduler`: many sequences stepped together through the batched forward;
//! - `generate`: the one-sequence generate loop; `sampler`: token choice;
//! - `speculative`: drafters and the verify loop (greedy output identical to `generate`);
//!   `cost_table`: the timings its controller weighs depths by, shared steps divided among
//!   their sequences.

pub(crate) mod cost_table;
pub mod generate;
pub mod prefix_cache;
pub mod sampler;
pub mod scheduler;
pub mod session;
pub mod speculative;
