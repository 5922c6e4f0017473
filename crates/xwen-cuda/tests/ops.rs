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
                Arg::I32(1),
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
        let want = xwen_engine::backend::moe_route::route(&logits, k);
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

/// The causal conv + SiLU of one row and the state shift, against the definition in f64.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn conv_step_matches_the_definition() {
    let g = gpu();
    for &(cd, kernel) in &[(96usize, 4usize), (8192, 4), (300, 2)] {
        let taps = noise(kernel * cd, 1);
        let state = noise((kernel - 1) * cd, 2);
        let x = noise(cd, 3);
        let (td, mut sd, xd, od) = (g.upload_f32(&taps).unwrap(), g.upload_f32(&state).unwrap(), g.upload_f32(&x).unwrap(), g.zeros(cd * 4).unwrap());
        g.launch("conv_step", (cd.div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(xd.ptr), Arg::Ptr(sd.ptr), Arg::Ptr(td.ptr), Arg::Ptr(od.ptr), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(1)]).unwrap();
        let out = g.read_f32(&od, cd).unwrap();
        let st = g.read_f32(&sd, (kernel - 1) * cd).unwrap();
        for c in 0..cd {
            let mut acc = 0.0f64;
            for j in 0..kernel {
                let w = if j < kernel - 1 { state[j * cd + c] } else { x[c] };
                acc += w as f64 * taps[j * cd + c] as f64;
            }
            let want = acc / (1.0 + (-acc).exp());
            assert!((out[c] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()), "conv {cd}x{kernel} channel {c}: {} vs {want}", out[c]);
            for j in 0..kernel - 1 {
                let want_s = if j + 1 < kernel - 1 { state[(j + 1) * cd + c] } else { x[c] };
                assert_eq!(st[j * cd + c], want_s, "state row {j} channel {c}");
            }
        }
        let _ = &mut sd;
        println!("conv_step {cd}x{kernel}: within 1e-5");
    }
}

