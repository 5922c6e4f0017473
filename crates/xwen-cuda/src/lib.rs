//! xwen's CUDA backend: qwen35 and qwen35moe wholly on one NVIDIA GPU.
//!
//! The engine knows no device: this crate reads a model through the engine's public loader
//! (`models::hybrid::Hybrid::load`), uploads its weights once in their GGUF block formats, keeps
//! the KV caches (f16) and recurrent states (f32) on the device, and runs a decode step —
//! embedding to the greedy token — as one CUDA graph. The kernels (`kernels.cu`) are compiled
//! at load by NVRTC for the card's architecture; the driver and NVRTC are opened at run time,
//! so the crate builds on a machine with no GPU and no CUDA toolkit.
//!
//! The CLI reaches it with `-ngl 99` (`crates/xwen-cli`, feature `cuda`). tests/ops.rs holds
//! every kernel to the CPU's arithmetic; tests/model.rs holds the whole model to the CPU's
//! logits and greedy tokens. Both skip, loudly, where no GPU is present.

pub mod blas;
pub mod collective;
pub mod device;
pub mod error;
pub mod gpu;
pub mod layout;
pub mod model;

pub use device::{attach, attach_group, CudaDevice};
pub use error::{CudaError, Result};
pub use gpu::{device_info, DeviceInfo};
pub use model::{device_bytes_needed, device_plan, mtp_plan_bytes, rms_norm_threads, CudaModel, CudaOptions, DevicePlan, DeviceShard, ExpertCacheStats};
