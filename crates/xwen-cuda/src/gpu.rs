//! The device: a CUDA context, one stream, and the kernels of `kernels.cu` compiled by NVRTC
//! for this card's architecture at load (no toolkit at build time: docs/decisions.md
//! "CUDA backend: dynamic loading and NVRTC").

use crate::error::{CudaError, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};
use std::collections::HashMap;
use std::sync::Arc;

const SOURCE: &str = include_str!("kernels.cu");

/// The kernels `kernels.cu` defines (each `extern "C" __global__`).
const KERNELS: &[&str] = &[
    "mv",
    "mv_glu",
    "mm",
    "mm_glu",
    "mm_tc",
    "silu_mul",
    "delta_prep",
    "delta_rows",
    "delta_out",
    "rms_norm",
    "embed",
    "attn_heads",
    "attn_split",
    "attn_merge",
    "conv_step",
    "delta_step",
    "moe_route",
    "moe_combine",
    "argmax",
    "quant_q8",
    "dequant_f16",
    "to_f16",
    "moe_sort",
    "mm_ex",
    "mv4",
    "mv4_cols",
    "mv4_route",
    "mv4_cols_route",
    "mv_cols",
    "mv_glu_cols",
    "conv_prompt",
    "conv_shift",
    "delta_step_rows",
    "moe_route_warp",
    "moe_down_combine",
    "moe_down_combine_norm",
    "mv_norm",
    "quant_q8_2",
    "moe_glu",
    "moe_local_ids",
    "moe_glu_tiles",
    "mv_tiles",
    "mtp_concat_norm",
    "argmax_answer",
];

/// A kernel argument: device pointers travel as plain 64-bit values.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// What `xwen --version` and the load line say about the device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub driver_version: i32,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (maj, min) = self.compute_capability;
        let (dmaj, dmin) = (self.driver_version / 1000, (self.driver_version % 1000) / 10);
        write!(f, "cuda:{} {} (sm_{maj}{min}, {} MiB, CUDA driver {dmaj}.{dmin})", self.ordinal, self.name, self.total_bytes >> 20)
    }
}

/// Opens device `ordinal`'s driver and reads what it is, without compiling anything.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    let ctx = open(ordinal)?;
    info_of(&ctx)
}

fn open(ordinal: usize) -> Result<Arc<CudaContext>> {
    // dynamic loading panics on first use where libcuda is missing: ask first
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDevice("the CUDA driver library (libcuda.so) is not installed".into()));
    }
    let count = CudaContext::device_count().map_err(|e| CudaError::NoDevice(format!("{e}")))?;
    if ordinal >= count.max(0) as usize {
        return Err(CudaError::NoDevice(format!("cuda:{ordinal} asked for, {count} device(s) present")));
    }
    Ok(CudaContext::new(ordinal)?)
}

fn info_of(ctx: &Arc<CudaContext>) -> Result<DeviceInfo> {
    let (free, total) = ctx.mem_get_info()?;
    let mut driver = 0i32;
    // SAFETY: cuDriverGetVersion writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
    Ok(DeviceInfo {
        ordinal: ctx.ordinal(),
        name: ctx.name()?,
        compute_capability: ctx.compute_capability()?,
        total_bytes: total as u64,
        free_bytes: free as u64,
        driver_version: driver,
    })
}

/// kernels.cu compiled by NVRTC for compute capability `arch` with `knobs`: the PTX, holding
/// every kernel the backend launches. Needs the NVRTC library, not a device.
pub fn compile_kernels(arch: (u32, u32), knobs: &Knobs) -> Result<cudarc::nvrtc::Ptx> {
    let mut options = vec![format!("--gpu-architecture=compute_{}{}", arch.0, arch.1), "--std=c++17".into()];
    options.extend(knobs.defines());
    let opts = cudarc::nvrtc::CompileOptions { options, ..Default::default() };
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::Compile("the NVRTC library (libnvrtc.so, CUDA 12 or 13) is not installed".into()));
    }
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts).map_err(|e| CudaError::Compile(format!("{e:?}")))?;
    let text = ptx.to_src();
    if let Some(k) = KERNELS.iter().find(|k| !text.contains(&format!(".entry {k}("))) {
        return Err(CudaError::Compile(format!("kernels.cu defines no kernel {k}")));
    }
    Ok(ptx)
}

