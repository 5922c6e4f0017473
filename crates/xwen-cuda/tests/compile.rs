//! The CUDA kernels compile, without a GPU: kernels.cu through NVRTC for Ampere and Hopper,
//! with the default shape knobs and with the others `XWEN_CUDA_DEFINES` offers for A/B runs,
//! every kernel the backend launches present in the PTX. A kernel that NVRTC refuses would
//! otherwise first fail on the GPU machine, at load. The library is PyPI's nvidia-cuda-nvrtc
//! wheel (`.ci/run` installs it into target/nvrtc; XWEN_NVRTC may name another libnvrtc.so);
//! without it cargo lists this test as ignored (crates/prereqs.rs).

use std::path::PathBuf;
use xwen_cuda::gpu::{compile_kernels, Knobs};

fn nvrtc() -> PathBuf {
    match std::env::var_os("XWEN_NVRTC") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/nvrtc/nvidia/cu13/lib/libnvrtc.so.13"),
    }
}

#[test]
#[cfg_attr(xwen_no_nvrtc, ignore = "needs PyPI's nvidia-cuda-nvrtc in target/nvrtc (.ci/run installs it) or XWEN_NVRTC")]
fn the_kernels_compile_for_ampere_and_hopper_with_every_knob() {
    let path = nvrtc();
    // NVRTC opens its builtins library by name (libnvrtc-builtins.so.13.N) and cudarc opens
    // NVRTC by name (libnvrtc.so.13): each opened by its path first is then found loaded.
    let dir = path.parent().expect("a library in a folder");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so")))
        .collect();
    libs.push(path.clone());
    // SAFETY: the libraries' initialisers only register them.
    let opened: Vec<libloading::Library> = libs.iter().map(|p| unsafe { libloading::Library::new(p) }.unwrap_or_else(|e| panic!("{}: {e}", p.display()))).collect();
    for arch in [(8, 0), (9, 0)] {
        for defs in ["", "-DMV_ROWS=2 -DMOE_DOWN_ROWS=4 -DMOE_GLU_ROWS=1 -DROUTE_REDUX=0 -DMV_COLS=4 -DMOE_TILE=2 -DMV4_CONV=1 -DCOLS_NARROW=1", "-DMV_ROWS=4 -DMOE_DOWN_ROWS=1 -DMOE_GLU_ROWS=4 -DQ4K_UNROLL=1 -DMV_COLS=16 -DMV_GLU_COLS=0 -DMOE_TILE=1 -DMOE_GROUP_ROWS=0 -DCOLS_NARROW=1", "-DCOLS_NARROW=0"] {
            let knobs = Knobs::with_defines(defs).unwrap();
            let ptx = compile_kernels(arch, &knobs).unwrap_or_else(|e| panic!("sm_{}{} {defs:?}: {e}", arch.0, arch.1));
            assert!(ptx.to_src().contains(&format!(".target sm_{}{}", arch.0, arch.1)), "sm_{}{}: the PTX's target", arch.0, arch.1);
        }
    }
    std::mem::forget(opened);
}
