//! The SIMD paths against their scalar emulations (bit for bit), and the AVX2 emulation against
//! golden bits from llama.cpp's own compiled CPU backend (tests/vectors/f32ops_ggml.bin, made by
//! tools/kernels/make_expf_vectors.sh).

use super::*;
use std::collections::HashMap;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// NaN-free inputs that reach every branch: any finite bit pattern (huge, tiny, subnormal),
/// the common range, and both exp cut-off bands (|x| ≈ 87..104 and ≈ 126..136).
fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let fixed = [
        0.0f32,
        -0.0,
        1e-45,
        -1e-45,
        1e-38,
        -1e-38,
        87.33,
        -87.33,
        88.72,
        -88.72,
        103.97,
        -103.97,
        133.08,
        -133.08,
        3e38,
        -3e38,
        f32::MAX,
        f32::MIN,
    ];
    let mut r = Rng(seed);
    let mut v: Vec<f32> = fixed.to_vec();
    while v.len() < n {
        let x = match r.next() % 5 {
            0 => {
                let b = r.next() as u32;
                if (b >> 23) & 0xff == 0xff {
                    continue;
                }
                f32::from_bits(b)
            }
            1 => r.unit() * 150.0,
            2 => r.unit().signum() * (87.0 + 17.0 * r.unit().abs()),
            3 => r.unit().signum() * (126.0 + 10.0 * r.unit().abs()),
            _ => r.unit() * 4.0,
        };
        v.push(x);
    }
    v.truncate(n);
    v
}

