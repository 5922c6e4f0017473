//! GGUF v3 writer (little-endian), laid out like gguf-py's: header, metadata, tensor table,
//! padding to the alignment, then each tensor's data padded to the alignment.
//!
//! Two ways to supply tensor data:
//! - in memory: `add_tensor(name, ty, dims, data)` then `write_to` / `write_file` / `to_bytes`;
//! - streamed, for files larger than memory (20 GB synthetic models): declare tensors with
//!   `add_tensor_info(name, ty, dims)`, call `stream_to(w)` (writes the header), then push the
//!   data of the declared tensors, in declaration order, through `GgufStream::write_data` in
//!   chunks of any size (a chunk may span tensors), and close with `GgufStream::finish`, which
//!   fails if any declared byte is missing. Tensors added with data may be mixed in; the stream
//!   writes them itself when their turn comes.

use std::io::Write;
use std::path::Path;

use crate::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::{GgmlType, GgufError, Value};

const ALIGNMENT_KEY: &str = "general.alignment";
/// llama.cpp's GGML_MAX_NAME is 64 including the terminating NUL.
const MAX_TENSOR_NAME: usize = 63;
const ZEROS: [u8; 4096] = [0; 4096];

struct PendingTensor {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    n_bytes: u64,
    data: Option<Vec<u8>>,
}

pub struct GgufWriter {
    alignment: u64,
    kv: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            kv: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Panics unless `a` is a power of two that fits in u32 (a programming error, not input).
    pub fn with_alignment(a: u64) -> Self {
        assert!(
            a.is_power_of_two() && a <= u64::from(u32::MAX),
            "GGUF alignment {a} must be a u32 power of two"
        );
        let mut w = Self::new();
        if a != DEFAULT_ALIGNMENT {
            w.add_kv(ALIGNMENT_KEY, Value::U32(a as u32));
        }
        w
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Adds a key, or replaces the value of an existing one in place (keys are unique in GGUF).
    /// A valid u32 `general.alignment` also sets the data alignment.
    pub fn add_kv(&mut self, key: &str, v: Value) {
        if key == ALIGNMENT_KEY {
            if let Value::U32(a) = v {
                if a.is_power_of_two() {
                    self.alignment = a.into();
                }
            }
        }
        match self.kv.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.kv.push((key.to_string(), v)),
        }
    }

    /// Adds a tensor with its data; `data.len()` must equal the type's `row_bytes` of the shape.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<(), GgufError> {
        let n_bytes = self.check_tensor(name, ty, dims)?;
        if data.len() as u64 != n_bytes {
            return Err(GgufError::TensorSizeMismatch {
                tensor: name.into(),
                expected: n_bytes,
                got: data.len() as u64,
            });
        }
        self.tensors.push(PendingTensor {
            name: name.into(),
            ty,
            dims: dims.to_vec(),
            n_bytes,
            data: Some(data),
        });
        Ok(())
    }

    /// Declares a tensor whose data will be streamed after `stream_to`.
    pub fn add_tensor_info(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
    ) -> Result<(), GgufError> {
        let n_bytes = self.check_tensor(name, ty, dims)?;
        self.tensors.push(PendingTensor {
            name: name.into(),
            ty,
            dims: dims.to_vec(),
            n_bytes,
            data: None,
        });
        Ok(())
    }

    fn check_tensor(&self, name: &str, ty: GgmlType, dims: &[u64]) -> Result<u64, GgufError> {
        if name.len() > MAX_TENSOR_NAME {
            return Err(GgufError::TensorNameTooLong {
                name: name.into(),
                len: name.len(),
            });
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor { name: name.into() });
        }
        if dims.len() > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name.into(),
                index: self.tensors.len() as u64,
                n_dims: dims.len() as u32,
            });
        }
        let n = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64);
        let Some(n) = n else {
            return Err(GgufError::DimsOverflow {
                tensor: name.into(),
                dims: dims.to_vec(),
            });
        };
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % ty.block_size() as u64 != 0 {
            return Err(GgufError::BadRowSize {
                tensor: name.into(),
                ty,
                ne0,
                block_size: ty.block_size(),
            });
        }
        ty.row_bytes(n).ok_or_else(|| GgufError::DimsOverflow {
            tensor: name.into(),
            dims: dims.to_vec(),
        })
    }

    fn padded(&self, n: u64) -> u64 {
        n.next_multiple_of(self.alignment)
    }

    /// Header, metadata, tensor table and the padding up to the data section.
    pub fn header_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            put_value(&mut out, k, v)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += self.padded(t.n_bytes);
        }
        if !self.tensors.is_empty() {
            out.resize(self.padded(out.len() as u64) as usize, 0);
        }
        Ok(out)
    }

    /// Writes the whole file; every tensor must have been added with its data.
    pub fn write_to(&self, w: &mut impl Write) -> Result<(), GgufError> {
        self.stream_to(w)?.finish()?;
        Ok(())
    }

    pub fn write_file(&self, path: &Path) -> Result<(), GgufError> {
        let file = std::fs::File::create(path).map_err(|source| GgufError::Open {
            path: path.display().to_string(),
            source,
        })?;
        let mut w = std::io::BufWriter::new(file);
        self.write_to(&mut w)?;
        w.into_inner()
            .map_err(|e| GgufError::Write(e.into_error()))?
            .sync_all()?;
        Ok(())
    }

    /// The whole file in memory. Panics if a tensor was declared with `add_tensor_info` (its
    /// data can only be streamed) or an array mixes element types.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Err(e) = self.write_to(&mut out) {
            panic!("GgufWriter::to_bytes: {e}");
        }
        out
    }

    /// Writes the header and returns a stream that takes the data of tensors declared with
    /// `add_tensor_info`, in declaration order (see the module docs).
    pub fn stream_to<W: Write>(&self, mut w: W) -> Result<GgufStream<'_, W>, GgufError> {
        w.write_all(&self.header_bytes()?)?;
        let mut s = GgufStream {
            gguf: self,
            w,
            next: 0,
            done_in_next: 0,
        };
        s.write_owned_tensors()?;
        Ok(s)
    }
}

