//! What can go wrong on the device, as one error type the CLI prints.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CudaError {
    /// No driver (libcuda) or no device: the caller falls back or says so.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("compiling the CUDA kernels with NVRTC: {0}")]
    Compile(String),
    /// The model cannot run on this backend (architecture, tensor type, geometry).
    #[error("{0}")]
    Unsupported(String),
    /// The model and its state do not fit the card.
    #[error("the model needs {need_mib} MiB on the GPU ({what}); {device} has {free_mib} MiB free")]
    TooBig { need_mib: u64, free_mib: u64, device: String, what: String },
    /// The model and its state do not fit the caller's `--vram-budget` (`DevicePlan::check_budget`).
    #[error("{0}")]
    OverBudget(String),
    #[error("{0}")]
    Engine(#[from] xwen_engine::EngineError),
    #[error("position {pos} is past the context of {n_ctx} tokens")]
    ContextFull { pos: usize, n_ctx: usize },
    #[error("token {id} is outside the vocabulary of {n_vocab}")]
    TokenOutOfRange { id: u32, n_vocab: usize },
}

pub type Result<T> = std::result::Result<T, CudaError>;
