//! AVX2 + FMA + F16C kernels. The structure follows ggml-cpu/arch/x86/quants.c's AVX2 paths
//! (integer products with maddubs/madd per block, one f32 FMA per block or super-block), so
//! results differ from the scalar twins only in float summation order.
//!
//! maddubs takes an unsigned and a signed byte: every kernel feeds it a non-negative weight
//! code (or |x| with the sign moved onto the activation) and an activation in -127..=127, which
//! all of ggml's activation quantizers guarantee (an activation byte of -128 would overflow
//! the sign trick, in ggml as here).
//!
//! Every `unsafe fn` here requires AVX2, FMA and F16C; `dot_fn` hands out safe wrappers that
//! dispatch only calls after detecting them.

use std::arch::x86_64::*;

use crate::formats::legacy::KVALUES_IQ4NL;
use crate::formats::{q3_k, DotFn};
use crate::half::f16_to_f32;
use crate::GgmlType;

macro_rules! safe_wrapper {
    ($name:ident, $inner:ident) => {
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only reachable through `dot_fn`, which dispatch calls after detecting
            // AVX2/FMA/F16C; slice lengths were checked by the callers (check_dot_args).
            unsafe { $inner(n, w, a) }
        }
    };
}

safe_wrapper!(q8_0, dot_q8_0);
safe_wrapper!(q4_0, dot_q4_0);
safe_wrapper!(q4_1, dot_q4_1);
safe_wrapper!(q5_0, dot_q5_0);
safe_wrapper!(q5_1, dot_q5_1);
safe_wrapper!(iq4_nl, dot_iq4_nl);
safe_wrapper!(q2_k, dot_q2_k);
safe_wrapper!(q3_k, dot_q3_k);
safe_wrapper!(q4_k, dot_q4_k);
safe_wrapper!(q5_k, dot_q5_k);
safe_wrapper!(q6_k, dot_q6_k);
safe_wrapper!(iq4_xs, dot_iq4_xs);
safe_wrapper!(f32d, dot_f32);
safe_wrapper!(f16d, dot_f16);
safe_wrapper!(bf16d, dot_bf16);

/// One Q8_0 row streamed from DRAM (see `dot_q8_0_stream`): bit-identical to `q8_0`.
pub fn q8_0_stream(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(n.is_multiple_of(32) && w.len() >= n / 32 * 34 && a.len() >= n / 32 * 34);
    // SAFETY: reachable only through dispatch::row_kernel, after detecting AVX2/FMA/F16C;
    // lengths checked above.
    unsafe { dot_q8_0_stream(n, w, a) }
}

pub fn dot_fn(weight: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    Some(match weight {
        T::Q8_0 => q8_0,
        T::Q4_0 => q4_0,
        T::Q4_1 => q4_1,
        T::Q5_0 => q5_0,
        T::Q5_1 => q5_1,
        T::IQ4_NL => iq4_nl,
        T::Q2_K => q2_k,
        T::Q3_K => q3_k,
        T::Q4_K => q4_k,
        T::Q5_K => q5_k,
        T::Q6_K => q6_k,
        T::IQ4_XS => iq4_xs,
        T::F32 => f32d,
        T::F16 => f16d,
        T::BF16 => bf16d,
        _ => return None,
    })
}

/// f16 at p[off..off+2] to f32 with F16C (the software conversion costs more than a Q8_0 block).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn h2f(p: &[u8], off: usize) -> f32 {
    debug_assert!(off + 2 <= p.len());
    let h = (p.as_ptr().add(off) as *const u16).read_unaligned();
    _mm_cvtss_f32(cvtph_ps(h as u32))
}

/// The two f16 of `h` (low half first) as lanes 0 and 1 (lanes 2, 3 zero). Through asm so the
/// input is materialized with vmovd: given the intrinsic, LLVM merges the load into a
/// `vpinsrw` on an arbitrary register, often the loop's accumulator, which chains every block
/// on the previous block's FMA (3x slower Q8_0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn cvtph_ps(h: u32) -> __m128 {
    let v = _mm_cvtsi32_si128(h as i32);
    let r: __m128;
    std::arch::asm!("vcvtph2ps {o}, {i}", i = in(xmm_reg) v, o = lateout(xmm_reg) r,
        options(pure, nomem, nostack, preserves_flags));
    r
}

/// The four f16 at p[off..off+8] as f32 lanes, converted straight from memory (`vcvtph2ps xmm,
/// m64`): no integer load and `vmovd` into a vector register as `cvtph_ps` needs (two of a Q8_0
/// block's ~14 vector ops, on the path to the block's FMA). Callers wanting fewer halves keep
/// the low lanes; the 8 bytes must lie inside the slice (a block's scale and what follows it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn cvtph_ps_at(p: &[u8], off: usize) -> __m128 {
    debug_assert!(off + 8 <= p.len());
    let r: __m128;
    std::arch::asm!("vcvtph2ps {o}, qword ptr [{p}]", p = in(reg) p.as_ptr().add(off), o = lateout(xmm_reg) r,
        options(pure, readonly, nostack, preserves_flags));
    r
}

