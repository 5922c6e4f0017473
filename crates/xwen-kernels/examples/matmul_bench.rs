//! Batched product throughput (prefill's matmuls): GMAC/s of `Pool::matmul` per weight type.
//!
//!   cargo run -p xwen-kernels --release --example matmul_bench -- [--shape 9216x2560]
//!       [--tokens 128] [--threads 1] [--types q8_0,q4_k,q6_k] [--reps 15]
//!
//! Activations are quantized inside every timed call, as in prefill. Best of --reps (15) calls after a
//! warm-up (the weights of the default shape stay in L3 only partly; prefill is compute-bound
//! either way: every weight byte is used n_tok times).
use std::time::Instant;

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}
extern "C" {
    fn clock_gettime(clk: i32, ts: *mut Timespec) -> i32;
}
/// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID): with one pool thread (the caller)
/// it does not count the time a neighbour on this shared machine takes the core away.
fn thread_cpu() -> f64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid out-pointer; clock 3 is CLOCK_THREAD_CPUTIME_ID on Linux.
    unsafe { clock_gettime(3, &mut ts) };
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

use xwen_kernels::{quantize, GgmlType, Pool, QMatrix};

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].as_str())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (rows, cols) = arg(&args, "--shape")
        .map(|s| {
            let (r, c) = s.split_once('x').expect("--shape ROWSxCOLS");
            (r.parse().unwrap(), c.parse().unwrap())
        })
        .unwrap_or((9216, 2560));
    let n_tok: usize = arg(&args, "--tokens").map_or(128, |s| s.parse().unwrap());
    let threads: usize = arg(&args, "--threads").map_or(1, |s| s.parse().unwrap());
    let reps: usize = arg(&args, "--reps").map_or(15, |s| s.parse().unwrap());
    let types: Vec<GgmlType> = arg(&args, "--types")
        .unwrap_or("q8_0,q4_k,q6_k")
        .split(',')
        .map(|t| match t {
            "q8_0" => GgmlType::Q8_0,
            "q4_k" => GgmlType::Q4_K,
            "q6_k" => GgmlType::Q6_K,
            "q5_k" => GgmlType::Q5_K,
            "bf16" => GgmlType::BF16,
            "f32" => GgmlType::F32,
            other => panic!("unknown type {other}"),
        })
        .collect();
    let pool = Pool::new(threads);
    let mut seed = 0x1234_5678_u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f32 / (1u64 << 53) as f32 - 0.5
    };
    let x: Vec<f32> = (0..n_tok * cols).map(|_| rnd()).collect();
    let wf: Vec<f32> = (0..rows * cols).map(|_| rnd() * 0.1).collect();
    let macs = (rows * cols * n_tok) as f64;
    for ty in types {
        let data = quantize(ty, &wf).unwrap();
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let mut y = vec![0f32; n_tok * rows];
        pool.matmul(w, &x, n_tok, &mut y);
        let (mut best, mut best_cpu) = (f64::MAX, f64::MAX);
        for _ in 0..reps {
            let (t, c) = (Instant::now(), thread_cpu());
            pool.matmul(w, &x, n_tok, &mut y);
            best = best.min(t.elapsed().as_secs_f64());
            best_cpu = best_cpu.min(thread_cpu() - c);
        }
        println!(
            "{ty:?} {rows}x{cols} x {n_tok} tok, {threads} thr: {:.1} ms, {:.1} GMAC/s (calling thread's CPU time: {:.1} ms, {:.1} GMAC/s)",
            best * 1e3,
            macs / best / 1e9,
            best_cpu * 1e3,
            macs / best_cpu / 1e9
        );
    }
}
