//! The engine's one error type. Every failure a caller can cause (a bad file, an unsupported
//! architecture, a context overflow) is a variant here; nothing in the engine prints or exits.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] xwen_gguf::GgufError),
    #[error("unsupported architecture `{0}` (xwen runs qwen35 and qwen35moe)")]
    UnsupportedArchitecture(String),
    #[error("metadata key `{0}` is missing or has the wrong type")]
    MissingKey(String),
    #[error("bad hyperparameter: {0}")]
    BadHparams(String),
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {got:?}, expected {want:?}")]
    TensorShape { name: String, got: Vec<u64>, want: Vec<u64> },
    #[error("tensor `{name}` has type {ty}, which xwen cannot compute with")]
    TensorType { name: String, ty: &'static str },
    #[error("token id {id} is outside the vocabulary ({n_vocab})")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("context full: {need} positions needed, max_ctx is {max}")]
    ContextFull { need: usize, max: usize },
    #[error("empty input: forward needs at least one token")]
    EmptyInput,
    #[error("state error: {0}")]
    State(String),
    #[error("expert store: {0}")]
    ExpertStore(String),
    #[error("RAM budget: {0}")]
    RamBudget(String),
    #[error("threads: {0}")]
    Threads(String),
    #[error("configuration: {0}")]
    Config(String),
    /// The device a model was put on (`Model::attach_device`) failed or refused.
    #[error("device: {0}")]
    Device(String),
    /// The ranks of a sharded model failed to meet (`crate::shard`): one's pass failed, or
    /// they disagreed.
    #[error("sharded model: {0}")]
    Collective(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl EngineError {
    /// The same error for a second caller (a failed read several sequences needed): the same
    /// message; an expert store's error keeps its variant.
    pub fn duplicate(&self) -> EngineError {
        match self {
            EngineError::ExpertStore(s) => EngineError::ExpertStore(s.clone()),
            EngineError::Io(e) => EngineError::Io(std::io::Error::new(e.kind(), e.to_string())),
            other => EngineError::State(other.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;
