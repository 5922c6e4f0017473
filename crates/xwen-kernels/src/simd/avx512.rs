//! AVX-512 F/BW/VL/VNNI kernels: Q8_0 (256-bit VNNI) and the float formats (512-bit FMA);
//! dispatch uses the AVX2 kernels for everything else.
//!
//! 512-bit versions of the k-quant kernels (VNNI `vpdpbusd` plus a 32-bit multiply per
//! sub-block scale) were written, passed the property tests, and measured 1.7-2.3x *slower*
//! than the AVX2 kernels on a Sapphire-Rapids-class Xeon (docs/bench.md): the scale multiply
//! (`vpmulld`) and the lane shuffles cost more than the wider registers save, and ggml also
//! runs its AVX2 k-quant code on AVX-512 machines. They were removed.
//! Every `unsafe fn` here requires the features named in its `target_feature`.

use std::arch::x86_64::*;

use super::avx2::h2f;
use crate::formats::DotFn;
use crate::GgmlType;

macro_rules! safe_wrapper {
    ($name:ident, $inner:ident) => {
        fn $name(n: usize, w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: only reachable through `dot_fn`, used by dispatch after detecting
            // AVX-512 F/BW/VL/VNNI (and AVX2/FMA/F16C); lengths checked by callers.
            unsafe { $inner(n, w, a) }
        }
    };
}

safe_wrapper!(q8_0, dot_q8_0);
safe_wrapper!(f32d, dot_f32);
safe_wrapper!(f16d, dot_f16);
safe_wrapper!(bf16d, dot_bf16);

/// ggml_vec_dot_f32 of an AVX-512 build (`f32ops::x86::dot512`): what llama.cpp computes for an
/// F32 weight against one token there.
pub fn dot_f32_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= 4 * n && a.len() >= 4 * n);
    // SAFETY: handed out by dispatch only after detecting AVX-512 F; lengths checked above.
    unsafe { crate::f32ops::x86::dot512_raw(w.as_ptr() as *const f32, a.as_ptr() as *const f32, n) }
}

/// ggml_vec_dot_f16 of an AVX-512 build without AVX512-FP16 (GGML_F16_STEP 64, EPR 16: F16
/// widened with `vcvtph2ps`): four 16-lane FMA accumulators over steps of 64, reduced as
/// GGML_F32x16_REDUCE into a double, the leftovers' float products added in double — what
/// llama.cpp computes for an F16 weight against one token there.
pub fn dot_f16_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= 2 * n && a.len() >= 2 * n);
    // SAFETY: handed out by dispatch only after detecting AVX-512 F; lengths checked above.
    unsafe { dot_f16_ggml512(n, w, a) }
}

/// ggml_vec_dot_f16 of an AVX-512 build over n halves (`dot_f16_vec_dot`'s body), inlinable
/// into a caller's loop compiled with these features (flash attention's per-position scores).
///
/// # Safety
/// AVX-512 F, FMA and F16C must be available; `w` and `a` hold at least 2·n bytes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub unsafe fn dot_f16_ggml512(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let np = n & !63;
    let mut i = 0;
    while i < np {
        for (k, ac) in acc.iter_mut().enumerate() {
            let x = _mm512_cvtph_ps(load256(w, 2 * (i + 16 * k)));
            let y = _mm512_cvtph_ps(load256(a, 2 * (i + 16 * k)));
            *ac = _mm512_fmadd_ps(x, y, *ac);
        }
        i += 64;
    }
    half_tail(crate::f32ops::x86::ggml_reduce512(acc) as f64, w, a, i, n, crate::half::f16_to_f32) as f32
}

/// `sum` plus the leftovers of a 16-bit float dot product past `from`, one at a time: each
/// product in float, added in double (ggml_vec_dot_f16 / _bf16's tails), `to_f32` widening the
/// format.
#[inline]
fn half_tail(sum: f64, w: &[u8], a: &[u8], from: usize, n: usize, to_f32: fn(u16) -> f32) -> f64 {
    let at = |p: &[u8], i: usize| to_f32(u16::from_le_bytes([p[2 * i], p[2 * i + 1]]));
    (from..n).fold(sum, |s, i| s + (at(w, i) * at(a, i)) as f64)
}

