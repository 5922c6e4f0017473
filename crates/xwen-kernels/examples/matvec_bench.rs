//! Kernel benchmarks: pool dispatch overhead, memory read bandwidth, matvec weight throughput.
//!
//!   cargo run -p xwen-kernels --release --example matvec_bench [-- --quick] [--only-matvec]
//!       [--shape ROWSxCOLS ...] [--matmul N_TOKENS] [--in-cache] [--threads 1,2]
//!       [--isa avx2|scalar]
//!
//! Shapes are rows × cols of the weight matrix (rows = outputs, cols = inputs). Defaults:
//! 2048x2048, 5120x17408 (the 27B FFN down projection) and 4096x14336 (the shape of
//! llama.cpp's `test-backend-ops perf -o MUL_MAT`, for a side-by-side run). Throughput is
//! weight bytes read per second.

use std::hint::black_box;
use std::time::{Duration, Instant};

use xwen_kernels::{dispatch, membw, GgmlType, Pool, QMatrix};

fn rng_bytes(n: usize, seed: &mut u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed as u8
        })
        .collect()
}

/// Random blocks with finite f16 scales (values do not affect speed, NaNs could).
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    if ty == GgmlType::F32 {
        // random bits would include NaNs and subnormals (slow paths); small finite values instead
        return rng_bytes(rows * cols, seed).iter().flat_map(|&b| (b as f32 / 1e4).to_le_bytes()).collect();
    }
    let ts = ty.type_size();
    let mut b = rng_bytes(rows * cols / ty.block_size() * ts, seed);
    let fields: &[usize] = match ty {
        GgmlType::Q8_0 => &[0],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    let h = xwen_kernels::half::f32_to_f16(0.01).to_le_bytes();
    for blk in b.chunks_exact_mut(ts) {
        for &f in fields {
            blk[f..f + 2].copy_from_slice(&h);
        }
    }
    b
}

/// Runs `f` until `min` has elapsed (after one warm-up call); returns seconds per call.
fn time_it(min: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < min {
        f();
        n += 1;
    }
    start.elapsed().as_secs_f64() / n as f64
}

