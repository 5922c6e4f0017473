//! Q4_K in the float order of llama.cpp's repacked kernels: the AVX2 kernels equal their
//! scalar emulations bit for bit, and products through the pool equal ggml's own repacked
//! MUL_MAT output (tests/vectors/repack_q4k_*.bin, from tools/kernels/make_q4k_repack_vectors.sh).

mod common;
use common::*;
use xwen_kernels::dispatch::{self, Isa};
use xwen_kernels::{q4k_repack, quantize, quantize_activations, GgmlType, Pool, QMatrix};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn simd_kernels_equal_the_scalar_emulations() {
    if !q4k_repack::repacked(8) {
        eprintln!("SKIP simd_kernels_equal_the_scalar_emulations: this CPU does not repack Q4_K");
        return;
    }
    assert!(matches!(dispatch::active(), Isa::Avx2 | Isa::Avx512));
    let mut rng = Rng(0xa11ce);
    let mut checked = 0;
    for case in 0..40 {
        let cols = 256 * (1 + rng.below(8));
        let wf: Vec<f32> = (0..cols)
            .map(|i| {
                rng.normalish()
                    * (1.0 + (i / 32 % 7) as f32)
                    * if case % 5 == 0 { 1e3 } else { 1.0 }
            })
            .collect();
        let wq = quantize(GgmlType::Q4_K, &wf).unwrap();
        let k = 1 + case % 4;
        let mut xq = Vec::new();
        for _ in 0..k {
            let mut row = Vec::new();
            quantize_activations(GgmlType::Q4_K, &rng.activations(cols), &mut row);
            xq.extend_from_slice(&row);
        }
        let stride = xq.len() / k;
        for grouped in [false, true] {
            let (dot, multi) = dispatch::matrix_kernels(GgmlType::Q4_K, 8, grouped).unwrap();
            let reference = if grouped {
                q4k_repack::dot_gemm_ref
            } else {
                q4k_repack::dot_gemv_ref
            };
            let want: Vec<f32> = (0..k)
                .map(|t| reference(cols, &wq, &xq[t * stride..]))
                .collect();
            let single: Vec<f32> = (0..k).map(|t| dot(cols, &wq, &xq[t * stride..])).collect();
            let mut out = vec![f32::NAN; k];
            multi.expect("AVX2 has a multi-token kernel")(cols, &wq, &xq, stride, &mut out);
            assert_eq!(
                bits(&single),
                bits(&want),
                "case {case} grouped {grouped}: single"
            );
            assert_eq!(
                bits(&out),
                bits(&want),
                "case {case} grouped {grouped}: multi"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 80);
}

#[test]
fn the_two_orders_really_differ_from_vec_dot() {
    // Guards against the tests above passing because every order rounds alike.
    let mut rng = Rng(99);
    let (mut gemv_diff, mut gemm_diff) = (0, 0);
    for _ in 0..50 {
        let cols = 2048;
        let wf: Vec<f32> = (0..cols).map(|_| rng.normalish()).collect();
        let wq = quantize(GgmlType::Q4_K, &wf).unwrap();
        let mut xq = Vec::new();
        quantize_activations(GgmlType::Q4_K, &rng.activations(cols), &mut xq);
        let v = xwen_kernels::formats::format(GgmlType::Q4_K)
            .unwrap()
            .dot
            .unwrap()(cols, &wq, &xq);
        gemv_diff += (q4k_repack::dot_gemv_ref(cols, &wq, &xq) != v) as usize;
        gemm_diff += (q4k_repack::dot_gemm_ref(cols, &wq, &xq) != v) as usize;
    }
    assert!(
        gemv_diff > 0 && gemm_diff > 0,
        "gemv {gemv_diff} gemm {gemm_diff}"
    );
}

#[test]
fn pool_products_equal_ggml_repacked_mul_mat() {
    if !q4k_repack::repacked(8) {
        eprintln!(
            "SKIP pool_products_equal_ggml_repacked_mul_mat: ggml does not repack Q4_K on this CPU"
        );
        return;
    }
    let files = read_vectors("repack_q4k_");
    assert!(
        files.len() >= 3,
        "expected repack_q4k_*.bin vectors, found {}",
        files.len()
    );
    for (name, v) in files {
        let shape = v.bytes("SHAP").unwrap();
        let rows = u32::from_le_bytes(shape[0..4].try_into().unwrap()) as usize;
        let n_tok = u32::from_le_bytes(shape[4..8].try_into().unwrap()) as usize;
        let cols = v.n;
        let wq = v.bytes("QW").unwrap();
        let x = v.f32s("X").unwrap();
        let want = v.f32s("Y").unwrap();
        let w = QMatrix::new(GgmlType::Q4_K, rows, cols, wq).unwrap();
        for threads in [1, 2] {
            let pool = Pool::new(threads);
            let mut y = vec![f32::NAN; n_tok * rows];
            if n_tok == 1 {
                pool.matvec(w, &x, &mut y);
            } else {
                pool.matmul(w, &x, n_tok, &mut y);
            }
            for t in 0..n_tok {
                assert_eq!(
                    bits(&y[t * rows..(t + 1) * rows]),
                    bits(&want[t * rows..(t + 1) * rows]),
                    "{name}: token {t} of {n_tok}, {threads} threads"
                );
            }
            // the gemv tail equals a lone matvec of that token
            let t = n_tok - 1;
            if !n_tok.is_multiple_of(4) {
                let mut y1 = vec![f32::NAN; rows];
                pool.matvec(w, &x[t * cols..(t + 1) * cols], &mut y1);
                assert_eq!(
                    bits(&y1),
                    bits(&want[t * rows..(t + 1) * rows]),
                    "{name}: matvec of token {t}"
                );
            }
        }
        // and the emulations alone reproduce ggml too (scalar path, e.g. under force_reference)
        let mut xq = Vec::new();
        xwen_kernels::quantize_activations_for_matmul(&w, &x, n_tok, &mut xq);
        let arb = xq.len() / n_tok;
        for t in 0..n_tok {
            let grouped = t < n_tok - n_tok % 4;
            for r in 0..rows {
                let a = &xq[t * arb..(t + 1) * arb];
                let got = if grouped {
                    q4k_repack::dot_gemm_ref(cols, w.row(r), a)
                } else {
                    q4k_repack::dot_gemv_ref(cols, w.row(r), a)
                };
                assert_eq!(
                    got.to_bits(),
                    want[t * rows + r].to_bits(),
                    "{name}: emulation token {t} row {r}"
                );
            }
        }
    }
}

#[test]
fn matmul_q_id_treats_every_token_as_a_single_token_product() {
    let mut rng = Rng(4242);
    let pool = Pool::new(2);
    let (rows, cols, n_tok) = (16, 512, 6);
    let wf: Vec<f32> = (0..rows * cols).map(|_| rng.normalish()).collect();
    let data = quantize(GgmlType::Q4_K, &wf).unwrap();
    let w = QMatrix::new(GgmlType::Q4_K, rows, cols, &data).unwrap();
    let x = rng.activations(n_tok * cols);
    let mut xq = Vec::new();
    for t in 0..n_tok {
        let mut row = Vec::new();
        quantize_activations(GgmlType::Q4_K, &x[t * cols..(t + 1) * cols], &mut row);
        xq.extend_from_slice(&row);
    }
    let mut y = vec![f32::NAN; n_tok * rows];
    pool.matmul_q_id(w, &xq, n_tok, &mut y);
    for t in 0..n_tok {
        let mut y1 = vec![f32::NAN; rows];
        pool.matvec(w, &x[t * cols..(t + 1) * cols], &mut y1);
        assert_eq!(bits(&y[t * rows..(t + 1) * rows]), bits(&y1), "token {t}");
    }
}
