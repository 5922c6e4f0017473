//! GGUF reading and writing.
//!
//! The reader treats every file as untrusted: each count, length, offset and dimension is checked
//! before use, so a malformed file yields a typed [`GgufError`] naming the problem, never a panic
//! or an allocation the file's size cannot justify. Tensor data is memory-mapped and validated
//! once at open (aligned, inside the file, non-overlapping), after which
//! [`GgufFile::tensor_data`] is a plain slice.
//!
//! The writer produces GGUF v3 files that llama.cpp and gguf-py load, either from in-memory
//! tensors or streamed tensor data for files larger than RAM (see [`GgufWriter`]).

// `x % n != 0` over `is_multiple_of`: the workspace's rust-version is 1.80.
#![allow(unknown_lints, clippy::manual_is_multiple_of)]

mod error;
mod file;
mod pages;
mod reader;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use file::{GgufFile, TensorInfo};
pub use pages::{evict_from_page_cache, MapPages};
pub use reader::{DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_METADATA_VALUES};
pub use types::{GgmlType, QK_K};
pub use value::Value;
pub use writer::{GgufStream, GgufWriter};
