//! The kernel set in force: what the CPU offers (CPUID, read once), the process-wide cap
//! (`set_max_isa`) and the force-the-reference switch. A leaf: the kernel tables (`dispatch`),
//! the f32 primitives and the repack rules all read it, and it imports none of them.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::OnceLock;

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
/// 0 = no cap, else 1 + the rank of the highest Isa allowed (see `set_max_isa`).
static MAX_ISA: AtomicU8 = AtomicU8::new(0);

fn rank(isa: Isa) -> u8 {
    match isa {
        Isa::Scalar => 0,
        Isa::Avx2 | Isa::Neon => 1,
        Isa::Avx512 => 2,
    }
}

/// Cap the kernel set (e.g. `Some(Isa::Avx2)` on an AVX-512 machine, for A/B timing or
/// bisecting); `None` removes the cap. Process-wide, meant to be set at start-up.
pub fn set_max_isa(cap: Option<Isa>) {
    MAX_ISA.store(cap.map_or(0, |i| 1 + rank(i)), Ordering::Relaxed);
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Bumped whenever the kernel set may change (`set_max_isa`, `set_force_reference`), so code
/// that caches a choice made from it (`f32ops`' width) chooses again.
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// The current kernel-set generation (see `GENERATION`).
#[inline]
pub fn generation() -> u32 {
    GENERATION.load(Ordering::Relaxed) & 0x00ff_ffff
}

/// Whether the llama.cpp build whose float orders xwen reproduces takes its AVX-512 paths: the
/// CPU has them and no `set_max_isa` cap below AVX-512 is in force. A cap to AVX2 thus means
/// "reproduce an AVX2 build" on any x86 machine — the build the committed parity fixtures come
/// from — in the kernels and in the reference-side choices (the
/// Q2_K repack, the f32 primitives' width). The scalar switch keeps the native build's orders.
pub fn reference_avx512() -> bool {
    let cap = MAX_ISA.load(Ordering::Relaxed);
    (cap == 0 || cap > 1 + rank(Isa::Avx2)) && detected() == Isa::Avx512
}

/// Force the scalar reference everywhere. Meant to be set once at start-up; kernels already
/// handed out (e.g. inside a running matvec) finish with the set they started with.
pub fn set_force_reference(on: bool) {
    if FORCE_REFERENCE.swap(on, Ordering::Relaxed) != on {
        GENERATION.fetch_add(1, Ordering::Relaxed);
    }
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
        return Isa::Scalar;
    }
    let d = detected();
    match MAX_ISA.load(Ordering::Relaxed) {
        0 => d,
        cap if rank(d) < cap => d,
        1 => Isa::Scalar,
        _ => match d {
            Isa::Avx512 => Isa::Avx2,
            other => other,
        },
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

