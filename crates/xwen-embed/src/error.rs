//! The one error type of the embedding API, grouped by what the caller can do about it; the C
//! ABI turns each group into a status code.

use xwen_chat::ChatError;
use xwen_engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value the caller passed cannot be used (an empty prompt, a token outside the
    /// vocabulary, a prompt longer than the context, malformed messages).
    #[error("{0}")]
    InvalidArgument(String),
    /// The model could not be opened: no such file or name, not a GGUF, an architecture xwen
    /// does not run, a RAM budget under the plan's floor.
    #[error("{0}")]
    Load(String),
    /// The chat template is missing or failed on these messages.
    #[error("{0}")]
    Template(String),
    /// The engine failed while running (an expert read failed, a state could not be restored).
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<ChatError> for Error {
    fn from(e: ChatError) -> Self {
        match e {
            ChatError::Template(_) => Error::Template(e.to_string()),
            other => Error::Load(other.to_string()),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
