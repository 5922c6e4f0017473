//! Writer → reader round trips: every value type, several tensor types, alignment, streaming.

mod common;

use common::{pattern, small_model};
use xwen_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("v.u8", Value::U8(0xfe)),
        ("v.i8", Value::I8(-7)),
        ("v.u16", Value::U16(65535)),
        ("v.i16", Value::I16(-32768)),
        ("v.u32", Value::U32(4_000_000_000)),
        ("v.i32", Value::I32(-123_456)),
        ("v.f32", Value::F32(-1.5e-6)),
        ("v.bool_t", Value::Bool(true)),
        ("v.bool_f", Value::Bool(false)),
        ("v.str", Value::from("héllo ✓ \u{0}nul")),
        ("v.str_empty", Value::from("")),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f64", Value::F64(std::f64::consts::PI)),
        ("v.arr_u8", Value::Array(vec![Value::U8(1), Value::U8(2)])),
        ("v.arr_i8", Value::Array(vec![Value::I8(-1)])),
        ("v.arr_u16", Value::Array(vec![Value::U16(9)])),
        ("v.arr_i16", Value::Array(vec![Value::I16(-9)])),
        ("v.arr_u32", Value::from(vec![1u32, 2, 3])),
        ("v.arr_i32", Value::from(vec![-1i32, 0, 1])),
        ("v.arr_f32", Value::from(vec![0.25f32, f32::INFINITY])),
        ("v.arr_bool", Value::from(vec![true, false, true])),
        ("v.arr_str", Value::from(vec!["a", "", "ü"])),
        ("v.arr_u64", Value::from(vec![u64::MAX, 0])),
        (
            "v.arr_i64",
            Value::Array(vec![Value::I64(-5), Value::I64(5)]),
        ),
        ("v.arr_f64", Value::Array(vec![Value::F64(1e300)])),
        ("v.arr_empty", Value::Array(vec![])),
        (
            "v.arr_nested",
            Value::Array(vec![
                Value::from(vec![1u32, 2]),
                Value::from(vec![3u32]),
                Value::Array(vec![]),
            ]),
        ),
    ]
}

fn tensor_cases() -> Vec<(&'static str, GgmlType, Vec<u64>)> {
    vec![
        ("f32", GgmlType::F32, vec![5, 3]),
        ("f16", GgmlType::F16, vec![7]),
        ("bf16", GgmlType::BF16, vec![2, 2, 2]),
        ("q8_0", GgmlType::Q8_0, vec![64, 3]),
        ("q4_0", GgmlType::Q4_0, vec![32, 1, 2]),
        ("q4_k", GgmlType::Q4_K, vec![256, 2]),
        ("q6_k", GgmlType::Q6_K, vec![512, 1, 1, 2]),
        ("i32", GgmlType::I32, vec![3]),
        ("iq4_xs", GgmlType::IQ4_XS, vec![256]),
        ("empty", GgmlType::F32, vec![0, 4]),
        ("scalar", GgmlType::F32, vec![]),
    ]
}

fn build(alignment: u64) -> (GgufWriter, Vec<Vec<u8>>) {
    let mut w = GgufWriter::with_alignment(alignment);
    for (k, v) in every_value() {
        w.add_kv(k, v);
    }
    let mut datas = Vec::new();
    for (i, (name, ty, dims)) in tensor_cases().into_iter().enumerate() {
        let n = ty.row_bytes(dims.iter().product()).unwrap() as usize;
        let data = pattern(n, i as u8);
        w.add_tensor(name, ty, &dims, data.clone()).unwrap();
        datas.push(data);
    }
    (w, datas)
}

#[test]
fn every_value_type_and_tensor_type_round_trips() {
    for alignment in [32, 1, 64, 4096] {
        let (w, datas) = build(alignment);
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), alignment);
        let expected = every_value();
        let got: Vec<_> = f
            .metadata()
            .iter()
            .filter(|(k, _)| k != "general.alignment")
            .collect();
        assert_eq!(got.len(), expected.len());
        for ((gk, gv), (ek, ev)) in got.iter().zip(&expected) {
            assert_eq!(gk, ek);
            assert_eq!(gv, ev, "{ek}");
            assert_eq!(f.get(ek), Some(ev));
        }
        assert_eq!(f.data_offset() % alignment, 0);
        for ((name, ty, dims), data) in tensor_cases().iter().zip(&datas) {
            let t = f.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!((t.ty, &t.dims), (*ty, dims));
            assert_eq!(t.offset % alignment, 0);
            assert_eq!(t.n_bytes, data.len() as u64);
            assert_eq!(f.tensor_data(t), &data[..], "{name}");
        }
        assert_eq!(f.tensors().len(), tensor_cases().len());
    }
}