/// 32 BF16 values at byte `off` of `p`, as `vdpbf16ps` takes them.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bh32(p: &[u8], off: usize) -> __m512bh {
    std::mem::transmute(_mm512_loadu_si512(p.as_ptr().add(off) as *const _))
}

/// Whether the CPU has AVX512-BF16 (`vdpbf16ps`), which a native llama.cpp build then uses
/// for every BF16 product.
pub fn has_bf16_dot() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx512bf16"))
}

/// ggml_vec_dot_bf16 of a build with AVX512-BF16: two `vdpbf16ps` accumulators over steps of 64
/// (each lane takes a pair of products per instruction, as the hardware rounds them), each
/// reduced by GCC's `_mm512_reduce_add_ps` and added to a double, the leftovers' float
/// products added in double. The instruction itself, so the bits are the CPU's as llama.cpp's
/// are. Only where `has_bf16_dot`.
pub fn dot_bf16_vec_dot(n: usize, w: &[u8], a: &[u8]) -> f32 {
    assert!(w.len() >= 2 * n && a.len() >= 2 * n && has_bf16_dot());
    // SAFETY: AVX512-BF16 (and F) detected above; lengths checked.
    unsafe { dot_bf16_dp_vec(n, w, a) }
}

#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_bf16_dp_vec(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let (mut c1, mut c2) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    while i + 64 <= n {
        c1 = _mm512_dpbf16_ps(c1, bh32(w, 2 * i), bh32(a, 2 * i));
        c2 = _mm512_dpbf16_ps(c2, bh32(w, 2 * (i + 32)), bh32(a, 2 * (i + 32)));
        i += 64;
    }
    let mut s = crate::f32ops::x86::reduce_add512(c1) as f64;
    s += crate::f32ops::x86::reduce_add512(c2) as f64;
    half_tail(s, w, a, i, n, crate::half::bf16_to_f32) as f32
}

/// tinyBLAS<32, __m512, __m512bh> (sgemm.cpp with AVX512-BF16): one `vdpbf16ps` chain per
/// output over k in steps of 32, the k % 32 tail as a zero-masked load, then GCC's
/// `_mm512_reduce_add_ps`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn dot_bf16_dp_tinyblas(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut c = _mm512_setzero_ps();
    let n32 = n / 32 * 32;
    for i in (0..n32).step_by(32) {
        c = _mm512_dpbf16_ps(c, bh32(w, 2 * i), bh32(a, 2 * i));
    }
    if n32 < n {
        let m: __mmask32 = (1u32 << (n - n32)) - 1;
        let x: __m512bh = std::mem::transmute(_mm512_maskz_loadu_epi16(m, w.as_ptr().add(2 * n32) as *const i16));
        let y: __m512bh = std::mem::transmute(_mm512_maskz_loadu_epi16(m, a.as_ptr().add(2 * n32) as *const i16));
        c = _mm512_dpbf16_ps(c, x, y);
    }
    crate::f32ops::x86::reduce_add512(c)
}

pub fn dot_fn(weight: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    Some(match weight {
        T::Q8_0 => q8_0,
        T::F32 => f32d,
        T::F16 => f16d,
        T::BF16 => bf16d,
        _ => return None,
    })
}

/// The lanes 0..r of a 16-lane vector (r < 16).
#[inline]
fn tail_mask(r: usize) -> __mmask16 {
    debug_assert!(r < 16);
    ((1u32 << r) - 1) as __mmask16
}

/// (Only AVX is needed for the load: with fewer features than its callers it inlines into
/// every one of them, the F16C and BF16 dots included.)
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load256(p: &[u8], off: usize) -> __m256i {
    debug_assert!(off + 32 <= p.len());
    _mm256_loadu_si256(p.as_ptr().add(off) as *const __m256i)
}

