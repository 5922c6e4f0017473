//! Tensor handles and the loader that resolves them from a GGUF file with shape checks.
//! A `Mat` is a view description (name, type, shape); its bytes stay in the memory map and
//! are borrowed only for the duration of a kernel call.

use crate::error::{EngineError, Result};
use xwen_gguf::{GgmlType, GgufFile, TensorInfo};
use xwen_kernels::QMatrix;

/// A 2-D weight matrix `rows × cols` (ggml: ne0 = cols, ne1 = rows), or a stack of `n_mats`
/// such matrices (MoE experts: ne2 = expert).
#[derive(Clone, Debug)]
pub struct Mat {
    pub info: TensorInfo,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub n_mats: usize,
}

impl Mat {
    pub fn q<'a>(&self, file: &'a GgufFile) -> QMatrix<'a> {
        QMatrix { ty: self.ty, rows: self.rows, cols: self.cols, data: file.tensor_data(&self.info) }
    }

    /// Bytes of one matrix of a stack.
    pub fn mat_bytes(&self) -> usize {
        self.rows * self.row_bytes()
    }

    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols as u64).expect("validated at load") as usize
    }

    /// Matrix `i` of a stack (an expert).
    pub fn q_sub<'a>(&self, file: &'a GgufFile, i: usize) -> QMatrix<'a> {
        let b = self.mat_bytes();
        let data = &file.tensor_data(&self.info)[i * b..(i + 1) * b];
        QMatrix { ty: self.ty, rows: self.rows, cols: self.cols, data }
    }
}

pub struct Loader<'a> {
    pub file: &'a GgufFile,
}

impl<'a> Loader<'a> {
    pub fn new(file: &'a GgufFile) -> Self {
        Loader { file }
    }

    pub fn info(&self, name: &str) -> Result<&'a TensorInfo> {
        self.file.tensor(name).ok_or_else(|| EngineError::MissingTensor(name.to_string()))
    }

    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    /// A tensor's GGUF dims, where the file has it.
    pub fn dims(&self, name: &str) -> Option<&'a [u64]> {
        self.file.tensor(name).map(|t| &t.dims[..])
    }

    fn check_shape(&self, t: &TensorInfo, want: &[u64]) -> Result<()> {
        // ggml drops trailing 1-dims inconsistently; compare with them trimmed.
        let trim = |d: &[u64]| {
            let mut v = d.to_vec();
            while v.len() > 1 && *v.last().unwrap() == 1 {
                v.pop();
            }
            v
        };
        if trim(&t.dims) != trim(want) {
            return Err(EngineError::TensorShape { name: t.name.clone(), got: t.dims.clone(), want: want.to_vec() });
        }
        Ok(())
    }

    fn check_computable(&self, t: &TensorInfo) -> Result<()> {
        use GgmlType::*;
        match t.ty {
            F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_NL
            | IQ4_XS => Ok(()),
            other => Err(EngineError::TensorType { name: t.name.clone(), ty: other.name() }),
        }
    }

    /// A `rows × cols` matrix (GGUF dims [cols, rows]).
    pub fn mat(&self, name: &str, rows: usize, cols: usize) -> Result<Mat> {
        let t = self.info(name)?;
        self.check_shape(t, &[cols as u64, rows as u64])?;
        self.check_computable(t)?;
        Ok(Mat { info: t.clone(), ty: t.ty, rows, cols, n_mats: 1 })
    }

    /// A stack of `n` matrices `rows × cols` (GGUF dims [cols, rows, n]).
    pub fn mats(&self, name: &str, n: usize, rows: usize, cols: usize) -> Result<Mat> {
        let t = self.info(name)?;
        self.check_shape(t, &[cols as u64, rows as u64, n as u64])?;
        self.check_computable(t)?;
        Ok(Mat { info: t.clone(), ty: t.ty, rows, cols, n_mats: n })
    }

    /// A vector (norm weights, biases) dequantized to f32.
    pub fn vec(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        self.check_shape(t, &[len as u64])?;
        self.dequant(t)
    }

    /// Any small tensor as f32 with an expected dims list.
    pub fn f32_tensor(&self, name: &str, dims: &[u64]) -> Result<Vec<f32>> {
        let t = self.info(name)?;
        self.check_shape(t, dims)?;
        self.dequant(t)
    }

    fn dequant(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let n = t.n_elements() as usize;
        let mut out = vec![0.0f32; n];
        xwen_kernels::dequantize(t.ty, self.file.tensor_data(t), &mut out)
            .map_err(|_| EngineError::TensorType { name: t.name.clone(), ty: t.ty.name() })?;
        Ok(out)
    }
}
