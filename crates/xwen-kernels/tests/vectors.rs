//! Our formats against llama.cpp's own code: gguf-py's numpy dequantizers/quantizers
//! (tests/vectors/gguf_*.bin) and ggml's C library (ggml_*.bin): reference quantizers,
//! dequantization, the CPU backend's activation quantizers and vec_dot.
//! Regenerate with tools/kernels/make_vectors.sh.

mod common;
use common::*;
use xwen_kernels::{dequantize, quantize, quantize_activations, vec_dot, vec_dot_type, GgmlType};

fn assert_bits_eq(name: &str, what: &str, ours: &[f32], theirs: &[f32]) {
    assert_eq!(ours.len(), theirs.len(), "{name} {what}: length");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{name} {what}: element {i}: ours {a:e} theirs {b:e}"
        );
    }
}

fn assert_bytes_eq(name: &str, what: &str, ours: &[u8], theirs: &[u8], block: usize) {
    assert_eq!(ours.len(), theirs.len(), "{name} {what}: length");
    if let Some(i) = ours.iter().zip(theirs).position(|(a, b)| a != b) {
        let blk = i / block;
        panic!(
            "{name} {what}: first difference at byte {i} (block {blk})\nours   {:?}\ntheirs {:?}",
            &ours[blk * block..(blk + 1) * block],
            &theirs[blk * block..(blk + 1) * block]
        );
    }
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let files = read_vectors("gguf_");
    assert!(
        files.len() >= 14,
        "expected gguf_*.bin vectors, found {}",
        files.len()
    );
    for (name, v) in files {
        let raw = v.bytes("QRND").unwrap();
        let mut ours = vec![0f32; v.n];
        dequantize(v.ty, raw, &mut ours).unwrap();
        assert_bits_eq(&name, "dequantize", &ours, &v.f32s("DQPY").unwrap());
    }
}

#[test]
fn quantize_matches_gguf_py_where_it_has_a_quantizer() {
    let mut checked = Vec::new();
    for (name, v) in read_vectors("gguf_") {
        let (Some(x), Some(q)) = (v.f32s("INPY"), v.bytes("QUPY")) else {
            continue;
        };
        let ours = quantize(v.ty, &x).unwrap();
        assert_bytes_eq(&name, "quantize", &ours, q, v.ty.type_size());
        checked.push(v.ty);
    }
    for t in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::BF16] {
        assert!(checked.contains(&t), "no gguf-py quantizer vectors for {t}");
    }
}

#[test]
fn reference_quantizers_and_dequantize_match_ggml() {
    let files = read_vectors("ggml_");
    assert!(
        files.len() >= 16,
        "expected ggml_*.bin vectors, found {}",
        files.len()
    );
    for (name, v) in files {
        let x = v.f32s("INPT").unwrap();
        let ours = quantize(v.ty, &x).unwrap();
        assert_bytes_eq(
            &name,
            "reference quantize",
            &ours,
            v.bytes("QREF").unwrap(),
            v.ty.type_size(),
        );
        if let Some(deq) = v.f32s("DEQ") {
            let mut out = vec![0f32; v.n];
            dequantize(v.ty, v.bytes("QREF").unwrap(), &mut out).unwrap();
            assert_bits_eq(&name, "dequantize", &out, &deq);
        }
    }
}

/// The vectors were made on x86-64 (AVX2); activation rounding is architecture-specific.
#[test]
#[cfg(target_arch = "x86_64")]
fn activation_quantization_matches_ggml_cpu_on_x86() {
    let mut n_checked = 0;
    for (name, v) in read_vectors("ggml_") {
        let (Some(x), Some(want)) = (v.f32s("ACTX"), v.bytes("ACTQ")) else {
            continue;
        };
        let mut ours = Vec::new();
        quantize_activations(v.ty, &x, &mut ours);
        let vd = vec_dot_type(v.ty);
        assert_bytes_eq(&name, "activation quantize", &ours, want, vd.type_size());
        n_checked += 1;
    }
    assert!(n_checked >= 14, "only {n_checked} activation vectors");
    // The inputs hold exact halfway cases, so the reference rounding must disagree somewhere:
    // otherwise this test could not tell the flavours apart.
    let v = &read_vectors("ggml_q8_0")[0].1;
    let x = v.f32s("ACTX").unwrap();
    let mut r = vec![0u8; v.bytes("ACTQ").unwrap().len()];
    xwen_kernels::formats::q8::quantize_q8_0_ref(&x, &mut r);
    assert_ne!(
        r.as_slice(),
        v.bytes("ACTQ").unwrap(),
        "no halfway case in the Q8_0 activation vectors"
    );
}

#[test]
#[cfg(target_arch = "x86_64")]
fn q8_k_repack_quantizer_tie_break_matches_ggml() {
    let files = read_vectors("ggml_q8_K");
    let v = &files.first().expect("ggml_q8_K.bin").1;
    let x = v.f32s("INPT").unwrap();
    let want = v.bytes("RP4X").unwrap();
    let mut ours = vec![0u8; 4 * 292];
    xwen_kernels::formats::q8::quantize_q8_k_prefer_positive(&x[..1024], &mut ours);
    assert_bytes_eq("ggml_Q8_K", "4x8 repack quantize", &ours, want, 292);
    // The input has +/- ties (make_vectors), so the row quantizer must differ somewhere: this
    // guards against the test passing because the two quantizers are secretly the same.
    let mut plain = vec![0u8; 4 * 292];
    xwen_kernels::formats::q8::quantize_q8_k(&x[..1024], &mut plain);
    assert_ne!(
        plain, ours,
        "input has no sign tie: the tie-break is untested"
    );
}

