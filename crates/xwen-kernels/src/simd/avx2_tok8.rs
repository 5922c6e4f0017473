//! Batched products for prefill with 8 tokens in the vector lanes, in the reference's exact
//! per-output float order: Q4_K in ggml's repacked gemm/gemv order (see `crate::q4k_repack`) and
//! Q8_0 in vec_dot/tinyBLAS order.
//!
//! The per-row kernels (`avx2_q4k_repack`, `avx2_multi`) hold one token's 32 elements in a
//! vector, so every sub-block sum ends in a horizontal reduction and their float epilogue is
//! scalar. Here the activations of 8 tokens are interleaved once per product (4 consecutive
//! elements of each token per 32-byte chunk: `Act8`, `Act8Q8`), so a chunk is one broadcast of
//! 4 weight codes (read straight from the blocks), one maddubs and one add, and the i32 lane t
//! is token t's exact partial sum with no horizontal step. For Q4_K the i16 sums of a
//! sub-block's 8 chunks stay exact, so its scale's madd runs once per sub-block. The float
//! steps then run on 8 tokens at once in exactly the per-output order of the reference (the
//! integer sums are exact, so only where the roundings happen matters, and that is unchanged).

#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx2::{cvtph_ps_at, h2f, h2f_wide};
use crate::half::read_f16;

pub(crate) const QK: usize = 256;
const Q8K: usize = 292;
pub(crate) const W: usize = 144;

/// Tokens per group (vector lanes).
pub const TOK: usize = 8;
/// Rows per kernel call.
pub const ROWS: usize = 4;

/// Q8_K activations of groups of 8 tokens, interleaved for the kernel.
#[derive(Default)]
pub struct Act8 {
    pub(crate) nb: usize,
    /// [group][block][chunk of 4 elements (64)][token (8)][4 bytes]
    pub(crate) qs: Vec<u8>,
    /// [group][block][token] — the Q8_K scale
    pub(crate) dy: Vec<f32>,
    /// [group][block][pair k (4)][token (8)][2]: the i16 sums of sub-blocks 2k and 2k+1
    pub(crate) bsp: Vec<i16>,
}

impl Act8 {
    /// Interleaves `groups` groups of 8 consecutive Q8_K rows (row t at `a[t * stride..]`,
    /// `nb` super-blocks each), starting at row 0 of `a`. Rows from `n_rows` on are padding:
    /// zero codes, sums and scale, so their lanes compute 0 and are never stored.
    pub fn build(&mut self, a: &[u8], stride: usize, nb: usize, groups: usize, n_rows: usize) {
        self.nb = nb;
        self.qs.clear();
        self.qs.resize(groups * nb * QK * TOK, 0);
        self.dy.clear();
        self.dy.resize(groups * nb * TOK, 0.0);
        self.bsp.clear();
        self.bsp.resize(groups * nb * 4 * TOK * 2, 0);
        for g in 0..groups {
            for t in 0..TOK {
                if g * TOK + t >= n_rows {
                    continue;
                }
                let row = &a[(g * TOK + t) * stride..];
                for i in 0..nb {
                    let b = &row[i * Q8K..(i + 1) * Q8K];
                    let gi = g * nb + i;
                    self.dy[gi * TOK + t] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    let qs = &mut self.qs[gi * QK * TOK..(gi + 1) * QK * TOK];
                    for c in 0..QK / 4 {
                        qs[c * 32 + t * 4..c * 32 + t * 4 + 4].copy_from_slice(&b[4 + 4 * c..8 + 4 * c]);
                    }
                    let bs = |k: usize| i16::from_le_bytes([b[4 + QK + 2 * k], b[5 + QK + 2 * k]]);
                    for k in 0..4 {
                        for h in 0..2 {
                            let j = 2 * k + h; // sub-block of 32 = bsums 2j, 2j+1
                            self.bsp[((gi * 4 + k) * TOK + t) * 2 + h] = bs(2 * j) + bs(2 * j + 1);
                        }
                    }
                }
            }
        }
    }
}

