//! Typed views of ggml's quantized blocks for the scalar reference code: a block's fields by
//! name (`b.scales`, `b.qs`) instead of byte offsets (`b[4..16]`), at no cost — each view is a
//! `repr(C)` struct of byte arrays (alignment 1, no padding) laid over the row's bytes, its
//! size checked against ggml's at compile time (candle's `BlockQ4K` does the same).

use crate::half::read_f16;

/// A block layout: `repr(C)`, fields of `u8` / `i8` arrays only, `size_of` = `BYTES`. Each
/// format's file implements it with its own block size (so this file imports no format).
///
/// # Safety
/// Implementors must be `repr(C)` structs whose fields are all `u8`/`i8` arrays (so any byte
/// pattern is a valid value, the alignment is 1 and there is no padding) and whose size is
/// `BYTES`.
pub unsafe trait Block: Sized {
    const BYTES: usize;
}

/// The whole blocks at the start of `bytes`, viewed in place.
pub fn blocks<B: Block>(bytes: &[u8]) -> &[B] {
    const { assert!(std::mem::align_of::<B>() == 1 && std::mem::size_of::<B>() == B::BYTES) };
    // SAFETY: `Block` guarantees alignment 1, no padding and validity for any bytes; the
    // slice covers bytes.len() / BYTES whole blocks inside `bytes`, borrowed for its lifetime.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const B, bytes.len() / B::BYTES) }
}

/// block_q8_0: f16 d; i8 qs[32].
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; 32],
}

/// block_q4_K: f16 d; f16 dmin; u8 scales[12] (6-bit scales and mins, get_scale_min_k4);
/// u8 qs[128] (element 64c + l is the low nibble of qs[32c + l], 64c + 32 + l the high one).
#[repr(C)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}

/// block_q6_K: u8 ql[128] (low 4 bits); u8 qh[64] (high 2 bits); i8 scales[16]; f16 d (last).
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: [u8; 2],
}

impl BlockQ8_0 {
    pub fn d(&self) -> f32 {
        read_f16(&self.d)
    }
}

impl BlockQ4K {
    pub fn d(&self) -> f32 {
        read_f16(&self.d)
    }
    pub fn dmin(&self) -> f32 {
        read_f16(&self.dmin)
    }
}

impl BlockQ6K {
    pub fn d(&self) -> f32 {
        read_f16(&self.d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The views read the fields at ggml's offsets.
    #[test]
    fn views_read_the_fields_where_ggml_puts_them() {
        let bytes: Vec<u8> = (0..420u32).map(|i| (i % 251) as u8).collect();
        let q6 = blocks::<BlockQ6K>(&bytes);
        assert_eq!(q6.len(), 2);
        assert_eq!(q6[1].ql[0], bytes[210]);
        assert_eq!(q6[1].qh[0], bytes[210 + 128]);
        assert_eq!(q6[1].scales[3], bytes[210 + 192 + 3] as i8);
        assert_eq!(q6[1].d, [bytes[418], bytes[419]]);
        let q4 = blocks::<BlockQ4K>(&bytes[..300]);
        assert_eq!(q4.len(), 2);
        assert_eq!((q4[1].dmin, q4[1].scales[11], q4[1].qs[127]), ([bytes[146], bytes[147]], bytes[144 + 15], bytes[287]));
        let q8 = blocks::<BlockQ8_0>(&bytes[..70]);
        assert_eq!(q8.len(), 2);
        assert_eq!((q8[1].d, q8[1].qs[31]), ([bytes[34], bytes[35]], bytes[67] as i8));
    }
}
