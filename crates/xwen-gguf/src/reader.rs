//! Parsing of the GGUF header (magic, version, metadata, tensor table) from untrusted bytes.
//!
//! Rules that keep hostile input harmless:
//! - every read goes through `Cursor`, which checks the bytes exist before touching them;
//! - a file-provided count is checked against the bytes left (count × the smallest encoding of
//!   one element) before any `Vec::with_capacity`, so a bogus count cannot reserve memory the file
//!   could not back; all metadata values together are capped at `MAX_METADATA_VALUES` because a
//!   `Value` is larger than its 1-byte encoding;
//! - arithmetic on offsets and sizes is checked; nested arrays are depth-limited (no recursion
//!   blow-up);
//! - tensor ranges are validated here once (alignment, inside the file, no overlap), so
//!   `GgufFile::tensor_data` can slice without further checks.

use std::collections::HashMap;

use crate::value::type_id;
use crate::{GgmlType, GgufError, TensorInfo, Value};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const MAX_DIMS: usize = 4;
/// All metadata values of a file, array elements included. Real vocabularies hold ~1-2 M
/// (tokens, merges, scores, types); the cap bounds memory to ~0.5 GiB of `Value`s.
pub const MAX_METADATA_VALUES: u64 = 1 << 24;
pub const MAX_ARRAY_DEPTH: usize = 16;

// Smallest encodings, used to bound counts by the bytes left.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1; // key length, 1-byte key, type, u8 value
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8; // name length, n_dims, type, offset

/// Key and tensor counts are only bounded by the file size, which for a 20 GB model still allows
/// a billion-entry claim; so reserve a modest amount up front and let real entries grow the
/// tables. (Array elements are instead bounded by `MAX_METADATA_VALUES` before reserving.)
fn initial_capacity(count: u64) -> usize {
    count.min(1 << 12) as usize
}

