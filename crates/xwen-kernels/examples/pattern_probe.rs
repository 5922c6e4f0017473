//! What a stream of loads with arithmetic between them gets from this machine's memory: the
//! ceiling a decode kernel of a given arithmetic density can reach, measured without any kernel.
//!
//!   cargo run -p xwen-kernels --release --example pattern_probe [-- WORK...]
//!
//! For each WORK (vector multiply-adds per 32-byte load, independent of each other, as a dot
//! kernel's are), a loop reads 512 MB of DRAM-resident bytes with two threads, with and without
//! a software prefetch 16 KB ahead (the decode kernels' distance), alternated with `membw`'s read
//! loop (the floor's denominator). The same loop over a 256 KB slice per thread (L2)
//! gives the arithmetic's own rate. Prints medians of the per-pass ratios to the read loop.

use std::arch::x86_64::*;
use std::time::Instant;
use xwen_kernels::{membw, Pool};

#[target_feature(enable = "avx2")]
unsafe fn stream(p: *const u8, len: usize, work: usize, prefetch: bool) -> u64 {
    let mut acc = [_mm256_setzero_si256(); 4];
    let c = _mm256_set1_epi8(3);
    let mut i = 0;
    while i + 128 <= len {
        if prefetch {
            _mm_prefetch(p.wrapping_add(i + (16 << 10)) as *const i8, _MM_HINT_T0);
            _mm_prefetch(p.wrapping_add(i + (16 << 10) + 64) as *const i8, _MM_HINT_T0);
        }
        for (k, a) in acc.iter_mut().enumerate() {
            let v = _mm256_loadu_si256(p.add(i + 32 * k) as *const __m256i);
            let mut s = v;
            for _ in 0..work {
                // independent of the previous iteration's work: only the final add chains
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(v, c));
            }
            *a = _mm256_add_epi64(*a, s);
        }
        i += 128;
    }
    let v = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
    _mm256_extract_epi64(v, 0) as u64
}

fn main() {
    if !is_x86_feature_detected!("avx2") {
        eprintln!("needs AVX2");
        return;
    }
    let works: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().expect("a number")).collect();
    let works = if works.is_empty() { vec![0, 1, 2, 3, 4, 6] } else { works };
    let passes = 7;
    let buf = membw::buffer(512 << 20);
    let pool = Pool::new(2);
    let half = buf.len() / 2 / 128 * 128;
    let run = |len: usize, reps: usize, work: usize, pf: bool| -> f64 {
        let t = Instant::now();
        pool.run(2, &|i| {
            for _ in 0..reps {
                // SAFETY: AVX2 checked in main; i·half + len <= buf.len().
                std::hint::black_box(unsafe { stream(buf.as_ptr().add(i * half), len, work, pf) });
            }
        });
        (2 * len * reps) as f64 / t.elapsed().as_secs_f64() / 1e9
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("work  in-L2 GB/s  DRAM GB/s (ratio to read loop)  with 16 KB prefetch (ratio)");
    for &w in &works {
        let l2 = median((0..passes).map(|_| run(256 << 10, 400, w, false)).collect());
        let (mut plain, mut pf, mut rp, mut rf) = (vec![], vec![], vec![], vec![]);
        for _ in 0..passes {
            // the floor's own denominator: membw's read loop, each thread a contiguous half
            let r = membw::read_bandwidth(&pool, &buf[..2 * half], 1)[0];
            let a = run(half, 1, w, false);
            let b = run(half, 1, w, true);
            plain.push(a);
            pf.push(b);
            rp.push(a / r);
            rf.push(b / r);
        }
        println!(
            "{w:4}  {l2:10.1}  {:9.2} ({:.3})  {:19.2} ({:.3})",
            median(plain),
            median(rp),
            median(pf),
            median(rf)
        );
    }
}
