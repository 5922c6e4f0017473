//! The Q8_0 token-lane product (`avx2_tok8::row_q8_0`) with AVX-512 VNNI: two of a block's
//! eight 4-element chunks per 512-bit vector (lanes 0..8: chunk 2p of the 8 tokens, lanes
//! 8..16: chunk 2p + 1) and one `vpdpbusd` for each pair's products. The integer sums are
//! exact and equal to the AVX2 kernel's (Σ x·y over 4 elements, as (x + 128)·y − 128·y with
//! the weight codes x + 128 unsigned — VNNI multiplies u8 by s8 — and −128·Σy computed once
//! per activation, shared by every weight row), and every float step — the per-chunk
//! fma(dx·dy, f32(Σ), acc) and the final hsum — pairs the same lanes in the same order, so
//! each token's result is the AVX2 kernel's bits (tests/pool.rs, tests/dot_rows_tokens.rs).
//! Half the instructions per block, which is what several sequences' decode rows sharing
//! one weight pass are bound by.

use std::arch::x86_64::*;

use super::avx2::{cvtph_ps_at, h2f_wide, k4_scales_mins};
use super::avx2_tok8::{Act8, Act8Q8, WideQuad, QK, ROWS, TOK, W};

const Q8_0: usize = 34;

/// One Q8_0 weight row (`nb` blocks) times the 8 tokens of group `g`: `row_q8_0`'s bits.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available; `w` holds nb blocks; `act` was
/// built for g + 1 groups and `build_vnni` ran.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn row_q8_0_vnni(w: &[u8], act: &Act8Q8, g: usize, out: &mut [f32; TOK]) {
    let mut one = [[0f32; TOK]; 1];
    rows_q8_0_vnni::<1>([w], act, g, &mut one);
    *out = one[0];
}

/// `row_q8_0_vnni` for R rows at once (`w[r]`, nb blocks each) against the same 8 tokens: each
/// activation vector is loaded once for the R rows (one row at a time is bound by those loads
/// on an AVX-512 Intel core); each row's operations are those of R = 1, so its bits too. Per
/// block and pair p of chunks: the row's chunks 2p and 2p + 1 (8 bytes) broadcast to every
/// token's lane pair and offset to unsigned (x + 128) in one `vpxorq` with an embedded
/// broadcast (no permute), one `vpdpbusd` from the activations' −128·Σy (`Act8Q8::corr`),
/// which leaves Σ x·y exactly, in the lanes `Act8Q8::qsi` interleaves (2t: chunk 2p of token
/// t, 2t + 1: chunk 2p + 1).
///
/// Each block also asks L2 for the same block of the row R rows on (`w[r]` are rows of one
/// matrix, one after another, so that is the next call's row): 8 decode rows make this kernel
/// read its weights at ~8 GB/s a core, too slowly for the hardware prefetcher to run far
/// enough ahead of 4 streams at once; one prefetch per block and row, a whole call ahead, gave
/// the 4B's 8-sequence decode +10% (docs/bench.md "the 8-row products were waiting on memory"). Past the matrix's end the
/// address is formed with wrapping arithmetic and a prefetch never faults.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available; every `w[r]` holds nb blocks;
/// `act` was built for g + 1 groups and `build_vnni` ran.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows_q8_0_vnni<const R: usize>(w: [&[u8]; R], act: &Act8Q8, g: usize, out: &mut [[f32; TOK]; R]) {
    let nb = act.nb;
    debug_assert!(act.corr.len() >= (g + 1) * nb * 64 && act.dy16.len() >= (g + 1) * nb * 16);
    debug_assert!(act.qsi.len() >= (g + 1) * nb * 32 * TOK);
    let off = _mm512_set1_epi8(0x80u8 as i8);
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    for i in 0..nb {
        let gi = g * nb + i;
        let dy = _mm512_loadu_ps(act.dy16.as_ptr().add(gi * 16));
        let qs = act.qsi.as_ptr().add(gi * 32 * TOK);
        let corr = act.corr.as_ptr().add(gi * 64);
        let mut d = [_mm512_setzero_ps(); R];
        for r in 0..R {
            // the same block of the row R rows on, which the next call reads
            _mm_prefetch(w[r].as_ptr().wrapping_add(i * Q8_0 + R * w[r].len()) as *const i8, _MM_HINT_T1);
            d[r] = _mm512_mul_ps(_mm512_set1_ps(h2f_wide(w[r], i * Q8_0)), dy);
        }
        // p also places the pair in the activations and the weight row, not only in acc
        #[allow(clippy::needless_range_loop)]
        for p in 0..4 {
            let y = _mm512_loadu_si512(qs.add(p * 64) as *const __m512i);
            let c = _mm512_loadu_si512(corr.add(p * 16) as *const __m512i);
            for r in 0..R {
                let x = xor_broadcast8(w[r].as_ptr().add(i * Q8_0 + 2 + 8 * p), off);
                let t = _mm512_dpbusd_epi32(c, x, y);
                acc[r][p] = _mm512_fmadd_ps(d[r], _mm512_cvtepi32_ps(t), acc[r][p]);
            }
        }
    }
    // lanes 2t / 2t + 1 of token t: chunks (0, 4, 2, 6) / (1, 5, 3, 7) summed in hsum_float_8's
    // order, then the two halves added — the one-token order
    let evens_odds = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for r in 0..R {
        let h01 = _mm512_add_ps(acc[r][2], acc[r][0]);
        let h23 = _mm512_add_ps(acc[r][3], acc[r][1]);
        let t = _mm512_permutexvar_ps(evens_odds, _mm512_add_ps(h01, h23));
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(t)));
        _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_add_ps(_mm512_castps512_ps256(t), hi));
    }
}