#[test]
fn typed_getters() {
    let f = GgufFile::from_bytes(small_model()).unwrap();
    assert_eq!(f.architecture(), Some("qwen35"));
    assert_eq!(f.arch_key("block_count"), "qwen35.block_count");
    assert_eq!(f.get_u32(&f.arch_key("block_count")), Some(2));
    assert_eq!(f.get_u64("qwen35.embedding_length"), Some(64));
    assert_eq!(f.get_f32("qwen35.rope.freq_base"), Some(1e7));
    assert_eq!(f.get_bool("tokenizer.ggml.add_bos_token"), Some(false));
    assert_eq!(f.get_str("general.name"), Some("tiny test"));
    assert_eq!(
        f.get_array("tokenizer.ggml.tokens").map(<[Value]>::len),
        Some(40)
    );
    assert_eq!(
        f.get_str("general.file_type"),
        None,
        "wrong type reads as absent"
    );
    assert_eq!(f.get("no.such.key"), None);
    let t = f.tensor("blk.0.ffn_up.weight").unwrap();
    assert_eq!((t.n_elements(), t.rows()), (512, 2));
}

#[test]
fn file_on_disk_is_memory_mapped_and_identical() {
    let (w, _) = build(32);
    let dir = std::env::temp_dir().join(format!("xwen-gguf-rt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rt.gguf");
    w.write_file(&path).unwrap();
    let from_disk = GgufFile::open(&path).unwrap();
    let bytes = w.to_bytes();
    assert_eq!(from_disk.file_len(), bytes.len() as u64);
    let in_mem = GgufFile::from_bytes(bytes).unwrap();
    for t in in_mem.tensors() {
        assert_eq!(
            from_disk.tensor_data(from_disk.tensor(&t.name).unwrap()),
            in_mem.tensor_data(t)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn streamed_file_equals_in_memory_file() {
    let (w_mem, datas) = build(64);
    // Same tensors, every other one streamed, pushed in awkward chunk sizes that span tensors.
    let mut w = GgufWriter::with_alignment(64);
    for (k, v) in every_value() {
        w.add_kv(k, v);
    }
    let mut streamed = Vec::new();
    for (i, ((name, ty, dims), data)) in tensor_cases().into_iter().zip(&datas).enumerate() {
        if i % 2 == 0 {
            w.add_tensor_info(name, ty, &dims).unwrap();
            streamed.extend_from_slice(data);
        } else {
            w.add_tensor(name, ty, &dims, data.clone()).unwrap();
        }
    }
    let mut s = w.stream_to(Vec::new()).unwrap();
    assert_eq!(s.current_tensor(), Some("f32"));
    for chunk in streamed.chunks(7) {
        s.write_data(chunk).unwrap();
    }
    let out = s.finish().unwrap();
    assert_eq!(out, w_mem.to_bytes());
}

#[test]
fn stream_rejects_missing_and_extra_bytes() {
    let mut w = GgufWriter::new();
    w.add_tensor_info("a", GgmlType::F32, &[4]).unwrap();
    let mut s = w.stream_to(Vec::new()).unwrap();
    s.write_data(&[0; 8]).unwrap();
    assert!(matches!(s.finish(), Err(GgufError::MissingTensorData { tensor }) if tensor == "a"));

    let mut s = w.stream_to(Vec::new()).unwrap();
    assert!(matches!(
        s.write_data(&[0; 17]),
        Err(GgufError::StreamOverrun { got: 1 })
    ));
    assert!(matches!(
        w.write_to(&mut Vec::new()),
        Err(GgufError::MissingTensorData { .. })
    ));
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new();
    let e = w
        .add_tensor("x", GgmlType::Q4_K, &[256], vec![0; 10])
        .unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::TensorSizeMismatch {
                expected: 144,
                got: 10,
                ..
            }
        ),
        "{e}"
    );
    let e = w.add_tensor_info("x", GgmlType::Q4_K, &[128]).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::BadRowSize {
                ne0: 128,
                block_size: 256,
                ..
            }
        ),
        "{e}"
    );
    let e = w
        .add_tensor_info("x", GgmlType::F32, &[1, 1, 1, 1, 1])
        .unwrap_err();
    assert!(matches!(e, GgufError::TooManyDims { n_dims: 5, .. }), "{e}");
    let e = w
        .add_tensor_info("x", GgmlType::F32, &[u64::MAX, 2])
        .unwrap_err();
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
    let e = w
        .add_tensor_info(&"n".repeat(64), GgmlType::F32, &[1])
        .unwrap_err();
    assert!(
        matches!(e, GgufError::TensorNameTooLong { len: 64, .. }),
        "{e}"
    );
    w.add_tensor_info("x", GgmlType::F32, &[1]).unwrap();
    let e = w.add_tensor_info("x", GgmlType::F32, &[1]).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateTensor { .. }), "{e}");
    w.add_kv("mixed", Value::Array(vec![Value::U8(1), Value::U32(2)]));
    let e = w.header_bytes().unwrap_err();
    assert!(
        matches!(e, GgufError::MixedArray { ref key } if key == "mixed"),
        "{e}"
    );
}

#[test]
fn add_kv_replaces_in_place_and_alignment_key_sets_alignment() {
    let mut w = GgufWriter::new();
    w.add_kv("a", Value::U32(1));
    w.add_kv("b", Value::U32(2));
    w.add_kv("a", Value::from("x"));
    w.add_kv("general.alignment", Value::U32(128));
    w.add_tensor("t", GgmlType::F32, &[1], vec![1, 2, 3, 4])
        .unwrap();
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let keys: Vec<_> = f.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b", "general.alignment"]);
    assert_eq!(f.get_str("a"), Some("x"));
    assert_eq!((f.alignment(), f.data_offset() % 128), (128, 0));
}
