//! xwen-engine: `models/` (the architecture registry, one file per architecture), `layers/`
//! (attention, delta rule, FFN, MoE: the math), `backend/` (the ops they run on: `cpu`), the batched forward (`batch`, `ctx`), the RAM plan (`memory_plan`), sequence state and
//! checkpoints (`state/`: KV caches, recurrent states, their byte codec), `experts/` (store, streaming, cache) and `runtime/` (the engine
//! object, scheduler, session, generate, sampler, drafting). The library never prints, exits or reads environment variables; errors are returned.

pub mod backend;
pub mod batch;
pub mod release;
pub mod ctx;
pub mod device;
pub mod config;
pub mod error;
pub mod experts;
pub mod layers;
pub mod memory_plan;
pub mod model;
pub mod models;
pub mod ops;
pub mod profile;
pub mod runtime;
pub mod shard;
pub mod state;
pub mod weights;

pub use config::{EngineConfig, FlashAttn, KvType};
pub use device::{prompts_one_by_one, DeviceModel, DevicePrompt, DeviceRow, DeviceSeq, DeviceSnapshot, MtpDraft, PromptOut, RowOut};
pub use error::{EngineError, Result};
pub use memory_plan::{MemoryPlan, Reserved};
pub use experts::store::{ExpertCacheStats, ExpertStore, ResidentExperts};
pub use experts::streamed::StreamedExperts;
pub use experts::replay::Route;
pub use model::{mtp_head_for_plan, mtp_plan_bytes, supported_archs, LogitsMode, Model, SeqStep, KNOWN_UNIMPLEMENTED_ARCHS};
pub use state::{SeqCheckpoint, SeqState, Snapshot};
pub use runtime::engine::{Engine, EngineObserver, EngineOptions, EngineRequest, Output, RequestId, RequestStats, StepReport, Usage};
pub use runtime::scheduler::StepShape;
pub use runtime::engine_thread::{EngineHandle, OutputSink, SubmitError};
pub use runtime::slots::{DraftSettings, DraftSource};
pub use runtime::prefix_cache::{Hit as PrefixHit, PrefixCache};
pub use runtime::generate::{self, generate, generate_observed, GenStats, GenerateRequest, StopReason};
pub use runtime::sampler;
pub use runtime::scheduler::{LogitsProcessor, TokenLogprobs};
pub use runtime::session::{Reuse, Session};
pub use runtime::speculative::{generate_speculative, ContraryDrafter, DflashDrafter, DraftMemory, DraftTally, Drafter, ModelDrafter, MtpDrafter, NgramDrafter, ReplayDrafter, SpecStats};
pub use runtime::sampler::{Sampler, SamplerConfig, SamplingParams};
pub use release::{identify, Checkpoint};
