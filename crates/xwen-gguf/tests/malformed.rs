//! Malformed input: every case is a typed error naming the problem, never a panic.

mod common;

use common::*;
use xwen_gguf::{GgmlType, GgufError, GgufFile, MAX_METADATA_VALUES};

fn open(r: Raw) -> GgufError {
    match GgufFile::from_bytes(r.0) {
        Ok(_) => panic!("malformed file was accepted"),
        Err(e) => {
            // Display must work and say something.
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

/// One valid tensor-less file to start from, plus a `Raw` positioned after its header.
fn one_kv(key: &str) -> Raw {
    Raw::header(3, 0, 1).str(key.as_bytes())
}

#[test]
fn bad_magic_and_empty_file() {
    let e = open(Raw::default().bytes(b"GGML\x03\0\0\0"));
    assert!(
        matches!(e, GgufError::BadMagic { ref found } if found == b"GGML"),
        "{e}"
    );
    let e = open(Raw::default().bytes(b"\x7fELF"));
    assert!(matches!(e, GgufError::BadMagic { .. }), "{e}");
    let e = open(Raw::default());
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
}

#[test]
fn versions() {
    let e = open(Raw::header(1, 0, 0));
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 1 }),
        "{e}"
    );
    assert!(e.to_string().contains("version 1"), "{e}");
    let e = open(Raw::header(4, 0, 0));
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 4 }),
        "{e}"
    );
    let e = open(Raw::header(0, 0, 0));
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 0 }),
        "{e}"
    );
    // v2 shares v3's layout.
    assert_eq!(
        GgufFile::from_bytes(Raw::header(2, 0, 0).0)
            .unwrap()
            .version(),
        2
    );
}

#[test]
fn big_endian_is_named() {
    let e = open(
        Raw::default()
            .bytes(b"GGUF")
            .bytes(&3u32.to_be_bytes())
            .bytes(&[0; 16]),
    );
    assert!(
        matches!(e, GgufError::BigEndian { raw: 0x0300_0000 }),
        "{e}"
    );
    assert!(e.to_string().contains("big-endian"));
}

#[test]
fn truncated_header_and_values() {
    let e = open(Raw::default().bytes(b"GGUF").u32(3).u32(0));
    assert!(
        matches!(e, GgufError::Truncated { ref what, offset: 8, .. } if what == "tensor count"),
        "{e}"
    );
    // A u64 value cut short.
    let e = open(one_kv("k").u32(T_U64).u32(7));
    assert!(
        matches!(e, GgufError::Truncated { ref what, .. } if what.contains("'k'")),
        "{e}"
    );
    // Every prefix of a valid file that lacks some tensor byte fails cleanly (only the padding
    // after the last tensor may be missing).
    let full = small_model();
    let f = GgufFile::from_bytes(full.clone()).unwrap();
    let data_end = f
        .tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.n_bytes)
        .max()
        .unwrap();
    assert!(GgufFile::from_bytes(full[..data_end as usize].to_vec()).is_ok());
    for cut in 0..data_end as usize {
        assert!(
            GgufFile::from_bytes(full[..cut].to_vec()).is_err(),
            "prefix of {cut} bytes accepted"
        );
    }
}

#[test]
fn absurd_counts() {
    let e = open(Raw::header(3, 0, u64::MAX));
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                count: u64::MAX,
                ..
            }
        ),
        "{e}"
    );
    let e = open(Raw::header(3, 1 << 40, 0));
    assert!(
        matches!(e, GgufError::CountTooLarge { ref what, .. } if what == "tensor count"),
        "{e}"
    );
    let e = open(one_kv("arr").u32(T_ARRAY).u32(T_U32).u64(1 << 61).u32(0));
    assert!(
        matches!(e, GgufError::CountTooLarge { ref what, .. } if what.contains("'arr'")),
        "{e}"
    );
    // 2^62 strings * 8 bytes overflows u64: must still be an error, not a wrap.
    let e = open(one_kv("arr").u32(T_ARRAY).u32(T_STR).u64(1 << 62));
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
}