/// The 8 bytes at `p` broadcast to every qword lane, XORed with `v`: one `vpxorq` with an
/// embedded broadcast. Written out because LLVM turns `xor(set1_epi64(load), splat)` into a
/// 128-bit XOR and a `vpbroadcastq` — a shuffle-port µop per use, which this kernel avoids.
///
/// # Safety
/// AVX-512F must be available; `p` must be readable for 8 bytes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn xor_broadcast8(p: *const u8, v: __m512i) -> __m512i {
    let x: __m512i;
    std::arch::asm!(
        "vpxorq {x}, {v}, qword ptr [{p}]{{1to8}}",
        x = lateout(zmm_reg) x,
        v = in(zmm_reg) v,
        p = in(reg) p,
        options(pure, readonly, nostack, preserves_flags),
    );
    x
}

/// `avx2_tok8::rows4` with AVX-512 VNNI, the same bits: a (sub-block 2k, 2k+1) chunk pair of
/// 8 tokens is one 512-bit vector (lanes 0..8: sub-block 2k's chunk e, 8..16: 2k+1's), the
/// weight codes of both — low and high nibbles of the same 4 bytes — one broadcast shifted per
/// half, and one `vpdpbusd` adds both chunks' 4-element sums (codes u8, activations s8) into
/// i32 lanes. The AVX2 kernel sums the same products exactly in i16 before the scale's madd;
/// here the i32 sums are multiplied by the scale instead, the same integer. Everything after
/// (mins, d/dmin, the float epilogue in gemm or gemv order) is `rows4`'s. 4 instructions per
/// row and chunk pair where AVX2 takes 7.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available; as `rows4` otherwise.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows4_vnni<const GEMM: bool, const WIDE: bool>(
    w: &[u8],
    row_bytes: usize,
    wide: &WideQuad,
    next: &[u8],
    act: &Act8,
    g: usize,
    out: &mut [[f32; TOK]; ROWS],
) {
    let nb = act.nb;
    let m4 = _mm512_set1_epi8(0x0f);
    // i16 lanes 0..16 (the low half's dwords) shift by 0, 16..32 by 4: low nibbles, then high
    let shifts = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0x0004_0004, 0x0004_0004, 0x0004_0004, 0x0004_0004, 0x0004_0004, 0x0004_0004, 0x0004_0004, 0x0004_0004);
    // WIDE codes hold [low 4 | high 4] per chunk: dword 0 to the low half, dword 1 to the high
    let idx01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    let mut acc = [_mm256_setzero_ps(); ROWS];
    let mut accm = [_mm256_setzero_ps(); ROWS];
    for i in 0..nb {
        let gi = g * nb + i;
        let dyv = _mm256_loadu_ps(act.dy.as_ptr().add(gi * TOK));
        let mut d = [_mm256_setzero_ps(); ROWS];
        let mut dmin = [_mm256_setzero_ps(); ROWS];
        let mut sm = [[0i16; 16]; ROWS];
        let mut qp = [std::ptr::null::<u8>(); ROWS];
        for r in 0..ROWS {
            if !next.is_empty() {
                let (lines, steps, j) = (next.len().div_ceil(64), nb * ROWS, i * ROWS + r);
                for l in j * lines / steps..(j + 1) * lines / steps {
                    _mm_prefetch(next.as_ptr().add(64 * l) as *const i8, _MM_HINT_T0);
                }
            }
            if WIDE {
                let ri = r * wide.nb + i;
                d[r] = _mm256_mul_ps(_mm256_set1_ps(wide.dd[ri][0]), dyv);
                dmin[r] = _mm256_mul_ps(_mm256_set1_ps(wide.dd[ri][1]), dyv);
                sm[r] = wide.sm[ri];
                qp[r] = wide.codes.as_ptr().add(ri * QK);
                continue;
            }
            let b = &w[r * row_bytes + i * W..r * row_bytes + (i + 1) * W];
            let dd = cvtph_ps_at(b, 0);
            d[r] = _mm256_mul_ps(_mm256_broadcastss_ps(dd), dyv);
            dmin[r] = _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), dyv);
            _mm256_storeu_si256(sm[r].as_mut_ptr() as *mut __m256i, k4_scales_mins(b, 4));
            qp[r] = b.as_ptr().add(16);
        }
        let qs = act.qs.as_ptr().add(gi * QK * TOK) as *const __m256i;
        let bsp = act.bsp.as_ptr().add(gi * 4 * TOK * 2) as *const __m256i;
        let mut s_tot = [_mm256_setzero_si256(); ROWS];
        let mut m_tot = [_mm256_setzero_si256(); ROWS];
        for k in 0..4 {
            let mut both = [_mm512_setzero_si512(); ROWS];
            for e in 0..8 {
                let a = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(qs.add(16 * k + e))),
                    _mm256_loadu_si256(qs.add(16 * k + 8 + e)),
                );
                for r in 0..ROWS {
                    let wv = if WIDE {
                        let p = qp[r].add(8 * (8 * k + e));
                        _mm512_permutexvar_epi32(idx01, _mm512_castsi128_si512(_mm_loadl_epi64(p as *const __m128i)))
                    } else {
                        let raw = _mm512_set1_epi32((qp[r].add(32 * k + 4 * e) as *const i32).read_unaligned());
                        _mm512_and_si512(_mm512_srlv_epi16(raw, shifts), m4)
                    };
                    both[r] = _mm512_dpbusd_epi32(both[r], wv, a);
                }
            }
            let bv = _mm256_loadu_si256(bsp.add(k));
            for r in 0..ROWS {
                let lo = _mm512_castsi512_si256(both[r]);
                let hi = _mm512_extracti64x4_epi64::<1>(both[r]);
                let s = _mm256_add_epi32(
                    _mm256_mullo_epi32(lo, _mm256_set1_epi32(sm[r][2 * k] as i32)),
                    _mm256_mullo_epi32(hi, _mm256_set1_epi32(sm[r][2 * k + 1] as i32)),
                );
                let mins = (sm[r].as_ptr().add(8 + 2 * k) as *const i32).read_unaligned();
                let m = _mm256_madd_epi16(bv, _mm256_set1_epi32(mins));
                if GEMM {
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d[r], acc[r]);
                    accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dmin[r], accm[r]);
                } else {
                    s_tot[r] = _mm256_add_epi32(s_tot[r], s);
                    m_tot[r] = _mm256_add_epi32(m_tot[r], m);
                }
            }
        }
        if !GEMM {
            for r in 0..ROWS {
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s_tot[r]), d[r], acc[r]);
                accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m_tot[r]), dmin[r], accm[r]);
            }
        }
    }
    for r in 0..ROWS {
        _mm256_storeu_ps(out[r].as_mut_ptr(), _mm256_sub_ps(acc[r], accm[r]));
    }
}

