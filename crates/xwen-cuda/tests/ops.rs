//! Each device product against the CPU's reference arithmetic (dequantized weights, f64 sums) on
//! fresh random inputs at several shapes, with a bound that follows from f32 accumulation:
//! |gpu − ref| ≤ 1e-5 · Σ|w·x| + 1e-6 per output. These need a CUDA GPU: they are ignored in
//! a plain `cargo test` (reported as such) and run by scripts/gpu-check with `--ignored`.

use xwen_cuda::gpu::{Arg, Gpu};
use xwen_cuda::layout::{device_layout, device_row_bytes};
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
    assert_eq!(data.len(), n_mat * rows * ty.row_bytes(cols as u64).unwrap() as usize);
    let row_bytes = device_row_bytes(ty, cols);
    let mut deq = vec![0.0f32; n_mat * rows * cols];
    xwen_kernels::dequantize(ty, &data, &mut deq).expect("dequantize");
    let x = noise(slots * cols, seed + 7);
    let res = noise(slots * rows, seed + 11);
    let ids: Vec<i32> = (0..slots).map(|s| ((s * 7 + 3) % n_mat) as i32).collect();
    let (wd, xd, rd, idd) = (g.upload(&device_layout(ty, &data)).unwrap(), g.upload_f32(&x).unwrap(), g.upload_f32(&res).unwrap(), g.upload_i32(&ids).unwrap());
    let yd = g.zeros(slots * rows * 4).unwrap();
    for with_res in [false, true] {
        g.launch(
            "mv",
            (rows.div_ceil(4 * g.knobs.mv_rows) as u32, slots as u32),
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
                Arg::Ptr(0),
                Arg::Ptr(0),
                Arg::Ptr(0),
                Arg::Ptr(0),
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
    for &n in &[64usize, 1000, 2048, 5120, 2560, 8192] {
        let x = noise(n, n as u64);
        let w = noise(n, n as u64 + 1);
        let mut want = vec![0.0f32; n];
        xwen_engine::ops::rms_norm(&x, &w, 1e-6, &mut want);
        for threads in [1024, xwen_cuda::rms_norm_threads(n)] {
            let (xd, wd, yd) = (g.upload_f32(&x).unwrap(), g.upload_f32(&w).unwrap(), g.zeros(n * 4).unwrap());
            let args = [Arg::Ptr(xd.ptr), Arg::Ptr(wd.ptr), Arg::Ptr(yd.ptr), Arg::I32(n as i32), Arg::F32(1e-6), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0)];
            g.launch("rms_norm", (1, 1), threads, 0, &args).unwrap();
            let y = g.read_f32(&yd, n).unwrap();
            let worst = y.iter().zip(&want).map(|(a, b)| ((a - b).abs() / b.abs().max(1e-6)) as f64).fold(0.0, f64::max);
            println!("rms_norm {n} ({threads} threads): worst rel err {worst:.2e}");
            assert!(worst < 1e-5, "rms_norm {n} ({threads} threads): {worst}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_router_picks_the_cpus_experts_and_weights() {
    let g = gpu();
    for &(n_expert, k) in &[(8usize, 2usize), (64, 8), (256, 8), (512, 10)] {
        let logits: Vec<f32> = noise(n_expert, n_expert as u64 * 3).iter().map(|v| v * 4.0).collect();
        let (ld, idd, wd) = (g.upload_f32(&logits).unwrap(), g.zeros(k * 4).unwrap(), g.zeros(k * 4).unwrap());
        let args = [Arg::Ptr(ld.ptr), Arg::I32(n_expert as i32), Arg::I32(k as i32), Arg::I32(1), Arg::F32(1.0), Arg::Ptr(idd.ptr), Arg::Ptr(wd.ptr)];
        // the block kernel, and the one-warp kernel decode uses up to 512 experts
        for (kernel, block, smem) in [("moe_route", 256u32, (n_expert * 4) as u32), ("moe_route_warp", 32, 0)] {
            g.launch(kernel, (1, 1), block, smem, &args).unwrap();
            let ids = g.read_i32(&idd, k).unwrap();
            let w = g.read_f32(&wd, k).unwrap();
            let want = xwen_engine::backend::moe_route::route(&logits, k);
            assert_eq!(ids.iter().map(|&i| i as usize).collect::<Vec<_>>(), want.experts, "{kernel}: {n_expert} experts, top {k}");
            for (a, b) in w.iter().zip(&want.weights) {
                assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-3), "{kernel}: weights {w:?} vs {:?}", want.weights);
            }
            println!("{kernel} {n_expert}/{k}: same experts, weights within 1e-6");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn argmax_takes_the_first_largest() {
    let g = gpu();
    let mut v = noise(248_320, 5);
    v[1000] = 3.0;
    v[200_000] = 3.0;
    v[150_000] = 3.0;
    let (vd, od, part) = (g.upload_f32(&v).unwrap(), g.zeros(4).unwrap(), g.zeros(8 * 128 + 4).unwrap());
    // one block, and many (the first largest lies in a block other than the last to finish);
    // again, to see the finish counter reset
    for &blocks in &[1u32, 61, 61, 128, 7] {
        let args = [Arg::Ptr(vd.ptr), Arg::I32(v.len() as i32), Arg::Ptr(od.ptr), Arg::Ptr(part.ptr), Arg::Ptr(part.at(4 * 128)), Arg::Ptr(part.at(8 * 128)), Arg::Ptr(0), Arg::I32(0)];
        g.launch("argmax", (blocks, 1), 1024, 0, &args).unwrap();
        assert_eq!(g.read_i32(&od, 1).unwrap()[0], 1000, "argmax over {blocks} blocks");
        assert_eq!(g.read_i32(&part, 8 * 128 / 4 + 1).unwrap()[8 * 128 / 4], 0, "argmax over {blocks} blocks: the counter is reset");
    }
    // banned tokens skipped (a greedy sampler's bans, `ops::argmax_except`), -1 entries none
    for (bans, blocks) in [(vec![1000, -1, -1], 61u32), (vec![1000, 150_000, -1], 7), (vec![1000, 150_000, 200_000], 1)] {
        let want = xwen_engine::ops::argmax_except(&v, &bans.iter().filter(|&&b| b >= 0).map(|&b| b as u32).collect::<Vec<_>>());
        let bd = g.upload_i32(&bans).unwrap();
        let args =
            [Arg::Ptr(vd.ptr), Arg::I32(v.len() as i32), Arg::Ptr(od.ptr), Arg::Ptr(part.ptr), Arg::Ptr(part.at(4 * 128)), Arg::Ptr(part.at(8 * 128)), Arg::Ptr(bd.ptr), Arg::I32(bans.len() as i32)];
        g.launch("argmax", (blocks, 1), 1024, 0, &args).unwrap();
        assert_eq!(g.read_i32(&od, 1).unwrap()[0] as u32, want, "argmax over {blocks} blocks skipping {bans:?}");
    }
    println!("argmax over 1, 61, 128 and 7 blocks: the first largest; skipping banned tokens: argmax_except's");
}

/// An MTP draft step's answer in the argmax launch (`argmax_answer`): the argmax's pick, the
/// probability softmax gives it against its f64 definition, the hidden row copied — over one
/// block and many, twice each (the finish counter reset).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_argmax_answer_gives_the_pick_its_probability_and_the_hidden_row() {
    let g = gpu();
    for &(n, scale, blocks) in &[(4096usize, 4.0f32, 1u32), (4096, 4.0, 1), (248_320, 8.0, 61), (248_320, 8.0, 61), (100_003, 0.01, 25)] {
        let mut v: Vec<f32> = noise(n, n as u64).iter().map(|x| x * scale).collect();
        v[n / 3] = 3.0 * scale;
        let hidden = noise(256, 9);
        let want_tok = xwen_engine::ops::argmax_except(&v, &[]);
        let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let want_p = 1.0 / v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>();
        let (vd, od, part, hd, ans, ms) =
            (g.upload_f32(&v).unwrap(), g.zeros(4).unwrap(), g.zeros(8 * 128 + 4).unwrap(), g.upload_f32(&hidden).unwrap(), g.zeros((256 + 2) * 4).unwrap(), g.zeros(2 * 128 * 4).unwrap());
        let args = [
            Arg::Ptr(vd.ptr),
            Arg::I32(n as i32),
            Arg::Ptr(od.ptr),
            Arg::Ptr(part.ptr),
            Arg::Ptr(part.at(4 * 128)),
            Arg::Ptr(part.at(8 * 128)),
            Arg::Ptr(hd.ptr),
            Arg::I32(256),
            Arg::Ptr(ans.ptr),
            Arg::Ptr(ms.ptr),
        ];
        g.launch("argmax_answer", (blocks, 1), 1024, 0, &args).unwrap();
        let a = g.read_f32(&ans, 258).unwrap();
        assert_eq!(g.read_i32(&od, 1).unwrap()[0] as u32, want_tok, "{n} logits over {blocks} blocks: the pick");
        assert_eq!(a[257].to_bits(), want_tok, "{n} logits over {blocks} blocks: the answer's token");
        assert!((a[256] as f64 - want_p).abs() <= 1e-5 * want_p, "{n} logits over {blocks} blocks: probability {} vs {want_p}", a[256]);
        assert_eq!(&a[..256], &hidden[..], "the hidden row");
        assert_eq!(g.read_i32(&part, 8 * 128 / 4 + 1).unwrap()[8 * 128 / 4], 0, "the counter is reset");
        println!("argmax_answer {n} over {blocks} blocks: token {want_tok}, probability {} (f64 {want_p:.6})", a[256]);
    }
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
        g.launch(
            "conv_step",
            (cd.div_ceil(256) as u32, 1),
            256,
            0,
            &[Arg::Ptr(xd.ptr), Arg::Ptr(sd.ptr), Arg::Ptr(td.ptr), Arg::Ptr(od.ptr), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(1), Arg::Ptr(0), Arg::Ptr(0)],
        )
        .unwrap();
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
                &[
                    Arg::Ptr(cvd.ptr),
                    Arg::Ptr(zd.ptr),
                    Arg::Ptr(bd.ptr),
                    Arg::Ptr(ald.ptr),
                    Arg::Ptr(dtd.ptr),
                    Arg::Ptr(ad.ptr),
                    Arg::Ptr(sdev.ptr),
                    Arg::Ptr(wd.ptr),
                    Arg::Ptr(od.ptr),
                    Arg::I32(hk as i32),
                    Arg::I32(hv as i32),
                    Arg::I32(sd as i32),
                    Arg::I32(tiled as i32),
                    Arg::F32(eps),
                    Arg::I32(1),
                ],
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
    let (qd, po, pml, out) =
        (g.zeros(n_head * hd * 4).unwrap(), g.zeros(n_head * n_split * hd * 4).unwrap(), g.zeros(n_head * n_split * 8).unwrap(), g.zeros(n_head * hd * 4).unwrap());
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
            &[
                Arg::Ptr(qgd.ptr),
                Arg::Ptr(kd.ptr),
                Arg::Ptr(vd.ptr),
                Arg::Ptr(qnd.ptr),
                Arg::Ptr(knd.ptr),
                Arg::Ptr(0),
                Arg::Ptr(step.ptr),
                Arg::Ptr(qd.ptr),
                Arg::Ptr(kc.ptr),
                Arg::Ptr(vc.ptr),
                Arg::I32(n_head as i32),
                Arg::I32(n_kv as i32),
                Arg::I32(hd as i32),
                Arg::I32(n_rot as i32),
                Arg::F32(theta_scale),
                Arg::F32(eps),
                Arg::Ptr(0),
                Arg::Ptr(0),
            ],
        )
        .unwrap();
        g.launch_3d(
            "attn_split",
            (n_head as u32, n_split as u32, 1),
            128,
            0,
            &[
                Arg::Ptr(qd.ptr),
                Arg::Ptr(kc.ptr),
                Arg::Ptr(vc.ptr),
                Arg::Ptr(step.ptr),
                Arg::Ptr(po.ptr),
                Arg::Ptr(pml.ptr),
                Arg::I32(n_head as i32),
                Arg::I32(n_kv as i32),
                Arg::I32(hd as i32),
                Arg::F32(1.0 / (hd as f32).sqrt()),
                Arg::Ptr(0),
                Arg::Ptr(0),
            ],
        )
        .unwrap();
        g.launch(
            "attn_merge",
            (n_head as u32, 1),
            hd as u32,
            0,
            &[Arg::Ptr(po.ptr), Arg::Ptr(pml.ptr), Arg::Ptr(qgd.ptr), Arg::Ptr(out.ptr), Arg::I32(hd as i32), Arg::I32(n_split as i32), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0)],
        )
        .unwrap();
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
            let rb = device_row_bytes(ty, cols);
            let mut deq = vec![0.0f32; rows * cols];
            xwen_kernels::dequantize(ty, &data, &mut deq).unwrap();
            let x = noise(n * cols, 600 + i as u64);
            let (wd, xd, yd) = (g.upload(&device_layout(ty, &data)).unwrap(), g.upload_f32(&x).unwrap(), g.zeros(n * rows * 4).unwrap());
            for (kernel, bound, grid) in [("mm", 1e-5, (rows.div_ceil(4) as u32, n.div_ceil(8) as u32)), ("mm_tc", 2e-3, (rows.div_ceil(64) as u32, n.div_ceil(64) as u32))] {
                let block = if kernel == "mm" { 128 } else { 128 };
                g.launch(
                    kernel,
                    grid,
                    block,
                    0,
                    &[
                        Arg::Ptr(wd.ptr),
                        Arg::I32(ty.id() as i32),
                        Arg::I32(rows as i32),
                        Arg::I32(cols as i32),
                        Arg::I64(rb as i64),
                        Arg::Ptr(xd.ptr),
                        Arg::I64(cols as i64),
                        Arg::I32(n as i32),
                        Arg::Ptr(yd.ptr),
                        Arg::I64(rows as i64),
                        Arg::Ptr(0),
                    ],
                )
                .unwrap();
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

/// A prompt pass's scan (delta_prep, delta_rows, delta_out over n tokens at once) against the
/// one-token kernel run token after token: the same recurrence, so within f32 rounding.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_prompt_scan_follows_the_token_steps() {
    let g = gpu();
    for &(hk, hv, sd, tiled, n) in &[(2usize, 4usize, 128usize, true, 37usize), (2, 4, 128, false, 9), (4, 8, 64, true, 100)] {
        let eps = 1e-6f32;
        let cd = 2 * hk * sd + hv * sd;
        let conv = noise(n * cd, 1);
        let z = noise(n * hv * sd, 2);
        let beta = noise(n * hv, 3);
        let alpha = noise(n * hv, 4);
        let dt = noise(hv, 5);
        let a: Vec<f32> = noise(hv, 6).iter().map(|v| -v.abs() - 0.1).collect();
        let w = noise(sd, 7);
        let up = |v: &[f32]| g.upload_f32(v).unwrap();
        let (cvd, zd, bd, ald, dtd, ad, wd) = (up(&conv), up(&z), up(&beta), up(&alpha), up(&dt), up(&a), up(&w));
        // token by token
        let mut s1 = g.zeros(hv * sd * sd * 4).unwrap();
        g.zero(&mut s1).unwrap();
        let o1 = g.zeros(hv * sd * 4).unwrap();
        let mut want = Vec::new();
        for t in 0..n {
            let at = |b: &xwen_cuda::gpu::DevBuf, w: usize| Arg::Ptr(b.at(t * w * 4));
            g.launch(
                "delta_step",
                (hv as u32, 1),
                256,
                0,
                &[
                    at(&cvd, cd),
                    at(&zd, hv * sd),
                    at(&bd, hv),
                    at(&ald, hv),
                    Arg::Ptr(dtd.ptr),
                    Arg::Ptr(ad.ptr),
                    Arg::Ptr(s1.ptr),
                    Arg::Ptr(wd.ptr),
                    Arg::Ptr(o1.ptr),
                    Arg::I32(hk as i32),
                    Arg::I32(hv as i32),
                    Arg::I32(sd as i32),
                    Arg::I32(tiled as i32),
                    Arg::F32(eps),
                    Arg::I32(1),
                ],
            )
            .unwrap();
            want.extend(g.read_f32(&o1, hv * sd).unwrap());
        }
        // the pass
        let mut s2 = g.zeros(hv * sd * sd * 4).unwrap();
        g.zero(&mut s2).unwrap();
        let (qn, kn, gb, oraw, out) = (
            g.zeros(n * hk * sd * 4).unwrap(),
            g.zeros(n * hk * sd * 4).unwrap(),
            g.zeros(n * hv * 8).unwrap(),
            g.zeros(n * hv * sd * 4).unwrap(),
            g.zeros(n * hv * sd * 4).unwrap(),
        );
        g.launch(
            "delta_prep",
            (hk as u32, n as u32),
            32,
            0,
            &[
                Arg::Ptr(cvd.ptr),
                Arg::Ptr(bd.ptr),
                Arg::Ptr(ald.ptr),
                Arg::Ptr(dtd.ptr),
                Arg::Ptr(ad.ptr),
                Arg::Ptr(qn.ptr),
                Arg::Ptr(kn.ptr),
                Arg::Ptr(gb.ptr),
                Arg::I32(hk as i32),
                Arg::I32(hv as i32),
                Arg::I32(sd as i32),
                Arg::I32(tiled as i32),
                Arg::F32(eps),
            ],
        )
        .unwrap();
        g.launch(
            "delta_rows",
            (hv as u32, sd.div_ceil(8) as u32),
            128,
            0,
            &[
                Arg::Ptr(qn.ptr),
                Arg::Ptr(kn.ptr),
                Arg::Ptr(cvd.ptr),
                Arg::Ptr(gb.ptr),
                Arg::Ptr(s2.ptr),
                Arg::Ptr(oraw.ptr),
                Arg::I32(hk as i32),
                Arg::I32(hv as i32),
                Arg::I32(sd as i32),
                Arg::I32(tiled as i32),
                Arg::I32(n as i32),
                Arg::Ptr(0),
                Arg::Ptr(0),
                Arg::Ptr(0),
            ],
        )
        .unwrap();
        g.launch(
            "delta_out",
            (hv as u32, n as u32),
            128,
            0,
            &[Arg::Ptr(oraw.ptr), Arg::Ptr(zd.ptr), Arg::Ptr(wd.ptr), Arg::Ptr(out.ptr), Arg::I32(hv as i32), Arg::I32(sd as i32), Arg::F32(eps), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0)],
        )
        .unwrap();
        let got = g.read_f32(&out, n * hv * sd).unwrap();
        let worst = got.iter().zip(&want).map(|(a, b)| ((a - b).abs() / (1.0 + b.abs())) as f64).fold(0.0, f64::max);
        let (st1, st2) = (g.read_f32(&s1, hv * sd * sd).unwrap(), g.read_f32(&s2, hv * sd * sd).unwrap());
        let worst_s = st1.iter().zip(&st2).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
        println!("delta scan hk {hk} hv {hv} sd {sd} tiled {tiled} n {n}: outputs within {worst:.2e}, states within {worst_s:.2e} of the token steps");
        assert!(worst < 1e-5 && worst_s < 1e-5, "scan vs steps: {worst} / {worst_s}");
        // decode's one-launch scan (delta_step_rows, then delta_out) token after token
        let mut s3 = g.zeros(hv * sd * sd * 4).unwrap();
        g.zero(&mut s3).unwrap();
        let (o3, out3) = (g.zeros(hv * sd * 4).unwrap(), g.zeros(hv * sd * 4).unwrap());
        let mut got3 = Vec::new();
        for t in 0..n {
            let at = |b: &xwen_cuda::gpu::DevBuf, w: usize| Arg::Ptr(b.at(t * w * 4));
            let step_args = [
                at(&cvd, cd),
                at(&bd, hv),
                at(&ald, hv),
                Arg::Ptr(dtd.ptr),
                Arg::Ptr(ad.ptr),
                Arg::Ptr(s3.ptr),
                Arg::Ptr(o3.ptr),
                Arg::I32(hk as i32),
                Arg::I32(hv as i32),
                Arg::I32(sd as i32),
                Arg::I32(tiled as i32),
                Arg::F32(eps),
                Arg::Ptr(0),
            ];
            g.launch("delta_step_rows", (hv as u32, sd.div_ceil(8) as u32), 128, 0, &step_args).unwrap();
            g.launch(
                "delta_out",
                (hv as u32, 1),
                128,
                0,
                &[Arg::Ptr(o3.ptr), at(&zd, hv * sd), Arg::Ptr(wd.ptr), Arg::Ptr(out3.ptr), Arg::I32(hv as i32), Arg::I32(sd as i32), Arg::F32(eps), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0)],
            )
            .unwrap();
            got3.extend(g.read_f32(&out3, hv * sd).unwrap());
        }
        let st3 = g.read_f32(&s3, hv * sd * sd).unwrap();
        let same = got3.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()) && st3.iter().zip(&st2).all(|(a, b)| a.to_bits() == b.to_bits());
        println!("delta_step_rows hk {hk} hv {hv} sd {sd} tiled {tiled} n {n}: {} the pass's outputs and state", if same { "bit for bit" } else { "differs from" });
        assert!(same, "the decode scan differs from the pass's");
    }
}

