//! The process-wide scalar switch. Its own test binary, because flipping it would race with
//! tests that compare dispatched results in the same process.

mod common;
use common::*;
use xwen_kernels::dispatch::{self, Isa};
use xwen_kernels::{formats, quantize, quantize_activations, GgmlType, Pool, QMatrix};

#[test]
fn force_reference_routes_everything_to_the_scalar_twins() {
    let mut rng = Rng(31337);
    let pool = Pool::new(2);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::BF16,
    ] {
        let (rows, cols) = (37, 512);
        let wf: Vec<f32> = (0..rows * cols).map(|_| rng.normalish()).collect();
        let data = quantize(ty, &wf).unwrap();
        let w = QMatrix::new(ty, rows, cols, &data).unwrap();
        let x = rng.activations(cols);
        let mut xq = Vec::new();
        quantize_activations(ty, &x, &mut xq);
        let scalar = formats::format(ty).unwrap().dot.unwrap();
        let want: Vec<f32> = (0..rows).map(|r| scalar(cols, w.row(r), &xq)).collect();

        dispatch::set_force_reference(true);
        assert_eq!(dispatch::active(), Isa::Scalar);
        let mut y = vec![0f32; rows];
        pool.matvec(w, &x, &mut y);
        let mut ym = vec![0f32; 3 * rows];
        let x3: Vec<f32> = x.iter().chain(&x).chain(&x).copied().collect();
        pool.matmul(w, &x3, 3, &mut ym);
        dispatch::set_force_reference(false);

        assert_eq!(y, want, "{ty} matvec under force_reference");
        assert_eq!(
            &ym[2 * rows..],
            want.as_slice(),
            "{ty} matmul under force_reference"
        );
        // activation bytes do not depend on the switch
        let mut xq2 = Vec::new();
        dispatch::set_force_reference(true);
        quantize_activations(ty, &x, &mut xq2);
        dispatch::set_force_reference(false);
        assert_eq!(xq, xq2, "{ty} activations changed with force_reference");
    }
    assert_eq!(
        dispatch::active(),
        dispatch::detected(),
        "switch did not turn off"
    );
}
