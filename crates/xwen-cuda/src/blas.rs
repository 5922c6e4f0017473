//! Prompt products through cuBLAS (docs/decisions.md "CUDA backend: prompt products"): a
//! pass's weights are dequantized to f16 rows and its activations rounded to f16, then one
//! GEMM with f32 sums on tensor cores. cuBLAS is opened at run time like the driver; where it
//! is missing (or `XWEN_CUBLAS=0`) the backend's own tensor-core kernel takes the products.

use crate::error::{CudaError, Result};
use cudarc::cublas::{sys, CudaBlas};
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// Whether cuBLAS can be opened here (the prompt products' fast path), without a device.
pub fn available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
}

pub struct Blas {
    inner: CudaBlas,
}

impl Blas {
    /// cuBLAS on `stream`, or None where the library is absent, refused, or turned off.
    pub fn open(stream: &Arc<CudaStream>) -> Option<Blas> {
        if std::env::var("XWEN_CUBLAS").is_ok_and(|v| v == "0") {
            return None;
        }
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        CudaBlas::new(stream.clone()).ok().map(|inner| Blas { inner })
    }

    /// C (m × n, column-major, ldc) = Aᵀ·B (+ C where accumulate): A is k × m column-major
    /// (row-major m × k: weight rows), B k × n (row-major n × k: token rows), both f16; C f32.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_tn(&self, m: usize, n: usize, k: usize, a: u64, lda: usize, b: u64, ldb: usize, c: u64, ldc: usize, accumulate: bool) -> Result<()> {
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        // SAFETY: the pointers are device buffers of the model that hold the stated shapes;
        // the handle's stream is the model's one stream.
        let status = unsafe {
            sys::cublasGemmEx(
                *self.inner.handle(),
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                m as i32,
                n as i32,
                k as i32,
                (&alpha as *const f32).cast(),
                a as *const std::ffi::c_void,
                sys::cudaDataType::CUDA_R_16F,
                lda as i32,
                b as *const std::ffi::c_void,
                sys::cudaDataType::CUDA_R_16F,
                ldb as i32,
                (&beta as *const f32).cast(),
                c as *mut std::ffi::c_void,
                sys::cudaDataType::CUDA_R_32F,
                ldc as i32,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(CudaError::Unsupported(format!("cublasGemmEx: {status:?}")));
        }
        Ok(())
    }
}