/// The decode products' activations as ggml's reference quantizers make them (kind 0:
/// quantize_row_q8_K_ref, one scale a 256; kind 1: quantize_row_q8_0_ref, an f16 scale a 32):
/// the int8 values and each value's scale.
fn quantize_ref(x: &[f32], kind: u32) -> (Vec<i8>, Vec<f32>) {
    let bw = if kind == 0 { 256 } else { 32 };
    let (mut q, mut sc) = (Vec::with_capacity(x.len()), Vec::with_capacity(x.len()));
    for b in x.chunks(bw) {
        if kind == 0 {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in b {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let iscale = if amax > 0.0 { -127.0 / max } else { 0.0 };
            q.extend(b.iter().map(|&v| if amax > 0.0 { ((iscale * v).round_ties_even() as i32).min(127) as i8 } else { 0 }));
            sc.extend(std::iter::repeat_n(if amax > 0.0 { 1.0 / iscale } else { 0.0 }, b.len()));
        } else {
            let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            q.extend(b.iter().map(|&v| (v * id).round() as i8));
            let dh = xwen_kernels::half::f16_to_f32(xwen_kernels::half::f32_to_f16(d));
            sc.extend(std::iter::repeat_n(dh, b.len()));
        }
    }
    (q, sc)
}

/// quant_q8 of both kinds value for value against ggml's reference quantizers, then `mv` on
/// those activations against Σ w·x̂ in f64 (x̂ the reference's dequantized activations): the
/// products take the CPU's quantized inputs, so only the order of f32 sums lies between them.
/// F32 and Q4_0 weights, with no q8 path, keep f32 activations.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn decode_products_on_q8_activations_match_the_reference() {
    let g = gpu();
    let types = [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::F32, GgmlType::Q4_0];
    for (i, ty) in types.into_iter().enumerate() {
        for &(rows, cols, n_mat, slots) in &[(37usize, 256usize, 1usize, 1usize), (130, 2048, 1, 1), (64, 768, 5, 3), (9, 4608, 1, 2)] {
            let seed = 3000 + 10 * i as u64 + cols as u64;
            let w_f32 = noise(n_mat * rows * cols, seed);
            let data = xwen_kernels::quantize(ty, &w_f32).expect("quantize");
            let mut deq = vec![0.0f32; n_mat * rows * cols];
            xwen_kernels::dequantize(ty, &data, &mut deq).unwrap();
            let mut x: Vec<f32> = noise(slots * cols, seed + 1).iter().map(|v| v * 3.0).collect();
            x[5] = 0.0;
            if cols >= 512 {
                x[256..288].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
            }
            let ids: Vec<i32> = (0..slots).map(|s| ((s * 3 + 1) % n_mat) as i32).collect();
            let rb = device_row_bytes(ty, cols);
            let (wd, xd, idd) = (g.upload(&device_layout(ty, &data)).unwrap(), g.upload_f32(&x).unwrap(), g.upload_i32(&ids).unwrap());
            let yd = g.zeros(slots * rows * 4).unwrap();
            let mut q8 = Vec::new();
            for kind in [0u32, 1] {
                let (xqd, xdd) = (g.zeros(slots * cols).unwrap(), g.zeros(slots * cols / 32 * 8).unwrap());
                let per = if kind == 0 { 256 } else { 32 };
                g.launch(
                    "quant_q8",
                    ((cols / per).div_ceil(8) as u32, slots as u32),
                    256,
                    0,
                    &[Arg::Ptr(xd.ptr), Arg::I32(cols as i32), Arg::I64(cols as i64), Arg::Ptr(xqd.ptr), Arg::Ptr(xdd.ptr), Arg::I32(kind as i32)],
                )
                .unwrap();
                let (want_q, want_s) = quantize_ref(&x, kind);
                let got_q: Vec<i8> = g.read_i32(&xqd, slots * cols / 4).unwrap().iter().flat_map(|w| w.to_le_bytes()).map(|b| b as i8).collect();
                let got_d = g.read_f32(&xdd, slots * cols / 32 * 2).unwrap();
                assert_eq!(got_q, want_q, "quant_q8 kind {kind}: values");
                for b in 0..slots * cols / 32 {
                    let s: i32 = want_q[32 * b..32 * b + 32].iter().map(|&v| v as i32).sum();
                    assert_eq!(got_d[2 * b], want_s[32 * b], "quant_q8 kind {kind}: scale of block {b}");
                    assert!((got_d[2 * b + 1] - want_s[32 * b] * s as f32).abs() <= 1e-6 * (1.0 + got_d[2 * b + 1].abs()), "quant_q8 kind {kind}: Σ of block {b}");
                }
                let xhat: Vec<f64> = want_q.iter().zip(&want_s).map(|(&q, &d)| q as f64 * d as f64).collect();
                q8.push((xqd, xdd, xhat));
            }
            g.launch(
                "mv",
                (rows.div_ceil(4 * g.knobs.mv_rows) as u32, slots as u32),
                128,
                0,
                &[
                    Arg::Ptr(wd.ptr),
                    Arg::I32(ty.id() as i32),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I64(rb as i64),
                    Arg::I64((rows * rb) as i64),
                    Arg::Ptr(idd.ptr),
                    Arg::Ptr(xd.ptr),
                    Arg::Ptr(q8[0].0.ptr),
                    Arg::Ptr(q8[0].1.ptr),
                    Arg::Ptr(q8[1].0.ptr),
                    Arg::Ptr(q8[1].1.ptr),
                    Arg::I64(cols as i64),
                    Arg::I32(1),
                    Arg::Ptr(yd.ptr),
                    Arg::I64(rows as i64),
                    Arg::Ptr(0),
                ],
            )
            .unwrap();
            let y = g.read_f32(&yd, slots * rows).unwrap();
            let xhat = match ty {
                GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => Some(&q8[0].2),
                GgmlType::Q8_0 => Some(&q8[1].2),
                _ => None,
            };
            let mut worst = 0.0f64;
            for s in 0..slots {
                let e = ids[s] as usize;
                for r in 0..rows {
                    let w = &deq[(e * rows + r) * cols..][..cols];
                    let xs: Vec<f64> = match xhat {
                        Some(xh) => xh[s * cols..][..cols].to_vec(),
                        None => x[s * cols..][..cols].iter().map(|&v| v as f64).collect(),
                    };
                    let want: f64 = w.iter().zip(&xs).map(|(&a, &b)| a as f64 * b).sum();
                    let mag: f64 = w.iter().zip(&xs).map(|(&a, &b)| (a as f64 * b).abs()).sum();
                    let err = (y[s * rows + r] as f64 - want).abs();
                    let bound = 2e-5 * mag + 1e-6;
                    assert!(err <= bound, "q8 mv {} {rows}x{cols} slot {s} row {r}: gpu {} want {want} (err {err:.3e} > {bound:.3e})", ty.name(), y[s * rows + r]);
                    worst = worst.max(err / mag.max(1e-30));
                }
            }
            println!("mv q8 {:>5} {rows:>4}x{cols:<5} {slots} slot(s): worst |err|/Σ|wx̂| {worst:.2e}", ty.name());
        }
    }
}

