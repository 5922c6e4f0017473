//! Shared test helpers: the vector file reader and a small deterministic RNG.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use xwen_kernels::GgmlType;

pub struct VectorFile {
    pub ty: GgmlType,
    pub n: usize,
    pub sections: HashMap<String, Vec<u8>>,
}

impl VectorFile {
    pub fn bytes(&self, tag: &str) -> Option<&[u8]> {
        self.sections.get(tag).map(|v| v.as_slice())
    }
    pub fn f32s(&self, tag: &str) -> Option<Vec<f32>> {
        self.bytes(tag).map(|b| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }
}

pub fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

/// Reads every `<prefix>_*.bin` vector file (format: tools/kernels/make_vectors.py).
pub fn read_vectors(prefix: &str) -> Vec<(String, VectorFile)> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(vectors_dir())
        .expect("tests/vectors exists")
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix) || !name.ends_with(".bin") {
            continue;
        }
        let b = std::fs::read(e.path()).unwrap();
        assert_eq!(&b[..4], b"XWKV", "{name}");
        let id = u32::from_le_bytes(b[4..8].try_into().unwrap());
        let n = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
        let ty = GgmlType::from_id(id).unwrap_or_else(|| panic!("{name}: unknown type id {id}"));
        let mut sections = HashMap::new();
        let mut p = 12;
        while p < b.len() {
            let tag = String::from_utf8_lossy(&b[p..p + 4]).trim_end().to_string();
            let len = u32::from_le_bytes(b[p + 4..p + 8].try_into().unwrap()) as usize;
            sections.insert(tag, b[p + 8..p + 8 + len].to_vec());
            p += 8 + len;
        }
        out.push((name, VectorFile { ty, n, sections }));
    }
    out
}

/// xorshift64*: deterministic and dependency-free.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn normalish(&mut self) -> f32 {
        (0..6).map(|_| self.uniform()).sum::<f32>() * 0.7
    }
    /// Activation-like values: heavy-ish tails, a range of magnitudes.
    pub fn activations(&mut self, n: usize) -> Vec<f32> {
        let scale = 10f32.powf(2.0 * self.uniform());
        (0..n)
            .map(|_| self.normalish() * scale * if self.below(50) == 0 { 8.0 } else { 1.0 })
            .collect()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Random but well-formed blocks: random bytes with every f16 scale field set to a finite
/// moderate value (so sums stay finite).
pub fn random_blocks(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let bs = ty.block_size();
    let ts = ty.type_size();
    let mut b = rng.bytes(n / bs * ts);
    let f16_fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q8_1 => {
            &[0, 2]
        }
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    match ty {
        GgmlType::F32 => {
            for (i, c) in b.chunks_exact_mut(4).enumerate() {
                let _ = i;
                c.copy_from_slice(&rng.normalish().to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in b.chunks_exact_mut(2) {
                c.copy_from_slice(&xwen_kernels::half::f32_to_f16(rng.normalish()).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in b.chunks_exact_mut(2) {
                c.copy_from_slice(&xwen_kernels::half::f32_to_bf16(rng.normalish()).to_le_bytes());
            }
        }
        GgmlType::Q8_K => {
            for blk in b.chunks_exact_mut(ts) {
                blk[..4].copy_from_slice(&(rng.uniform() * 0.01).to_le_bytes());
                for g in 0..16 {
                    let s: i32 = blk[4 + 16 * g..20 + 16 * g]
                        .iter()
                        .map(|&q| q as i8 as i32)
                        .sum();
                    blk[260 + 2 * g..262 + 2 * g].copy_from_slice(&(s as i16).to_le_bytes());
                }
            }
        }
        _ => {}
    }
    for blk in b.chunks_exact_mut(ts) {
        for &off in f16_fields {
            let v = rng.uniform() * 0.05;
            blk[off..off + 2].copy_from_slice(&xwen_kernels::half::f32_to_f16(v).to_le_bytes());
        }
    }
    b
}

/// Σ|w_i · a_i| over dequantized values: the natural scale of a dot product's rounding error.
pub fn abs_dot(w_ty: GgmlType, w: &[u8], a_ty: GgmlType, a: &[u8], n: usize) -> f64 {
    let mut wf = vec![0f32; n];
    let mut af = vec![0f32; n];
    xwen_kernels::dequantize(
        w_ty,
        &w[..w_ty.row_bytes(n as u64).unwrap() as usize],
        &mut wf,
    )
    .unwrap();
    xwen_kernels::dequantize(
        a_ty,
        &a[..a_ty.row_bytes(n as u64).unwrap() as usize],
        &mut af,
    )
    .unwrap();
    wf.iter().zip(&af).map(|(x, y)| (x * y).abs() as f64).sum()
}
