//! Probe: one routed expert's Q4_K product (512x2048, G token groups of 8) through the lane
//! kernel (`simd::avx2_tok8::rows4`): codes decoded per group vs a quad decoded once
//! (`WideQuad`), with the matrix in cache; then cold (cycling through 96 copies, past L3, as
//! prefill reads each expert once per layer) without and with the next-quad prefetch.
//! Interleaved, best of N.
//!
//!   cargo run -p xwen-kernels --release --example lane_probe    # LANE_GROUPS=16,64 for others
use std::time::Instant;
use xwen_kernels::simd::avx2_tok8::{rows4, Act8, WideQuad, ROWS, TOK};
use xwen_kernels::{quantize, quantize_activations, GgmlType};

fn main() {
    let (rows, cols) = (512usize, 2048usize);
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f32 / (1u64 << 53) as f32 - 0.5
    };
    let wf: Vec<f32> = (0..rows * cols).map(|_| rnd() * 0.1).collect();
    let w1 = quantize(GgmlType::Q4_K, &wf).unwrap();
    let rb = w1.len() / rows;
    // 96 copies (57 MB, past the 32 MB L3): "cold" walks them in turn, as prefill walks experts
    let copies = 96;
    let big: Vec<u8> = (0..copies).flat_map(|_| w1.iter().copied()).collect();
    let w = &big[..w1.len()];
    let nb = cols / 256;
    let list: Vec<usize> = std::env::var("LANE_GROUPS").map(|s| s.split(',').map(|x| x.parse().unwrap()).collect()).unwrap_or(vec![1, 2, 3]);
    for groups in list {
        let n = groups * TOK;
        let mut xq = Vec::new();
        let mut row = Vec::new();
        for _ in 0..n {
            let x: Vec<f32> = (0..cols).map(|_| rnd()).collect();
            quantize_activations(GgmlType::Q4_K, &x, &mut row);
            xq.extend_from_slice(&row);
        }
        let arb = row.len();
        let mut act = Act8::default();
        act.build(&xq, arb, nb, groups, n);
        let mut out = [[0f32; TOK]; ROWS];
        let mut wq = WideQuad::default();
        let mut sink = 0f32;
        let (mut best_a, mut best_b) = (f64::MAX, f64::MAX);
        let iters = (200 / groups).max(4);
        for _ in 0..7 {
            let t = Instant::now();
            for _ in 0..iters {
                for q in 0..rows / ROWS {
                    let wr = &w[q * ROWS * rb..(q + 1) * ROWS * rb];
                    for g in 0..groups {
                        unsafe { rows4::<false, false>(wr, rb, &wq, &[], &act, g, &mut out) };
                        sink += out[0][0];
                    }
                }
            }
            best_a = best_a.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            for _ in 0..iters {
                for q in 0..rows / ROWS {
                    let wr = &w[q * ROWS * rb..(q + 1) * ROWS * rb];
                    unsafe { wq.fill(wr, rb, nb) };
                    for g in 0..groups {
                        unsafe { rows4::<false, true>(wr, rb, &wq, &[], &act, g, &mut out) };
                        sink += out[0][0];
                    }
                }
            }
            best_b = best_b.min(t.elapsed().as_secs_f64());
        }
        // cold weights, with or without the next quad prefetched during the first group
        let mut cold = |prefetch: bool| {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t = Instant::now();
                for it in 0..iters {
                    let wm = &big[(it % copies) * w1.len()..(it % copies + 1) * w1.len()];
                    for q in 0..rows / ROWS {
                        let wr = &wm[q * ROWS * rb..(q + 1) * ROWS * rb];
                        let last = q + 1 == rows / ROWS;
                        let next = if prefetch && !last { &wm[(q + 1) * ROWS * rb..(q + 2) * ROWS * rb] } else { &[][..] };
                        for g in 0..groups {
                            let next = if g == 0 { next } else { &[][..] };
                            unsafe { rows4::<false, false>(wr, rb, &wq, next, &act, g, &mut out) };
                            sink += out[0][0];
                        }
                    }
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            best
        };
        let (best_c, best_d) = (cold(false), cold(true));
        let macs = (rows * cols * n * iters) as f64;
        println!("groups {groups}: cold weights, per-group decode {:.1} GMAC/s, with next-quad prefetch {:.1}", macs / best_c / 1e9, macs / best_d / 1e9);
        println!("groups {groups}: per-group decode {:.1} GMAC/s, quad decoded once {:.1} GMAC/s ({sink:.0})", macs / best_a / 1e9, macs / best_b / 1e9);
    }
}