/// One Gated DeltaNet token (L2 norms, gates, the rule, the gated output norm) against the
/// definition in f64, for tiled and grouped V-head pairing, several steps in a row.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn delta_step_matches_the_definition() {
    let g = gpu();
    for &(hk, hv, sd, tiled) in &[(2usize, 4usize, 128usize, true), (2, 4, 128, false), (1, 2, 64, true), (4, 4, 256, true)] {
        let eps = 1e-6f32;
        let cdim = 2 * hk * sd + hv * sd;
        let dt = noise(hv, 7);
        let a: Vec<f32> = noise(hv, 8).iter().map(|v| -v.abs() - 0.1).collect();
        let w = noise(sd, 9);
        let mut s_ref = vec![0.0f64; hv * sd * sd];
        let mut sdev = g.zeros(hv * sd * sd * 4).unwrap();
        g.zero(&mut sdev).unwrap();
        let (dtd, ad, wd, od) = (g.upload_f32(&dt).unwrap(), g.upload_f32(&a).unwrap(), g.upload_f32(&w).unwrap(), g.zeros(hv * sd * 4).unwrap());
        let mut worst = 0.0f64;
        for step in 0..4u64 {
            let conv = noise(cdim, 20 + step);
            let z = noise(hv * sd, 30 + step);
            let beta = noise(hv, 40 + step);
            let alpha = noise(hv, 50 + step);
            let (cvd, zd, bd, ald) = (g.upload_f32(&conv).unwrap(), g.upload_f32(&z).unwrap(), g.upload_f32(&beta).unwrap(), g.upload_f32(&alpha).unwrap());
            g.launch(
                "delta_step",
                (hv as u32, 1),
                256,
                0,
                &[Arg::Ptr(cvd.ptr), Arg::Ptr(zd.ptr), Arg::Ptr(bd.ptr), Arg::Ptr(ald.ptr), Arg::Ptr(dtd.ptr), Arg::Ptr(ad.ptr), Arg::Ptr(sdev.ptr), Arg::Ptr(wd.ptr), Arg::Ptr(od.ptr), Arg::I32(hk as i32), Arg::I32(hv as i32), Arg::I32(sd as i32), Arg::I32(tiled as i32), Arg::F32(eps), Arg::I32(1)],
            )
            .unwrap();
            let got = g.read_f32(&od, hv * sd).unwrap();
            for h in 0..hv {
                let kh = if tiled { h % hk } else { h / (hv / hk) };
                let l2 = |v: &[f32]| {
                    let ss: f64 = v.iter().map(|x| (*x as f64).powi(2)).sum();
                    v.iter().map(|x| *x as f64 / (ss + eps as f64).sqrt()).collect::<Vec<f64>>()
                };
                let q = l2(&conv[kh * sd..(kh + 1) * sd]);
                let k = l2(&conv[hk * sd + kh * sd..][..sd]);
                let v = &conv[2 * hk * sd + h * sd..][..sd];
                let b = 1.0 / (1.0 + (-(beta[h] as f64)).exp());
                let x = alpha[h] as f64 + dt[h] as f64;
                let sp = if x > 20.0 { x } else { (1.0 + x.exp()).ln() };
                let decay = (sp * a[h] as f64).exp();
                let s = &mut s_ref[h * sd * sd..(h + 1) * sd * sd];
                let mut o = vec![0.0f64; sd];
                for j in 0..sd {
                    let row = &mut s[j * sd..(j + 1) * sd];
                    row.iter_mut().for_each(|v| *v *= decay);
                    let kv: f64 = row.iter().zip(&k).map(|(a, b)| a * b).sum();
                    let d = (v[j] as f64 - kv) * b;
                    row.iter_mut().zip(&k).for_each(|(r, kk)| *r += d * kk);
                    o[j] = row.iter().zip(&q).map(|(a, b)| a * b).sum::<f64>() / (sd as f64).sqrt();
                }
                let ms = o.iter().map(|v| v * v).sum::<f64>() / sd as f64;
                let sc = 1.0 / (ms + eps as f64).sqrt();
                for i in 0..sd {
                    let zv = z[h * sd + i] as f64;
                    let want = o[i] * sc * w[i] as f64 * (zv / (1.0 + (-zv).exp()));
                    let err = (got[h * sd + i] as f64 - want).abs();
                    worst = worst.max(err);
                    assert!(err < 1e-4 * (1.0 + want.abs()), "delta {hk}/{hv}/{sd} tiled {tiled} step {step} head {h} dim {i}: {} vs {want}", got[h * sd + i]);
                }
            }
        }
        println!("delta_step hk {hk} hv {hv} sd {sd} tiled {tiled}: 4 steps, worst abs err {worst:.2e}");
    }
}

