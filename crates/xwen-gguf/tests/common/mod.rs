//! Shared by the integration tests: a byte-level GGUF builder for files the writer refuses to
//! make (malformed ones), a small valid model written by the writer, and fixture paths.
#![allow(dead_code)]

use std::path::PathBuf;

use xwen_gguf::{GgmlType, GgufWriter, Value};

pub const T_U8: u32 = 0;
pub const T_U32: u32 = 4;
pub const T_BOOL: u32 = 7;
pub const T_STR: u32 = 8;
pub const T_ARRAY: u32 = 9;
pub const T_U64: u32 = 10;

/// Appends raw little-endian fields; the caller decides every count, so anything can be faked.
#[derive(Default, Clone)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw::default()
            .bytes(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    pub fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u8(self, v: u8) -> Raw {
        self.bytes(&[v])
    }
    pub fn u32(self, v: u32) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(self, v: u64) -> Raw {
        self.bytes(&v.to_le_bytes())
    }
    pub fn str(self, s: &[u8]) -> Raw {
        self.u64(s.len() as u64).bytes(s)
    }
    /// key + u32 value
    pub fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key.as_bytes()).u32(T_U32).u32(v)
    }
    pub fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name.as_bytes()).u32(dims.len() as u32);
        for d in dims {
            r = r.u64(*d);
        }
        r.u32(ty).u64(offset)
    }
    /// Zero padding up to `align`, then `n` data bytes.
    pub fn data(mut self, align: usize, n: usize) -> Raw {
        let padded = self.0.len().next_multiple_of(align);
        self.0.resize(padded + n, 0);
        self
    }
}

/// A small but complete model-like file: typical keys, a vocabulary, tensors of several types.
pub fn small_model() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::from("qwen35"));
    w.add_kv("general.name", Value::from("tiny test"));
    w.add_kv("general.file_type", Value::U32(7));
    w.add_kv("qwen35.block_count", Value::U32(2));
    w.add_kv("qwen35.embedding_length", Value::U32(64));
    w.add_kv("qwen35.rope.freq_base", Value::F32(1e7));
    w.add_kv(
        "qwen35.rope.dimension_sections",
        Value::from(vec![3i32, 3, 2, 0]),
    );
    let tokens: Vec<Value> = (0..40).map(|i| Value::Str(format!("tok{i}"))).collect();
    w.add_kv("tokenizer.ggml.tokens", Value::Array(tokens));
    w.add_kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
    let f32s: Vec<u8> = (0..64u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.add_tensor("output_norm.weight", GgmlType::F32, &[64], f32s)
        .unwrap();
    let q8 = pattern(GgmlType::Q8_0.row_bytes(64 * 4).unwrap() as usize, 1);
    w.add_tensor("blk.0.attn_q.weight", GgmlType::Q8_0, &[64, 4], q8)
        .unwrap();
    let q4k = pattern(GgmlType::Q4_K.row_bytes(256 * 2).unwrap() as usize, 2);
    w.add_tensor("blk.0.ffn_up.weight", GgmlType::Q4_K, &[256, 2], q4k)
        .unwrap();
    w.add_tensor("blk.1.ssm_a", GgmlType::BF16, &[3, 1, 1], pattern(6, 3))
        .unwrap();
    w.to_bytes()
}

/// Deterministic non-constant bytes, so misplaced data shows up as a mismatch.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Tiny trained models shipped beside the repository (`../shared/models/gguf`).
pub fn shared_models_dir() -> PathBuf {
    repo_root().join("../shared/models/gguf")
}

/// xorshift64*: deterministic, dependency-free randomness for mutation tests.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}
