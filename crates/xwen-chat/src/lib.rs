//! xwen-chat: the text side of a chat request. A byte-level BPE tokenizer built from a GGUF's
//! `tokenizer.ggml.*` metadata (token-for-token identical to llama.cpp), the incremental
//! detokenizer with its stop strings (`TextStream`), and Jinja chat templates rendered into
//! markup/content segments so that text a user or tool wrote can never turn into control
//! tokens. On the way back, `reply` splits a reply's text into reasoning, content and tool
//! calls (`tool_parse`), for every front end.

mod bpe;
mod pretok;
pub mod reply;
mod segments;
mod stop;
mod stream;
mod template;
mod tokenizer;
pub mod tool_parse;
mod unicode;
mod unicode_data;
mod vocab;

pub use segments::{encode_segments, segments_text, Segment};
pub use stop::partial_suffix;
pub use stream::TextStream;
pub use template::{ChatMessage, ChatTemplate, RenderOptions, ToolCall};
pub use tokenizer::Tokenizer;
pub use unicode::byte_to_char;

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("GGUF metadata key {0} is missing")]
    MissingKey(&'static str),
    #[error("bad tokenizer metadata: {0}")]
    BadMetadata(String),
    #[error("unsupported tokenizer: {0}")]
    UnsupportedTokenizer(String),
    #[error("pre-tokenizer regex: {0}")]
    Regex(String),
    #[error("chat template: {0}")]
    Template(String),
}
