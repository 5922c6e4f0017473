//! Several sequences' decode rows sharing one pass over a weight matrix (`dot_rows_tokens`)
//! and `Pool::matvec_tokens_q` (token-lane kernels where they keep the one-token order) against
//! each token multiplied alone (`Pool::matvec`): bit for bit, for every weight type
//! and under every kernel set this CPU runs (a separate test binary, since the kernel set is
//! process-wide).

mod common;
use common::*;
use xwen_kernels::dispatch::{self, Isa};
use xwen_kernels::{act_row_bytes, dot_rows_tokens, quantize, quantize_activations, GgmlType, Pool, QMatrix};

#[test]
fn tokens_sharing_a_weight_pass_get_their_matvec_bits() {
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_K,
        GgmlType::Q4_0,
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::IQ4_NL,
    ];
    let mut caps = vec![None, Some(Isa::Scalar)];
    if dispatch::supported(Isa::Avx2) && dispatch::detected() != Isa::Avx2 {
        caps.push(Some(Isa::Avx2));
    }
    let pool = Pool::new(2);
    let mut rng = Rng(0xba7c4);
    for cap in caps {
        dispatch::set_max_isa(cap);
        for &ty in &types {
            // 16 rows is the smallest repacked Q4_K matrix (rows % 8 == 0); 13 is not repacked;
            // 136 spans several output tiles (tokens past the lane groups ride each tile)
            for rows in [13, 16, 40, 136] {
                let cols = 256 * (1 + rng.below(2));
                let wf: Vec<f32> = (0..rows * cols).map(|_| rng.normalish()).collect();
                let data = quantize(ty, &wf).unwrap();
                let w = QMatrix::new(ty, rows, cols, &data).unwrap();
                let kern = dispatch::row_kernel(ty, rows).unwrap();
                for n_tok in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 14, 16, 21] {
                    let xs: Vec<Vec<f32>> = (0..n_tok).map(|_| rng.activations(cols)).collect();
                    let mut xq = Vec::new();
                    let mut row = Vec::new();
                    for x in &xs {
                        quantize_activations(ty, x, &mut row);
                        assert_eq!(row.len(), act_row_bytes(&w));
                        xq.extend_from_slice(&row);
                    }
                    // rows 3.. only: a run that does not start at the matrix head
                    let r0 = 3;
                    let mut got = vec![f32::NAN; (rows - r0) * n_tok];
                    dot_rows_tokens(&w, kern, &xq, n_tok, r0, &mut got);
                    let mut whole = vec![f32::NAN; rows * n_tok];
                    pool.matvec_tokens_q(w, &xq, n_tok, &mut whole);
                    for (t, x) in xs.iter().enumerate() {
                        let mut want = vec![0.0f32; rows];
                        pool.matvec(w, x, &mut want);
                        assert_eq!(
                            whole[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{ty} {rows}x{cols} under {cap:?}: matvec_tokens_q, token {t} of {n_tok}"
                        );
                        for r in r0..rows {
                            assert_eq!(
                                got[(r - r0) * n_tok + t].to_bits(),
                                want[r].to_bits(),
                                "{ty} {rows}x{cols} under {cap:?}: token {t} of {n_tok}, row {r}"
                            );
                        }
                    }
                }
            }
        }
    }
    dispatch::set_max_isa(None);
}