/// 256-bit VNNI: `vpdpbusd` sums the same groups of 4 byte products into the same i32 lanes
/// as AVX2's maddubs+madd pair, and the float accumulation is identical, so this returns the
/// AVX2 kernel's bits exactly (which keeps the AVX2 multi-token kernel valid here).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_q8_0(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / 32 {
        let b = 34 * i;
        let d = _mm256_set1_ps(h2f(w, b) * h2f(a, b));
        let x = load256(w, b + 2);
        let p = _mm256_dpbusd_epi32(
            _mm256_setzero_si256(),
            _mm256_sign_epi8(x, x),
            _mm256_sign_epi8(load256(a, b + 2), x),
        );
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
    }
    hsum256(acc)
}

/// The horizontal sum `dot_q8_0` ends with (the AVX2 kernel's order).
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum256(acc: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// `dot_q8_0` for up to 4 activation rows (`stride` bytes apart) against one weight row: each
/// weight block loaded and its magnitudes taken once for all rows, then per row exactly
/// `dot_q8_0`'s operations in its order — each row's result is that kernel's bits. Against the
/// AVX2 multi-row kernel a row's products cost one `vpdpbusd` instead of maddubs + madd, which
/// is most of a decode row's work in a Q8_0 product (the mixers' projections of a Q4_K_M file).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn multi_q8_0_rows<const T: usize>(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..n / 32 {
        let b = 34 * i;
        let dw = h2f(w, b);
        let x = load256(w, b + 2);
        let ax = _mm256_sign_epi8(x, x);
        for (t, acc) in acc.iter_mut().enumerate() {
            let ba = t * stride + b;
            let d = _mm256_set1_ps(dw * h2f(a, ba));
            let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, _mm256_sign_epi8(load256(a, ba + 2), x));
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *acc);
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = hsum256(acc);
    }
}

fn multi_q8_0(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    debug_assert!(w.len() >= n / 32 * 34 && a.len() >= (out.len() - 1) * stride + n / 32 * 34);
    // SAFETY: handed out by `multi_dot_fn` only where `Isa::Avx512` was detected (AVX-512
    // F/BW/VL/VNNI with AVX2/FMA/F16C); callers checked that `a` holds out.len() rows of
    // `stride` bytes.
    unsafe { count_1_to_4!(out.len(), multi_q8_0_rows::<N>(n, w, a, stride, out)) }
}

/// Q8_0 activation rows laid out once for `q8_0_prepared_rows`: per row and block the scale as
/// f32 and the 32 codes offset to unsigned (x + 128), so that a weight row's product with each
/// of them is one `vpdpbusd` per block — no per-row sign step, no per-row f16 conversion.
#[derive(Default)]
pub struct Q8Prepared {
    nb: usize,
    rows: usize,
    scales: Vec<f32>,
    codes: Vec<u8>,
}

impl Q8Prepared {
    /// Lays out `rows` Q8_0 activation rows of `nb` blocks each (`xq`, back to back), reusing
    /// this value's buffers.
    pub fn fill(&mut self, xq: &[u8], rows: usize, nb: usize) {
        assert!(xq.len() >= rows * nb * 34, "Q8Prepared::fill: activations too short");
        self.nb = nb;
        self.rows = rows;
        self.scales.clear();
        self.codes.clear();
        for blk in xq[..rows * nb * 34].chunks_exact(34) {
            self.scales.push(crate::half::read_f16(blk));
            self.codes.extend(blk[2..].iter().map(|&c| c ^ 0x80));
        }
    }
}

/// One Q8_0 weight row (`nb` blocks) against activation rows `t0..t0 + out.len()` of `acts`
/// (at most 8 at once): `dot_q8_0`'s bits per row. The i32 lane sums are the same integers —
/// `vpdpbusd` of the unsigned codes (x + 128) with the weights, started from −128·Σw of the
/// lane's four weights (one `vpdpbusd` per block, shared by the rows), is Σ x·w — and the
/// float epilogue is the same: d = d_w·d_x rounded once, then one FMA per block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_prepared_rows<const T: usize>(w: &[u8], acts: &Q8Prepared, t0: usize, out: &mut [f32]) {
    let nb = acts.nb;
    let off = _mm256_set1_epi8(0x80u8 as i8);
    let zero = _mm256_setzero_si256();
    let codes = acts.codes.as_ptr();
    let scales = acts.scales.as_ptr();
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nb {
        let b = 34 * i;
        let dw = _mm256_set1_ps(h2f(w, b));
        let x = load256(w, b + 2);
        let neg_c = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, off, x));
        for (t, acc) in acc.iter_mut().enumerate() {
            let at = (t0 + t) * nb + i;
            let a = _mm256_loadu_si256(codes.add(at * 32) as *const __m256i);
            let p = _mm256_dpbusd_epi32(neg_c, a, x);
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(*scales.add(at)));
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *acc);
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = hsum256(acc);
    }
}