fn assert_bits(what: &str, ours: &[f32], want: &[f32], inputs: &[f32]) {
    assert_eq!(ours.len(), want.len(), "{what}: length");
    for (i, (a, b)) in ours.iter().zip(want).enumerate() {
        assert!(
            a.to_bits() == b.to_bits(),
            "{what}: element {i} (input {:e} = {:#010x}): got {a:e} ({:#010x}), want {b:e} ({:#010x})",
            inputs.get(i).copied().unwrap_or(f32::NAN),
            inputs.get(i).map_or(0, |x| x.to_bits()),
            a.to_bits(),
            b.to_bits()
        );
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_expf_and_silu_equal_their_emulation_on_1e6_values() {
    if !has_avx2_fma() {
        eprintln!(
            "SKIP avx2_expf_and_silu_equal_their_emulation: no AVX2+FMA on this CPU — NOT a pass"
        );
        return;
    }
    let xs = inputs(1_000_000, 1);
    for c in xs.chunks_exact(8) {
        let a: [f32; 8] = c.try_into().unwrap();
        // SAFETY: detected above.
        let got = unsafe { x86::lanes::expf8(&a) };
        let want = a.map(v_expf_avx2_lane);
        assert_bits("AVX2 ggml_v_expf", &got, &want, c);
    }
    let mut got = vec![0.0f32; xs.len()];
    let mut want = vec![0.0f32; xs.len()];
    // SAFETY: detected above; lengths equal.
    unsafe { x86::silu256(xs.as_ptr(), got.as_mut_ptr(), xs.len()) };
    silu_emulated(ExpFlavor::Avx2, &xs, &mut want);
    assert_bits("AVX2 silu", &got, &want, &xs);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_expf_and_silu_equal_their_emulation_on_1e6_values() {
    if !has_avx512_dq() {
        eprintln!(
            "SKIP avx512_expf_and_silu_equal_their_emulation: no AVX-512F/DQ on this CPU, the AVX-512 \
             ggml_v_expf path is untested here — NOT a pass"
        );
        return;
    }
    let xs = inputs(1_000_000, 2);
    for c in xs.chunks_exact(16) {
        let a: [f32; 16] = c.try_into().unwrap();
        // SAFETY: detected above.
        let got = unsafe { x86::lanes::expf16(&a) };
        let want = a.map(v_expf_avx512_lane);
        assert_bits("AVX-512 ggml_v_expf", &got, &want, c);
    }
    let mut got = vec![0.0f32; xs.len()];
    let mut want = vec![0.0f32; xs.len()];
    // SAFETY: detected above; lengths equal.
    unsafe { x86::silu512(xs.as_ptr(), got.as_mut_ptr(), xs.len()) };
    silu_emulated(ExpFlavor::Avx512, &xs, &mut want);
    assert_bits("AVX-512 silu", &got, &want, &xs);
}

/// Every length 1..40 (every chunk/tail split) through the dispatched ops, against the
/// emulation of the flavour in use; softmax also with a padded, masked row.
#[test]
fn dispatched_ops_equal_emulation_for_every_tail() {
    let flavor = exp_flavor();
    let mut r = Rng(3);
    for n in 1..=40 {
        let g: Vec<f32> = (0..n).map(|_| r.unit() * 12.0).collect();
        let u: Vec<f32> = (0..n).map(|_| r.unit() * 3.0).collect();
        let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
        silu(&g, &mut a);
        silu_emulated(flavor, &g, &mut b);
        assert_bits(&format!("silu n={n}"), &a, &b, &g);
        let mut c = g.clone();
        silu_inplace(&mut c);
        assert_bits(&format!("silu_inplace n={n}"), &c, &a, &g);
        swiglu(&g, &u, &mut a);
        swiglu_emulated(flavor, &g, &u, &mut b);
        assert_bits(&format!("swiglu n={n}"), &a, &b, &g);
        for row_len in [n, n.next_multiple_of(8), 256] {
            let (mut p, mut q) = (g.clone(), g.clone());
            softmax_masked_inplace(&mut p, row_len);
            softmax_masked_emulated(flavor, &mut q, row_len);
            assert_bits(&format!("softmax n={n} row={row_len}"), &p, &q, &g);
        }
        let mut p = g.clone();
        softmax_inplace(&mut p);
        let s: f64 = p.iter().map(|&v| v as f64).sum();
        assert!((s - 1.0).abs() < 1e-5, "softmax n={n} sums to {s}");
    }
}

/// Both emulations stay within ggml's stated accuracy (1.45 ulp + 0.5) of libm's expf where
/// exp is a normal float, and handle the cut-offs and infinities as ggml does.
#[test]
fn emulated_expf_is_accurate_and_saturates() {
    for flavor in [ExpFlavor::Avx2, ExpFlavor::Avx512] {
        for x in inputs(200_000, 4) {
            if !(-87.0..=88.0).contains(&x) {
                continue;
            }
            let (a, b) = (v_expf_lane(flavor, x), x.exp());
            let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(
                ulps <= 2,
                "{flavor:?} expf({x:e}) = {a:e}, libm {b:e} ({ulps} ulp)"
            );
        }
        assert_eq!(
            v_expf_lane(flavor, f32::NEG_INFINITY).to_bits(),
            0,
            "{flavor:?} exp(-inf)"
        );
        assert_eq!(
            v_expf_lane(flavor, -200.0).to_bits(),
            0,
            "{flavor:?} exp(-200)"
        );
        assert_eq!(
            v_expf_lane(flavor, 200.0),
            f32::INFINITY,
            "{flavor:?} exp(200)"
        );
        assert_eq!(
            v_expf_lane(flavor, f32::INFINITY),
            f32::INFINITY,
            "{flavor:?} exp(inf)"
        );
        assert_eq!(v_expf_lane(flavor, 0.0), 1.0, "{flavor:?} exp(0)");
    }
}

// ---------- golden bits from ggml ----------

fn golden() -> HashMap<String, Vec<u8>> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/f32ops_ggml.bin");
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..4], b"XWF1");
    let mut out = HashMap::new();
    let mut p = 4;
    while p < b.len() {
        let tag = String::from_utf8_lossy(&b[p..p + 4]).into_owned();
        let len = u32::from_le_bytes(b[p + 4..p + 8].try_into().unwrap()) as usize;
        out.insert(tag, b[p + 8..p + 8 + len].to_vec());
        p += 8 + len;
    }
    out
}

fn f32s(g: &HashMap<String, Vec<u8>>, tag: &str) -> Vec<f32> {
    let b = g
        .get(tag)
        .unwrap_or_else(|| panic!("golden section {tag} missing"));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn u32s(g: &HashMap<String, Vec<u8>>, tag: &str) -> Vec<usize> {
    let b = g
        .get(tag)
        .unwrap_or_else(|| panic!("golden section {tag} missing"));
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize)
        .collect()
}

type SiluFn = dyn Fn(&[f32], &mut [f32]);
type SwigluFn = dyn Fn(&[f32], &[f32], &mut [f32]);
type SoftmaxFn = dyn Fn(&mut [f32], usize);

