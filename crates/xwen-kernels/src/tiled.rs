//! K-quant products in the float order of llama.cpp's tiled CPU matmul (b11434
//! ggml-cpu/tiled/).
//!
//! Since b11434, ggml-cpu computes a MUL_MAT (and each expert of a MUL_MAT_ID) whose weight is a
//! K-quant held in its plain layout (Q2_K..Q6_K, IQ4_XS; not a CPU_REPACK matrix) with a tiled
//! kernel when the product has at least 8 activation rows (`ggml_tiled_min_batch`) and the
//! build has AVX/AVX2/AVX-512-VNNI. On x86 with AVX2 that covers every Q6_K, Q5_K and Q3_K
//! matrix of a prefill, and Q4_K matrices whose row count is not a multiple of 8 (the others
//! are repacked, see `q4k_repack`). Its integer work is exact; only the float steps matter, and
//! they differ from ggml_vec_dot_*_q8_K. Per output (weight row, token) and per 256-element
//! block, in block order, starting from 0:
//!
//! ```text
//! s1  = Σ_sub scale · Σ (code - bias) · q8        (exact i32)
//! s2  = Σ_sub min · Σ q8 over the sub-block        (exact i32, formats with a min)
//! res = d · f32(s1);  res = fma(-dmin, f32(s2), res)
//! acc = fma(res, d8, acc)                          (AVX2 kernel, tiled-kernel.cpp:383-400;
//!                                                   the VNNI kernel's mul + add, as GCC fuses it)
//! ```
//!
//! `dot_ref` is that arithmetic in scalar form; `simd::avx2_tiled` computes the same bits.

use crate::formats::q8::{q8k_parts, Q8_K_BYTES, QK_K};
use crate::formats::{q2_k, q3_k, q4_k, q5_k, q6_k, DotFn};
use crate::half::read_f16;
use crate::GgmlType;

/// Least number of activation rows for which llama.cpp takes the tiled path.
pub const MIN_BATCH: usize = 8;

/// Whether llama.cpp's CPU backend on this machine multiplies a `ty` matrix of `rows` rows with
/// the tiled kernel once a product has `MIN_BATCH` or more activation rows. A property of the
/// reference on this CPU, not of the kernel set in use.
pub fn applies(ty: GgmlType, rows: usize) -> bool {
    // the build has AVX2 (or AVX/AVX-512 VNNI) on x86; the types of tiled.cpp's dispatch that
    // xwen supports, unless the matrix is repacked instead
    let x86_simd = cfg!(target_arch = "x86_64") && crate::isa::detected() != crate::isa::Isa::Scalar;
    let plain_kquant = matches!(
        ty,
        GgmlType::Q6_K | GgmlType::Q5_K | GgmlType::Q4_K | GgmlType::Q3_K | GgmlType::Q2_K | GgmlType::IQ4_XS
    );
    x86_simd && plain_kquant && !crate::q4k_repack::repacked_q8k(ty, rows)
}

/// One weight block widened the way the tiled kernels see it.
pub struct Unpacked {
    pub d: f32,
    pub dmin: f32,
    /// Unsigned codes in element order; the weight value is `code - bias`.
    pub codes: [u8; QK_K],
    pub bias: i32,
    /// Elements per sub-block (16 or 32) and the per-sub-block scale and min.
    pub sub: usize,
    pub scales: [i32; 16],
    pub mins: [i32; 16],
    pub has_min: bool,
}