/// f16 at p[off..off+2] to f32 through `cvtph_ps_at` (so p[off..off+8] must lie inside p).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn h2f_wide(p: &[u8], off: usize) -> f32 {
    _mm_cvtss_f32(cvtph_ps_at(p, off))
}

pub(crate) use super::prefetch::prefetch_ahead;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load(p: &[u8], off: usize) -> __m256i {
    debug_assert!(off + 32 <= p.len());
    _mm256_loadu_si256(p.as_ptr().add(off) as *const __m256i)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f32at(p: &[u8], off: usize) -> f32 {
    debug_assert!(off + 4 <= p.len());
    (p.as_ptr().add(off) as *const f32).read_unaligned()
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load128(p: &[u8], off: usize) -> __m128i {
    debug_assert!(off + 16 <= p.len());
    _mm_loadu_si128(p.as_ptr().add(off) as *const __m128i)
}

/// Sum of products of signed bytes as 8 i32 lanes (ggml's mul_sum_i8_pairs without the float).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// Unsigned x signed bytes summed to 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_u8_i8(ux: __m256i, sy: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(ux, sy), _mm256_set1_epi16(1))
}

/// 32 nibbles of 16 bytes: low nibbles in bytes 0..16, high nibbles in 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles32(p: &[u8], off: usize) -> __m256i {
    let t = load128(p, off);
    let both = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// Bit j of the u32 at p[off..off+4] spread to byte j as 0x10 (the Q5 fifth bit).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits32_to_0x10(p: &[u8], off: usize) -> __m256i {
    let h = u32::from_le_bytes([p[off], p[off + 1], p[off + 2], p[off + 3]]);
    let shuf = _mm256_setr_epi64x(
        0,
        0x0101010101010101,
        0x0202020202020202,
        0x0303030303030303,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(h as i32), shuf);
    let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0_impl::<false>(n, w, a)
}

/// `dot_q8_0` with the weights prefetched `PREFETCH_AHEAD` bytes ahead, one line per two
/// blocks: the decode kernel of Q8_0 matrices, which come from DRAM once per token. One row at
/// a time keeps each thread on one sequential stream: a group of 4 rows per call (four FMA
/// chains overlapping, faster in cache) streamed 11-26% slower than this from DRAM, most on
/// the 35B's 2048-column rows (examples/stream_probe; docs/bench.md "Decode Q8_0: one sequential stream per thread").
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_stream(n: usize, w: &[u8], a: &[u8]) -> f32 {
    dot_q8_0_impl::<true>(n, w, a)
}

/// ggml_vec_dot_q8_0_q8_0's order; `PREFETCH` adds the decode kernel's lookahead.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_impl<const PREFETCH: bool>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 32 {
        let b = i * 34;
        if PREFETCH && i % 2 == 0 {
            prefetch_ahead(w.as_ptr().add(b));
        }
        // a Q8_0 block is 34 bytes: the 8 bytes from its scale lie inside it
        let d = _mm256_set1_ps(h2f_wide(w, b) * h2f_wide(a, b));
        let p = mul_sum_i8(load(w, b + 2), load(a, b + 2));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 32 {
        let (bw, ba) = (i * 18, i * 34);
        let d = _mm256_set1_ps(h2f(w, bw) * h2f(a, ba));
        let q = _mm256_sub_epi8(nibbles32(w, bw + 2), _mm256_set1_epi8(8));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(mul_sum_i8(q, load(a, ba + 2))), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..n / 32 {
        let (bw, ba) = (i * 20, i * 36);
        summs += h2f(w, bw + 2) * h2f(a, ba + 2);
        let d = _mm256_set1_ps(h2f(w, bw) * h2f(a, ba));
        let p = mul_sum_u8_i8(nibbles32(w, bw + 4), load(a, ba + 4));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc) + summs
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 32 {
        let (bw, ba) = (i * 22, i * 34);
        let d = _mm256_set1_ps(h2f(w, bw) * h2f(a, ba));
        let q = _mm256_or_si256(nibbles32(w, bw + 6), bits32_to_0x10(w, bw + 2));
        let q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(mul_sum_i8(q, load(a, ba + 2))), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_1(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..n / 32 {
        let (bw, ba) = (i * 24, i * 36);
        summs += h2f(w, bw + 2) * h2f(a, ba + 2);
        let d = _mm256_set1_ps(h2f(w, bw) * h2f(a, ba));
        let q = _mm256_or_si256(nibbles32(w, bw + 8), bits32_to_0x10(w, bw + 4));
        acc = _mm256_fmadd_ps(
            d,
            _mm256_cvtepi32_ps(mul_sum_u8_i8(q, load(a, ba + 4))),
            acc,
        );
    }
    hsum_ps(acc) + summs
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_lookup(q: __m256i) -> __m256i {
    let t = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), q)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_nl(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // llamafile's tinyBLAS_Q0_AVX (2+ tokens, a matrix not repacked): one 8-lane accumulator
    // over the blocks, then hsum
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 32 {
        let (bw, ba) = (i * 18, i * 34);
        let d = _mm256_set1_ps(h2f(w, bw) * h2f(a, ba));
        let q = iq4_lookup(nibbles32(w, bw + 2));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(mul_sum_i8(q, load(a, ba + 2))), acc);
    }
    hsum_ps(acc)
}

/// ggml_vec_dot_iq4_nl_q8_0 (AVX2): what llama.cpp computes for one token (and for every token
/// of a MUL_MAT_ID) with an IQ4_NL matrix it did not repack.
pub fn dot_iq4_nl_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: handed out by dispatch only after detecting AVX2/FMA/F16C; callers checked the
    // slice lengths (n / 32 blocks each).
    unsafe { dot_iq4_nl_ggml(n, w, a) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_nl_ggml(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // ggml_vec_dot_iq4_nl_q8_0 (AVX2): blocks in pairs, even ones into accum1, odd ones into
    // accum2, hsum of their sum; an odd last block in scalar, `sumf += d * sumi`, product
    // rounded first: GCC 13 (the device machine's build, which made the committed fixtures and
    // the random-geometry records) keeps it apart; GCC 12 contracts it into one FMA, so two
    // builds of one llama.cpp source differ here by an ulp (docs/parity.md)
    let nb = n / 32;
    let mut acc = [_mm256_setzero_ps(); 2];
    let block = |i: usize| {
        let (bw, ba) = (i * 18, i * 34);
        let d = h2f(w, bw) * h2f(a, ba);
        (d, mul_sum_i8(iq4_lookup(nibbles32(w, bw + 2)), load(a, ba + 2)))
    };
    let mut i = 0;
    while i + 1 < nb {
        for (k, ac) in acc.iter_mut().enumerate() {
            let (d, p) = block(i + k);
            *ac = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), *ac);
        }
        i += 2;
    }
    let mut s = hsum_ps(_mm256_add_ps(acc[0], acc[1]));
    if i < nb {
        let (d, p) = block(i);
        s += d * hsum_i32(p) as f32;
    }
    s
}