/// Our dispatched dot against ggml's vec_dot on the same bytes: equal up to summation order.
#[test]
#[cfg(target_arch = "x86_64")]
fn vec_dot_agrees_with_ggml() {
    for (name, v) in read_vectors("ggml_") {
        let (Some(w), Some(a), Some(d)) = (v.bytes("QREF"), v.bytes("ACTQ"), v.f32s("DOT")) else {
            continue;
        };
        let ours = vec_dot(v.ty, v.n, w, a);
        let bound = abs_dot(v.ty, w, vec_dot_type(v.ty), a, v.n) * 2e-6 + 1e-30;
        let err = (ours as f64 - d[0] as f64).abs();
        assert!(
            err <= bound,
            "{name}: ours {ours:e} ggml {:e} |diff| {err:e} > {bound:e}",
            d[0]
        );
    }
}

#[test]
fn vec_dot_is_bit_exact_with_ggml_on_avx2() {
    // The ggml_*.bin dots come from an AVX2 build: where that is the active set, our kernels
    // follow its float order exactly (Q2_K still only up to order, see vec_dot_agrees_with_ggml).
    if xwen_kernels::dispatch::active() != xwen_kernels::dispatch::Isa::Avx2 {
        eprintln!("SKIP vec_dot_is_bit_exact_with_ggml_on_avx2: active kernel set is not AVX2");
        return;
    }
    let mut checked = Vec::new();
    for (name, v) in read_vectors("ggml_") {
        let (Some(w), Some(a), Some(d)) = (v.bytes("QREF"), v.bytes("ACTQ"), v.f32s("DOT")) else {
            continue;
        };
        if v.ty == GgmlType::Q2_K {
            continue;
        }
        // the single-token kernel: F32/BF16 weights take tinyBLAS's order for 2+ tokens instead
        let dot = xwen_kernels::dispatch::row_dot_fn(v.ty, 1).expect("supported");
        let ours = dot(v.n, w, a);
        assert_eq!(
            ours.to_bits(),
            d[0].to_bits(),
            "{name}: ours {ours:e} ggml {:e}",
            d[0]
        );
        checked.push(v.ty);
    }
    assert!(
        checked.contains(&GgmlType::Q6_K)
            && checked.contains(&GgmlType::Q4_K)
            && checked.contains(&GgmlType::BF16),
        "{checked:?}"
    );
}

/// 48 rows of n = 4096 per K-quant (tests/vectors/kdot_*.bin, tools/kernels/make_kdot_vectors.sh):
/// enough blocks and rows that a float-order difference from ggml's AVX2 vec_dot (the dmin term's
/// accumulation, the final sums) cannot hide the way it can in one 4-block dot.
#[test]
fn k_quant_vec_dot_rows_are_bit_exact_with_ggml_on_avx2() {
    if xwen_kernels::dispatch::active() != xwen_kernels::dispatch::Isa::Avx2 {
        eprintln!(
            "SKIP k_quant_vec_dot_rows_are_bit_exact_with_ggml_on_avx2: active set is not AVX2"
        );
        return;
    }
    let mut checked = Vec::new();
    for (name, v) in read_vectors("kdot_") {
        let (w, a, d) = (
            v.bytes("QREF").unwrap(),
            v.bytes("ACTQ").unwrap(),
            v.f32s("DOTS").unwrap(),
        );
        if v.ty == GgmlType::Q2_K {
            continue;
        }
        let rb = w.len() / d.len();
        let bad: Vec<String> = d
            .iter()
            .enumerate()
            .filter_map(|(r, &want)| {
                let ours = vec_dot(v.ty, v.n, &w[r * rb..(r + 1) * rb], a);
                (ours.to_bits() != want.to_bits())
                    .then(|| format!("row {r}: ours {ours:e} ggml {want:e}"))
            })
            .collect();
        assert!(
            bad.is_empty(),
            "{name}: {} of {} rows differ\n{}",
            bad.len(),
            d.len(),
            bad.join("\n")
        );
        // The multi-token kernel (prefill of matrices ggml does not repack) owes the same bits.
        if let Some(multi) = xwen_kernels::dispatch::multi_dot_fn(v.ty) {
            let acts: Vec<u8> = (0..4).flat_map(|_| a.iter().copied()).collect();
            for t in 1..=4 {
                for (r, &want) in d.iter().enumerate() {
                    let mut out = [0f32; 4];
                    multi(
                        v.n,
                        &w[r * rb..(r + 1) * rb],
                        &acts[..t * a.len()],
                        a.len(),
                        &mut out[..t],
                    );
                    for (k, o) in out[..t].iter().enumerate() {
                        assert_eq!(
                            o.to_bits(),
                            want.to_bits(),
                            "{name} multi T={t} token {k} row {r}: ours {o:e} ggml {want:e}"
                        );
                    }
                }
            }
        }
        checked.push(v.ty);
    }
    for ty in [
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        assert!(
            checked.contains(&ty),
            "no kdot vectors for {ty}: {checked:?}"
        );
    }
}
