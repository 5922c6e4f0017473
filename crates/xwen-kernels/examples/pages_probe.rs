//! What the page size of a mapping costs a plain read loop (the floor's denominator):
//!
//!   cargo run -p xwen-kernels --release --example pages_probe [-- FILE]
//!
//! Reads 1 GiB of anonymous memory in 4 KiB pages, 1 GiB asked for 2 MiB pages and, given a
//! FILE (at least 1 GiB, e.g. a GGUF), its first GiB through a mapping that asks for 2 MiB
//! pages — the page cache maps 2 MiB folios with 2 MiB entries. The three alternate pass by
//! pass with the same two threads; prints each one's median and best GB/s and how much of
//! each is mapped in 2 MiB pages (/proc/self/smaps_rollup).

use memmap2::{Advice, Mmap, MmapMut};
use xwen_kernels::{membw, Pool};

const LEN: usize = 1 << 30;

fn anon(huge: bool) -> MmapMut {
    let mut m = MmapMut::map_anon(LEN).expect("anonymous mapping");
    let _ = m.advise(if huge { Advice::HugePage } else { Advice::NoHugePage });
    m.fill(1);
    m
}

fn main() {
    let file = std::env::args().nth(1).map(|p| {
        let f = std::fs::File::open(&p).expect("open FILE");
        // SAFETY: read-only mapping of a file nobody rewrites during the probe.
        let m = unsafe { Mmap::map(&f) }.expect("map FILE");
        assert!(m.len() >= LEN, "FILE must hold at least 1 GiB");
        let _ = m.advise(Advice::HugePage);
        let _ = m.advise(Advice::PopulateRead);
        m
    });
    let (small, huge) = (anon(false), anon(true));
    let smaps = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    for l in smaps.lines().filter(|l| l.starts_with("AnonHugePages") || l.starts_with("FilePmdMapped")) {
        println!("{l}");
    }
    let pool = Pool::new(2);
    let mut bufs: Vec<(&str, &[u8], Vec<f64>)> = vec![("anon, 4 KiB pages", &small, vec![]), ("anon, 2 MiB pages", &huge, vec![])];
    if let Some(m) = &file {
        bufs.push(("file mapping", &m[..LEN], vec![]));
    }
    for _ in 0..8 {
        for (_, b, v) in bufs.iter_mut() {
            v.push(membw::read_bandwidth(&pool, b, 1)[0]);
        }
    }
    for (name, _, v) in bufs.iter_mut() {
        v.sort_by(f64::total_cmp);
        println!("{name}: median {:.2} GB/s, best {:.2}", v[v.len() / 2], v[v.len() - 1]);
    }
}
