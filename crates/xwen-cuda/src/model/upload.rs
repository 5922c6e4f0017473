//! Weights onto the device in their file's block formats (Q8_0 and Q6_K padded:
//! `crate::layout`).

use super::*;

/// Where an expert's gate, up and down lie in a slot of a VRAM expert cache's pool (and of its
/// host copy), each 256-byte aligned, and the slot's bytes: (offsets, slot bytes).
pub(super) fn slot_layout(mats: &[Mat; 3]) -> ([usize; 3], usize) {
    let mut offs = [0usize; 3];
    let mut at = 0;
    for (i, m) in mats.iter().enumerate() {
        offs[i] = at;
        at += (m.rows * crate::layout::device_row_bytes(m.ty, m.cols)).next_multiple_of(256);
    }
    (offs, at)
}

/// Types the products have a kernel for (kernels.cu `dot_row`, `deq1`).
pub(super) fn device_type(ty: GgmlType) -> Option<i32> {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K).then(|| ty.id() as i32)
}

/// `m`'s type as the kernels name it, or why they cannot compute with it.
fn kernel_type(m: &Mat) -> Result<i32> {
    device_type(m.ty).ok_or_else(|| CudaError::Unsupported(format!("{}: type {} has no CUDA kernel yet", m.info.name, m.ty.name())))
}

pub(super) struct Uploader<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) file: &'a GgufFile,
}

impl Uploader<'_> {
    /// A matrix or a whole stack, its bytes as the file holds them.
    pub(super) fn mat(&self, m: &Mat) -> Result<DevMat> {
        self.block(m, 0..m.n_mats)
    }

    /// The matrices `experts` of a stack (a rank's block; a matrix: 0..1), their bytes as the
    /// file holds them.
    pub(super) fn block(&self, m: &Mat, experts: std::ops::Range<usize>) -> Result<DevMat> {
        let ty = kernel_type(m)?;
        if !m.cols.is_multiple_of(4) {
            // the products read activations four floats at a time
            return Err(CudaError::Unsupported(format!("{}: {} columns (the CUDA products take multiples of 4)", m.info.name, m.cols)));
        }
        if experts.is_empty() || experts.end > m.n_mats {
            return Err(CudaError::Unsupported(format!("{}: experts {experts:?} of a stack of {}", m.info.name, m.n_mats)));
        }
        let all = self.file.tensor_data(&m.info);
        let per = all.len() / m.n_mats;
        let data = crate::layout::device_layout(m.ty, &all[experts.start * per..experts.end * per]);
        Ok(DevMat::owning(self.gpu.upload(&data)?, ty, m.rows, m.cols, crate::layout::device_row_bytes(m.ty, m.cols)))
    }

    /// A VRAM expert cache's pool of `slots` slots for a layer's gate, up and down stacks: one
    /// allocation, each slot an expert's three matrices side by side (`slot_layout`), so an
    /// expert goes up in one copy; the three `DevMat`s step a slot at a time.
    pub(super) fn pool(&self, mats: &[Mat; 3], slots: usize) -> Result<[DevMat; 3]> {
        let (offs, slot) = slot_layout(mats);
        let buf = Arc::new(self.gpu.zeros(slots * slot)?);
        let mut out = Vec::with_capacity(3);
        for (m, off) in mats.iter().zip(offs) {
            let ty = kernel_type(m)?;
            let row_bytes = crate::layout::device_row_bytes(m.ty, m.cols);
            out.push(DevMat { _buf: Arc::clone(&buf), ptr: buf.ptr + off as u64, ty, rows: m.rows, cols: m.cols, row_bytes, stride: slot });
        }
        let [g, u, d]: [DevMat; 3] = out.try_into().map_err(|_| CudaError::Unsupported("a pool of three matrices".into()))?;
        Ok([g, u, d])
    }
}