/// `q8_0_prepared_rows` over the first `out.len()` rows of `acts`, eight at a time. Requires
/// `Isa::Avx512` (AVX-512 F/BW/VL/VNNI, AVX2, FMA, F16C): `dispatch::RowKernel::q8_prepared`
/// is set only there.
pub fn q8_0_prepared(w: &[u8], acts: &Q8Prepared, out: &mut [f32]) {
    assert!(w.len() >= acts.nb * 34 && out.len() <= acts.rows, "q8_0_prepared: sizes");
    for (g, o) in out.chunks_mut(8).enumerate() {
        let t = 8 * g;
        // SAFETY: only called where Isa::Avx512 was detected (see above); the weight row holds
        // nb blocks and rows t..t + o.len() exist in `acts` (asserted).
        unsafe {
            match o.len() {
                1 => q8_0_prepared_rows::<1>(w, acts, t, o),
                2 => q8_0_prepared_rows::<2>(w, acts, t, o),
                3 => q8_0_prepared_rows::<3>(w, acts, t, o),
                4 => q8_0_prepared_rows::<4>(w, acts, t, o),
                5 => q8_0_prepared_rows::<5>(w, acts, t, o),
                6 => q8_0_prepared_rows::<6>(w, acts, t, o),
                7 => q8_0_prepared_rows::<7>(w, acts, t, o),
                _ => q8_0_prepared_rows::<8>(w, acts, t, o),
            }
        }
    }
}

/// `avx2_multi::multi_q6_k` (the AVX2 single-token kernel's operations per row, which this
/// set runs for Q6_K) with each sub-block's scale product and its add as one `vpdpwssd`: the
/// same i32 lanes (s·p pairs summed exactly either way), so the same bits, one instruction
/// fewer per row and 32 codes. Up to 8 rows share a block's decoding (`MULTI_Q6_K_ROWS`).
/// Each super-block's 4 lines `PREFETCH_AHEAD` on are asked for, as the one-token kernels do:
/// the output matrix of several sequences' decode rows streams too slowly for the hardware
/// prefetcher alone (+4% on the 4B's 8-sequence decode, docs/bench.md "the 8-row products were
/// waiting on memory").
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn multi_q6_k_rows<const T: usize>(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    use super::avx2::{f32at, load, load128, q6_half, q6_offset, scale_pair, Q8K, QK};
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..n / QK {
        let bw = i * 210;
        for o in [0, 64, 128, 192] {
            super::prefetch::prefetch_ahead(w.as_ptr().wrapping_add(bw + o));
        }
        let wd = h2f(w, bw + 208);
        let scales = load128(w, bw + 192);
        let mut sumi = [_mm256_setzero_si256(); T];
        for h in 0..2 {
            for (k, &qk) in q6_half(w, bw, h).iter().enumerate() {
                let s = scale_pair(scales, 4 * h + k);
                for (t, sumi) in sumi.iter_mut().enumerate() {
                    let q8 = load(a, t * stride + i * Q8K + 4 + 128 * h + 32 * k);
                    *sumi = _mm256_dpwssd_epi32(*sumi, s, _mm256_maddubs_epi16(qk, q8));
                }
            }
        }
        for (t, acc) in acc.iter_mut().enumerate() {
            let ba = t * stride + i * Q8K;
            let d = f32at(a, ba) * wd;
            let si = _mm256_sub_epi32(sumi[t], q6_offset(w, bw, a, ba));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(si), *acc);
        }
    }
    for (o, acc) in out.iter_mut().zip(acc) {
        *o = super::avx2::hsum_ps(acc);
    }
}