/// A context, its stream and the compiled kernels.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    funcs: HashMap<&'static str, CudaFunction>,
    pub info: DeviceInfo,
    /// cuBLAS for prompt products, where the library is present.
    pub blas: Option<crate::blas::Blas>,
    /// Per-kernel device time while profiling (`set_profiling`): name → (ms, launches).
    profile: std::sync::Mutex<Option<HashMap<String, (f64, u64)>>>,
    /// Launch each kernel as a programmatic dependent of the one before it (sm_90 and later;
    /// `XWEN_PDL=0` turns it off): see `launch_3d`.
    pdl: bool,
    /// The kernels' shape knobs they were compiled with (launch grids follow them).
    pub knobs: Knobs,
    /// Device memory that sequences' checkpoints may hold (`DevSeq::snapshot`).
    pub snapshots: SnapshotRoom,
    /// A stream of its own for reading checkpoints back (`read_f32_after`), made at its first
    /// use: such a read off the steps' thread must not queue ahead of a step's kernels.
    reads: std::sync::OnceLock<Arc<CudaStream>>,
}

/// The device memory checkpoints kept on the device may take: a ceiling the model sets once
/// its own buffers are planned (0, the default, keeps every checkpoint on the host), and what
/// the live ones hold.
#[derive(Debug, Default)]
pub struct SnapshotRoom {
    cap: std::sync::atomic::AtomicU64,
    used: std::sync::atomic::AtomicU64,
}

