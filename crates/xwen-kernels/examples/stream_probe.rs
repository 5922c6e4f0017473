//! How close a decode matvec comes to a plain read loop over the same DRAM-resident bytes.
//!
//!   cargo run -p xwen-kernels --release --example stream_probe [-- TYPE ROWS COLS [PASSES]]
//!
//! TYPE is q4_k, q8_0 or q6_k (default q4_k 9216 2560: the 4B's FFN gate). Enough distinct
//! matrices of that shape to fill 512 MB are multiplied one after the other (as decode reads
//! each weight once per token, none of them warm in a cache), then the same bytes are read by
//! `membw::read_bandwidth` with the same two threads; the two alternate pass by pass, so the
//! ratio of the two times shares the machine's mood. Prints each side's median GB/s and the
//! median of the per-pass ratios (matvec / read loop; 1.0 would be a kernel as fast as the
//! memory), and the kernel's rate on a block of the same width held in L2 by one thread, times
//! two (its arithmetic alone on both cores; compare with `examples/pattern_probe`).

use std::time::Instant;
use xwen_kernels::{membw, GgmlType, Pool, QMatrix};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ty = match args.first().map(String::as_str) {
        None | Some("q4_k") => GgmlType::Q4_K,
        Some("q8_0") => GgmlType::Q8_0,
        Some("q6_k") => GgmlType::Q6_K,
        Some(t) => panic!("type {t}: one of q4_k, q8_0, q6_k"),
    };
    let num = |i: usize, d: usize| args.get(i).map_or(d, |s| s.parse().expect("a number"));
    let (rows, cols, passes) = (num(1, 9216), num(2, 2560), num(3, 15));
    assert!(cols % 256 == 0, "cols must be a multiple of 256");

    let bytes = rows * cols / ty.block_size() * ty.type_size();
    let nmat = (512usize << 20).div_ceil(bytes);
    let mut data = membw::buffer(bytes * nmat + 4096);
    let data = &mut data[..bytes * nmat];
    let mut seed = 0x9e3779b97f4a7c15u64;
    for b in data.iter_mut() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        *b = seed as u8;
    }
    // finite f16 scales (random bits could be NaN or subnormal: slow paths)
    let scale_at: &[usize] = match ty {
        GgmlType::Q8_0 => &[0],
        GgmlType::Q6_K => &[208],
        _ => &[0, 2],
    };
    for blk in data.chunks_exact_mut(ty.type_size()) {
        for &f in scale_at {
            blk[f..f + 2].copy_from_slice(&xwen_kernels::half::f32_to_f16(0.01).to_le_bytes());
        }
    }
    let mats: Vec<QMatrix> =
        (0..nmat).map(|m| QMatrix::new(ty, rows, cols, &data[m * bytes..(m + 1) * bytes]).unwrap()).collect();
    let x: Vec<f32> = (0..cols).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
    let mut y = vec![0f32; rows];
    let pool = Pool::new(2);

    let (mut mv, mut rd, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..passes {
        let t = Instant::now();
        for w in &mats {
            pool.matvec(*w, &x, &mut y);
        }
        let m = (bytes * nmat) as f64 / t.elapsed().as_secs_f64() / 1e9;
        let r = membw::read_bandwidth(&pool, data, 1)[0];
        mv.push(m);
        rd.push(r);
        ratio.push(m / r);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // the kernel's own rate: one thread over and over a block of the same width small enough
    // to stay in its L2 (~320 KB), doubled for the two cores (their L2s are private)
    let one = Pool::new(1);
    let l2_rows = ((320usize << 10) / (bytes / rows)).clamp(16, rows) / 16 * 16;
    let hot = QMatrix::new(ty, l2_rows, cols, &data[..l2_rows * (bytes / rows)]).unwrap();
    let mut yh = vec![0f32; l2_rows];
    let mut l2 = Vec::new();
    for _ in 0..passes {
        let t = Instant::now();
        for _ in 0..400 {
            one.matvec(hot, &x, &mut yh);
        }
        l2.push(2.0 * (400 * hot.data.len()) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    println!(
        "{ty:?} {rows}x{cols} ({nmat} matrices, {passes} passes, 2 threads): matvec {:.2} GB/s, read loop {:.2} GB/s, per-pass ratio {:.3}; in L2 ({l2_rows} rows, 1 thread x 2) {:.1} GB/s",
        median(&mut mv),
        median(&mut rd),
        median(&mut ratio),
        median(&mut l2)
    );
}