pub(crate) struct Header {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, Value)>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    values_left: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.buf.len() - self.pos {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n as u64,
                available: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` elements of at least `min_size` bytes each can fit in what is left.
    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), GgufError> {
        match count.checked_mul(min_size) {
            Some(total) if total <= self.remaining() => Ok(()),
            _ => Err(GgufError::CountTooLarge {
                what: what(),
                count,
                offset: self.pos as u64,
                remaining: self.remaining(),
            }),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(GgufError::StringTooLong {
                what: what(),
                len,
                offset: self.pos as u64 - 8,
                remaining: self.remaining(),
            });
        }
        let start = self.pos as u64;
        let bytes = self.take(len as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: start,
            }),
        }
    }

    fn spend_values(&mut self, n: u64, key: &str) -> Result<(), GgufError> {
        match self.values_left.checked_sub(n) {
            Some(left) => {
                self.values_left = left;
                Ok(())
            }
            None => Err(GgufError::TooManyValues {
                key: key.to_string(),
                limit: MAX_METADATA_VALUES,
            }),
        }
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
        let what = || format!("value of key '{key}'");
        Ok(match ty {
            type_id::U8 => Value::U8(self.array::<1>(&what)?[0]),
            type_id::I8 => Value::I8(self.array::<1>(&what)?[0] as i8),
            type_id::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            type_id::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            type_id::U32 => Value::U32(u32::from_le_bytes(self.array(&what)?)),
            type_id::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            type_id::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            type_id::U64 => Value::U64(u64::from_le_bytes(self.array(&what)?)),
            type_id::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            type_id::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            type_id::BOOL => {
                let offset = self.pos as u64;
                match self.array::<1>(&what)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    byte => {
                        return Err(GgufError::InvalidBool {
                            key: key.to_string(),
                            byte,
                            offset,
                        })
                    }
                }
            }
            type_id::STR => Value::Str(self.string(&what)?),
            type_id::ARRAY => self.array_value(key, depth)?,
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_string(),
                    type_id: ty,
                })
            }
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Value, GgufError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                key: key.to_string(),
                limit: MAX_ARRAY_DEPTH,
            });
        }
        let what = || format!("array header of key '{key}'");
        let elem_ty = self.u32(&what)?;
        let n = self.u64(&what)?;
        let min_size: u64 = match elem_ty {
            type_id::U8 | type_id::I8 | type_id::BOOL => 1,
            type_id::U16 | type_id::I16 => 2,
            type_id::U32 | type_id::I32 | type_id::F32 => 4,
            type_id::U64 | type_id::I64 | type_id::F64 | type_id::STR => 8,
            type_id::ARRAY => 12,
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_string(),
                    type_id: elem_ty,
                })
            }
        };
        self.check_count(n, min_size, &|| format!("array of key '{key}'"))?;
        self.spend_values(n, key)?;
        // Bounded by check_count: n elements of min_size bytes fit in the file.
        let mut out = Vec::with_capacity(n as usize);
        if elem_ty == type_id::STR {
            // The hot path for 250k-entry vocabularies: no per-element dispatch.
            for i in 0..n {
                let s = self.string(&|| format!("element {i} of key '{key}'"))?;
                out.push(Value::Str(s));
            }
        } else if min_size <= 8 && elem_ty != type_id::STR && elem_ty != type_id::BOOL {
            // Fixed-size numbers: one bounds check for the whole array.
            let bytes = self.take((n * min_size) as usize, &|| format!("array of key '{key}'"))?;
            out.extend(
                bytes
                    .chunks_exact(min_size as usize)
                    .map(|c| decode_number(elem_ty, c)),
            );
        } else {
            for _ in 0..n {
                out.push(self.value(elem_ty, key, depth + 1)?);
            }
        }
        Ok(Value::Array(out))
    }
}

/// `c` holds exactly one little-endian number of type `ty` (a fixed-size, non-bool type).
fn decode_number(ty: u32, c: &[u8]) -> Value {
    let b8 = |c: &[u8]| {
        let mut a = [0u8; 8];
        a[..c.len()].copy_from_slice(c);
        a
    };
    let raw = u64::from_le_bytes(b8(c));
    match ty {
        type_id::U8 => Value::U8(raw as u8),
        type_id::I8 => Value::I8(raw as u8 as i8),
        type_id::U16 => Value::U16(raw as u16),
        type_id::I16 => Value::I16(raw as u16 as i16),
        type_id::U32 => Value::U32(raw as u32),
        type_id::I32 => Value::I32(raw as u32 as i32),
        type_id::F32 => Value::F32(f32::from_bits(raw as u32)),
        type_id::U64 => Value::U64(raw),
        type_id::I64 => Value::I64(raw as i64),
        _ => Value::F64(f64::from_bits(raw)),
    }
}

/// Reads the first four bytes and the version; shared by `parse` and sniffing tools.
fn read_preamble(c: &mut Cursor) -> Result<u32, GgufError> {
    let head = &c.buf[..c.buf.len().min(4)];
    if head != &GGUF_MAGIC[..head.len()] {
        return Err(GgufError::BadMagic {
            found: head.to_vec(),
        });
    }
    c.take(4, &|| "magic".into())?;
    let version = c.u32(&|| "version".into())?;
    // A big-endian v2/v3 file stores the version as 0x0N000000 (ggml's own heuristic).
    if version != 0 && version & 0xFFFF == 0 {
        return Err(GgufError::BigEndian { raw: version });
    }
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    Ok(version)
}

pub(crate) fn parse(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor {
        buf,
        pos: 0,
        values_left: MAX_METADATA_VALUES,
    };
    let version = read_preamble(&mut c)?;
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;
    c.check_count(n_kv, MIN_KV_BYTES, &|| "metadata count".into())?;
    c.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, &|| "tensor count".into())?;

    let mut metadata = Vec::with_capacity(initial_capacity(n_kv));
    let mut key_index = HashMap::with_capacity(initial_capacity(n_kv));
    for i in 0..n_kv {
        let key = c.string(&|| format!("name of metadata key #{i}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { index: i });
        }
        if key_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        let ty = c.u32(&|| format!("value type of key '{key}'"))?;
        c.spend_values(1, &key)?;
        let value = c.value(ty, &key, 0)?;
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match key_index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(other) => {
            return Err(GgufError::BadAlignment {
                found: format!("{other:?}"),
            })
        }
    };

    c.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, &|| "tensor count".into())?;
    let mut tensors = Vec::with_capacity(initial_capacity(n_tensors));
    let mut tensor_index = HashMap::with_capacity(initial_capacity(n_tensors));
    for i in 0..n_tensors {
        let t = read_tensor_info(&mut c, i)?;
        if tensor_index.contains_key(&t.name) {
            return Err(GgufError::DuplicateTensor { name: t.name });
        }
        tensor_index.insert(t.name.clone(), tensors.len());
        tensors.push(t);
    }

    let file_len = buf.len() as u64;
    let table_end = c.pos as u64;
    let aligned = table_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::BadAlignment {
            found: alignment.to_string(),
        })?;
    let data_offset = if n_tensors == 0 {
        // Tensor-less files (vocab-only) end right after the table, unpadded.
        aligned.min(file_len)
    } else if aligned > file_len {
        return Err(GgufError::Truncated {
            what: "padding before the tensor data section".into(),
            offset: table_end,
            needed: aligned - table_end,
            available: file_len - table_end,
        });
    } else {
        aligned
    };
    check_tensor_ranges(&tensors, alignment, data_offset, file_len)?;

    Ok(Header {
        version,
        alignment,
        metadata,
        key_index,
        tensors,
        tensor_index,
        data_offset,
    })
}

fn read_tensor_info(c: &mut Cursor, index: u64) -> Result<TensorInfo, GgufError> {
    let name = c.string(&|| format!("name of tensor #{index}"))?;
    let what = || format!("tensor info of '{name}'");
    let n_dims = c.u32(&what)?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name,
            index,
            n_dims,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64(&what)?);
    }
    let type_id = c.u32(&what)?;
    let offset = c.u64(&what)?;
    let Some(ty) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            tensor: name,
            type_id,
        });
    };
    // ggml keeps element counts in int64_t, so anything past i64::MAX is as broken as overflow.
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64 && dims.iter().all(|&d| d <= i64::MAX as u64));
    let Some(n_elements) = n_elements else {
        return Err(GgufError::DimsOverflow { tensor: name, dims });
    };
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % ty.block_size() as u64 != 0 {
        return Err(GgufError::BadRowSize {
            tensor: name,
            ty,
            ne0,
            block_size: ty.block_size(),
        });
    }
    let Some(n_bytes) = ty.row_bytes(n_elements) else {
        return Err(GgufError::DimsOverflow { tensor: name, dims });
    };
    Ok(TensorInfo {
        name,
        ty,
        dims,
        offset,
        n_bytes,
    })
}

fn check_tensor_ranges(
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        }
    }
    // Empty tensors occupy no bytes and cannot collide with anything.
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_unstable_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // In bounds of the file already, so the sum cannot overflow.
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::TensorsOverlap {
                first: a.name.clone(),
                first_end: a.offset + a.n_bytes,
                second: b.name.clone(),
                second_start: b.offset,
            });
        }
    }
    Ok(())
}