/// A quad of Q4_K rows decoded once for a product with many token groups: per row and
/// super-block the 4-bit codes as bytes in the kernel's chunk order ([k][e]: the 4 low-nibble
/// codes of sub-block 2k, then the 4 high-nibble codes of 2k+1, elements 4e..4e+3), the 6-bit
/// scales and mins as i16, and d / dmin widened from f16. Same values `rows4` decodes per group.
#[derive(Default)]
pub struct WideQuad {
    pub(crate) nb: usize,
    pub(crate) codes: Vec<u8>,
    pub(crate) sm: Vec<[i16; 16]>,
    pub(crate) dd: Vec<[f32; 2]>,
}

impl WideQuad {
    /// Decodes ROWS consecutive rows of `w` (`row_bytes` each, `nb` super-blocks).
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; `w` holds ROWS rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn fill(&mut self, w: &[u8], row_bytes: usize, nb: usize) {
        self.nb = nb;
        self.codes.resize(ROWS * nb * QK, 0);
        self.sm.resize(ROWS * nb, [0; 16]);
        self.dd.resize(ROWS * nb, [0.0; 2]);
        for r in 0..ROWS {
            for i in 0..nb {
                let b = &w[r * row_bytes + i * W..r * row_bytes + (i + 1) * W];
                let ri = r * nb + i;
                self.dd[ri] = [h2f(b, 0), h2f(b, 2)];
                _mm256_storeu_si256(self.sm[ri].as_mut_ptr() as *mut __m256i, super::avx2::k4_scales_mins(b, 4));
                let out = &mut self.codes[ri * QK..(ri + 1) * QK];
                for c in 0..QK / 8 {
                    // chunk c = 8k + e: 4 bytes of qs at 32k + 4e
                    let (k, e) = (c / 8, c % 8);
                    let raw = u32::from_le_bytes(b[16 + 32 * k + 4 * e..20 + 32 * k + 4 * e].try_into().unwrap());
                    out[8 * c..8 * c + 4].copy_from_slice(&(raw & 0x0f0f_0f0f).to_le_bytes());
                    out[8 * c + 4..8 * c + 8].copy_from_slice(&((raw >> 4) & 0x0f0f_0f0f).to_le_bytes());
                }
            }
        }
    }
}

