//! Memory read bandwidth: the denominator of decode's floor (weight bytes a token reads /
//! bandwidth). Decode streams every weight from DRAM once per token, so no matvec can beat a
//! plain read loop over the same bytes with the same threads; this is that loop.
//!
//! Each of the pool's threads reads one contiguous share of the buffer with wide loads into
//! four independent accumulators (no stores, no software prefetch: on the machine of
//! docs/bench.md a prefetch in this loop measured 15-20% slower, the hardware prefetchers
//! alone stream best). The buffer must be much larger than the last-level cache and backed by
//! real pages (`buffer` fills it), or the figure is a cache's. It asks for 2 MiB pages, as the
//! weights' mapping does (`xwen_gguf::MapPages`): with 4 KiB pages a page walk every 4 KiB
//! costs this loop 6-10% here (docs/bench.md "the weights in 2 MiB pages"), and the floor is the best the
//! machine can stream.

use crate::Pool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// An anonymous mapping of whole pages, every byte written (1), asked for 2 MiB pages.
pub struct Buffer {
    map: memmap2::MmapMut,
    len: usize,
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map[..self.len]
    }
}

/// A buffer of `bytes` (rounded down to 4 KiB) with every page written, so reads hit DRAM
/// rather than the kernel's shared zero page; in 2 MiB pages where the kernel grants them.
pub fn buffer(bytes: usize) -> Buffer {
    let len = bytes / 4096 * 4096;
    let mut map = memmap2::MmapMut::map_anon(len.max(1)).expect("anonymous mapping for the bandwidth buffer");
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage); // a hint; 4 KiB pages work the same
    map.fill(1);
    Buffer { map, len }
}

/// Reads `buf` once per pass with all of `pool`'s threads; returns each pass's GB/s
/// (10^9 bytes per second).
pub fn read_bandwidth(pool: &Pool, buf: &[u8], passes: usize) -> Vec<f64> {
    let n = pool.n_threads().max(1);
    // whole 128-byte steps per thread; a tail of < n·128 bytes is not read (nor counted)
    let share = buf.len() / n / 128 * 128;
    let sums: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let mut out = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t = Instant::now();
        pool.run(n, &|i| {
            let s = read_sum(&buf[i * share..(i + 1) * share]);
            sums[i].store(s, Ordering::Relaxed);
        });
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(&sums);
        out.push((share * n) as f64 / secs / 1e9);
    }
    out
}

/// A sum over `s` (len a multiple of 128) that the compiler cannot drop.
fn read_sum(s: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected just above.
        return unsafe { read_sum_avx2(s) };
    }
    let mut acc = [0u64; 4];
    for c in s.chunks_exact(32) {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = a.wrapping_add(u64::from_le_bytes(c[8 * k..8 * k + 8].try_into().unwrap()));
        }
    }
    acc.iter().fold(0, |a, &v| a.wrapping_add(v))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_sum_avx2(s: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let p = s.as_ptr();
    let mut acc = [_mm256_setzero_si256(); 4];
    let mut i = 0;
    while i + 128 <= s.len() {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(i + 32 * k) as *const __m256i));
        }
        i += 128;
    }
    let v = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
    let mut o = [0u64; 4];
    _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, v);
    o.iter().fold(0, |a, &v| a.wrapping_add(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_byte_of_each_share() {
        // the sum itself is checked: a loop the optimizer dropped would not produce it
        let mut buf = buffer(8192);
        buf.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        let expect_words: u64 = buf.chunks_exact(8).fold(0u64, |a, c| a.wrapping_add(u64::from_le_bytes(c.try_into().unwrap())));
        assert_eq!(read_sum(&buf), expect_words);
        let pool = Pool::new(2);
        let gbs = read_bandwidth(&pool, &buf, 3);
        assert_eq!(gbs.len(), 3);
        assert!(gbs.iter().all(|g| g.is_finite() && *g > 0.0));
    }

    #[test]
    fn buffer_is_whole_pages_of_nonzero_bytes() {
        let b = buffer(10_000);
        assert_eq!(b.len(), 8192);
        assert!(b.iter().all(|&x| x == 1));
    }
}