/// Q4_0 / IQ4_NL in llama.cpp's AVX2 repacked layout (block_q4_0x8, ggml_gemv / gemm
/// `_q4_0_8x8_q8_0`, `_iq4_nl_8x8_q8_0`): each block's integer dot is exact and every output
/// is one float chain over the blocks, acc = fma(f32(Σ), d_w·d_a, acc), with no lanes — for the
/// one-token gemv and the 4-token gemm alike.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_b32_repacked<const IQ4: bool>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for i in 0..n / 32 {
        let (bw, ba) = (i * 18, i * 34);
        let q = if IQ4 { iq4_lookup(nibbles32(w, bw + 2)) } else { _mm256_sub_epi8(nibbles32(w, bw + 2), _mm256_set1_epi8(8)) };
        let s = hsum_i32(mul_sum_i8(q, load(a, ba + 2)));
        acc = (s as f32).mul_add(h2f(w, bw) * h2f(a, ba), acc);
    }
    acc
}

/// `dot_b32_repacked` for Q4_0.
pub fn dot_q4_0_repacked(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: handed out by dispatch only after detecting AVX2/FMA/F16C; callers checked the
    // slice lengths (n / 32 blocks each).
    unsafe { dot_b32_repacked::<false>(n, w, a) }
}

/// `dot_b32_repacked` for IQ4_NL.
pub fn dot_iq4_nl_repacked(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as `dot_q4_0_repacked`.
    unsafe { dot_b32_repacked::<true>(n, w, a) }
}

/// Q8_K block field offsets.
pub(super) const QK: usize = 256;
pub(super) const Q8K: usize = 292;

/// 16 bsums of a Q8_K block summed pairwise: the 8 sums over 32 elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bsums32(a: &[u8], ba: usize) -> __m128i {
    let s = load(a, ba + 4 + QK);
    _mm_hadd_epi16(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1))
}

/// Byte shuffles that broadcast i16 lane k of a 128-bit vector to all 16 lanes
/// (ggml's get_scale_shuffle_k4).
static SHUF_I16: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut k = 0;
    while k < 8 {
        let mut i = 0;
        while i < 16 {
            t[k][2 * i] = 2 * k as u8;
            t[k][2 * i + 1] = 2 * k as u8 + 1;
            i += 1;
        }
        k += 1;
    }
    t
};

/// Q4_K/Q5_K scales and mins as 8 + 8 i16 lanes ([scales | mins]), ggml's kmask unpacking.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn k4_scales_mins(b: &[u8], off: usize) -> __m256i {
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    debug_assert!(off + 12 <= b.len());
    let p = b.as_ptr().add(off) as *const u32;
    let (u0, u1, u2) = (
        p.read_unaligned(),
        p.add(1).read_unaligned(),
        p.add(2).read_unaligned(),
    );
    let m_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let m_lo = u1 & KMASK1;
    let s_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let s_lo = u0 & KMASK1;
    _mm256_cvtepu8_epi16(_mm_setr_epi32(
        s_lo as i32,
        s_hi as i32,
        m_lo as i32,
        m_hi as i32,
    ))
}

