//! Batched product throughput (prefill's matmuls): GMAC/s of `Pool::matmul` per weight type.
//!
//!   cargo run -p xwen-kernels --release --example matmul_bench -- [--shape 9216x2560]
//!       [--tokens 128] [--threads 1] [--types q8_0,q4_k,q6_k] [--reps 15] [--decode]
//!
//! With `--decode` (tokens default 8): several sequences' decode rows sharing one weight pass
//! (`Pool::matvec_tokens_q`, the token-lane kernels), each matrix timed hot (the same copy
//! back to back, in cache) and cold (cycling through copies past the L3, as a decode step
//! streams every matrix from DRAM): hot shows the kernel's arithmetic, cold what a step gets.
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

use xwen_kernels::{quantize, quantize_activations, GgmlType, Pool, QMatrix};

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
    let decode = args.iter().any(|a| a == "--decode");
    let n_tok: usize = arg(&args, "--tokens").map_or(if decode { 8 } else { 128 }, |s| s.parse().unwrap());
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
        if decode {
            decode_rows(&pool, ty, rows, cols, &data, &x, n_tok, reps);
            continue;
        }
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

/// `--decode`: n_tok single-token rows through `matvec_tokens_q`, hot and cold (module docs).
#[allow(clippy::too_many_arguments)]
fn decode_rows(pool: &Pool, ty: GgmlType, rows: usize, cols: usize, data: &[u8], x: &[f32], n_tok: usize, reps: usize) {
    let mut xq = Vec::new();
    let mut row = Vec::new();
    for t in 0..n_tok {
        quantize_activations(ty, &x[t * cols..(t + 1) * cols], &mut row);
        xq.extend_from_slice(&row);
    }
    // copies past the 32 MB L3 (at least 96 MB)
    let copies = (96usize << 20).div_ceil(data.len()).max(2);
    let big: Vec<u8> = (0..copies).flat_map(|_| data.iter().copied()).collect();
    let mat = |c: usize| QMatrix::new(ty, rows, cols, &big[c * data.len()..(c + 1) * data.len()]).unwrap();
    let mut y = vec![0f32; n_tok * rows];
    let (mut hot, mut cold) = (f64::MAX, f64::MAX);
    for _ in 0..reps {
        // the same copy back to back: in cache from the second call on
        for _ in 0..4 {
            let t = Instant::now();
            pool.matvec_tokens_q(mat(0), &xq, n_tok, &mut y);
            hot = hot.min(t.elapsed().as_secs_f64());
        }
        for c in 1..copies {
            let t = Instant::now();
            pool.matvec_tokens_q(mat(c), &xq, n_tok, &mut y);
            cold = cold.min(t.elapsed().as_secs_f64());
        }
    }
    let macs = (rows * cols * n_tok) as f64;
    println!(
        "{ty:?} {rows}x{cols} x {n_tok} decode rows, {} thr: hot {:.3} ms {:.1} GMAC/s | cold {:.3} ms {:.1} GMAC/s {:.1} GB/s",
        pool.n_threads(),
        hot * 1e3,
        macs / hot / 1e9,
        cold * 1e3,
        macs / cold / 1e9,
        data.len() as f64 / 1e9 / cold
    );
}

