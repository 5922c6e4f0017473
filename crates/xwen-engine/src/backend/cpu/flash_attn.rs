//! Flash attention in the float order of llama.cpp's CPU `ggml_compute_forward_flash_attn_ext`
//! (ggml-cpu/ops.cpp, b11434; AVX2 build), over an f32 or f16 KV cache. One query head's row
//! at a time; which of ggml's three paths a row takes is ggml's rule:
//! - **tiled** (`flash_attn_ext_tiled`): a ubatch of ≥ 64 query rows with K and V of one type
//!   (f32 or f16): KV in tiles of 64, scores as f32 FMA chains over the head dim against K
//!   widened to f32 (`simd_gemm`), the tile's softmax through ggml's vector expf
//!   (`ggml_vec_soft_max_f32`, f64 sum), V accumulated in f32 FMA chains over the tile;
//! - **split-KV** (decode: one query row, ≥ 512 KV cells, K and V of one type): the KV cells
//!   split into one chunk per thread, each chunk run as below into (M, S, VKQ) partials, then
//!   merged in chunk order (`ggml_flash_attn_ext_reduce_partials`) — so the bits depend on the
//!   thread count, as llama.cpp's do;
//! - **one chunk** otherwise: Q rounded to the K type's dot type (f16 for an f16 cache),
//!   `ggml_vec_dot_f16` / `_f32` per position (4 × 8 lanes, ggml's reduction), an online softmax
//!   with libm's expf, and for an f16 V an accumulator kept in f16 (`ggml_vec_mad_f16`,
//!   `ggml_vec_scale_f16`: every update rounded to f16).
//!
//! llama.cpp's KV view is `n_kv` cells (the used cells padded to 256, at most the context);
//! cells past a row's causal limit are masked with −inf and skipped (one chunk) or weigh 0
//! (tiled). GCC contracts `S*ms + vs` and the partial merge's `a*b + c*d` to fused
//! multiply-adds on the first product, which is reproduced here.
//!
//! AVX-512 builds of llama.cpp use 16-lane vectors in `ggml_vec_dot_f16`: reproduced where the
//! AVX-512 kernels are active (`dispatch::active`; the parity suite caps them to AVX2).

use xwen_kernels::half::{f16_to_f32, f32_to_f16};

pub use crate::state::kv::KvRows;

/// The Q8_0 bytes of elements `at..at + n` (both multiples of 32).
fn q8_slice(r: &[u8], at: usize, n: usize) -> &[u8] {
    &r[at / 32 * 34..(at + n) / 32 * 34]
}

/// ggml's tile sizes (ggml-cpu/common.h GGML_FA_TILE_Q / _KV).
const TILE_Q: usize = 64;
const TILE_KV: usize = 64;
/// A decode row over at least this many KV cells takes the split-KV path.
const SPLIT_MIN_KV: usize = 512;

/// How ggml runs the rows of one ubatch (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    OneChunk,
    Tiled,
    Split { threads: usize },
}

/// The path of a ubatch of `n_rows` query rows over `n_kv` cells.
pub fn path(n_rows: usize, n_kv: usize, same_type: bool, threads: usize) -> Path {
    if same_type && n_rows == 1 && n_kv >= SPLIT_MIN_KV {
        Path::Split { threads: threads.max(1) }
    } else if same_type && n_rows >= TILE_Q {
        Path::Tiled
    } else {
        Path::OneChunk
    }
}

/// llama.cpp's `n_kv` after a ubatch that leaves `used` cells filled: padded to 256, at most the
/// context's cells (`n_ctx`, itself padded to 256).
pub fn n_kv(used: usize, n_ctx: usize) -> usize {
    let cells = n_ctx.next_multiple_of(256).max(256);
    used.next_multiple_of(256).max(256).min(cells)
}

/// Where one head's keys and values sit in the cache rows: K row stride and this head's offset,
/// V's the same (they differ for MLA, whose V is the first `kv_lora_rank` of a longer K row).
/// The key length is the query's; the value length is the output's.
#[derive(Clone, Copy, Debug)]
pub struct HeadAt {
    pub k_width: usize,
    pub k_off: usize,
    pub v_width: usize,
    pub v_off: usize,
}

impl HeadAt {
    /// K and V of one shape: row stride `width`, head offset `off`.
    pub fn same(width: usize, off: usize) -> Self {
        HeadAt { k_width: width, k_off: off, v_width: width, v_off: off }
    }
}

/// One query head's attention: `q` (key length), keys and values of positions `0..visible` at
/// `k`/`v` (laid out as `at` says); writes `out` (value length).
#[allow(clippy::too_many_arguments)]
pub fn attend(q: &[f32], k: KvRows, v: KvRows, at: HeadAt, visible: usize, n_kv: usize, scale: f32, path: Path, out: &mut [f32]) {
    attend_rows(&[q], &[visible], k, v, at, n_kv, scale, path, &mut [out]);
}

