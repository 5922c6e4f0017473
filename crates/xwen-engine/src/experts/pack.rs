//! The expert-packed sidecar (`xwen pack`): every layer × expert's gate, up and down matrices as
//! one 4 KiB-aligned, checksummed record, so a cache miss is one read instead of three
//! (docs/architecture.md "A streamed expert's path").
//!
//! Layout (little-endian):
//! - file header, padded to 4 KiB: magic `XWENPAK1`, version u32, layer count u32, expert count
//!   u32, reserved u32, the hash of the GGUF's expert tensor table u64 (`table_hash`), then per
//!   layer 48 bytes: present u32, record stride u32 (a multiple of 4 KiB), offset of the layer's
//!   first record u64, the three matrices' bytes u32 × 3, their ggml types u32 × 3, reserved u32;
//! - records: a 64-byte header — magic u32 `XPRC`, version u16, layer u16, expert u32, sizes
//!   u32 × 3, types u8 × 3 + padding, crc32 of the payload u32 — then gate, up and down bytes, the
//!   record padded to its stride.
//!
//! The sidecar is untrusted input: the file header is checked against the GGUF it claims to
//! pack when opened (`Pack::open`: magic, version, geometry, sizes, the table hash), and every
//! record header on the read path at O(1) (`Pack::check_record`: magic, version, layer, expert,
//! sizes, types) — a mismatch is an error naming layer and expert. `Pack::verify` checks every
//! record's crc32.

use crate::error::{EngineError, Result};
use crate::experts::direct_read::{DirectFile, BLOCK};
use crate::weights::Mat;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use xwen_gguf::GgufFile;

const MAGIC: &[u8; 8] = b"XWENPAK1";
const VERSION: u32 = 1;
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"XPRC");
const RECORD_HEADER: usize = 64;
const LAYER_ENTRY: usize = 48;
const FILE_HEADER_FIXED: usize = 32;

/// Where a GGUF's sidecar sits: beside it, `.xwenpack` appended.
pub fn sidecar_path(gguf: &Path) -> PathBuf {
    let mut s = gguf.as_os_str().to_owned();
    s.push(".xwenpack");
    PathBuf::from(s)
}

/// A hash (FNV-1a 64) of the expert tensor table — each stack's name, type, dims, offset and
/// size, in layer order — and of a sample of each stack's bytes (its first and last 256): what
/// a sidecar must match to stand for the GGUF's experts. The sample tells apart two files of one
/// layout (the same converter on two checkpoints of one geometry) at the cost of a few pages.
pub fn table_hash(file: &GgufFile, layers: &[Option<[Mat; 3]>]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h = (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3);
        }
    };
    for (il, l) in layers.iter().enumerate() {
        let Some(mats) = l else { continue };
        eat(&(il as u64).to_le_bytes());
        for m in mats {
            eat(m.info.name.as_bytes());
            eat(&(m.ty as u32).to_le_bytes());
            for d in &m.info.dims {
                eat(&d.to_le_bytes());
            }
            eat(&m.info.offset.to_le_bytes());
            eat(&m.info.n_bytes.to_le_bytes());
            let data = file.tensor_data(&m.info);
            let k = data.len().min(256);
            eat(&data[..k]);
            eat(&data[data.len() - k..]);
        }
    }
    h
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct LayerEntry {
    stride: u64,
    offset: u64,
    sizes: [u32; 3],
    types: [u32; 3],
}

fn layer_entry(mats: &[Mat; 3], offset: u64) -> LayerEntry {
    let sizes = mats.each_ref().map(|m| m.mat_bytes() as u32);
    let payload: u64 = sizes.iter().map(|&s| u64::from(s)).sum();
    LayerEntry { stride: (RECORD_HEADER as u64 + payload).div_ceil(BLOCK) * BLOCK, offset, sizes, types: mats.each_ref().map(|m| m.ty as u32) }
}

