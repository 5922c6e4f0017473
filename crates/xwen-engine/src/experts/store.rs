//! Where routed experts come from. MoE layers reach expert weights only through
//! [`ExpertStore`], so a disk-streaming store with a bounded cache can replace the resident one
//! without touching model code.

use crate::experts::direct_read::AlignedBuf;
use crate::error::{EngineError, Result};
use crate::weights::Mat;
use std::ops::Range;
use std::sync::Arc;
use xwen_gguf::{GgmlType, GgufFile};
use xwen_kernels::QMatrix;

/// The bytes of one expert's gate, up and down matrices: borrowed from the memory map, or an
/// owned buffer shared with a cache (`StreamedExperts` hands out the latter).
pub enum ExpertBytes<'a> {
    Borrowed([&'a [u8]; 3]),
    Shared(Arc<AlignedBuf>, [Range<usize>; 3]),
}

#[derive(Clone, Copy, Debug)]
pub struct MatShape {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
}

impl MatShape {
    /// The shapes of one expert of the (gate, up, down) stacks `mats`.
    pub fn of_expert(mats: &[Mat; 3]) -> [MatShape; 3] {
        mats.each_ref().map(|m| MatShape { ty: m.ty, rows: m.rows, cols: m.cols })
    }
}

/// The (gate, up, down) stacks of MoE layer `layer` of `layers`, checked to hold `expert`: the
/// lookup every store starts from.
pub fn expert_stacks(layers: &[Option<[Mat; 3]>], layer: usize, expert: usize) -> Result<&[Mat; 3]> {
    let mats = layers
        .get(layer)
        .and_then(|l| l.as_ref())
        .ok_or_else(|| EngineError::ExpertStore(format!("layer {layer} has no experts")))?;
    if expert >= mats[0].n_mats {
        return Err(EngineError::ExpertStore(format!("expert {expert} out of range")));
    }
    Ok(mats)
}

/// Counters of the expert cache since load (or the last reset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Experts read ahead (`ExpertStore::prefetch`) that their layer then asked for — among
    /// the hits, or misses that waited for the read ahead still in flight (`prefetch_waited`)
    /// — and read ahead but evicted unasked (a wrong guess: a read for nothing).
    pub prefetch_used: u64,
    pub prefetch_waited: u64,
    /// Experts the prefetch readers read.
    pub prefetch_reads: u64,
    pub prefetch_wasted: u64,
    /// Bytes read from the file (whole 4 KiB blocks around each expert's ranges).
    pub bytes_read: u64,
    /// Expert records read, by the layers' lookups and the prefetch readers together (a
    /// packed sidecar: one read each; the GGUF: three ranges each).
    pub reads: u64,
    /// The bytes of one expert's gate, up and down (the largest layer's): what a read needs,
    /// so `bytes_read / (reads × expert_bytes)` is the reads' overhead (block alignment).
    pub expert_bytes: u64,
    /// Bytes the cache holds now, and its capacity.
    pub cached_bytes: u64,
    pub capacity_bytes: u64,
    /// Whether reads bypass the page cache (see `direct_read`).
    pub direct_io: bool,
}

impl ExpertCacheStats {
    pub fn hit_rate(&self) -> f64 {
        hit_rate(self.hits, self.misses)
    }
}

/// hits / (hits + misses), 0 before any lookup: the expert cache's and the row cache's.
pub(crate) fn hit_rate(hits: u64, misses: u64) -> f64 {
    let n = hits + misses;
    if n == 0 {
        0.0
    } else {
        hits as f64 / n as f64
    }
}

pub struct ExpertHandle<'a> {
    pub bytes: ExpertBytes<'a>,
    pub shapes: [MatShape; 3],
}

impl ExpertHandle<'_> {
    fn mat(&self, i: usize) -> QMatrix<'_> {
        let s = self.shapes[i];
        let data = match &self.bytes {
            ExpertBytes::Borrowed(b) => b[i],
            ExpertBytes::Shared(buf, r) => &buf[r[i].clone()],
        };
        QMatrix { ty: s.ty, rows: s.rows, cols: s.cols, data }
    }
    pub fn gate(&self) -> QMatrix<'_> {
        self.mat(0)
    }
    pub fn up(&self) -> QMatrix<'_> {
        self.mat(1)
    }
    pub fn down(&self) -> QMatrix<'_> {
        self.mat(2)
    }
}