fn multi_q6_k(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    debug_assert!(w.len() >= n / 256 * 210 && a.len() >= (out.len() - 1) * stride + n / 256 * 292);
    // SAFETY: handed out by `multi_dot_fn` only where `Isa::Avx512` was detected (AVX-512
    // F/BW/VL/VNNI with AVX2/FMA/F16C); callers checked that `a` holds out.len() rows of
    // `stride` bytes.
    unsafe {
        match out.len() {
            1 => multi_q6_k_rows::<1>(n, w, a, stride, out),
            2 => multi_q6_k_rows::<2>(n, w, a, stride, out),
            3 => multi_q6_k_rows::<3>(n, w, a, stride, out),
            4 => multi_q6_k_rows::<4>(n, w, a, stride, out),
            5 => multi_q6_k_rows::<5>(n, w, a, stride, out),
            6 => multi_q6_k_rows::<6>(n, w, a, stride, out),
            7 => multi_q6_k_rows::<7>(n, w, a, stride, out),
            8 => multi_q6_k_rows::<8>(n, w, a, stride, out),
            k => panic!("multi_q6_k takes 1..=8 rows, got {k}"),
        }
    }
}

/// `avx2_q4k_repack`'s multi-row kernel in the gemv order (a repacked Q4_K matrix's decode
/// rows: 2–3 of them, or a tail) with each sub-block's scale product and add as one
/// `vpdpwssd`, accumulated straight into the row's i32 lanes: the same integers (exact sums in
/// any order), then the same FMAs per super-block — each token's in its own lane of one
/// vector (its sums reduced by `hadd`s for all tokens at once, where one token's reduction and
/// scalar FMAs took about as many instructions as its products), so the same bits.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_gemv_rows<const T: usize>(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    use super::avx2::{bcast_i16, bsums32, f32at, k4_scales_mins, load, Q8K, QK};
    const { assert!(T >= 1 && T <= 4) };
    let m4 = _mm256_set1_epi8(0x0f);
    // lane t: token t's running sums (lanes past T stay 0)
    let (mut acc, mut accm) = (_mm_setzero_ps(), _mm_setzero_ps());
    for i in 0..n / QK {
        let bw = i * 144;
        let (wd, wdmin) = (h2f(w, bw), h2f(w, bw + 2));
        let sm = k4_scales_mins(w, bw + 4);
        let mins = _mm256_extracti128_si256(sm, 1);
        let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        let mut v = [_mm256_setzero_si256(); T];
        for j in 0..4 {
            let q4 = load(w, bw + 16 + 32 * j);
            let q4l = _mm256_and_si256(q4, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            let (sl, sh) = (bcast_i16(sc, 2 * j), bcast_i16(sc, 2 * j + 1));
            for (t, v) in v.iter_mut().enumerate() {
                let ba = t * stride + i * Q8K;
                let pl = _mm256_maddubs_epi16(q4l, load(a, ba + 4 + 64 * j));
                let ph = _mm256_maddubs_epi16(q4h, load(a, ba + 4 + 64 * j + 32));
                *v = _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(*v, sl, pl), sh, ph);
            }
        }
        let (mut ps, mut pm, mut dy) = ([_mm_setzero_si128(); 4], [_mm_setzero_si128(); 4], [0f32; 4]);
        for (t, v) in v.iter().enumerate() {
            let ba = t * stride + i * Q8K;
            dy[t] = f32at(a, ba);
            // lane k: Σ m·bsum over sub-blocks 2k, 2k+1
            pm[t] = _mm_madd_epi16(mins, bsums32(a, ba));
            ps[t] = _mm_add_epi32(_mm256_castsi256_si128(*v), _mm256_extracti128_si256(*v, 1));
        }
        // lane t: the sum of token t's 4 lanes (exact integers, so the order is free)
        let sums = _mm_hadd_epi32(_mm_hadd_epi32(ps[0], ps[1]), _mm_hadd_epi32(ps[2], ps[3]));
        let msums = _mm_hadd_epi32(_mm_hadd_epi32(pm[0], pm[1]), _mm_hadd_epi32(pm[2], pm[3]));
        let dyv = _mm_loadu_ps(dy.as_ptr());
        // d = wd·dy, dmin = wdmin·dy, then fma(f32(sum), d, acc) per token, as the scalar steps
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), _mm_mul_ps(_mm_set1_ps(wd), dyv), acc);
        accm = _mm_fmadd_ps(_mm_cvtepi32_ps(msums), _mm_mul_ps(_mm_set1_ps(wdmin), dyv), accm);
    }
    let mut r = [0f32; 4];
    _mm_storeu_ps(r.as_mut_ptr(), _mm_sub_ps(acc, accm));
    out[..T].copy_from_slice(&r[..T]);
}