/// `attend` for several queries of one KV head (`at`: the query heads of a GQA group, the rows
/// of one sequence's span), each seeing its own number of positions (`visible[i]`) and sharing
/// the path and `n_kv`: every query's result is the one it gets alone — the same positions in
/// the same order, the same blocks, the same split — while on the one-chunk and split-KV paths
/// each cached K and V row is read once for all of them.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(qs: &[&[f32]], visible: &[usize], k: KvRows, v: KvRows, at: HeadAt, n_kv: usize, scale: f32, path: Path, outs: &mut [&mut [f32]]) {
    debug_assert_eq!(qs.len(), outs.len());
    debug_assert_eq!(qs.len(), visible.len());
    let Some(hd) = outs.first().map(|o| o.len()) else { return };
    match path {
        Path::Tiled => {
            for ((q, out), &vis) in qs.iter().zip(outs.iter_mut()).zip(visible) {
                tiled(q, k, v, at, vis, n_kv, scale, out);
            }
        }
        Path::OneChunk => {
            let ends: Vec<usize> = visible.iter().map(|&vis| vis.min(n_kv)).collect();
            let ps = one_chunk_heads(qs, k, v, at, hd, 0, &ends, scale);
            for (p, out) in ps.iter().zip(outs.iter_mut()) {
                let inv = if p.s == 0.0 { 0.0 } else { 1.0 / p.s };
                for (o, &x) in out.iter_mut().zip(&p.vkq) {
                    *o = x * inv;
                }
            }
        }
        Path::Split { threads } => {
            let chunk = n_kv.div_ceil(threads);
            let mut m = vec![f32::NEG_INFINITY; qs.len()];
            let mut s = vec![0.0f32; qs.len()];
            let mut acc = vec![vec![0.0f32; hd]; qs.len()];
            for ith in 0..threads {
                let start = ith * chunk;
                if start >= n_kv {
                    continue;
                }
                let end = (start + chunk).min(n_kv);
                // each query's part of this chunk: start..end within what it sees (empty where
                // it sees none of it)
                let ends: Vec<usize> = visible.iter().map(|&vis| if start < vis { end.min(vis) } else { start }).collect();
                let ps = one_chunk_heads(qs, k, v, at, hd, start, &ends, scale);
                for (g, p) in ps.iter().enumerate() {
                    if p.s == 0.0 {
                        continue;
                    }
                    let m_new = m[g].max(p.m);
                    let (so, sn) = ((m[g] - m_new).exp(), (p.m - m_new).exp());
                    for (a, &c) in acc[g].iter_mut().zip(&p.vkq) {
                        *a = a.mul_add(so, c * sn);
                    }
                    s[g] = s[g].mul_add(so, p.s * sn);
                    m[g] = m_new;
                }
            }
            for ((out, acc), &s) in outs.iter_mut().zip(&acc).zip(&s) {
                let inv = if s != 0.0 { 1.0 / s } else { 1.0 };
                for (o, &x) in out.iter_mut().zip(acc) {
                    *o = x * inv;
                }
            }
        }
    }
}

/// `attend` for one query that sees only the positions p < keep.len() with keep[p] (QSA's
/// selection added to the causal mask): the other cells are −inf in the mask, which ggml's
/// one-chunk path skips, its tiled path weighs 0 (a tile all masked for the row is skipped)
/// and its split-KV path skips too (a chunk with nothing left adds nothing).
#[allow(clippy::too_many_arguments)]
pub fn attend_masked(q: &[f32], k: KvRows, v: KvRows, at: HeadAt, keep: &[bool], n_kv: usize, scale: f32, path: Path, out: &mut [f32]) {
    let visible = keep.len();
    let dv = out.len();
    let q16: Vec<u16> = match k {
        KvRows::F16(_) => q.iter().map(|&x| f32_to_f16(x)).collect(),
        _ => Vec::new(),
    };
    let kept = |r: std::ops::Range<usize>| r.filter(|&p| keep[p]);
    match path {
        Path::Tiled => tiled_rows(&[q], k, v, at, visible, n_kv, scale, Some(&[keep]), &mut [out]),
        Path::OneChunk => {
            let p = one_chunk_each(q, &q16, k, v, at, dv, kept(0..visible.min(n_kv)), scale, dot_f16);
            let inv = if p.s == 0.0 { 0.0 } else { 1.0 / p.s };
            for (o, &x) in out.iter_mut().zip(&p.vkq) {
                *o = x * inv;
            }
        }
        Path::Split { threads } => {
            let chunk = n_kv.div_ceil(threads);
            let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
            let mut acc = vec![0.0f32; dv];
            for start in (0..n_kv).step_by(chunk.max(1)) {
                let end = (start + chunk).min(n_kv).min(visible).max(start);
                let p = one_chunk_each(q, &q16, k, v, at, dv, kept(start..end), scale, dot_f16);
                if p.s == 0.0 {
                    continue;
                }
                let m_new = m.max(p.m);
                let (so, sn) = ((m - m_new).exp(), (p.m - m_new).exp());
                for (a, &c) in acc.iter_mut().zip(&p.vkq) {
                    *a = a.mul_add(so, c * sn);
                }
                s = s.mul_add(so, p.s * sn);
                m = m_new;
            }
            let inv = if s != 0.0 { 1.0 / s } else { 1.0 };
            for (o, &x) in out.iter_mut().zip(&acc) {
                *o = x * inv;
            }
        }
    }
}

/// Online-softmax state of one row over a range of positions.
struct Partial {
    m: f32,
    s: f32,
    vkq: Vec<f32>,
}

/// ggml's `flash_attn_ext_f16_one_chunk` for one row of each query in `qs` (sharing a KV
/// head), query i over positions `start..ends[i]` (all unmasked; empty where ends[i] ≤ start);
/// `dv` is the value length.
#[allow(clippy::too_many_arguments)]
fn one_chunk_heads(qs: &[&[f32]], k: KvRows, v: KvRows, at: HeadAt, dv: usize, start: usize, ends: &[usize], scale: f32) -> Vec<Partial> {
    let end = ends.iter().copied().max().unwrap_or(start).max(start);
    let dk = qs.first().map_or(0, |q| q.len());
    // Q in the K type's dot type
    let q16s: Vec<Vec<u16>> = qs
        .iter()
        .map(|q| match k {
            KvRows::F16(_) => q.iter().map(|&x| f32_to_f16(x)).collect(),
            _ => Vec::new(),
        })
        .collect();
    #[cfg(target_arch = "x86_64")]
    if let (KvRows::F16(kk), KvRows::F16(vv)) = (k, v) {
        if simd() && dk.is_multiple_of(64) && dv.is_multiple_of(16) && end > start {
            assert!((end - 1) * at.k_width + at.k_off + dk <= kk.len() && (end - 1) * at.v_width + at.v_off + dv <= vv.len());
            let mut vkq16 = vec![vec![0u16; dv]; qs.len()];
            let mut ms = vec![(0.0f32, 0.0f32); qs.len()];
            // SAFETY: the features were detected; the rows read lie inside the cache (above).
            unsafe {
                if avx512() {
                    x86::one_chunk_f16_512(&q16s, kk, vv, at, start, ends, scale, &mut vkq16, &mut ms)
                } else {
                    x86::one_chunk_f16_256(&q16s, kk, vv, at, start, ends, scale, &mut vkq16, &mut ms)
                }
            };
            return ms.iter().zip(&vkq16).map(|(&(m, s), acc)| Partial { m, s, vkq: acc.iter().map(|&h| f16_to_f32(h)).collect() }).collect();
        }
    }
    qs.iter().zip(&q16s).zip(ends).map(|((q, q16), &e)| one_chunk_each(q, q16, k, v, at, dv, start..e.max(start), scale, dot_f16)).collect()
}

