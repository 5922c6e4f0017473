//! Writes a fuzzing seed corpus made from small real GGUFs:
//! `cargo run -p xwen-gguf --release --example fuzz_seeds -- OUT_DIR [FILE.gguf ...]`
//! (from the repo root; without files it takes ../shared/models/gguf/*.gguf and
//! tests/fixtures/vocab/*.gguf). Each real file becomes a slim copy — every key, arrays cut to
//! 8 elements, long strings cut, the 6 smallest tensors with their real data — so seeds stay a
//! few KB while keeping real key names, value types and tensor tables. The first 2 KiB of each
//! file are added as-is too (a truncated header), plus one writer-made file with every value type.

use std::path::{Path, PathBuf};

use xwen_gguf::{GgmlType, GgufFile, GgufWriter, Value};

fn slim(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().take(8).map(slim).collect()),
        Value::Str(s) if s.len() > 64 => Value::Str(s.chars().take(32).collect()),
        other => other.clone(),
    }
}

fn slim_file(f: &GgufFile) -> Vec<u8> {
    let mut w = GgufWriter::with_alignment(f.alignment());
    for (k, v) in f.metadata() {
        w.add_kv(k, slim(v));
    }
    let mut small: Vec<_> = f.tensors().iter().collect();
    small.sort_by_key(|t| t.n_bytes);
    for t in small.into_iter().take(6) {
        w.add_tensor(&t.name, t.ty, &t.dims, f.tensor_data(t).to_vec())
            .expect("tensor from a valid file");
    }
    w.to_bytes()
}

fn every_type_file() -> Vec<u8> {
    let mut w = GgufWriter::with_alignment(64);
    let values = [
        Value::U8(1),
        Value::I8(-1),
        Value::U16(2),
        Value::I16(-2),
        Value::U32(3),
        Value::I32(-3),
        Value::F32(0.5),
        Value::Bool(true),
        Value::from("s"),
        Value::U64(4),
        Value::I64(-4),
        Value::F64(0.25),
        Value::from(vec![1u32, 2]),
        Value::Array(vec![Value::from(vec!["a", "b"]), Value::Array(vec![])]),
    ];
    for (i, v) in values.into_iter().enumerate() {
        w.add_kv(&format!("k.{i}"), v);
    }
    for (name, ty, ne0) in [
        ("f", GgmlType::F32, 4),
        ("q", GgmlType::Q8_0, 32),
        ("k", GgmlType::Q4_K, 256),
    ] {
        let n = ty.row_bytes(ne0).unwrap() as usize;
        w.add_tensor(name, ty, &[ne0, 1], vec![7; n]).unwrap();
    }
    w.to_bytes()
}

fn ggufs_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "gguf"));
    v.sort();
    v
}

fn main() {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .expect("usage: fuzz_seeds OUT_DIR [FILE.gguf ...]"),
    );
    let mut inputs: Vec<PathBuf> = args.map(PathBuf::from).collect();
    if inputs.is_empty() {
        inputs = ggufs_in(Path::new("../shared/models/gguf"));
        inputs.extend(ggufs_in(Path::new("tests/fixtures/vocab")));
    }
    std::fs::create_dir_all(&out).unwrap();
    let mut written = vec![("every-type".to_string(), every_type_file())];
    for p in &inputs {
        let stem = p.file_stem().unwrap().to_string_lossy().to_string();
        let f = GgufFile::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        written.push((format!("{stem}-slim"), slim_file(&f)));
        let raw = std::fs::read(p).unwrap();
        written.push((format!("{stem}-head"), raw[..raw.len().min(2048)].to_vec()));
    }
    for (name, bytes) in &written {
        std::fs::write(out.join(name), bytes).unwrap();
        println!("{name}: {} bytes", bytes.len());
    }
}
