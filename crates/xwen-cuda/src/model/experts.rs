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

/// Which expert each slot of a layer's pool holds, and when each was last used.
#[derive(Clone, Debug)]
pub(crate) struct SlotMap {
    slot_of: Vec<i32>,
    expert_in: Vec<i32>,
    last_use: Vec<u64>,
}

/// One round of a layer's experts: the experts to copy up (expert, slot) before it, and each
/// routed (token, slot)'s pool slot, -1 where another round computes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Round {
    pub loads: Vec<(usize, usize)>,
    pub slot_ids: Vec<i32>,
}

impl SlotMap {
    /// Puts expert `e` into the least recently used slot (its old expert out), used at `now`;
    /// the slot. Nothing may be reading that slot (`ExpertCache::read_ahead`).
    pub(crate) fn take_lru(&mut self, e: usize, now: u64) -> usize {
        let victim = (0..self.slots()).min_by_key(|&x| (self.last_use[x], x)).unwrap_or(0);
        if let Ok(old) = usize::try_from(self.expert_in[victim]) {
            self.slot_of[old] = -1;
        }
        self.expert_in[victim] = e as i32;
        self.slot_of[e] = victim as i32;
        self.last_use[victim] = now;
        victim
    }

    /// A pool of `slots` slots for a layer of `n_expert` experts, holding experts 0.. at first.
    pub(crate) fn new(n_expert: usize, slots: usize) -> SlotMap {
        let slots = slots.min(n_expert).max(1);
        let mut slot_of = vec![-1; n_expert];
        for (s, e) in slot_of.iter_mut().enumerate().take(slots) {
            *e = s as i32;
        }
        SlotMap { slot_of, expert_in: (0..slots as i32).collect(), last_use: vec![0; slots] }
    }

    pub(crate) fn slots(&self) -> usize {
        self.expert_in.len()
    }

    /// The rounds that compute the routed `ids` (expert numbers, k a token), and the slots'
    /// new contents: the experts already held go in the first round, then the missing ones, at
    /// most `slots()` a round; a missing expert takes the least recently used slot that its
    /// round does not need. `tick` orders passes (later: more recent). Errors on an id outside
    /// the layer's experts.
    #[cfg(test)]
    pub(crate) fn plan(&mut self, ids: &[i32], tick: u64) -> std::result::Result<Vec<Round>, String> {
        self.plan_except(ids, tick, &[])
    }

    /// The routed experts not in the pool, each with the routed slots that picked it, in the
    /// order first picked. Errors on an id outside the layer's experts.
    pub(crate) fn missing(&self, ids: &[i32]) -> std::result::Result<Vec<(usize, usize)>, String> {
        let n_expert = self.slot_of.len();
        let mut uses = vec![0usize; n_expert];
        let mut out = Vec::new();
        for &e in ids {
            let Some(ix) = usize::try_from(e).ok().filter(|&x| x < n_expert) else {
                return Err(format!("the router picked expert {e} of {n_expert}"));
            };
            if self.slot_of[ix] < 0 {
                if uses[ix] == 0 {
                    out.push(ix);
                }
                uses[ix] += 1;
            }
        }
        Ok(out.into_iter().map(|e| (e, uses[e])).collect())
    }

