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

/// Bytes ahead that the Q4_K and Q6_K kernels ask L2 (not L1) for. Measured in the VM's fast
/// memory phase (the read loop 70-72 GB/s on two threads), `examples/stream_probe`: Q4_K
/// 9216 x 2560 27.8 GB/s with `prefetch_ahead` (16 KB, into L1), 31.9 with 16 KB into L2,
/// 34.0 with 8 KB or 4 KB into L2, 29.9 with 32 KB; Q6_K (the 4B's lm head) 31.9 -> 40.3;
/// Q4_K 512 x 2048 (an expert) 23.6 -> 27.9. Q8_0's kernel fell from 37.8 to 21.5 the same way,
/// so it keeps `prefetch_ahead` (docs/bench.md "The one-token kernels prefetch into L2").
pub(crate) const PREFETCH_AHEAD_L2: usize = 8 << 10;

/// Prefetch into L2 of the line `PREFETCH_AHEAD_L2` bytes after `p` (as `prefetch_ahead`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead_l2(p: *const u8) {
    _mm_prefetch(p.wrapping_add(PREFETCH_AHEAD_L2) as *const i8, _MM_HINT_T1);
}

