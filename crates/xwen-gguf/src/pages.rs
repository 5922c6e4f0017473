//! The page size of a file mapping. Decode streams every weight once per token, and with
//! 4 KiB pages that is a TLB miss (a page walk) every 4 KiB — for a MoE model's routed experts,
//! scattered 0.6 MB matrices, more still. Linux maps a file with 2 MiB entries where its page
//! cache holds 2 MiB folios (ext4 and xfs do, kernel 6.x), and fills the cache in 2 MiB folios
//! when the mapping that faults the file in is marked MADV_HUGEPAGE. Measured on the 35B-A3B
//! (docs/bench.md "the weights in 2 MiB pages"): decode 6.75 t/s with 2 MiB mappings, 4.94 with 4 KiB.

/// Which pages a weights mapping asks the kernel for (Linux only; elsewhere a no-op).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MapPages {
    /// MADV_HUGEPAGE: map 2 MiB folios with 2 MiB entries, and read uncached parts of the file
    /// in as 2 MiB folios.
    #[default]
    Huge,
    /// MADV_NOHUGEPAGE: 4 KiB entries only (for A/B timing).
    Small,
}

#[cfg(target_os = "linux")]
pub(crate) fn advise(map: &memmap2::Mmap, pages: MapPages) {
    let advice = match pages {
        MapPages::Huge => memmap2::Advice::HugePage,
        MapPages::Small => memmap2::Advice::NoHugePage,
    };
    // Only a hint: a kernel without THP refuses it, and the mapping works the same.
    let _ = map.advise(advice);
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn advise(_map: &memmap2::Mmap, _pages: MapPages) {}

/// Drops `path`'s clean, unmapped pages from the page cache (posix_fadvise DONTNEED), so the
/// next mapping marked `MapPages::Huge` reads the file back in 2 MiB folios. A page cache
/// filled by `read` (cat, cp, a 4 KiB mapping) holds small folios that no later mapping can
/// map with 2 MiB entries. Costs a re-read of the file from disk. A no-op off Linux.
pub fn evict_from_page_cache(path: &std::path::Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(path)?;
        // SAFETY: a valid open descriptor; the call only drops clean cached pages.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = path;
    Ok(())
}

/// Bytes of the mapping that starts at `addr` currently mapped with 2 MiB entries, from
/// /proc/self/smaps (`FilePmdMapped`); None where that is not available.
pub(crate) fn huge_mapped_bytes(addr: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    pmd_mapped_in(&smaps, addr)
}

/// `FilePmdMapped` of the smaps entry whose range starts at `addr`, in bytes.
fn pmd_mapped_in(smaps: &str, addr: usize) -> Option<u64> {
    let mut in_vma = false;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((start, _end)) = head.split_once('-') {
            if let Ok(start) = usize::from_str_radix(start, 16) {
                // a range line opens the next mapping's entry
                in_vma = start == addr;
                continue;
            }
        }
        if in_vma {
            if let Some(rest) = line.strip_prefix("FilePmdMapped:") {
                let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                return Some(kb * 1024);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::pmd_mapped_in;

    const SMAPS: &str = "\
7f1000000000-7f1000200000 r--p 00000000 fd:00 12 /a.gguf
Size:               2048 kB
FilePmdMapped:      2048 kB
7f2000000000-7f2000600000 r--p 00000000 fd:00 13 /b.gguf
Size:               6144 kB
FilePmdMapped:      4096 kB
Locked:                0 kB
";

    #[test]
    fn finds_the_entry_of_the_mapping() {
        assert_eq!(pmd_mapped_in(SMAPS, 0x7f2000000000), Some(4 << 20));
        assert_eq!(pmd_mapped_in(SMAPS, 0x7f1000000000), Some(2 << 20));
        assert_eq!(pmd_mapped_in(SMAPS, 0x7f3000000000), None);
    }

    #[test]
    fn a_kernel_without_the_field_reports_none() {
        assert_eq!(pmd_mapped_in("7f1000000000-7f1000200000 r--p 0 fd:00 1 /a\nSize: 8 kB\n", 0x7f1000000000), None);
    }
}
