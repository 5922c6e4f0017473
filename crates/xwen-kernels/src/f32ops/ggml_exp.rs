//! ggml-cpu's exp-based f32 element-wise ops, bit for bit: SiLU (`ggml_vec_silu_f32`,
//! vec.cpp:380), SwiGLU (`ggml_vec_swiglu_f32`, vec.cpp:417) and the softmax of
//! `ggml_compute_forward_soft_max_f32` (ops.cpp:5813) with its `ggml_vec_soft_max_f32`
//! (vec.cpp:531), all of llama.cpp b11434.
//!
//! Why bit for bit: these activations are quantized (Q8_0/Q8_K/bf16) for the next matmul, and a
//! 1-ulp difference occasionally flips a rounding step there, which shows as a 1e-3 jump in the
//! logits. libm's expf is not what ggml uses on full vector chunks: vec.h's `ggml_v_expf` is a
//! polynomial with its own rounding, and only the `n % lanes` tail goes through libm's expf.
//!
//! Which `ggml_v_expf` ggml runs depends on the ISA it was compiled for (GGML_NATIVE):
//! - [`ExpFlavor::Avx2`], vec.h's `__AVX2__ && __FMA__` branch: 8 lanes.
//! - [`ExpFlavor::Avx512`], the `__AVX512F__ && __AVX512DQ__` branch: 16 lanes and a different
//!   algorithm (`_mm512_scalef_ps`, its own overflow handling), so its bits differ.
//!
//! Every lane is computed independently, so each flavour has an exact scalar emulation here
//! (`f32::mul_add` for each fused multiply-add, bit casts for the integer steps); SIMD paths are
//! held equal to it by tests. The flavour follows the CPU, as llama.cpp built with GGML_NATIVE
//! on that CPU would; capping the kernel set (`dispatch::set_max_isa`) below the CPU imitates an
//! AVX2 machine. Machines without AVX2+FMA (and non-x86) run the AVX2 flavour emulated — on
//! those llama.cpp uses its SSE2/NEON variants, which this module does not reproduce.
//!
//! Summation orders assume llama.cpp was built by GCC (its `_mm512_reduce_add_ps` tree).

use crate::isa as dispatch;

/// Which ggml `ggml_v_expf` to reproduce (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpFlavor {
    Avx2,
    Avx512,
}

impl ExpFlavor {
    /// Elements per vector chunk; the rest of a row goes through libm's expf.
    pub const fn lanes(self) -> usize {
        match self {
            ExpFlavor::Avx2 => 8,
            ExpFlavor::Avx512 => 16,
        }
    }
}

fn has_avx512_dq() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The flavour llama.cpp built natively for this CPU uses.
pub fn exp_flavor() -> ExpFlavor {
    let capped = !dispatch::force_reference() && dispatch::active() != dispatch::detected();
    if has_avx512_dq() && !capped {
        ExpFlavor::Avx512
    } else {
        ExpFlavor::Avx2
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Impl {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Emulated(ExpFlavor),
}

fn implementation() -> Impl {
    let flavor = exp_flavor();
    // On x86 any kernel set above Scalar includes AVX2+FMA; AVX-512F/DQ was checked by
    // exp_flavor.
    #[cfg(target_arch = "x86_64")]
    if dispatch::active() != dispatch::Isa::Scalar {
        return match flavor {
            ExpFlavor::Avx512 => Impl::Avx512,
            ExpFlavor::Avx2 => Impl::Avx2,
        };
    }
    Impl::Emulated(flavor)
}

// ---------- one lane of ggml_v_expf / ggml_v_silu ----------

const R: f32 = f32::from_bits(0x4b40_0000); // 0x1.8p23
const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b); // 0x1.715476p+0
const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 0x1.62e4p-1
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e); // 0x1.7f7d1cp-20
const P5: f32 = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7
const P4: f32 = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5
const P3: f32 = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3
const P2: f32 = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2
const P1: f32 = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1

/// Range reduction shared by both flavours: z = x·log2e + 1.5·2²³ puts round(x·log2e) in z's
/// low mantissa bits, n is that integer as a float, b = x − n·ln2 (ln2 in two parts).
#[inline(always)]
fn reduce(x: f32) -> (f32, f32, f32) {
    let z = x.mul_add(LOG2E, R);
    let n = z - R;
    // _mm_fnmadd_ps(a, b, c) = −(a·b) + c, fused; the negation is exact, so fma(−a, b, c) is it.
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    (z, n, b)
}

