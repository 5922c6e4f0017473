//! Weights onto the device in their file's block formats (Q8_0 and Q6_K padded:
//! `crate::layout`).

use super::*;

/// Types the products have a kernel for (kernels.cu `dot_row`, `deq1`).
pub(super) fn device_type(ty: GgmlType) -> Option<i32> {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K).then(|| ty.id() as i32)
}

pub(super) struct Uploader<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) file: &'a GgufFile,
}

impl Uploader<'_> {
    /// A matrix or a whole stack, its bytes as the file holds them.
    pub(super) fn mat(&self, m: &Mat) -> Result<DevMat> {
        let ty = device_type(m.ty).ok_or_else(|| CudaError::Unsupported(format!("{}: type {} has no CUDA kernel yet", m.info.name, m.ty.name())))?;
        if m.cols % 4 != 0 {
            // the products read activations four floats at a time
            return Err(CudaError::Unsupported(format!("{}: {} columns (the CUDA products take multiples of 4)", m.info.name, m.cols)));
        }
        let data = crate::layout::device_layout(m.ty, self.file.tensor_data(&m.info));
        Ok(DevMat { buf: self.gpu.upload(&data)?, ty, rows: m.rows, cols: m.cols, row_bytes: crate::layout::device_row_bytes(m.ty, m.cols) })
    }

    /// The matrices `experts` of a stack (a rank's block), their bytes as the file holds them.
    pub(super) fn block(&self, m: &Mat, experts: std::ops::Range<usize>) -> Result<DevMat> {
        let ty = device_type(m.ty).ok_or_else(|| CudaError::Unsupported(format!("{}: type {} has no CUDA kernel yet", m.info.name, m.ty.name())))?;
        if m.cols % 4 != 0 || experts.end > m.n_mats {
            return Err(CudaError::Unsupported(format!("{}: experts {experts:?} of {} with {} columns", m.info.name, m.n_mats, m.cols)));
        }
        let all = self.file.tensor_data(&m.info);
        let per = all.len() / m.n_mats.max(1);
        let data = crate::layout::device_layout(m.ty, &all[experts.start * per..experts.end * per]);
        Ok(DevMat { buf: self.gpu.upload(&data)?, ty, rows: m.rows, cols: m.cols, row_bytes: crate::layout::device_row_bytes(m.ty, m.cols) })
    }

    /// A pool of `slots` matrices of a stack's shape and type (the VRAM expert cache's slots,
    /// filled by `ExpertCache::fill`).
    pub(super) fn pool(&self, m: &Mat, slots: usize) -> Result<DevMat> {
        let ty = device_type(m.ty).ok_or_else(|| CudaError::Unsupported(format!("{}: type {} has no CUDA kernel yet", m.info.name, m.ty.name())))?;
        let row_bytes = crate::layout::device_row_bytes(m.ty, m.cols);
        Ok(DevMat { buf: self.gpu.zeros(slots * m.rows * row_bytes)?, ty, rows: m.rows, cols: m.cols, row_bytes })
    }
}