/// Tensor data being streamed after the header; created by `GgufWriter::stream_to`.
pub struct GgufStream<'a, W: Write> {
    gguf: &'a GgufWriter,
    w: W,
    next: usize,
    done_in_next: u64,
}

impl<W: Write> GgufStream<'_, W> {
    /// The tensor whose bytes `write_data` takes next, if any is still owed.
    pub fn current_tensor(&self) -> Option<&str> {
        self.gguf.tensors.get(self.next).map(|t| t.name.as_str())
    }

    /// Appends bytes to the data of the declared tensors, in order; a chunk may end mid-tensor
    /// or span several tensors.
    pub fn write_data(&mut self, mut bytes: &[u8]) -> Result<(), GgufError> {
        while !bytes.is_empty() {
            let Some(t) = self.gguf.tensors.get(self.next) else {
                return Err(GgufError::StreamOverrun {
                    got: bytes.len() as u64,
                });
            };
            let want = (t.n_bytes - self.done_in_next).min(bytes.len() as u64) as usize;
            self.w.write_all(&bytes[..want])?;
            bytes = &bytes[want..];
            self.done_in_next += want as u64;
            if self.done_in_next == t.n_bytes {
                self.end_tensor()?;
                self.write_owned_tensors()?;
            }
        }
        Ok(())
    }

    /// Checks every declared byte was written, flushes, and hands the writer back.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some(t) = self.gguf.tensors.get(self.next) {
            return Err(GgufError::MissingTensorData {
                tensor: t.name.clone(),
            });
        }
        self.w.flush()?;
        Ok(self.w)
    }

    fn end_tensor(&mut self) -> Result<(), GgufError> {
        let n = self.gguf.tensors[self.next].n_bytes;
        let mut pad = self.gguf.padded(n) - n;
        // Alignments are u32 powers of two, so padding can exceed any fixed buffer.
        while pad > 0 {
            let k = pad.min(ZEROS.len() as u64) as usize;
            self.w.write_all(&ZEROS[..k])?;
            pad -= k as u64;
        }
        self.next += 1;
        self.done_in_next = 0;
        Ok(())
    }

    /// Writes the tensors that carry their own data until one that must be streamed.
    fn write_owned_tensors(&mut self) -> Result<(), GgufError> {
        while let Some(data) = self
            .gguf
            .tensors
            .get(self.next)
            .and_then(|t| t.data.as_deref())
        {
            self.w.write_all(data)?;
            self.end_tensor()?;
        }
        Ok(())
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, key: &str, v: &Value) -> Result<(), GgufError> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::Str(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(items) => {
            // An empty array has no element to take a type from; u8 is as good as any.
            let elem_ty = items.first().map_or(Value::U8(0).type_id(), Value::type_id);
            if items.iter().any(|x| x.type_id() != elem_ty) {
                return Err(GgufError::MixedArray { key: key.into() });
            }
            out.extend_from_slice(&elem_ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for x in items {
                put_value(out, key, x)?;
            }
        }
    }
    Ok(())
}
