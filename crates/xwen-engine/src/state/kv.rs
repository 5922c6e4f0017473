//! A KV cache of one attention layer for one sequence, in the cache's element type (llama.cpp's
//! `-ctk` / `-ctv`): rows appended as a forward writes them (rounded or quantized on write as
//! ggml's copy into the cache does), truncated — never copied — when a sequence rolls back.

use crate::config::KvType;
use xwen_kernels::half::f32_to_f16;

/// One of a KV cache's two tensors, [pos][n_head_kv·head_dim], in the cache's element type.
#[derive(Clone, Debug)]
pub enum KvBuf {
    F32(Vec<f32>),
    /// f16 bit patterns, rounded to nearest even on write (as ggml's f32 → f16 copy).
    F16(Vec<u16>),
    /// Q8_0 blocks (34 bytes per 32 elements), quantized on write as ggml's set_rows does
    /// (the CPU's `quantize_row_q8_0`).
    Q8_0(Vec<u8>),
}

impl Default for KvBuf {
    fn default() -> Self {
        KvBuf::F32(Vec::new())
    }
}

impl KvBuf {
    pub fn empty(ty: KvType) -> Self {
        match ty {
            KvType::F32 => KvBuf::F32(Vec::new()),
            KvType::F16 => KvBuf::F16(Vec::new()),
            KvType::Q8_0 => KvBuf::Q8_0(Vec::new()),
        }
    }
    pub fn ty(&self) -> KvType {
        match self {
            KvBuf::F32(_) => KvType::F32,
            KvBuf::F16(_) => KvType::F16,
            KvBuf::Q8_0(_) => KvType::Q8_0,
        }
    }
    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.len(),
            KvBuf::F16(v) => v.len(),
            KvBuf::Q8_0(v) => v.len() / 34 * 32,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn bytes(&self) -> usize {
        self.ty().row_bytes(self.len())
    }
    /// Keeps the first `n` elements (for Q8_0 a multiple of 32: whole rows).
    pub fn truncate(&mut self, n: usize) {
        match self {
            KvBuf::F32(v) => v.truncate(n),
            KvBuf::F16(v) => v.truncate(n),
            KvBuf::Q8_0(v) => v.truncate(n / 32 * 34),
        }
    }
    /// Elements the buffer holds room for without reallocating.
    pub fn capacity(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.capacity(),
            KvBuf::F16(v) => v.capacity(),
            KvBuf::Q8_0(v) => v.capacity() / 34 * 32,
        }
    }

    /// Room for `total` elements in all (for Q8_0 a multiple of 32), reserved exactly where the
    /// buffer has less: the pages are mapped as rows are written, the buffer never moves again.
    /// Where the system refuses that much address space at once (a context of millions of
    /// positions on a wide model, a strict overcommit policy), nothing is reserved and the
    /// buffer grows as rows come, as it always could.
    pub fn reserve_total(&mut self, total: usize) {
        fn exact<T>(v: &mut Vec<T>, total: usize) {
            if total > v.capacity() {
                let _ = v.try_reserve_exact(total - v.len());
            }
        }
        match self {
            KvBuf::F32(v) => exact(v, total),
            KvBuf::F16(v) => exact(v, total),
            KvBuf::Q8_0(v) => exact(v, total.div_ceil(32) * 34),
        }
    }

    /// Appends f32 values in the cache's type.
    pub fn extend(&mut self, x: &[f32]) {
        match self {
            KvBuf::F32(v) => v.extend_from_slice(x),
            KvBuf::F16(v) => v.extend(x.iter().map(|&f| f32_to_f16(f))),
            KvBuf::Q8_0(v) => {
                let mut q = Vec::new();
                xwen_kernels::quantize_activations(xwen_kernels::GgmlType::Q8_0, x, &mut q);
                v.extend_from_slice(&q);
            }
        }
    }
    pub fn rows(&self) -> KvRows<'_> {
        match self {
            KvBuf::F32(v) => KvRows::F32(v),
            KvBuf::F16(v) => KvRows::F16(v),
            KvBuf::Q8_0(v) => KvRows::Q8_0(v),
        }
    }
}

/// KV cache of one attention layer for one sequence.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub k: KvBuf,
    pub v: KvBuf,
    /// Positions the sequence may hold (the context, `-c`; 0: unbounded). The first append
    /// reserves exactly this many rows, so the cache never reallocates: growing by doubling
    /// would copy every row inside a step, hold the old and the new buffer at once, and reserve
    /// up to twice the context — past what the RAM plan counts for it.
    pub max_rows: usize,
}

impl KvCache {
    pub fn new(types: (KvType, KvType)) -> Self {
        KvCache { k: KvBuf::empty(types.0), v: KvBuf::empty(types.1), max_rows: 0 }
    }
    /// Positions held, for K rows `width` wide.
    pub fn len(&self, width: usize) -> usize {
        self.k.len() / width
    }

    /// Appends rows: `k` of K rows `k_width` wide, `v` of as many V rows `v_width` wide, in
    /// the cache's types, within the room `max_rows` reserves.
    pub fn append(&mut self, k: &[f32], v: &[f32], k_width: usize, v_width: usize) {
        if self.max_rows > 0 {
            let rows = self.len(k_width.max(1)) + k.len() / k_width.max(1);
            self.k.reserve_total(rows.max(self.max_rows) * k_width);
            self.v.reserve_total(rows.max(self.max_rows) * v_width);
        }
        self.k.extend(k);
        self.v.extend(v);
    }
}

/// KV rows of one attention layer, one sequence: `width` elements per position.
#[derive(Clone, Copy)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    /// Q8_0 blocks; a head's offset and the row width are multiples of 32.
    Q8_0(&'a [u8]),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_too_large_to_reserve_still_takes_rows() {
        // 2^40 positions of 128 halves: more address space than any system grants at once
        let mut kv = KvCache { max_rows: 1 << 40, ..KvCache::new((KvType::F16, KvType::F16)) };
        let row = vec![0.5f32; 128];
        kv.append(&row, &row, 128, 128);
        kv.append(&row, &row, 128, 128);
        assert_eq!(kv.len(128), 2);
        assert!(kv.k.capacity() < 1 << 30, "nothing absurd was reserved");
        // a context that fits is reserved at once
        let mut small = KvCache { max_rows: 300, ..KvCache::new((KvType::Q8_0, KvType::F32)) };
        small.append(&row, &row, 128, 128);
        assert_eq!((small.k.capacity(), small.v.capacity()), (300 * 128, 300 * 128));
    }
}
