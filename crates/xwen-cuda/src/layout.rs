//! How a weight's blocks lie on the device. Most types keep their file layout; Q8_0 (34-byte
//! blocks) and Q6_K (210-byte blocks) are padded at upload so that the products read their
//! quants with aligned 4-, 8- and 16-byte loads (kernels.cu `Q8_0_BYTES`, `Q6_K_BYTES`): 6% more
//! bytes for Q8_0 and 7% for Q6_K, against loads of two bytes at a time.

use xwen_gguf::GgmlType;

/// Q8_0 on the device: f16 scale, 2 pad bytes, 32 quants (kernels.cu `Q8_0_BYTES`).
const Q8_0_DEVICE: usize = 36;
/// Q6_K on the device: the file's 210-byte block, 14 pad bytes (kernels.cu `Q6_K_BYTES`).
const Q6_K_DEVICE: usize = 224;

/// Bytes of one row of `cols` values of type `ty` on the device.
pub fn device_row_bytes(ty: GgmlType, cols: usize) -> usize {
    match ty {
        GgmlType::Q8_0 => cols / 32 * Q8_0_DEVICE,
        GgmlType::Q6_K => cols / 256 * Q6_K_DEVICE,
        _ => ty.row_bytes(cols as u64).map_or(0, |b| b as usize),
    }
}

/// `data` (whole rows of type `ty`, as the file holds them) in the device layout.
pub fn device_layout(ty: GgmlType, data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    match ty {
        GgmlType::Q8_0 => {
            let mut out = Vec::with_capacity(data.len() / 34 * Q8_0_DEVICE);
            for b in data.chunks_exact(34) {
                out.extend_from_slice(&b[..2]);
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&b[2..]);
            }
            out.into()
        }
        GgmlType::Q6_K => {
            let mut out = Vec::with_capacity(data.len() / 210 * Q6_K_DEVICE);
            for b in data.chunks_exact(210) {
                out.extend_from_slice(b);
                out.extend_from_slice(&[0; Q6_K_DEVICE - 210]);
            }
            out.into()
        }
        _ => data.into(),
    }
}

/// `device_layout` undone: device-layout rows of type `ty` as the file (and the CPU's dot
/// products) lay them out — `dev` itself, or its blocks unpadded into `buf`.
pub fn file_layout<'a>(ty: GgmlType, dev: &'a [u8], buf: &'a mut Vec<u8>) -> &'a [u8] {
    match ty {
        GgmlType::Q8_0 => {
            buf.clear();
            for b in dev.chunks_exact(Q8_0_DEVICE) {
                buf.extend_from_slice(&b[..2]);
                buf.extend_from_slice(&b[4..]);
            }
            buf
        }
        GgmlType::Q6_K => {
            buf.clear();
            for b in dev.chunks_exact(Q6_K_DEVICE) {
                buf.extend_from_slice(&b[..210]);
            }
            buf
        }
        _ => dev,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_blocks_keep_their_bytes_in_place() {
        let q8: Vec<u8> = (0..68).map(|i| i as u8).collect();
        let d = device_layout(GgmlType::Q8_0, &q8);
        assert_eq!(d.len(), 72);
        assert_eq!(&d[..2], &q8[..2]);
        assert_eq!(&d[4..36], &q8[2..34]);
        assert_eq!(&d[36..38], &q8[34..36]);
        assert_eq!(&d[40..72], &q8[36..68]);
        assert_eq!(device_row_bytes(GgmlType::Q8_0, 64), 72);
        let q6: Vec<u8> = (0..420).map(|i| i as u8).collect();
        let d = device_layout(GgmlType::Q6_K, &q6);
        assert_eq!(d.len(), 448);
        assert_eq!(&d[..210], &q6[..210]);
        assert_eq!(&d[224..434], &q6[210..]);
        assert_eq!(device_row_bytes(GgmlType::Q6_K, 512), 448);
        assert_eq!(device_row_bytes(GgmlType::Q4_K, 512), 288);
        assert!(matches!(device_layout(GgmlType::Q4_K, &q6), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn the_file_layout_undoes_the_device_layout() {
        let mut buf = Vec::new();
        for (ty, bytes) in [(GgmlType::Q8_0, 68), (GgmlType::Q6_K, 420), (GgmlType::Q4_K, 288)] {
            let file: Vec<u8> = (0..bytes).map(|i| (i * 7) as u8).collect();
            let dev = device_layout(ty, &file);
            assert_eq!(file_layout(ty, &dev, &mut buf), &file[..], "{ty}");
        }
    }
}