    /// `plan`, leaving out the experts `elsewhere` lists (computed by the CPU): never copied
    /// up, their routed slots -1 in every round.
    pub(crate) fn plan_except(&mut self, ids: &[i32], tick: u64, elsewhere: &[usize]) -> std::result::Result<Vec<Round>, String> {
        let n_expert = self.slot_of.len();
        let mut seen = vec![false; n_expert];
        for &e in elsewhere.iter().filter(|&&e| e < n_expert) {
            seen[e] = true;
        }
        let (mut held, mut missing) = (Vec::new(), Vec::new());
        for &e in ids {
            let Some(ix) = usize::try_from(e).ok().filter(|&x| x < n_expert) else {
                return Err(format!("the router picked expert {e} of {n_expert}"));
            };
            if !seen[ix] {
                seen[ix] = true;
                if self.slot_of[ix] >= 0 {
                    held.push(ix);
                } else {
                    missing.push(ix);
                }
            }
        }
        let order: Vec<usize> = held.into_iter().chain(missing).collect();
        let s = self.slots();
        let mut rounds = Vec::with_capacity(order.len().div_ceil(s).max(1));
        let mut in_round = vec![false; n_expert];
        for (r, group) in order.chunks(s.max(1)).enumerate() {
            let now = tick * 1024 + r as u64 + 1;
            let mut busy = vec![false; s];
            for &e in group {
                in_round[e] = true;
                if self.slot_of[e] >= 0 {
                    busy[self.slot_of[e] as usize] = true;
                }
            }
            let mut loads = Vec::new();
            for &e in group {
                if self.slot_of[e] < 0 {
                    let victim = (0..s).filter(|&x| !busy[x]).min_by_key(|&x| (self.last_use[x], x)).expect("a round holds at most `slots` experts");
                    if let Ok(old) = usize::try_from(self.expert_in[victim]) {
                        self.slot_of[old] = -1;
                    }
                    self.expert_in[victim] = e as i32;
                    self.slot_of[e] = victim as i32;
                    busy[victim] = true;
                    loads.push((e, victim));
                }
                self.last_use[self.slot_of[e] as usize] = now;
            }
            let slot_ids = ids.iter().map(|&e| if in_round[e as usize] { self.slot_of[e as usize] } else { -1 }).collect();
            for &e in group {
                in_round[e] = false;
            }
            rounds.push(Round { loads, slot_ids });
        }
        if rounds.is_empty() {
            // every pick computed elsewhere: a round that computes nothing
            rounds.push(Round { loads: vec![], slot_ids: vec![-1; ids.len()] });
        }
        Ok(rounds)
    }
}

/// How many of a decode step's missed experts the CPU computes: the split that makes the CPU's
/// share take as long as the GPU's copies of the rest, from costs measured on earlier steps
/// (moving averages of seconds an expert on each side, and of the GPU part's time with no
/// copies).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuSplit {
    cpu_s: f64,
    copy_s: f64,
    gpu_fixed_s: f64,
}

impl Default for CpuSplit {
    fn default() -> Self {
        // first guesses (a 35B-A3B expert, ~1.8 MB: ~40 µs over PCIe 4/5, ~60 µs on 16 cores);
        // the measured costs replace them within a few steps
        CpuSplit { cpu_s: 60e-6, copy_s: 40e-6, gpu_fixed_s: 20e-6 }
    }
}

impl CpuSplit {
    const KEEP: f64 = 0.8;

    /// Misses of `m` to compute on the CPU: c with c·cpu ≈ (m − c)·copy + fixed.
    pub(crate) fn cpu_count(&self, m: usize) -> usize {
        if m == 0 {
            return 0;
        }
        let c = (m as f64 * self.copy_s + self.gpu_fixed_s) / (self.cpu_s + self.copy_s).max(1e-12);
        (c.round() as usize).min(m)
    }

    /// A step's measurement: `c` experts took `t_cpu` on the CPU while the GPU part with `g`
    /// copies took `t_gpu`.
    pub(crate) fn learn(&mut self, c: usize, g: usize, t_cpu: f64, t_gpu: f64) {
        let mix = |old: f64, new: f64| Self::KEEP * old + (1.0 - Self::KEEP) * new;
        if c > 0 {
            self.cpu_s = mix(self.cpu_s, t_cpu / c as f64);
        }
        if g > 0 {
            self.copy_s = mix(self.copy_s, ((t_gpu - self.gpu_fixed_s).max(0.0) / g as f64).max(1e-7));
        } else {
            self.gpu_fixed_s = mix(self.gpu_fixed_s, t_gpu);
        }
    }
}

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