/// A Q4_K block's eight sub-block dot products with a Q8_K block, each times its 6-bit scale,
/// as i32 lanes: (the low-nibble sub-blocks 0, 2, 4, 6; the high-nibble ones 1, 3, 5, 7) —
/// ggml's `sumi_1`, `sumi_2`. `sc` holds the scales as i16 lanes 0..8 of both 128-bit halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4k_scaled_dots(w: &[u8], bw: usize, a: &[u8], ba: usize, sc: __m256i) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0f);
    // two accumulators: the adds of low and high nibbles' products do not wait on each other
    let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for j in 0..4 {
        let q4 = load(w, bw + 16 + 32 * j);
        let q4l = _mm256_and_si256(q4, m4);
        let q4h = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
        let pl = _mm256_maddubs_epi16(q4l, load(a, ba + 4 + 64 * j));
        let ph = _mm256_maddubs_epi16(q4h, load(a, ba + 4 + 64 * j + 32));
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(bcast_i16(sc, 2 * j), pl));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(bcast_i16(sc, 2 * j + 1), ph));
    }
    (s0, s1)
}

/// Broadcast i16 lane k (0..8) of `v128` (both 128-bit halves hold the same 8 lanes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bcast_i16(v: __m256i, k: usize) -> __m256i {
    // asm: given the intrinsic, LLVM sees the table and emits a shift plus a `vpbroadcastw`
    // (two shuffle-port ops instead of one); the Q4_K gemv ran 8-10% slower that way.
    let r: __m256i;
    std::arch::asm!("vpshufb {o}, {v}, [{t}]", o = lateout(ymm_reg) r, v = in(ymm_reg) v,
        t = in(reg) SHUF_I16[k].as_ptr(), options(pure, readonly, nostack, preserves_flags));
    r
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..n / QK {
        let (bw, ba) = (i * 144, i * Q8K);
        let dy = f32at(a, ba);
        let d = dy * h2f(w, bw);
        let dmin = -dy * h2f(w, bw + 2);
        let sm = k4_scales_mins(w, bw + 4);
        let prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), bsums32(a, ba));
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        let (s0, s1) = q4k_scaled_dots(w, bw, a, ba, sc);
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(d),
            _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)),
            acc,
        );
    }
    let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    hsum_ps(acc) + _mm_cvtss_f32(m)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let m1 = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..n / QK {
        let (bw, ba) = (i * 176, i * Q8K);
        let dy = f32at(a, ba);
        let d = dy * h2f(w, bw);
        let dmin = -dy * h2f(w, bw + 2);
        let sm = k4_scales_mins(w, bw + 4);
        let prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), bsums32(a, ba));
        // Unlike Q4_K, ggml's AVX2 Q5_K sums the mins term per super-block as an integer and
        // accumulates it in a scalar, which GCC contracts to one fused multiply-add.
        let z = _mm_setzero_si128();
        let msum = _mm_cvtsi128_si32(_mm_hadd_epi32(_mm_hadd_epi32(prod, z), z));
        summs = dmin.mul_add(msum as f32, summs);
        let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        let mut hbits = load(w, bw + 16);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let q4 = load(w, bw + 48 + 32 * j);
            let hl = _mm256_slli_epi16(_mm256_and_si256(hbits, m1), 4);
            let hh = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), m1), 4);
            hbits = _mm256_srli_epi16(hbits, 2);
            let q5l = _mm256_or_si256(_mm256_and_si256(q4, m4), hl);
            let q5h = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), hh);
            let pl = _mm256_maddubs_epi16(q5l, load(a, ba + 4 + 64 * j));
            let ph = _mm256_maddubs_epi16(q5h, load(a, ba + 4 + 64 * j + 32));
            let pl = _mm256_madd_epi16(bcast_i16(sc, 2 * j), pl);
            let ph = _mm256_madd_epi16(bcast_i16(sc, 2 * j + 1), ph);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) + summs
}

/// Q6_K's two high bits (already shifted down to bits 0..1) moved to bits 4..5.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_hi(v: __m256i) -> __m256i {
    _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi8(3)), 4)
}

/// Byte shuffles giving 8 copies of byte 2p then 8 of byte 2p+1 (ggml's get_scale_shuffle).
static SHUF_PAIR: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut p = 0;
    while p < 8 {
        let mut i = 0;
        while i < 8 {
            t[p][i] = 2 * p as u8;
            t[p][i + 8] = 2 * p as u8 + 1;
            i += 1;
        }
        p += 1;
    }
    t
};

/// Scales 2p and 2p+1 of 16 signed byte scales as 8+8 i16 lanes, matching the maddubs output
/// of 32 bytes that span two 16-element groups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scale_pair(scales: __m128i, p: usize) -> __m256i {
    let shuf = _mm_loadu_si128(SHUF_PAIR[p].as_ptr() as *const __m128i);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf))
}

