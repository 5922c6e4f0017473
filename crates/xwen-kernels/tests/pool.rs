//! The worker pool and the matvec/matmul drivers against a naive per-row loop.

mod common;
use common::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use xwen_kernels::{quantize, quantize_activations, vec_dot, GgmlType, Pool, QMatrix};

#[test]
fn run_executes_every_task_exactly_once() {
    for threads in [1, 2, 3, 5] {
        let pool = Pool::new(threads);
        assert_eq!(pool.n_threads(), threads);
        for n_tasks in [0, 1, 2, 7, 64, 1000] {
            let hits: Vec<AtomicUsize> = (0..n_tasks).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n_tasks, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "threads {threads} tasks {n_tasks}"
            );
        }
    }
}

#[test]
fn run_survives_many_back_to_back_jobs_and_idle_gaps() {
    let pool = Pool::new(2);
    let total = AtomicUsize::new(0);
    for k in 0..20_000 {
        pool.run(3, &|i| {
            total.fetch_add(i + 1, Ordering::Relaxed);
        });
        if k % 5000 == 0 {
            // long enough for the worker to park
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    assert_eq!(total.load(Ordering::Relaxed), 20_000 * 6);
}

#[test]
fn a_panicking_task_is_reported_and_the_pool_still_works() {
    let pool = Pool::new(2);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.run(16, &|i| {
            if i == 11 {
                panic!("boom");
            }
        })
    }));
    assert!(r.is_err());
    let n = AtomicUsize::new(0);
    pool.run(10, &|_| {
        n.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(n.load(Ordering::Relaxed), 10);
}

/// The reference for one token of an n_tok-token product.
fn naive(w: &QMatrix, x: &[f32], n_tok: usize) -> Vec<f32> {
    let mut xq = Vec::new();
    quantize_activations(w.ty, x, &mut xq);
    row_loop(w, &xq, false, n_tok)
}

/// Rows one by one, in llama.cpp's float order for a product of n_tok tokens: a Q4_K matrix it
/// would repack takes its gemv (or, for a token of a 4-token group, gemm) order; a plain
/// K-quant of 8+ tokens the tiled order; an F32 weight against one token ggml_vec_dot_f32's
/// order (tinyBLAS for more, where its rows are a multiple of 4) — as the scalar emulations
/// compute them.
fn row_loop(w: &QMatrix, xq: &[u8], grouped: bool, n_tok: usize) -> Vec<f32> {
    use xwen_kernels::{dispatch, q4k_repack, tiled};
    (0..w.rows)
        .map(|r| {
            if n_tok == 1 {
                dispatch::row_dot_fn(w.ty, w.rows).unwrap()(w.cols, w.row(r), xq)
            } else if n_tok >= tiled::MIN_BATCH && tiled::applies(w.ty, w.rows) {
                tiled::dot_ref(w.ty, w.cols, w.row(r), xq)
            } else if w.ty == GgmlType::Q4_K && q4k_repack::repacked(w.rows) {
                if grouped {
                    q4k_repack::dot_gemm_ref(w.cols, w.row(r), xq)
                } else {
                    q4k_repack::dot_gemv_ref(w.cols, w.row(r), xq)
                }
            } else if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) && !w.rows.is_multiple_of(4) {
                // tinyBLAS refuses a float matrix whose rows are not a multiple of 4: ggml's
                // one-token vec_dot runs for every token
                dispatch::row_dot_fn(w.ty, w.rows).unwrap()(w.cols, w.row(r), xq)
            } else {
                vec_dot(w.ty, w.cols, w.row(r), xq)
            }
        })
        .collect()
}

#[test]
fn matvec_and_matmul_equal_a_naive_row_loop() {
    let mut rng = Rng(0x5eed);
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_K,
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::IQ4_NL,
    ];
    for (k, &ty) in types.iter().enumerate() {
        let threads = 1 + k % 3;
        let pool = Pool::new(threads);
        let rows = [1, 7, 13, 64, 97][k % 5] + rng.below(9);
        let cols = 256 * (1 + rng.below(3));
        let wf: Vec<f32> = (0..rows * cols).map(|_| rng.normalish()).collect();
        let data = quantize(ty, &wf).unwrap();
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let x = rng.activations(cols);
        let mut y = vec![f32::NAN; rows];
        pool.matvec(w, &x, &mut y);
        let want = naive(&w, &x, 1);
        assert_eq!(
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{ty} matvec {rows}x{cols} threads {threads}"
        );

        for n_tok in [1, 2, 3, 6, 13, 20, 40] {
            check_matmul(&pool, &w, &rng.activations(n_tok * cols), n_tok, &format!("{ty} matmul"));
        }
    }
}

/// pool.matmul of `xs` (n_tok rows) equals `expected_token` for every token, bit for bit.
fn check_matmul(pool: &Pool, w: &QMatrix, xs: &[f32], n_tok: usize, what: &str) {
    let rows = w.rows;
    let mut ym = vec![f32::NAN; n_tok * rows];
    pool.matmul(*w, xs, n_tok, &mut ym);
    for t in 0..n_tok {
        assert_eq!(&ym[t * rows..(t + 1) * rows], expected_token(w, xs, n_tok, t).as_slice(), "{what}: token {t} of {n_tok} ({}x{})", w.rows, w.cols);
    }
}