/// Widens block `b` of a `ty` row (as the tiled unpack routines do).
pub fn unpack(ty: GgmlType, b: &[u8]) -> Unpacked {
    let mut u = Unpacked {
        d: 0.0,
        dmin: 0.0,
        codes: [0; QK_K],
        bias: 0,
        sub: 16,
        scales: [0; 16],
        mins: [0; 16],
        has_min: false,
    };
    match ty {
        GgmlType::Q6_K => {
            for (c, v) in u.codes.iter_mut().zip(q6_k::codes(b)) {
                *c = (v + 32) as u8;
            }
            u.bias = 32;
            for j in 0..16 {
                u.scales[j] = b[192 + j] as i8 as i32;
            }
            u.d = read_f16(&b[208..]);
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            u.d = read_f16(b);
            u.dmin = read_f16(&b[2..]);
            let (sc, mn) = q4_k::unpack_scales_k4(&b[4..16]);
            for j in 0..8 {
                u.scales[j] = sc[j] as i32;
                u.mins[j] = mn[j] as i32;
            }
            u.sub = 32;
            u.has_min = true;
            if ty == GgmlType::Q5_K {
                u.codes = q5_k::codes(b);
            } else {
                let qs = &b[16..144];
                for k in 0..4 {
                    for l in 0..32 {
                        u.codes[64 * k + l] = qs[32 * k + l] & 0xf;
                        u.codes[64 * k + 32 + l] = qs[32 * k + l] >> 4;
                    }
                }
            }
        }
        GgmlType::Q3_K => {
            for (c, v) in u.codes.iter_mut().zip(q3_k::codes(b)) {
                *c = (v + 4) as u8;
            }
            u.bias = 4;
            for (s, v) in u.scales.iter_mut().zip(q3_k::scales(&b[96..108])) {
                *s = v as i32;
            }
            u.d = read_f16(&b[108..]);
        }
        GgmlType::Q2_K => {
            u.codes = q2_k::codes(b);
            for ((s, m), &x) in u.scales.iter_mut().zip(u.mins.iter_mut()).zip(&b[..16]) {
                *s = (x & 0xf) as i32;
                *m = (x >> 4) as i32;
            }
            u.d = read_f16(&b[80..]);
            u.dmin = read_f16(&b[82..]);
            u.has_min = true;
        }
        GgmlType::IQ4_XS => {
            let kv = crate::formats::legacy::KVALUES_IQ4NL;
            u.d = read_f16(b);
            u.sub = 32;
            u.bias = 128;
            for ib in 0..8 {
                u.scales[ib] = crate::formats::iq4::xs_scale(b, ib);
                let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
                for j in 0..16 {
                    u.codes[32 * ib + j] = (kv[(qs[j] & 0xf) as usize] as i32 + 128) as u8;
                    u.codes[32 * ib + 16 + j] = (kv[(qs[j] >> 4) as usize] as i32 + 128) as u8;
                }
            }
        }
        other => panic!("no tiled kernel for {other:?}"),
    }
    u
}

/// The block's exact integer sums (s1, s2) against one Q8_K block.
pub fn block_sums(u: &Unpacked, q8: &[u8], bsums: &[i16; 16]) -> (i32, i32) {
    let (mut s1, mut s2) = (0i32, 0i32);
    for s in 0..QK_K / u.sub {
        let e = s * u.sub;
        let dot: i32 = (e..e + u.sub)
            .map(|i| (u.codes[i] as i32 - u.bias) * q8[i] as i8 as i32)
            .sum();
        s1 += u.scales[s] * dot;
        if u.has_min {
            let per = u.sub / 16;
            let bs: i32 = bsums[s * per..(s + 1) * per].iter().map(|&v| v as i32).sum();
            s2 += u.mins[s] * bs;
        }
    }
    (s1, s2)
}

/// One block's contribution folded into `acc`, as the reference's epilogue does. The AVX2
/// kernel writes one fused multiply-add; the AVX-512 VNNI kernel writes a multiply and an add
/// (`_mm512_add_ps(p, _mm512_mul_ps(result, d1))`), which GCC — llama.cpp's build compiler on
/// Linux, `-ffp-contract=fast` by default — fuses into the same `vfmadd213ps` (checked in the
/// b11434 native build's object code), so both give these bits.
#[inline(always)]
pub fn fold(acc: f32, d: f32, dmin: f32, has_min: bool, s1: i32, s2: i32, d8: f32) -> f32 {
    let mut res = d * s1 as f32;
    if has_min {
        res = (-dmin).mul_add(s2 as f32, res);
    }
    res.mul_add(d8, acc)
}

/// Scalar tiled-order product of one `ty` row with one Q8_K row of n elements.
pub fn dot_ref(ty: GgmlType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let bb = ty.type_size();
    let mut acc = 0.0f32;
    for i in 0..n / QK_K {
        let u = unpack(ty, &w[i * bb..(i + 1) * bb]);
        let (d8, q8, bsums) = q8k_parts(&a[i * Q8_K_BYTES..(i + 1) * Q8_K_BYTES]);
        let (s1, s2) = block_sums(&u, q8, &bsums);
        acc = fold(acc, u.d, u.dmin, u.has_min, s1, s2, d8);
    }
    acc
}

macro_rules! ref_fns {
    ($($ty:ident => $f:ident;)*) => {
        $(
            fn $f(n: usize, w: &[u8], a: &[u8]) -> f32 {
                dot_ref(GgmlType::$ty, n, w, a)
            }
        )*
        /// The scalar tiled-order dot for `ty`.
        pub(crate) fn ref_fn(ty: GgmlType) -> Option<DotFn> {
            Some(match ty {
                $(GgmlType::$ty => $f,)*
                _ => return None,
            })
        }
    };
}

ref_fns! {
    Q6_K => ref_q6_k;
    Q5_K => ref_q5_k;
    Q4_K => ref_q4_k;
    Q3_K => ref_q3_k;
    Q2_K => ref_q2_k;
    IQ4_XS => ref_iq4_xs;
}