/// Half h (128 codes) of the Q6_K block at `bw`, as four vectors of 32 unsigned codes (0..63)
/// in element order: the low nibbles of ql with qh's 2-bit highs (`q6_hi`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_half(w: &[u8], bw: usize, h: usize) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0f);
    let q4b1 = load(w, bw + 64 * h);
    let q4b2 = load(w, bw + 64 * h + 32);
    let qh = load(w, bw + 128 + 32 * h);
    [
        _mm256_or_si256(_mm256_and_si256(q4b1, m4), q6_hi(qh)),
        _mm256_or_si256(_mm256_and_si256(q4b2, m4), q6_hi(_mm256_srli_epi16(qh, 2))),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4b1, 4), m4), q6_hi(_mm256_srli_epi16(qh, 4))),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4b2, 4), m4), q6_hi(_mm256_srli_epi16(qh, 6))),
    ]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / QK {
        let (bw, ba) = (i * 210, i * Q8K);
        for l in 0..4 {
            super::prefetch::prefetch_ahead_l2(w.as_ptr().add(bw + 64 * l));
        }
        let d = f32at(a, ba) * h2f(w, bw + 208);
        let scales = load128(w, bw + 192);
        let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for h in 0..2 {
            for (k, &qk) in q6_half(w, bw, h).iter().enumerate() {
                let q8 = load(a, ba + 4 + 128 * h + 32 * k);
                let p = _mm256_maddubs_epi16(qk, q8);
                let v = _mm256_madd_epi16(scale_pair(scales, 4 * h + k), p);
                if k % 2 == 0 {
                    s0 = _mm256_add_epi32(s0, v);
                } else {
                    s1 = _mm256_add_epi32(s1, v);
                }
            }
        }
        let sumi = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), q6_offset(w, bw, a, ba));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// The q - 32 offset of a Q6_K super-block, per i32 lane as ggml's AVX2 vec_dot subtracts it
/// (32·Σ scale·bsum over sub-block pairs): the lanes' float sum must see ggml's per-lane split.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_offset(w: &[u8], bw: usize, a: &[u8], ba: usize) -> __m256i {
    let scales16 = _mm256_cvtepi8_epi16(load128(w, bw + 192));
    _mm256_slli_epi32(_mm256_madd_epi16(load(a, ba + 4 + QK), scales16), 5)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q2_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // ggml_vec_dot_q2_K_q8_K (AVX2, b11434): per block, the mins' products with the bsums
    // (8 i32 lanes of pairs) join the lanes' accumulator with −d_y·dmin first, then the
    // scaled codes with d_y·d; one hsum at the end
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / QK {
        let (bw, ba) = (i * 84, i * Q8K);
        let dy = f32at(a, ba);
        let (d, dmin) = (dy * h2f(w, bw + 80), -dy * h2f(w, bw + 82));
        let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(load128(w, bw), 4), _mm_set1_epi8(0x0f)));
        let prod = _mm256_madd_epi16(mins, load(a, ba + 4 + QK));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let qb = load(w, bw + 16 + 32 * h);
            for k in 0..4 {
                let q = _mm256_and_si256(_mm256_srl_epi16(qb, _mm_cvtsi32_si128(2 * k as i32)), m3);
                let p = _mm256_maddubs_epi16(q, load(a, ba + 4 + 128 * h + 32 * k));
                let g = 8 * h + 2 * k;
                let s = _mm256_setr_m128i(
                    _mm_set1_epi16((w[bw + g] & 0xf) as i16),
                    _mm_set1_epi16((w[bw + g + 1] & 0xf) as i16),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Q2_K in the repacked kernels' order (`crate::q2k_repack`): ggml_gemv_q2_K_8x8_q8_K.
pub fn dot_q2_k_gemv(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: handed out by dispatch only after detecting AVX2/FMA/F16C; lengths checked by
    // the callers.
    unsafe { dot_q2_k_repacked::<false>(n, w, a) }
}

/// Q2_K in ggml_gemm_q2_K_8x8_q8_K's order (a row of a 4-token group).
pub fn dot_q2_k_gemm(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: as in `dot_q2_k_gemv`.
    unsafe { dot_q2_k_repacked::<true>(n, w, a) }
}

/// `dot_q2_k`'s integer work per 128-element half, reduced to exact scalars before the
/// repacked kernels' scalar FMAs (one per block for the gemv, one per half for the gemm).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q2_k_repacked<const GEMM: bool>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let (mut acc, mut accm) = (0f32, 0f32);
    for i in 0..n / QK {
        let (bw, ba) = (i * 84, i * Q8K);
        let dy = f32at(a, ba);
        let (d, dmin) = (h2f(w, bw + 80) * dy, h2f(w, bw + 82) * dy);
        let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(load128(w, bw), 4), _mm_set1_epi8(0x0f)));
        // lane l: sub-blocks 2l and 2l + 1, so lanes 0..4 are the first half's
        let prod = _mm256_madd_epi16(mins, load(a, ba + 4 + QK));
        let m = [hsum_i32x4(_mm256_castsi256_si128(prod)), hsum_i32x4(_mm256_extracti128_si256(prod, 1))];
        let mut s = [0i32; 2];
        for (h, sh) in s.iter_mut().enumerate() {
            let qb = load(w, bw + 16 + 32 * h);
            let mut sumi = _mm256_setzero_si256();
            for k in 0..4 {
                let q = _mm256_and_si256(_mm256_srl_epi16(qb, _mm_cvtsi32_si128(2 * k as i32)), m3);
                let p = _mm256_maddubs_epi16(q, load(a, ba + 4 + 128 * h + 32 * k));
                let g = 8 * h + 2 * k;
                let sc = _mm256_setr_m128i(_mm_set1_epi16((w[bw + g] & 0xf) as i16), _mm_set1_epi16((w[bw + g + 1] & 0xf) as i16));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, p));
            }
            *sh = hsum_i32x4(_mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256(sumi, 1)));
        }
        if GEMM {
            for h in 0..2 {
                acc = (s[h] as f32).mul_add(d, acc);
                accm = (m[h] as f32).mul_add(dmin, accm);
            }
        } else {
            acc = ((s[0] + s[1]) as f32).mul_add(d, acc);
            accm = ((m[0] + m[1]) as f32).mul_add(dmin, accm);
        }
    }
    acc - accm
}

