//! xwen-engine: model architectures, per-sequence state, expert store, sampler and the generate
//! API. The library never prints, exits or reads environment variables; errors are returned.

pub mod attention;
pub mod batch;
pub mod checkpoint;
pub mod compute;
pub mod config;
pub mod deltanet;
pub mod direct_read;
pub mod error;
pub mod expert_cache;
pub mod expert_store;
pub mod ffn;
pub mod heap;
pub mod memory_plan;
pub mod model;
pub mod models;
pub mod moe;
pub mod ops;
pub mod profile;
pub mod runtime;
pub mod state;
pub mod streamed_experts;
pub mod synth;
pub mod weights;

pub use config::EngineConfig;
pub use error::{EngineError, Result};
pub use expert_store::{ExpertStore, ResidentExperts};
pub use memory_plan::MemoryPlan;
pub use streamed_experts::{ExpertCacheStats, StreamedExperts};
pub use model::{supported_archs, LogitsMode, Model, SeqStep, KNOWN_UNIMPLEMENTED_ARCHS};
pub use state::{SeqCheckpoint, SeqState, Snapshot};
pub use runtime::generate::{self, generate, GenStats, GenerateRequest, StopReason};
pub use runtime::sampler;
pub use runtime::scheduler::{Event, Request, Scheduler, SeqId};
pub use runtime::session::{Reuse, Session};
pub use runtime::sampler::{Sampler, SamplerConfig, SamplingParams};
pub use checkpoint::{identify, Checkpoint};
