//! The VRAM expert cache (`--vram-budget` below the whole model): each MoE layer's routed
//! experts live in a pool of `slots` device slots; all of them stay in host RAM in their device
//! layout (page-locked where the driver allows, so a copy runs at the bus's speed). A pass's
//! router picks the experts on the device; the host reads the picks (one sync a MoE layer),
//! copies the missing experts up into the least recently used slots not needed by the pass, and
//! hands the kernels slot numbers instead of expert numbers. The products are the same kernels
//! on the same bytes, so the logits are those of the model held whole.
//!
//! A decode step's missed experts may instead be computed by the CPU from the host copy while
//! the GPU copies up and computes the rest (`CpuSplit` balances the two by their measured
//! costs, layer step by layer step); those outputs are the CPU's arithmetic (llama.cpp's CPU
//! dot products on q8 activations), so they follow the model held whole within the GPU-vs-CPU
//! bound instead of bit for bit. `CudaOptions::cpu_experts = 0` copies every miss.
//!
//! The host tier is either that page-locked copy of every expert, or — where the engine
//! streams experts from disk under `--ram-budget` — the engine's expert store itself (a bounded
//! RAM cache fed from the file): a missed expert is looked up there (read from disk if the RAM
//! cache lacks it), laid out for the device in a page-locked staging buffer and copied up.
//!
//! Read-ahead (`XWEN_EXPERT_READAHEAD=1`): at a decode step's MoE layer the next MoE layer's
//! router is applied to this layer's input as well — the residual stream changes little from
//! one layer to the next — and the experts it picks that the next pool lacks are copied up on
//! a second stream while this layer computes; the next layer's work waits for those copies
//! before it touches its pool. A guess only moves bytes: the products still take the router's
//! real picks, so the bits do not depend on it.
//!
//! A pass that needs more experts of a layer than the pool holds (a long prompt, a wide decode
//! batch) runs that layer's experts in rounds of at most `slots` experts: each round's slots
//! computed, the others marked -1 (the kernels skip them), every slot's output where the
//! whole-model pass puts it, then one weighted sum.

use super::*;
use crate::gpu::HostBuf;

mod cpu;
mod slots;
mod split;

pub(crate) use slots::{Round, SlotMap};
use split::CpuSplit;

/// Counts since load: experts a pass found in VRAM, experts copied up, bytes copied, rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertCacheStats {
    pub slots: usize,
    pub n_expert: usize,
    pub hits: u64,
    pub loads: u64,
    pub bytes_up: u64,
    pub rounds: u64,
    /// Missed experts the CPU computed instead of copying them up.
    pub on_cpu: u64,
    /// Whether the host copy (or the staging buffers) is page-locked (copies at the bus's speed).
    pub pinned: bool,
    /// Whether the host tier is the engine's streamed expert store (`--ram-budget`).
    pub streamed: bool,
    /// Threads computing missed experts on the CPU (0: none).
    pub cpu_threads: usize,
    /// Experts copied up ahead of their layer on a guess, and how many of those the layer's
    /// router then picked.
    pub read_ahead: u64,
    pub read_ahead_used: u64,
    /// Decode MoE layer steps split between the CPU and the GPU, and their host time blocked
    /// on the router's picks, the CPU's products and the GPU's routed part (µs, summed).
    pub split_steps: u64,
    pub wait_us: u64,
    pub cpu_us: u64,
    pub gpu_us: u64,
}

impl ExpertCacheStats {
    pub fn hit_rate(&self) -> f64 {
        let all = self.hits + self.loads + self.on_cpu;
        if all == 0 {
            0.0
        } else {
            self.hits as f64 / all as f64
        }
    }
}

/// A layer's experts in host RAM in the device layout, an expert's gate, up and down side by
/// side as in a pool slot (`upload::slot_layout`).
pub(super) struct HostExperts {
    all: HostBuf,
}

