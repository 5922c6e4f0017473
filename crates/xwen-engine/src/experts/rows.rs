//! Rows of a huge lookup table streamed from disk on demand under a RAM budget — qwen4exp's
//! PLE n-gram table (`per_layer_token_embd`: ~90 GiB in bf16 at full size, of which a token
//! reads one row per head per n-gram order). Beside the routed experts it is what a model
//! larger than RAM cannot keep resident (docs/architecture.md "A streamed row's path").
//!
//! A step asks for all the rows its tokens need at once (`StreamedRows::gather`): the rows are
//! deduplicated, served from the bounded row cache (`row_cache`) where it holds them, and the
//! rest read with direct I/O (`direct_read`, as the experts are: a miss goes to the disk, and
//! no row sits in the page cache outside the budget) — sorted by offset, the 4 KiB blocks of
//! neighbouring rows merged into one extent, the extents read by a few threads at once, each
//! read's rows dequantized as it lands. A row is contiguous in the GGUF (`cols` elements in
//! whole quant blocks, `Mat::row_bytes`), so it is one read of the one or two blocks it
//! touches. The bytes a row becomes are the mapped run's bytes: the logits are the same bits.

use crate::error::{EngineError, Result};
use crate::experts::direct_read::{AlignedBuf, DirectFile, BLOCK};
use crate::experts::row_cache::{RowCache, SLOT_OVERHEAD};
use crate::weights::Mat;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use xwen_gguf::GgufFile;

/// Threads reading one step's missed rows at once (a disk serves parallel reads faster, as
/// for the experts: `StreamedExperts::experts_as_landed`).
pub const ROW_READERS: usize = 4;

/// Bytes one read call covers at most (its extents' blocks): bounds the buffers in flight.
pub const ROW_READ_CHUNK: u64 = 256 << 10;

/// A table whose rows a budgeted model streams, and how many of its rows one token reads
/// (`models::Network::row_tables`).
#[derive(Clone, Debug)]
pub struct RowTable {
    pub mat: Mat,
    pub per_token: usize,
}

impl RowTable {
    /// The blocks one row's read may span: its bytes across at most one block boundary more
    /// than they fill.
    pub fn read_span(&self) -> u64 {
        (self.mat.row_bytes() as u64).div_ceil(BLOCK) * BLOCK + BLOCK
    }
}

/// The 4 KiB blocks a row of `table` touches on average in a file whose tensor data starts at
/// `data_offset`: its bytes' blocks, plus one where a row crosses a block boundary it does not
/// fill. The rows' starts repeat their place in a block every 4096 rows at most, so the first
/// 4096 rows give the exact figure.
pub fn blocks_per_row(table: &Mat, data_offset: u64) -> f64 {
    let rb = table.row_bytes() as u64;
    let base = data_offset + table.info.offset;
    let n = table.rows.min(BLOCK as usize) as u64;
    let blocks: u64 = (0..n).map(|r| (base + (r + 1) * rb).div_ceil(BLOCK) - (base + r * rb) / BLOCK).sum();
    blocks as f64 / n.max(1) as f64
}

/// RAM the reads of one gather hold at most: each reader's buffer, the finished ones waiting to
/// be dequantized (as many), and the one being dequantized — each a chunk plus one row's blocks
/// and its alignment.
pub fn in_flight_bytes(tables: &[RowTable]) -> u64 {
    let span = tables.iter().map(RowTable::read_span).max().unwrap_or(0);
    if span == 0 {
        return 0;
    }
    (2 * ROW_READERS as u64 + 1) * (ROW_READ_CHUNK + span + BLOCK)
}

/// RAM one cached row takes: the largest table's row and the slot's overhead.
pub fn slot_bytes(tables: &[RowTable]) -> u64 {
    tables.iter().map(|t| t.mat.row_bytes() as u64).max().map_or(0, |b| b + SLOT_OVERHEAD)
}