/// Runs every golden case through `silu`, `swiglu` and `softmax` (given as closures so the same
/// checks serve the emulation and the dispatched ops).
fn check_golden(who: &str, silu_f: &SiluFn, swiglu_f: &SwigluFn, softmax_f: &SoftmaxFn) {
    let g = golden();
    let x = f32s(&g, "EXIN");
    // ggml_vec_soft_max_f32(n, y, x, max = 0) exposes raw ggml_v_expf lanes and the sum.
    let want = f32s(&g, "EXPY");
    let mut y = x.clone();
    let sum = exp_sum_emulated(ExpFlavor::Avx2, &mut y, 0.0, x.len());
    if who == "emulated" {
        assert_bits("ggml_v_expf (EXPY)", &y, &want, &x);
        let want_sum = f64::from_le_bytes(g["EXPS"][..8].try_into().unwrap());
        assert_eq!(
            sum.to_bits(),
            want_sum.to_bits(),
            "soft_max sum {sum:e} vs {want_sum:e}"
        );
    }
    let mut y = vec![0.0f32; x.len()];
    silu_f(&x, &mut y);
    assert_bits(&format!("{who} silu (SLOT)"), &y, &f32s(&g, "SLOT"), &x);
    swiglu_f(&x, &f32s(&g, "SWUP"), &mut y);
    assert_bits(&format!("{who} swiglu (SWOT)"), &y, &f32s(&g, "SWOT"), &x);

    let (tx, tu, tsl, tsw) = (
        f32s(&g, "TLIN"),
        f32s(&g, "TLUP"),
        f32s(&g, "TLSL"),
        f32s(&g, "TLSW"),
    );
    let mut off = 0;
    for len in 1..=40 {
        let r = off..off + len;
        let mut y = vec![0.0f32; len];
        silu_f(&tx[r.clone()], &mut y);
        assert_bits(
            &format!("{who} silu len {len}"),
            &y,
            &tsl[r.clone()],
            &tx[r.clone()],
        );
        swiglu_f(&tx[r.clone()], &tu[r.clone()], &mut y);
        assert_bits(
            &format!("{who} swiglu len {len}"),
            &y,
            &tsw[r.clone()],
            &tx[r.clone()],
        );
        off += len;
    }

    let (lens, sin, sot) = (u32s(&g, "SMLN"), f32s(&g, "SMIN"), f32s(&g, "SMOT"));
    let mut off = 0;
    for &len in &lens {
        let mut row = sin[off..off + len].to_vec();
        softmax_f(&mut row, len);
        assert_bits(
            &format!("{who} soft_max len {len}"),
            &row,
            &sot[off..off + len],
            &sin[off..off + len],
        );
        off += len;
    }

    let vis = u32s(&g, "MKVS");
    let scale = f32s(&g, "MKSC")[0];
    let (kq, ot) = (f32s(&g, "MKIN"), f32s(&g, "MKOT"));
    const NKV: usize = 256;
    for (i, &v) in vis.iter().enumerate() {
        // ggml: wp = kq·scale, then += mask (0 here); the engine hands in scaled scores.
        let mut row: Vec<f32> = kq[i * NKV..i * NKV + v]
            .iter()
            .map(|&s| s * scale)
            .collect();
        softmax_f(&mut row, NKV);
        let want = &ot[i * NKV..(i + 1) * NKV];
        assert_bits(
            &format!("{who} soft_max_ext visible {v} of {NKV}"),
            &row,
            &want[..v],
            &kq[i * NKV..],
        );
        assert!(
            want[v..].iter().all(|&p| p == 0.0),
            "masked columns are 0 in ggml"
        );
    }
}

#[test]
fn avx2_emulation_matches_ggml_golden_bits() {
    check_golden(
        "emulated",
        &|x, y| silu_emulated(ExpFlavor::Avx2, x, y),
        &|g, u, y| swiglu_emulated(ExpFlavor::Avx2, g, u, y),
        &|x, row| softmax_masked_emulated(ExpFlavor::Avx2, x, row),
    );
}

#[test]
fn dispatched_ops_match_ggml_golden_bits_on_avx2_machines() {
    if exp_flavor() != ExpFlavor::Avx2 {
        eprintln!(
            "SKIP dispatched_ops_match_ggml_golden_bits: this CPU runs the {:?} flavour; the golden \
             file holds AVX2 bits — NOT a pass",
            exp_flavor()
        );
        return;
    }
    check_golden(
        "dispatched",
        &|x, y| silu(x, y),
        &|g, u, y| swiglu(g, u, y),
        &|x, row| softmax_masked_inplace(x, row),
    );
}
