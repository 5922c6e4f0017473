//! Positioned reads of a model file that bypass the page cache (Linux `O_DIRECT`), for the
//! streamed expert store: a cache hit rate is only real if a miss really goes to the disk, and
//! expert bytes read through the page cache would sit in RAM outside the budget
//! (docs/decisions.md "Experts streamed from disk").
//!
//! `O_DIRECT` wants the file offset, the length and the buffer address aligned to the device's
//! logical block; every read here covers whole 4 KiB blocks around the bytes asked for, into a
//! 4 KiB-aligned place of the destination. Where the filesystem refuses `O_DIRECT` (tmpfs, some
//! overlays) the file is read normally and the read bytes are dropped from the page cache
//! afterwards (`POSIX_FADV_DONTNEED`), which keeps the RAM bound if not the hit-rate purity;
//! [`DirectFile::is_direct`] says which.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// pread(2): a read at an offset that leaves the file position alone (threads share the file).
fn read_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    #[cfg(unix)]
    return std::os::unix::fs::FileExt::read_at(f, buf, off);
    #[cfg(windows)]
    return std::os::windows::fs::FileExt::seek_read(f, buf, off);
}

/// The alignment of a direct read (offset, length) where the device does not say its own, and
/// of every buffer's address; the memory plan counts reads at this grain (the most a read can
/// round up to).
pub const BLOCK: u64 = 4096;

/// The finest grain direct reads take (a disk's logical block is 512 B at the least).
pub const MIN_GRAIN: u64 = 512;

/// The grain the kernel says direct reads of `file` need (statx `STATX_DIOALIGN`: the larger of
/// the offset and the buffer alignment), where it says one between MIN_GRAIN and BLOCK; else
/// BLOCK. A table row read at 512 B reads up to 8× fewer bytes than at 4 KiB.
#[cfg(target_os = "linux")]
fn dio_grain(file: &File) -> u64 {
    use std::os::fd::AsRawFd;
    // SAFETY: statx fills the zeroed struct it is given; an empty path with AT_EMPTY_PATH names
    // the open descriptor itself.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut st) };
    if rc != 0 || st.stx_mask & libc::STATX_DIOALIGN == 0 {
        return BLOCK;
    }
    let g = u64::from(st.stx_dio_offset_align.max(st.stx_dio_mem_align));
    if g.is_power_of_two() && (MIN_GRAIN..=BLOCK).contains(&g) {
        g
    } else {
        BLOCK
    }
}

/// Injected read faults, for tests of the failure paths (an EIO, a short read): the faults a
/// real disk gives, on demand. Process-wide; off (one relaxed atomic load per read) unless a
/// test arms it.
pub mod faults {
    use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

    /// What an armed read returns.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Fault {
        /// The disk reports an I/O error (EIO).
        Eio,
        /// The read returns fewer bytes than asked, then end of file.
        ShortRead,
    }

    static KIND: AtomicU8 = AtomicU8::new(0);
    /// Reads still to pass before the faults begin, and faults still to give.
    static SKIP: AtomicU64 = AtomicU64::new(0);
    static LEFT: AtomicU64 = AtomicU64::new(0);

    /// The next `count` expert reads after `skip` successful ones fail with `fault`.
    pub fn inject(fault: Fault, skip: u64, count: u64) {
        SKIP.store(skip, Ordering::SeqCst);
        LEFT.store(count, Ordering::SeqCst);
        KIND.store(if fault == Fault::Eio { 1 } else { 2 }, Ordering::SeqCst);
    }

    /// File bytes every read touching them fails on with EIO, until `clear` (a bad stretch of
    /// the disk: one expert fails for good, the others read); `end` 0 is none.
    static BAD_START: AtomicU64 = AtomicU64::new(0);
    static BAD_END: AtomicU64 = AtomicU64::new(0);

    /// Every read that touches file bytes `range` fails with EIO from now on.
    pub fn fail_bytes(range: std::ops::Range<u64>) {
        BAD_START.store(range.start, Ordering::SeqCst);
        BAD_END.store(range.end, Ordering::SeqCst);
    }

    /// No more faults.
    pub fn clear() {
        KIND.store(0, Ordering::SeqCst);
        LEFT.store(0, Ordering::SeqCst);
        BAD_END.store(0, Ordering::SeqCst);
    }

    /// Whether a read of `ranges` touches the bad bytes (`fail_bytes`).
    pub(super) fn touches_bad(ranges: &[std::ops::Range<u64>]) -> bool {
        let end = BAD_END.load(Ordering::Relaxed);
        if end == 0 {
            return false;
        }
        let start = BAD_START.load(Ordering::SeqCst);
        ranges.iter().any(|r| r.start < end && start < r.end)
    }

    /// The fault this read takes, if one is armed and due.
    pub(super) fn take() -> Option<Fault> {
        if KIND.load(Ordering::Relaxed) == 0 {
            return None;
        }
        if SKIP.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| s.checked_sub(1)).is_ok() {
            return None;
        }
        LEFT.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1)).ok()?;
        match KIND.load(Ordering::SeqCst) {
            1 => Some(Fault::Eio),
            2 => Some(Fault::ShortRead),
            _ => None,
        }
    }
}

