//! ggml tensor types: the numeric ids stored in GGUF tensor tables and the block geometry
//! (elements per block, bytes per block) needed to size tensor data.
//!
//! Ids and sizes follow ggml/include/ggml.h and gguf-py's GGML_QUANT_SIZES at llama.cpp b11434.
//! Ids 4, 5, 31-33 and 36-38 are formats ggml removed; 40-42 (NVFP4, Q1_0, Q2_0) are newer than
//! this enum and read as unknown types.

/// k-quant super-block size (ggml's QK_K).
pub const QK_K: usize = 256;

#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, id, name, block_size, type_size): one row per type so the four facts cannot drift apart.
const TABLE: [(GgmlType, u32, &str, usize, usize); 32] = {
    use GgmlType::*;
    [
        (F32, 0, "F32", 1, 4),
        (F16, 1, "F16", 1, 2),
        (Q4_0, 2, "Q4_0", 32, 2 + 16),
        (Q4_1, 3, "Q4_1", 32, 2 + 2 + 16),
        (Q5_0, 6, "Q5_0", 32, 2 + 4 + 16),
        (Q5_1, 7, "Q5_1", 32, 2 + 2 + 4 + 16),
        (Q8_0, 8, "Q8_0", 32, 2 + 32),
        (Q8_1, 9, "Q8_1", 32, 2 + 2 + 32),
        (Q2_K, 10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
        (Q3_K, 11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
        (Q4_K, 12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
        (Q5_K, 13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
        (Q6_K, 14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
        (Q8_K, 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
        (IQ2_XXS, 16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
        (IQ2_XS, 17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
        (IQ3_XXS, 18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
        (IQ1_S, 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
        (IQ4_NL, 20, "IQ4_NL", 32, 2 + 16),
        (
            IQ3_S,
            21,
            "IQ3_S",
            QK_K,
            2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
        ),
        (IQ2_S, 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
        (IQ4_XS, 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
        (I8, 24, "I8", 1, 1),
        (I16, 25, "I16", 1, 2),
        (I32, 26, "I32", 1, 4),
        (I64, 27, "I64", 1, 8),
        (F64, 28, "F64", 1, 8),
        (IQ1_M, 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
        (BF16, 30, "BF16", 1, 2),
        (TQ1_0, 34, "TQ1_0", QK_K, 2 + 4 * 13),
        (TQ2_0, 35, "TQ2_0", QK_K, 2 + 64),
        (MXFP4, 39, "MXFP4", 32, 1 + 16),
    ]
};

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 32] = {
        let mut out = [GgmlType::F32; 32];
        let mut i = 0;
        while i < TABLE.len() {
            out[i] = TABLE[i].0;
            i += 1;
        }
        out
    };

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // TABLE is in declaration order, so the discriminant indexes it.
        &TABLE[self as usize]
    }

    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    pub fn id(self) -> u32 {
        self.row().1
    }

    /// The name as gguf-py and llama.cpp's tools print it ("Q4_K", "BF16").
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block (ggml_type_size).
    pub fn type_size(self) -> usize {
        self.row().4
    }

    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by `n_elements` values; None if `n_elements` is not a whole number of blocks
    /// or the size overflows u64.
    pub fn row_bytes(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if n_elements % bs != 0 {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for GgmlType {
    type Err = String;
    /// Case-insensitive ("q4_k", "Q4_K", "bf16").
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TABLE
            .iter()
            .find(|r| r.2.eq_ignore_ascii_case(s))
            .map(|r| r.0)
            .ok_or_else(|| format!("unknown ggml type `{s}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_declaration_order_and_ids_round_trip() {
        for (i, t) in GgmlType::ALL.iter().enumerate() {
            assert_eq!(*t as usize, i, "{t:?}");
            assert_eq!(GgmlType::from_id(t.id()), Some(*t));
            assert_eq!(t.name().parse::<GgmlType>().unwrap(), *t);
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 40, 41, 42, 43, u32::MAX] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn sizes_match_ggml_block_structs() {
        // sizeof(block_*) from ggml-common.h, written out independently of TABLE's formulas.
        let expect = [
            (GgmlType::Q4_0, 18),
            (GgmlType::Q8_0, 34),
            (GgmlType::Q2_K, 84),
            (GgmlType::Q3_K, 110),
            (GgmlType::Q4_K, 144),
            (GgmlType::Q5_K, 176),
            (GgmlType::Q6_K, 210),
            (GgmlType::Q8_K, 292),
            (GgmlType::IQ4_XS, 136),
            (GgmlType::TQ1_0, 54),
            (GgmlType::MXFP4, 17),
        ];
        for (t, size) in expect {
            assert_eq!(t.type_size(), size, "{t}");
        }
        assert_eq!(GgmlType::Q4_K.row_bytes(4096), Some(16 * 144));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
        assert_eq!(GgmlType::BF16.row_bytes(3), Some(6));
    }
}