/// Gated attention at one position: q/k RMS-normed and roped, k/v into the f16 caches, the split
/// softmax over every cached position merged, times sigmoid(gate) — against f64 with the f16
/// rounding of the cache, at several positions (one and several KV splits).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn attention_at_a_position_matches_the_definition() {
    let g = gpu();
    let (n_head, n_kv, hd, n_rot) = (4usize, 2usize, 256usize, 64usize);
    let n_ctx = 700usize;
    let n_split = n_ctx.div_ceil(256);
    let kvw = n_kv * hd;
    let base = 10_000_000.0f32;
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let eps = 1e-6f32;
    let (qn, kn) = (noise(hd, 1), noise(hd, 2));
    let (qnd, knd) = (g.upload_f32(&qn).unwrap(), g.upload_f32(&kn).unwrap());
    let (kc, vc) = (g.zeros(n_ctx * kvw * 2).unwrap(), g.zeros(n_ctx * kvw * 2).unwrap());
    let (qd, po, pml, out) = (g.zeros(n_head * hd * 4).unwrap(), g.zeros(n_head * n_split * hd * 4).unwrap(), g.zeros(n_head * n_split * 8).unwrap(), g.zeros(n_head * hd * 4).unwrap());
    let mut step = g.zeros(8).unwrap();
    let norm = |x: &[f32], w: &[f32]| {
        let ms = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
        let sc = 1.0 / (ms + eps as f64).sqrt();
        x.iter().zip(w).map(|(a, b)| *a as f64 * sc * *b as f64).collect::<Vec<f64>>()
    };
    let rope = |x: &mut Vec<f64>, pos: usize| {
        for i in 0..n_rot / 2 {
            let th = pos as f64 * (theta_scale as f64).powi(i as i32);
            let (c, s) = (th.cos(), th.sin());
            let (x0, x1) = (x[i], x[i + n_rot / 2]);
            x[i] = x0 * c - x1 * s;
            x[i + n_rot / 2] = x0 * s + x1 * c;
        }
    };
    let f16r = |v: f64| xwen_kernels::half::f16_to_f32(xwen_kernels::half::f32_to_f16(v as f32)) as f64;
    let (mut ks, mut vs): (Vec<Vec<f64>>, Vec<Vec<f64>>) = (Vec::new(), Vec::new());
    let mut worst = 0.0f64;
    for pos in 0..600usize {
        let qg = noise(n_head * 2 * hd, 100 + pos as u64);
        let k = noise(kvw, 200 + pos as u64);
        let v = noise(kvw, 300 + pos as u64);
        let (qgd, kd, vd) = (g.upload_f32(&qg).unwrap(), g.upload_f32(&k).unwrap(), g.upload_f32(&v).unwrap());
        let p: Vec<u8> = [pos as i32, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        g.write(&mut step, &p).unwrap();
        g.launch(
            "attn_heads",
            ((n_head + n_kv) as u32, 1),
            hd as u32,
            (hd * 4) as u32,
            &[Arg::Ptr(qgd.ptr), Arg::Ptr(kd.ptr), Arg::Ptr(vd.ptr), Arg::Ptr(qnd.ptr), Arg::Ptr(knd.ptr), Arg::Ptr(0), Arg::Ptr(step.ptr), Arg::Ptr(qd.ptr), Arg::Ptr(kc.ptr), Arg::Ptr(vc.ptr), Arg::I32(n_head as i32), Arg::I32(n_kv as i32), Arg::I32(hd as i32), Arg::I32(n_rot as i32), Arg::F32(theta_scale), Arg::F32(eps)],
        )
        .unwrap();
        g.launch_3d("attn_split", (n_head as u32, n_split as u32, 1), 128, 0, &[Arg::Ptr(qd.ptr), Arg::Ptr(kc.ptr), Arg::Ptr(vc.ptr), Arg::Ptr(step.ptr), Arg::Ptr(po.ptr), Arg::Ptr(pml.ptr), Arg::I32(n_head as i32), Arg::I32(n_kv as i32), Arg::I32(hd as i32), Arg::F32(1.0 / (hd as f32).sqrt())]).unwrap();
        g.launch("attn_merge", (n_head as u32, 1), hd as u32, 0, &[Arg::Ptr(po.ptr), Arg::Ptr(pml.ptr), Arg::Ptr(qgd.ptr), Arg::Ptr(out.ptr), Arg::I32(hd as i32), Arg::I32(n_split as i32)]).unwrap();
        let mut krow = Vec::new();
        for h in 0..n_kv {
            let mut kk = norm(&k[h * hd..(h + 1) * hd], &kn);
            rope(&mut kk, pos);
            krow.extend(kk.into_iter().map(f16r));
        }
        ks.push(krow);
        vs.push(v.iter().map(|x| f16r(*x as f64)).collect());
        if ![0usize, 1, 7, 255, 256, 257, 599].contains(&pos) {
            continue;
        }
        let got = g.read_f32(&out, n_head * hd).unwrap();
        for h in 0..n_head {
            let kvh = h / (n_head / n_kv);
            let mut q = norm(&qg[h * 2 * hd..h * 2 * hd + hd], &qn);
            rope(&mut q, pos);
            let sc: Vec<f64> = (0..=pos).map(|p| ks[p][kvh * hd..(kvh + 1) * hd].iter().zip(&q).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()).collect();
            let m = sc.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for i in 0..hd {
                let o: f64 = (0..=pos).map(|p| e[p] * vs[p][kvh * hd + i]).sum::<f64>() / l;
                let gt = qg[h * 2 * hd + hd + i] as f64;
                let want = o / (1.0 + (-gt).exp());
                let err = (got[h * hd + i] as f64 - want).abs();
                worst = worst.max(err);
                assert!(err < 2e-4, "attention pos {pos} head {h} dim {i}: {} vs {want}", got[h * hd + i]);
            }
        }
    }
    println!("attention 4q/2kv heads of 256, positions 0..600 (1 to 3 KV splits): worst abs err {worst:.2e}");
}

