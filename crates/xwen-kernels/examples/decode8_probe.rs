//! Probe: several sequences' decode rows sharing one weight pass (`Pool::matvec_tokens_q`, the
//! token-lane kernels) per weight type, with the matrix hot in cache (the same copy every call)
//! and cold (cycling through copies past the L3, as a decode step streams every matrix from
//! DRAM). Hot shows the kernel's arithmetic; cold what the step gets. Best of --reps.
//!
//!   cargo run -p xwen-kernels --release --example decode8_probe -- [--shape 9216x2560]
//!       [--tokens 8] [--threads 1] [--types q8_0,q4_k,q6_k] [--reps 9]
use std::time::Instant;
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
    let n_tok: usize = arg(&args, "--tokens").map_or(8, |s| s.parse().unwrap());
    let threads: usize = arg(&args, "--threads").map_or(1, |s| s.parse().unwrap());
    let reps: usize = arg(&args, "--reps").map_or(9, |s| s.parse().unwrap());
    let types: Vec<GgmlType> = arg(&args, "--types")
        .unwrap_or("q8_0,q4_k,q6_k")
        .split(',')
        .map(|t| match t {
            "q8_0" => GgmlType::Q8_0,
            "q4_k" => GgmlType::Q4_K,
            "q6_k" => GgmlType::Q6_K,
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
    let wf: Vec<f32> = (0..rows * cols).map(|_| rnd() * 0.1).collect();
    let x: Vec<f32> = (0..n_tok * cols).map(|_| rnd()).collect();
    let macs = (rows * cols * n_tok) as f64;
    for ty in types {
        let data = quantize(ty, &wf).unwrap();
        let mut xq = Vec::new();
        let mut row = Vec::new();
        for t in 0..n_tok {
            quantize_activations(ty, &x[t * cols..(t + 1) * cols], &mut row);
            xq.extend_from_slice(&row);
        }
        // copies past the 32 MB L3 (at least 96 MB)
        let copies = (96usize << 20).div_ceil(data.len()).max(2);
        let big: Vec<u8> = (0..copies).flat_map(|_| data.iter().copied()).collect();
        let mut y = vec![0f32; n_tok * rows];
        let mat = |c: usize| QMatrix::new(ty, rows, cols, &big[c * data.len()..(c + 1) * data.len()]).unwrap();
        let mut hot = f64::MAX;
        let mut cold = f64::MAX;
        for _ in 0..reps {
            // the same copy back to back: in cache from the second call on
            for _ in 0..4 {
                let t = Instant::now();
                pool.matvec_tokens_q(mat(0), &xq, n_tok, &mut y);
                hot = hot.min(t.elapsed().as_secs_f64());
            }
            let mut tc = f64::MAX;
            for c in 1..copies {
                let t = Instant::now();
                pool.matvec_tokens_q(mat(c), &xq, n_tok, &mut y);
                tc = tc.min(t.elapsed().as_secs_f64());
            }
            cold = cold.min(tc);
        }
        let gb = data.len() as f64 / 1e9;
        println!(
            "{ty:?} {rows}x{cols} x {n_tok} tok, {threads} thr: hot {:.3} ms {:.1} GMAC/s | cold {:.3} ms {:.1} GMAC/s {:.1} GB/s",
            hot * 1e3,
            macs / hot / 1e9,
            cold * 1e3,
            macs / cold / 1e9,
            gb / cold
        );
    }
}
