//! The ranks of a model split by its routed experts (`crate::shard`), driven in lockstep: every
//! pass on every rank at once, a thread a rank (`lockstep`). `ShardGroup` runs CPU rank models
//! (the in-process stand-in for GPUs that tests and CI use); `DeviceGroup` puts device ranks
//! behind the engine's device seam as one device (what `xwen_cuda::attach_group` builds).

mod cpu_group;
mod device_group;
mod lockstep;

pub use cpu_group::{GroupState, GroupStep, ShardGroup};
pub use device_group::{AbortFn, DeviceGroup};
