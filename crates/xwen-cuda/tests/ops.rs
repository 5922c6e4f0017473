//! Each device product against the CPU's reference arithmetic (dequantized weights, f64 sums) on
//! fresh random inputs at several shapes, with a bound that follows from f32 accumulation:
//! |gpu − ref| ≤ 1e-5 · Σ|w·x| + 1e-6 per output. These need a CUDA GPU: they are ignored in
//! a plain `cargo test` (reported as such) and run by scripts/gpu-check with `--ignored`.

use xwen_cuda::gpu::{Arg, Gpu};
use xwen_gguf::GgmlType;

fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn gpu() -> Gpu {
    Gpu::new(0).unwrap_or_else(|e| panic!("a CUDA GPU is needed for this test: {e}"))
}

/// `mv` over `slots` experts of a stack of `n_mat` matrices (rows × cols) of type `ty`, each slot
/// its own expert and input, against dequantized f64 dots.
fn check_mv(g: &Gpu, ty: GgmlType, rows: usize, cols: usize, n_mat: usize, slots: usize, seed: u64) {
    let w_f32 = noise(n_mat * rows * cols, seed);
    let data = xwen_kernels::quantize(ty, &w_f32).expect("quantize");
    let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
    assert_eq!(data.len(), n_mat * rows * row_bytes);
    let mut deq = vec![0.0f32; n_mat * rows * cols];
    xwen_kernels::dequantize(ty, &data, &mut deq).expect("dequantize");
    let x = noise(slots * cols, seed + 7);
    let res = noise(slots * rows, seed + 11);
    let ids: Vec<i32> = (0..slots).map(|s| ((s * 7 + 3) % n_mat) as i32).collect();
    let (wd, xd, rd, idd) = (g.upload(&data).unwrap(), g.upload_f32(&x).unwrap(), g.upload_f32(&res).unwrap(), g.upload_i32(&ids).unwrap());
    let yd = g.zeros(slots * rows * 4).unwrap();
    for with_res in [false, true] {
        g.launch(
            "mv",
            (rows.div_ceil(4) as u32, slots as u32),
            128,
            0,
            &[
                Arg::Ptr(wd.ptr),
                Arg::I32(ty.id() as i32),
                Arg::I32(rows as i32),
                Arg::I32(cols as i32),
                Arg::I64(row_bytes as i64),
                Arg::I64((rows * row_bytes) as i64),
                Arg::Ptr(idd.ptr),
                Arg::Ptr(xd.ptr),
                Arg::I64(cols as i64),
                Arg::Ptr(yd.ptr),
                Arg::I64(rows as i64),
                Arg::Ptr(if with_res { rd.ptr } else { 0 }),
            ],
        )
        .unwrap();
        let y = g.read_f32(&yd, slots * rows).unwrap();
        let mut worst = 0.0f64;
        for s in 0..slots {
            let e = ids[s] as usize;
            for r in 0..rows {
                let w = &deq[(e * rows + r) * cols..][..cols];
                let xs = &x[s * cols..][..cols];
                let exact: f64 = w.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() + if with_res { res[s * rows + r] as f64 } else { 0.0 };
                let mag: f64 = w.iter().zip(xs).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let err = (y[s * rows + r] as f64 - exact).abs();
                let bound = 1e-5 * mag + 1e-6 + if with_res { 1e-7 * res[s * rows + r].abs() as f64 } else { 0.0 };
                assert!(err <= bound, "{} {rows}x{cols} slot {s} row {r}: gpu {} exact {exact} (err {err:.3e} > {bound:.3e})", ty.name(), y[s * rows + r]);
                worst = worst.max(err / mag.max(1e-30));
            }
        }
        println!("mv {:>5} {rows:>4}x{cols:<5} {slots} slot(s){}: worst |err|/Σ|wx| {worst:.2e}", ty.name(), if with_res { " +res" } else { "" });
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn products_of_every_weight_type_match_the_dequantized_reference() {
    let g = gpu();
    let types = [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];
    for (i, ty) in types.into_iter().enumerate() {
        for &(rows, cols) in &[(1usize, 256usize), (37, 512), (130, 2048), (5, 768)] {
            check_mv(&g, ty, rows, cols, 1, 1, 100 + i as u64);
        }
        // a stack of experts, several slots each reading its own expert and input
        check_mv(&g, ty, 64, 256, 9, 4, 900 + i as u64);
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn rms_norm_matches_the_cpu() {
    let g = gpu();
    for &n in &[64usize, 1000, 2048, 5120] {
        let x = noise(n, n as u64);
        let w = noise(n, n as u64 + 1);
        let (xd, wd, yd) = (g.upload_f32(&x).unwrap(), g.upload_f32(&w).unwrap(), g.zeros(n * 4).unwrap());
        g.launch("rms_norm", (1, 1), 1024, 0, &[Arg::Ptr(xd.ptr), Arg::Ptr(wd.ptr), Arg::Ptr(yd.ptr), Arg::I32(n as i32), Arg::F32(1e-6)]).unwrap();
        let y = g.read_f32(&yd, n).unwrap();
        let mut want = vec![0.0f32; n];
        xwen_engine::ops::rms_norm(&x, &w, 1e-6, &mut want);
        let worst = y.iter().zip(&want).map(|(a, b)| ((a - b).abs() / b.abs().max(1e-6)) as f64).fold(0.0, f64::max);
        println!("rms_norm {n}: worst rel err {worst:.2e}");
        assert!(worst < 1e-5, "rms_norm {n}: {worst}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_router_picks_the_cpus_experts_and_weights() {
    let g = gpu();
    for &(n_expert, k) in &[(8usize, 2usize), (64, 8), (256, 8), (512, 10)] {
        let logits: Vec<f32> = noise(n_expert, n_expert as u64 * 3).iter().map(|v| v * 4.0).collect();
        let (ld, idd, wd) = (g.upload_f32(&logits).unwrap(), g.zeros(k * 4).unwrap(), g.zeros(k * 4).unwrap());
        g.launch("moe_route", (1, 1), 256, (n_expert * 4) as u32, &[Arg::Ptr(ld.ptr), Arg::I32(n_expert as i32), Arg::I32(k as i32), Arg::I32(1), Arg::F32(1.0), Arg::Ptr(idd.ptr), Arg::Ptr(wd.ptr)]).unwrap();
        let ids = g.read_i32(&idd, k).unwrap();
        let w = g.read_f32(&wd, k).unwrap();
        let want = xwen_engine::backend::route::route(&logits, k);
        assert_eq!(ids.iter().map(|&i| i as usize).collect::<Vec<_>>(), want.experts, "{n_expert} experts, top {k}");
        for (a, b) in w.iter().zip(&want.weights) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-3), "weights {w:?} vs {:?}", want.weights);
        }
        println!("moe_route {n_expert}/{k}: same experts, weights within 1e-6");
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn argmax_takes_the_first_largest() {
    let g = gpu();
    let mut v = noise(248_320, 5);
    v[1000] = 3.0;
    v[200_000] = 3.0;
    let (vd, od) = (g.upload_f32(&v).unwrap(), g.zeros(4).unwrap());
    g.launch("argmax", (1, 1), 1024, 0, &[Arg::Ptr(vd.ptr), Arg::I32(v.len() as i32), Arg::Ptr(od.ptr)]).unwrap();
    assert_eq!(g.read_i32(&od, 1).unwrap()[0], 1000);
}