/// `one_chunk` position by position through the dispatching helpers (`dot16` for an f16 K):
/// every cache type and shape, and the reference the f16 fast path is tested against. The
/// positions are the unmasked ones in order (ggml skips a −inf mask before the dot product).
#[allow(clippy::too_many_arguments)]
fn one_chunk_each(q: &[f32], q16: &[u16], k: KvRows, v: KvRows, at: HeadAt, dv: usize, range: impl Iterator<Item = usize>, scale: f32, dot16: fn(&[u16], &[u16]) -> f32) -> Partial {
    let dk = q.len();
    let mut q8 = Vec::new();
    if let KvRows::Q8_0(_) = k {
        xwen_kernels::quantize_activations(xwen_kernels::GgmlType::Q8_0, q, &mut q8);
    }
    let mut v32 = vec![0.0f32; dv];
    let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
    let mut vkq32 = vec![0.0f32; dv];
    let mut vkq16 = vec![0u16; dv];
    for p in range {
        let (ka, va) = (p * at.k_width + at.k_off, p * at.v_width + at.v_off);
        let mut sc = match k {
            KvRows::F16(kk) => dot16(&kk[ka..ka + dk], q16),
            KvRows::F32(kk) => dot_f32(&kk[ka..ka + dk], q),
            KvRows::Q8_0(kk) => xwen_kernels::vec_dot(xwen_kernels::GgmlType::Q8_0, dk, q8_slice(kk, ka, dk), &q8),
        };
        sc *= scale;
        sc += 0.0; // the mask's 0
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if sc > m {
            let m_old = m;
            m = sc;
            ms = (m_old - m).exp();
            match v {
                KvRows::F16(_) => scale_f16(&mut vkq16, ms),
                _ => vkq32.iter_mut().for_each(|x| *x *= ms),
            }
        } else {
            vs = (sc - m).exp();
        }
        match v {
            KvRows::F16(vv) => mad_f16(&mut vkq16, &vv[va..va + dv], vs),
            KvRows::F32(vv) => {
                for (y, &x) in vkq32.iter_mut().zip(&vv[va..va + dv]) {
                    *y = x.mul_add(vs, *y);
                }
            }
            KvRows::Q8_0(vv) => {
                // ggml: dequantize the row (to_float), then ggml_vec_mad_f32
                dequant_q8_0(q8_slice(vv, va, dv), &mut v32);
                for (y, &x) in vkq32.iter_mut().zip(&v32) {
                    *y = x.mul_add(vs, *y);
                }
            }
        }
        s = s.mul_add(ms, vs);
    }
    if let KvRows::F16(_) = v {
        for (d, &h) in vkq32.iter_mut().zip(&vkq16) {
            *d = f16_to_f32(h);
        }
    }
    Partial { m, s, vkq: vkq32 }
}

/// ggml's `dequantize_row_q8_0`: x = d · q.
fn dequant_q8_0(blocks: &[u8], out: &mut [f32]) {
    for (b, o) in blocks.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
        let d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        for (x, &q) in o.iter_mut().zip(&b[2..34]) {
            *x = q as i8 as f32 * d;
        }
    }
}

/// ggml's `flash_attn_ext_tiled` for one row: positions `0..visible` in tiles of 64.
#[allow(clippy::too_many_arguments)]
fn tiled(q: &[f32], k: KvRows, v: KvRows, at: HeadAt, visible: usize, n_kv: usize, scale: f32, out: &mut [f32]) {
    let mut one = [out];
    tiled_rows(&[q], k, v, at, visible, n_kv, scale, None, &mut one);
}