/// Rows per call of `rows16_vnni`: one per 32-bit lane of a 512-bit vector.
pub const ROWS16: usize = 16;

/// `rows4_vnni` (not WIDE) for 16 rows at once with the rows, not the tokens, in the lanes:
/// the same bits, a third of the instructions. Lane r holds row r; a chunk of 4 codes of
/// every row is one vector (the 16 rows' 32 code bytes of a sub-block pair transposed once:
/// 8 × 8 dwords in each 256-bit half), shared by the 8 tokens, and each token's 4 activation
/// codes are one broadcast dword — so a `vpdpbusd` is 64 useful products where the token-lane
/// kernel's is the same 64 after a per-row broadcast, shift and mask. The integer sums per
/// (row, token, sub-block) are exact whatever the order, the scales and mins are the
/// integers `rows4` multiplies (decoded here for 16 rows at once from gathered header dwords,
/// the mins' products as i16 pairs with the activations' paired sums), and every float step —
/// fma(f32(Σ), d·dy, acc) per super-block (gemv) or pair (gemm), acc − accm — is `rows4`'s
/// per row and token. `next` is the next call's 16 rows (maybe empty): each super-block of
/// them is asked into L2 while this call computes the same super-block of its own, a whole
/// call ahead. The earlier prefetch (each row's super-block 2 on, into L1) left the kernel
/// waiting on 16 streams: 82 GMAC/s a core streaming from DRAM against 120 in cache; with the
/// next call's rows it streams at 118 (`examples/matmul_bench --decode`, docs/bench.md "the 8-row
/// products were waiting on memory").
/// Only the group's first `nt` tokens are computed (the rest are padding, never stored; their
/// outputs are 0).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C must be available; `w` holds 16 rows of
/// `row_bytes` (nb super-blocks each, the row starts < 2³¹ bytes apart); `act` was built for
/// g + 1 groups.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn rows16_vnni<const GEMM: bool>(w: &[u8], row_bytes: usize, next: &[u8], act: &Act8, g: usize, nt: usize, out: &mut [[f32; TOK]; ROWS16]) {
    let nb = act.nb;
    let nt = nt.min(TOK);
    debug_assert!(w.len() >= 15 * row_bytes + nb * W && act.dy.len() >= (g + 1) * nb * TOK);
    let m4 = _mm512_set1_epi8(0x0f);
    let (m6, m4d, m2) = (_mm512_set1_epi32(63), _mm512_set1_epi32(0xf), _mm512_set1_epi32(3));
    let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let offs = _mm512_mullo_epi32(lane, _mm512_set1_epi32(row_bytes as i32));
    let mut acc = [_mm512_setzero_ps(); TOK];
    let mut accm = [_mm512_setzero_ps(); TOK];
    let qs_act = act.qs.as_ptr() as *const i32;
    let bsp = act.bsp.as_ptr() as *const i32;
    for i in 0..nb {
        let gi = g * nb + i;
        let base = w.as_ptr().add(i * W);
        // the next call's rows (`next`), this super-block of each, into L2 (see the doc)
        if !next.is_empty() {
            let pb = next.as_ptr().add(i * W);
            for r in 0..ROWS16 {
                let p = pb.wrapping_add(r * row_bytes);
                for o in [0, 64, 128, W - 1] {
                    _mm_prefetch(p.wrapping_add(o) as *const i8, _MM_HINT_T1);
                }
            }
        }
        // each row's header: d | dmin, then the 12 scale bytes as three dwords
        let h = _mm512_i32gather_epi32::<1>(offs, base as *const _);
        let s1 = _mm512_i32gather_epi32::<1>(offs, base.add(4) as *const _);
        let s2 = _mm512_i32gather_epi32::<1>(offs, base.add(8) as *const _);
        let s3 = _mm512_i32gather_epi32::<1>(offs, base.add(12) as *const _);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(h)));
        // scale_min_k4 for sub-block j of every row
        let byte = |v: __m512i, j: u32| _mm512_srlv_epi32(v, _mm512_set1_epi32(8 * j as i32));
        let sc: [__m512i; 8] = std::array::from_fn(|j| {
            if j < 4 {
                _mm512_and_si512(byte(s1, j as u32), m6)
            } else {
                let jj = j as u32 - 4;
                let lo = _mm512_and_si512(byte(s3, jj), m4d);
                let hi = _mm512_and_si512(_mm512_srli_epi32::<6>(byte(s1, jj)), m2);
                _mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi))
            }
        });
        let mn: [__m512i; 8] = std::array::from_fn(|j| {
            if j < 4 {
                _mm512_and_si512(byte(s2, j as u32), m6)
            } else {
                let jj = j as u32 - 4;
                let lo = _mm512_and_si512(_mm512_srli_epi32::<4>(byte(s3, jj)), m4d);
                let hi = _mm512_and_si512(_mm512_srli_epi32::<6>(byte(s2, jj)), m2);
                _mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi))
            }
        });
        let dy: [__m512; TOK] = std::array::from_fn(|t| _mm512_set1_ps(*act.dy.get_unchecked(gi * TOK + t)));
        let mut s_tot = [_mm512_setzero_si512(); TOK];
        let mut m_tot = [_mm512_setzero_si512(); TOK];
        for k in 0..4 {
            // rows q, q + 4 (q < 4) and 8 + q, 12 + q: after the 8 × 8 transposes of both
            // halves, lane r of code vector e is row r's dword e of this pair
            let row = |r: usize| _mm256_loadu_si256(base.add(r * row_bytes + 16 + 32 * k) as *const __m256i);
            let z: [__m512i; 8] = std::array::from_fn(|q| {
                let (a, b) = if q < 4 { (q, q + 4) } else { (q + 4, q + 8) };
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(row(a)), row(b))
            });
            let t: [__m512i; 8] = std::array::from_fn(|p| {
                let (a, b) = (z[2 * (p / 2)], z[2 * (p / 2) + 1]);
                if p % 2 == 0 { _mm512_unpacklo_epi32(a, b) } else { _mm512_unpackhi_epi32(a, b) }
            });
            // u[e'] for the rows of z0..z3 (e' < 4) and z4..z7 (e' >= 4): dword e' % 4 in the
            // even 128-bit lanes, e' % 4 + 4 in the odd ones
            let u: [__m512i; 8] = std::array::from_fn(|p| {
                let o = 4 * (p / 4);
                match p % 4 {
                    0 => _mm512_unpacklo_epi64(t[o], t[o + 2]),
                    1 => _mm512_unpackhi_epi64(t[o], t[o + 2]),
                    2 => _mm512_unpacklo_epi64(t[o + 1], t[o + 3]),
                    _ => _mm512_unpackhi_epi64(t[o + 1], t[o + 3]),
                }
            });
            let codes: [__m512i; 8] = std::array::from_fn(|e| {
                if e < 4 {
                    _mm512_shuffle_i32x4::<0x88>(u[e], u[e + 4])
                } else {
                    _mm512_shuffle_i32x4::<0xdd>(u[e - 4], u[e])
                }
            });
            let lo: [__m512i; 8] = std::array::from_fn(|e| _mm512_and_si512(codes[e], m4));
            let hi: [__m512i; 8] = std::array::from_fn(|e| _mm512_and_si512(_mm512_srli_epi16::<4>(codes[e]), m4));
            // the mins of sub-blocks 2k, 2k + 1 as one i16 pair per row
            let mp = _mm512_or_si512(mn[2 * k], _mm512_slli_epi32::<16>(mn[2 * k + 1]));
            for tk in 0..nt {
                // chunk c of token tk: dword (gi·64 + c)·8 + tk of the interleaved codes
                let a = |c: usize| _mm512_set1_epi32(*qs_act.add((gi * 64 + c) * TOK + tk));
                let mut sl = _mm512_setzero_si512();
                let mut sh = _mm512_setzero_si512();
                for e in 0..8 {
                    sl = _mm512_dpbusd_epi32(sl, lo[e], a(16 * k + e));
                    sh = _mm512_dpbusd_epi32(sh, hi[e], a(16 * k + 8 + e));
                }
                let s = _mm512_add_epi32(_mm512_mullo_epi32(sl, sc[2 * k]), _mm512_mullo_epi32(sh, sc[2 * k + 1]));
                let m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp, _mm512_set1_epi32(*bsp.add((gi * 4 + k) * TOK + tk)));
                if GEMM {
                    acc[tk] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, dy[tk]), acc[tk]);
                    accm[tk] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmin, dy[tk]), accm[tk]);
                } else {
                    s_tot[tk] = _mm512_add_epi32(s_tot[tk], s);
                    m_tot[tk] = _mm512_add_epi32(m_tot[tk], m);
                }
            }
        }
        if !GEMM {
            for tk in 0..nt {
                acc[tk] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_tot[tk]), _mm512_mul_ps(d, dy[tk]), acc[tk]);
                accm[tk] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m_tot[tk]), _mm512_mul_ps(dmin, dy[tk]), accm[tk]);
            }
        }
    }
    let mut res = [[0f32; ROWS16]; TOK];
    for tk in 0..TOK {
        _mm512_storeu_ps(res[tk].as_mut_ptr(), _mm512_sub_ps(acc[tk], accm[tk]));
    }
    for (r, o) in out.iter_mut().enumerate() {
        for (tk, v) in o.iter_mut().enumerate() {
            *v = res[tk][r];
        }
    }
}