/// mv4 (a layer's input projections in one launch) equals `mv` of each part, bit for bit.
/// q8_K and q8_0 copies of `n` rows of `cols` values (quant_q8), for the row products.
fn q8_rows(g: &Gpu, x: &xwen_cuda::gpu::DevBuf, cols: usize, n: usize) -> Vec<(xwen_cuda::gpu::DevBuf, xwen_cuda::gpu::DevBuf)> {
    [0i32, 1]
        .iter()
        .map(|&kind| {
            let (xq, xs) = (g.zeros(n * cols).unwrap(), g.zeros(n * cols / 32 * 8).unwrap());
            let per = if kind == 0 { 256 } else { 32 };
            g.launch("quant_q8", ((cols / per).div_ceil(8) as u32, n as u32), 256, 0, &[Arg::Ptr(x.ptr), Arg::I32(cols as i32), Arg::I64(cols as i64), Arg::Ptr(xq.ptr), Arg::Ptr(xs.ptr), Arg::I32(kind)])
                .unwrap();
            (xq, xs)
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn decode_batch_products_give_each_row_the_bits_of_mv_alone() {
    // mv_cols and mv4_cols (a warp a weight row and several rows of a decode batch) against mv
    // and mv4 on each row alone: bit for bit, for every type, batch sizes around the column
    // group, with and without a residual
    let g = gpu();
    let types = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0];
    for (i, ty) in types.into_iter().enumerate() {
        let (rows, cols) = (70usize, 512usize);
        let data = xwen_kernels::quantize(ty, &noise(rows * cols, 500 + i as u64)).unwrap();
        let rb = device_row_bytes(ty, cols);
        let wd = g.upload(&device_layout(ty, &data)).unwrap();
        for n in [2usize, 3, 8, 9, 17] {
            let x = noise(n * cols, 600 + n as u64);
            let xd = g.upload_f32(&x).unwrap();
            let q8 = q8_rows(&g, &xd, cols, n);
            let res = noise(n * rows, 700 + n as u64);
            for with_res in [false, true] {
                let batch = g.upload_f32(&res).unwrap();
                let y_res = if with_res { batch.ptr } else { 0 };
                g.launch(
                    "mv_cols",
                    ((rows.div_ceil(4) * n.div_ceil(g.knobs.mv_cols)) as u32, 1),
                    128,
                    0,
                    &[
                        Arg::Ptr(wd.ptr),
                        Arg::I32(ty.id() as i32),
                        Arg::I32(rows as i32),
                        Arg::I32(cols as i32),
                        Arg::I64(rb as i64),
                        Arg::Ptr(xd.ptr),
                        Arg::Ptr(q8[0].0.ptr),
                        Arg::Ptr(q8[0].1.ptr),
                        Arg::Ptr(q8[1].0.ptr),
                        Arg::Ptr(q8[1].1.ptr),
                        Arg::I64(cols as i64),
                        Arg::I32(n as i32),
                        Arg::Ptr(batch.ptr),
                        Arg::I64(rows as i64),
                        Arg::Ptr(y_res),
                    ],
                )
                .unwrap();
                let got = g.read_f32(&batch, n * rows).unwrap();
                for t in 0..n {
                    let one = g.upload_f32(&res[t * rows..(t + 1) * rows]).unwrap();
                    let at = |b: &xwen_cuda::gpu::DevBuf, w: usize| Arg::Ptr(b.at(t * w));
                    g.launch(
                        "mv",
                        (rows.div_ceil(4 * g.knobs.mv_rows) as u32, 1),
                        128,
                        0,
                        &[
                            Arg::Ptr(wd.ptr),
                            Arg::I32(ty.id() as i32),
                            Arg::I32(rows as i32),
                            Arg::I32(cols as i32),
                            Arg::I64(rb as i64),
                            Arg::I64((rows * rb) as i64),
                            Arg::Ptr(0),
                            at(&xd, cols * 4),
                            at(&q8[0].0, cols),
                            at(&q8[0].1, cols / 32 * 8),
                            at(&q8[1].0, cols),
                            at(&q8[1].1, cols / 32 * 8),
                            Arg::I64(cols as i64),
                            Arg::I32(1),
                            Arg::Ptr(one.ptr),
                            Arg::I64(rows as i64),
                            Arg::Ptr(if with_res { one.ptr } else { 0 }),
                        ],
                    )
                    .unwrap();
                    let want = g.read_f32(&one, rows).unwrap();
                    let (a, b): (Vec<u32>, Vec<u32>) = (got[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect(), want.iter().map(|v| v.to_bits()).collect());
                    assert_eq!(a, b, "mv_cols {ty:?}: batch of {n}, row {t}, residual {with_res}");
                }
            }
            // mv4_cols: two parts, each batch row as mv4 gives it alone
            let parts = [(rows, g.zeros(n * rows * 4).unwrap()), (33usize, g.zeros(n * 33 * 4).unwrap())];
            let mv4_args = |x: u64, q: [u64; 4], ys: [u64; 2], n_col: usize| {
                let mut a = vec![Arg::I32(cols as i32), Arg::Ptr(x), Arg::Ptr(q[0]), Arg::Ptr(q[1]), Arg::Ptr(q[2]), Arg::Ptr(q[3])];
                for (k, (r, _)) in parts.iter().enumerate() {
                    a.extend([Arg::Ptr(wd.ptr), Arg::I32(ty.id() as i32), Arg::I32(*r as i32), Arg::I64(rb as i64), Arg::Ptr(ys[k])]);
                }
                for _ in 0..2 {
                    a.extend([Arg::Ptr(0), Arg::I32(0), Arg::I32(0), Arg::I64(0), Arg::Ptr(0)]);
                }
                a.push(Arg::I32(n_col as i32));
                a.extend([Arg::Ptr(0), Arg::Ptr(0), Arg::I32(0), Arg::Ptr(0)]);
                a
            };
            let total = rows + 33;
            let q = [q8[0].0.ptr, q8[0].1.ptr, q8[1].0.ptr, q8[1].1.ptr];
            g.launch("mv4_cols", ((total.div_ceil(4) * n.div_ceil(g.knobs.mv_cols)) as u32, 1), 128, 0, &mv4_args(xd.ptr, q, [parts[0].1.ptr, parts[1].1.ptr], n)).unwrap();
            for t in 0..n {
                let one = [g.zeros(rows * 4).unwrap(), g.zeros(33 * 4).unwrap()];
                let qt = [q8[0].0.at(t * cols), q8[0].1.at(t * cols / 32 * 8), q8[1].0.at(t * cols), q8[1].1.at(t * cols / 32 * 8)];
                g.launch("mv4", (total.div_ceil(4) as u32, 1), 128, 0, &mv4_args(xd.at(t * cols * 4), qt, [one[0].ptr, one[1].ptr], 1)).unwrap();
                for (k, (r, batch)) in parts.iter().enumerate() {
                    let got: Vec<u32> = g.read_f32(batch, n * r).unwrap()[t * r..(t + 1) * r].iter().map(|v| v.to_bits()).collect();
                    let want: Vec<u32> = g.read_f32(&one[k], *r).unwrap().iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "mv4_cols {ty:?}: batch of {n}, row {t}, part {k}");
                }
            }
            // mv_glu_cols: a dense FFN's gate, up and SwiGLU, each batch row as mv_glu alone
            let hb = g.zeros(n * rows * 4).unwrap();
            let glu_args = |x: u64, q: [u64; 4], h: u64, n_col: usize, batch: bool| {
                let mut a = vec![Arg::Ptr(wd.ptr), Arg::Ptr(wd.ptr), Arg::I32(ty.id() as i32), Arg::I32(ty.id() as i32), Arg::I32(rows as i32), Arg::I32(cols as i32), Arg::I64(rb as i64), Arg::I64(rb as i64)];
                if !batch {
                    a.extend([Arg::I64((rows * rb) as i64), Arg::I64((rows * rb) as i64), Arg::Ptr(0)]);
                }
                a.extend([Arg::Ptr(x), Arg::Ptr(q[0]), Arg::Ptr(q[1]), Arg::Ptr(q[2]), Arg::Ptr(q[3]), Arg::I64(cols as i64)]);
                a.push(Arg::I32(if batch { n_col as i32 } else { 1 }));
                a.extend([Arg::Ptr(h), Arg::I64(rows as i64)]);
                a
            };
            g.launch("mv_glu_cols", ((rows.div_ceil(4) * n.div_ceil(g.knobs.mv_cols)) as u32, 1), 128, 0, &glu_args(xd.ptr, q, hb.ptr, n, true)).unwrap();
            let got_h = g.read_f32(&hb, n * rows).unwrap();
            for t in 0..n {
                let one = g.zeros(rows * 4).unwrap();
                let qt = [q8[0].0.at(t * cols), q8[0].1.at(t * cols / 32 * 8), q8[1].0.at(t * cols), q8[1].1.at(t * cols / 32 * 8)];
                g.launch("mv_glu", (rows.div_ceil(4) as u32, 1), 128, 0, &glu_args(xd.at(t * cols * 4), qt, one.ptr, 1, false)).unwrap();
                let want: Vec<u32> = g.read_f32(&one, rows).unwrap().iter().map(|v| v.to_bits()).collect();
                let got: Vec<u32> = got_h[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "mv_glu_cols {ty:?}: batch of {n}, row {t}");
            }
        }
        eprintln!("decode batch products {ty:?}: every row's bits alone (batches of 2 to 17)");
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn fused_input_projections_equal_one_product_each() {
    let g = gpu();
    let cols = 512;
    let parts = [(GgmlType::Q4_K, 70usize), (GgmlType::Q6_K, 33), (GgmlType::F32, 5), (GgmlType::Q8_0, 8)];
    let x = noise(cols, 9);
    let xd = g.upload_f32(&x).unwrap();
    let mut mats = Vec::new();
    for (i, &(ty, rows)) in parts.iter().enumerate() {
        let data = xwen_kernels::quantize(ty, &noise(rows * cols, 20 + i as u64)).unwrap();
        mats.push((g.upload(&device_layout(ty, &data)).unwrap(), ty, rows, g.zeros(rows * 4).unwrap(), g.zeros(rows * 4).unwrap()));
    }
    let mut args = vec![Arg::I32(cols as i32), Arg::Ptr(xd.ptr), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0), Arg::Ptr(0)];
    for (w, ty, rows, y, _) in &mats {
        args.extend([Arg::Ptr(w.ptr), Arg::I32(ty.id() as i32), Arg::I32(*rows as i32), Arg::I64(device_row_bytes(*ty, cols) as i64), Arg::Ptr(y.ptr)]);
    }
    let total: usize = parts.iter().map(|p| p.1).sum();
    args.extend([Arg::I32(1), Arg::Ptr(0), Arg::Ptr(0), Arg::I32(0), Arg::Ptr(0)]);
    g.launch("mv4", (total.div_ceil(4) as u32, 1), 128, 0, &args).unwrap();
    for (w, ty, rows, y, y1) in &mats {
        let rb = device_row_bytes(*ty, cols);
        g.launch(
            "mv",
            (rows.div_ceil(4 * g.knobs.mv_rows) as u32, 1),
            128,
            0,
            &[
                Arg::Ptr(w.ptr),
                Arg::I32(ty.id() as i32),
                Arg::I32(*rows as i32),
                Arg::I32(cols as i32),
                Arg::I64(rb as i64),
                Arg::I64((rows * rb) as i64),
                Arg::Ptr(0),
                Arg::Ptr(xd.ptr),
                Arg::Ptr(0),
                Arg::Ptr(0),
                Arg::Ptr(0),
                Arg::Ptr(0),
                Arg::I64(cols as i64),
                Arg::I32(1),
                Arg::Ptr(y1.ptr),
                Arg::I64(*rows as i64),
                Arg::Ptr(0),
            ],
        )
        .unwrap();
        let (a, b) = (g.read_f32(y, *rows).unwrap(), g.read_f32(y1, *rows).unwrap());
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "mv4 part {} differs from mv", ty.name());
    }
    println!("mv4: 4 parts equal to mv, bit for bit");
}

/// The prompt pass's convolution (conv_prompt over every token at once, conv_shift) equals
/// conv_step token after token, outputs and state, bit for bit.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_prompt_convolution_equals_the_token_steps() {
    let g = gpu();
    for &(cd, kernel, n) in &[(300usize, 4usize, 1usize), (300, 4, 2), (8192, 4, 77), (64, 2, 5)] {
        let taps = noise(kernel * cd, 1);
        let state0 = noise((kernel - 1) * cd, 2);
        let x = noise(n * cd, 3);
        let (td, xd) = (g.upload_f32(&taps).unwrap(), g.upload_f32(&x).unwrap());
        let (s1, s2) = (g.upload_f32(&state0).unwrap(), g.upload_f32(&state0).unwrap());
        let (o1, o2) = (g.zeros(n * cd * 4).unwrap(), g.zeros(n * cd * 4).unwrap());
        for t in 0..n {
            g.launch(
                "conv_step",
                (cd.div_ceil(256) as u32, 1),
                256,
                0,
                &[Arg::Ptr(xd.at(t * cd * 4)), Arg::Ptr(s1.ptr), Arg::Ptr(td.ptr), Arg::Ptr(o1.at(t * cd * 4)), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(1), Arg::Ptr(0), Arg::Ptr(0)],
            )
            .unwrap();
        }
        g.launch(
            "conv_prompt",
            ((n * cd).div_ceil(256) as u32, 1),
            256,
            0,
            &[Arg::Ptr(xd.ptr), Arg::Ptr(s2.ptr), Arg::Ptr(td.ptr), Arg::Ptr(o2.ptr), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(n as i32), Arg::Ptr(0), Arg::Ptr(0)],
        )
        .unwrap();
        g.launch(
            "conv_shift",
            (cd.div_ceil(256) as u32, 1),
            256,
            0,
            &[Arg::Ptr(xd.ptr), Arg::Ptr(s2.ptr), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(n as i32), Arg::Ptr(0), Arg::Ptr(0)],
        )
        .unwrap();
        let bits = |b: &xwen_cuda::gpu::DevBuf, len: usize| g.read_f32(b, len).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&o1, n * cd), bits(&o2, n * cd), "conv outputs, cd {cd} kernel {kernel} n {n}");
        if kernel > 1 {
            assert_eq!(bits(&s1, (kernel - 1) * cd), bits(&s2, (kernel - 1) * cd), "conv state, cd {cd} kernel {kernel} n {n}");
        }
        println!("conv prompt cd {cd} kernel {kernel} n {n}: outputs and state equal to the token steps");
    }
}