/// Mean read bandwidth over at least `min`, one `membw` pass (the library's read loop) at a
/// time.
fn bandwidth(pool: &Pool, buf: &[u8], min: Duration) -> f64 {
    let t = time_it(min, || {
        black_box(membw::read_bandwidth(pool, buf, 1));
    });
    // membw reads whole 128-byte steps of each thread's share
    (buf.len() / pool.n_threads() / 128 * 128 * pool.n_threads()) as f64 / t / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only_matvec = args.iter().any(|a| a == "--only-matvec");
    let mut shapes: Vec<(usize, usize)> = args
        .windows(2)
        .filter(|w| w[0] == "--shape")
        .map(|w| {
            let (r, c) = w[1].split_once('x').expect("--shape ROWSxCOLS");
            (r.parse().unwrap(), c.parse().unwrap())
        })
        .collect();
    if shapes.is_empty() {
        shapes = vec![(2048, 2048), (5120, 17408), (4096, 14336)];
    }
    let threads: Vec<usize> = args
        .windows(2)
        .find(|w| w[0] == "--threads")
        .map(|w| w[1].split(',').map(|t| t.parse().unwrap()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    match args
        .windows(2)
        .find(|w| w[0] == "--isa")
        .map(|w| w[1].as_str())
    {
        Some("avx2") => dispatch::set_max_isa(Some(dispatch::Isa::Avx2)),
        Some("scalar") => dispatch::set_max_isa(Some(dispatch::Isa::Scalar)),
        Some(other) => panic!("--isa avx2|scalar, got {other}"),
        None => {}
    }
    let min = Duration::from_millis(if quick { 200 } else { 1500 });
    println!("kernel set: {:?}", dispatch::active());
    if args.iter().any(|a| a == "--in-cache") {
        in_cache();
        return;
    }
    if !only_matvec {
        pool_and_memory(quick, min, &threads);
    }
    matvecs(&shapes, min, &threads);
    if let Some(n_tok) = args
        .windows(2)
        .find(|w| w[0] == "--matmul")
        .map(|w| w[1].parse::<usize>().unwrap())
    {
        matmuls(&shapes, n_tok, min, &threads);
    }
}

/// Batched products (prefill): n_tok tokens against each shape.
fn matmuls(shapes: &[(usize, usize)], n_tok: usize, min: Duration, thread_counts: &[usize]) {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for &(rows, cols) in shapes {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
            let data = weights(ty, rows, cols, &mut seed);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            let x: Vec<f32> = (0..n_tok * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut y = vec![0f32; n_tok * rows];
            for &threads in thread_counts {
                let pool = Pool::new(threads);
                let t = time_it(min, || pool.matmul(w, &x, n_tok, &mut y));
                println!(
                    "matmul {ty:>4} {rows}x{cols} x {n_tok} tokens {threads} thread(s): {:9.1} us  {:6.1} GFLOP/s",
                    t * 1e6,
                    2.0 * (rows * cols * n_tok) as f64 / t / 1e9
                );
            }
        }
    }
}

fn pool_and_memory(quick: bool, min: Duration, threads: &[usize]) {
    for threads in [1, 2] {
        let pool = Pool::new(threads);
        let iters = 200_000;
        let start = Instant::now();
        for _ in 0..iters {
            pool.run(threads, &|i| {
                black_box(i);
            });
        }
        let ns = start.elapsed().as_nanos() as f64 / iters as f64;
        println!("empty run(): {threads} thread(s), {ns:.0} ns per call (back to back)");
    }
    {
        // After an idle gap long enough for the worker to park.
        let pool = Pool::new(2);
        let mut total = 0.0;
        let reps = 50;
        for _ in 0..reps {
            std::thread::sleep(Duration::from_millis(5));
            let start = Instant::now();
            pool.run(2, &|i| {
                black_box(i);
            });
            total += start.elapsed().as_nanos() as f64;
        }
        println!(
            "empty run(): 2 threads after a 5 ms idle gap, {:.0} ns per call",
            total / reps as f64
        );
    }

    let gib = if quick { 1 << 27 } else { 1 << 30 };
    let buf = membw::buffer(gib);
    for &threads in threads {
        let pool = Pool::new(threads);
        println!(
            "memory read bandwidth: {threads} thread(s), {:.1} GB/s over {} MiB",
            bandwidth(&pool, &buf, min),
            gib >> 20
        );
    }
}

fn matvecs(shapes: &[(usize, usize)], min: Duration, thread_counts: &[usize]) {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for &(rows, cols) in shapes {
        // F32: the MoE routers (ffn_gate_inp) in decode
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32] {
            let data = weights(ty, rows, cols, &mut seed);
            let w = QMatrix::new(ty, rows, cols, &data).unwrap();
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut y = vec![0f32; rows];
            for &threads in thread_counts {
                let pool = Pool::new(threads);
                let t = time_it(min, || pool.matvec(w, &x, &mut y));
                println!(
                    "matvec {ty:>4} {rows}x{cols} {threads} thread(s): {:8.1} us  {:6.2} GB/s weights",
                    t * 1e6,
                    data.len() as f64 / t / 1e9
                );
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn thread_cpu_seconds() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: plain libc call writing into a valid struct.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

/// Kernel compute cost on an L2-resident 64×4096 block in thread CPU time (robust to a shared
/// machine's load); the counterpart of tools/kernels/ggml_dot_bench.c.
#[cfg(target_os = "linux")]
fn in_cache() {
    let (rows, cols) = (64usize, 4096usize);
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q5_K,
        GgmlType::F32,
        GgmlType::BF16,
    ] {
        let w = xwen_kernels::quantize(ty, &x).unwrap();
        let rb = w.len() / rows;
        let mut a = Vec::new();
        xwen_kernels::quantize_activations(ty, &x[..cols], &mut a);
        let dot = dispatch::dot_fn(ty).unwrap();
        let mut sink = 0f32;
        let (t0, mut reps) = (thread_cpu_seconds(), 0u64);
        let mut t1;
        loop {
            for r in 0..rows {
                sink += dot(cols, &w[r * rb..(r + 1) * rb], &a);
            }
            reps += 1;
            t1 = thread_cpu_seconds();
            if t1 - t0 > 1.5 {
                break;
            }
        }
        black_box(sink);
        let per_row = (t1 - t0) / (reps * rows as u64) as f64;
        println!(
            "xwen dot {ty:>4} in-cache {rows}x{cols}: {:7.1} ns/row  {:6.2} GB/s of weights (thread CPU time)",
            per_row * 1e9,
            rb as f64 / per_row / 1e9
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn in_cache() {
    println!("--in-cache needs Linux (thread CPU clock)");
}
