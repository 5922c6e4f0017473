//! An opened GGUF file: parsed metadata and tensor table over the file's bytes.

use std::collections::HashMap;
use std::path::Path;

use crate::pages::MapPages;
use crate::reader::{self, Header};
use crate::{GgmlType, GgufError, Value};

#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ne0 first (the contiguous dimension), as stored in the file.
    pub dims: Vec<u64>,
    /// Relative to the data section (`GgufFile::data_offset`).
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Product of dims[1..]: the number of ne0-long rows.
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file. Tensor data stays in the (memory-mapped) file; only the header is
/// copied out. Send + Sync, so one opened model can be shared across worker threads.
pub struct GgufFile {
    bytes: Bytes,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("file_len", &self.file_len())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps `path` read-only and validates the header and every tensor range.
    ///
    /// The mapping assumes nobody truncates or rewrites the file while it is open (the usual
    /// contract of mmap-based model loaders, llama.cpp's included).
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        Self::open_with(path, MapPages::Huge)
    }

    /// `open`, asking for the given page size for the mapping (see `MapPages`).
    pub fn open_with(path: &Path, pages: MapPages) -> Result<GgufFile, GgufError> {
        let io_err = |source| GgufError::Open {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        if len == 0 {
            // mmap of an empty file fails on some platforms; report it as what it is.
            return Self::from_bytes(Vec::new());
        }
        // SAFETY: read-only private mapping; see the contract above.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        crate::pages::advise(&map, pages);
        Self::from_parts(Bytes::Mapped(map))
    }

    /// Parses an in-memory file (tests, fuzzing, small fixtures).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_parts(Bytes::Owned(bytes))
    }

    fn from_parts(bytes: Bytes) -> Result<GgufFile, GgufError> {
        let Header {
            version,
            alignment,
            metadata,
            key_index,
            tensors,
            tensor_index,
            data_offset,
        } = reader::parse(bytes.as_slice())?;
        Ok(GgufFile {
            bytes,
            version,
            alignment,
            metadata,
            key_index,
            tensors,
            tensor_index,
            data_offset,
        })
    }

    /// Bytes of the file now mapped with 2 MiB page entries (Linux; None for an in-memory
    /// file or where the kernel does not say). Meaningful after the weights are paged in.
    pub fn huge_mapped_bytes(&self) -> Option<u64> {
        match &self.bytes {
            Bytes::Mapped(m) => crate::pages::huge_mapped_bytes(m.as_ptr() as usize),
            Bytes::Owned(_) => None,
        }
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// All key/value pairs in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    pub fn get_u32(&self, key: &str) -> Option<u32> {
        u32::try_from(self.get_u64(key)?).ok()
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_array(&self, key: &str) -> Option<&[Value]> {
        self.get(key)?.as_array()
    }

    /// `general.architecture` ("qwen35", "qwen35moe", …).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// `"{arch}.{suffix}"`, e.g. `arch_key("block_count")` → "qwen35.block_count". With no
    /// architecture key the prefix is empty, so lookups simply miss.
    pub fn arch_key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.architecture().unwrap_or(""))
    }

    /// The tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of `t`, which must come from this file's `tensors()`: ranges were validated at
    /// open. Panics only for a `TensorInfo` whose range lies outside this file (a caller bug).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = self.data_offset.checked_add(t.offset).and_then(|s| {
            Some(usize::try_from(s).ok()?..usize::try_from(s.checked_add(t.n_bytes)?).ok()?)
        });
        match range.and_then(|r| self.bytes.as_slice().get(r)) {
            Some(s) => s,
            None => panic!("tensor '{}' is not a tensor of this GGUF file", t.name),
        }
    }

    /// Absolute file offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn file_len(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// Sum of all tensors' `n_bytes`.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn gguf_file_is_send_and_sync() {
        assert_send_sync::<GgufFile>();
    }

    #[test]
    fn rows_of_a_dimensionless_tensor_is_one() {
        let t = TensorInfo {
            name: "s".into(),
            ty: GgmlType::F32,
            dims: vec![],
            offset: 0,
            n_bytes: 4,
        };
        assert_eq!((t.rows(), t.n_elements()), (1, 1));
    }
}