/// Where missed experts come from.
enum HostTier {
    /// Every routed expert, page-locked, in the device layout (per layer; None: dense).
    Pinned(Vec<Option<HostExperts>>),
    /// The engine's expert store (file layout), staged through page-locked buffers: one for
    /// the model's stream, one for the read-ahead's; each reused only once its copies are done.
    Store { store: std::sync::Arc<dyn xwen_engine::ExpertStore>, staging: [std::sync::Mutex<HostBuf>; 2] },
}

/// Experts a staging buffer holds (copies go up in batches of it).
const STAGED: usize = 16;

/// Every this many MoE layer steps a side of the CPU split that its balance leaves idle gets
/// a miss anyway (`CpuSplit::cpu_count`): rare enough that a CPU truly slower than the bus
/// costs ~1% (a 35B-A3B step is 40 MoE layer steps), often enough to recover within tokens.
const PROBE_EVERY: u64 = 64;

/// A matrix of a layer's experts: type, rows, columns, device row bytes, device bytes an expert.
type Shape = (GgmlType, usize, usize, usize, usize);

/// The pools' bookkeeping (and the CPU split's costs) under one lock.
struct Book {
    maps: Vec<Option<SlotMap>>,
    tick: u64,
    stats: ExpertCacheStats,
    split: CpuSplit,
    /// Per layer: experts copied up on a guess and not yet picked; whether a read-ahead's
    /// copies into the layer's pool may still be in flight.
    guessed: Vec<Vec<usize>>,
    pending: Vec<bool>,
}

/// The CPU experts' pool of `threads`: its idle workers spin `XWEN_CPU_EXPERTS_SPIN_US` µs
/// before parking where that is set, else the pool's default (1 ms, which spans a layer step,
/// so they spin through the GPU's part of it). For A/B runs on the GPU host: on the 122B-A10B
/// class 8 CPU threads waited 233 µs a layer step for the router's picks against 59 µs at 4
/// (docs/bench.md), which spinning workers beside the thread that queues the GPU's work would
/// explain.
fn cpu_experts_pool(threads: usize) -> std::io::Result<xwen_kernels::Pool> {
    match std::env::var("XWEN_CPU_EXPERTS_SPIN_US").ok().and_then(|v| v.parse().ok()) {
        Some(us) => xwen_kernels::Pool::try_with_spin(threads, std::time::Duration::from_micros(us)),
        None => xwen_kernels::Pool::try_new(threads),
    }
}

/// The read-ahead's own stream, the guesses' scratch (a decode batch's router logits, ids and
/// weights for the next MoE layer) and an event a layer marking its copies done.
pub(super) struct ReadAhead {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    pub(super) logits: DevBuf,
    pub(super) ids: DevBuf,
    pub(super) weights: DevBuf,
    ready: Vec<cudarc::driver::CudaEvent>,
}

/// The pools' bookkeeping and the host copies of every MoE layer's experts.
pub(super) struct ExpertCache {
    book: std::sync::Mutex<Book>,
    host: HostTier,
    /// Per layer (None: dense) its gate's, up's and down's shapes, and where they lie in a
    /// slot: (offsets, slot bytes).
    shapes: Vec<Option<[Shape; 3]>>,
    slots_at: Vec<Option<([usize; 3], usize)>>,
    /// Threads computing missed experts on the CPU (None: every miss copied up).
    cpu: Option<xwen_kernels::Pool>,
    pub(super) read_ahead: Option<ReadAhead>,
    /// Page-locked room for a decode batch's router picks and input rows read back together
    /// (one sync), and for the CPU's outputs on their way up (no sync: reused only after the
    /// next MoE layer's read-back has drained the stream).
    readback: std::sync::Mutex<HostBuf>,
    ys_up: std::sync::Mutex<HostBuf>,
    pub(super) pipe: Pipe,
}

