//! Times the DeltaNet decode step over a model's worth of head states (default: the 35B-A3B's
//! 30 layers × 32 heads of 128×128 f32, 63 MB), single-threaded and on a pool, against the
//! state's bytes: is the recurrence bound by memory or by its arithmetic?
//! usage: cargo run --release -p xwen-kernels --example delta_probe [-- HEADS [THREADS]]

use std::time::Instant;

fn main() {
    if std::env::var("PER_LAYER").is_ok() {
        per_layer(30, 2, 64);
        per_layer(30, 1, 64);
        per_layer(30, 2, 0);
        return;
    }
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let heads = args.first().copied().unwrap_or(30 * 32);
    let threads = args.get(1).copied().unwrap_or(2);
    let sd = 128;
    let mut states: Vec<Vec<f32>> = (0..heads).map(|h| (0..sd * sd).map(|i| ((i + h) % 97) as f32 * 1e-3).collect()).collect();
    let k: Vec<f32> = (0..sd).map(|i| (i as f32 * 0.01).sin()).collect();
    let q: Vec<f32> = (0..sd).map(|i| (i as f32 * 0.02).cos()).collect();
    let v: Vec<f32> = (0..sd).map(|i| (i as f32 * 0.03).sin()).collect();
    let bytes = (heads * sd * sd * 4) as f64;
    let mut out = vec![0f32; sd];
    for pass in 0..3 {
        let t0 = Instant::now();
        for s in states.iter_mut() {
            xwen_kernels::f32ops::delta_rule_step(s, &k, &q, &v, 0.99, 0.5, 0.088, &mut out);
        }
        let dt = t0.elapsed().as_secs_f64();
        println!("pass {pass}: 1 thread {:.2} ms, {:.1} GB/s of state read+written", dt * 1e3, 2.0 * bytes / dt / 1e9);
    }
    let pool = xwen_kernels::Pool::new(threads);
    let ptrs: Vec<usize> = states.iter_mut().map(|s| s.as_mut_ptr() as usize).collect();
    for pass in 0..3 {
        let t0 = Instant::now();
        pool.run(heads, &|h| {
            // SAFETY: task h owns state h alone.
            let s = unsafe { std::slice::from_raw_parts_mut(ptrs[h] as *mut f32, sd * sd) };
            let mut o = vec![0f32; sd];
            xwen_kernels::f32ops::delta_rule_step(s, &k, &q, &v, 0.99, 0.5, 0.088, &mut o);
        });
        let dt = t0.elapsed().as_secs_f64();
        println!("pass {pass}: {threads} threads {:.2} ms, {:.1} GB/s", dt * 1e3, 2.0 * bytes / dt / 1e9);
    }
}

/// The model's shape: one job per layer (32 heads of one 2 MB state), with `flush_mb` of other
/// memory streamed between layers, as decode's weight products do.
#[allow(dead_code)]
pub fn per_layer(layers: usize, threads: usize, flush_mb: usize) {
    let (sd, hv) = (128, 32);
    let mut states: Vec<Vec<f32>> = (0..layers).map(|l| (0..hv * sd * sd).map(|i| ((i + l) % 97) as f32 * 1e-3).collect()).collect();
    let flush: Vec<u8> = vec![1u8; flush_mb << 20];
    let k: Vec<f32> = (0..sd).map(|i| (i as f32 * 0.01).sin()).collect();
    let pool = xwen_kernels::Pool::new(threads);
    for pass in 0..3 {
        let mut in_scan = 0.0;
        let mut sink = 0u64;
        for st in states.iter_mut() {
            sink += flush.iter().step_by(64).map(|&b| b as u64).sum::<u64>();
            let p = st.as_mut_ptr() as usize;
            let t0 = Instant::now();
            pool.run(hv, &|h| {
                // SAFETY: task h owns head h's rows alone.
                let s = unsafe { std::slice::from_raw_parts_mut((p as *mut f32).add(h * sd * sd), sd * sd) };
                let mut o = vec![0f32; sd];
                xwen_kernels::f32ops::delta_rule_step(s, &k, &k, &k, 0.99, 0.5, 0.088, &mut o);
            });
            in_scan += t0.elapsed().as_secs_f64();
        }
        std::hint::black_box(sink);
        println!("per-layer pass {pass}: {threads} threads, {layers} layers, {flush_mb} MB between: scan {:.2} ms", in_scan * 1e3);
    }
}