/// The layers' entries as a pack of `layers` lays them out (records after a header of
/// `header_len` bytes).
fn plan(layers: &[Option<[Mat; 3]>], n_expert: usize) -> (u64, Vec<Option<LayerEntry>>) {
    let header_len = ((FILE_HEADER_FIXED + LAYER_ENTRY * layers.len()) as u64).div_ceil(BLOCK) * BLOCK;
    let mut at = header_len;
    let entries = layers
        .iter()
        .map(|l| {
            l.as_ref().map(|mats| {
                let e = layer_entry(mats, at);
                at += e.stride * n_expert as u64;
                e
            })
        })
        .collect();
    (header_len, entries)
}

fn n_expert_of(layers: &[Option<[Mat; 3]>]) -> Result<usize> {
    let n = layers.iter().flatten().map(|m| m[0].n_mats).max().unwrap_or(0);
    if n == 0 {
        return Err(EngineError::ExpertStore("the model has no routed experts to pack".into()));
    }
    Ok(n)
}

fn record_header(layer: usize, expert: usize, e: &LayerEntry, crc: u32) -> [u8; RECORD_HEADER] {
    let mut h = [0u8; RECORD_HEADER];
    h[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    h[4..6].copy_from_slice(&(VERSION as u16).to_le_bytes());
    h[6..8].copy_from_slice(&(layer as u16).to_le_bytes());
    h[8..12].copy_from_slice(&(expert as u32).to_le_bytes());
    for i in 0..3 {
        h[12 + 4 * i..16 + 4 * i].copy_from_slice(&e.sizes[i].to_le_bytes());
        h[24 + i] = e.types[i] as u8;
    }
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What `write` wrote.
#[derive(Clone, Debug)]
pub struct PackReport {
    pub path: PathBuf,
    pub records: usize,
    pub bytes: u64,
}

/// Writes the sidecar of `file`'s experts (`layers`) to `out` (through `out.part`, renamed when
/// complete), reading each expert's bytes from the mapped file.
pub fn write(file: &GgufFile, layers: &[Option<[Mat; 3]>], out: &Path) -> Result<PackReport> {
    let io = |e: std::io::Error| EngineError::ExpertStore(format!("writing {}: {e}", out.display()));
    let n_expert = n_expert_of(layers)?;
    let (header_len, entries) = plan(layers, n_expert);
    let mut head = Vec::with_capacity(header_len as usize);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&(layers.len() as u32).to_le_bytes());
    head.extend_from_slice(&(n_expert as u32).to_le_bytes());
    head.extend_from_slice(&0u32.to_le_bytes());
    head.extend_from_slice(&table_hash(file, layers).to_le_bytes());
    for e in &entries {
        let mut b = [0u8; LAYER_ENTRY];
        if let Some(e) = e {
            b[0..4].copy_from_slice(&1u32.to_le_bytes());
            b[4..8].copy_from_slice(&(e.stride as u32).to_le_bytes());
            b[8..16].copy_from_slice(&e.offset.to_le_bytes());
            for i in 0..3 {
                b[16 + 4 * i..20 + 4 * i].copy_from_slice(&e.sizes[i].to_le_bytes());
                b[28 + 4 * i..32 + 4 * i].copy_from_slice(&e.types[i].to_le_bytes());
            }
        }
        head.extend_from_slice(&b);
    }
    head.resize(header_len as usize, 0);
    let part = PathBuf::from(format!("{}.part", out.display()));
    let result = (|| -> Result<u64> {
        let mut w = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(&part).map_err(io)?);
        w.write_all(&head).map_err(io)?;
        let mut written = header_len;
        let mut rec = Vec::new();
        for (il, (l, e)) in layers.iter().zip(&entries).enumerate() {
            let (Some(mats), Some(e)) = (l, e) else { continue };
            for x in 0..n_expert {
                rec.clear();
                rec.resize(RECORD_HEADER, 0);
                for m in mats {
                    rec.extend_from_slice(m.q_sub(file, x).data);
                }
                let crc = crc32fast::hash(&rec[RECORD_HEADER..]);
                rec[..RECORD_HEADER].copy_from_slice(&record_header(il, x, e, crc));
                rec.resize(e.stride as usize, 0);
                w.write_all(&rec).map_err(io)?;
                written += e.stride;
            }
        }
        w.flush().map_err(io)?;
        Ok(written)
    })();
    match result {
        Ok(bytes) => {
            std::fs::rename(&part, out).map_err(io)?;
            Ok(PackReport { path: out.to_path_buf(), records: layers.iter().flatten().count() * n_expert, bytes })
        }
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(e)
        }
    }
}