/// A decode step's convolution inside the qkv product's launch (mv4 / mv4_cols with taps: each
/// batch row's qkv outputs convolved against its own sequence's conv state, from the batch
/// table) equals the product, then conv_step over the batch: the products, the convolved rows
/// and every row's state, bit for bit.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_convolution_inside_the_qkv_product_equals_conv_step() {
    let g = gpu();
    let (cols, kernel) = (512usize, 4usize);
    for &(ty, cd, n) in &[(GgmlType::Q4_K, 384usize, 1usize), (GgmlType::Q6_K, 320, 5), (GgmlType::Q8_0, 256, 11)] {
        let seed = 1700 + n as u64;
        let wd = g.upload(&device_layout(ty, &xwen_kernels::quantize(ty, &noise(cd * cols, seed)).unwrap())).unwrap();
        let rb = device_row_bytes(ty, cols);
        let xd = g.upload_f32(&noise(n * cols, seed + 1)).unwrap();
        let xq = q8_rows(&g, &xd, cols, n);
        let taps = g.upload_f32(&noise(kernel * cd, seed + 2)).unwrap();
        let state0: Vec<Vec<f32>> = (0..n).map(|t| noise((kernel - 1) * cd, seed + 10 + t as u64)).collect();
        let (s1, s2): (Vec<_>, Vec<_>) = state0.iter().map(|s| (g.upload_f32(s).unwrap(), g.upload_f32(s).unwrap())).unzip();
        let table = |ss: &[xwen_cuda::gpu::DevBuf]| g.upload(&ss.iter().flat_map(|b| [b.ptr, 0]).flat_map(|p| p.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let (t1, t2) = (table(&s1), table(&s2));
        let (y1, y2, c1, c2) = (g.zeros(n * cd * 4).unwrap(), g.zeros(n * cd * 4).unwrap(), g.zeros(n * cd * 4).unwrap(), g.zeros(n * cd * 4).unwrap());
        let launch = |y: u64, conv: [Arg; 4]| {
            let mut a = vec![Arg::I32(cols as i32), Arg::Ptr(xd.ptr), Arg::Ptr(xq[0].0.ptr), Arg::Ptr(xq[0].1.ptr), Arg::Ptr(xq[1].0.ptr), Arg::Ptr(xq[1].1.ptr)];
            a.extend([Arg::Ptr(wd.ptr), Arg::I32(ty.id() as i32), Arg::I32(cd as i32), Arg::I64(rb as i64), Arg::Ptr(y)]);
            for _ in 0..3 {
                a.extend([Arg::Ptr(0), Arg::I32(0), Arg::I32(0), Arg::I64(0), Arg::Ptr(0)]);
            }
            a.push(Arg::I32(n as i32));
            a.extend(conv);
            let (name, per) = if n == 1 { ("mv4", 1) } else { ("mv4_cols", g.knobs.mv_cols) };
            g.launch(name, ((cd.div_ceil(4) * n.div_ceil(per)) as u32, 1), 128, 0, &a).unwrap();
        };
        // the product, then the convolution's own launch
        launch(y1.ptr, [Arg::Ptr(0), Arg::Ptr(0), Arg::I32(0), Arg::Ptr(0)]);
        let conv_args = [Arg::Ptr(y1.ptr), Arg::Ptr(0), Arg::Ptr(taps.ptr), Arg::Ptr(c1.ptr), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(1), Arg::Ptr(t1.ptr), Arg::Ptr(0)];
        g.launch("conv_step", (cd.div_ceil(256) as u32, n as u32), 256, 0, &conv_args).unwrap();
        // both in one launch
        launch(y2.ptr, [Arg::Ptr(taps.ptr), Arg::Ptr(c2.ptr), Arg::I32(kernel as i32), Arg::Ptr(t2.ptr)]);
        let bits = |b: &xwen_cuda::gpu::DevBuf, len: usize| g.read_f32(b, len).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&y1, n * cd), bits(&y2, n * cd), "{}: the qkv rows", ty.name());
        assert_eq!(bits(&c1, n * cd), bits(&c2, n * cd), "{}: the convolved rows", ty.name());
        for t in 0..n {
            assert_eq!(bits(&s1[t], (kernel - 1) * cd), bits(&s2[t], (kernel - 1) * cd), "{}: row {t}'s conv state", ty.name());
        }
        println!("mv4 with the convolution, {} batch of {n}: products, convolved rows and states equal to conv_step's", ty.name());
    }
}

/// A pass of several sequences' prompt spans back to back (the spans table: each span's first
/// row and length, each row's place in its span; each row's states from the batch table)
/// convolves and scans each span as its own pass does: conv_prompt / conv_shift and delta_rows
/// over the spans together equal each span alone, outputs and states, bit for bit.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn prompt_spans_convolve_and_scan_as_each_alone() {
    let g = gpu();
    let (hk, hv, sd, kernel) = (2usize, 4usize, 128usize, 4usize);
    let cd = 2 * hk * sd + hv * sd;
    let lens = [37usize, 9, 2, 1];
    let n: usize = lens.iter().sum();
    let firsts: Vec<usize> = lens.iter().scan(0, |a, &l| { let f = *a; *a += l; Some(f) }).collect();
    let up = |v: &[f32]| g.upload_f32(v).unwrap();
    let (taps, x) = (up(&noise(kernel * cd, 1)), up(&noise(n * cd, 2)));
    let (qn, kn, gb) = (up(&noise(n * hk * sd, 3)), up(&noise(n * hk * sd, 4)), up(&noise(n * hv * 2, 5).iter().map(|v| v.abs() * 0.9).collect::<Vec<f32>>()));
    let conv0: Vec<Vec<f32>> = (0..lens.len()).map(|s| noise((kernel - 1) * cd, 10 + s as u64)).collect();
    let s0: Vec<Vec<f32>> = (0..lens.len()).map(|s| noise(hv * sd * sd, 20 + s as u64).iter().map(|v| v * 0.1).collect()).collect();
    let bits = |b: &xwen_cuda::gpu::DevBuf, at: usize, len: usize| g.read_f32_at(b, at, len).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    // each span alone
    let (o_conv1, o_scan1) = (g.zeros(n * cd * 4).unwrap(), g.zeros(n * hv * sd * 4).unwrap());
    let (c1, st1): (Vec<_>, Vec<_>) = (0..lens.len()).map(|s| (up(&conv0[s]), up(&s0[s]))).unzip();
    for (s, (&len, &f)) in lens.iter().zip(&firsts).enumerate() {
        let conv_args = [Arg::Ptr(x.at(f * cd * 4)), Arg::Ptr(c1[s].ptr), Arg::Ptr(taps.ptr), Arg::Ptr(o_conv1.at(f * cd * 4)), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(len as i32), Arg::Ptr(0), Arg::Ptr(0)];
        g.launch("conv_prompt", ((len * cd).div_ceil(256) as u32, 1), 256, 0, &conv_args).unwrap();
        let shift = [Arg::Ptr(x.at(f * cd * 4)), Arg::Ptr(c1[s].ptr), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(len as i32), Arg::Ptr(0), Arg::Ptr(0)];
        g.launch("conv_shift", (cd.div_ceil(256) as u32, 1), 256, 0, &shift).unwrap();
        let scan = [
            Arg::Ptr(qn.at(f * hk * sd * 4)),
            Arg::Ptr(kn.at(f * hk * sd * 4)),
            Arg::Ptr(x.at(f * cd * 4)),
            Arg::Ptr(gb.at(f * hv * 8)),
            Arg::Ptr(st1[s].ptr),
            Arg::Ptr(o_scan1.at(f * hv * sd * 4)),
            Arg::I32(hk as i32),
            Arg::I32(hv as i32),
            Arg::I32(sd as i32),
            Arg::I32(1),
            Arg::I32(len as i32),
            Arg::Ptr(0),
            Arg::Ptr(0),
            Arg::Ptr(0),
        ];
        g.launch_3d("delta_rows", (hv as u32, sd.div_ceil(8) as u32, 1), 128, 0, &scan).unwrap();
    }
    // the spans together: states through the batch table (two pointers a row), the spans table
    let (o_conv2, o_scan2) = (g.zeros(n * cd * 4).unwrap(), g.zeros(n * hv * sd * 4).unwrap());
    let (c2, st2): (Vec<_>, Vec<_>) = (0..lens.len()).map(|s| (up(&conv0[s]), up(&s0[s]))).unzip();
    let mut tab = Vec::new();
    let mut seg = Vec::new();
    let mut off = Vec::new();
    for (s, (&len, &f)) in lens.iter().zip(&firsts).enumerate() {
        seg.extend([f as i32, len as i32]);
        for t in 0..len {
            tab.extend([c2[s].ptr, st2[s].ptr]);
            off.push(t as i32);
        }
    }
    let tab_d = g.upload(&tab.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    let (seg_d, off_d) = (g.upload_i32(&seg).unwrap(), g.upload_i32(&off).unwrap());
    let conv_args = [Arg::Ptr(x.ptr), Arg::Ptr(0), Arg::Ptr(taps.ptr), Arg::Ptr(o_conv2.ptr), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(n as i32), Arg::Ptr(off_d.ptr), Arg::Ptr(tab_d.ptr)];
    g.launch("conv_prompt", ((n * cd).div_ceil(256) as u32, 1), 256, 0, &conv_args).unwrap();
    let shift = [Arg::Ptr(x.ptr), Arg::Ptr(0), Arg::I32(cd as i32), Arg::I32(kernel as i32), Arg::I32(n as i32), Arg::Ptr(seg_d.ptr), Arg::Ptr(tab_d.ptr)];
    g.launch("conv_shift", (cd.div_ceil(256) as u32, lens.len() as u32), 256, 0, &shift).unwrap();
    let scan = [
        Arg::Ptr(qn.ptr),
        Arg::Ptr(kn.ptr),
        Arg::Ptr(x.ptr),
        Arg::Ptr(gb.ptr),
        Arg::Ptr(0),
        Arg::Ptr(o_scan2.ptr),
        Arg::I32(hk as i32),
        Arg::I32(hv as i32),
        Arg::I32(sd as i32),
        Arg::I32(1),
        Arg::I32(n as i32),
        Arg::Ptr(tab_d.ptr),
        Arg::Ptr(0),
        Arg::Ptr(seg_d.ptr),
    ];
    g.launch_3d("delta_rows", (hv as u32, sd.div_ceil(8) as u32, lens.len() as u32), 128, 0, &scan).unwrap();
    assert_eq!(bits(&o_conv1, 0, n * cd), bits(&o_conv2, 0, n * cd), "the spans' convolution outputs");
    assert_eq!(bits(&o_scan1, 0, n * hv * sd), bits(&o_scan2, 0, n * hv * sd), "the spans' scan outputs");
    for s in 0..lens.len() {
        assert_eq!(bits(&c1[s], 0, (kernel - 1) * cd), bits(&c2[s], 0, (kernel - 1) * cd), "span {s}'s conv state");
        assert_eq!(bits(&st1[s], 0, hv * sd * sd), bits(&st2[s], 0, hv * sd * sd), "span {s}'s S");
    }
    println!("prompt spans {lens:?}: convolution and scan equal to each span alone, outputs and states");
}

