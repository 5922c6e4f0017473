//! f32 vector primitives for the engine's non-matmul work (DeltaNet state sweeps, attention
//! scores, convolutions), dispatched once at run time like the quantized kernels: AVX-512F,
//! AVX2+FMA, or a portable path with eight partial sums. The engine is compiled for baseline
//! x86-64, so without this its float loops would run on SSE2 only.
//!
//! The exp-based ops (SiLU, SwiGLU, softmax) live in `ggml_exp`: they reproduce ggml-cpu's
//! vectorized expf bit for bit, which is what parity with llama.cpp needs.

use std::sync::atomic::{AtomicU32, Ordering};

mod ggml_exp;
pub use ggml_exp::{
    exp_flavor, silu, silu_emulated, silu_inplace, silu_scalar, soft_max_sum, softmax_inplace,
    softmax_masked_emulated, softmax_masked_inplace, swiglu, swiglu_emulated, v_expf_avx2_lane,
    v_expf_avx512_lane, v_expf_lane, v_silu_lane, ExpFlavor,
};

const UNKNOWN: u8 = 0;
const PORTABLE: u8 = 1;
const AVX2: u8 = 2;
const AVX512: u8 = 3;

/// The chosen level and the `isa::generation` it was chosen under: (generation << 8) | level.
static LEVEL: AtomicU32 = AtomicU32::new(UNKNOWN as u32);

#[inline]
fn level() -> u8 {
    let cached = LEVEL.load(Ordering::Relaxed);
    let gen = crate::isa::generation();
    if cached & 0xff != UNKNOWN as u32 && cached >> 8 == gen {
        return (cached & 0xff) as u8;
    }
    // the kernel set changed (`set_max_isa`, `set_force_reference`) or nothing was chosen yet
    let l = detect();
    LEVEL.store((gen << 8) | l as u32, Ordering::Relaxed);
    l
}

fn detect() -> u8 {
    if crate::isa::force_reference() {
        return PORTABLE;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") && crate::isa::reference_avx512() {
            return AVX512;
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return AVX2;
        }
    }
    PORTABLE
}

/// Σ a[i]·b[i].
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: the features were detected at run time.
        AVX512 => return unsafe { x86::dot512(a, b) },
        AVX2 => return unsafe { x86::dot256(a, b) },
        _ => {}
    }
    dot_portable(a, b)
}

/// Σ a[i]·b[i] in tinyBLAS's order (llamafile sgemm gemm_bloc: one FMA chain of
/// `tinyblas_lanes()` lanes over the length, the k % lanes tail as one more zero-padded step,
/// then the build's horizontal sum) — what llama.cpp computes when it hands a contiguous f32
/// batch to tinyBLAS; `dot` where no SIMD set is active.
pub fn dot_tinyblas(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: the features were detected at run time (AVX512 implies AVX2/FMA here).
        AVX512 => return unsafe { x86::dot512_tinyblas(a, b) },
        AVX2 => return unsafe { x86::dot256_tinyblas(a, b) },
        _ => {}
    }
    dot(a, b)
}

/// The lanes of tinyBLAS's f32 accumulators in the build xwen reproduces: 16 in an AVX-512
/// build (tinyBLAS<16, __m512>), else 8 (tinyBLAS<8, __m256>). ggml_vec_dot_f32 keeps four
/// accumulators of that many lanes.
pub fn tinyblas_lanes() -> usize {
    if crate::isa::reference_avx512() {
        16
    } else {
        8
    }
}

/// y[i] += a·x[i].
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: the features were detected at run time.
        AVX512 => return unsafe { x86::axpy512(a, x, y) },
        AVX2 => return unsafe { x86::axpy256(a, x, y) },
        _ => {}
    }
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// y[i] = fma(x[i], k[i], y[i]) where the active kernel set is AVX-512 — an AVX-512 build of
/// llama.cpp (GCC, -march=native) contracts ggml_ssm_conv's `sumf += s * c` — else
/// y[i] += x[i]·k[i] rounded twice, as its AVX2 build does. Returns whether it fused.
pub fn conv_tap_acc(y: &mut [f32], x: &[f32], k: &[f32]) -> bool {
    assert!(x.len() == y.len() && k.len() == y.len());
    #[cfg(target_arch = "x86_64")]
    if level() == AVX512 {
        // SAFETY: the features were detected at run time.
        unsafe { x86::fma_acc512(y, x, k) };
        return true;
    }
    for ((yi, &xi), &ki) in y.iter_mut().zip(x).zip(k) {
        *yi += xi * ki;
    }
    false
}