#[test]
fn absurd_string_lengths() {
    let e = open(one_kv("s").u32(T_STR).u64(u64::MAX - 3).bytes(b"abc"));
    assert!(
        matches!(e, GgufError::StringTooLong { ref what, len, .. } if what.contains("'s'") && len == u64::MAX - 3),
        "{e}"
    );
    let e = open(Raw::header(3, 0, 1).u64(1 << 50).bytes(&[0; 16]));
    assert!(
        matches!(e, GgufError::StringTooLong { ref what, .. } if what.contains("key #0")),
        "{e}"
    );
}

#[test]
fn non_utf8_strings_name_the_key() {
    let e = open(one_kv("general.name").u32(T_STR).str(b"ok\xff"));
    assert!(
        matches!(e, GgufError::InvalidUtf8 { ref what, .. } if what.contains("'general.name'")),
        "{e}"
    );
    let e = open(
        one_kv("toks")
            .u32(T_ARRAY)
            .u32(T_STR)
            .u64(2)
            .str(b"a")
            .str(b"\xc3"),
    );
    assert!(
        matches!(e, GgufError::InvalidUtf8 { ref what, .. } if what.contains("element 1 of key 'toks'")),
        "{e}"
    );
    let e = open(Raw::header(3, 0, 1).str(b"k\x80").u32(T_U8).u8(0));
    assert!(
        matches!(e, GgufError::InvalidUtf8 { ref what, .. } if what.contains("key #0")),
        "{e}"
    );
    let e = open(
        Raw::header(3, 1, 0)
            .str(b"\xfe")
            .u32(1)
            .u64(1)
            .u32(0)
            .u64(0)
            .data(32, 4),
    );
    assert!(
        matches!(e, GgufError::InvalidUtf8 { ref what, .. } if what.contains("tensor #0")),
        "{e}"
    );
}

#[test]
fn unknown_value_types() {
    let e = open(one_kv("k").u32(13).u32(0));
    assert!(
        matches!(e, GgufError::UnknownValueType { ref key, type_id: 13 } if key == "k"),
        "{e}"
    );
    let e = open(one_kv("k").u32(T_ARRAY).u32(99).u64(1).u32(0));
    assert!(
        matches!(e, GgufError::UnknownValueType { type_id: 99, .. }),
        "{e}"
    );
}

#[test]
fn invalid_bool_empty_key_duplicate_key() {
    let e = open(one_kv("b").u32(T_BOOL).u8(2));
    assert!(matches!(e, GgufError::InvalidBool { byte: 2, .. }), "{e}");
    let e = open(Raw::header(3, 0, 1).str(b"").u32(T_U8).u8(0).u8(0));
    assert!(matches!(e, GgufError::EmptyKey { index: 0 }), "{e}");
    let e = open(Raw::header(3, 0, 2).kv_u32("dup", 1).kv_u32("dup", 2));
    assert!(
        matches!(e, GgufError::DuplicateKey { ref key } if key == "dup"),
        "{e}"
    );
}

#[test]
fn nesting_and_value_budget() {
    let mut r = one_kv("deep").u32(T_ARRAY);
    for _ in 0..100 {
        r = r.u32(T_ARRAY).u64(1);
    }
    let e = open(r.u32(T_U8).u64(0));
    assert!(
        matches!(e, GgufError::NestingTooDeep { ref key, .. } if key == "deep"),
        "{e}"
    );
    let n = MAX_METADATA_VALUES; // plus the key itself: one over the budget
    let e = open(
        one_kv("big")
            .u32(T_ARRAY)
            .u32(T_U8)
            .u64(n)
            .bytes(&vec![0; n as usize]),
    );
    assert!(matches!(e, GgufError::TooManyValues { .. }), "{e}");
}

#[test]
fn alignment_key() {
    for (bad, ty) in [(0u32, T_U32), (3, T_U32), (48, T_U32), (32, T_U64)] {
        let r = one_kv("general.alignment").u32(ty);
        let r = if ty == T_U64 {
            r.u64(bad.into())
        } else {
            r.u32(bad)
        };
        let e = open(r);
        assert!(
            matches!(e, GgufError::BadAlignment { .. }),
            "{bad}/{ty}: {e}"
        );
    }
}

fn tensor_file(tensors: &[(&str, &[u64], u32, u64)], data_len: usize) -> Raw {
    let mut r = Raw::header(3, tensors.len() as u64, 0);
    for (name, dims, ty, off) in tensors {
        r = r.tensor(name, dims, *ty, *off);
    }
    r.data(32, data_len)
}