/// Counters of the row cache since load (or the last reset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowCacheStats {
    /// Distinct rows a step asked for (a row two tokens of one step read counts once), found
    /// cached or not.
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Read calls (one extent each: neighbouring rows' blocks merged) and the bytes they read
    /// (whole 4 KiB blocks).
    pub reads: u64,
    pub bytes_read: u64,
    /// Rows a step asked for in all, duplicates included.
    pub rows_asked: u64,
    /// Bytes the cache holds now (rows and overhead), and its capacity.
    pub cached_bytes: u64,
    pub capacity_bytes: u64,
    /// Whether reads bypass the page cache.
    pub direct_io: bool,
}

impl RowCacheStats {
    pub fn hit_rate(&self) -> f64 {
        super::store::hit_rate(self.hits, self.misses)
    }
}

/// Rows of a gather that could not be read: their places in the ids asked for, and why.
pub struct RowsFailed {
    pub positions: Vec<usize>,
    pub error: EngineError,
}

pub struct StreamedRows {
    file: DirectFile,
    data_offset: u64,
    tables: Vec<Mat>,
    cache: Mutex<RowCache>,
    capacity: u64,
    reads: AtomicU64,
    bytes_read: AtomicU64,
    rows_asked: AtomicU64,
}

/// Neighbouring missed rows read together: the file's block-aligned bytes `blocks`, holding
/// missed rows `rows` (indices into the step's missed list).
struct Extent {
    blocks: Range<u64>,
    rows: Range<usize>,
}

impl StreamedRows {
    /// Streams `tables` of the GGUF at `path` (opened as `gguf`) through a row cache of
    /// `capacity` bytes (rows and overhead).
    pub fn open(path: &Path, gguf: &GgufFile, tables: &[RowTable], capacity: u64) -> Result<StreamedRows> {
        let mut file = DirectFile::open(path).map_err(|e| EngineError::ExpertStore(format!("cannot open {} to stream table rows: {e}", path.display())))?;
        file.recycle(2 * ROW_READERS + 1);
        // a row is a few hundred bytes: read it at the device's own grain, not in 4 KiB blocks
        file.use_device_grain();
        let slot = tables.iter().map(|t| t.mat.row_bytes()).max().unwrap_or(0);
        Ok(StreamedRows {
            file,
            data_offset: gguf.data_offset(),
            tables: tables.iter().map(|t| t.mat.clone()).collect(),
            cache: Mutex::new(RowCache::new(slot, capacity)),
            capacity,
            reads: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            rows_asked: AtomicU64::new(0),
        })
    }

    /// Which of the streamed tables `m` is, if it streams.
    pub fn table_of(&self, m: &Mat) -> Option<usize> {
        self.tables.iter().position(|t| t.info.name == m.info.name)
    }

    /// Whether the tensor `name` is a streamed table (never read through the mapping).
    pub fn streams(&self, name: &str) -> bool {
        self.tables.iter().any(|t| t.info.name == name)
    }

    pub fn stats(&self) -> RowCacheStats {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let (hits, misses, evictions) = cache.counters();
        RowCacheStats {
            hits,
            misses,
            evictions,
            reads: self.reads.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            rows_asked: self.rows_asked.load(Ordering::Relaxed),
            cached_bytes: cache.bytes(),
            capacity_bytes: self.capacity,
            direct_io: self.file.is_direct(),
        }
    }

