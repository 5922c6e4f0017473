//! AVX-512 (F/BW/VL/VNNI) kernels.

use crate::formats::DotFn;
use crate::GgmlType;

pub fn dot_fn(_weight: GgmlType) -> Option<DotFn> {
    None
}