/// The sum of four i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_i32x4(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q3_k(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / QK {
        let (bw, ba) = (i * 110, i * Q8K);
        let d = f32at(a, ba) * h2f(w, bw + 108);
        let sc = q3_k::scales(&w[bw + 96..bw + 108]);
        let hm = load(w, bw);
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let qb = load(w, bw + 32 + 32 * h);
            for k in 0..4 {
                let low =
                    _mm256_and_si256(_mm256_srl_epi16(qb, _mm_cvtsi32_si128(2 * k as i32)), m3);
                // high bit (4h + k) of hmask[l]: set -> +0, clear -> -4
                let bit = _mm256_set1_epi8(1u8.wrapping_shl((4 * h + k) as u32) as i8);
                let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                let q = _mm256_sub_epi8(low, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
                let p = mul_sum_i8(q, load(a, ba + 4 + 128 * h + 32 * k));
                // mul_sum_i8 already reduced to i32 over groups of 4 bytes: lanes 0..3 are the
                // first 16 elements, lanes 4..7 the second 16.
                let g = 8 * h + 2 * k;
                let s = _mm256_setr_epi32(
                    sc[g] as i32,
                    sc[g] as i32,
                    sc[g] as i32,
                    sc[g] as i32,
                    sc[g + 1] as i32,
                    sc[g + 1] as i32,
                    sc[g + 1] as i32,
                    sc[g + 1] as i32,
                );
                sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(p, s));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_xs(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / QK {
        let (bw, ba) = (i * 136, i * Q8K);
        let d = f32at(a, ba) * h2f(w, bw);
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let q = iq4_lookup(nibbles32(w, bw + 8 + 16 * ib));
            let p = mul_sum_i8(q, load(a, ba + 4 + 32 * ib));
            let s = crate::formats::iq4::xs_scale(&w[bw..], ib);
            sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(p, _mm256_set1_epi32(s)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // F32 weight matrices (MoE routers) go through llamafile's tinyBLAS in llama.cpp on AVX2
    // for batches of 2+ tokens (sgemm.cpp: one 8-lane FMA accumulator per output over k, the
    // k % 8 tail one more zero-padded step — x86 tinyBLAS takes any k — then hsum). Matching its
    // order keeps router probabilities bit-identical, which keeps near-tie expert choices
    // identical. Single tokens take `dot_f32_vec_dot` (tinyBLAS refuses n < 2).
    debug_assert!(w.len() >= 4 * n && a.len() >= 4 * n);
    crate::f32ops::x86::dot256_tinyblas_raw(w.as_ptr() as *const f32, a.as_ptr() as *const f32, n)
}

/// dst[j·dst_stride + i] = src[i·src_stride + j] for an 8×8 block of floats (i rows of src,
/// j columns): the lane products' output tiles (rows × tokens) into y (tokens × rows).
///
/// # Safety
/// AVX available; src holds 8 rows of 8 floats at src_stride, dst 8 rows of 8 at dst_stride.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn transpose8x8(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
    let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * src_stride)));
    // pairs of rows interleaved, then quads, then the 128-bit halves exchanged
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    let c = [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ];
    for (j, v) in c.iter().enumerate() {
        _mm256_storeu_ps(dst.add(j * dst_stride), *v);
    }
}

/// Rows per call of `f32_block`.
pub const F32_BLOCK_ROWS: usize = 4;
/// Tokens per call of `f32_block`.
pub const F32_BLOCK_TOKENS: usize = 3;