pub struct DirectFile {
    file: File,
    direct: bool,
    len: u64,
    /// Where this file's read buffers go back to when dropped, for its next reads (`recycle`).
    recycler: Option<Arc<Recycler>>,
    /// Every read widened to whole multiples of this (`grain`).
    grain: u64,
    /// The finest grain the device allows direct reads at (`dio_grain`; BLOCK when buffered).
    device_grain: u64,
}

/// Buffers of earlier reads, kept for the next ones. A fresh allocation's pages are mapped and
/// zeroed by the kernel as the direct read first touches them — a third of a streamed decode's
/// CPU time on the 35B-A3B (perf: `clear_page_erms` under `__get_user_pages`), on cores the
/// compute needs; a recycled buffer's pages are mapped already and the read overwrites them.
/// It holds at most `max` buffers: a buffer comes back only when an expert leaves the cache or
/// a layer drops one it read uncached, and a read takes one out, so the buffers in flight plus
/// those kept never exceed what the reads in flight held at their peak (the memory plan's
/// "in flight").
pub struct Recycler {
    free: Mutex<Vec<Vec<u8>>>,
    max: usize,
}

impl Recycler {
    /// A kept buffer of at least `n` bytes and not much more (a larger one would hold RAM the
    /// cache's count would charge to a smaller expert), if there is one.
    fn take(&self, n: usize) -> Option<Vec<u8>> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let fits = |v: &Vec<u8>| v.len() >= n && v.len() <= n + n / 8 + BLOCK as usize;
        let i = free.iter().position(fits)?;
        Some(free.swap_remove(i))
    }

    fn give(&self, raw: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < self.max {
            free.push(raw);
        }
    }

    /// Buffers kept now.
    pub fn kept(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl DirectFile {
    /// Opens `path` for direct reads, falling back to buffered reads where the filesystem
    /// refuses them.
    pub fn open(path: &Path) -> io::Result<DirectFile> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::OpenOptionsExt;
            if let Ok(file) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
                let len = file.metadata()?.len();
                let device_grain = dio_grain(&file);
                let df = DirectFile { file, direct: true, len, recycler: None, grain: BLOCK, device_grain };
                // some filesystems accept the flag at open and fail the first read (EINVAL)
                let mut probe = AlignedBuf::new(BLOCK as usize);
                if len == 0 || read_at(&df.file, probe.block_mut(0, BLOCK as usize), 0).is_ok() {
                    return Ok(df);
                }
            }
        }
        DirectFile::open_buffered(path)
    }

    /// Opens `path` for buffered reads (the fallback of `open`), each read's bytes dropped from
    /// the page cache after it.
    pub fn open_buffered(path: &Path) -> io::Result<DirectFile> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(DirectFile { file, direct: false, len, recycler: None, grain: BLOCK, device_grain: BLOCK })
    }

    /// From now on, the buffers of this file's reads are kept when dropped (up to `max`) and
    /// reused by its next reads (`Recycler`).
    pub fn recycle(&mut self, max: usize) {
        self.recycler = (max > 0).then(|| Arc::new(Recycler { free: Mutex::new(Vec::new()), max }));
    }

    /// The buffers kept for reuse, if this file recycles them.
    pub fn recycler(&self) -> Option<&Recycler> {
        self.recycler.as_deref()
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The grain every read is widened to (offset and length): BLOCK, or the device's direct-I/O
    /// alignment after `use_device_grain`.
    pub fn grain(&self) -> u64 {
        self.grain
    }

    /// Reads from now on at the finest grain the device allows direct reads at (`dio_grain`):
    /// for reads of a few hundred bytes (a table's rows), up to 8× fewer bytes than whole 4 KiB
    /// blocks. Expert reads keep BLOCK: they are megabytes, and the expert cache's budget
    /// counts them at that grain.
    pub fn use_device_grain(&mut self) {
        self.grain = self.device_grain;
    }

    /// The file's length when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads the byte ranges `ranges` of the file into one buffer; returns it with the place of
    /// each range inside it. A range past the end of the file (a file truncated since it was
    /// opened) is an error, never a short buffer.
    pub fn read_ranges(&self, ranges: &[Range<u64>]) -> io::Result<(AlignedBuf, Vec<Range<usize>>)> {
        match faults::take() {
            Some(faults::Fault::Eio) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            Some(faults::Fault::ShortRead) => {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a short read: the file returned fewer bytes than asked"))
            }
            None => {}
        }
        if faults::touches_bad(ranges) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        // each range widened to whole blocks, laid out one after the other
        let g = self.grain;
        let spans: Vec<Range<u64>> = ranges.iter().map(|r| r.start / g * g..r.end.div_ceil(g) * g).collect();
        let total: u64 = spans.iter().map(|s| s.end - s.start).sum();
        let mut buf = match &self.recycler {
            Some(r) => AlignedBuf::recycled(r, total as usize),
            None => AlignedBuf::new(total as usize),
        };
        let mut places = Vec::with_capacity(ranges.len());
        let mut at = 0usize;
        for (r, s) in ranges.iter().zip(&spans) {
            if r.end > self.len || r.start > r.end {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("bytes {}..{} lie past the end of the file ({} bytes)", r.start, r.end, self.len),
                ));
            }
            let span_len = (s.end - s.start) as usize;
            // the bytes wanted must all arrive; the block tail past EOF may not
            let need = (r.end - s.start) as usize;
            let dst = buf.block_mut(at, span_len);
            let mut got = 0usize;
            while got < need {
                match read_at(&self.file, &mut dst[got..], s.start + got as u64) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the file ended at byte {} while reading {}..{}", s.start + got as u64, r.start, r.end),
                        ))
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
                // a direct read that stops short of a block boundary stops at EOF: no retry
                if self.direct && got < need && !got.is_multiple_of(g as usize) {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the file ended while reading {}..{}", r.start, r.end),
                    ));
                }
            }
            let off = (r.start - s.start) as usize;
            places.push(at + off..at + off + (r.end - r.start) as usize);
            at += span_len;
        }
        if !self.direct {
            self.drop_cached(&spans);
        }
        Ok((buf, places))
    }

    /// Buffered fallback: the bytes just read leave the page cache, so RAM holds them once
    /// (in the expert cache), not twice.
    fn drop_cached(&self, spans: &[Range<u64>]) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            for s in spans {
                // SAFETY: a valid descriptor; the call only drops clean cached pages.
                unsafe {
                    libc::posix_fadvise(
                        self.file.as_raw_fd(),
                        s.start as libc::off_t,
                        (s.end - s.start) as libc::off_t,
                        libc::POSIX_FADV_DONTNEED,
                    )
                };
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = spans;
    }
}