/// A decode step's missed experts copied up on a stream of their own while the model's stream
/// computes the held experts' products and the shared expert (`Pipe::split`); the GPU part's
/// timing, learned at the next read-back (whose sync has completed it) rather than waited for.
pub(super) struct Pipe {
    /// Off (`XWEN_EXPERT_OVERLAP=0`): the copies go first on the model's stream, every slot's
    /// products after them, and the host waits for the GPU part to time it (the code before).
    pub(super) on: bool,
    copies: std::sync::Arc<cudarc::driver::CudaStream>,
    copied: cudarc::driver::CudaEvent,
    /// The second round's routed slots' pool numbers (a decode batch's k a row).
    pub(super) ids: DevBuf,
    pub(super) t0: cudarc::driver::CudaEvent,
    pub(super) t1: cudarc::driver::CudaEvent,
    /// The last step's CPU experts, copies and CPU seconds, whose GPU part t0..t1 timed.
    pending: std::sync::Mutex<Option<(usize, usize, f64)>>,
}

/// Whether a decode step's copies overlap the held experts' products: `XWEN_EXPERT_OVERLAP`
/// (default on; 0 for A/B runs).
fn overlap_default() -> bool {
    std::env::var("XWEN_EXPERT_OVERLAP").map_or(true, |v| v != "0")
}

impl Pipe {
    /// Whether a decode step's `rounds` take the pipe: it is on, and they are one round that
    /// copies something up.
    pub(super) fn takes(&self, rounds: &[Round]) -> bool {
        self.on && matches!(rounds, [r] if !r.loads.is_empty())
    }

    /// `round` (a decode step's one round) as two: the experts the pool held, computed at once,
    /// and those it copies up, computed once their copies are in: each routed slot's pool
    /// number in exactly one of the two (-1 in the other), so each slot's output is the one
    /// kernel's on the same bytes.
    pub(super) fn split(round: &Round) -> (Round, Round) {
        let loaded: Vec<i32> = round.loads.iter().map(|&(_, s)| s as i32).collect();
        let (held, fresh) = round.slot_ids.iter().map(|&s| if s >= 0 && loaded.contains(&s) { (-1, s) } else { (s, -1) }).unzip();
        (Round { loads: Vec::new(), slot_ids: held }, Round { loads: round.loads.clone(), slot_ids: fresh })
    }
}

/// A decode step's missed experts the CPU computes: (routed slot index, expert) pairs.
pub(super) type CpuJobs = Vec<(usize, usize)>;