#[test]
fn a_valid_hand_built_tensor_file_opens() {
    // Guards the builder itself, so the failures below fail for the stated reason.
    let f =
        GgufFile::from_bytes(tensor_file(&[("a", &[8], 0, 0), ("b", &[32], 8, 32)], 66).0).unwrap();
    assert_eq!(f.tensor("b").unwrap().ty, GgmlType::Q8_0);
    assert_eq!(f.tensor_data(f.tensor("b").unwrap()).len(), 34);
}

#[test]
fn tensor_table_errors() {
    let e = open(tensor_file(&[("a", &[1, 1, 1, 1, 1], 0, 0)], 4));
    assert!(
        matches!(e, GgufError::TooManyDims { ref tensor, n_dims: 5, .. } if tensor == "a"),
        "{e}"
    );
    let e = open(tensor_file(&[("a", &[4], 4, 0)], 64));
    assert!(
        matches!(e, GgufError::UnknownTensorType { type_id: 4, .. }),
        "{e}"
    );
    let e = open(tensor_file(&[("a", &[4], 1000, 0)], 64));
    assert!(
        matches!(e, GgufError::UnknownTensorType { type_id: 1000, .. }),
        "{e}"
    );
    let e = open(tensor_file(&[("a", &[1 << 32, 1 << 32], 0, 0)], 4));
    assert!(
        matches!(e, GgufError::DimsOverflow { ref tensor, .. } if tensor == "a"),
        "{e}"
    );
    let e = open(tensor_file(&[("a", &[1 << 63], 0, 0)], 4));
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
    // 2^62 F64 elements: count fits i64, bytes overflow u64.
    let e = open(tensor_file(&[("a", &[1 << 62], 28, 0)], 4));
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
    let e = open(tensor_file(&[("a", &[100], 12, 0)], 4));
    assert!(
        matches!(
            e,
            GgufError::BadRowSize {
                ty: GgmlType::Q4_K,
                ne0: 100,
                ..
            }
        ),
        "{e}"
    );
    let e = open(tensor_file(&[("a", &[1], 0, 0), ("a", &[1], 0, 32)], 64));
    assert!(
        matches!(e, GgufError::DuplicateTensor { ref name } if name == "a"),
        "{e}"
    );
}

#[test]
fn tensor_data_errors() {
    let e = open(tensor_file(&[("a", &[8], 0, 0)], 31));
    assert!(
        matches!(e, GgufError::TensorOutOfBounds { ref tensor, .. } if tensor == "a"),
        "{e}"
    );
    let e = open(tensor_file(&[("a", &[8], 0, u64::MAX - 31)], 32));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    let e = open(tensor_file(&[("a", &[8], 0, 16)], 64));
    assert!(
        matches!(
            e,
            GgufError::MisalignedTensor {
                offset: 16,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
    let e = open(tensor_file(&[("a", &[16], 0, 0), ("b", &[8], 0, 32)], 64));
    assert!(
        matches!(e, GgufError::TensorsOverlap { ref first, ref second, first_end: 64, second_start: 32 }
            if first == "a" && second == "b"),
        "{e}"
    );
    // Same start, listed in reverse order.
    let e = open(tensor_file(&[("b", &[8], 0, 0), ("a", &[8], 0, 0)], 64));
    assert!(matches!(e, GgufError::TensorsOverlap { .. }), "{e}");
    // Empty tensors may share offsets with anything.
    GgufFile::from_bytes(tensor_file(&[("a", &[8], 0, 0), ("e", &[0], 0, 0)], 32).0).unwrap();
    // Missing padding between the table and the data section.
    let r = Raw::header(3, 1, 0).tensor("a", &[0], 0, 0);
    let e = open(r);
    assert!(
        matches!(e, GgufError::Truncated { ref what, .. } if what.contains("padding")),
        "{e}"
    );
}

#[test]
fn open_reports_missing_files() {
    let e = GgufFile::open(std::path::Path::new("no/such/file.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Open { .. }), "{e}");
    assert!(e.to_string().contains("no/such/file.gguf"));
}