/// An opened sidecar whose header matched the GGUF's experts.
pub struct Pack {
    file: DirectFile,
    entries: Vec<Option<LayerEntry>>,
    n_expert: usize,
    path: PathBuf,
    /// One bit per record (layer × n_expert + expert): its payload's crc32 has matched once.
    checked: Vec<std::sync::atomic::AtomicU64>,
}

impl Pack {
    /// Its reads' buffers are kept for the next reads, up to `max` (`DirectFile::recycle`).
    pub fn recycle(&mut self, max: usize) {
        self.file.recycle(max);
    }

    /// Opens `path` as the sidecar of `file`'s experts `layers`; an error says why it does not
    /// stand for them.
    pub fn open(path: &Path, file_of: &GgufFile, layers: &[Option<[Mat; 3]>]) -> Result<Pack> {
        let bad = |why: String| EngineError::ExpertStore(format!("{}: not a pack of this model: {why}", path.display()));
        let file = DirectFile::open(path).map_err(|e| EngineError::ExpertStore(format!("cannot open {}: {e}", path.display())))?;
        let n_expert = n_expert_of(layers)?;
        let (header_len, want) = plan(layers, n_expert);
        if file.len() < header_len {
            return Err(bad(format!("{} bytes, shorter than its header", file.len())));
        }
        let whole_header = 0..header_len;
        let (buf, places) = file.read_ranges(std::slice::from_ref(&whole_header)).map_err(|e| bad(e.to_string()))?;
        let h = &buf[places[0].clone()];
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
        if &h[..8] != MAGIC {
            return Err(bad("bad magic".into()));
        }
        if u32_at(8) != VERSION {
            return Err(bad(format!("version {} (this xwen reads {VERSION})", u32_at(8))));
        }
        if (u32_at(12) as usize, u32_at(16) as usize) != (layers.len(), n_expert) {
            return Err(bad(format!("{} layers × {} experts, the model has {} × {n_expert}", u32_at(12), u32_at(16), layers.len())));
        }
        if u64_at(24) != table_hash(file_of, layers) {
            return Err(bad("its expert table hash differs (made from another file)".into()));
        }
        for (il, w) in want.iter().enumerate() {
            let o = FILE_HEADER_FIXED + il * LAYER_ENTRY;
            let got = (u32_at(o) == 1).then(|| LayerEntry {
                stride: u64::from(u32_at(o + 4)),
                offset: u64_at(o + 8),
                sizes: [u32_at(o + 16), u32_at(o + 20), u32_at(o + 24)],
                types: [u32_at(o + 28), u32_at(o + 32), u32_at(o + 36)],
            });
            if &got != w {
                return Err(bad(format!("layer {il}'s entry differs from the model's experts")));
            }
        }
        let end = want.iter().flatten().map(|e| e.offset + e.stride * n_expert as u64).max().unwrap_or(header_len);
        if file.len() < end {
            return Err(bad(format!("truncated: {} bytes of {end}", file.len())));
        }
        let checked = (0..(want.len() * n_expert).div_ceil(64)).map(|_| std::sync::atomic::AtomicU64::new(0)).collect();
        Ok(Pack { file, entries: want, n_expert, path: path.to_path_buf(), checked })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes of record (layer, expert) in the sidecar.
    pub fn record_range(&self, layer: usize, expert: usize) -> Option<Range<u64>> {
        let e = self.entries.get(layer)?.as_ref()?;
        if expert >= self.n_expert {
            return None;
        }
        let start = e.offset + e.stride * expert as u64;
        Some(start..start + e.stride)
    }

    /// Checks a read record's header (O(1)) and returns where gate, up and down lie in `rec`.
    pub fn check_record(&self, rec: &[u8], layer: usize, expert: usize) -> Result<[Range<usize>; 3]> {
        let bad = |why: &str| {
            EngineError::ExpertStore(format!("{}: the record of expert {expert} of layer {layer} is corrupt: {why}", self.path.display()))
        };
        let e = self.entries.get(layer).and_then(|e| e.as_ref()).ok_or_else(|| bad("the layer has no experts"))?;
        if rec.len() < RECORD_HEADER || rec.len() as u64 != e.stride {
            return Err(bad("wrong length"));
        }
        let u32_at = |o: usize| u32::from_le_bytes(rec[o..o + 4].try_into().expect("4 bytes"));
        if u32_at(0) != RECORD_MAGIC || u16::from_le_bytes([rec[4], rec[5]]) != VERSION as u16 {
            return Err(bad("bad magic or version"));
        }
        if u16::from_le_bytes([rec[6], rec[7]]) as usize != layer || u32_at(8) as usize != expert {
            return Err(bad(&format!("it is labelled expert {} of layer {}", u32_at(8), u16::from_le_bytes([rec[6], rec[7]]))));
        }
        for i in 0..3 {
            if u32_at(12 + 4 * i) != e.sizes[i] || u32::from(rec[24 + i]) != e.types[i] {
                return Err(bad("sizes or types differ from the model's"));
            }
        }
        let mut at = RECORD_HEADER;
        Ok(e.sizes.map(|s| {
            let r = at..at + s as usize;
            at += s as usize;
            r
        }))
    }

    /// Reads record (layer, expert): one read, its header checked, and the first time this
    /// record is read its payload's crc32 too — a corrupt record is an error naming layer and
    /// expert, never a wrong token. The file does not change under a run, so once is enough:
    /// 0.1 ms a record here, paid once per record rather than on every miss.
    pub fn read(&self, layer: usize, expert: usize) -> Result<(crate::experts::direct_read::AlignedBuf, [Range<usize>; 3])> {
        let (buf, places) = self.read_unchecked(layer, expert)?;
        let bit = layer * self.n_expert + expert;
        let word = &self.checked[bit / 64];
        if word.load(std::sync::atomic::Ordering::Relaxed) & (1 << (bit % 64)) == 0 {
            self.check_crc(&buf, &places, layer, expert)?;
            word.fetch_or(1 << (bit % 64), std::sync::atomic::Ordering::Relaxed);
        }
        Ok((buf, places))
    }

    /// One read of record (layer, expert), its header checked.
    fn read_unchecked(&self, layer: usize, expert: usize) -> Result<(crate::experts::direct_read::AlignedBuf, [Range<usize>; 3])> {
        let r = self
            .record_range(layer, expert)
            .ok_or_else(|| EngineError::ExpertStore(format!("expert {expert} of layer {layer} is not in {}", self.path.display())))?;
        let (buf, places) = self.file.read_ranges(std::slice::from_ref(&r)).map_err(|e| {
            EngineError::ExpertStore(format!("reading expert {expert} of layer {layer} from {}: {e}", self.path.display()))
        })?;
        let base = places[0].start;
        let inner = self.check_record(&buf[places[0].clone()], layer, expert)?;
        Ok((buf, inner.map(|r| base + r.start..base + r.end)))
    }

    /// The payload of a record read (gate, up, down at `places`) against its header's crc32.
    fn check_crc(&self, buf: &[u8], places: &[Range<usize>; 3], layer: usize, expert: usize) -> Result<()> {
        let rec_start = places[0].start - RECORD_HEADER;
        let crc = u32::from_le_bytes(buf[rec_start + 28..rec_start + 32].try_into().expect("4 bytes"));
        if crc32fast::hash(&buf[places[0].start..places[2].end]) != crc {
            return Err(EngineError::ExpertStore(format!(
                "{}: the record of expert {expert} of layer {layer} fails its checksum",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Checks every record's header and crc32; returns the number of records.
    pub fn verify(&self) -> Result<usize> {
        let mut n = 0;
        for il in 0..self.entries.len() {
            if self.entries[il].is_none() {
                continue;
            }
            for x in 0..self.n_expert {
                let (buf, places) = self.read_unchecked(il, x)?;
                self.check_crc(&buf, &places, il, x)?;
                n += 1;
            }
        }
        Ok(n)
    }
}
