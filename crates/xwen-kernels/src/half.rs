//! IEEE half (F16) and bfloat16 conversions, bit-exact with ggml on x86.
//!
//! f32 -> f16 rounds to nearest even like F16C's `vcvtps2ph` with `_MM_FROUND_TO_NEAREST_INT`
//! (ggml-cpu uses that instruction for `ggml_cpu_fp32_to_fp16` and GGML_CPU_FP32_TO_FP16 on x86).
//! NaN keeps its sign and top payload bits and is forced quiet, as the instruction does.
//! f32 -> bf16 is ggml's GGML_FP32_TO_BF16 (ggml-impl.h:623): round to nearest even, NaN forced
//! quiet by OR-ing bit 6 into the truncated pattern.

#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if mant == 0 {
            sign
        } else {
            // Subnormal half: mant * 2^-24, exact in f32.
            let v = (mant as f32) * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (mant << 13)
    } else {
        sign | ((exp + 112) << 23) | (mant << 13)
    };
    f32::from_bits(bits)
}

#[inline]
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let abs = x & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        // NaN: quiet, payload truncated.
        return sign | 0x7e00 | ((abs >> 13) & 0x3ff) as u16;
    }
    if abs >= 0x4780_0000 {
        // >= 65536 before rounding; anything that rounds past 65504 becomes inf (handled below too).
        return sign | 0x7c00;
    }
    if abs < 0x3880_0000 {
        // Below the smallest normal half (2^-14): round abs * 2^24 to an integer count of 2^-24.
        // The multiply is exact (power of two) and the f32 add rounds to nearest even.
        let v = f32::from_bits(abs) * 16_777_216.0;
        // v < 1024; adding 2^23 then reading the mantissa rounds to nearest even.
        let r = (v + 8_388_608.0).to_bits() - 0x4b00_0000;
        return sign | r as u16;
    }
    // Normal: rebias exponent, round the 13 dropped mantissa bits to nearest even.
    let mant_drop = abs & 0x1fff;
    let mut h = (abs >> 13) - (112 << 10);
    if mant_drop > 0x1000 || (mant_drop == 0x1000 && (h & 1) == 1) {
        h += 1; // may carry into the exponent, up to 0x7c00 = inf, which is correct
    }
    sign | h as u16
}

#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// Reads the little-endian f16 at `b[0..2]` as f32.
#[inline]
pub fn read_f16(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

#[inline]
pub fn write_f16(b: &mut [u8], v: f32) {
    b[..2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
}

#[inline]
pub fn read_f32(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_pattern() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f32_to_f16(f) & 0x7c00 == 0x7c00 && f32_to_f16(f) & 0x3ff != 0);
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "pattern {h:#06x} -> {f}");
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even_at_every_midpoint() {
        // Midpoints between consecutive halves (normal and subnormal) must go to the even one;
        // one f32 ulp either side must go to the nearer one.
        for h in 0u16..0x7bff {
            let lo = f16_to_f32(h) as f64;
            let hi = f16_to_f32(h + 1) as f64;
            let mid = ((lo + hi) / 2.0) as f32;
            let want = if h & 1 == 0 { h } else { h + 1 };
            assert_eq!(f32_to_f16(mid), want, "mid of {h:#06x}");
            let below = f32::from_bits(mid.to_bits() - 1);
            let above = f32::from_bits(mid.to_bits() + 1);
            assert_eq!(f32_to_f16(below), h);
            assert_eq!(f32_to_f16(above), h + 1);
        }
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds up to inf
        assert_eq!(f32_to_f16(65519.99), 0x7bff);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
    }

    #[test]
    fn bf16_matches_ggml_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (down).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }
}