/// A layer's experts in host RAM, gate, up and down each a stack in the device layout.
pub(super) struct HostExperts {
    mats: [HostBuf; 3],
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
    /// Per layer (None: dense) its gate's, up's and down's shapes.
    shapes: Vec<Option<[Shape; 3]>>,
    /// Threads computing missed experts on the CPU (None: every miss copied up).
    cpu: Option<xwen_kernels::Pool>,
    pub(super) read_ahead: Option<ReadAhead>,
}

/// A decode step's missed experts the CPU computes: (routed slot index, expert) pairs.
pub(super) type CpuJobs = Vec<(usize, usize)>;

impl ExpertCache {
    /// The host copies of `experts` (per layer, None for a dense one) and pools of `slots`.
    /// `read_ahead`: with read-ahead, a decode batch's rows at most (its scratch); `k` experts
    /// a token.
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
    ) -> Result<ExpertCache> {
        let shape = |m: &Mat| {
            let rb = crate::layout::device_row_bytes(m.ty, m.cols);
            (m.ty, m.rows, m.cols, rb, rb * m.rows)
        };
        let shapes: Vec<Option<[Shape; 3]>> = experts.iter().map(|ex| ex.as_ref().map(|e| [shape(&e[0]), shape(&e[1]), shape(&e[2])])).collect();
        let maps = experts.iter().map(|ex| ex.as_ref().map(|_| SlotMap::new(n_expert, slots))).collect();
        let mut pinned = true;
        let host = match store {
            Some(store) => {
                let most = shapes.iter().flatten().map(|s| s.iter().map(|m| m.4).sum::<usize>()).max().unwrap_or(0);
                let (a, b) = (gpu.host_buf(STAGED * most)?, gpu.host_buf(STAGED * most)?);
                pinned = a.pinned() && b.pinned();
                HostTier::Store { store, staging: [std::sync::Mutex::new(a), std::sync::Mutex::new(b)] }
            }
            None => {
                let mut host = Vec::with_capacity(experts.len());
                for ex in experts {
                    let Some(ex) = ex else {
                        host.push(None);
                        continue;
                    };
                    let mut one = |m: &Mat| -> Result<HostBuf> {
                        let data = crate::layout::device_layout(m.ty, file.tensor_data(&m.info));
                        let mut buf = gpu.host_buf(data.len())?;
                        buf.bytes_mut().copy_from_slice(&data);
                        pinned &= buf.pinned();
                        Ok(buf)
                    };
                    host.push(Some(HostExperts { mats: [one(&ex[0])?, one(&ex[1])?, one(&ex[2])?] }));
                }
                HostTier::Pinned(host)
            }
        };
        // the CPU path takes the types the CPU's dot products take
        let cpu_ok = experts.iter().flatten().flatten().all(|m| xwen_kernels::is_supported_weight(m.ty) && m.cols % m.ty.block_size() == 0);
        let cpu = if cpu_threads > 0 && cpu_ok { xwen_kernels::Pool::try_new(cpu_threads).ok() } else { None };
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
        Ok(ExpertCache { book: std::sync::Mutex::new(book), host, shapes, cpu, read_ahead })
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
        let loads: Vec<(usize, usize)> = map.expert_in.iter().enumerate().map(|(s, &e)| (e as usize, s)).collect();
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
            let c = book.split.cpu_count(missing.len());
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
        self.book().split.learn(c, g, t_cpu, t_gpu);
    }

    /// The CPU's outputs of `jobs` (routed slot index, expert) of layer `il`: each slot's
    /// token's row of `x` (k slots a token, `hidden` values a row) through its expert's gate,
    /// up, SwiGLU and down, on the host copy with the CPU's dot products; `hidden` values a
    /// job, back to back.
    pub(super) fn cpu_products(&self, il: usize, jobs: &[(usize, usize)], x: &[f32], k: usize) -> Result<Vec<f32>> {
        let (Some(pool), Some(Some(shape))) = (&self.cpu, self.shapes.get(il)) else {
            return Err(CudaError::Unsupported(format!("layer {il}: no CPU path for its experts")));
        };
        let [(tg, ff, hidden, _, _), (tu, _, _, _, _), (td, dn, eff, _, _)] = *shape;
        let xs: Vec<&[f32]> = jobs.iter().map(|&(slot, _)| &x[slot / k * hidden..(slot / k + 1) * hidden]).collect();
        // each job's expert's gate, up and down bytes, and whether they are in the device layout
        let experts: Vec<usize> = jobs.iter().map(|&(_, e)| e).collect();
        let handles = match &self.host {
            HostTier::Store { store, .. } => store.experts(il, &experts)?,
            HostTier::Pinned(_) => Vec::new(),
        };
        let mats: Vec<[&[u8]; 3]> = match &self.host {
            HostTier::Pinned(host) => {
                let Some(Some(h)) = host.get(il) else {
                    return Err(CudaError::Unsupported(format!("layer {il} has no host experts")));
                };
                experts.iter().map(|&e| std::array::from_fn(|i| &h.mats[i].bytes()[e * shape[i].4..(e + 1) * shape[i].4])).collect()
            }
            HostTier::Store { .. } => handles.iter().map(|h| [h.gate().data, h.up().data, h.down().data]).collect(),
        };
        let dev = matches!(self.host, HostTier::Pinned(_));
        // gate and up rows in chunks: a task a (job, chunk)
        const CHUNK: usize = 64;
        let acts_in: Vec<(Vec<u8>, Vec<u8>)> = xs
            .iter()
            .map(|x| {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                xwen_kernels::quantize_activations(tg, x, &mut a);
                xwen_kernels::quantize_activations(tu, x, &mut b);
                (a, b)
            })
            .collect();
        let mid = SharedOut::new(jobs.len() * ff);
        let chunks = ff.div_ceil(CHUNK);
        pool.run(jobs.len() * chunks, &|t| {
            let (j, c) = (t / chunks, t % chunks);
            let mut buf = Vec::new();
            for r in c * CHUNK..((c + 1) * CHUNK).min(ff) {
                let g = xwen_kernels::vec_dot(tg, hidden, row_of(mats[j][0], shape[0], dev, r, &mut buf), &acts_in[j].0);
                let u = xwen_kernels::vec_dot(tu, hidden, row_of(mats[j][1], shape[1], dev, r, &mut buf), &acts_in[j].1);
                mid.put(j * ff + r, g / (1.0 + (-g).exp()) * u);
            }
        });
        let mid = mid.into_vec();
        let acts_mid: Vec<Vec<u8>> = (0..jobs.len())
            .map(|j| {
                let mut a = Vec::new();
                xwen_kernels::quantize_activations(td, &mid[j * ff..(j + 1) * ff], &mut a);
                a
            })
            .collect();
        let out = SharedOut::new(jobs.len() * dn);
        let chunks = dn.div_ceil(CHUNK);
        pool.run(jobs.len() * chunks, &|t| {
            let (j, c) = (t / chunks, t % chunks);
            let mut buf = Vec::new();
            for r in c * CHUNK..((c + 1) * CHUNK).min(dn) {
                out.put(j * dn + r, xwen_kernels::vec_dot(td, eff, row_of(mats[j][2], shape[2], dev, r, &mut buf), &acts_mid[j]));
            }
        });
        Ok(out.into_vec())
    }

    /// Copies `loads` (expert, slot) of layer `il` into `pool` on the stream; the bytes copied.
    pub(super) fn copy_up(&self, gpu: &Gpu, il: usize, pool: &Glu, loads: &[(usize, usize)]) -> Result<u64> {
        self.copy_up_on(gpu, &gpu.stream, 0, il, pool, loads)
    }

    /// `copy_up` on `stream`, staged (from the store) through staging buffer `which`.
    fn copy_up_on(&self, gpu: &Gpu, stream: &cudarc::driver::CudaStream, which: usize, il: usize, pool: &Glu, loads: &[(usize, usize)]) -> Result<u64> {
        let Some(Some(shape)) = self.shapes.get(il) else {
            return Err(CudaError::Unsupported(format!("layer {il} has no experts")));
        };
        let dst = [&pool.gate, &pool.up, &pool.down];
        let mut bytes = 0u64;
        match &self.host {
            HostTier::Pinned(host) => {
                let Some(Some(h)) = host.get(il) else {
                    return Err(CudaError::Unsupported(format!("layer {il} has no host experts")));
                };
                for &(e, s) in loads {
                    for i in 0..3 {
                        let mb = shape[i].4;
                        gpu.write_at_on(stream, dst[i].buf.ptr + (s * mb) as u64, &h.mats[i].bytes()[e * mb..(e + 1) * mb])?;
                        bytes += mb as u64;
                    }
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
                    let mut at = 0;
                    let mut spans = Vec::with_capacity(batch.len() * 3);
                    for (h, &(_, s)) in handles.iter().zip(batch) {
                        for (i, m) in [h.gate(), h.up(), h.down()].into_iter().enumerate() {
                            let mb = shape[i].4;
                            let laid = crate::layout::device_layout(m.ty, m.data);
                            if laid.len() != mb {
                                return Err(CudaError::Unsupported(format!("layer {il}: an expert of {} bytes where the device takes {mb}", laid.len())));
                            }
                            buf[at..at + mb].copy_from_slice(&laid);
                            spans.push((at, dst[i].buf.ptr + (s * mb) as u64, mb));
                            at += mb;
                        }
                    }
                    drop(handles);
                    for (at, d, mb) in spans {
                        gpu.write_at_on(stream, d, &stage.bytes()[at..at + mb])?;
                        bytes += mb as u64;
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

/// Row `r` of a matrix (`dev`: in the device layout, else the file's) in the CPU's layout.
fn row_of<'a>(mat: &'a [u8], shape: Shape, dev: bool, r: usize, buf: &'a mut Vec<u8>) -> &'a [u8] {
    let (ty, _, cols, drb, _) = shape;
    if dev {
        cpu_row(ty, &mat[r * drb..(r + 1) * drb], buf)
    } else {
        let rb = ty.row_bytes(cols as u64).unwrap_or(0) as usize;
        &mat[r * rb..(r + 1) * rb]
    }
}

/// A device-layout row of type `ty` in the file's (the CPU's) layout: itself, or its blocks
/// unpadded into `buf` (the device pads Q8_0 and Q6_K).
fn cpu_row<'a>(ty: GgmlType, dev: &'a [u8], buf: &'a mut Vec<u8>) -> &'a [u8] {
    match ty {
        // f16 scale, 2 pad bytes, 32 quants → scale, quants
        GgmlType::Q8_0 => {
            buf.clear();
            for b in dev.chunks_exact(36) {
                buf.extend_from_slice(&b[..2]);
                buf.extend_from_slice(&b[4..]);
            }
            buf
        }
        // the file's 210-byte block, 14 pad bytes
        GgmlType::Q6_K => {
            buf.clear();
            for b in dev.chunks_exact(224) {
                buf.extend_from_slice(&b[..210]);
            }
            buf
        }
        _ => dev,
    }
}

/// Floats the pool's tasks write at disjoint indices.
struct SharedOut(Vec<std::sync::atomic::AtomicU32>);

impl SharedOut {
    fn new(n: usize) -> SharedOut {
        SharedOut((0..n).map(|_| std::sync::atomic::AtomicU32::new(0)).collect())
    }

    fn put(&self, i: usize, v: f32) {
        self.0[i].store(v.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }

    fn into_vec(self) -> Vec<f32> {
        self.0.into_iter().map(|a| f32::from_bits(a.into_inner())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_experts_are_hits_and_a_miss_takes_the_least_recently_used_slot() {
        let mut m = SlotMap::new(8, 3); // holds 0, 1, 2
        let r = m.plan(&[0, 1], 1).unwrap();
        assert_eq!(r, vec![Round { loads: vec![], slot_ids: vec![0, 1] }]);
        // 2 is the least recently used: 5 takes its slot
        let r = m.plan(&[5, 0], 2).unwrap();
        assert_eq!(r, vec![Round { loads: vec![(5, 2)], slot_ids: vec![2, 0] }]);
        // 1 is now the oldest; 0 and 5 are needed, so 7 takes slot 1
        let r = m.plan(&[0, 7, 5, 7], 3).unwrap();
        assert_eq!(r, vec![Round { loads: vec![(7, 1)], slot_ids: vec![0, 1, 2, 1] }]);
    }

    #[test]
    fn a_pass_wider_than_the_pool_runs_in_rounds_each_slot_once() {
        let mut m = SlotMap::new(16, 4);
        let ids: Vec<i32> = vec![9, 1, 2, 10, 11, 12, 13, 3, 14, 1, 9, 0];
        let rounds = m.plan(&ids, 1).unwrap();
        // distinct: 0, 1, 2, 3 held; 9..14 missing: 10 experts in rounds of 4
        assert_eq!(rounds.len(), 3);
        assert!(rounds[0].loads.is_empty(), "the held experts go first, without copies");
        let mut done = vec![false; ids.len()];
        for r in &rounds {
            let mut live = std::collections::HashMap::new();
            for (i, &s) in r.slot_ids.iter().enumerate() {
                if s >= 0 {
                    assert!(!done[i], "slot {i} computed twice");
                    done[i] = true;
                    // within a round a pool slot holds one expert
                    assert_eq!(*live.entry(s).or_insert(ids[i]), ids[i]);
                }
            }
            assert!(live.len() <= 4);
        }
        assert!(done.iter().all(|&d| d), "every routed slot computed in some round");
    }

    #[test]
    fn a_router_id_outside_the_layer_is_refused() {
        let mut m = SlotMap::new(4, 2);
        assert!(m.plan(&[0, 4], 1).is_err());
        assert!(m.plan(&[-1], 1).is_err());
    }

    #[test]
    fn experts_left_to_the_cpu_are_never_copied_and_their_slots_skipped() {
        let mut m = SlotMap::new(8, 2); // holds 0, 1
        assert_eq!(m.missing(&[0, 5, 6, 5]).unwrap(), vec![(5, 2), (6, 1)]);
        let r = m.plan_except(&[0, 5, 6, 5], 1, &[6]).unwrap();
        assert_eq!(r, vec![Round { loads: vec![(5, 1)], slot_ids: vec![0, 1, -1, 1] }]);
        // all picks elsewhere: one round that computes nothing
        let r = m.plan_except(&[7, 7], 2, &[7]).unwrap();
        assert_eq!(r, vec![Round { loads: vec![], slot_ids: vec![-1, -1] }]);
    }

    #[test]
    fn the_cpu_split_balances_the_measured_costs() {
        let mut s = CpuSplit::default();
        // a CPU twice as slow an expert as a copy, no fixed GPU cost: a third on the CPU
        for _ in 0..200 {
            s.learn(2, 0, 2.0 * 40e-6, 0.0);
            s.learn(3, 3, 3.0 * 40e-6, 3.0 * 20e-6);
        }
        assert_eq!(s.cpu_count(9), 3);
        assert_eq!(s.cpu_count(0), 0);
        // a CPU with nothing to do is never handed more than the misses
        assert!(s.cpu_count(1) <= 1);
    }

    #[test]
    fn a_pool_as_large_as_the_layer_never_copies() {
        let mut m = SlotMap::new(6, 6);
        for t in 0..5 {
            let r = m.plan(&[5, 4, 3, 2, 1, 0], t).unwrap();
            assert_eq!(r.len(), 1);
            assert!(r[0].loads.is_empty());
        }
    }
}