/// `out[r][t]` = `dot_f32(n, row r, token t)` for R rows (`w`, stride `ws` floats) and T tokens
/// (`a`, stride `as_` floats), bit for bit: each output keeps its own single 8-lane FMA chain
/// over k and the same hsum (tinyBLAS's order), so computing R·T of them together changes no
/// result. One chain per call is bound by the FMA latency (~2 MACs/cycle for the MoE router
/// at prefill); twelve independent chains keep both FMA pipes busy.
///
/// # Safety
/// AVX2/FMA available; n % 8 == 0; `w` holds R rows and `a` T tokens of n floats at their
/// strides.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // acc[r][t] indexed by both loops
pub unsafe fn f32_block<const R: usize, const T: usize>(
    n: usize,
    w: *const f32,
    ws: usize,
    a: *const f32,
    as_: usize,
    out: &mut [[f32; T]; R],
) {
    debug_assert!(n.is_multiple_of(8));
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for i in (0..n).step_by(8) {
        let x: [__m256; T] = std::array::from_fn(|t| _mm256_loadu_ps(a.add(t * as_ + i)));
        for r in 0..R {
            let wr = _mm256_loadu_ps(w.add(r * ws + i));
            for t in 0..T {
                acc[r][t] = _mm256_fmadd_ps(wr, x[t], acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            out[r][t] = hsum_ps(acc[r][t]);
        }
    }
}

/// ggml_vec_dot_f32 (AVX2): 4 × 8-lane FMA accumulators over steps of 32, GGML_F32x8_REDUCE,
/// the tail added in double. What llama.cpp computes for an F32 weight against one token.
pub fn dot_f32_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: handed out by dispatch only after detecting AVX2/FMA/F16C; callers checked the
    // slice lengths (n f32 each).
    unsafe { dot_f32_ggml(n, w, a) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32_ggml(n: usize, w: &[u8], a: &[u8]) -> f32 {
    debug_assert!(w.len() >= 4 * n && a.len() >= 4 * n);
    crate::f32ops::dot256_raw_streaming(w.as_ptr() as *const f32, a.as_ptr() as *const f32, n)
}

/// F16 weights against 2+ tokens go through llamafile's tinyBLAS in llama.cpp on AVX2 (sgemm.cpp
/// tinyBLAS<8, __m256, __m256, ggml_fp16_t, ...>, the activations converted to F16 first): one
/// 8-lane FMA chain over k, the k % 8 tail as a zero-padded partial load, then hsum. One token
/// takes `dot_f16_vec_dot` (`dispatch::row_dot_fn`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let n8 = n / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    for i in (0..n8).step_by(8) {
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(load128(w, 2 * i)), _mm256_cvtph_ps(load128(a, 2 * i)), acc);
    }
    if n8 < n {
        let (mut x, mut y) = ([0u8; 16], [0u8; 16]);
        x[..2 * (n - n8)].copy_from_slice(&w[2 * n8..2 * n]);
        y[..2 * (n - n8)].copy_from_slice(&a[2 * n8..2 * n]);
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(load128(&x, 0)), _mm256_cvtph_ps(load128(&y, 0)), acc);
    }
    hsum_ps(acc)
}

/// ggml_vec_dot_f16 (AVX2 + F16C): 4 × 8-lane FMA accumulators over steps of 32, reduced as
/// GGML_F32x8_REDUCE (acc0+acc2, acc1+acc3, then the halves and two hadds) into a double, the
/// tail's float products added in double. What llama.cpp computes for an F16 weight against one
/// token.
pub fn dot_f16_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: handed out by dispatch only after detecting AVX2/FMA/F16C; callers checked the
    // slice lengths (n f16 each).
    unsafe { dot_f16_ggml(n, w, a) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_ggml(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let n32 = n / 32 * 32;
    for i in (0..n32).step_by(32) {
        for (k, ac) in acc.iter_mut().enumerate() {
            let x = _mm256_cvtph_ps(load128(w, 2 * (i + 8 * k)));
            let y = _mm256_cvtph_ps(load128(a, 2 * (i + 8 * k)));
            *ac = _mm256_fmadd_ps(x, y, *ac);
        }
    }
    let mut s = crate::f32ops::x86::ggml_reduce(acc) as f64;
    for i in n32..n {
        let x = f16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]]));
        let y = f16_to_f32(u16::from_le_bytes([a[2 * i], a[2 * i + 1]]));
        s += (x * y) as f64;
    }
    s as f32
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16x8(p: &[u8], off: usize) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(load128(p, off)),
        16,
    ))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // BF16 weights against 2+ tokens go through llamafile's tinyBLAS in llama.cpp on AVX2
    // (sgemm.cpp tinyBLAS<8, __m256, __m256, ggml_bf16_t, ...>): one 8-lane FMA accumulator over
    // k, the k % 8 tail as a zero-padded partial load, then hsum. One token takes
    // `dot_bf16_vec_dot`.
    let mut acc = _mm256_setzero_ps();
    let n8 = n / 8 * 8;
    for i in (0..n8).step_by(8) {
        acc = _mm256_fmadd_ps(bf16x8(w, 2 * i), bf16x8(a, 2 * i), acc);
    }
    if n8 < n {
        let (mut x, mut y) = ([0u8; 16], [0u8; 16]);
        x[..2 * (n - n8)].copy_from_slice(&w[2 * n8..2 * n]);
        y[..2 * (n - n8)].copy_from_slice(&a[2 * n8..2 * n]);
        acc = _mm256_fmadd_ps(bf16x8(&x, 0), bf16x8(&y, 0), acc);
    }
    hsum_ps(acc)
}

