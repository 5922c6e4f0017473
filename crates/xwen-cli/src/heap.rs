//! The process heap policy for inference: buffers of the same sizes are allocated and freed
//! every layer (activations of a prefill chunk, up to tens of MB each). With glibc's defaults
//! each one above the mmap threshold is a fresh mapping, so every forward pass page-faults and
//! zeroes its working set again and unmaps it after (~2-5% of a prefill, docs/bench.md).

/// Keeps freed heap memory in the process for reuse: allocations up to 32 MB (glibc's ceiling
/// for the mmap threshold) come from the heap, and its top is never trimmed. A process-wide
/// setting, so applications opt in (the CLI does at start-up); a no-op off glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt only adjusts allocator parameters; called before threads allocate.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, i32::MAX);
        }
    }
}