/// One lane of vec.h's AVX2+FMA `ggml_v_expf`.
#[inline]
pub fn v_expf_avx2_lane(x: f32) -> f32 {
    let (z, n, b) = reduce(x);
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits())); // 2^n
    let u = b * b;
    let j = P5
        .mul_add(b, P4)
        .mul_add(u, P3.mul_add(b, P2))
        .mul_add(u, P1 * b);
    // c is _CMP_GT_OQ, false for NaN. Without c, 2^n is a normal float: ggml's all-lanes fast
    // path computes fma(j, k, k) and its slow path fma(k, j, k) for such lanes, the same value.
    let c = n.abs() > 126.0;
    if !c {
        return j.mul_add(k, k);
    }
    // Scale in two steps so neither overflows or underflows early.
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// One lane of vec.h's AVX-512F/DQ `ggml_v_expf`.
#[inline]
pub fn v_expf_avx512_lane(x: f32) -> f32 {
    let (_, n, b) = reduce(x);
    let u = b * b;
    let j = P5
        .mul_add(b, P4)
        .mul_add(u, P3.mul_add(b, P2))
        .mul_add(u, P1.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n)
}

/// `_mm512_scalef_ps` for one lane: a·2^floor(b) rounded once. Only reached with |b| ≤ 192
/// (or NaN), where the f64 product is exact and the cast to f32 is the single rounding.
#[inline]
fn scalef(a: f32, b: f32) -> f32 {
    if b.is_nan() || a.is_nan() {
        return f32::NAN;
    }
    (a as f64 * 2f64.powi(b.floor() as i32)) as f32
}

#[inline]
pub fn v_expf_lane(flavor: ExpFlavor, x: f32) -> f32 {
    match flavor {
        ExpFlavor::Avx2 => v_expf_avx2_lane(x),
        ExpFlavor::Avx512 => v_expf_avx512_lane(x),
    }
}

/// One lane of `ggml_v_silu`: x / (1 + v_expf(0 − x)).
#[inline]
pub fn v_silu_lane(flavor: ExpFlavor, x: f32) -> f32 {
    x / (1.0 + v_expf_lane(flavor, 0.0 - x))
}