/// The tiled path for consecutive query rows of one head: row i sees positions
/// `0..visible0 + i`, or with `keep` only those p with keep[i][p] (a sparse selection added to
/// the causal mask). Each KV tile is widened (and K transposed) once for all rows, as ggml
/// does per query tile; every row keeps its own online-softmax state, so a row's bits do not
/// depend on the rows beside it.
#[allow(clippy::too_many_arguments)]
pub fn tiled_rows(qs: &[&[f32]], k: KvRows, v: KvRows, at: HeadAt, visible0: usize, n_kv: usize, scale: f32, keep: Option<&[&[bool]]>, outs: &mut [&mut [f32]]) {
    let Some(dk) = qs.first().map(|q| q.len()) else { return };
    let hd = outs.first().map_or(dk, |o| o.len());
    let n = qs.len();
    let mut m = vec![f32::NEG_INFINITY; n];
    let mut s = vec![0.0f32; n];
    let mut vkq = vec![0.0f32; n * hd];
    let mut kq = [0.0f32; TILE_KV];
    // the tile's K transposed ([dk][64], zero past the valid cells) and V ([tk][dv]), in f32
    let mut kt = vec![0.0f32; dk * TILE_KV];
    let mut vt = vec![0.0f32; TILE_KV * hd];
    let widen = |rows: KvRows, at: usize, dst: &mut [f32]| match rows {
        KvRows::F32(r) => dst.copy_from_slice(&r[at..at + dst.len()]),
        KvRows::F16(r) => {
            let len = dst.len();
            for (d, &h) in dst.iter_mut().zip(&r[at..at + len]) {
                *d = f16_to_f32(h);
            }
        }
        // not a path ggml takes for Q8_0 (`path`); widened for completeness
        KvRows::Q8_0(r) => dequant_q8_0(q8_slice(r, at, dst.len()), dst),
    };
    let mut krow = vec![0.0f32; dk];
    let last_visible = visible0 + n - 1;
    let mut c = 0;
    while c < n_kv.min(last_visible) {
        let tile_valid = (last_visible - c).min(TILE_KV);
        for tk in 0..TILE_KV {
            if tk < tile_valid {
                widen(k, (c + tk) * at.k_width + at.k_off, &mut krow);
                for (d, &x) in krow.iter().enumerate() {
                    kt[d * TILE_KV + tk] = x;
                }
                widen(v, (c + tk) * at.v_width + at.v_off, &mut vt[tk * hd..(tk + 1) * hd]);
            } else {
                for d in 0..dk {
                    kt[d * TILE_KV + tk] = 0.0;
                }
            }
        }
        for (i, q) in qs.iter().enumerate() {
            let visible = visible0 + i;
            if c >= visible {
                continue; // every cell of the tile is masked for this row: no change
            }
            let valid = (visible - c).min(TILE_KV);
            tile_scores(q, &kt, &mut kq);
            let kept = |tk: usize| keep.is_none_or(|kp| kp[i].get(c + tk).copied().unwrap_or(false));
            for (tk, x) in kq.iter_mut().enumerate() {
                // scale, then the mask: 0 for the row's cells, −inf past them
                *x = if tk < valid && kept(tk) { *x * scale + 0.0 } else { f32::NEG_INFINITY };
            }
            let tile_max = kq.iter().fold(f32::NEG_INFINITY, |a, &b| if a > b { a } else { b });
            if tile_max == f32::NEG_INFINITY {
                continue; // ggml skips a row whose cells of the tile are all masked
            }
            let m_new = m[i].max(tile_max);
            let acc = &mut vkq[i * hd..(i + 1) * hd];
            if m_new > m[i] {
                let ms = (m[i] - m_new).exp();
                acc.iter_mut().for_each(|x| *x *= ms);
                s[i] *= ms;
            }
            m[i] = m_new;
            let sum = xwen_kernels::f32ops::soft_max_sum(&mut kq[..valid], m_new, TILE_KV);
            s[i] = (s[i] as f64 + sum) as f32;
            // the masked cells weigh exp(−inf) = 0: fma(v, 0, a) = a, so they are left out
            tile_values(&kq[..valid], &vt[..valid * hd], acc);
        }
        c += TILE_KV;
    }
    for (i, out) in outs.iter_mut().enumerate() {
        let inv = if s[i] == 0.0 { 0.0 } else { 1.0 / s[i] };
        for (o, &x) in out.iter_mut().zip(&vkq[i * hd..(i + 1) * hd]) {
            *o = x * inv;
        }
    }
}

/// Whether the AVX-512 forms run (an AVX-512 build's dot order; the tile products' element-wise
/// FMA chains, the same bits at any width): where the AVX-512 kernels are the active set
/// (`--isa` caps it).
fn avx512() -> bool {
    xwen_kernels::dispatch::active() == xwen_kernels::dispatch::Isa::Avx512
}

/// Whether the AVX2 + FMA + F16C versions below may run (the same bits as the portable ones,
/// which are the specification).
fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static OK: OnceLock<bool> = OnceLock::new();
        *OK.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `ggml_vec_dot_f16` (AVX2 + F16C): 4 accumulators × 8 lanes over steps of 32, FMA, ggml's
/// reduction, the tail summed in f64; with the AVX-512 kernels active, an AVX-512 build's
/// (4 × 16 lanes over steps of 64).
fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        if avx512() {
            // SAFETY: u16 slices read as their little-endian bytes (x86), same lengths.
            let (xb, yb) = unsafe { (std::slice::from_raw_parts(x.as_ptr() as *const u8, 2 * x.len()), std::slice::from_raw_parts(y.as_ptr() as *const u8, 2 * y.len())) };
            return xwen_kernels::simd::avx512::dot_f16_vec_dot(x.len(), xb, yb);
        }
        // SAFETY: the features were detected; the slices are of equal length.
        return unsafe { x86::dot_f16(x, y) };
    }
    dot_f16_portable(x, y)
}

fn dot_f16_portable(x: &[u16], y: &[u16]) -> f32 {
    lanes_dot(x.len(), |i| f16_to_f32(x[i]), |i| f16_to_f32(y[i]))
}

/// `ggml_vec_dot_f32` (AVX2 + FMA), the same shape with a float tail.
fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let np = n & !31;
    let mut sum = lanes_dot(np, |i| x[i], |i| y[i]);
    for i in np..n {
        sum = x[i].mul_add(y[i], sum);
    }
    sum
}

/// The 4 × 8-lane FMA dot product of ggml's AVX2 vec_dot and its `GGML_F32x8_REDUCE`; the part
/// past the last full step of 32 is added in f64 (ggml_vec_dot_f16's tail).
#[inline(always)]
fn lanes_dot(n: usize, x: impl Fn(usize) -> f32, y: impl Fn(usize) -> f32) -> f32 {
    let np = n & !31;
    let mut acc = [[0.0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let e = i + 8 * j + l;
                *lane = x(e).mul_add(y(e), *lane);
            }
        }
    }
    // x0 += x2, x1 += x3, x0 += x1; then (lo + hi), hadd, hadd
    let r: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let t: [f32; 4] = std::array::from_fn(|l| r[l] + r[l + 4]);
    let mut sum = ((t[0] + t[1]) + (t[2] + t[3])) as f64;
    for i in np..n {
        sum += (x(i) * y(i)) as f64;
    }
    sum as f32
}

/// `ggml_vec_mad_f16`: y = f16(fma(x, v, y)) per element.
fn mad_f16(y: &mut [u16], x: &[u16], v: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the features were detected.
        return unsafe { x86::mad_f16(y, x, v) };
    }
    mad_f16_portable(y, x, v)
}

fn mad_f16_portable(y: &mut [u16], x: &[u16], v: f32) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = f32_to_f16(f16_to_f32(xi).mul_add(v, f16_to_f32(*yi)));
    }
}

/// `ggml_vec_scale_f16`: y = f16(y · v) per element.
fn scale_f16(y: &mut [u16], v: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the features were detected.
        return unsafe { x86::scale_f16(y, v) };
    }
    for yi in y.iter_mut() {
        *yi = f32_to_f16(f16_to_f32(*yi) * v);
    }
}