/// The multi-row kernel of a repacked Q4_K matrix in the gemv order (`q4k_gemv_rows`).
pub fn q4k_gemv_multi(n: usize, w: &[u8], a: &[u8], stride: usize, out: &mut [f32]) {
    debug_assert!(w.len() >= n / 256 * 144 && a.len() >= (out.len() - 1) * stride + n / 256 * 292);
    // SAFETY: handed out by dispatch only where `Isa::Avx512` was detected (AVX-512
    // F/BW/VL/VNNI with AVX2/FMA/F16C); callers checked that `a` holds out.len() rows of
    // `stride` bytes.
    unsafe { count_1_to_4!(out.len(), q4k_gemv_rows::<N>(n, w, a, stride, out)) }
}

/// The multi-row kernel of this set for `weight`, where it has its own (Q8_0, Q6_K); None: the
/// AVX2 multi-row kernels apply where this set uses their single-token twins (`dispatch`).
pub fn multi_dot_fn(weight: GgmlType) -> Option<crate::formats::MultiDotFn> {
    match weight {
        GgmlType::Q8_0 => Some(multi_q8_0),
        GgmlType::Q6_K => Some(multi_q6_k),
        _ => None,
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_f32(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // F32 weights against 2+ tokens go through llamafile's tinyBLAS in an AVX-512 build of
    // llama.cpp (sgemm.cpp tinyBLAS<16, __m512, ...>): one 16-lane FMA chain per output over k,
    // the k % 16 tail one more step of masked (zero-filled) loads (gemm_bloc's load_partial),
    // then GCC's _mm512_reduce_add_ps; single tokens take `dot_f32_vec_dot`.
    debug_assert!(w.len() >= 4 * n && a.len() >= 4 * n);
    crate::f32ops::x86::dot512_tinyblas_raw(w.as_ptr() as *const f32, a.as_ptr() as *const f32, n)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_f16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // tinyBLAS<16> over F16 (the activations converted to F16 first): one 16-lane FMA chain of
    // the widened values per output, the k % 16 tail masked as `dot_f32`'s, then GCC's
    // _mm512_reduce_add_ps.
    let full = n / 16 * 16;
    let mut acc = _mm512_setzero_ps();
    for i in (0..full).step_by(16) {
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(load256(w, 2 * i)), _mm512_cvtph_ps(load256(a, 2 * i)), acc);
    }
    if full < n {
        let m = tail_mask(n - full);
        let (pw, pa) = (w.as_ptr().add(2 * full) as *const i16, a.as_ptr().add(2 * full) as *const i16);
        acc = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, pw)), _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, pa)), acc);
    }
    crate::f32ops::x86::reduce_add512(acc)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn bf16x16(p: &[u8], off: usize) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(load256(p, off)),
        16,
    ))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_bf16(n: usize, w: &[u8], a: &[u8]) -> f32 {
    // a CPU with AVX512-BF16: what an AVX512-BF16 build's tinyBLAS computes, on the instruction
    if has_bf16_dot() {
        return dot_bf16_dp_tinyblas(n, w, a);
    }
    let mut acc = [_mm512_setzero_ps(); 2];
    let n32 = n / 32 * 32;
    for i in (0..n32).step_by(32) {
        for (k, ac) in acc.iter_mut().enumerate() {
            *ac = _mm512_fmadd_ps(
                bf16x16(w, 2 * (i + 16 * k)),
                bf16x16(a, 2 * (i + 16 * k)),
                *ac,
            );
        }
    }
    let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
    for i in n32..n {
        let x = crate::half::bf16_to_f32(u16::from_le_bytes([w[2 * i], w[2 * i + 1]]));
        let y = crate::half::bf16_to_f32(u16::from_le_bytes([a[2 * i], a[2 * i + 1]]));
        s += x * y;
    }
    s
}