/// `slots` routed slots' ids sorted by expert on the device into tiles of up to `tile` slots of
/// one expert (moe_sort): (the slots in that order, the tiles, how many tiles the launch takes).
fn moe_sort(g: &Gpu, ids: &xwen_cuda::gpu::DevBuf, slots: usize, n_expert: usize, tile: usize) -> (xwen_cuda::gpu::DevBuf, xwen_cuda::gpu::DevBuf, usize) {
    let max_tiles = slots.div_ceil(tile) + n_expert.min(slots);
    let (cnt, off, ord, tiles) = (g.zeros(n_expert * 4).unwrap(), g.zeros(n_expert * 4).unwrap(), g.zeros(slots * 4).unwrap(), g.zeros(max_tiles * 16).unwrap());
    let args = [
        Arg::Ptr(ids.ptr),
        Arg::I32(slots as i32),
        Arg::I32(n_expert as i32),
        Arg::Ptr(cnt.ptr),
        Arg::Ptr(off.ptr),
        Arg::Ptr(ord.ptr),
        Arg::Ptr(tiles.ptr),
        Arg::I32(max_tiles as i32),
        Arg::I32(tile as i32),
    ];
    g.launch("moe_sort", (1, 1), 1024, (n_expert * 8) as u32, &args).unwrap();
    (ord, tiles, max_tiles)
}

/// A decode batch's routed experts grouped per expert (moe_sort into tiles of `MOE_TILE`
/// slots, then moe_glu_tiles and mv_tiles: each expert's words loaded once for a tile) give
/// every slot the bits of its own slot's launches (mv_glu, mv): rows of several tokens, experts
/// shared by up to six slots (more than a tile), a slot another round computes (-1) skipped.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn grouped_decode_experts_give_each_slot_its_bits_alone() {
    let g = gpu();
    let tile = g.knobs.moe_tile;
    for &(ty, dty, n_expert, k, eff, cols, n) in &[(GgmlType::Q4_K, GgmlType::Q6_K, 16usize, 4usize, 512usize, 1024usize, 6usize), (GgmlType::Q8_0, GgmlType::Q8_0, 8, 3, 256, 512, 5)] {
        let seed = 1500 + n as u64;
        let up = |t: GgmlType, rows: usize, c: usize, seed: u64| g.upload(&device_layout(t, &xwen_kernels::quantize(t, &noise(n_expert * rows * c, seed)).unwrap())).unwrap();
        let (eg, eu, ed) = (up(ty, eff, cols, seed), up(ty, eff, cols, seed + 1), up(dty, cols, eff, seed + 2));
        let (rb, drb) = (device_row_bytes(ty, cols), device_row_bytes(dty, eff));
        let slots = n * k;
        let mut ids: Vec<i32> = (0..slots).map(|s| ((s * 7 + s / k) % n_expert) as i32).collect();
        ids[1] = -1;
        let idd = g.upload_i32(&ids).unwrap();
        let xd = g.upload_f32(&noise(n * cols, seed + 3)).unwrap();
        // x as both q8 kinds (each product takes its weight's)
        let xq = q8_rows(&g, &xd, cols, n);
        let (xk, xdk, xz, xdz) = (xq[0].0.ptr, xq[0].1.ptr, xq[1].0.ptr, xq[1].1.ptr);
        // slot by slot
        let (h1, h2) = (g.zeros(slots * eff * 4).unwrap(), g.zeros(slots * eff * 4).unwrap());
        let mut args = vec![Arg::Ptr(eg.ptr), Arg::Ptr(eu.ptr), Arg::I32(ty.id() as i32), Arg::I32(ty.id() as i32), Arg::I32(eff as i32), Arg::I32(cols as i32)];
        args.extend([Arg::I64(rb as i64), Arg::I64(rb as i64), Arg::I64((eff * rb) as i64), Arg::I64((eff * rb) as i64), Arg::Ptr(idd.ptr), Arg::Ptr(xd.ptr)]);
        args.extend([Arg::Ptr(xk), Arg::Ptr(xdk), Arg::Ptr(xz), Arg::Ptr(xdz), Arg::I64(cols as i64), Arg::I32(k as i32), Arg::Ptr(h1.ptr), Arg::I64(eff as i64)]);
        g.launch("mv_glu", (eff.div_ceil(4) as u32, slots as u32), 128, 0, &args).unwrap();
        // grouped
        let (ord, tiles, max_tiles) = moe_sort(&g, &idd, slots, n_expert, tile);
        let mut args = vec![Arg::Ptr(eg.ptr), Arg::Ptr(eu.ptr), Arg::I32(ty.id() as i32), Arg::I32(ty.id() as i32), Arg::I32(eff as i32)];
        args.extend([Arg::I64(rb as i64), Arg::I64(rb as i64), Arg::I64((eff * rb) as i64), Arg::I64((eff * rb) as i64), Arg::Ptr(tiles.ptr), Arg::Ptr(ord.ptr)]);
        args.extend([Arg::I32(k as i32), Arg::I32(cols as i32), Arg::Ptr(xd.ptr), Arg::Ptr(xk), Arg::Ptr(xdk), Arg::Ptr(xz), Arg::Ptr(xdz), Arg::Ptr(h2.ptr)]);
        g.launch("moe_glu_tiles", (eff.div_ceil(2 * g.knobs.moe_glu_rows) as u32, max_tiles as u32), 128, 0, &args).unwrap();
        let live: Vec<usize> = (0..slots).filter(|&s| ids[s] >= 0).collect();
        let rows_of = |b: &xwen_cuda::gpu::DevBuf, w: usize| {
            let v = g.read_i32(b, slots * w).unwrap();
            live.iter().map(|&s| v[s * w..(s + 1) * w].to_vec()).collect::<Vec<_>>()
        };
        assert_eq!(rows_of(&h1, eff), rows_of(&h2, eff), "moe_glu_tiles {}: every slot's hidden row", ty.name());
        // the down products from the hidden rows
        let hq = q8_rows(&g, &h1, eff, slots);
        let (hk, hdk, hz, hdz) = (hq[0].0.ptr, hq[0].1.ptr, hq[1].0.ptr, hq[1].1.ptr);
        let (y1, y2) = (g.zeros(slots * cols * 4).unwrap(), g.zeros(slots * cols * 4).unwrap());
        let mut args = vec![Arg::Ptr(ed.ptr), Arg::I32(dty.id() as i32), Arg::I32(cols as i32), Arg::I32(eff as i32), Arg::I64(drb as i64), Arg::I64((cols * drb) as i64)];
        args.extend([Arg::Ptr(idd.ptr), Arg::Ptr(h1.ptr), Arg::Ptr(hk), Arg::Ptr(hdk), Arg::Ptr(hz), Arg::Ptr(hdz), Arg::I64(eff as i64), Arg::I32(1)]);
        args.extend([Arg::Ptr(y1.ptr), Arg::I64(cols as i64), Arg::Ptr(0)]);
        g.launch("mv", (cols.div_ceil(4 * g.knobs.mv_rows) as u32, slots as u32), 128, 0, &args).unwrap();
        let mut args = vec![Arg::Ptr(ed.ptr), Arg::I32(dty.id() as i32), Arg::I32(cols as i32), Arg::I32(eff as i32), Arg::I64(drb as i64), Arg::I64((cols * drb) as i64)];
        args.extend([Arg::Ptr(tiles.ptr), Arg::Ptr(ord.ptr), Arg::Ptr(h1.ptr), Arg::Ptr(hk), Arg::Ptr(hdk), Arg::Ptr(hz), Arg::Ptr(hdz), Arg::Ptr(y2.ptr), Arg::I64(cols as i64)]);
        g.launch("mv_tiles", (cols.div_ceil(4) as u32, max_tiles as u32), 128, 0, &args).unwrap();
        assert_eq!(rows_of(&y1, cols), rows_of(&y2, cols), "mv_tiles {}: every slot's output row", dty.name());
        println!("grouped decode experts {} / {} ({n} tokens, top {k} of {n_expert}, tiles of {tile}): every slot's rows equal to its own launches, bit for bit", ty.name(), dty.name());
    }
}

/// Routed experts of a prompt pass grouped per expert (moe_sort, then mm_ex on tensor cores)
/// against dequantized f64 dots, every slot: f16 rounding of both inputs bounds it as mm_tc.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn grouped_expert_products_match_the_dequantized_reference() {
    let g = gpu();
    let types = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16, GgmlType::BF16, GgmlType::F32, GgmlType::Q4_0];
    for (i, ty) in types.into_iter().enumerate() {
        for &(n_expert, k, n_tok, rows, cols) in &[(16usize, 4usize, 37usize, 200usize, 256usize), (64, 8, 50, 128, 512), (8, 2, 3, 70, 768)] {
            let seed = 7000 + 10 * i as u64 + n_tok as u64;
            let w_f32 = noise(n_expert * rows * cols, seed);
            let data = xwen_kernels::quantize(ty, &w_f32).expect("quantize");
            let mut deq = vec![0.0f32; n_expert * rows * cols];
            xwen_kernels::dequantize(ty, &data, &mut deq).unwrap();
            let x = noise(n_tok * cols, seed + 1);
            // each token k distinct experts, skewed so some experts take many slots and some none
            let ids: Vec<i32> = (0..n_tok).flat_map(|t| (0..k).map(move |s| ((t * t + 5 * s) % n_expert.min(k + 3 + t % 5)) as i32)).collect();
            let ids: Vec<i32> = ids
                .chunks(k)
                .flat_map(|c| {
                    let mut v: Vec<i32> = Vec::new();
                    for &e in c {
                        let mut e = e;
                        while v.contains(&e) {
                            e = (e + 1) % n_expert as i32;
                        }
                        v.push(e);
                    }
                    v
                })
                .collect();
            let slots = n_tok * k;
            let rb = device_row_bytes(ty, cols);
            let (wd, xd, idd) = (g.upload(&device_layout(ty, &data)).unwrap(), g.upload_f32(&x).unwrap(), g.upload_i32(&ids).unwrap());
            let yd = g.zeros(slots * rows * 4).unwrap();
            let (ord, tiles, max_tiles) = moe_sort(&g, &idd, slots, n_expert, 16);
            let order = g.read_i32(&ord, slots).unwrap();
            let mut sorted: Vec<usize> = order.iter().map(|&o| o as usize).collect();
            assert!(sorted.windows(2).all(|w| ids[w[0]] <= ids[w[1]]), "moe_sort: slots grouped by expert");
            sorted.sort();
            assert_eq!(sorted, (0..slots).collect::<Vec<_>>(), "moe_sort: every slot once");
            g.launch(
                "mm_ex",
                (rows.div_ceil(128) as u32, max_tiles as u32),
                128,
                0,
                &[
                    Arg::Ptr(wd.ptr),
                    Arg::I32(ty.id() as i32),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I64(rb as i64),
                    Arg::I64((rows * rb) as i64),
                    Arg::Ptr(tiles.ptr),
                    Arg::Ptr(ord.ptr),
                    Arg::Ptr(xd.ptr),
                    Arg::I64(cols as i64),
                    Arg::I32(k as i32),
                    Arg::Ptr(yd.ptr),
                    Arg::I64(rows as i64),
                ],
            )
            .unwrap();
            let y = g.read_f32(&yd, slots * rows).unwrap();
            let mut worst = 0.0f64;
            for s in 0..slots {
                let (e, t) = (ids[s] as usize, s / k);
                for r in 0..rows {
                    let w = &deq[(e * rows + r) * cols..][..cols];
                    let xt = &x[t * cols..][..cols];
                    let exact: f64 = w.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = w.iter().zip(xt).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    let err = (y[s * rows + r] as f64 - exact).abs();
                    assert!(err <= 2e-3 * mag + 1e-6, "mm_ex {} slot {s} (expert {e}) row {r}: {} vs {exact}", ty.name(), y[s * rows + r]);
                    worst = worst.max(err / mag.max(1e-30));
                }
            }
            println!("mm_ex {:>5} {n_expert} experts top {k}, {n_tok} tokens, {rows}x{cols}: worst |err|/Σ|wx| {worst:.2e}", ty.name());
        }
    }
}