/// Token t of an n_tok-token product by the row loop, in the order llama.cpp gives that token.
fn expected_token(w: &QMatrix, xs: &[f32], n_tok: usize, t: usize) -> Vec<f32> {
    let cols = w.cols;
    let xt = &xs[t * cols..(t + 1) * cols];
    if w.ty == GgmlType::Q4_K && w.rows.is_multiple_of(8) && t < n_tok - n_tok % 4 && is_x86_feature_detected_avx2() {
        // repacked Q4_K rows of a 4-token group use the 4-row quantizer and the gemm order
        let mut xq = vec![0u8; cols / 256 * 292];
        xwen_kernels::formats::q8::quantize_q8_k_prefer_positive(xt, &mut xq);
        return row_loop(w, &xq, true, n_tok);
    }
    naive(w, xt, n_tok)
}

/// Dense prefill shapes: repacked Q4_K with 4+ token groups (each row quad decoded once for all
/// groups), plain rows and the tail past the last 4-token group, Q8_0 row runs that do not fill
/// the lane product's sub-tiles of 8 rows, on 1 and 2 threads.
#[test]
fn dense_prefill_products_equal_the_row_loop() {
    let mut rng = Rng(0xde75e);
    for &(ty, rows, cols) in &[(GgmlType::Q4_K, 64, 512), (GgmlType::Q4_K, 72, 768), (GgmlType::Q8_0, 40, 512), (GgmlType::Q8_0, 43, 768)] {
        let wf: Vec<f32> = (0..rows * cols).map(|_| rng.normalish()).collect();
        let data = quantize(ty, &wf).unwrap();
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        for threads in [1, 2] {
            let pool = Pool::new(threads);
            for n_tok in [32, 45, 70] {
                let what = format!("{ty} {rows}x{cols}, {threads} threads");
                check_matmul(&pool, &w, &rng.activations(n_tok * cols), n_tok, &what);
            }
        }
    }
}

fn is_x86_feature_detected_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[test]
fn matvec_q_reuses_prequantized_activations() {
    let mut rng = Rng(7);
    let pool = Pool::new(2);
    let (rows, cols) = (33, 512);
    let wf: Vec<f32> = (0..rows * cols).map(|_| rng.normalish()).collect();
    let data = quantize(GgmlType::Q4_K, &wf).unwrap();
    let w = QMatrix::new(GgmlType::Q4_K, rows, cols, &data).unwrap();
    let x = rng.activations(cols);
    let mut xq = Vec::new();
    quantize_activations(w.ty, &x, &mut xq);
    let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
    pool.matvec_q(w, &xq, &mut a);
    pool.matvec(w, &x, &mut b);
    assert_eq!(a, b);
}

/// MUL_MAT_ID semantics (every token its own single-token product, row quantizer): the expert
/// path, including the token-lane kernel's padded last group, equals the per-token row loop.
#[test]
fn matmul_q_id_equals_single_token_products() {
    let mut rng = Rng(0x1d);
    for &(ty, rows) in &[(GgmlType::Q4_K, 64), (GgmlType::Q8_0, 48), (GgmlType::Q6_K, 40)] {
        let cols = 512;
        let pool = Pool::new(2);
        let wf: Vec<f32> = (0..rows * cols).map(|_| rng.normalish()).collect();
        let data = quantize(ty, &wf).unwrap();
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        for n_tok in [2, 5, 8, 12, 13, 16, 21] {
            let xs = rng.activations(n_tok * cols);
            let mut xq = Vec::new();
            let mut row = Vec::new();
            for t in 0..n_tok {
                quantize_activations(ty, &xs[t * cols..(t + 1) * cols], &mut row);
                xq.extend_from_slice(&row);
            }
            let mut y = vec![f32::NAN; n_tok * rows];
            pool.matmul_q_id(w, &xq, n_tok, &mut y);
            let arb = xq.len() / n_tok;
            for t in 0..n_tok {
                let want = row_loop(&w, &xq[t * arb..(t + 1) * arb], false, n_tok);
                assert_eq!(&y[t * rows..(t + 1) * rows], want.as_slice(), "{ty} token {t} of {n_tok}");
            }
            // a second matrix sharing the activations (an expert's gate and up): the shared
            // layout gives each matrix what it gets alone
            let w2f: Vec<f32> = (0..rows * cols).map(|_| rng.normalish()).collect();
            let data2 = quantize(ty, &w2f).unwrap();
            let w2 = QMatrix::new(ty, rows, cols, &data2).unwrap();
            let mut y2 = vec![f32::NAN; n_tok * rows];
            pool.matmul_q_id(w2, &xq, n_tok, &mut y2);
            let (mut s1, mut s2) = (vec![f32::NAN; n_tok * rows], vec![f32::NAN; n_tok * rows]);
            pool.matmul_q_id_shared(&[w, w2], &xq, n_tok, &mut [&mut s1, &mut s2]);
            assert_eq!(s1, y, "{ty} shared, first matrix, {n_tok} tokens");
            assert_eq!(s2, y2, "{ty} shared, second matrix, {n_tok} tokens");
        }
    }
}
