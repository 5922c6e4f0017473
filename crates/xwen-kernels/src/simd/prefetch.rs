//! Software prefetch for kernels that stream weights from DRAM (a file of its own so the f32
//! primitives and the quantized kernels share it without importing each other).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Bytes ahead of a matvec kernel's read position that it asks the cache for. Decode streams
/// every weight from DRAM once; one core alone keeps too few lines in flight once the kernel's
/// arithmetic fills the out-of-order window (the read loop streams 12 GB/s, a Q8_0 matvec 7-8).
/// One prefetch per line consumed, spread through the loop, 16 KB ahead, measured 10.6-12.1
/// GB/s against 7.8-8.1 without and 6.5-8.1 for a burst of whole rows ahead (docs/bench.md).
pub(crate) const PREFETCH_AHEAD: usize = 16 << 10;

/// Prefetch of the line `PREFETCH_AHEAD` bytes after `p` (may lie past the end of the data:
/// prefetches never fault, and the address is only formed with wrapping arithmetic).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(p: *const u8) {
    _mm_prefetch(p.wrapping_add(PREFETCH_AHEAD) as *const i8, _MM_HINT_T0);
}