/// x[i] *= a, then return Σ x[i]·b[i] (one sweep: DeltaNet's decay followed by S·k).
#[inline]
pub fn scale_dot(a: f32, x: &mut [f32], b: &[f32]) -> f32 {
    assert_eq!(x.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: the features were detected at run time.
        AVX512 => return unsafe { x86::scale_dot512(a, x, b) },
        AVX2 => return unsafe { x86::scale_dot256(a, x, b) },
        _ => {}
    }
    for v in x.iter_mut() {
        *v *= a;
    }
    dot_portable(x, b)
}

/// One token of ggml's gated delta rule on one head's state `s` (rows of `k.len()` floats, one
/// per value index j): row_j ·= decay; δ_j = (v_j − row_j·k)·β; row_j += δ_j·k;
/// out_j = (row_j·q)·scale — `scale_dot` then `axpy_dot` per row, bit for bit. A row's update
/// needs only its own δ_j, so each row is finished in one visit (ggml sweeps the whole state
/// four times; two fused sweeps still cost ~7x this on a 64 KB head state).
#[allow(clippy::too_many_arguments)] // the recurrence's inputs, all per step
pub fn delta_rule_step(s: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: f32, beta: f32, scale: f32, out: &mut [f32]) {
    let sd = k.len();
    assert!(q.len() == sd && s.len() == v.len() * sd && out.len() == v.len());
    #[cfg(target_arch = "x86_64")]
    match level() {
        AVX2 if sd.is_multiple_of(32) => {
            // SAFETY: AVX2/FMA detected; lengths checked above.
            unsafe { x86::delta_rule_step256(s, k, q, v, decay, beta, scale, out) };
            return;
        }
        AVX512 if sd.is_multiple_of(16) => {
            // SAFETY: AVX-512F detected; lengths checked above.
            unsafe { x86::delta_rule_step512(s, k, q, v, decay, beta, scale, out) };
            return;
        }
        _ => {}
    }
    for (j, row) in s.chunks_exact_mut(sd).enumerate() {
        let delta = (v[j] - scale_dot(decay, row, k)) * beta;
        out[j] = axpy_dot(delta, k, row, q) * scale;
    }
}

/// KDA's step (Kimi Delta Attention: a per-key-channel decay), in ggml's
/// `gated_delta_net` order with `g` of S_k values: row_j ·= decay (element-wise, ggml_vec_mul);
/// δ_j = (v_j − row_j·k)·β; row_j += δ_j·k; out_j = (row_j·q)·scale. Element-wise products
/// round the same in any order, so each row is finished in one visit as in `delta_rule_step`.
#[allow(clippy::too_many_arguments)] // the recurrence's inputs, all per step
pub fn delta_rule_step_channels(s: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: &[f32], beta: f32, scale: f32, out: &mut [f32]) {
    let sd = k.len();
    assert!(q.len() == sd && decay.len() == sd && s.len() == v.len() * sd && out.len() == v.len());
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY (each arm): the features were detected at run time; lengths checked above.
        AVX512 if sd == 64 => return unsafe { x86::delta_rule_step512_channels::<4>(s, k, q, v, decay, beta, scale, out) },
        AVX512 if sd == 128 => return unsafe { x86::delta_rule_step512_channels::<8>(s, k, q, v, decay, beta, scale, out) },
        AVX2 if sd.is_multiple_of(32) => return unsafe { x86::delta_rule_step256_channels(s, k, q, v, decay, beta, scale, out) },
        _ => {}
    }
    for (j, row) in s.chunks_exact_mut(sd).enumerate() {
        for (x, &d) in row.iter_mut().zip(decay) {
            *x *= d;
        }
        // S·k in `delta_rule_step`'s reduction order at every kernel level (scaling by 1 is exact)
        let delta = (v[j] - scale_dot(1.0, row, k)) * beta;
        out[j] = axpy_dot(delta, k, row, q) * scale;
    }
}

/// y[i] += a·x[i], then return Σ y[i]·q[i] (DeltaNet's rank-1 update followed by S·q).
#[inline]
pub fn axpy_dot(a: f32, x: &[f32], y: &mut [f32], q: &[f32]) -> f32 {
    assert!(x.len() == y.len() && q.len() == y.len());
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: the features were detected at run time.
        AVX512 => return unsafe { x86::axpy_dot512(a, x, y, q) },
        AVX2 => return unsafe { x86::axpy_dot256(a, x, y, q) },
        _ => {}
    }
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
    dot_portable(y, q)
}

pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let n8 = a.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        for l in 0..8 {
            acc[l] += a[i + l] * b[i + l];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for i in n8..a.len() {
        s += a[i] * b[i];
    }
    s
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::dot256_raw_streaming;

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// ggml_vec_dot_f32 of an AVX-512 build (b11434, GGML_SIMD with GGML_F32_STEP 64,
    /// GGML_F32_EPR 16): four 16-lane FMA accumulators over steps of 64, reduced as
    /// GGML_F32x16_REDUCE (`ggml_reduce512`), the n % 64 leftovers added to the float sum one
    /// product at a time (rounded first, as the AVX2 form's measured tail).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot512(a: &[f32], b: &[f32]) -> f32 {
        dot512_raw(a.as_ptr(), b.as_ptr(), a.len())
    }

    /// `dot512` over n floats at possibly unaligned addresses.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot512_raw(pa: *const f32, pb: *const f32, n: usize) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 4];
        let np = n & !63;
        let mut i = 0;
        while i < np {
            for (j, ac) in acc.iter_mut().enumerate() {
                *ac = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i + 16 * j)), _mm512_loadu_ps(pb.add(i + 16 * j)), *ac);
            }
            i += 64;
        }
        let mut s = ggml_reduce512(acc);
        while i < n {
            // the product rounded, then added (measured against that build)
            s += pa.add(i).read_unaligned() * pb.add(i).read_unaligned();
            i += 1;
        }
        s
    }

    /// GGML_F32x16_REDUCE: (x0 + x2) + (x1 + x3) lane by lane, then GCC's
    /// `_mm512_reduce_add_ps` — the 256-bit halves added, then the 128-bit halves, then lanes
    /// 0 + 2 and 1 + 3, then those two. (Rust's intrinsic of that name does not promise an
    /// order, so the tree is written out.)
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn ggml_reduce512(acc: [__m512; 4]) -> f32 {
        reduce_add512(_mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3])))
    }

    /// GCC's `_mm512_reduce_add_ps` (avx512fintrin.h `__MM512_REDUCE_OP`): the 256-bit halves
    /// added, then the 128-bit halves, then lanes 0 + 2 and 1 + 3, then those two — tinyBLAS's
    /// hsum in an AVX-512 build.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn reduce_add512(a: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(a);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
        let t3 = _mm256_add_ps(hi, lo);
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let t8 = _mm_add_ps(t6, _mm_shuffle_ps::<0b01_00_11_10>(t6, t6));
        let t10 = _mm_add_ps(t8, _mm_shuffle_ps::<0b00_01_00_01>(t8, t8));
        _mm_cvtss_f32(t10)
    }

    /// y[i] = fma(x[i], k[i], y[i]).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma_acc512(y: &mut [f32], x: &[f32], k: &[f32]) {
        let n = y.len();
        let (py, px, pk) = (y.as_mut_ptr(), x.as_ptr(), k.as_ptr());
        let mut i = 0;
        while i + 16 <= n {
            _mm512_storeu_ps(py.add(i), _mm512_fmadd_ps(_mm512_loadu_ps(px.add(i)), _mm512_loadu_ps(pk.add(i)), _mm512_loadu_ps(py.add(i))));
            i += 16;
        }
        while i < n {
            *py.add(i) = (*px.add(i)).mul_add(*pk.add(i), *py.add(i));
            i += 1;
        }
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpy512(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let va = _mm512_set1_ps(a);
        let mut i = 0;
        while i + 16 <= n {
            _mm512_storeu_ps(
                py.add(i),
                _mm512_fmadd_ps(va, _mm512_loadu_ps(px.add(i)), _mm512_loadu_ps(py.add(i))),
            );
            i += 16;
        }
        while i < n {
            *py.add(i) += a * *px.add(i);
            i += 1;
        }
    }

    /// x ·= a (ggml_vec_scale_f32, element-wise), then ggml_vec_dot_f32(x, b) (`ggml_dot512`).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scale_dot512(a: f32, x: &mut [f32], b: &[f32]) -> f32 {
        let n = x.len();
        let px = x.as_mut_ptr();
        let va = _mm512_set1_ps(a);
        let mut i = 0;
        while i + 16 <= n {
            _mm512_storeu_ps(px.add(i), _mm512_mul_ps(_mm512_loadu_ps(px.add(i)), va));
            i += 16;
        }
        while i < n {
            *px.add(i) *= a;
            i += 1;
        }
        dot512_raw(px, b.as_ptr(), n)
    }

    /// y += a·x as ggml_vec_mad_f32 of an AVX-512 build (fused, the scalar tail contracted too),
    /// then ggml_vec_dot_f32(y, q) (`dot512_raw`).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpy_dot512(a: f32, x: &[f32], y: &mut [f32], q: &[f32]) -> f32 {
        let n = x.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let (va, np) = (_mm512_set1_ps(a), n & !63);
        let mut i = 0;
        while i < np {
            _mm512_storeu_ps(py.add(i), _mm512_fmadd_ps(_mm512_loadu_ps(px.add(i)), va, _mm512_loadu_ps(py.add(i))));
            i += 16;
        }
        while i < n {
            // ggml_vec_mad_f32's leftovers `y[i] += x[i]*v`, contracted by the AVX-512 build
            *py.add(i) = (*px.add(i)).mul_add(a, *py.add(i));
            i += 1;
        }
        dot512_raw(py, q.as_ptr(), n)
    }

    /// `delta_rule_step` at the AVX-512 level, in the order of llama.cpp's AVX-512 build
    /// (ggml-cpu ops.cpp gated_delta_net): per row kv = ggml_vec_dot_f32(row·decay, k),
    /// δ = (v − kv)·β, then ggml_vec_mad_f32(row, k, δ) and out = ggml_vec_dot_f32(row, q)·scale
    /// — `scale_dot512` then `axpy_dot512`, each row finished before the next (the decay is
    /// element-wise, so scaling the whole state first, as ggml does, gives the same values).
    /// Found with the DeltaNet taps against a native AVX-512 llama.cpp build (docs/parity.md
    /// "Random geometries").
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn delta_rule_step512(s: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: f32, beta: f32, scale: f32, out: &mut [f32]) {
        let sd = k.len();
        match sd {
            64 => return delta_rule_step512_rows::<4>(s, k, q, v, decay, beta, scale, out),
            128 => return delta_rule_step512_rows::<8>(s, k, q, v, decay, beta, scale, out),
            _ => {}
        }
        for ((row, &vj), oj) in s.chunks_exact_mut(sd).zip(v).zip(out.iter_mut()) {
            let delta = (vj - scale_dot512(decay, row, k)) * beta;
            *oj = axpy_dot512(delta, k, row, q) * scale;
        }
    }

    /// `delta_rule_step512` for a state row of M vectors (S_k = 16·M, a multiple of 64): the
    /// same operations in the same order — the row scaled, ggml_vec_dot_f32 with k (four
    /// accumulators from zero over 64-float steps, `ggml_reduce512`), δ, the fused row update,
    /// the dot with q — with the row, k and q held in registers instead of stored and read
    /// back between the steps (the reload's store-forwarding latency chained every row).
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn delta_rule_step512_rows<const M: usize>(s: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: f32, beta: f32, scale: f32, out: &mut [f32]) {
        let vdecay = [_mm512_set1_ps(decay); M];
        delta_rows512::<M>(s, k, q, v, &vdecay, beta, scale, out)
    }

    /// `delta_rule_step_channels` (KDA) at the AVX-512 level for S_k = 16·M, a multiple of 64:
    /// each row multiplied by the per-channel decays (element-wise, as ggml_vec_mul), then
    /// `delta_rule_step512_rows`'s steps (ggml's second scaling, by 1, is exact and left out).
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn delta_rule_step512_channels<const M: usize>(s: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: &[f32], beta: f32, scale: f32, out: &mut [f32]) {
        debug_assert_eq!(decay.len(), 16 * M);
        let vdecay: [__m512; M] = std::array::from_fn(|m| _mm512_loadu_ps(decay.as_ptr().add(16 * m)));
        delta_rows512::<M>(s, k, q, v, &vdecay, beta, scale, out)
    }

    /// The rows of one delta-rule step with each row scaled by `vdecay` (a vector per 16 of
    /// its floats) first.
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn delta_rows512<const M: usize>(s: &mut [f32], k: &[f32], q: &[f32], v: &[f32], vdecay: &[__m512; M], beta: f32, scale: f32, out: &mut [f32]) {
        debug_assert!(M.is_multiple_of(4) && k.len() == 16 * M && q.len() == 16 * M && s.len() == v.len() * 16 * M);
        let kv: [__m512; M] = std::array::from_fn(|m| _mm512_loadu_ps(k.as_ptr().add(16 * m)));
        let qv: [__m512; M] = std::array::from_fn(|m| _mm512_loadu_ps(q.as_ptr().add(16 * m)));
        // ggml_vec_dot_f32 over 16·M floats: accumulator j takes vectors j, j + 4, … in turn
        let dot = |a: &[__m512; M], b: &[__m512; M]| -> f32 {
            let mut acc = [_mm512_setzero_ps(); 4];
            for m in 0..M {
                acc[m % 4] = _mm512_fmadd_ps(a[m], b[m], acc[m % 4]);
            }
            ggml_reduce512(acc)
        };
        for ((row, &vj), oj) in s.chunks_exact_mut(16 * M).zip(v).zip(out.iter_mut()) {
            let p = row.as_mut_ptr();
            let mut r: [__m512; M] = std::array::from_fn(|m| _mm512_mul_ps(_mm512_loadu_ps(p.add(16 * m)), vdecay[m]));
            let delta = (vj - dot(&r, &kv)) * beta;
            let vdelta = _mm512_set1_ps(delta);
            for m in 0..M {
                r[m] = _mm512_fmadd_ps(kv[m], vdelta, r[m]);
                _mm512_storeu_ps(p.add(16 * m), r[m]);
            }
            *oj = dot(&r, &qv) * scale;
        }
    }

    /// ggml_vec_dot_f32's AVX2 order (GGML_F32_STEP 32: four 8-lane FMA accumulators, then
    /// GGML_F32x8_REDUCE: acc0+acc2, acc1+acc3, acc0+acc1, 128-bit halves, two hadds), with the
    /// tail added in scalar. ggml's DeltaNet recurrence and f32 matrix × vector use it, so the
    /// same order keeps our results bit-identical to llama.cpp on AVX2 machines.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn ggml_reduce(acc: [__m256; 4]) -> f32 {
        let a0 = _mm256_add_ps(acc[0], acc[2]);
        let a1 = _mm256_add_ps(acc[1], acc[3]);
        let a = _mm256_add_ps(a0, a1);
        let t0 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }

    /// tinyBLAS<8>'s per-output order: one 8-lane FMA chain (the n % 8 tail as a zero-padded
    /// step, `load_partial`), then its hsum (the 128-bit halves, then movehl and movehdup) —
    /// also `simd::avx2`'s F32 matrix kernel.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot256_tinyblas(a: &[f32], b: &[f32]) -> f32 {
        dot256_tinyblas_raw(a.as_ptr(), b.as_ptr(), a.len())
    }

    /// `dot256_tinyblas` over n floats at possibly unaligned addresses.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot256_tinyblas_raw(pa: *const f32, pb: *const f32, n: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc);
            i += 8;
        }
        if i < n {
            let (mut ta, mut tb) = ([0f32; 8], [0f32; 8]);
            for j in 0..n - i {
                ta[j] = pa.add(i + j).read_unaligned();
                tb[j] = pb.add(i + j).read_unaligned();
            }
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(ta.as_ptr()), _mm256_loadu_ps(tb.as_ptr()), acc);
        }
        let r = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }

    /// tinyBLAS<16>'s per-output order in an AVX-512 build: one 16-lane FMA chain (the n % 16
    /// tail masked, as `load_partial`), then GCC's `_mm512_reduce_add_ps` (`reduce_add512`) —
    /// also `simd::avx512`'s F32 matrix kernel.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot512_tinyblas(a: &[f32], b: &[f32]) -> f32 {
        dot512_tinyblas_raw(a.as_ptr(), b.as_ptr(), a.len())
    }

    /// `dot512_tinyblas` over n floats at possibly unaligned addresses.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot512_tinyblas_raw(pa: *const f32, pb: *const f32, n: usize) -> f32 {
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), acc);
            i += 16;
        }
        if i < n {
            let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, pa.add(i)), _mm512_maskz_loadu_ps(m, pb.add(i)), acc);
        }
        reduce_add512(acc)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot256(a: &[f32], b: &[f32]) -> f32 {
        dot256_raw(a.as_ptr(), b.as_ptr(), a.len())
    }

    /// ggml_vec_dot_f32 (AVX2) over n floats at possibly unaligned addresses (also the F32
    /// weight kernel for one token, simd::avx2::dot_f32_vec_dot).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot256_raw(pa: *const f32, pb: *const f32, n: usize) -> f32 {
        dot256_impl::<false>(pa, pb, n)
    }

    /// dot256_raw for a weight row streamed from DRAM: also prefetches `pa` ahead of the loop
    /// (crate::simd::prefetch::prefetch_ahead); same result.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot256_raw_streaming(pa: *const f32, pb: *const f32, n: usize) -> f32 {
        dot256_impl::<true>(pa, pb, n)
    }

    #[inline(always)]
    unsafe fn dot256_impl<const PREFETCH: bool>(pa: *const f32, pb: *const f32, n: usize) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let np = n & !31;
        let mut i = 0;
        while i < np {
            if PREFETCH {
                crate::simd::prefetch::prefetch_ahead(pa.add(i) as *const u8);
                crate::simd::prefetch::prefetch_ahead(pa.add(i + 16) as *const u8);
            }
            for (j, ac) in acc.iter_mut().enumerate() {
                *ac = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8 * j)), _mm256_loadu_ps(pb.add(i + 8 * j)), *ac);
            }
            i += 32;
        }
        // ggml_vec_dot_f32 (b11434, GGML_SIMD) adds the leftovers to the reduced *float* sum,
        // `sumf += x[i]*y[i]`, product rounded first (measured: no FMA contraction there; a
        // double accumulator, as the scalar build has, is 1 ulp off for n % 32 != 0)
        let mut s = ggml_reduce(acc);
        while i < n {
            s += pa.add(i).read_unaligned() * pb.add(i).read_unaligned();
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy256(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(py.add(i), _mm256_fmadd_ps(_mm256_loadu_ps(px.add(i)), va, _mm256_loadu_ps(py.add(i))));
            i += 8;
        }
        while i < n {
            *py.add(i) += *px.add(i) * a;
            i += 1;
        }
    }

    /// ggml_vec_scale_f32 of x, then ggml_vec_dot_f32(x, b).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_dot256(a: f32, x: &mut [f32], b: &[f32]) -> f32 {
        let n = x.len();
        let px = x.as_mut_ptr();
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(px.add(i), _mm256_mul_ps(_mm256_loadu_ps(px.add(i)), va));
            i += 8;
        }
        while i < n {
            *px.add(i) *= a;
            i += 1;
        }
        dot256(x, b)
    }

    /// `delta_rule_step` for k.len() % 32 == 0: two rows at a time (independent chains, so the
    /// reductions of one overlap the other's loads), each in scale_dot256 / axpy_dot256's
    /// exact order.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn delta_rule_step256(s: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: f32, beta: f32, scale: f32, out: &mut [f32]) {
        let sd = k.len();
        let rows = v.len();
        let p = s.as_mut_ptr();
        let mut j = 0;
        while j + 2 <= rows {
            delta_rows::<2, false>(p.add(j * sd), sd, k, q, &v[j..j + 2], decay, &[], beta, scale, &mut out[j..j + 2]);
            j += 2;
        }
        if j < rows {
            delta_rows::<1, false>(p.add(j * sd), sd, k, q, &v[j..j + 1], decay, &[], beta, scale, &mut out[j..j + 1]);
        }
    }

    /// `delta_rule_step_channels` (KDA) for k.len() % 32 == 0: `delta_rule_step256` with each
    /// row multiplied by the per-channel decays (element-wise, as ggml_vec_mul; ggml's second
    /// scaling, by 1, is exact and left out).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn delta_rule_step256_channels(s: &mut [f32], k: &[f32], q: &[f32], v: &[f32], decay: &[f32], beta: f32, scale: f32, out: &mut [f32]) {
        let sd = k.len();
        debug_assert_eq!(decay.len(), sd);
        let rows = v.len();
        let p = s.as_mut_ptr();
        let mut j = 0;
        while j + 2 <= rows {
            delta_rows::<2, true>(p.add(j * sd), sd, k, q, &v[j..j + 2], 1.0, decay, beta, scale, &mut out[j..j + 2]);
            j += 2;
        }
        if j < rows {
            delta_rows::<1, true>(p.add(j * sd), sd, k, q, &v[j..j + 1], 1.0, decay, beta, scale, &mut out[j..j + 1]);
        }
    }

    /// R consecutive state rows from `r` (sd floats each) through one delta-rule step, each
    /// row scaled by `decay`, or with CHANNELS element-wise by `decays` (sd of them).
    #[inline(always)]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // R rows' chains side by side
    unsafe fn delta_rows<const R: usize, const CHANNELS: bool>(
        r: *mut f32,
        sd: usize,
        k: &[f32],
        q: &[f32],
        v: &[f32],
        decay: f32,
        decays: &[f32],
        beta: f32,
        scale: f32,
        out: &mut [f32],
    ) {
        let (pk, pq, pd) = (k.as_ptr(), q.as_ptr(), decays.as_ptr());
        let vdecay = _mm256_set1_ps(decay);
        // row ·= decay, kv = row · k (dot256's order: 4 accumulators over steps of 32)
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let mut i = 0;
        while i < sd {
            for c in 0..4 {
                let kk = _mm256_loadu_ps(pk.add(i + 8 * c));
                let dd = if CHANNELS { _mm256_loadu_ps(pd.add(i + 8 * c)) } else { vdecay };
                for n in 0..R {
                    let at = r.add(n * sd + i + 8 * c);
                    let x = _mm256_mul_ps(_mm256_loadu_ps(at), dd);
                    _mm256_storeu_ps(at, x);
                    acc[n][c] = _mm256_fmadd_ps(x, kk, acc[n][c]);
                }
            }
            i += 32;
        }
        let vdelta: [__m256; R] = std::array::from_fn(|n| _mm256_set1_ps((v[n] - ggml_reduce(acc[n])) * beta));
        // row += δ·k (axpy256's fma), out = row · q
        let mut acc = [[_mm256_setzero_ps(); 4]; R];
        let mut i = 0;
        while i < sd {
            for c in 0..4 {
                let (kk, qq) = (_mm256_loadu_ps(pk.add(i + 8 * c)), _mm256_loadu_ps(pq.add(i + 8 * c)));
                for n in 0..R {
                    let at = r.add(n * sd + i + 8 * c);
                    let y = _mm256_fmadd_ps(kk, vdelta[n], _mm256_loadu_ps(at));
                    _mm256_storeu_ps(at, y);
                    acc[n][c] = _mm256_fmadd_ps(y, qq, acc[n][c]);
                }
            }
            i += 32;
        }
        for n in 0..R {
            out[n] = ggml_reduce(acc[n]) * scale;
        }
    }

    /// ggml_vec_mad_f32 (y += x·a, fused), then ggml_vec_dot_f32(y, q).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_dot256(a: f32, x: &[f32], y: &mut [f32], q: &[f32]) -> f32 {
        axpy256(a, x, y);
        dot256(y, q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KDA's step with every channel's decay the same is Gated DeltaNet's step, bit for bit.
    #[test]
    fn channel_decays_of_one_value_are_the_scalar_step() {
        let sd = 32;
        let gen = |n: usize, s: f32| (0..n).map(|i| (i as f32 * 0.37 + s).sin()).collect::<Vec<f32>>();
        let (k, q, v) = (gen(sd, 0.1), gen(sd, 0.2), gen(sd, 0.3));
        let mut s1 = gen(sd * sd, 0.4);
        let mut s2 = s1.clone();
        let (mut o1, mut o2) = (vec![0.0f32; sd], vec![0.0f32; sd]);
        delta_rule_step(&mut s1, &k, &q, &v, 0.9, 0.6, 0.25, &mut o1);
        delta_rule_step_channels(&mut s2, &k, &q, &v, &vec![0.9; sd], 0.6, 0.25, &mut o2);
        assert_eq!(o1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), o2.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        assert_eq!(s1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), s2.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }

    fn vecs(n: usize, seed: u32) -> (Vec<f32>, Vec<f32>) {
        let mut s = seed;
        let mut r = || {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        ((0..n).map(|_| r()).collect(), (0..n).map(|_| r()).collect())
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() <= 1e-5 * (1.0 + a.abs().max(b.abs()))
    }

    /// Every dispatched path agrees with the portable reference (to float reassociation).
    #[test]
    fn dispatched_ops_equal_portable() {
        for n in [1, 7, 8, 15, 16, 31, 64, 100, 128, 257] {
            let (a, b) = vecs(n, n as u32);
            assert!(close(dot(&a, &b), dot_portable(&a, &b)), "dot n={n}");
            let mut y1 = b.clone();
            axpy(0.3, &a, &mut y1);
            let y2: Vec<f32> = b.iter().zip(&a).map(|(y, x)| y + 0.3 * x).collect();
            assert!(y1.iter().zip(&y2).all(|(p, q)| close(*p, *q)), "axpy n={n}");
            let mut x1 = a.clone();
            let s1 = scale_dot(0.7, &mut x1, &b);
            let x2: Vec<f32> = a.iter().map(|v| v * 0.7).collect();
            assert!(
                close(s1, dot_portable(&x2, &b)) && x1 == x2,
                "scale_dot n={n}"
            );
            let mut y3 = b.clone();
            let s3 = axpy_dot(-0.2, &a, &mut y3, &a);
            let y4: Vec<f32> = b.iter().zip(&a).map(|(y, x)| y + -0.2 * x).collect();
            assert!(close(s3, dot_portable(&y4, &a)), "axpy_dot n={n}");
        }
    }

    /// KDA's step on the register-resident rows (S_k 64, 128) equals the row-by-row form
    /// (element-wise decay, scale_dot by 1, axpy_dot), bit for bit.
    #[test]
    fn channel_step_equals_the_row_by_row_form() {
        for (rows, sd) in [(128, 128), (7, 64), (5, 40)] {
            let (s0, _) = vecs(rows * sd, (rows * sd) as u32);
            let (k, q) = vecs(sd, 3 + sd as u32);
            let (v, _) = vecs(rows, 11 + rows as u32);
            let decay: Vec<f32> = (0..sd).map(|i| 0.8 + 0.19 * ((i as f32) * 0.7).sin()).collect();
            let (beta, scale) = (0.61f32, 1.0 / (sd as f32).sqrt());
            let mut s1 = s0.clone();
            let mut o1 = vec![0f32; rows];
            delta_rule_step_channels(&mut s1, &k, &q, &v, &decay, beta, scale, &mut o1);
            let mut s2 = s0.clone();
            let mut o2 = vec![0f32; rows];
            for (j, row) in s2.chunks_exact_mut(sd).enumerate() {
                for (x, &d) in row.iter_mut().zip(&decay) {
                    *x *= d;
                }
                let delta = (v[j] - scale_dot(1.0, row, &k)) * beta;
                o2[j] = axpy_dot(delta, &k, row, &q) * scale;
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&s1), bits(&s2), "state {rows}x{sd}");
            assert_eq!(bits(&o1), bits(&o2), "out {rows}x{sd}");
        }
    }

    /// The AVX2 forms of both steps (whatever the level this machine dispatches to) equal
    /// their row-by-row AVX2 sweeps, bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_steps_equal_their_row_by_row_sweeps() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        for (rows, sd) in [(128, 128), (7, 64), (6, 32)] {
            let (s0, _) = vecs(rows * sd, (rows * sd) as u32);
            let (k, q) = vecs(sd, 3 + sd as u32);
            let (v, _) = vecs(rows, 11 + rows as u32);
            let decays: Vec<f32> = (0..sd).map(|i| 0.8 + 0.19 * ((i as f32) * 0.7).sin()).collect();
            let (beta, scale) = (0.61f32, 1.0 / (sd as f32).sqrt());
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for channels in [false, true] {
                let (mut s1, mut o1) = (s0.clone(), vec![0f32; rows]);
                let (mut s2, mut o2) = (s0.clone(), vec![0f32; rows]);
                // SAFETY: AVX2 and FMA detected above; lengths match.
                unsafe {
                    if channels {
                        x86::delta_rule_step256_channels(&mut s1, &k, &q, &v, &decays, beta, scale, &mut o1);
                    } else {
                        x86::delta_rule_step256(&mut s1, &k, &q, &v, 0.93, beta, scale, &mut o1);
                    }
                    for (j, row) in s2.chunks_exact_mut(sd).enumerate() {
                        let kv = if channels {
                            for (x, &d) in row.iter_mut().zip(&decays) {
                                *x *= d;
                            }
                            x86::scale_dot256(1.0, row, &k)
                        } else {
                            x86::scale_dot256(0.93, row, &k)
                        };
                        o2[j] = x86::axpy_dot256((v[j] - kv) * beta, &k, row, &q) * scale;
                    }
                }
                assert_eq!(bits(&s1), bits(&s2), "state {rows}x{sd} channels {channels}");
                assert_eq!(bits(&o1), bits(&o2), "out {rows}x{sd} channels {channels}");
            }
        }
    }

    /// The one-visit delta-rule step equals scale_dot then axpy_dot row by row, bit for bit
    /// (state, outputs), for even and odd row counts and widths on and off the fast path.
    #[test]
    fn delta_rule_step_equals_the_two_sweeps() {
        for (rows, sd) in [(128, 128), (7, 64), (6, 32), (4, 48), (5, 40), (3, 7)] {
            let (s0, _) = vecs(rows * sd, (rows * sd) as u32);
            let (k, q) = vecs(sd, 3 + sd as u32);
            let (v, _) = vecs(rows, 11 + rows as u32);
            let (decay, beta, scale) = (0.93f32, 0.61f32, 1.0 / (sd as f32).sqrt());
            let mut s1 = s0.clone();
            let mut o1 = vec![0f32; rows];
            delta_rule_step(&mut s1, &k, &q, &v, decay, beta, scale, &mut o1);
            let mut s2 = s0.clone();
            let mut o2 = vec![0f32; rows];
            for (j, row) in s2.chunks_exact_mut(sd).enumerate() {
                let delta = (v[j] - scale_dot(decay, row, &k)) * beta;
                o2[j] = axpy_dot(delta, &k, row, &q) * scale;
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&s1), bits(&s2), "state {rows}x{sd}");
            assert_eq!(bits(&o1), bits(&o2), "out {rows}x{sd}");
        }
    }
}