/// A byte buffer whose usable part starts at a `BLOCK`-aligned address (what `O_DIRECT` needs
/// of the destination). Derefs to that part.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
    /// Where `raw` goes when this buffer is dropped, if anywhere.
    home: Option<Arc<Recycler>>,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + BLOCK as usize];
        let start = raw.as_ptr().align_offset(BLOCK as usize);
        AlignedBuf { raw, start, len, home: None }
    }

    /// A buffer of `len` usable bytes from `recycler`'s kept ones where one fits (its old bytes
    /// still in it: every read overwrites the blocks it hands out), else a new one; either way
    /// it goes back to `recycler` when dropped.
    fn recycled(recycler: &Arc<Recycler>, len: usize) -> AlignedBuf {
        let need = len + BLOCK as usize;
        let raw = recycler.take(need).unwrap_or_else(|| vec![0u8; need]);
        let start = raw.as_ptr().align_offset(BLOCK as usize);
        AlignedBuf { raw, start, len, home: Some(recycler.clone()) }
    }

    /// `len` bytes from `at` (a multiple of the file's grain, so the slice is as aligned).
    fn block_mut(&mut self, at: usize, len: usize) -> &mut [u8] {
        debug_assert!(at.is_multiple_of(MIN_GRAIN as usize) && at + len <= self.len);
        &mut self.raw[self.start + at..self.start + at + len]
    }

    /// Bytes this buffer holds (its allocation, alignment slack included).
    pub fn allocated(&self) -> usize {
        self.raw.len()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.give(std::mem::take(&mut self.raw));
        }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("xwen-direct-{}-{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_unaligned_ranges_exactly() {
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let p = temp_file("ranges", &data);
        // direct where the filesystem allows it, and the buffered fallback everywhere
        for f in [DirectFile::open(&p).unwrap(), DirectFile::open_buffered(&p).unwrap()] {
            let ranges = [3..4100u64, 12_288..12_289, 40_001..50_000, 0..0];
            let (buf, places) = f.read_ranges(&ranges).unwrap();
            for (r, pl) in ranges.iter().zip(&places) {
                assert_eq!(&buf[pl.clone()], &data[r.start as usize..r.end as usize], "direct {}", f.is_direct());
            }
        }
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_range_past_the_end_is_an_error() {
        for buffered in [false, true] {
            let p = temp_file(&format!("eof{buffered}"), &[1u8; 5000]);
            let f = if buffered { DirectFile::open_buffered(&p) } else { DirectFile::open(&p) }.unwrap();
            let e = f.read_ranges(&[4000..6000, 0..1]).err().expect("past EOF");
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
            // truncated after open: the length checked at open still allows it; the read must fail
            std::fs::write(&p, [1u8; 100]).unwrap();
            assert!(f.read_ranges(&[0..1, 0..4000]).is_err());
            std::fs::remove_file(&p).unwrap();
        }
    }

    #[test]
    fn recycled_buffers_are_reused_and_read_exactly() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 13 + i / 97) as u8).collect();
        let p = temp_file("recycle", &data);
        let mut f = DirectFile::open(&p).unwrap();
        f.recycle(2);
        let ranges = [5..30_000u64, 33_000..33_001];
        let (a, _) = f.read_ranges(&ranges).unwrap();
        let first = a.as_ptr();
        drop(a);
        assert_eq!(f.recycler().unwrap().kept(), 1);
        // the same size again takes the kept buffer, its stale bytes overwritten by the read
        let (b, places) = f.read_ranges(&ranges).unwrap();
        assert_eq!(b.as_ptr(), first);
        assert_eq!(b.as_ptr() as usize % BLOCK as usize, 0);
        for (r, pl) in ranges.iter().zip(&places) {
            assert_eq!(&b[pl.clone()], &data[r.start as usize..r.end as usize]);
        }
        // a much smaller read does not take a large kept buffer
        drop(b);
        let (c, pc) = f.read_ranges(std::slice::from_ref(&(0..10))).unwrap();
        assert_ne!(c.as_ptr(), first);
        assert_eq!(&c[pc[0].clone()], &data[..10]);
        assert_eq!(c.allocated(), 2 * BLOCK as usize);
        // at most `max` are kept
        let bufs: Vec<AlignedBuf> = (0..4).map(|_| f.read_ranges(&ranges).unwrap().0).collect();
        drop((bufs, c));
        assert_eq!(f.recycler().unwrap().kept(), 2);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn reads_at_the_finest_grain_give_the_exact_bytes() {
        let dir = std::env::temp_dir().join(format!("xwen-grain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let mut f = DirectFile::open_buffered(&path).unwrap();
        f.grain = MIN_GRAIN;
        let ranges = [3..700, 511..513, 4095..4097, 19_000..20_000, 0..0];
        let (buf, places) = f.read_ranges(&ranges).unwrap();
        for (r, p) in ranges.iter().zip(&places) {
            assert_eq!(&buf[p.clone()], &data[r.start as usize..r.end as usize], "{r:?}");
        }
        // 512-byte spans, not 4 KiB ones: 1024 + 1024 + 1024 + 1536 (+ nothing) bytes, where
        // the 4 KiB grain reads 4096 + 4096 + 8192 + 4096
        assert_eq!(buf.len(), 4608, "the spans at the 512 B grain");
        // and the grain the device gives, where O_DIRECT works here, is one of the sane ones
        let mut d = DirectFile::open(&path).unwrap();
        assert_eq!(d.grain(), BLOCK, "whole blocks unless asked");
        d.use_device_grain();
        assert!(d.grain().is_power_of_two() && (MIN_GRAIN..=BLOCK).contains(&d.grain()), "{}", d.grain());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn buffers_are_block_aligned() {
        for len in [0, 1, 4096, 10_000] {
            let b = AlignedBuf::new(len);
            assert_eq!(b.as_ptr() as usize % BLOCK as usize, 0);
            assert_eq!(b.len(), len);
        }
    }
}