/// The cuBLAS prompt path: dequant_f16 equals the dequantized weights rounded to f16, to_f16
/// the inputs, and the GEMM (with and without accumulating into y) the f64 dots within f16
/// rounding.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn cublas_prompt_products_match_the_dequantized_reference() {
    let g = gpu();
    let Some(blas) = g.blas.as_ref() else {
        panic!("cuBLAS did not open (libcublas not found): the prompt products would fall back to mm_tc");
    };
    for (i, ty) in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_K, GgmlType::BF16, GgmlType::F32].into_iter().enumerate() {
        let (rows, cols, n) = (300usize, 512usize, 77usize);
        let w_f32 = noise(rows * cols, 40 + i as u64);
        let data = xwen_kernels::quantize(ty, &w_f32).expect("quantize");
        let mut deq = vec![0.0f32; rows * cols];
        xwen_kernels::dequantize(ty, &data, &mut deq).unwrap();
        let x = noise(n * cols, 50 + i as u64);
        let res = noise(n * rows, 60 + i as u64);
        let rb = device_row_bytes(ty, cols);
        let (wd, xd, wh, xh) = (g.upload(&device_layout(ty, &data)).unwrap(), g.upload_f32(&x).unwrap(), g.zeros(rows * cols * 2).unwrap(), g.zeros(n * cols * 2).unwrap());
        let units = rows
            * match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => cols / 256 * 32,
                GgmlType::Q6_K => cols / 256 * 16,
                GgmlType::Q8_0 => cols / 32 * 8,
                _ => cols / 4,
            };
        g.launch(
            "dequant_f16",
            (units.div_ceil(256) as u32, 1),
            256,
            0,
            &[Arg::Ptr(wd.ptr), Arg::I32(ty.id() as i32), Arg::I32(rows as i32), Arg::I32(cols as i32), Arg::I64(rb as i64), Arg::Ptr(wh.ptr)],
        )
        .unwrap();
        g.launch("to_f16", ((n * cols).div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(xd.ptr), Arg::I32(cols as i32), Arg::I64(cols as i64), Arg::I32(n as i32), Arg::Ptr(xh.ptr)])
            .unwrap();
        let halves = |b: &xwen_cuda::gpu::DevBuf, len: usize| -> Vec<f32> {
            g.read_i32(b, len / 2).unwrap().iter().flat_map(|w| [*w as u32 as u16, (*w as u32 >> 16) as u16]).map(xwen_kernels::half::f16_to_f32).collect()
        };
        let wf = halves(&wh, rows * cols);
        for (j, (&a, &b)) in wf.iter().zip(&deq).enumerate() {
            assert!((a - b).abs() <= b.abs() * 4.9e-4 + 6e-8, "dequant_f16 {} value {j}: {a} vs {b}", ty.name());
        }
        let xf = halves(&xh, n * cols);
        for (&a, &b) in xf.iter().zip(&x) {
            assert!((a - b).abs() <= b.abs() * 4.9e-4 + 6e-8, "to_f16: {a} vs {b}");
        }
        for acc in [false, true] {
            let yd = g.upload_f32(&res).unwrap();
            blas.gemm_tn(rows, n, cols, wh.ptr, cols, xh.ptr, cols, yd.ptr, rows, acc).unwrap();
            let y = g.read_f32(&yd, n * rows).unwrap();
            let mut worst = 0.0f64;
            for t in 0..n {
                for r in 0..rows {
                    let (wr, xt) = (&deq[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                    let exact: f64 = wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() + if acc { res[t * rows + r] as f64 } else { 0.0 };
                    let mag: f64 = wr.iter().zip(xt).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    let err = (y[t * rows + r] as f64 - exact).abs();
                    assert!(err <= 2e-3 * mag + 1e-6, "cuBLAS {} token {t} row {r}: {} vs {exact}", ty.name(), y[t * rows + r]);
                    worst = worst.max(err / mag.max(1e-30));
                }
            }
            println!("cublas {:>5} {rows}x{cols} {n} tokens{}: worst |err|/Σ|wx| {worst:.2e}", ty.name(), if acc { " +=" } else { "" });
        }
    }
}

/// The producers that quantize their own outputs for the next product (delta_out, attn_merge
/// with yq) write the same outputs as without, and the same q8_K values and scales quant_q8
/// makes of them, bit for bit.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn fused_quantization_equals_the_quantizer() {
    let g = gpu();
    // q8 values and scales of the same outputs by quant_q8 (kind 0 q8_K, 1 q8_0)
    let quant = |y: &xwen_cuda::gpu::DevBuf, n: usize, rows: usize, kind: i32| {
        let (q, d) = (g.zeros(rows * n).unwrap(), g.zeros(rows * n / 32 * 8).unwrap());
        let per = if kind == 0 { 256 } else { 32 };
        g.launch(
            "quant_q8",
            ((n / per).div_ceil(8) as u32, rows as u32),
            256,
            0,
            &[Arg::Ptr(y.ptr), Arg::I32(n as i32), Arg::I64(n as i64), Arg::Ptr(q.ptr), Arg::Ptr(d.ptr), Arg::I32(kind)],
        )
        .unwrap();
        (g.read_i32(&q, rows * n / 4).unwrap(), g.read_i32(&d, rows * n / 16).unwrap())
    };
    let read = |b: &xwen_cuda::gpu::DevBuf, len: usize| g.read_i32(b, len).unwrap();
    // rms_norm quantizing both kinds at once, over 2 rows
    // (the block of 1024 threads walks the row; rms_norm_threads' block holds it in registers)
    for &n in &[2048usize, 5120, 256, 2560] {
        for threads in [1024, xwen_cuda::rms_norm_threads(n)] {
            let rows = 2;
            let (x, w) = (g.upload_f32(&noise(rows * n, 11)).unwrap(), g.upload_f32(&noise(n, 12)).unwrap());
            let (y1, y2) = (g.zeros(rows * n * 4).unwrap(), g.zeros(rows * n * 4).unwrap());
            let (qk, dk, qz, dz) = (g.zeros(rows * n).unwrap(), g.zeros(rows * n / 32 * 8).unwrap(), g.zeros(rows * n).unwrap(), g.zeros(rows * n / 32 * 8).unwrap());
            let args = |y: u64, p: [u64; 4]| {
                [Arg::Ptr(x.ptr), Arg::Ptr(w.ptr), Arg::Ptr(y), Arg::I32(n as i32), Arg::F32(1e-6), Arg::Ptr(p[0]), Arg::Ptr(p[1]), Arg::Ptr(p[2]), Arg::Ptr(p[3])]
            };
            g.launch("rms_norm", (rows as u32, 1), threads, 0, &args(y1.ptr, [0; 4])).unwrap();
            g.launch("rms_norm", (rows as u32, 1), threads, 0, &args(y2.ptr, [qk.ptr, dk.ptr, qz.ptr, dz.ptr])).unwrap();
            assert_eq!(read(&y1, rows * n), read(&y2, rows * n), "rms_norm {n} ({threads} threads): outputs");
            let ((wk, wdk), (wz, wdz)) = (quant(&y1, n, rows, 0), quant(&y1, n, rows, 1));
            assert_eq!((read(&qk, rows * n / 4), read(&dk, rows * n / 16)), (wk, wdk), "rms_norm {n} ({threads} threads): q8_K");
            assert_eq!((read(&qz, rows * n / 4), read(&dz, rows * n / 16)), (wz, wdz), "rms_norm {n} ({threads} threads): q8_0");
            println!("rms_norm {n} ({threads} threads) quantizing (q8_K and q8_0): equal to rms_norm then quant_q8, bit for bit");
        }
    }
    // delta_out and attn_merge quantizing as q8_0 (and both kinds at once)
    for &(hv, sd) in &[(32usize, 128usize), (16, 64), (8, 256)] {
        let n = hv * sd;
        let (o, z, w) = (g.upload_f32(&noise(n, 21)).unwrap(), g.upload_f32(&noise(n, 22)).unwrap(), g.upload_f32(&noise(sd, 23)).unwrap());
        let (y1, y2) = (g.zeros(n * 4).unwrap(), g.zeros(n * 4).unwrap());
        let (qk, dk, qz, dz) = (g.zeros(n).unwrap(), g.zeros(n / 32 * 8).unwrap(), g.zeros(n).unwrap(), g.zeros(n / 32 * 8).unwrap());
        let base = |y: u64, p: [u64; 4]| {
            vec![
                Arg::Ptr(o.ptr),
                Arg::Ptr(z.ptr),
                Arg::Ptr(w.ptr),
                Arg::Ptr(y),
                Arg::I32(hv as i32),
                Arg::I32(sd as i32),
                Arg::F32(1e-6),
                Arg::Ptr(p[0]),
                Arg::Ptr(p[1]),
                Arg::Ptr(p[2]),
                Arg::Ptr(p[3]),
            ]
        };
        g.launch("delta_out", (hv as u32, 1), 128, 0, &base(y1.ptr, [0; 4])).unwrap();
        let heads = 256 / sd;
        for p in [[0, 0, qz.ptr, dz.ptr], [qk.ptr, dk.ptr, qz.ptr, dz.ptr]] {
            g.launch("delta_out", ((hv / heads) as u32, 1), (128 * heads) as u32, 0, &base(y2.ptr, p)).unwrap();
            assert_eq!(read(&y1, n), read(&y2, n), "delta_out sd {sd}: outputs");
            assert_eq!((read(&qz, n / 4), read(&dz, n / 16)), quant(&y1, n, 1, 1), "delta_out sd {sd}: q8_0");
            if p[0] != 0 {
                assert_eq!((read(&qk, n / 4), read(&dk, n / 16)), quant(&y1, n, 1, 0), "delta_out sd {sd}: q8_K");
            }
        }
        println!("delta_out sd {sd} quantizing as q8_0 (alone, and with q8_K): equal to quant_q8's, bit for bit");
    }
    for &(n_head, hd) in &[(16usize, 256usize), (8, 128)] {
        let n_split = 2;
        let n = n_head * hd;
        let ml: Vec<f32> = noise(n_head * n_split * 2, 31).iter().enumerate().map(|(i, v)| if i % 2 == 1 { v.abs() + 0.5 } else { *v }).collect();
        let (po, pml, qg) = (g.upload_f32(&noise(n * n_split, 32)).unwrap(), g.upload_f32(&ml).unwrap(), g.upload_f32(&noise(2 * n, 33)).unwrap());
        let (y1, y2) = (g.zeros(n * 4).unwrap(), g.zeros(n * 4).unwrap());
        let (qk, dk, qz, dz) = (g.zeros(n).unwrap(), g.zeros(n / 32 * 8).unwrap(), g.zeros(n).unwrap(), g.zeros(n / 32 * 8).unwrap());
        let args = |y: u64, p: [u64; 4]| {
            vec![
                Arg::Ptr(po.ptr),
                Arg::Ptr(pml.ptr),
                Arg::Ptr(qg.ptr),
                Arg::Ptr(y),
                Arg::I32(hd as i32),
                Arg::I32(n_split as i32),
                Arg::Ptr(p[0]),
                Arg::Ptr(p[1]),
                Arg::Ptr(p[2]),
                Arg::Ptr(p[3]),
            ]
        };
        g.launch("attn_merge", (n_head as u32, 1), hd as u32, 0, &args(y1.ptr, [0; 4])).unwrap();
        g.launch("attn_merge", ((n / 256) as u32, 1), 256, 0, &args(y2.ptr, [qk.ptr, dk.ptr, qz.ptr, dz.ptr])).unwrap();
        assert_eq!(read(&y1, n), read(&y2, n), "attn_merge hd {hd}: outputs");
        assert_eq!((read(&qz, n / 4), read(&dz, n / 16)), quant(&y1, n, 1, 1), "attn_merge hd {hd}: q8_0");
        assert_eq!((read(&qk, n / 4), read(&dk, n / 16)), quant(&y1, n, 1, 0), "attn_merge hd {hd}: q8_K");
        println!("attn_merge hd {hd} quantizing both kinds: equal to quant_q8's, bit for bit");
    }
    let bits = |b: &xwen_cuda::gpu::DevBuf, len: usize| g.read_i32(b, len).unwrap();
    // delta_out: sd 128 (two heads a block), 64 (four), 256 (one)
    for &(hv, sd) in &[(32usize, 128usize), (16, 64), (8, 256)] {
        let n = hv * sd;
        let (o, z, w) = (g.upload_f32(&noise(n, 1)).unwrap(), g.upload_f32(&noise(n, 2)).unwrap(), g.upload_f32(&noise(sd, 3)).unwrap());
        let (y1, y2, q1, d1, q2, d2) =
            (g.zeros(n * 4).unwrap(), g.zeros(n * 4).unwrap(), g.zeros(n).unwrap(), g.zeros(n / 32 * 8).unwrap(), g.zeros(n).unwrap(), g.zeros(n / 32 * 8).unwrap());
        let base = |y: u64, q: u64, d: u64| {
            vec![Arg::Ptr(o.ptr), Arg::Ptr(z.ptr), Arg::Ptr(w.ptr), Arg::Ptr(y), Arg::I32(hv as i32), Arg::I32(sd as i32), Arg::F32(1e-6), Arg::Ptr(q), Arg::Ptr(d), Arg::Ptr(0), Arg::Ptr(0)]
        };
        g.launch("delta_out", (hv as u32, 1), 128, 0, &base(y1.ptr, 0, 0)).unwrap();
        g.launch(
            "quant_q8",
            ((n / 256).div_ceil(8) as u32, 1),
            256,
            0,
            &[Arg::Ptr(y1.ptr), Arg::I32(n as i32), Arg::I64(n as i64), Arg::Ptr(q1.ptr), Arg::Ptr(d1.ptr), Arg::I32(0)],
        )
        .unwrap();
        let heads = 256 / sd;
        g.launch("delta_out", ((hv / heads) as u32, 1), (128 * heads) as u32, 0, &base(y2.ptr, q2.ptr, d2.ptr)).unwrap();
        assert_eq!(bits(&y1, n), bits(&y2, n), "delta_out sd {sd}: outputs");
        assert_eq!(bits(&q1, n / 4), bits(&q2, n / 4), "delta_out sd {sd}: q8 values");
        assert_eq!(bits(&d1, n / 16), bits(&d2, n / 16), "delta_out sd {sd}: q8 scales");
        println!("delta_out sd {sd} quantizing: equal to delta_out then quant_q8, bit for bit");
    }
    // attn_merge: hd 256 (a head a block), 128 (two), over 3 splits
    for &(n_head, hd) in &[(16usize, 256usize), (8, 128)] {
        let n_split = 3;
        let n = n_head * hd;
        let mut ml = noise(n_head * n_split * 2, 4);
        for (i, v) in ml.iter_mut().enumerate() {
            if i % 2 == 1 {
                *v = v.abs() + 0.5; // sums positive
            }
        }
        ml[2] = f32::NEG_INFINITY; // a split with no positions
        let (po, pml, qg) = (g.upload_f32(&noise(n * n_split, 5)).unwrap(), g.upload_f32(&ml).unwrap(), g.upload_f32(&noise(2 * n, 6)).unwrap());
        let (y1, y2, q1, d1, q2, d2) =
            (g.zeros(n * 4).unwrap(), g.zeros(n * 4).unwrap(), g.zeros(n).unwrap(), g.zeros(n / 32 * 8).unwrap(), g.zeros(n).unwrap(), g.zeros(n / 32 * 8).unwrap());
        let args = |y: u64, q: u64, d: u64| {
            vec![
                Arg::Ptr(po.ptr),
                Arg::Ptr(pml.ptr),
                Arg::Ptr(qg.ptr),
                Arg::Ptr(y),
                Arg::I32(hd as i32),
                Arg::I32(n_split as i32),
                Arg::Ptr(q),
                Arg::Ptr(d),
                Arg::Ptr(0),
                Arg::Ptr(0),
            ]
        };
        g.launch("attn_merge", (n_head as u32, 1), hd as u32, 0, &args(y1.ptr, 0, 0)).unwrap();
        g.launch(
            "quant_q8",
            ((n / 256).div_ceil(8) as u32, 1),
            256,
            0,
            &[Arg::Ptr(y1.ptr), Arg::I32(n as i32), Arg::I64(n as i64), Arg::Ptr(q1.ptr), Arg::Ptr(d1.ptr), Arg::I32(0)],
        )
        .unwrap();
        g.launch("attn_merge", ((n_head * hd / 256) as u32, 1), 256, 0, &args(y2.ptr, q2.ptr, d2.ptr)).unwrap();
        assert_eq!(bits(&y1, n), bits(&y2, n), "attn_merge hd {hd}: outputs");
        assert_eq!(bits(&q1, n / 4), bits(&q2, n / 4), "attn_merge hd {hd}: q8 values");
        assert_eq!(bits(&d1, n / 16), bits(&d2, n / 16), "attn_merge hd {hd}: q8 scales");
        println!("attn_merge hd {hd} quantizing: equal to attn_merge then quant_q8, bit for bit");
    }
}

