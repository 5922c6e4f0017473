//! Every way a GGUF file (untrusted input) or a writer call can be wrong. Each variant names
//! the key, tensor or offset at fault so a one-line Display is enough to act on.

use crate::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },

    #[error("i/o error while writing GGUF: {0}")]
    Write(#[from] std::io::Error),

    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },

    #[error(
        "big-endian GGUF (version field reads {raw:#010x}); only little-endian files are supported"
    )]
    BigEndian { raw: u32 },

    #[error("GGUF version {version} is not supported (only versions 2 and 3; v1 is obsolete)")]
    UnsupportedVersion { version: u32 },

    #[error("truncated file: {what} needs {needed} bytes at offset {offset}, but the file has only {available} left")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },

    #[error("{what}: count {count} at offset {offset} cannot fit in the {remaining} bytes left")]
    CountTooLarge {
        what: String,
        count: u64,
        offset: u64,
        remaining: u64,
    },

    #[error("{what}: string length {len} at offset {offset} exceeds the {remaining} bytes left")]
    StringTooLong {
        what: String,
        len: u64,
        offset: u64,
        remaining: u64,
    },

    #[error("{what}: string at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },

    #[error("metadata key #{index} is empty")]
    EmptyKey { index: u64 },

    #[error("duplicate metadata key '{key}'")]
    DuplicateKey { key: String },

    #[error("metadata key '{key}' has unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },

    #[error("metadata key '{key}' has invalid bool byte {byte:#04x} at offset {offset}")]
    InvalidBool { key: String, byte: u8, offset: u64 },

    #[error("metadata key '{key}': arrays nested deeper than {limit} levels")]
    NestingTooDeep { key: String, limit: usize },

    #[error("metadata key '{key}': more than {limit} metadata values in the file")]
    TooManyValues { key: String, limit: u64 },

    #[error("general.alignment must be a u32 power of two, found {found}")]
    BadAlignment { found: String },

    #[error("tensor #{index} '{tensor}' has {n_dims} dimensions (at most 4 allowed)")]
    TooManyDims {
        tensor: String,
        index: u64,
        n_dims: u32,
    },

    #[error("tensor '{tensor}' has unknown ggml type id {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },

    #[error("tensor '{tensor}': element count of dims {dims:?} overflows")]
    DimsOverflow { tensor: String, dims: Vec<u64> },

    #[error("tensor '{tensor}': row of {ne0} elements is not a multiple of {ty}'s block size {block_size}")]
    BadRowSize {
        tensor: String,
        ty: GgmlType,
        ne0: u64,
        block_size: usize,
    },

    #[error("duplicate tensor name '{name}'")]
    DuplicateTensor { name: String },

    #[error(
        "tensor '{tensor}': data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error(
        "tensor '{tensor}': data [{start}, {end}) lies past the end of the file ({file_len} bytes)"
    )]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },

    #[error("tensors '{first}' (ends at data offset {first_end}) and '{second}' (starts at {second_start}) overlap")]
    TensorsOverlap {
        first: String,
        first_end: u64,
        second: String,
        second_start: u64,
    },

    // Writer-side misuse.
    #[error("tensor '{tensor}': {got} bytes of data given, its type and shape need {expected}")]
    TensorSizeMismatch {
        tensor: String,
        expected: u64,
        got: u64,
    },

    #[error("tensor name '{name}' is {len} bytes; llama.cpp allows at most 63")]
    TensorNameTooLong { name: String, len: usize },

    #[error("tensor '{tensor}' was declared without data and none was streamed for it")]
    MissingTensorData { tensor: String },

    #[error("metadata key '{key}': array elements must all have one type")]
    MixedArray { key: String },

    #[error("streamed {got} bytes past the end of the declared tensor data")]
    StreamOverrun { got: u64 },
}