/// The tiled path's two products with hardware FMA: scores of `valid` cells as FMA chains over
/// the head dim (`kt` is the tile's K transposed, [dk][64]), then V accumulated over the cells.
fn tile_scores(q: &[f32], kt: &[f32], kq: &mut [f32; TILE_KV]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: AVX-512F detected; kt holds q.len() rows of TILE_KV.
        return unsafe { x86::tile_scores512(q, kt, kq) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the features were detected.
        return unsafe { x86::tile_scores(q, kt, kq) };
    }
    tile_scores_body(q, kt, kq)
}

#[inline(always)]
fn tile_scores_body(q: &[f32], kt: &[f32], kq: &mut [f32; TILE_KV]) {
    kq.fill(0.0);
    for (dk, &qd) in q.iter().enumerate() {
        let row = &kt[dk * TILE_KV..][..TILE_KV];
        for (a, &k) in kq.iter_mut().zip(row) {
            *a = k.mul_add(qd, *a);
        }
    }
}

fn tile_values(w: &[f32], vt: &[f32], vkq: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() && vkq.len().is_multiple_of(16) {
        // SAFETY: AVX-512F detected; vt holds w.len() rows of vkq.len().
        return unsafe { x86::tile_values512(w, vt, vkq) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the features were detected.
        return unsafe { x86::tile_values(w, vt, vkq) };
    }
    tile_values_body(w, vt, vkq)
}

/// vkq[d] = fma(v[tk][d], w[tk], vkq[d]) over the tile's cells in order (`vt` is [tk][hd]).
#[inline(always)]
fn tile_values_body(w: &[f32], vt: &[f32], vkq: &mut [f32]) {
    let hd = vkq.len();
    for (tk, &wt) in w.iter().enumerate() {
        let row = &vt[tk * hd..][..hd];
        for (a, &x) in vkq.iter_mut().zip(row) {
            *a = x.mul_add(wt, *a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// `one_chunk_heads` for an f16 K and V (S_k a multiple of 64, S_v of 16) with the position
    /// loop compiled for AVX-512: see `one_chunk_f16`. Each head's (M, S) into `ms`, its
    /// accumulator into `vkq16`.
    ///
    /// # Safety
    /// AVX-512 F, FMA and F16C available; every row of `range` inside `k` and `v`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn one_chunk_f16_512(q16s: &[Vec<u16>], k: &[u16], v: &[u16], at: HeadAt, start: usize, ends: &[usize], scale: f32, vkq16: &mut [Vec<u16>], ms: &mut [(f32, f32)]) {
        one_chunk_f16::<true>(q16s, k, v, at, start, ends, scale, vkq16, ms)
    }

    /// The same for AVX2 (ggml_vec_dot_f16 of an AVX2 build, 8-lane f16 updates).
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; every row of `range` inside `k` and `v`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn one_chunk_f16_256(q16s: &[Vec<u16>], k: &[u16], v: &[u16], at: HeadAt, start: usize, ends: &[usize], scale: f32, vkq16: &mut [Vec<u16>], ms: &mut [(f32, f32)]) {
        one_chunk_f16::<false>(q16s, k, v, at, start, ends, scale, vkq16, ms)
    }

    /// `one_chunk`'s loop for an f16 cache, for each query head position by position the same
    /// operations (the score: ggml_vec_dot_f16 · scale + the mask's 0; a new maximum rescales
    /// the f16 accumulator by expf(M_old − M), else the weight is expf(s − M);
    /// ggml_vec_mad_f16; S), but the scores of a block of positions are computed first (they
    /// depend on nothing the softmax carries, so their dot products pipeline instead of each
    /// waiting on the last position's accumulator update), every helper is inlined, and the
    /// queries sharing the KV head (its query heads; a span's rows) take each cached row in
    /// turn while it is in L1 — their softmax chains, independent, interleave. Query i walks
    /// positions start..ends[i]: the blocks of 32 from `start` it would walk alone.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn one_chunk_f16<const W512: bool>(q16s: &[Vec<u16>], k: &[u16], v: &[u16], at: HeadAt, start: usize, ends: &[usize], scale: f32, vkq16: &mut [Vec<u16>], ms: &mut [(f32, f32)]) {
        const BLOCK: usize = 32;
        let g = q16s.len();
        debug_assert_eq!(ends.len(), g);
        let dk = q16s.first().map_or(0, |q| q.len());
        let mut scores = vec![[0.0f32; BLOCK]; g];
        for st in ms.iter_mut() {
            *st = (f32::NEG_INFINITY, 0.0);
        }
        let end = ends.iter().copied().max().unwrap_or(start);
        let mut p0 = start;
        while p0 < end {
            let p1 = (p0 + BLOCK).min(end);
            for ((q16, sc_h), &e) in q16s.iter().zip(scores.iter_mut()).zip(ends) {
                let qb = std::slice::from_raw_parts(q16.as_ptr() as *const u8, 2 * dk);
                for (p, out) in (p0..p1.min(e)).zip(sc_h.iter_mut()) {
                    let kp = k.as_ptr().add(p * at.k_width + at.k_off);
                    let mut sc = if W512 {
                        xwen_kernels::simd::avx512::dot_f16_ggml512(dk, std::slice::from_raw_parts(kp as *const u8, 2 * dk), qb)
                    } else {
                        dot_f16_raw(kp, q16.as_ptr(), dk)
                    };
                    sc *= scale;
                    sc += 0.0; // the mask's 0
                    *out = sc;
                }
            }
            for (i, p) in (p0..p1).enumerate() {
                let vp = v.as_ptr().add(p * at.v_width + at.v_off);
                for (((sc_h, acc), st), &e) in scores.iter().zip(vkq16.iter_mut()).zip(ms.iter_mut()).zip(ends) {
                    if p >= e {
                        continue;
                    }
                    let sc = sc_h[i];
                    let (m, s) = st;
                    let (mut fm, mut vs) = (1.0f32, 1.0f32);
                    if sc > *m {
                        let m_old = *m;
                        *m = sc;
                        fm = (m_old - sc).exp();
                        scale_f16_raw::<W512>(acc, fm);
                    } else {
                        vs = (sc - *m).exp();
                    }
                    mad_f16_raw::<W512>(acc, vp, vs);
                    *s = s.mul_add(fm, vs);
                }
            }
            p0 = p1;
        }
    }

    /// ggml_vec_scale_f16 on y (its length a multiple of 16 with W512, of 8 otherwise):
    /// y = f16(f32(y) · v), element by element, 16 or 8 at a time.
    #[inline(always)]
    unsafe fn scale_f16_raw<const W512: bool>(y: &mut [u16], v: f32) {
        let py = y.as_mut_ptr();
        if W512 {
            let vv = _mm512_set1_ps(v);
            for i in (0..y.len()).step_by(16) {
                let ay = _mm512_cvtph_ps(_mm256_loadu_si256(py.add(i) as *const __m256i));
                _mm256_storeu_si256(py.add(i) as *mut __m256i, _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_mul_ps(ay, vv)));
            }
        } else {
            let vv = _mm256_set1_ps(v);
            for i in (0..y.len()).step_by(8) {
                let ay = _mm256_cvtph_ps(_mm_loadu_si128(py.add(i) as *const __m128i));
                _mm_storeu_si128(py.add(i) as *mut __m128i, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(ay, vv)));
            }
        }
    }

    /// ggml_vec_mad_f16: y = f16(fma(f32(x), v, f32(y))) element by element over y's length
    /// (a multiple of 16 with W512, of 8 otherwise), `x` that many halves.
    #[inline(always)]
    unsafe fn mad_f16_raw<const W512: bool>(y: &mut [u16], x: *const u16, v: f32) {
        let py = y.as_mut_ptr();
        if W512 {
            let vv = _mm512_set1_ps(v);
            for i in (0..y.len()).step_by(16) {
                let ax = _mm512_cvtph_ps(_mm256_loadu_si256(x.add(i) as *const __m256i));
                let ay = _mm512_cvtph_ps(_mm256_loadu_si256(py.add(i) as *const __m256i));
                _mm256_storeu_si256(py.add(i) as *mut __m256i, _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_fmadd_ps(ax, vv, ay)));
            }
        } else {
            let vv = _mm256_set1_ps(v);
            for i in (0..y.len()).step_by(8) {
                let ax = _mm256_cvtph_ps(_mm_loadu_si128(x.add(i) as *const __m128i));
                let ay = _mm256_cvtph_ps(_mm_loadu_si128(py.add(i) as *const __m128i));
                _mm_storeu_si128(py.add(i) as *mut __m128i, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_fmadd_ps(ax, vv, ay)));
            }
        }
    }

    /// # Safety
    /// AVX2, FMA and F16C available; equal lengths.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
        dot_f16_raw(x.as_ptr(), y.as_ptr(), x.len())
    }

    /// `dot_f16` over n halves at `px`, `py`.
    #[inline(always)]
    unsafe fn dot_f16_raw(px: *const u16, py: *const u16, n: usize) -> f32 {
        let np = n & !31;
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < np {
            for (j, a) in acc.iter_mut().enumerate() {
                let ax = _mm256_cvtph_ps(_mm_loadu_si128(px.add(i + 8 * j) as *const __m128i));
                let ay = _mm256_cvtph_ps(_mm_loadu_si128(py.add(i + 8 * j) as *const __m128i));
                *a = _mm256_fmadd_ps(ax, ay, *a);
            }
            i += 32;
        }
        let r = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let t0 = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        let mut sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1)) as f64;
        for k in np..n {
            sum += (f16_to_f32(*px.add(k)) * f16_to_f32(*py.add(k))) as f64;
        }
        sum as f32
    }

    /// # Safety
    /// AVX2, FMA and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad_f16(y: &mut [u16], x: &[u16], v: f32) {
        let n = y.len().min(x.len());
        let n8 = n & !7;
        mad_f16_raw::<false>(&mut y[..n8], x.as_ptr(), v);
        mad_f16_portable(&mut y[n8..n], &x[n8..n], v);
    }

    /// # Safety
    /// AVX2 and F16C available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_f16(y: &mut [u16], v: f32) {
        let n8 = y.len() & !7;
        scale_f16_raw::<false>(&mut y[..n8], v);
        for yi in &mut y[n8..] {
            *yi = f32_to_f16(f16_to_f32(*yi) * v);
        }
    }

    /// `tile_scores_body` with the tile's 64 scores in eight 8-lane registers through the
    /// whole head dim (each score one FMA chain over d in order).
    ///
    /// # Safety
    /// AVX2 and FMA available; `kt` holds q.len() rows of TILE_KV.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_scores(q: &[f32], kt: &[f32], kq: &mut [f32; TILE_KV]) {
        debug_assert!(kt.len() >= q.len() * TILE_KV);
        let mut acc = [_mm256_setzero_ps(); TILE_KV / 8];
        for (d, &qd) in q.iter().enumerate() {
            let vq = _mm256_set1_ps(qd);
            let row = kt.as_ptr().add(d * TILE_KV);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(8 * j)), vq, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(kq.as_mut_ptr().add(8 * j), *a);
        }
    }

    /// `tile_scores_body` with the tile's 64 scores in four 16-lane registers through the
    /// whole head dim (each score still one FMA chain over d in order).
    ///
    /// # Safety
    /// AVX-512F available; `kt` holds q.len() rows of TILE_KV.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_scores512(q: &[f32], kt: &[f32], kq: &mut [f32; TILE_KV]) {
        debug_assert!(kt.len() >= q.len() * TILE_KV);
        let mut acc = [_mm512_setzero_ps(); TILE_KV / 16];
        for (d, &qd) in q.iter().enumerate() {
            let vq = _mm512_set1_ps(qd);
            let row = kt.as_ptr().add(d * TILE_KV);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(row.add(16 * j)), vq, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(kq.as_mut_ptr().add(16 * j), *a);
        }
    }

    /// `tile_values_body` with 128, 64 or 16 of the accumulator's floats at a time held in
    /// registers across the tile's cells (each still one FMA chain over the cells in order).
    ///
    /// # Safety
    /// AVX-512F available; vkq.len() a multiple of 16; `vt` holds w.len() rows of vkq.len().
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile_values512(w: &[f32], vt: &[f32], vkq: &mut [f32]) {
        let hd = vkq.len();
        debug_assert!(hd.is_multiple_of(16) && vt.len() >= w.len() * hd);
        let mut d0 = 0;
        while d0 < hd {
            d0 += match hd - d0 {
                r if r >= 128 => values_chunk::<8>(w, vt, hd, d0, vkq),
                r if r >= 64 => values_chunk::<4>(w, vt, hd, d0, vkq),
                _ => values_chunk::<1>(w, vt, hd, d0, vkq),
            };
        }
    }

    /// Floats d0..d0 + 16·R of the accumulator through the tile's cells; returns 16·R.
    #[inline(always)]
    unsafe fn values_chunk<const R: usize>(w: &[f32], vt: &[f32], hd: usize, d0: usize, vkq: &mut [f32]) -> usize {
        let pa = vkq.as_mut_ptr().add(d0);
        let mut acc: [__m512; R] = std::array::from_fn(|j| _mm512_loadu_ps(pa.add(16 * j)));
        for (tk, &wt) in w.iter().enumerate() {
            let vw = _mm512_set1_ps(wt);
            let row = vt.as_ptr().add(tk * hd + d0);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(row.add(16 * j)), vw, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(pa.add(16 * j), *a);
        }
        16 * R
    }

    /// `tile_values_body` with 64 or 8 of the accumulator's floats at a time held in registers
    /// across the tile's cells (each one FMA chain over the cells in order); a head width that
    /// is not a multiple of 8 takes the portable body.
    ///
    /// # Safety
    /// AVX2 and FMA available; `vt` holds w.len() rows of vkq.len().
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_values(w: &[f32], vt: &[f32], vkq: &mut [f32]) {
        let hd = vkq.len();
        if !hd.is_multiple_of(8) {
            return tile_values_body(w, vt, vkq);
        }
        debug_assert!(vt.len() >= w.len() * hd);
        let mut d0 = 0;
        while d0 < hd {
            d0 += if hd - d0 >= 64 { values_chunk256::<8>(w, vt, hd, d0, vkq) } else { values_chunk256::<1>(w, vt, hd, d0, vkq) };
        }
    }

    /// Floats d0..d0 + 8·R of the accumulator through the tile's cells; returns 8·R.
    #[inline(always)]
    unsafe fn values_chunk256<const R: usize>(w: &[f32], vt: &[f32], hd: usize, d0: usize, vkq: &mut [f32]) -> usize {
        let pa = vkq.as_mut_ptr().add(d0);
        let mut acc: [__m256; R] = std::array::from_fn(|j| _mm256_loadu_ps(pa.add(8 * j)));
        for (tk, &wt) in w.iter().enumerate() {
            let vw = _mm256_set1_ps(wt);
            let row = vt.as_ptr().add(tk * hd + d0);
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(8 * j)), vw, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(pa.add(8 * j), *a);
        }
        8 * R
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_ggml() {
        assert_eq!(path(1, 256, true, 2), Path::OneChunk);
        assert_eq!(path(1, 512, true, 2), Path::Split { threads: 2 });
        assert_eq!(path(1, 512, false, 2), Path::OneChunk);
        assert_eq!(path(63, 4096, true, 2), Path::OneChunk);
        assert_eq!(path(64, 256, true, 2), Path::Tiled);
        assert_eq!(n_kv(1, 32768), 256);
        assert_eq!(n_kv(257, 32768), 512);
        assert_eq!(n_kv(257, 300), 512);
        assert_eq!(n_kv(600, 300), 512);
    }

    /// The f16 fast path (scores a block at a time, helpers inlined, the queries of a KV head
    /// together) gives every query `one_chunk_each`'s bits — M, S and the accumulator — at
    /// both vector widths, for groups of 1 to 4 queries, over ranges that end inside and on a
    /// block, each query ending where it does alone (the rows of a span), with strided heads.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_f16_fast_path_has_the_per_position_bits() {
        if !simd() {
            return;
        }
        let avx512 = is_x86_feature_detected!("avx512f");
        let r = |i: usize| ((i as f32 * 0.618_034).fract() - 0.5) * 3.0;
        for (hd, heads, group) in [(64usize, 2usize, 1usize), (128, 1, 3), (256, 2, 4)] {
            let n = 300;
            let width = hd * heads;
            let k16: Vec<u16> = (0..width * n).map(|i| f32_to_f16(r(i * 3 + 1))).collect();
            let v16: Vec<u16> = (0..width * n).map(|i| f32_to_f16(r(i * 5 + 2))).collect();
            let qs: Vec<Vec<f32>> = (0..group).map(|h| (0..hd).map(|i| r(i + 7 + 131 * h)).collect()).collect();
            let q16s: Vec<Vec<u16>> = qs.iter().map(|q| q.iter().map(|&x| f32_to_f16(x)).collect()).collect();
            let at = HeadAt::same(width, hd * (heads - 1));
            let scale = 1.0 / (hd as f32).sqrt();
            for (range, stagger) in [0usize..1, 0..32, 5..77, 0..300].into_iter().flat_map(|r| [(r.clone(), 0usize), (r.clone(), 7), (r, 40)]) {
                // query h stops `stagger` positions before query h − 1 (the rows of a span), down to none
                let ends: Vec<usize> = (0..group).map(|h| range.end.saturating_sub(h * stagger).max(range.start)).collect();
                let bits = |p: &Partial| (p.m.to_bits(), p.s.to_bits(), p.vkq.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                let run = |wide: bool| -> Vec<Partial> {
                    let mut acc = vec![vec![0u16; hd]; group];
                    let mut ms = vec![(0.0f32, 0.0f32); group];
                    // SAFETY: the features were checked; every row lies inside the cache.
                    unsafe {
                        if wide {
                            x86::one_chunk_f16_512(&q16s, &k16, &v16, at, range.start, &ends, scale, &mut acc, &mut ms)
                        } else {
                            x86::one_chunk_f16_256(&q16s, &k16, &v16, at, range.start, &ends, scale, &mut acc, &mut ms)
                        }
                    };
                    ms.iter().zip(&acc).map(|(&(m, s), a)| Partial { m, s, vkq: a.iter().map(|&h| f16_to_f32(h)).collect() }).collect()
                };
                // SAFETY (the AVX2 dot): the features were checked by `simd`.
                let avx2_dot: fn(&[u16], &[u16]) -> f32 = |x, y| unsafe { x86::dot_f16(x, y) };
                let got = run(false);
                for (h, (q, q16)) in qs.iter().zip(&q16s).enumerate() {
                    let want = one_chunk_each(q, q16, KvRows::F16(&k16), KvRows::F16(&v16), at, hd, range.start..ends[h], scale, avx2_dot);
                    assert_eq!(bits(&got[h]), bits(&want), "AVX2 hd {hd} head {h} of {group} {range:?} stagger {stagger}");
                }
                if avx512 {
                    let dot512: fn(&[u16], &[u16]) -> f32 = |x, y| {
                        // SAFETY: u16 slices read as their little-endian bytes (x86), same lengths.
                        let (xb, yb) = unsafe { (std::slice::from_raw_parts(x.as_ptr() as *const u8, 2 * x.len()), std::slice::from_raw_parts(y.as_ptr() as *const u8, 2 * y.len())) };
                        xwen_kernels::simd::avx512::dot_f16_vec_dot(x.len(), xb, yb)
                    };
                    let got = run(true);
                    for (h, (q, q16)) in qs.iter().zip(&q16s).enumerate() {
                        let want = one_chunk_each(q, q16, KvRows::F16(&k16), KvRows::F16(&v16), at, hd, range.start..ends[h], scale, dot512);
                        assert_eq!(bits(&got[h]), bits(&want), "AVX-512 hd {hd} head {h} of {group} {range:?} stagger {stagger}");
                    }
                }
            }
        }
    }

    /// The AVX2 and AVX-512 tile products give the portable bodies' bits (the tiled path's scores and
    /// values: one FMA chain per output element).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_tile_products_have_the_portable_bits() {
        if !simd() {
            return;
        }
        let r = |i: usize| ((i as f32 * 0.618_034).fract() - 0.5) * 3.0;
        for dk in [64usize, 128, 256, 576] {
            let q: Vec<f32> = (0..dk).map(|i| r(i + 3)).collect();
            let kt: Vec<f32> = (0..dk * TILE_KV).map(|i| r(i * 7 + 1)).collect();
            let (mut a, mut b) = ([0.0f32; TILE_KV], [0.0f32; TILE_KV]);
            tile_scores_body(&q, &kt, &mut a);
            // SAFETY: AVX2 and FMA detected; kt holds dk rows of TILE_KV.
            unsafe { x86::tile_scores(&q, &kt, &mut b) };
            assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits), "AVX2 scores dk {dk}");
            if avx512() {
                // SAFETY: AVX-512F detected; kt holds dk rows of TILE_KV.
                unsafe { x86::tile_scores512(&q, &kt, &mut b) };
                assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits), "AVX-512 scores dk {dk}");
            }
            for valid in [1usize, 37, 64] {
                let w: Vec<f32> = (0..valid).map(|i| r(i * 11 + 5).abs()).collect();
                let vt: Vec<f32> = (0..valid * dk).map(|i| r(i * 13 + 2)).collect();
                let mut x: Vec<f32> = (0..dk).map(|i| r(i + 9)).collect();
                let (mut y, mut z) = (x.clone(), x.clone());
                tile_values_body(&w, &vt, &mut x);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                // SAFETY: AVX2 and FMA detected; vt holds valid rows of dk.
                unsafe { x86::tile_values(&w, &vt, &mut y) };
                assert_eq!(bits(&x), bits(&y), "AVX2 values dk {dk} valid {valid}");
                if avx512() {
                    // SAFETY: AVX-512F detected; dk is a multiple of 16; vt holds valid rows of dk.
                    unsafe { x86::tile_values512(&w, &vt, &mut z) };
                    assert_eq!(bits(&x), bits(&z), "AVX-512 values dk {dk} valid {valid}");
                }
            }
        }
    }

    /// Every path computes softmax(q·k·scale)·v; against an f64 reference on an f32 cache.
    #[test]
    fn every_path_is_attention() {
        let (hd, n) = (64, 700);
        let r = |i: usize| ((i as f32 * 0.618_034).fract() - 0.5) * 2.0;
        let q: Vec<f32> = (0..hd).map(|i| r(i + 7)).collect();
        let k: Vec<f32> = (0..hd * n).map(|i| r(i * 3 + 1)).collect();
        let v: Vec<f32> = (0..hd * n).map(|i| r(i * 5 + 2)).collect();
        let scale = 1.0 / (hd as f32).sqrt();
        for visible in [1, 63, 64, 65, 300, 700] {
            let sc: Vec<f64> = (0..visible).map(|p| (0..hd).map(|d| q[d] as f64 * k[p * hd + d] as f64).sum::<f64>() * scale as f64).collect();
            let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
            let w: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
            let tot: f64 = w.iter().sum();
            let want: Vec<f64> = (0..hd).map(|d| (0..visible).map(|p| w[p] * v[p * hd + d] as f64).sum::<f64>() / tot).collect();
            let nkv = n_kv(visible, 4096);
            for p in [Path::OneChunk, Path::Tiled, Path::Split { threads: 3 }] {
                for half in [false, true] {
                    let (k16, v16): (Vec<u16>, Vec<u16>) = (k.iter().map(|&x| f32_to_f16(x)).collect(), v.iter().map(|&x| f32_to_f16(x)).collect());
                    let (kr, vr) = if half { (KvRows::F16(&k16), KvRows::F16(&v16)) } else { (KvRows::F32(&k), KvRows::F32(&v)) };
                    let mut out = vec![0.0f32; hd];
                    attend(&q, kr, vr, HeadAt::same(hd, 0), visible, nkv.max(visible), scale, p, &mut out);
                    let tol = if half { 3e-3 } else { 1e-5 };
                    for d in 0..hd {
                        assert!((out[d] as f64 - want[d]).abs() < tol, "{p:?} half {half} visible {visible} d {d}: {} vs {}", out[d], want[d]);
                    }
                }
            }
        }
    }
}