impl SnapshotRoom {
    pub fn set_cap(&self, bytes: u64) {
        self.cap.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// `bytes` more taken where they fit under the ceiling.
    pub fn take(&self, bytes: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let cap = self.cap.load(Relaxed);
        self.used.fetch_update(Relaxed, Relaxed, |u| (u + bytes <= cap).then_some(u + bytes)).is_ok()
    }

    pub fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Shape knobs of kernels.cu that both the kernels and their launches' grids depend on, passed
/// to NVRTC as definitions. `XWEN_CUDA_DEFINES` overrides them for A/B runs without a rebuild
/// (e.g. "-DMOE_DOWN_ROWS=4 -DMV_ROWS=2"); other -D definitions there pass through to the
/// kernels (their `#ifndef` defaults: Q4K_UNROLL; ROUTE_REDUX), anything else is refused.
#[derive(Clone, Debug)]
pub struct Knobs {
    /// Rows a warp of `mv` takes.
    pub mv_rows: usize,
    /// Rows a block (a warp a slot) of `moe_down_combine` takes.
    pub moe_down_rows: usize,
    /// Rows a warp of `moe_glu` takes (of its gate or of its up matrix).
    pub moe_glu_rows: usize,
    /// Decode-batch rows a warp of `mv_cols` / `mv4_cols` takes at once.
    pub mv_cols: usize,
    /// A decode batch's dense FFN through `mv_glu_cols` (the weights loaded once for
    /// `mv_cols` rows) instead of `mv_glu` a row at a time: the same bits (the op test
    /// `decode_batch_products_…` and the engine's batch tests hold it on an H100), 4B decode
    /// batches of 8 / 32 rows +1.7% / +2.6%; `-DMV_GLU_COLS=0` goes back to mv_glu.
    pub mv_glu_cols: bool,
    /// Routed slots of one expert a tile of a decode batch's grouped experts takes
    /// (`moe_glu_tiles`, `mv_tiles`: the expert's weights loaded once for them).
    pub moe_tile: usize,
    /// Decode batches of at least this many rows take their routed experts grouped per expert
    /// (moe_sort, then `moe_glu_tiles` / `mv_tiles`: each slot's bits those of its row alone);
    /// smaller ones a slot at a time (`moe_glu`, `moe_down_combine`). 0 (the default): never
    /// grouped — on an H100 the grouped path ran batches of 8 / 32 rows of the 35B-A3B at 591 /
    /// 813 t/s against 991 / 1225 a slot at a time (docs/bench.md).
    pub moe_group_rows: usize,
    /// A decode step's DeltaNet convolution inside the qkv product's launch (`mv4`'s fused
    /// epilogue, conv_step's arithmetic) instead of a launch of its own (`-DMV4_CONV=1`; off:
    /// 0.98–0.99× the default's tg128 on an H100, docs/decisions.md).
    pub mv4_conv: bool,
    /// A decode step's router top-k inside the router product's launch (`mv4_route`: its last
    /// block to finish routes, moe_route_warp's picks bit for bit) instead of a launch of its
    /// own (`-DFUSE_ROUTE=1`; off: with `-DFUSE_MIDS=1` it ran the 35B-A3B's tg128 at 371.7
    /// against 405.3 t/s on an H100, docs/bench.md).
    pub fuse_route: bool,
    /// A decode step's experts' hidden rows quantized inside their gate/up launch (`moe_glu`:
    /// the last block of each slot quantizes its row, quant_q8_2's bits) instead of a launch of
    /// their own (`-DFUSE_MIDS=1`; off, measured slower with `FUSE_ROUTE`).
    pub fuse_mids: bool,
    /// A decode step's RMSNorms inside the launch that writes their input (`mv_norm` for one
    /// row's out and down projections, `moe_down_combine_norm` for the MoE layer's output: the
    /// last block normalizes, rms_norm's bits) instead of launches of their own
    /// (`-DFUSE_NORM=1`; off: 373.4 against 405.3 t/s, all three 342.5, on an H100).
    pub fuse_norm: bool,
    /// Other -D definitions from the environment.
    extra: Vec<String>,
}

impl Knobs {
    fn from_env() -> Result<Knobs> {
        Knobs::with_defines(&std::env::var("XWEN_CUDA_DEFINES").unwrap_or_default())
    }

    /// The default knobs with `defs` (XWEN_CUDA_DEFINES' form: "-DNAME=VALUE …") applied.
    pub fn with_defines(defs: &str) -> Result<Knobs> {
        let mut k = Knobs { mv_rows: 1, moe_down_rows: 2, moe_glu_rows: 2, mv_cols: 8, mv_glu_cols: true, moe_tile: 4, moe_group_rows: 0, mv4_conv: false, fuse_route: false, fuse_mids: false, fuse_norm: false, extra: Vec::new() };
        for d in defs.split_whitespace() {
            let Some(def) = d.strip_prefix("-D") else {
                return Err(CudaError::Compile(format!("XWEN_CUDA_DEFINES: '{d}' is not a -DNAME=VALUE definition")));
            };
            let rows = |v: &str| match v.parse::<usize>() {
                Ok(n @ (1 | 2 | 4)) => Ok(n),
                _ => Err(CudaError::Compile(format!("XWEN_CUDA_DEFINES: {d}: rows are 1, 2 or 4"))),
            };
            match def.split_once('=') {
                Some(("MV_ROWS", v)) => k.mv_rows = rows(v)?,
                Some(("MOE_DOWN_ROWS", v)) => k.moe_down_rows = rows(v)?,
                Some(("MOE_GLU_ROWS", v)) => k.moe_glu_rows = rows(v)?,
                Some(("MV_GLU_COLS", v)) => k.mv_glu_cols = v != "0",
                Some(("MOE_TILE", v)) => k.moe_tile = rows(v)?,
                Some(("MV4_CONV", v)) => k.mv4_conv = v != "0",
                Some(("FUSE_ROUTE", v)) => k.fuse_route = v != "0",
                Some(("FUSE_MIDS", v)) => k.fuse_mids = v != "0",
                Some(("FUSE_NORM", v)) => k.fuse_norm = v != "0",
                Some(("MOE_GROUP_ROWS", v)) => {
                    k.moe_group_rows = v.parse::<usize>().map_err(|_| CudaError::Compile(format!("XWEN_CUDA_DEFINES: {d}: MOE_GROUP_ROWS is a row count (0: never)")))?
                }
                Some(("MV_COLS", v)) => {
                    k.mv_cols = match v.parse::<usize>() {
                        Ok(n @ (1 | 2 | 4 | 8 | 16)) => n,
                        _ => return Err(CudaError::Compile(format!("XWEN_CUDA_DEFINES: {d}: MV_COLS is 1, 2, 4, 8 or 16"))),
                    }
                }
                _ => k.extra.push(d.to_string()),
            }
        }
        Ok(k)
    }

    fn defines(&self) -> Vec<String> {
        let mut v = vec![
            format!("-DMV_ROWS={}", self.mv_rows),
            format!("-DMOE_DOWN_ROWS={}", self.moe_down_rows),
            format!("-DMOE_GLU_ROWS={}", self.moe_glu_rows),
            format!("-DMV_COLS={}", self.mv_cols),
            format!("-DMOE_TILE={}", self.moe_tile),
        ];
        v.extend(self.extra.iter().cloned());
        v
    }
}

impl Gpu {
    /// Opens device `ordinal` and compiles the kernels for it.
    pub fn new(ordinal: usize) -> Result<Gpu> {
        let ctx = open(ordinal)?;
        let info = info_of(&ctx)?;
        let (maj, min) = info.compute_capability;
        // the kernels use Ampere's warp reductions (__reduce_add_sync) and bf16 conversions
        if maj < 8 {
            return Err(CudaError::Compile(format!(
                "{} has compute capability {maj}.{min}; xwen's CUDA kernels need 8.0 (Ampere) or newer: run with -ngl 0 (the CPU)",
                info.name
            )));
        }
        let knobs = Knobs::from_env()?;
        let ptx = compile_kernels((maj as u32, min as u32), &knobs)?;
        let module = ctx.load_module(ptx)?;
        let mut funcs = HashMap::new();
        for &k in KERNELS {
            funcs.insert(k, module.load_function(k)?);
        }
        // the engine's buffers live as long as the model; no per-use event bookkeeping
        // SAFETY: every launch and copy goes through the one stream below, in order.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let blas = crate::blas::Blas::open(&stream);
        let pdl = maj >= 9 && std::env::var("XWEN_PDL").map_or(true, |v| v != "0");
        Ok(Gpu { ctx, stream, _module: module, funcs, info, blas, profile: std::sync::Mutex::new(None), pdl, knobs, snapshots: SnapshotRoom::default(), reads: std::sync::OnceLock::new() })
    }

    /// Launches `name` on the stream with `args` in the kernel's parameter order.
    pub fn launch(&self, name: &str, grid: (u32, u32), block: u32, smem: u32, args: &[Arg]) -> Result<()> {
        self.launch_3d(name, (grid.0, grid.1, 1), block, smem, args)
    }

    /// `launch` over a three-dimensional grid.
    ///
    /// On sm_90 and later each kernel is launched as a programmatic dependent of the one before
    /// it on the stream: the driver starts it while its predecessor's last blocks still run, and
    /// every kernel begins with `pdl_start` (kernels.cu), which waits until the predecessor has
    /// finished and its writes are visible before reading or writing anything. A decode step is
    /// hundreds of short kernels, and this hides most of the launch gap between them.
    pub fn launch_3d(&self, name: &str, grid: (u32, u32, u32), block: u32, smem: u32, args: &[Arg]) -> Result<()> {
        let f = self.funcs.get(name).ok_or_else(|| CudaError::Unsupported(format!("no kernel {name}")))?;
        let mut prof = self.profile.lock().unwrap_or_else(|e| e.into_inner());
        let Some(table) = prof.as_mut() else {
            return self.launch_pdl(f, grid, block, smem, args, self.pdl);
        };
        // profiling: each launch between two events, waited for (so never under capture)
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (t0, t1) = (self.ctx.new_event(timed)?, self.ctx.new_event(timed)?);
        t0.record(&self.stream)?;
        self.launch_pdl(f, grid, block, smem, args, false)?;
        t1.record(&self.stream)?;
        t1.synchronize()?;
        let ms = t0.elapsed_ms(&t1)? as f64;
        let e = table.entry(name.to_string()).or_insert((0.0, 0));
        e.0 += ms;
        e.1 += 1;
        Ok(())
    }

    fn launch_pdl(&self, f: &CudaFunction, grid: (u32, u32, u32), block: u32, smem: u32, args: &[Arg], pdl: bool) -> Result<()> {
        use cudarc::driver::sys;
        // each argument in an 8-byte slot; the driver reads the parameter's own size from it
        // (little-endian, so a 4-byte value sits at the slot's start)
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p,
                Arg::I32(v) => v as u32 as u64,
                Arg::I64(v) => v as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        let mut params: Vec<*mut std::ffi::c_void> = slots.iter_mut().map(|s| (s as *mut u64).cast()).collect();
        // SAFETY: a zeroed attribute value is a valid union of plain integers.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: pdl as u32,
        };
        self.ctx.bind_to_thread()?;
        // SAFETY: the argument lists match kernels.cu's signatures (tests/ops.rs runs each);
        // `slots` outlives the call, which copies the parameters.
        unsafe { sys::cuLaunchKernelEx(&cfg, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }.result()?;
        Ok(())
    }

    /// Starts (true) or stops (false) timing each launch; stopping returns the table, the
    /// kernels by time, descending.
    pub fn set_profiling(&self, on: bool) -> Vec<(String, f64, u64)> {
        let mut prof = self.profile.lock().unwrap_or_else(|e| e.into_inner());
        let old = std::mem::replace(&mut *prof, on.then(HashMap::new));
        let mut rows: Vec<(String, f64, u64)> = old.unwrap_or_default().into_iter().map(|(k, (ms, n))| (k, ms, n)).collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        rows
    }

    /// A zeroed device buffer of `bytes`.
    pub fn zeros(&self, bytes: usize) -> Result<DevBuf> {
        let s = self.stream.alloc_zeros::<u8>(bytes.max(4))?;
        Ok(DevBuf::wrap(s, &self.stream))
    }

    /// A new device buffer holding a copy of `src` (on the stream).
    pub fn duplicate(&self, src: &DevBuf) -> Result<DevBuf> {
        let s = self.stream.clone_dtod(&src.slice)?;
        Ok(DevBuf::wrap(s, &self.stream))
    }

    /// A device copy of `data`.
    pub fn upload(&self, data: &[u8]) -> Result<DevBuf> {
        let s = self.stream.clone_htod(data)?;
        Ok(DevBuf::wrap(s, &self.stream))
    }

    pub fn upload_f32(&self, data: &[f32]) -> Result<DevBuf> {
        self.upload(as_bytes(data))
    }

    pub fn upload_i32(&self, data: &[i32]) -> Result<DevBuf> {
        self.upload(i32_bytes(data))
    }

    /// Copies `src` into the start of `dst`.
    pub fn write(&self, dst: &mut DevBuf, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice.slice_mut(0..src.len());
        self.stream.memcpy_htod(src, &mut view)?;
        Ok(())
    }

    /// The first `n` f32 of `src`, on the host (waits for the stream).
    pub fn read_f32(&self, src: &DevBuf, n: usize) -> Result<Vec<f32>> {
        self.read_f32_at(src, 0, n)
    }

    /// `n` f32 of `src` from f32 `first` on, on the host (waits for the stream).
    pub fn read_f32_at(&self, src: &DevBuf, first: usize, n: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; n];
        self.read_into(src, 4 * first, &mut out)?;
        Ok(out)
    }

    /// The first `n` u16 of `src` (f16 bits), on the host (waits for the stream).
    pub fn read_u16(&self, src: &DevBuf, n: usize) -> Result<Vec<u16>> {
        let mut out = vec![0u16; n];
        self.read_into(src, 0, &mut out)?;
        Ok(out)
    }

    pub fn read_i32(&self, src: &DevBuf, n: usize) -> Result<Vec<i32>> {
        let mut out = vec![0i32; n];
        self.read_into(src, 0, &mut out)?;
        Ok(out)
    }

    /// `out`'s worth of `src` from byte `first` on, straight into `out` (waits for the stream;
    /// none copied for an empty `out`). Straight in, not through a byte vector converted
    /// element by element: a sequence's recurrent states (tens of MB) are read this way at
    /// every server checkpoint, and the conversion cost more than the copy.
    fn read_into<T: Plain>(&self, src: &DevBuf, first: usize, out: &mut [T]) -> Result<()> {
        Self::read_into_on(&self.stream, src, first, out)
    }

    /// `read_into` on `stream`.
    fn read_into_on<T: Plain>(stream: &Arc<CudaStream>, src: &DevBuf, first: usize, out: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(out);
        if bytes == 0 {
            return Ok(());
        }
        if first + bytes > src.bytes() {
            return Err(CudaError::Unsupported(format!("a read of {bytes} bytes at {first} from a buffer of {}", src.bytes())));
        }
        // SAFETY: `Plain` types have no padding and every byte pattern is a value of them; the
        // byte view covers exactly `out`, which outlives the (synchronous) copy.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), bytes) };
        stream.memcpy_dtoh(&src.slice.slice(first..first + bytes), dst)?;
        Ok(())
    }

    /// Each of `srcs` whole as f32 on the host, read on the reads' stream once the work before
    /// `ready` (recorded on the model's stream) is done: reads that may run on another thread
    /// while the model's stream computes (`DevSnapshot::download`).
    pub fn read_f32_after(&self, srcs: &[&DevBuf], ready: &cudarc::driver::CudaEvent) -> Result<Vec<Vec<f32>>> {
        let reads = match self.reads.get() {
            Some(s) => s,
            None => {
                let s = self.ctx.new_stream()?;
                self.reads.get_or_init(|| s)
            }
        };
        reads.wait(ready)?;
        let out = srcs
            .iter()
            .map(|src| {
                let mut out = vec![0f32; src.bytes() / 4];
                Self::read_into_on(reads, src, 0, &mut out)?;
                Ok(out)
            })
            .collect::<Result<Vec<_>>>()?;
        reads.synchronize()?;
        Ok(out)
    }

    /// Copies all of `src` over `dst` (the same size), on the stream.
    pub fn copy(&self, dst: &mut DevBuf, src: &DevBuf) -> Result<()> {
        if dst.bytes() != src.bytes() {
            return Err(CudaError::Unsupported(format!("a copy of {} bytes into {}", src.bytes(), dst.bytes())));
        }
        self.stream.memcpy_dtod(&src.slice, &mut dst.slice)?;
        Ok(())
    }

    /// Copies `bytes` bytes from the device address `src` to `dst`, on the stream. The caller's
    /// addresses are into live buffers of this context holding that many bytes.
    pub fn copy_at(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: see above; the copy is ordered on the model's stream with the kernels.
        unsafe { cudarc::driver::sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream.cu_stream()) }.result()?;
        Ok(())
    }

    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize()?;
        Ok(())
    }

    /// Copies `src` to the device address `dst`, on the stream. `src` may be dropped when this
    /// returns: a copy from pageable memory is staged by the driver before the call returns.
    pub fn write_at(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.write_at_on(&self.stream, dst, src)
    }

    /// `write_at` on another stream of this context (a pinned `src` must outlive the copy).
    pub fn write_at_on(&self, stream: &CudaStream, dst: u64, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's `dst` is an address into a live buffer with `src.len()` bytes
        // free (ExpertCache: a pool slot, the ids scratch); the source is staged or pinned.
        unsafe { cudarc::driver::sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream.cu_stream()) }.result()?;
        Ok(())
    }

    /// `n` f32 at the device address `src`, on the host (waits for the stream).
    pub fn read_f32_ptr(&self, src: u64, n: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; n];
        if n > 0 {
            self.ctx.bind_to_thread()?;
            // SAFETY: the caller's `src` is an address into a live buffer holding `n` f32; the
            // stream is waited for before `out` is read.
            unsafe { cudarc::driver::sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), src, n * 4, self.stream.cu_stream()) }.result()?;
            self.sync()?;
        }
        Ok(out)
    }

    /// Copies `dst.len()` bytes at the device address `src` into `dst` on the stream, without
    /// waiting (page-locked `dst`: the copy runs after the call returns; read `dst` after a
    /// sync).
    pub fn read_async(&self, dst: &mut [u8], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: `src` is an address into a live buffer holding `dst.len()` bytes; `dst` is
        // not read before the caller's sync.
        unsafe { cudarc::driver::sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), self.stream.cu_stream()) }.result()?;
        Ok(())
    }

    /// An event that times the stream between two records (`elapsed_ms`).
    pub fn timed_event(&self) -> Result<cudarc::driver::CudaEvent> {
        Ok(self.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?)
    }

    /// A host buffer of `bytes` the device copies from at the bus's full speed (page-locked),
    /// or, where the driver cannot lock that much, an ordinary one (copies staged, slower).
    pub fn host_buf(&self, bytes: usize) -> Result<HostBuf> {
        self.ctx.bind_to_thread()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: cuMemHostAlloc writes a pointer to `bytes` page-locked bytes or fails.
        let r = unsafe { cudarc::driver::sys::cuMemHostAlloc(&mut p, bytes.max(1), 0) };
        if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            return Ok(HostBuf::Pinned { ptr: p.cast(), len: bytes, ctx: self.ctx.clone() });
        }
        Ok(HostBuf::Pageable(vec![0u8; bytes]))
    }
}