/// `ggml_silu_f32`, the scalar tail: libm's expf (Rust's f32::exp calls the same expf).
#[inline]
pub fn silu_scalar(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

// ---------- public ops ----------

/// y = silu(x) as `ggml_vec_silu_f32` on one row (ggml's unary ops run per row of ne0).
pub fn silu(x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    // SAFETY: lengths checked; x and y are distinct borrows.
    unsafe { silu_raw(implementation(), x.as_ptr(), y.as_mut_ptr(), x.len()) }
}

/// In-place [`silu`] on one row.
pub fn silu_inplace(x: &mut [f32]) {
    let p = x.as_mut_ptr();
    // SAFETY: every path reads element i before writing element i, and nothing else.
    unsafe { silu_raw(implementation(), p, p, x.len()) }
}

/// y = silu(g)·u as `ggml_vec_swiglu_f32` on one row (ggml_swiglu_split(gate, up)).
pub fn swiglu(g: &[f32], u: &[f32], y: &mut [f32]) {
    assert!(g.len() == u.len() && g.len() == y.len());
    match implementation() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were detected at run time; lengths checked.
        Impl::Avx512 => unsafe { x86::swiglu512(g, u, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Impl::Avx2 => unsafe { x86::swiglu256(g, u, y) },
        Impl::Emulated(f) => swiglu_emulated(f, g, u, y),
    }
}

/// Softmax of one row as `ggml_soft_max` (scale 1, no mask): the MoE router's op.
pub fn softmax_inplace(x: &mut [f32]) {
    let n = x.len();
    softmax_masked_inplace(x, n);
}

/// Softmax of one row of `row_len` columns of which only the first `x.len()` are unmasked, as
/// `ggml_soft_max_ext` with a 0/−inf mask (causal attention, where llama.cpp's row is the KV
/// length padded to 256). The masked columns give exp = 0, but they fill up the last vector
/// chunk, whose sum then comes from the vector reduction instead of the scalar tail: that
/// changes the sum's rounding, hence `row_len`. Scores must already carry ggml's `scale`.
pub fn softmax_masked_inplace(x: &mut [f32], row_len: usize) {
    assert!(row_len >= x.len());
    if x.is_empty() {
        return;
    }
    let max = ggml_max(x);
    let sum = match implementation() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were detected at run time.
        Impl::Avx512 => unsafe { x86::exp_sum512(x, max, row_len) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Impl::Avx2 => unsafe { x86::exp_sum256(x, max, row_len) },
        Impl::Emulated(f) => exp_sum_emulated(f, x, max, row_len),
    };
    // ggml: sum = 1.0/sum in double, then ggml_vec_scale_f32 takes it as a float.
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `ggml_vec_soft_max_f32(row_len, x, x, max)` over a row whose columns from x.len() on are
/// −inf: x ← exp(x − max) (ggml's vector expf on full chunks, libm's on the tail) and the f64
/// sum, unnormalized — flash attention's per-tile step.
pub fn soft_max_sum(x: &mut [f32], max: f32, row_len: usize) -> f64 {
    assert!(row_len >= x.len());
    if x.is_empty() {
        return 0.0;
    }
    match implementation() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were detected at run time.
        Impl::Avx512 => unsafe { x86::exp_sum512(x, max, row_len) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Impl::Avx2 => unsafe { x86::exp_sum256(x, max, row_len) },
        Impl::Emulated(f) => exp_sum_emulated(f, x, max, row_len),
    }
}

/// ggml_vec_max_f32: max = MAX(max, x[i]) with MAX(a, b) = a > b ? a : b.
fn ggml_max(x: &[f32]) -> f32 {
    x.iter()
        .fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v })
}

// ---------- the emulated (portable) paths ----------

/// # Safety
/// `x` readable and `y` writable for `n` elements; if they overlap, then exactly (in place).
unsafe fn silu_raw(imp: Impl, x: *const f32, y: *mut f32, n: usize) {
    match imp {
        #[cfg(target_arch = "x86_64")]
        Impl::Avx512 => x86::silu512(x, y, n),
        #[cfg(target_arch = "x86_64")]
        Impl::Avx2 => x86::silu256(x, y, n),
        Impl::Emulated(f) => silu_emulated_raw(f, x, y, n),
    }
}

unsafe fn silu_emulated_raw(flavor: ExpFlavor, x: *const f32, y: *mut f32, n: usize) {
    let full = n / flavor.lanes() * flavor.lanes();
    for i in 0..full {
        *y.add(i) = v_silu_lane(flavor, *x.add(i));
    }
    for i in full..n {
        *y.add(i) = silu_scalar(*x.add(i));
    }
}

/// [`silu`] computed by the scalar emulation of `flavor` whatever the CPU (tests, bisecting).
pub fn silu_emulated(flavor: ExpFlavor, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    // SAFETY: lengths checked; distinct borrows.
    unsafe { silu_emulated_raw(flavor, x.as_ptr(), y.as_mut_ptr(), x.len()) }
}

/// [`swiglu`] by the scalar emulation of `flavor`.
pub fn swiglu_emulated(flavor: ExpFlavor, g: &[f32], u: &[f32], y: &mut [f32]) {
    assert!(g.len() == u.len() && g.len() == y.len());
    let full = g.len() / flavor.lanes() * flavor.lanes();
    for i in 0..full {
        y[i] = v_silu_lane(flavor, g[i]) * u[i];
    }
    for i in full..g.len() {
        y[i] = silu_scalar(g[i]) * u[i];
    }
}

/// [`softmax_masked_inplace`] by the scalar emulation of `flavor`.
pub fn softmax_masked_emulated(flavor: ExpFlavor, x: &mut [f32], row_len: usize) {
    assert!(row_len >= x.len());
    if x.is_empty() {
        return;
    }
    let max = ggml_max(x);
    let inv = (1.0 / exp_sum_emulated(flavor, x, max, row_len)) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// The horizontal sum of one chunk in ggml's order: AVX2's extract/movehl/movehdup sequence,
/// or GCC's `_mm512_reduce_add_ps` tree.
fn hsum_emulated(flavor: ExpFlavor, v: &[f32]) -> f32 {
    match flavor {
        ExpFlavor::Avx2 => ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])),
        ExpFlavor::Avx512 => {
            let t3: [f32; 8] = std::array::from_fn(|i| v[i + 8] + v[i]);
            let t6: [f32; 4] = std::array::from_fn(|i| t3[i + 4] + t3[i]);
            (t6[0] + t6[2]) + (t6[1] + t6[3])
        }
    }
}

/// x ← exp(x − max) as `ggml_vec_soft_max_f32` over a row of `row_len` columns whose columns
/// from x.len() on are −inf; returns the f64 sum.
fn exp_sum_emulated(flavor: ExpFlavor, x: &mut [f32], max: f32, row_len: usize) -> f64 {
    let w = flavor.lanes();
    let n = x.len();
    let mut sum = 0.0f64;
    let mut chunk = [0.0f32; 16];
    let mut i = 0;
    while i < n {
        if i + w > row_len {
            // ggml's scalar tail (libm expf); masked columns there add expf(−inf) = 0.
            for v in &mut x[i..] {
                let e = (*v - max).exp();
                sum += e as f64;
                *v = e;
            }
            break;
        }
        let m = (n - i).min(w); // < w only for the last chunk, padded with masked columns
        for l in 0..w {
            let xl = if l < m { x[i + l] } else { f32::NEG_INFINITY };
            chunk[l] = v_expf_lane(flavor, xl - max);
        }
        x[i..i + m].copy_from_slice(&chunk[..m]);
        sum += hsum_emulated(flavor, &chunk[..w]) as f64;
        i += w;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[path = "ggml_exp_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "ggml_exp_tests.rs"]
mod tests;
