//! The reduction the ranks of a sharded model meet in, on device buffers (`xwen_engine::shard`):
//! NCCL between the GPUs of one host ([`Nccl`], NVLink or PCIe, never a home-made transport),
//! or through host memory and the engine's in-process collective ([`HostStaged`]) where ranks
//! share a GPU — the tests' N ranks on one card — or NCCL is absent.

use crate::error::{CudaError, Result};
use crate::gpu::{as_bytes, Gpu};
use std::sync::Arc;
use xwen_engine::shard::Collective;

/// One rank's end of a group's reductions over device buffers.
pub trait DeviceCollective: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;

    /// The `n` f32 at `ptr` on `gpu`'s device summed over the ranks into every rank's buffer,
    /// after the work queued on `gpu`'s stream and before what is queued after. Every value
    /// the ranks reduce has one owner and zeros elsewhere (`shard`), so the sum is the owner's
    /// bits whatever order a transport adds in.
    fn all_reduce_sum(&self, gpu: &Gpu, ptr: u64, n: usize) -> Result<()>;

    /// Fails the group: ranks waiting in a reduction, or entering one later, get an error.
    fn abort(&self, why: &str);
}

/// Reductions through host memory: the buffer read back, summed by the engine's collective
/// (`LocalGroup`: the ranks' threads in this process), written back. Waits for the stream.
pub struct HostStaged(pub Arc<dyn Collective>);

impl DeviceCollective for HostStaged {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn all_reduce_sum(&self, gpu: &Gpu, ptr: u64, n: usize) -> Result<()> {
        let mut v = gpu.read_f32_ptr(ptr, n)?;
        self.0.all_reduce_sum(&mut v)?;
        gpu.write_at(ptr, as_bytes(&v))
    }

    fn abort(&self, why: &str) {
        self.0.abort(why)
    }
}

/// `size` ranks' ends of an in-process group staged through host memory.
pub fn host_staged(size: usize) -> Vec<Arc<dyn DeviceCollective>> {
    xwen_engine::shard::LocalGroup::new(size).into_iter().map(|g| Arc::new(HostStaged(Arc::new(g))) as Arc<dyn DeviceCollective>).collect()
}

/// A rank's NCCL communicator (one of a clique made by `Nccl::clique` in this process).
pub struct Nccl {
    comm: NcclComm,
    rank: usize,
    size: usize,
    aborted: std::sync::Mutex<Option<String>>,
}

/// The driver's handle of a communicator.
struct NcclComm(cudarc::nccl::sys::ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread, by one thread at a time: each rank's
// calls come from that rank's thread (`DeviceGroup`), in order.
unsafe impl Send for NcclComm {}
// SAFETY: see above; `&Nccl` offers the calls one rank makes, never two at once.
unsafe impl Sync for NcclComm {}

impl Nccl {
    /// One communicator a GPU (`devices[r]`: rank r's ordinal, each a different device), made
    /// together (ncclCommInitAll). NVLink multicast is left off (NCCL_NVLS_ENABLE=0 unless set).
    pub fn clique(devices: &[usize]) -> Result<Vec<Arc<dyn DeviceCollective>>> {
        let ordinals: Vec<i32> = devices.iter().map(|&d| d as i32).collect();
        let mut seen = ordinals.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != ordinals.len() {
            return Err(CudaError::Unsupported("NCCL takes one rank a GPU: ranks sharing a GPU reduce through host memory".into()));
        }
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // SAFETY: set before NCCL reads its environment (at the first communicator's init)
            // and while the ranks' threads do not read the environment.
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
        let size = ordinals.len();
        let mut comms = vec![std::ptr::null_mut(); size];
        // the library is opened at the first call: where it is absent, say so instead of the
        // loader's panic
        std::panic::catch_unwind(cudarc::nccl::result::get_nccl_version)
            .map_err(|_| CudaError::Unsupported("NCCL was not found: xwen opens libnccl.so, where the NCCL wheel and packages install libnccl.so.2 — link one to the other on the library path (scripts/gpu-multi-check does)".into()))?
            .map_err(|e| CudaError::Unsupported(format!("NCCL: {e:?}")))?;
        // SAFETY: `comms` has a slot a device, `ordinals` one ordinal each.
        unsafe { cudarc::nccl::result::comm_init_all(comms.as_mut_ptr(), size as i32, ordinals.as_ptr()) }.map_err(|e| CudaError::Unsupported(format!("NCCL: {e:?}")))?;
        Ok(comms.into_iter().enumerate().map(|(rank, c)| Arc::new(Nccl { comm: NcclComm(c), rank, size, aborted: std::sync::Mutex::new(None) }) as Arc<dyn DeviceCollective>).collect())
    }
}

impl DeviceCollective for Nccl {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, gpu: &Gpu, ptr: u64, n: usize) -> Result<()> {
        if let Some(why) = self.aborted.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            return Err(CudaError::Engine(xwen_engine::EngineError::Collective(format!("the group was aborted: {why}"))));
        }
        gpu.ctx.bind_to_thread()?;
        use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t};
        // SAFETY: `ptr` holds `n` f32 on this rank's device; in place is allowed (send = recv).
        unsafe {
            cudarc::nccl::result::all_reduce(ptr as *const _, ptr as *mut _, n, ncclDataType_t::ncclFloat32, ncclRedOp_t::ncclSum, self.comm.0, gpu.stream.cu_stream() as _)
        }
        .map(|_| ())
        .map_err(|e| CudaError::Unsupported(format!("NCCL all-reduce: {e:?}")))
    }

    fn abort(&self, why: &str) {
        let mut a = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        if a.is_none() {
            *a = Some(format!("rank {}: {why}", self.rank));
            // SAFETY: the communicator is live; aborting it fails the peers' pending calls
            // (they would otherwise wait for this rank forever).
            let _ = unsafe { cudarc::nccl::result::comm_abort(self.comm.0) };
        }
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if self.aborted.get_mut().map_or(true, |a| a.is_none()) {
            // SAFETY: the last use of the communicator (the rank's model is gone).
            let _ = unsafe { cudarc::nccl::result::comm_destroy(self.comm.0) };
        }
    }
}