/// Host memory the device's copies read from (`Gpu::host_buf`).
pub enum HostBuf {
    Pinned { ptr: *mut u8, len: usize, ctx: Arc<CudaContext> },
    Pageable(Vec<u8>),
}

// SAFETY: the pinned bytes are owned by this value alone (freed in Drop); the pointer is never
// shared outside the borrows `bytes` and `bytes_mut` hand out.
unsafe impl Send for HostBuf {}
// SAFETY: a shared reference only reads.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    pub fn bytes(&self) -> &[u8] {
        match self {
            // SAFETY: `len` bytes were allocated at `ptr` and live until Drop.
            HostBuf::Pinned { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            HostBuf::Pageable(v) => v,
        }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: as `bytes`, and `&mut self` is the only borrow.
            HostBuf::Pinned { ptr, len, .. } => unsafe { std::slice::from_raw_parts_mut(*ptr, *len) },
            HostBuf::Pageable(v) => v,
        }
    }

    pub fn pinned(&self) -> bool {
        matches!(self, HostBuf::Pinned { .. })
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if let HostBuf::Pinned { ptr, ctx, .. } = self {
            let _ = ctx.bind_to_thread();
            // SAFETY: allocated by cuMemHostAlloc in `Gpu::host_buf`, freed once.
            unsafe { cudarc::driver::sys::cuMemFreeHost(ptr.cast()) };
        }
    }
}