impl ExpertCache {
    /// The host copies of `experts` (per layer, None for a dense one) and pools of `slots`.
    /// `read_ahead`: with read-ahead, a decode batch's rows at most (its scratch); `k` experts
    /// a token; `rows`, `hidden`, `ubatch`: a decode batch's rows, their width, a prompt pass's
    /// tokens at most (the read-back's room).
    /// `store`: the engine's expert store as the host tier (else a page-locked copy of every
    /// expert is made from `file`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        gpu: &Gpu,
        file: &GgufFile,
        experts: &[Option<[Mat; 3]>],
        n_expert: usize,
        k: usize,
        slots: usize,
        cpu_threads: usize,
        read_ahead: Option<usize>,
        store: Option<std::sync::Arc<dyn xwen_engine::ExpertStore>>,
        (rows, hidden, ubatch): (usize, usize, usize),
    ) -> Result<ExpertCache> {
        let shape = |m: &Mat| {
            let rb = crate::layout::device_row_bytes(m.ty, m.cols);
            (m.ty, m.rows, m.cols, rb, rb * m.rows)
        };
        let shapes: Vec<Option<[Shape; 3]>> = experts.iter().map(|ex| ex.as_ref().map(|e| [shape(&e[0]), shape(&e[1]), shape(&e[2])])).collect();
        let slots_at: Vec<Option<([usize; 3], usize)>> = experts.iter().map(|ex| ex.as_ref().map(super::upload::slot_layout)).collect();
        let maps = experts.iter().map(|ex| ex.as_ref().map(|_| SlotMap::new(n_expert, slots))).collect();
        let mut pinned = true;
        let host = match store {
            Some(store) => {
                let most = slots_at.iter().flatten().map(|&(_, slot)| slot).max().unwrap_or(0);
                let (a, b) = (gpu.host_buf(STAGED * most)?, gpu.host_buf(STAGED * most)?);
                pinned = a.pinned() && b.pinned();
                HostTier::Store { store, staging: [std::sync::Mutex::new(a), std::sync::Mutex::new(b)] }
            }
            None => {
                let mut host = Vec::with_capacity(experts.len());
                for (ex, at) in experts.iter().zip(&slots_at) {
                    let (Some(ex), Some((offs, slot))) = (ex, at) else {
                        host.push(None);
                        continue;
                    };
                    let mut all = gpu.host_buf(n_expert * slot)?;
                    pinned &= all.pinned();
                    let dst = all.bytes_mut();
                    for (m, off) in ex.iter().zip(offs) {
                        let data = crate::layout::device_layout(m.ty, file.tensor_data(&m.info));
                        let mb = data.len() / n_expert.max(1);
                        for e in 0..n_expert {
                            dst[e * slot + off..e * slot + off + mb].copy_from_slice(&data[e * mb..(e + 1) * mb]);
                        }
                    }
                    host.push(Some(HostExperts { all }));
                }
                HostTier::Pinned(host)
            }
        };
        // the CPU path takes the types the CPU's dot products take
        let cpu_ok = experts.iter().flatten().flatten().all(|m| xwen_kernels::is_supported_weight(m.ty) && m.cols % m.ty.block_size() == 0);
        let cpu = if cpu_threads > 0 && cpu_ok { cpu_experts_pool(cpu_threads).ok() } else { None };
        let streamed = matches!(host, HostTier::Store { .. });
        let stats = ExpertCacheStats { slots, n_expert, pinned, streamed, cpu_threads: cpu.as_ref().map_or(0, |p| p.n_threads()), ..Default::default() };
        let read_ahead = if let Some(rows) = read_ahead {
            Some(ReadAhead {
                stream: gpu.ctx.new_stream()?,
                logits: gpu.zeros(rows * n_expert * 4)?,
                ids: gpu.zeros(rows * k * 4)?,
                weights: gpu.zeros(rows * k * 4)?,
                ready: (0..experts.len()).map(|_| gpu.timed_event()).collect::<Result<_>>()?,
            })
        } else {
            None
        };
        let n = experts.len();
        let book = Book { maps, tick: 0, stats, split: CpuSplit::default(), guessed: vec![Vec::new(); n], pending: vec![false; n] };
        // a prompt pass's picks, or a decode batch's picks and input rows
        let readback = std::sync::Mutex::new(gpu.host_buf((ubatch * k).max(rows * (k + hidden)) * 4)?);
        let ys_up = std::sync::Mutex::new(gpu.host_buf(rows * k * hidden * 4)?);
        let pipe = Pipe {
            on: overlap_default(),
            copies: gpu.ctx.new_stream()?,
            copied: gpu.timed_event()?,
            ids: gpu.zeros(rows.max(1) * k * 4)?,
            t0: gpu.timed_event()?,
            t1: gpu.timed_event()?,
            pending: std::sync::Mutex::new(None),
        };
        Ok(ExpertCache { book: std::sync::Mutex::new(book), host, shapes, slots_at, cpu, read_ahead, readback, ys_up, pipe })
    }

    /// Whether missed experts may be computed on the CPU.
    pub(super) fn has_cpu(&self) -> bool {
        self.cpu.is_some()
    }

    /// The router's `n_ids` picks at `ids`, and where `x` is given (address, values) those
    /// input rows too, read back in one sync.
    pub(super) fn read_back(&self, gpu: &Gpu, ids: u64, n_ids: usize, x: Option<(u64, usize)>) -> Result<(Vec<i32>, Vec<f32>)> {
        let mut buf = self.readback.lock().unwrap_or_else(|e| e.into_inner());
        let nx = x.map_or(0, |(_, n)| n);
        let room = buf.bytes().len();
        if 4 * (n_ids + nx) > room {
            return Err(CudaError::Unsupported(format!("a read-back of {} values into room for {}", n_ids + nx, room / 4)));
        }
        let b = buf.bytes_mut();
        let (bi, bx) = b.split_at_mut(4 * n_ids);
        gpu.read_async(bi, ids)?;
        if let Some((xp, n)) = x {
            gpu.read_async(&mut bx[..4 * n], xp)?;
        }
        let start = std::time::Instant::now();
        gpu.sync()?;
        self.book().stats.wait_us += start.elapsed().as_micros() as u64;
        self.learn_pending()?;
        let b = buf.bytes();
        let words = |r: &[u8]| r.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect::<Vec<_>>();
        let ids = words(&b[..4 * n_ids]).into_iter().map(i32::from_le_bytes).collect();
        let xs = words(&b[4 * n_ids..4 * (n_ids + nx)]).into_iter().map(f32::from_le_bytes).collect();
        Ok((ids, xs))
    }

    /// Copies the CPU's outputs `ys` (`hidden` values a job) up to their slots' rows of the
    /// device buffer at `dst` (`hidden` f32 a routed slot), on the stream, without waiting.
    pub(super) fn put_cpu_outputs(&self, gpu: &Gpu, jobs: &[(usize, usize)], ys: &[f32], hidden: usize, dst: u64) -> Result<()> {
        let mut buf = self.ys_up.lock().unwrap_or_else(|e| e.into_inner());
        if ys.len() * 4 > buf.bytes().len() {
            return Err(CudaError::Unsupported(format!("{} CPU expert outputs for room of {}", ys.len() / hidden.max(1), buf.bytes().len() / 4 / hidden.max(1))));
        }
        buf.bytes_mut()[..ys.len() * 4].copy_from_slice(as_bytes(ys));
        let b = buf.bytes();
        for (j, &(slot, _)) in jobs.iter().enumerate() {
            gpu.write_at(dst + (slot * hidden * 4) as u64, &b[j * hidden * 4..(j + 1) * hidden * 4])?;
        }
        Ok(())
    }

    /// Copies up, on the read-ahead's stream, the experts of layer `il` that `guess` (router
    /// ids of the layer, guessed a layer early) picks and its pool lacks, into its least
    /// recently used slots. Called after a sync: nothing reads layer `il`'s pool until its
    /// own pass, which waits for these copies first (`wait_read_ahead`).
    pub(super) fn read_ahead(&self, gpu: &Gpu, il: usize, pool: &Glu, guess: &[i32]) -> Result<()> {
        let Some(ra) = &self.read_ahead else { return Ok(()) };
        let mut guard = self.book();
        let book = &mut *guard;
        let Some(Some(map)) = book.maps.get_mut(il) else { return Ok(()) };
        let missing = map.missing(guess).map_err(CudaError::Unsupported)?;
        // older than the layer's own picks at this step: never evicts what it is about to use
        let now = book.tick * 1024;
        let loads: Vec<(usize, usize)> = missing.iter().take(map.slots()).map(|&(e, _)| (e, map.take_lru(e, now))).collect();
        book.guessed[il].extend(loads.iter().map(|&(e, _)| e));
        book.stats.read_ahead += loads.len() as u64;
        drop(guard);
        if loads.is_empty() {
            return Ok(());
        }
        self.copy_up_on(gpu, &ra.stream, 1, il, pool, &loads)?;
        ra.ready[il].record(&ra.stream)?;
        self.book().pending[il] = true;
        Ok(())
    }

    /// Makes the model's stream wait for layer `il`'s read-ahead copies, if any are pending.
    pub(super) fn wait_read_ahead(&self, gpu: &Gpu, il: usize) -> Result<()> {
        let Some(ra) = &self.read_ahead else { return Ok(()) };
        let mut book = self.book();
        if std::mem::take(&mut book.pending[il]) {
            gpu.stream.wait(&ra.ready[il])?;
        }
        Ok(())
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }


    /// Fills layer `il`'s pool with the experts its map starts with (0..slots).
    pub(super) fn fill(&self, gpu: &Gpu, il: usize, pool: &Glu) -> Result<()> {
        let book = self.book();
        let Some(Some(map)) = book.maps.get(il) else { return Ok(()) };
        let loads = map.contents();
        drop(book);
        self.copy_up(gpu, il, pool, &loads).map(|_| ())
    }

    /// The rounds of layer `il` for the routed `ids`, the counts updated.
    /// With `cpu` (a decode step, the CPU path on), some missed experts are left to the CPU:
    /// the routed slots they fill come back as jobs, and the rounds skip them.
    pub(super) fn plan(&self, il: usize, ids: &[i32], cpu: bool) -> Result<(Vec<Round>, CpuJobs)> {
        let mut guard = self.book();
        let book = &mut *guard;
        book.tick += 1;
        let map = book.maps.get_mut(il).and_then(|m| m.as_mut()).ok_or_else(|| CudaError::Unsupported(format!("layer {il} has no expert pool")))?;
        let mut elsewhere = Vec::new();
        if cpu && self.cpu.is_some() {
            let mut missing = map.missing(ids).map_err(CudaError::Unsupported)?;
            // the experts fewest slots picked go to the CPU (it reads an expert once a slot)
            missing.sort_by_key(|&(e, uses)| (uses, e));
            let c = book.split.cpu_count(missing.len(), book.tick % PROBE_EVERY == 0);
            elsewhere = missing[..c].iter().map(|&(e, _)| e).collect();
        }
        let rounds = map.plan_except(ids, book.tick, &elsewhere).map_err(CudaError::Unsupported)?;
        if !book.guessed[il].is_empty() {
            let used = book.guessed[il].iter().filter(|&&e| ids.contains(&(e as i32))).count();
            book.stats.read_ahead_used += used as u64;
            book.guessed[il].clear();
        }
        let jobs: CpuJobs = ids.iter().enumerate().filter(|(_, &e)| elsewhere.contains(&(e as usize))).map(|(i, &e)| (i, e as usize)).collect();
        let stats = &mut book.stats;
        let distinct = {
            let mut v: Vec<i32> = ids.to_vec();
            v.sort_unstable();
            v.dedup();
            v.len() as u64
        };
        let loads: u64 = rounds.iter().map(|r| r.loads.len() as u64).sum();
        stats.loads += loads;
        stats.on_cpu += elsewhere.len() as u64;
        stats.hits += distinct - loads - elsewhere.len() as u64;
        stats.rounds += rounds.len() as u64;
        Ok((rounds, jobs))
    }

    /// A step's costs for the CPU split: `c` experts on the CPU in `t_cpu` s, the GPU part
    /// with `g` copies in `t_gpu` s.
    pub(super) fn learn(&self, c: usize, g: usize, t_cpu: f64, t_gpu: f64) {
        let mut book = self.book();
        book.split.learn(c, g, t_cpu, t_gpu);
        book.stats.split_steps += 1;
        book.stats.cpu_us += (t_cpu * 1e6) as u64;
        book.stats.gpu_us += (t_gpu * 1e6) as u64;
    }

    /// A step's costs whose GPU part (`pipe.t0`..`t1`, recorded on the model's stream) is
    /// timed later: learned by the next read-back, once its sync has completed them.
    pub(super) fn learn_later(&self, c: usize, g: usize, t_cpu: f64) {
        *self.pipe.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some((c, g, t_cpu));
    }

    /// The pending step's costs learned (its events complete: the stream was just synced).
    fn learn_pending(&self) -> Result<()> {
        let taken = self.pipe.pending.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((c, g, t_cpu)) = taken {
            let t_gpu = self.pipe.t0.elapsed_ms(&self.pipe.t1)? as f64 / 1e3;
            self.learn(c, g, t_cpu, t_gpu);
        }
        Ok(())
    }

    /// `loads` of layer `il` copied up on the pipe's own stream; the model's stream waits for
    /// them from here on (what it enqueues next may read them).
    pub(super) fn copy_up_beside(&self, gpu: &Gpu, il: usize, pool: &Glu, loads: &[(usize, usize)]) -> Result<()> {
        self.copy_up_on(gpu, &self.pipe.copies, 0, il, pool, loads)?;
        self.pipe.copied.record(&self.pipe.copies)?;
        Ok(())
    }

    /// The model's stream made to wait for `copy_up_beside`'s copies.
    pub(super) fn wait_copies(&self, gpu: &Gpu) -> Result<()> {
        gpu.stream.wait(&self.pipe.copied)?;
        Ok(())
    }


    /// Copies `loads` (expert, slot) of layer `il` into `pool` on the stream; the bytes copied.
    pub(super) fn copy_up(&self, gpu: &Gpu, il: usize, pool: &Glu, loads: &[(usize, usize)]) -> Result<u64> {
        self.copy_up_on(gpu, &gpu.stream, 0, il, pool, loads)
    }

    /// `copy_up` on `stream`, staged (from the store) through staging buffer `which`: one
    /// copy an expert (its three matrices lie side by side in a slot).
    fn copy_up_on(&self, gpu: &Gpu, stream: &cudarc::driver::CudaStream, which: usize, il: usize, pool: &Glu, loads: &[(usize, usize)]) -> Result<u64> {
        let (Some(Some(shape)), Some(Some((offs, slot)))) = (self.shapes.get(il), self.slots_at.get(il)) else {
            return Err(CudaError::Unsupported(format!("layer {il} has no experts")));
        };
        let (offs, slot) = (*offs, *slot);
        // the pool's first matrix starts its slot
        let base = pool.gate.ptr - offs[0] as u64;
        let mut bytes = 0u64;
        match &self.host {
            HostTier::Pinned(host) => {
                let Some(Some(h)) = host.get(il) else {
                    return Err(CudaError::Unsupported(format!("layer {il} has no host experts")));
                };
                for &(e, s) in loads {
                    gpu.write_at_on(stream, base + (s * slot) as u64, &h.all.bytes()[e * slot..(e + 1) * slot])?;
                    bytes += slot as u64;
                }
            }
            HostTier::Store { store, staging } => {
                let mut stage = staging[which].lock().unwrap_or_else(|e| e.into_inner());
                for batch in loads.chunks(STAGED) {
                    // the buffer's last copies are done before it is written again
                    stream.synchronize()?;
                    let ids: Vec<usize> = batch.iter().map(|&(e, _)| e).collect();
                    let handles = store.experts(il, &ids)?;
                    let buf = stage.bytes_mut();
                    for (j, h) in handles.iter().enumerate() {
                        for (i, m) in [h.gate(), h.up(), h.down()].into_iter().enumerate() {
                            let mb = shape[i].4;
                            let laid = crate::layout::device_layout(m.ty, m.data);
                            if laid.len() != mb {
                                return Err(CudaError::Unsupported(format!("layer {il}: an expert of {} bytes where the device takes {mb}", laid.len())));
                            }
                            buf[j * slot + offs[i]..j * slot + offs[i] + mb].copy_from_slice(&laid);
                        }
                    }
                    drop(handles);
                    for (j, &(_, s)) in batch.iter().enumerate() {
                        gpu.write_at_on(stream, base + (s * slot) as u64, &stage.bytes()[j * slot..(j + 1) * slot])?;
                        bytes += slot as u64;
                    }
                }
            }
        }
        self.book().stats.bytes_up += bytes;
        Ok(bytes)
    }

    pub(super) fn stats(&self) -> ExpertCacheStats {
        self.book().stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_split_puts_each_routed_slot_in_exactly_one_half() {
        // slots 0..4 of a pool; experts copied into slots 2 and 5; -1: the CPU's or another round's
        let round = Round { loads: vec![(17, 2), (40, 5)], slot_ids: vec![0, 2, -1, 5, 3, 2, 1, -1] };
        let (held, fresh) = Pipe::split(&round);
        assert_eq!(held, Round { loads: vec![], slot_ids: vec![0, -1, -1, -1, 3, -1, 1, -1] });
        assert_eq!(fresh, Round { loads: vec![(17, 2), (40, 5)], slot_ids: vec![-1, 2, -1, 5, -1, 2, -1, -1] });
        for (i, &s) in round.slot_ids.iter().enumerate() {
            let (a, b) = (held.slot_ids[i], fresh.slot_ids[i]);
            assert!(a == -1 || b == -1, "slot {i} in both halves");
            assert_eq!(a.max(b), s, "slot {i}");
        }
    }
}