/// ggml_vec_dot_bf16 (AVX2): 4 × 8-lane accumulators over steps of 32 (multiply, then add:
/// GCC keeps them apart here), reduced (c1 + c3) + (c2 + c4), hsum, the tail in double. What
/// llama.cpp computes for a BF16 weight against one token.
pub fn dot_bf16_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: handed out by dispatch only after detecting AVX2/FMA/F16C; callers checked the
    // slice lengths (n bf16 each).
    unsafe { dot_bf16_ggml(n, w, a) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16_ggml(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut c = [_mm256_setzero_ps(); 4];
    let n32 = n / 32 * 32;
    for i in (0..n32).step_by(32) {
        for (k, ck) in c.iter_mut().enumerate() {
            let p = _mm256_mul_ps(bf16x8(w, 2 * (i + 8 * k)), bf16x8(a, 2 * (i + 8 * k)));
            *ck = _mm256_add_ps(p, *ck);
        }
    }
    let x = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
    let mut s = hsum_ps(x) as f64;
    for i in n32..n {
        let x = crate::half::bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]]));
        let y = crate::half::bf16_to_f32(u16::from_le_bytes([a[2 * i], a[2 * i + 1]]));
        s += (x * y) as f64;
    }
    s as f32
}

/// quantize_row_q8_0's AVX path (arch/x86/quants.c:302): id = 127/amax, round half to even.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    let sign = _mm256_set1_ps(-0.0);
    for (i, ob) in out.chunks_exact_mut(34).enumerate().take(x.len() / 32) {
        let p = x.as_ptr().add(32 * i);
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for vk in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vk));
        }
        let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        let d = amax / 127.0;
        ob[..2].copy_from_slice(&crate::half::f32_to_f16(d).to_le_bytes());
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let mut r = [_mm256_setzero_si256(); 4];
        for k in 0..4 {
            let scaled = _mm256_mul_ps(v[k], id);
            r[k] = _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(scaled));
        }
        let p01 = _mm256_packs_epi32(r[0], r[1]);
        let p23 = _mm256_packs_epi32(r[2], r[3]);
        let b = _mm256_packs_epi16(p01, p23);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(ob.as_mut_ptr().add(2) as *mut __m256i, b);
    }
}

/// F32 -> F16 with vcvtps2ph (round to nearest even), like ggml_cpu_fp32_to_fp16.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_f16(x: &[f32], out: &mut [u8]) {
    assert!(out.len() >= 2 * x.len(), "quantize_f16: output too short");
    let n8 = x.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm_storeu_si128(out.as_mut_ptr().add(2 * i) as *mut __m128i, h);
    }
    crate::formats::float::quantize_f16(&x[n8..], &mut out[2 * n8..]);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
    _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<1>(t)))
}

/// quantize_row_q8_K_ref vectorized (same bytes): `max` is the first element of largest
/// magnitude, codes are round-half-even(-127/max * x) (ggml's nearest_int), bsums sum 16 codes.
/// With `prefer_positive`, a +a/-a tie for the largest magnitude takes +a (the x86 4x8 repack
/// quantizer's rule).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_k(x: &[f32], out: &mut [u8], prefer_positive: bool) {
    let sign = _mm256_set1_ps(-0.0);
    for (i, ob) in out.chunks_exact_mut(292).enumerate().take(x.len() / 256) {
        let xb = &x[256 * i..256 * i + 256];
        let p = xb.as_ptr();
        let mut m = _mm256_setzero_ps();
        for k in 0..32 {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * k))));
        }
        let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        let max = if prefer_positive {
            if xb.contains(&amax) {
                amax
            } else {
                -amax
            }
        } else {
            // the first element reaching amax decides the sign
            *xb.iter().find(|v| v.abs() == amax).unwrap_or(&amax)
        };
        let iscale = -127.0 / max;
        let is = _mm256_set1_ps(iscale);
        let o = ob.as_mut_ptr();
        for k in 0..8 {
            let r: [__m256i; 4] = [
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(
                    is,
                    _mm256_loadu_ps(p.add(32 * k)),
                ))),
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(
                    is,
                    _mm256_loadu_ps(p.add(32 * k + 8)),
                ))),
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(
                    is,
                    _mm256_loadu_ps(p.add(32 * k + 16)),
                ))),
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(
                    is,
                    _mm256_loadu_ps(p.add(32 * k + 24)),
                ))),
            ];
            // |codes| <= 127 by construction, so the saturating packs are exact; the two 16-bit
            // halves give the two bsums of these 32 codes.
            let w01 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(r[0], r[1]));
            let w23 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(r[2], r[3]));
            let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi16(w01, w23));
            _mm256_storeu_si256(o.add(4 + 32 * k) as *mut __m256i, b);
            let s01 = _mm256_madd_epi16(w01, _mm256_set1_epi16(1));
            let s23 = _mm256_madd_epi16(w23, _mm256_set1_epi16(1));
            let (b0, b1) = (hsum_i32(s01) as i16, hsum_i32(s23) as i16);
            ob[4 + 256 + 4 * k..4 + 256 + 4 * k + 2].copy_from_slice(&b0.to_le_bytes());
            ob[4 + 256 + 4 * k + 2..4 + 256 + 4 * k + 4].copy_from_slice(&b1.to_le_bytes());
        }
        ob[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