/// A device allocation and its address (kernels take addresses, so a captured graph's
/// arguments stay valid as long as the buffer lives).
pub struct DevBuf {
    slice: CudaSlice<u8>,
    pub ptr: u64,
}

impl DevBuf {
    fn wrap(slice: CudaSlice<u8>, stream: &CudaStream) -> DevBuf {
        let ptr = {
            let (p, _sync) = slice.device_ptr(stream);
            p
        };
        DevBuf { slice, ptr }
    }

    pub fn bytes(&self) -> usize {
        self.slice.len()
    }

    /// The address `bytes` into the buffer.
    pub fn at(&self, bytes: usize) -> u64 {
        self.ptr + bytes as u64
    }
}

/// Element types a device buffer is read back as: no padding, every bit pattern a value, the
/// device's byte order (little-endian, as every host CUDA runs on).
trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for u16 {}
impl Plain for i32 {}

pub fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// `v`'s bytes as a kernel's int table reads them (the device, like the host, is little-endian).
pub fn i32_bytes(v: &[i32]) -> &[u8] {
    // SAFETY: i32 has no padding and any byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

impl Gpu {
    /// Zeroes the whole of `buf`.
    pub fn zero(&self, buf: &mut DevBuf) -> Result<()> {
        self.stream.memset_zeros(&mut buf.slice)?;
        Ok(())
    }
}