/// moe_down_combine (a decode step's expert and shared down products, weighted sum and
/// residual in one launch) equals `mv` per slot, `mv` of the shared expert and moe_combine,
/// bit for bit, with and without a shared expert and its gate.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_fused_moe_output_equals_its_three_steps() {
    let g = gpu();
    for (i, &(ty, n_expert, k, rows, cols, shared)) in
        [(GgmlType::Q4_K, 16usize, 8usize, 301usize, 512usize, 2), (GgmlType::Q6_K, 8, 2, 256, 768, 1), (GgmlType::Q8_0, 8, 4, 64, 256, 0), (GgmlType::Q4_K, 64, 10, 96, 1024, 2)]
            .iter()
            .enumerate()
    {
        let seed = 900 + i as u64;
        let data = xwen_kernels::quantize(ty, &noise(n_expert * rows * cols, seed)).unwrap();
        let rb = device_row_bytes(ty, cols);
        let wd = g.upload(&device_layout(ty, &data)).unwrap();
        let sdata = xwen_kernels::quantize(ty, &noise(rows * cols, seed + 1)).unwrap();
        let sd = g.upload(&device_layout(ty, &sdata)).unwrap();
        let ids: Vec<i32> = (0..k).map(|s| ((s * 5 + 1) % n_expert) as i32).collect();
        let wts: Vec<f32> = noise(k, seed + 2).iter().map(|v| v.abs() + 0.01).collect();
        let h = noise(k * cols, seed + 3);
        let hs = noise(cols, seed + 4);
        let x0 = noise(rows, seed + 5);
        let sg = [0.3f32];
        let (idd, wtd, hd, hsd, sgd) =
            (g.upload_i32(&ids).unwrap(), g.upload_f32(&wts).unwrap(), g.upload_f32(&h).unwrap(), g.upload_f32(&hs).unwrap(), g.upload_f32(&sg).unwrap());
        // q8 activations as decode makes them (both kinds)
        let kind = if ty == GgmlType::Q8_0 { 1 } else { 0 };
        let quant = |x: &xwen_cuda::gpu::DevBuf, rows_: usize| {
            let (q, d) = (g.zeros(rows_ * cols).unwrap(), g.zeros(rows_ * cols / 32 * 8).unwrap());
            let per = if kind == 0 { 256 } else { 32 };
            g.launch(
                "quant_q8",
                ((cols / per).div_ceil(8) as u32, rows_ as u32),
                256,
                0,
                &[Arg::Ptr(x.ptr), Arg::I32(cols as i32), Arg::I64(cols as i64), Arg::Ptr(q.ptr), Arg::Ptr(d.ptr), Arg::I32(kind)],
            )
            .unwrap();
            (q, d)
        };
        let (hq, hdq) = quant(&hd, k);
        let (sq, sdq) = quant(&hsd, 1);
        let q4 = |q: u64, d: u64| if kind == 0 { [q, d, 0, 0] } else { [0, 0, q, d] };
        let (hk, sk) = (q4(hq.ptr, hdq.ptr), q4(sq.ptr, sdq.ptr));
        // three steps
        let x1 = g.upload_f32(&x0).unwrap();
        let (ys, shy) = (g.zeros(k * rows * 4).unwrap(), g.zeros(rows * 4).unwrap());
        g.launch(
            "mv",
            (rows.div_ceil(4 * g.knobs.mv_rows) as u32, k as u32),
            128,
            0,
            &[
                Arg::Ptr(wd.ptr),
                Arg::I32(ty.id() as i32),
                Arg::I32(rows as i32),
                Arg::I32(cols as i32),
                Arg::I64(rb as i64),
                Arg::I64((rows * rb) as i64),
                Arg::Ptr(idd.ptr),
                Arg::Ptr(hd.ptr),
                Arg::Ptr(hk[0]),
                Arg::Ptr(hk[1]),
                Arg::Ptr(hk[2]),
                Arg::Ptr(hk[3]),
                Arg::I64(cols as i64),
                Arg::I32(1),
                Arg::Ptr(ys.ptr),
                Arg::I64(rows as i64),
                Arg::Ptr(0),
            ],
        )
        .unwrap();
        if shared > 0 {
            g.launch(
                "mv",
                (rows.div_ceil(4 * g.knobs.mv_rows) as u32, 1),
                128,
                0,
                &[
                    Arg::Ptr(sd.ptr),
                    Arg::I32(ty.id() as i32),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I64(rb as i64),
                    Arg::I64((rows * rb) as i64),
                    Arg::Ptr(0),
                    Arg::Ptr(hsd.ptr),
                    Arg::Ptr(sk[0]),
                    Arg::Ptr(sk[1]),
                    Arg::Ptr(sk[2]),
                    Arg::Ptr(sk[3]),
                    Arg::I64(cols as i64),
                    Arg::I32(1),
                    Arg::Ptr(shy.ptr),
                    Arg::I64(rows as i64),
                    Arg::Ptr(0),
                ],
            )
            .unwrap();
        }
        let (sh_ptr, sg_ptr) = match shared {
            0 => (0, 0),
            1 => (shy.ptr, 0),
            _ => (shy.ptr, sgd.ptr),
        };
        g.launch(
            "moe_combine",
            (rows.div_ceil(256) as u32, 1),
            256,
            0,
            &[Arg::Ptr(x1.ptr), Arg::Ptr(ys.ptr), Arg::Ptr(wtd.ptr), Arg::I32(k as i32), Arg::I32(rows as i32), Arg::Ptr(sh_ptr), Arg::Ptr(sg_ptr)],
        )
        .unwrap();
        // one launch
        let x2 = g.upload_f32(&x0).unwrap();
        let s_ptr = if shared > 0 { sd.ptr } else { 0 };
        g.launch(
            "moe_down_combine",
            (rows.div_ceil(g.knobs.moe_down_rows) as u32, 1),
            32 * (k as u32 + u32::from(shared > 0)),
            0,
            &[
                Arg::Ptr(wd.ptr),
                Arg::I32(ty.id() as i32),
                Arg::I32(rows as i32),
                Arg::I32(cols as i32),
                Arg::I64(rb as i64),
                Arg::I64((rows * rb) as i64),
                Arg::Ptr(idd.ptr),
                Arg::Ptr(wtd.ptr),
                Arg::I32(k as i32),
                Arg::Ptr(hd.ptr),
                Arg::Ptr(hk[0]),
                Arg::Ptr(hk[1]),
                Arg::Ptr(hk[2]),
                Arg::Ptr(hk[3]),
                Arg::Ptr(s_ptr),
                Arg::I32(ty.id() as i32),
                Arg::I32(cols as i32),
                Arg::I64(rb as i64),
                Arg::Ptr(hsd.ptr),
                Arg::Ptr(sk[0]),
                Arg::Ptr(sk[1]),
                Arg::Ptr(sk[2]),
                Arg::Ptr(sk[3]),
                Arg::Ptr(sg_ptr),
                Arg::Ptr(x2.ptr),
            ],
        )
        .unwrap();
        assert_eq!(g.read_i32(&x1, rows).unwrap(), g.read_i32(&x2, rows).unwrap(), "{} k {k} shared {shared}: fused differs", ty.name());
        println!("moe_down_combine {} {n_expert} experts top {k}, shared {shared}: equal to mv + mv + moe_combine, bit for bit", ty.name());
    }
}

