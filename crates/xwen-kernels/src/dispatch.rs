//! Runtime choice of the SIMD kernel set, made once from CPUID (never from compile-time target
//! features, so one binary serves every x86-64), plus a process-wide switch that forces the
//! scalar reference everywhere for bisecting numeric differences.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::formats::{self, DotFn, MultiDotFn};
use crate::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL/VNNI on top of the AVX2 set (kernels without a 512-bit version use AVX2).
    Avx512,
    Neon,
}

static FORCE_REFERENCE: AtomicBool = AtomicBool::new(false);

/// Force the scalar reference everywhere. Meant to be set once at start-up; kernels already
/// handed out (e.g. inside a running matvec) finish with the set they started with.
pub fn set_force_reference(on: bool) {
    FORCE_REFERENCE.store(on, Ordering::Relaxed);
}

pub fn force_reference() -> bool {
    FORCE_REFERENCE.load(Ordering::Relaxed)
}

/// The best kernel set this CPU supports, ignoring the force switch.
pub fn detected() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

/// The kernel set in use now.
pub fn active() -> Isa {
    if force_reference() {
        Isa::Scalar
    } else {
        detected()
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    if avx512 {
        Isa::Avx512
    } else if avx2 {
        Isa::Avx2
    } else {
        Isa::Scalar
    }
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Isa {
    if std::arch::is_aarch64_feature_detected!("neon") {
        Isa::Neon
    } else {
        Isa::Scalar
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Isa {
    Isa::Scalar
}

/// The dot kernel for `weight` under `isa` (falling back to scalar where that set has none).
/// Only hands out SIMD kernels for an `isa` this CPU supports.
pub fn dot_fn_for(weight: GgmlType, isa: Isa) -> Option<DotFn> {
    let scalar = formats::format(weight)?.dot?;
    let isa = if supported(isa) { isa } else { Isa::Scalar };
    let simd = match isa {
        Isa::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            crate::simd::avx512::dot_fn(weight).or_else(|| crate::simd::avx2::dot_fn(weight))
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => crate::simd::avx2::dot_fn(weight),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => crate::simd::neon::dot_fn(weight),
        #[allow(unreachable_patterns)]
        _ => None,
    };
    Some(simd.unwrap_or(scalar))
}

/// Whether kernels of `isa` may run on this CPU.
pub fn supported(isa: Isa) -> bool {
    matches!(
        (isa, detected()),
        (Isa::Scalar, _)
            | (Isa::Avx2, Isa::Avx2 | Isa::Avx512)
            | (Isa::Avx512, Isa::Avx512)
            | (Isa::Neon, Isa::Neon)
    )
}

/// The dot kernel in use now for `weight`.
pub fn dot_fn(weight: GgmlType) -> Option<DotFn> {
    dot_fn_for(weight, active())
}

/// A multi-token kernel for `weight` whose per-token results are bit-identical to
/// `dot_fn(weight)`; None where the active set has none (callers then loop over `dot_fn`).
/// The AVX-512 set has no multi-token kernels yet, since the AVX2 ones would not match its
/// single-token results bit for bit.
pub fn multi_dot_fn(weight: GgmlType) -> Option<MultiDotFn> {
    match active() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => crate::simd::avx2_multi::multi_dot_fn(weight),
        _ => None,
    }
}