    pub fn reset_stats(&self) {
        self.reads.store(0, Ordering::Relaxed);
        self.bytes_read.store(0, Ordering::Relaxed);
        self.rows_asked.store(0, Ordering::Relaxed);
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).reset_counters();
    }

    /// Rows `ids` of streamed table `t`, dequantized into `out` (row i at `out[i·cols..]`),
    /// every distinct row looked up once and the missed ones read together. The rows whose
    /// read failed are left as they were and named in the answer; an id past the table is the
    /// caller's to refuse first.
    pub fn gather(&self, t: usize, ids: &[usize], out: &mut [f32]) -> Result<Option<RowsFailed>> {
        let m = &self.tables[t];
        let (rb, cols) = (m.row_bytes(), m.cols);
        debug_assert!(out.len() >= ids.len() * cols && ids.iter().all(|&r| r < m.rows));
        self.rows_asked.fetch_add(ids.len() as u64, Ordering::Relaxed);
        let key = |row: usize| ((t as u64) << 48) | row as u64;
        let dequant = |bytes: &[u8], i: usize, out: &mut [f32]| {
            xwen_kernels::dequantize(m.ty, bytes, &mut out[i * cols..(i + 1) * cols]).map_err(|e| EngineError::State(format!("table {}: {e}", m.info.name)))
        };
        // the positions asking for each distinct row, by row (so by file offset)
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_unstable_by_key(|&i| ids[i]);
        let mut groups: Vec<(usize, Range<usize>)> = Vec::new();
        for (at, &i) in order.iter().enumerate() {
            match groups.last_mut() {
                Some((row, r)) if *row == ids[i] => r.end = at + 1,
                _ => groups.push((ids[i], at..at + 1)),
            }
        }
        let mut missed: Vec<(usize, Range<usize>)> = Vec::new();
        {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            for (row, r) in groups {
                match cache.lookup(key(row), rb) {
                    Some(bytes) => {
                        for &i in &order[r] {
                            dequant(bytes, i, out)?;
                        }
                    }
                    None => missed.push((row, r)),
                }
            }
        }
        if missed.is_empty() {
            return Ok(None);
        }
        let base = self.data_offset + m.info.offset;
        let extents = extents(&missed, base, rb as u64, self.file.grain());
        let batches = batches(&extents);
        // each landed read: its rows dequantized and offered to the cache
        let mut failed: Option<RowsFailed> = None;
        let mut land = |b: usize, got: std::io::Result<(AlignedBuf, Vec<Range<usize>>)>, out: &mut [f32]| -> Result<()> {
            let exts = &extents[batches[b].clone()];
            let (buf, places) = match got {
                Ok(g) => g,
                Err(e) => {
                    let f = failed.get_or_insert_with(|| RowsFailed {
                        positions: Vec::new(),
                        error: EngineError::ExpertStore(format!("reading rows of {} from the model file: {e}", m.info.name)),
                    });
                    for x in exts {
                        f.positions.extend(missed[x.rows.clone()].iter().flat_map(|(_, r)| order[r.clone()].iter().copied()));
                    }
                    return Ok(());
                }
            };
            self.reads.fetch_add(exts.len() as u64, Ordering::Relaxed);
            self.bytes_read.fetch_add(exts.iter().map(|x| x.blocks.end - x.blocks.start).sum(), Ordering::Relaxed);
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            for (x, place) in exts.iter().zip(&places) {
                for (row, r) in &missed[x.rows.clone()] {
                    let at = place.start + (base + *row as u64 * rb as u64 - x.blocks.start) as usize;
                    let bytes = &buf[at..at + rb];
                    for &i in &order[r.clone()] {
                        dequant(bytes, i, out)?;
                    }
                    cache.insert(key(*row), bytes);
                }
            }
            Ok(())
        };
        let read = |b: usize| {
            let ranges: Vec<Range<u64>> = extents[batches[b].clone()].iter().map(|x| x.blocks.clone()).collect();
            self.file.read_ranges(&ranges)
        };
        if batches.len() == 1 {
            land(0, read(0), out)?;
        } else {
            // readers take the batches in turn; each read is dequantized here as it lands,
            // while the readers go on (at most ROW_READERS finished reads wait)
            let next = AtomicUsize::new(0);
            std::thread::scope(|sc| -> Result<()> {
                let (tx, rx) = std::sync::mpsc::sync_channel(ROW_READERS);
                for _ in 0..ROW_READERS.min(batches.len()) {
                    let (tx, next, read, n) = (tx.clone(), &next, &read, batches.len());
                    sc.spawn(move || loop {
                        let b = next.fetch_add(1, Ordering::Relaxed);
                        if b >= n || tx.send((b, read(b))).is_err() {
                            break;
                        }
                    });
                }
                drop(tx);
                let mut result = Ok(());
                for (b, got) in rx {
                    if result.is_ok() {
                        result = land(b, got, out);
                    }
                    if result.is_err() {
                        // the readers stop at their next batch
                        next.store(batches.len(), Ordering::Relaxed);
                    }
                }
                result
            })?;
        }
        Ok(failed)
    }
}