/// The prompt products — `mm` (8 tokens a pass, f32) and `mm_tc` (64 × 64 tiles on tensor
/// cores, f16 inputs, f32 sums) — against dequantized f64 dots, for token counts that fill and
/// part-fill their tiles. Bounds: mm as mv; mm_tc by f16 rounding of both inputs (2⁻¹¹ relative
/// each): |err| ≤ 2e-3 · Σ|w·x|.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn prompt_products_match_the_dequantized_reference() {
    let g = gpu();
    let types = [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];
    for (i, ty) in types.into_iter().enumerate() {
        for &(rows, cols, n) in &[(70usize, 256usize, 3usize), (130, 512, 17), (64, 1024, 64), (200, 768, 100)] {
            let w_f32 = noise(rows * cols, 500 + i as u64);
            let data = xwen_kernels::quantize(ty, &w_f32).expect("quantize");
            let rb = ty.row_bytes(cols as u64).unwrap() as usize;
            let mut deq = vec![0.0f32; rows * cols];
            xwen_kernels::dequantize(ty, &data, &mut deq).unwrap();
            let x = noise(n * cols, 600 + i as u64);
            let (wd, xd, yd) = (g.upload(&data).unwrap(), g.upload_f32(&x).unwrap(), g.zeros(n * rows * 4).unwrap());
            for (kernel, bound, grid) in [("mm", 1e-5, (rows.div_ceil(4) as u32, n.div_ceil(8) as u32)), ("mm_tc", 2e-3, (rows.div_ceil(64) as u32, n.div_ceil(64) as u32))] {
                let block = if kernel == "mm" { 128 } else { 128 };
                g.launch(kernel, grid, block, 0, &[Arg::Ptr(wd.ptr), Arg::I32(ty.id() as i32), Arg::I32(rows as i32), Arg::I32(cols as i32), Arg::I64(rb as i64), Arg::Ptr(xd.ptr), Arg::I64(cols as i64), Arg::I32(n as i32), Arg::Ptr(yd.ptr), Arg::I64(rows as i64), Arg::Ptr(0)]).unwrap();
                let y = g.read_f32(&yd, n * rows).unwrap();
                let mut worst = 0.0f64;
                for t in 0..n {
                    for r in 0..rows {
                        let (wr, xt) = (&deq[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                        let exact: f64 = wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let mag: f64 = wr.iter().zip(xt).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                        let err = (y[t * rows + r] as f64 - exact).abs();
                        assert!(err <= bound * mag + 1e-6, "{kernel} {} {rows}x{cols} n {n} token {t} row {r}: {} vs {exact}", ty.name(), y[t * rows + r]);
                        worst = worst.max(err / mag.max(1e-30));
                    }
                }
                println!("{kernel:<5} {:>5} {rows:>4}x{cols:<5} {n:>3} tokens: worst |err|/Σ|wx| {worst:.2e}", ty.name());
            }
        }
    }
}
