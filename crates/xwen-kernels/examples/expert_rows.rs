//! A routed expert's products on the CPU, as the VRAM expert cache's CPU path computes a missed
//! expert (`xwen-cuda` `experts/cpu.rs`): gate and up (ff × hidden), SwiGLU, down (hidden × ff),
//! Q4_K, 64-row tasks on the pool — each row by `vec_dot` alone against the runs of rows of
//! `dot_rows` (the CPU backend's row loop, rows ahead requested from memory; the same bits).
//! Enough experts (the 35B-A3B's shape by default) that they come from memory, not the cache.
//!
//!   cargo run -p xwen-kernels --release --example expert_rows [-- THREADS [EXPERTS]]
use std::time::Instant;
use xwen_kernels::{dispatch, GgmlType, Pool, QMatrix};

fn lcg(s: &mut u64) -> u64 { *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); *s >> 33 }

/// A Q4_K matrix of rows × cols: fixed small scales, random quants.
fn q4k(rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let nb = rows * cols / 256;
    let mut v = vec![0u8; nb * 144];
    for b in v.chunks_exact_mut(144) {
        b[0..2].copy_from_slice(&0x2000u16.to_le_bytes()); // d
        b[2..4].copy_from_slice(&0x1800u16.to_le_bytes()); // dmin
        for x in &mut b[4..] { *x = lcg(seed) as u8; }
    }
    v
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let threads = args.first().copied().unwrap_or(2);
    let n_exp = args.get(1).copied().unwrap_or(200);
    let (h, ff) = (2048usize, 512usize);
    let mut seed = 1u64;
    let experts: Vec<[Vec<u8>; 3]> = (0..n_exp).map(|_| [q4k(ff, h, &mut seed), q4k(ff, h, &mut seed), q4k(h, ff, &mut seed)]).collect();
    let x: Vec<f32> = (0..h).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
    let pool = Pool::new(threads);
    let ty = GgmlType::Q4_K;
    let mut xq = Vec::new();
    xwen_kernels::quantize_activations(ty, &x, &mut xq);
    let dot = dispatch::dot_fn(ty).unwrap();
    let k = dispatch::RowKernel { dot, prefetches: false, multi: None, multi_rows: 4, q8_prepared: false };
    for variant in ["vec_dot rows", "dot_rows 64", "vec_dot rows", "dot_rows 64"] {
        let t0 = Instant::now();
        let mut sink = 0f32;
        for e in &experts {
            let mut mid = vec![0f32; ff];
            let out = std::sync::Mutex::new(vec![0f32; 2 * ff]);
            let chunks = ff / 64;
            pool.run(2 * chunks, &|t| {
                let (m, c) = (t / chunks, t % chunks);
                let mut y = vec![0f32; 64];
                run(&QMatrix { ty, rows: ff, cols: h, data: &e[m] }, k, &xq, c * 64, &mut y, variant);
                out.lock().unwrap()[m * ff + c * 64..m * ff + c * 64 + 64].copy_from_slice(&y);
            });
            let o = out.into_inner().unwrap();
            for i in 0..ff {
                let g = o[i];
                mid[i] = g / (1.0 + (-g).exp()) * o[ff + i];
            }
            let mut mq = Vec::new();
            xwen_kernels::quantize_activations(ty, &mid, &mut mq);
            let down = std::sync::Mutex::new(vec![0f32; h]);
            let dch = h / 64;
            pool.run(dch, &|c| {
                let mut y = vec![0f32; 64];
                run(&QMatrix { ty, rows: h, cols: ff, data: &e[2] }, k, &mq, c * 64, &mut y, variant);
                down.lock().unwrap()[c * 64..c * 64 + 64].copy_from_slice(&y);
            });
            sink += down.into_inner().unwrap()[0];
        }
        let dt = t0.elapsed().as_secs_f64();
        let bytes = n_exp as f64 * (3 * ff * h / 256 * 144) as f64;
        println!("{variant}: {:.1} us an expert, {:.1} GB/s ({sink:.1})", dt * 1e6 / n_exp as f64, bytes / dt / 1e9);
    }
}

/// Rows `r0..r0 + y.len()` of `w` times `act` into `y`: a `vec_dot` a row, or one `dot_rows` run.
fn run(w: &QMatrix, k: dispatch::RowKernel, act: &[u8], r0: usize, y: &mut [f32], variant: &str) {
    if variant.starts_with("vec_dot") {
        let rb = w.row_bytes();
        for (i, yi) in y.iter_mut().enumerate() {
            let r = r0 + i;
            *yi = xwen_kernels::vec_dot(w.ty, w.cols, &w.data[r * rb..(r + 1) * rb], act);
        }
    } else {
        xwen_kernels::dot_rows(w, k, act, r0, y);
    }
}