/// moe_glu (a decode step's routed experts' and shared expert's gate, up and SwiGLU in one
/// launch) equals mv_glu over the k slots and mv_glu of the shared expert; quant_q8_2 (their
/// hidden rows quantized in one launch, each in its own kind) equals two quant_q8 launches;
/// bit for bit, for experts and shared experts of different types and widths.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_fused_expert_launches_equal_their_parts() {
    let g = gpu();
    let cases = [(GgmlType::Q4_K, GgmlType::Q8_0, 16usize, 8usize, 512usize, 512usize, 2048usize), (GgmlType::Q6_K, GgmlType::Q4_K, 8, 2, 256, 768, 512)];
    for (i, &(ty, sty, n_expert, k, eff, s_ff, cols)) in cases.iter().enumerate() {
        let seed = 1200 + 10 * i as u64;
        let up = |t: GgmlType, n: usize, rows: usize, seed: u64| g.upload(&device_layout(t, &xwen_kernels::quantize(t, &noise(n * rows * cols, seed)).unwrap())).unwrap();
        let (eg, eu, sg, su) = (up(ty, n_expert, eff, seed), up(ty, n_expert, eff, seed + 1), up(sty, 1, s_ff, seed + 2), up(sty, 1, s_ff, seed + 3));
        let (rb, srb) = (device_row_bytes(ty, cols), device_row_bytes(sty, cols));
        let ids: Vec<i32> = (0..k).map(|s| ((s * 3 + 2) % n_expert) as i32).collect();
        let idd = g.upload_i32(&ids).unwrap();
        let x = noise(cols, seed + 4);
        let xd = g.upload_f32(&x).unwrap();
        // x as both q8 kinds
        let q8 = |kind: i32, xb: &xwen_cuda::gpu::DevBuf, n: usize, rows: usize| {
            let (q, d) = (g.zeros(rows * n).unwrap(), g.zeros(rows * n / 32 * 8).unwrap());
            let per = if kind == 0 { 256 } else { 32 };
            g.launch(
                "quant_q8",
                ((n / per).div_ceil(8) as u32, rows as u32),
                256,
                0,
                &[Arg::Ptr(xb.ptr), Arg::I32(n as i32), Arg::I64(n as i64), Arg::Ptr(q.ptr), Arg::Ptr(d.ptr), Arg::I32(kind)],
            )
            .unwrap();
            (q, d)
        };
        let ((xk, xdk), (xz, xdz)) = (q8(0, &xd, cols, 1), q8(1, &xd, cols, 1));
        let glu = |gp: u64, upp: u64, t: GgmlType, rows: usize, rbb: usize, ids: u64, slots: usize, h: u64| {
            g.launch(
                "mv_glu",
                (rows.div_ceil(4) as u32, slots as u32),
                128,
                0,
                &[
                    Arg::Ptr(gp),
                    Arg::Ptr(upp),
                    Arg::I32(t.id() as i32),
                    Arg::I32(t.id() as i32),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I64(rbb as i64),
                    Arg::I64(rbb as i64),
                    Arg::I64((rows * rbb) as i64),
                    Arg::I64((rows * rbb) as i64),
                    Arg::Ptr(ids),
                    Arg::Ptr(xd.ptr),
                    Arg::Ptr(xk.ptr),
                    Arg::Ptr(xdk.ptr),
                    Arg::Ptr(xz.ptr),
                    Arg::Ptr(xdz.ptr),
                    Arg::I64(cols as i64),
                    Arg::I32(k as i32),
                    Arg::Ptr(h),
                    Arg::I64(rows as i64),
                ],
            )
            .unwrap();
        };
        let (h1, hs1, h2, hs2) = (g.zeros(k * eff * 4).unwrap(), g.zeros(s_ff * 4).unwrap(), g.zeros(k * eff * 4).unwrap(), g.zeros(s_ff * 4).unwrap());
        glu(eg.ptr, eu.ptr, ty, eff, rb, idd.ptr, k, h1.ptr);
        glu(sg.ptr, su.ptr, sty, s_ff, srb, 0, 1, hs1.ptr);
        g.launch(
            "moe_glu",
            (eff.max(s_ff).div_ceil(2 * g.knobs.moe_glu_rows) as u32, k as u32 + 1),
            128,
            0,
            &[
                Arg::Ptr(eg.ptr),
                Arg::Ptr(eu.ptr),
                Arg::I32(ty.id() as i32),
                Arg::I32(ty.id() as i32),
                Arg::I32(eff as i32),
                Arg::I64(rb as i64),
                Arg::I64(rb as i64),
                Arg::I64((eff * rb) as i64),
                Arg::I64((eff * rb) as i64),
                Arg::Ptr(idd.ptr),
                Arg::I32(k as i32),
                Arg::Ptr(sg.ptr),
                Arg::Ptr(su.ptr),
                Arg::I32(sty.id() as i32),
                Arg::I32(sty.id() as i32),
                Arg::I32(s_ff as i32),
                Arg::I64(srb as i64),
                Arg::I64(srb as i64),
                Arg::I32(cols as i32),
                Arg::Ptr(xd.ptr),
                Arg::Ptr(xk.ptr),
                Arg::Ptr(xdk.ptr),
                Arg::Ptr(xz.ptr),
                Arg::Ptr(xdz.ptr),
                Arg::Ptr(h2.ptr),
                Arg::Ptr(hs2.ptr),
                // no quantization in the launch (-DFUSE_MIDS's count null)
                Arg::Ptr(0),
                Arg::I32(0),
                Arg::Ptr(0),
                Arg::Ptr(0),
                Arg::I32(0),
                Arg::Ptr(0),
                Arg::Ptr(0),
            ],
        )
        .unwrap();
        assert_eq!(g.read_i32(&h1, k * eff).unwrap(), g.read_i32(&h2, k * eff).unwrap(), "moe_glu {}: the experts' rows", ty.name());
        assert_eq!(g.read_i32(&hs1, s_ff).unwrap(), g.read_i32(&hs2, s_ff).unwrap(), "moe_glu {}: the shared expert's rows", sty.name());
        // the hidden rows: experts' in one kind, the shared row in the other, after them
        let (ka, kb) = if sty == GgmlType::Q8_0 { (0, 1) } else { (1, 0) };
        let ((qa, da), (qb, db)) = (q8(ka, &h1, eff, k), q8(kb, &hs1, s_ff, 1));
        let (q2a, d2a, q2b, d2b) = (g.zeros(k * eff).unwrap(), g.zeros(k * eff / 32 * 8).unwrap(), g.zeros(s_ff).unwrap(), g.zeros(s_ff / 32 * 8).unwrap());
        let per = |kind: i32| if kind == 0 { 256 } else { 32 };
        g.launch(
            "quant_q8_2",
            ((eff / per(ka)).max(s_ff / per(kb)).div_ceil(8) as u32, k as u32 + 1),
            256,
            0,
            &[
                Arg::Ptr(h1.ptr),
                Arg::I32(eff as i32),
                Arg::Ptr(q2a.ptr),
                Arg::Ptr(d2a.ptr),
                Arg::I32(ka),
                Arg::Ptr(hs1.ptr),
                Arg::I32(s_ff as i32),
                Arg::Ptr(q2b.ptr),
                Arg::Ptr(d2b.ptr),
                Arg::I32(kb),
            ],
        )
        .unwrap();
        let rd = |b: &xwen_cuda::gpu::DevBuf, n: usize| g.read_i32(b, n).unwrap();
        assert_eq!((rd(&qa, k * eff / 4), rd(&da, k * eff / 16)), (rd(&q2a, k * eff / 4), rd(&d2a, k * eff / 16)), "quant_q8_2: the experts' rows");
        assert_eq!((rd(&qb, s_ff / 4), rd(&db, s_ff / 16)), (rd(&q2b, s_ff / 4), rd(&d2b, s_ff / 16)), "quant_q8_2: the shared row");
        println!("moe_glu {} experts top {k} + shared {}, quant_q8_2: equal to their separate launches, bit for bit", ty.name(), sty.name());
    }
}

/// The kernels no other test holds alone: the embedding lookup (`embed`: a token's row
/// dequantized, against the CPU's dequantizer, every type), the SwiGLU of a prompt pass
/// (`silu_mul`, against f32 on the CPU), and the prompt pass's fused gate and up products with
/// the SwiGLU (`mm_glu`, against dequantized f64 dots, the bound of `mm`'s test doubled for two
/// products and the gate's sigmoid).
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn embedding_rows_swiglu_and_the_prompt_glu_match_the_cpu() {
    let g = gpu();
    let types = [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];
    for (i, ty) in types.into_iter().enumerate() {
        let (rows, cols) = (50usize, 512usize);
        let data = xwen_kernels::quantize(ty, &noise(rows * cols, 2000 + i as u64)).unwrap();
        let mut deq = vec![0.0f32; rows * cols];
        xwen_kernels::dequantize(ty, &data, &mut deq).unwrap();
        let ids: Vec<i32> = vec![0, 49, 7, 7, 31];
        let (ed, idd, xd) = (g.upload(&device_layout(ty, &data)).unwrap(), g.upload_i32(&ids).unwrap(), g.zeros(ids.len() * cols * 4).unwrap());
        let args = [Arg::Ptr(ed.ptr), Arg::I32(ty.id() as i32), Arg::I32(cols as i32), Arg::I64(device_row_bytes(ty, cols) as i64), Arg::Ptr(idd.ptr), Arg::Ptr(xd.ptr)];
        g.launch("embed", (cols.div_ceil(256) as u32, ids.len() as u32), 256, 0, &args).unwrap();
        let x = g.read_f32(&xd, ids.len() * cols).unwrap();
        for (t, &id) in ids.iter().enumerate() {
            let want = &deq[id as usize * cols..(id as usize + 1) * cols];
            for (c, (&a, &b)) in x[t * cols..(t + 1) * cols].iter().zip(want).enumerate() {
                assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-3), "embed {} row {id} col {c}: {a} vs {b}", ty.name());
            }
        }
        println!("embed {:>5}: {} rows equal to the CPU's dequantized rows", ty.name(), ids.len());
    }

    // silu_mul: h ← silu(h)·u
    let n = 3000usize;
    let (h, u) = (noise(n, 2100).iter().map(|v| v * 6.0).collect::<Vec<f32>>(), noise(n, 2101));
    let (hd, ud) = (g.upload_f32(&h).unwrap(), g.upload_f32(&u).unwrap());
    g.launch("silu_mul", (n.div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(hd.ptr), Arg::Ptr(ud.ptr), Arg::I64(n as i64)]).unwrap();
    let got = g.read_f32(&hd, n).unwrap();
    for i in 0..n {
        let want = (h[i] as f64 / (1.0 + (-(h[i] as f64)).exp()) * u[i] as f64) as f32;
        assert!((got[i] - want).abs() <= 2e-6 * want.abs().max(1e-3), "silu_mul {i}: {} vs {want}", got[i]);
    }
    println!("silu_mul {n}: within 2e-6 of the f64 definition");

    // mm_glu over a prompt pass: h[t][r] = silu(G[r]·x[t]) · (U[r]·x[t])
    for (i, ty) in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16].into_iter().enumerate() {
        let (rows, cols, n) = (70usize, 512usize, 19usize);
        let (gq, uq) = (xwen_kernels::quantize(ty, &noise(rows * cols, 2200 + i as u64)).unwrap(), xwen_kernels::quantize(ty, &noise(rows * cols, 2300 + i as u64)).unwrap());
        let (mut gdq, mut udq) = (vec![0.0f32; rows * cols], vec![0.0f32; rows * cols]);
        xwen_kernels::dequantize(ty, &gq, &mut gdq).unwrap();
        xwen_kernels::dequantize(ty, &uq, &mut udq).unwrap();
        let x = noise(n * cols, 2400 + i as u64);
        let (gw, uw, xd, hd) = (g.upload(&device_layout(ty, &gq)).unwrap(), g.upload(&device_layout(ty, &uq)).unwrap(), g.upload_f32(&x).unwrap(), g.zeros(n * rows * 4).unwrap());
        let rb = device_row_bytes(ty, cols);
        let args = [
            Arg::Ptr(gw.ptr),
            Arg::Ptr(uw.ptr),
            Arg::I32(ty.id() as i32),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
            Arg::I64(rb as i64),
            Arg::Ptr(xd.ptr),
            Arg::I64(cols as i64),
            Arg::I32(n as i32),
            Arg::Ptr(hd.ptr),
            Arg::I64(rows as i64),
        ];
        // MM_T (8) tokens a block row, as forward.rs launches it
        g.launch("mm_glu", (rows.div_ceil(4) as u32, n.div_ceil(8) as u32), 128, 0, &args).unwrap();
        let got = g.read_f32(&hd, n * rows).unwrap();
        let mut worst = 0.0f64;
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            for r in 0..rows {
                let dot = |w: &[f32]| -> (f64, f64) {
                    let wr = &w[r * cols..(r + 1) * cols];
                    (wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum(), wr.iter().zip(xt).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum())
                };
                let ((gv, gm), (uv, um)) = (dot(&gdq), dot(&udq));
                let want = gv / (1.0 + (-gv).exp()) * uv;
                // each product within mm's bound, carried through silu(g)·u
                let bound = 2e-5 * (gm * uv.abs() + um * gv.abs().max(1.0)) + 1e-6;
                let err = (got[t * rows + r] as f64 - want).abs();
                assert!(err <= bound, "mm_glu {} token {t} row {r}: {} vs {want} (err {err:.3e} > {bound:.3e})", ty.name(), got[t * rows + r]);
                worst = worst.max(err / bound);
            }
        }
        println!("mm_glu {:>5} {rows}x{cols} {n} tokens: worst err / bound {worst:.2e}", ty.name());
    }
}