/// The missed rows (sorted by row) as extents of whole blocks of the file's read grain
/// (`DirectFile::grain`): a row's blocks merged into the previous extent where they touch or
/// overlap it and the extent stays within a read chunk.
fn extents(missed: &[(usize, Range<usize>)], base: u64, rb: u64, grain: u64) -> Vec<Extent> {
    let mut out: Vec<Extent> = Vec::new();
    for (k, (row, _)) in missed.iter().enumerate() {
        let start = base + *row as u64 * rb;
        let blocks = start / grain * grain..(start + rb).div_ceil(grain) * grain;
        match out.last_mut() {
            Some(x) if blocks.start <= x.blocks.end && blocks.end - x.blocks.start <= ROW_READ_CHUNK => {
                x.blocks.end = x.blocks.end.max(blocks.end);
                x.rows.end = k + 1;
            }
            _ => out.push(Extent { blocks, rows: k..k + 1 }),
        }
    }
    out
}

/// Consecutive extents grouped into reads of at most `ROW_READ_CHUNK` bytes (one extent at
/// least), and as many reads as readers where the extents allow: a decode step's few rows go
/// to the disk at once rather than one after another.
fn batches(extents: &[Extent]) -> Vec<Range<usize>> {
    let total: u64 = extents.iter().map(|x| x.blocks.end - x.blocks.start).sum();
    let cap = total.div_ceil(ROW_READERS as u64).clamp(BLOCK, ROW_READ_CHUNK);
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut bytes = 0u64;
    for (k, x) in extents.iter().enumerate() {
        let len = x.blocks.end - x.blocks.start;
        match out.last_mut() {
            Some(r) if bytes + len <= cap => {
                r.end = k + 1;
                bytes += len;
            }
            _ => {
                out.push(k..k + 1);
                bytes = len;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_rows_share_a_read_and_reads_spread_over_the_readers() {
        let rb = 1000u64;
        // rows 0..=4 share blocks 0..2 (bytes 0..5000); row 4100 starts at 4_100_000
        let missed: Vec<(usize, Range<usize>)> = [0usize, 1, 2, 4, 4100, 4101].iter().map(|&r| (r, 0..1)).collect();
        let x = extents(&missed, 0, rb, BLOCK);
        assert_eq!(x.len(), 2);
        assert_eq!((x[0].blocks.clone(), x[0].rows.clone()), (0..8192, 0..4));
        assert_eq!(x[1].rows, 4..6);
        assert_eq!(x[1].blocks.start % BLOCK, 0);
        // at a 512 B grain rows 0..=2 read 3 KiB, row 4 (bytes 4000..5000) 1.5 KiB of its own,
        // rows 4100..=4101 2.5 KiB: 7 KiB where the 4 KiB grain reads 12
        let x = extents(&missed, 0, rb, 512);
        let got: Vec<_> = x.iter().map(|e| (e.blocks.clone(), e.rows.clone())).collect();
        assert_eq!(got, vec![(0..3072, 0..3), (3584..5120, 3..4), (4_099_584..4_102_144, 4..6)]);
        // one block each: a read per reader, not one read for all
        let one: Vec<(usize, Range<usize>)> = (0..8usize).map(|i| (i * 2000, 0..1)).collect();
        let b = batches(&extents(&one, 0, 8, BLOCK));
        assert_eq!(b.len(), ROW_READERS);
        assert_eq!(b.iter().map(|r| r.len()).sum::<usize>(), 8);
    }
}
