//! What bounds the Q8_0 decode dot with its row in L1: cycles per 34-byte block (at the
//! nominal 3 GHz of docs/bench.md's VM) of the kernel decode uses and of variants of its loop.
//!
//!   cargo run -p xwen-kernels --release --example dot_probe [-- COLS]
//!
//! ggml's order keeps one FMA chain per row, so a row waits on the FMA latency (4 cycles) per
//! block: `no integer work` (scales and FMA only) and `no scales` show each half alone near that
//! bound, `two rows` shows two chains overlapping. Two rows per call were measured from DRAM
//! too and streamed worse (docs/bench.md "Tried and dropped: two Q8_0 rows per decode call"), so decode keeps one row per call.

use std::arch::x86_64::*;
use std::time::Instant;
use xwen_kernels::{dispatch, GgmlType};

type Variant = unsafe fn(usize, &[u8], &[u8], &[u8]) -> f32;

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale(w: &[u8], a: &[u8], b: usize) -> __m256 {
    let dw = _mm_cvtph_ps(_mm_loadl_epi64(w.as_ptr().add(b) as *const __m128i));
    let da = _mm_cvtph_ps(_mm_loadl_epi64(a.as_ptr().add(b) as *const __m128i));
    _mm256_broadcastss_ps(_mm_mul_ps(dw, da))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn int_dot(w: &[u8], a: &[u8], b: usize) -> __m256 {
    let x = _mm256_loadu_si256(w.as_ptr().add(b + 2) as *const __m256i);
    let y = _mm256_loadu_si256(a.as_ptr().add(b + 2) as *const __m256i);
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let o: [f32; 8] = std::mem::transmute(v);
    o.iter().sum()
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn full(n: usize, w: &[u8], _w1: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for b in (0..n / 32).map(|i| i * 34) {
        acc = _mm256_fmadd_ps(scale(w, a, b), int_dot(w, a, b), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn no_scales(n: usize, w: &[u8], _w1: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for b in (0..n / 32).map(|i| i * 34) {
        acc = _mm256_fmadd_ps(_mm256_set1_ps(0.5), int_dot(w, a, b), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn no_int(n: usize, w: &[u8], _w1: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for b in (0..n / 32).map(|i| i * 34) {
        acc = _mm256_fmadd_ps(scale(w, a, b), _mm256_loadu_ps(a.as_ptr().add(b + 2) as *const f32), acc);
    }
    hsum(acc)
}

/// Two rows, two chains (per block time: divide by 2).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_rows(n: usize, w0: &[u8], w1: &[u8], a: &[u8]) -> f32 {
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for b in (0..n / 32).map(|i| i * 34) {
        acc0 = _mm256_fmadd_ps(scale(w0, a, b), int_dot(w0, a, b), acc0);
        acc1 = _mm256_fmadd_ps(scale(w1, a, b), int_dot(w1, a, b), acc1);
    }
    hsum(acc0) + hsum(acc1)
}

fn cycles_per_block(blocks_per_call: usize, mut call: impl FnMut() -> f32) -> f64 {
    let iters = 100_000_000 / blocks_per_call;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let mut sink = 0.0;
        for _ in 0..iters {
            sink += call();
        }
        std::hint::black_box(sink);
        best = best.min(t.elapsed().as_nanos() as f64 / (iters * blocks_per_call) as f64);
    }
    best * 3.0
}

fn main() {
    assert!(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"));
    let cols: usize = std::env::args().nth(1).map_or(2048, |s| s.parse().expect("COLS"));
    assert!(cols.is_multiple_of(32), "COLS must be a multiple of 32");
    let (nb, rb) = (cols / 32, cols / 32 * 34);
    let mut w = vec![0u8; 3 * rb];
    let mut s = 1u32;
    for b in w.iter_mut() {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        *b = s as u8;
    }
    for blk in w.chunks_exact_mut(34) {
        blk[..2].copy_from_slice(&xwen_kernels::half::f32_to_f16(0.01).to_le_bytes());
    }
    let (w0, w1, a) = (&w[..rb], &w[rb..2 * rb], &w[2 * rb..]);
    let k = dispatch::row_kernel(GgmlType::Q8_0, 4096).expect("Q8_0 kernel");
    let c = cycles_per_block(nb, || (k.dot)(cols, std::hint::black_box(w0), a));
    println!("decode kernel (row_kernel Q8_0): {c:.2} cycles/block");
    let variants: [(&str, Variant, usize); 4] =
        [("same loop, no prefetch", full, 1), ("no scales", no_scales, 1), ("no integer work", no_int, 1), ("two rows", two_rows, 2)];
    for (name, f, rows) in variants {
        // SAFETY: AVX2/FMA/F16C asserted above; every slice holds `cols / 32` blocks.
        let c = cycles_per_block(nb * rows, || unsafe { f(cols, std::hint::black_box(w0), w1, a) });
        println!("{name}: {c:.2} cycles/block");
    }
}