pub trait ExpertStore: Send + Sync {
    /// Expert `expert` of MoE layer `layer`.
    fn expert(&self, layer: usize, expert: usize) -> Result<ExpertHandle<'_>>;
    /// Experts `ids` of MoE layer `layer`, in order (a decode step's selection): each one's
    /// handle or the error its read met, so a batch can fail only the rows that needed a
    /// failed expert. A streaming store reads the missing ones concurrently: a disk serves
    /// parallel reads faster.
    fn experts_each(&self, layer: usize, ids: &[usize]) -> Vec<Result<ExpertHandle<'_>>> {
        ids.iter().map(|&e| self.expert(layer, e)).collect()
    }
    /// `experts_each`, failing at the first expert whose read failed.
    fn experts(&self, layer: usize, ids: &[usize]) -> Result<Vec<ExpertHandle<'_>>> {
        self.experts_each(layer, ids).into_iter().collect()
    }
    /// Experts `ids` of layer `layer`, handed to `f` as they become available — each one's
    /// index in `ids` with its handle, or the error its read met: those at hand first, then the
    /// missing ones as their reads land (several together when several landed meanwhile), so
    /// a decode step computes the cached experts while the missed ones are still being read.
    /// Every id is handed over exactly once; an error of `f` ends it (reads already running
    /// finish and are dropped).
    fn experts_as_landed<'s>(&'s self, layer: usize, ids: &[usize], f: &mut dyn FnMut(Vec<(usize, Result<ExpertHandle<'s>>)>) -> Result<()>) -> Result<()> {
        f(self.experts_each(layer, ids).into_iter().enumerate().collect())
    }
    /// Whether experts come from disk (so reading them ahead of the compute pays).
    fn streams(&self) -> bool {
        false
    }

    /// A decode step's layer `layer` chose `chosen` (the union of its rows' experts); `next`
    /// is the next MoE layer and its likely experts, most likely first (`moe::Lookahead`). A
    /// streamed store judges its last guess against `chosen` and starts reading the guesses
    /// it trusts (`experts::prefetch`) in the background, so the next layer's lookups find
    /// them read; a store that does not stream ignores it. Never fails: a failed read is the
    /// lookup's error.
    fn prefetch(&self, _layer: usize, _chosen: &[usize], _next: Option<(usize, &[usize])>) {}

    /// A decode step's layer `layer` has routed to `chosen` (the union of its rows' experts),
    /// before it looks any of them up. A streamed store drops the guesses for this layer that
    /// no reader has started and that it did not choose: nothing will ask for them this step,
    /// and reading them would spend the disk on a record the cache will most likely evict
    /// unused. A store that does not stream ignores it.
    fn routed(&self, _layer: usize, _chosen: &[usize]) {}
    /// Bytes resident in RAM that this store owns (the mapped file is not counted).
    fn resident_bytes(&self) -> u64 {
        0
    }
    /// Hits, misses and bytes read of a caching store; None for one that does not cache.
    fn cache_stats(&self) -> Option<ExpertCacheStats> {
        None
    }
    /// The expert-packed sidecar read from, if any, and why one beside the model is not.
    fn pack_status(&self) -> (Option<std::path::PathBuf>, Option<String>) {
        (None, None)
    }
    /// Reads every expert the store does not hold yet into its cache, one at a time, until
    /// `stop` says so (a streamed store whose cache holds them all runs this in the
    /// background); returns the experts read.
    fn read_in_all(&self, _stop: &dyn Fn() -> bool) -> Result<usize> {
        Ok(0)
    }
    fn reset_cache_stats(&self) {}
}

/// All experts served straight from the memory-mapped GGUF.
pub struct ResidentExperts {
    file: Arc<GgufFile>,
    /// Per layer: (gate, up, down) stacks; None for layers without experts.
    layers: Vec<Option<[Mat; 3]>>,
}

impl ResidentExperts {
    pub fn new(file: Arc<GgufFile>, layers: Vec<Option<[Mat; 3]>>) -> Self {
        ResidentExperts { file, layers }
    }
}

impl ExpertStore for ResidentExperts {
    fn expert(&self, layer: usize, expert: usize) -> Result<ExpertHandle<'_>> {
        let mats = expert_stacks(&self.layers, layer, expert)?;
        let slice = |m: &Mat| m.q_sub(&self.file, expert).data;
        Ok(ExpertHandle {
            bytes: ExpertBytes::Borrowed([slice(&mats[0]), slice(&mats[1]), slice(&mats[2])]),
            shapes: MatShape::of_expert(mats),
        })
    }
}

/// A batch of experts as read: each one's handle or its read's error.
pub type ReadBatch<'a> = Vec<Result<ExpertHandle<'a>>>;

/// `f` over experts `ids` of layer `layer` in batches of `batch` (their index range in `ids`
/// and each one's handle or read error), the next batch read while `f` runs on this one — a
/// streamed prefill overlaps the disk and the cores. Stops at `f`'s first error.
pub fn read_in_batches(store: &dyn ExpertStore, layer: usize, ids: &[usize], batch: usize, f: &mut dyn FnMut(std::ops::Range<usize>, ReadBatch<'_>) -> Result<()>) -> Result<()> {
    let batch = batch.max(1);
    let batches: Vec<std::ops::Range<usize>> = (0..ids.len()).step_by(batch).map(|s| s..(s + batch).min(ids.len())).collect();
    let read = |r: &std::ops::Range<usize>| store.experts_each(layer, &ids[r.clone()]);
    std::thread::scope(|sc| {
        let mut next = batches.first().map(|r| sc.spawn(move || read(r)));
        for (b, r) in batches.iter().enumerate() {
            let got = next.take().expect("a read per batch").join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            next = batches.get(b + 1).map(|r| sc.spawn(move || read(r)));
            // a read still running after an error finishes inside the scope; its result is dropped
            f(r.clone(), got)?;
        }
        Ok(())
    })
}