/// `out[r][t]` = row r of `w` (ROWS consecutive rows of `row_bytes`, `nb` super-blocks each)
/// times token t of activation group `g`, in the gemm (`GEMM`) or gemv order. The weight codes
/// are taken straight from the Q4_K blocks (4 bytes broadcast, nibbles masked: extra work on
/// ports the multiplies leave free), so nothing is widened per product — which matters for
/// routed experts, multiplied with only ~2 token groups each in prefill.
///
/// With `WIDE`, `wide` (a `WideQuad` of these ROWS rows; ignored otherwise) the codes, scales
/// and f16 factors come pre-decoded from it instead: for dense products of many token groups,
/// where decoding them per group cost 3 of a chunk's 7 vector operations.
///
/// `next` (empty for none) is prefetched, spread over the call's (block, row) steps: the next
/// quad's weights, for products whose weights come cold from DRAM (routed experts, read once
/// per layer), where the hardware prefetcher alone left this loop ~35% slower than with the
/// weights in cache (`examples/lane_probe`).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w` holds ROWS rows, `act` at least g + 1 groups of
/// `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows4<const GEMM: bool, const WIDE: bool>(
    w: &[u8],
    row_bytes: usize,
    wide: &WideQuad,
    next: &[u8],
    act: &Act8,
    g: usize,
    out: &mut [[f32; TOK]; ROWS],
) {
    let nb = act.nb;
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); ROWS];
    let mut accm = [_mm256_setzero_ps(); ROWS];
    for i in 0..nb {
        let gi = g * nb + i;
        let dyv = _mm256_loadu_ps(act.dy.as_ptr().add(gi * TOK));
        let mut d = [_mm256_setzero_ps(); ROWS];
        let mut dmin = [_mm256_setzero_ps(); ROWS];
        // [row][scales 0..8 | mins 8..16] as i16
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
            // F16C: the software conversion's branches and shifts cost ~10% of these loops;
            // d and dmin are lanes 0 and 1 of one conversion (8 bytes inside the block)
            let dd = cvtph_ps_at(b, 0);
            d[r] = _mm256_mul_ps(_mm256_broadcastss_ps(dd), dyv);
            dmin[r] = _mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dd)), dyv);
            _mm256_storeu_si256(sm[r].as_mut_ptr() as *mut __m256i, super::avx2::k4_scales_mins(b, 4));
            qp[r] = b.as_ptr().add(16);
        }
        let qs = act.qs.as_ptr().add(gi * QK * TOK) as *const __m256i;
        let bsp = act.bsp.as_ptr().add(gi * 4 * TOK * 2) as *const __m256i;
        let mut s_tot = [_mm256_setzero_si256(); ROWS];
        let mut m_tot = [_mm256_setzero_si256(); ROWS];
        for k in 0..4 {
            // sub-blocks 2k (low nibbles of qs[32k..32k+32]) and 2k+1 (high nibbles); i16 sums
            // over a sub-block's 8 chunks stay exact (|each| <= 2·15·128, eight <= 30720), so
            // the scale's madd runs once per sub-block: the multiply port bounds this loop.
            let mut lo = [_mm256_setzero_si256(); ROWS];
            let mut hi = [_mm256_setzero_si256(); ROWS];
            for e in 0..8 {
                let a0 = _mm256_loadu_si256(qs.add(16 * k + e));
                let a1 = _mm256_loadu_si256(qs.add(16 * k + 8 + e));
                for r in 0..ROWS {
                    let (wl, wh) = if WIDE {
                        let p = qp[r].add(8 * (8 * k + e)) as *const i32;
                        (_mm256_set1_epi32(p.read_unaligned()), _mm256_set1_epi32(p.add(1).read_unaligned()))
                    } else {
                        let raw = _mm256_set1_epi32((qp[r].add(32 * k + 4 * e) as *const i32).read_unaligned());
                        (_mm256_and_si256(raw, m4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4))
                    };
                    lo[r] = _mm256_add_epi16(lo[r], _mm256_maddubs_epi16(wl, a0));
                    hi[r] = _mm256_add_epi16(hi[r], _mm256_maddubs_epi16(wh, a1));
                }
            }
            let bv = _mm256_loadu_si256(bsp.add(k));
            for r in 0..ROWS {
                let s = _mm256_add_epi32(
                    _mm256_madd_epi16(lo[r], _mm256_set1_epi16(sm[r][2 * k])),
                    _mm256_madd_epi16(hi[r], _mm256_set1_epi16(sm[r][2 * k + 1])),
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

// ---------- Q8_0 ----------

const Q8_0: usize = 34;

/// Q8_0 activations of groups of 8 tokens, interleaved: [group][block][lane l (8)][token][4].
#[derive(Default)]
pub struct Act8Q8 {
    pub(crate) nb: usize,
    pub(crate) qs: Vec<u8>,
    /// [group][block][token]: the f16 scale widened
    pub(crate) dy: Vec<f32>,
    /// For the VNNI kernel (`simd::avx512_tok8`), which multiplies the weights offset to
    /// unsigned (x + 128) by these signed codes (`build_vnni` fills these instead of `qs` and
    /// `dy`): `qsi` the codes with a chunk pair's two chunks interleaved per token (per
    /// [group][block][pair p (4)] 16 dwords, dword j = chunk 2p + j % 2 of token j / 2), so one
    /// 8-byte broadcast of a weight row's chunks 2p, 2p + 1 meets every token's two dwords
    /// without a permute; `corr` per [group][block][pair][lane] the −128·Σy of the 4 codes that
    /// lane's `vpdpbusd` takes, the sum's starting value, so (x + 128)·y − 128·y leaves Σ x·y
    /// exactly; `dy16` the scales per lane ([group][block][16], lane j token j / 2's).
    pub(crate) qsi: Vec<u8>,
    pub(crate) corr: Vec<i32>,
    pub(crate) dy16: Vec<f32>,
}

impl Act8Q8 {
    /// The VNNI kernel's activations (`qsi`, `corr`, `dy16`; not `qs` and `dy`) straight from
    /// `groups` groups of 8 quantized rows (`stride` bytes apart, nb Q8_0 blocks each): once
    /// per product, shared by every weight row.
    pub fn build_vnni(&mut self, a: &[u8], stride: usize, nb: usize, groups: usize) {
        self.nb = nb;
        let blocks = groups * nb;
        assert!(groups == 0 || a.len() >= (groups * TOK - 1) * stride + nb * Q8_0, "build_vnni: activations too short");
        // every element is written below: no zeroing first
        self.qsi.clear();
        self.qsi.reserve(blocks * 32 * TOK);
        self.corr.clear();
        self.corr.reserve(blocks * 64);
        self.dy16.clear();
        self.dy16.reserve(blocks * 16);
        // SAFETY: AVX2 is present wherever a lane kernel runs (the VNNI kernel needs AVX-512);
        // the spare capacities hold `blocks` blocks' worth, `a` groups · 8 rows of nb blocks,
        // and `vnni_layout` writes every element of the lengths set after it.
        unsafe {
            vnni_layout(a, stride, nb, groups, self.qsi.as_mut_ptr(), self.corr.as_mut_ptr(), self.dy16.as_mut_ptr());
            self.qsi.set_len(blocks * 32 * TOK);
            self.corr.set_len(blocks * 64);
            self.dy16.set_len(blocks * 16);
        }
    }

    pub fn build(&mut self, a: &[u8], stride: usize, nb: usize, groups: usize) {
        self.nb = nb;
        self.qs.clear();
        self.qs.resize(groups * nb * 32 * TOK, 0);
        self.dy.clear();
        self.dy.resize(groups * nb * TOK, 0.0);
        for g in 0..groups {
            for t in 0..TOK {
                let row = &a[(g * TOK + t) * stride..];
                for i in 0..nb {
                    let b = &row[i * Q8_0..(i + 1) * Q8_0];
                    let gi = g * nb + i;
                    self.dy[gi * TOK + t] = read_f16(b);
                    let qs = &mut self.qs[gi * 32 * TOK..(gi + 1) * 32 * TOK];
                    for l in 0..8 {
                        qs[l * 32 + t * 4..l * 32 + t * 4 + 4].copy_from_slice(&b[2 + 4 * l..6 + 4 * l]);
                    }
                }
            }
        }
    }
}

/// `Act8Q8::build_vnni`'s body: per block of a group, the 8 tokens' 32 codes as 4 qwords
/// each, transposed so qword p of token t lands at qword 8p + t (dwords 16p + 2t, 16p + 2t + 1:
/// chunks 2p, 2p + 1), each dword's −128·Σ of its 4 codes beside it, the scales twice per
/// token. The codes are moved, not recomputed: a 4×4 qword transpose per half of the tokens.
///
/// # Safety
/// AVX2 must be available; `qsi`, `corr`, `dy16` point at room for groups·nb blocks (256
/// bytes, 64 and 16 values each), `a` holds groups·8 rows `stride` apart of nb Q8_0 blocks.
#[target_feature(enable = "avx2")]
unsafe fn vnni_layout(a: &[u8], stride: usize, nb: usize, groups: usize, qsi: *mut u8, corr: *mut i32, dy16: *mut f32) {
    let ones = _mm256_set1_epi8(1);
    let m128 = _mm256_set1_epi16(-128);
    for g in 0..groups {
        let rows: [*const u8; TOK] = std::array::from_fn(|t| a.as_ptr().add((g * TOK + t) * stride));
        for i in 0..nb {
            let gi = g * nb + i;
            let codes: [__m256i; TOK] = std::array::from_fn(|t| _mm256_loadu_si256(rows[t].add(i * Q8_0 + 2) as *const __m256i));
            for t in 0..TOK {
                let d = read_f16(std::slice::from_raw_parts(rows[t].add(i * Q8_0), 2));
                *dy16.add(gi * 16 + 2 * t) = d;
                *dy16.add(gi * 16 + 2 * t + 1) = d;
            }
            for half in 0..2 {
                let [c0, c1, c2, c3] = [codes[4 * half], codes[4 * half + 1], codes[4 * half + 2], codes[4 * half + 3]];
                // u0 = [c0 q0, c1 q0 | c0 q2, c1 q2], u1 the same of q1 and q3; u2, u3 of c2, c3
                let (u0, u1) = (_mm256_unpacklo_epi64(c0, c1), _mm256_unpackhi_epi64(c0, c1));
                let (u2, u3) = (_mm256_unpacklo_epi64(c2, c3), _mm256_unpackhi_epi64(c2, c3));
                let by_pair = [
                    _mm256_permute2x128_si256(u0, u2, 0x20),
                    _mm256_permute2x128_si256(u1, u3, 0x20),
                    _mm256_permute2x128_si256(u0, u2, 0x31),
                    _mm256_permute2x128_si256(u1, u3, 0x31),
                ];
                for (p, v) in by_pair.into_iter().enumerate() {
                    // qwords 8p + 4·half .. + 4 of the block: dwords 16p + 8·half .. + 8
                    let dw = gi * 64 + 16 * p + 8 * half;
                    _mm256_storeu_si256(qsi.add(dw * 4) as *mut __m256i, v);
                    // −128·(sum of the dword's 4 signed codes), exact in i16 then i32
                    let c = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, v), m128);
                    _mm256_storeu_si256(corr.add(dw) as *mut __m256i, c);
                }
            }
        }
    }
}

/// |x| of a Q8_0 row's codes, 32 per block (`ax` of `row_q8_0`): one vector per block, where
/// a byte loop compiled to scalar code (~4% of the product at 512 tokens).
///
/// # Safety
/// AVX2 must be available; `w` holds whole 34-byte blocks, `ax` 32 bytes per block.
#[target_feature(enable = "avx2")]
pub unsafe fn abs_codes_q8_0(w: &[u8], ax: &mut [u8]) {
    let nb = w.len() / Q8_0;
    assert!(ax.len() >= nb * 32, "abs_codes_q8_0: ax too short");
    for i in 0..nb {
        let x = _mm256_loadu_si256(w.as_ptr().add(i * Q8_0 + 2) as *const __m256i);
        _mm256_storeu_si256(ax.as_mut_ptr().add(i * 32) as *mut __m256i, _mm256_abs_epi8(x));
    }
}

/// One Q8_0 weight row (`nb` blocks) times the 8 tokens of group `g`, in the order of ggml's
/// vec_dot_q8_0 / tinyBLAS_Q0_AVX (identical for Q8_0): per block, lane l (elements 4l..4l+3)
/// gets fma(dx·dy, f32(Σ x·y), acc_l); at the end the lanes are summed as tinyBLAS's hsum. Here
/// acc_l holds lane l of all 8 tokens, so no step is horizontal. `ax` is |x| of the row.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `w`/`ax` hold nb blocks, `act` g + 1 groups.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn row_q8_0(w: &[u8], ax: &[u8], act: &Act8Q8, g: usize, out: &mut [f32; TOK]) {
    let nb = act.nb;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 8];
    for i in 0..nb {
        let gi = g * nb + i;
        let d = _mm256_mul_ps(_mm256_set1_ps(h2f_wide(w, i * Q8_0)), _mm256_loadu_ps(act.dy.as_ptr().add(gi * TOK)));
        let qs = act.qs.as_ptr().add(gi * 32 * TOK) as *const __m256i;
        let xp = w.as_ptr().add(i * Q8_0 + 2) as *const i32;
        let ap = ax.as_ptr().add(i * 32) as *const i32;
        for l in 0..8 {
            let x = _mm256_set1_epi32(xp.add(l).read_unaligned());
            let a = _mm256_set1_epi32(ap.add(l).read_unaligned());
            let sy = _mm256_sign_epi8(_mm256_loadu_si256(qs.add(l)), x);
            let q = _mm256_madd_epi16(_mm256_maddubs_epi16(a, sy), ones);
            acc[l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc[l]);
        }
    }
    // tinyBLAS hsum per token: h_i = l_{i+4} + l_i, then (h0 + h2) + (h1 + h3)
    let h: [__m256; 4] = std::array::from_fn(|k| _mm256_add_ps(acc[k + 4], acc[k]));
    let s = _mm256_add_ps(_mm256_add_ps(h[0], h[2]), _mm256_add_ps(h[1], h[3]));
    _mm256_storeu_ps(out.as_mut_ptr(), s);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code, −128 included (its magnitude 128 fits the unsigned operand), per block.
    #[test]
    fn abs_codes_of_every_byte() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let nb = 9;
        let w: Vec<u8> = (0..nb * Q8_0).map(|i| (i * 37 + 11) as u8).collect();
        let mut ax = vec![0u8; nb * 32];
        // SAFETY: AVX2 checked above; w holds nb whole blocks, ax 32 bytes per block.
        unsafe { abs_codes_q8_0(&w, &mut ax) };
        for i in 0..nb {
            for j in 0..32 {
                assert_eq!(ax[i * 32 + j], (w[i * Q8_0 + 2 + j] as i8).unsigned_abs(), "block {i} code {j}");
            }
        }
        assert!(w.iter().enumerate().any(|(i, &b)| b == 0x80 && i % Q8_0 >= 2), "the codes cover -128");
    }

    /// The VNNI layout element by element, as its doc states it.
    fn vnni_reference(a: &[u8], stride: usize, nb: usize, groups: usize) -> (Vec<u8>, Vec<i32>, Vec<f32>) {
        let blocks = groups * nb;
        let (mut qsi, mut corr, mut dy16) = (vec![0u8; blocks * 32 * TOK], vec![0i32; blocks * 64], vec![0f32; blocks * 16]);
        for g in 0..groups {
            for t in 0..TOK {
                let row = &a[(g * TOK + t) * stride..];
                for (i, b) in row.chunks_exact(Q8_0).take(nb).enumerate() {
                    let gi = g * nb + i;
                    dy16[gi * 16 + 2 * t] = read_f16(b);
                    dy16[gi * 16 + 2 * t + 1] = read_f16(b);
                    for (l, c) in b[2..].chunks_exact(4).enumerate() {
                        let lane = gi * 64 + 16 * (l / 2) + 2 * t + l % 2;
                        qsi[lane * 4..lane * 4 + 4].copy_from_slice(c);
                        corr[lane] = -128 * c.iter().map(|&x| x as i8 as i32).sum::<i32>();
                    }
                }
            }
        }
        (qsi, corr, dy16)
    }

    #[test]
    fn the_vnni_layout_is_the_elementwise_one() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut seed = 0x9e37_79b9_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for (nb, groups, pad) in [(1, 1, 0), (3, 2, 6), (8, 3, 34), (24, 1, 2)] {
            let stride = nb * Q8_0 + pad;
            let mut a: Vec<u8> = (0..groups * TOK * stride).map(|_| next() as u8).collect();
            // scales: finite f16 values
            for r in 0..groups * TOK {
                for i in 0..nb {
                    a[r * stride + i * Q8_0 + 1] &= 0x3b;
                }
            }
            // extremes of the codes too
            a[2] = 0x80;
            a[3] = 0x7f;
            let mut act = Act8Q8::default();
            // a buffer used before (longer) must not leak into the next layout
            act.build_vnni(&vec![0x11u8; 4 * TOK * (30 * Q8_0)], 30 * Q8_0, 30, 4);
            act.build_vnni(&a, stride, nb, groups);
            let (qsi, corr, dy16) = vnni_reference(&a, stride, nb, groups);
            assert_eq!(act.qsi, qsi, "nb {nb} groups {groups}");
            assert_eq!(act.corr, corr, "nb {nb} groups {groups}");
            assert_eq!(act.dy16.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), dy16.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
    }
}
