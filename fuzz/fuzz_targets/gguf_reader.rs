//! Any byte string: `GgufFile::from_bytes` returns Ok or a typed error, never panics or
//! over-allocates. An accepted file serves every tensor range, and rewriting it with
//! `GgufWriter` gives a file that parses and rewrites to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xwen_gguf::{GgufFile, GgufWriter};

fn rewrite(f: &GgufFile) -> Option<Vec<u8>> {
    let mut w = GgufWriter::with_alignment(f.alignment());
    for (k, v) in f.metadata() {
        w.add_kv(k, v.clone());
    }
    for t in f.tensors() {
        // The reader accepts names llama.cpp would not (>= 64 bytes); the writer refuses them.
        w.add_tensor(&t.name, t.ty, &t.dims, f.tensor_data(t).to_vec())
            .ok()?;
    }
    let mut out = Vec::new();
    w.write_to(&mut out).ok()?;
    Some(out)
}

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        assert!(std::ptr::eq(f.tensor(&t.name).unwrap(), t));
    }
    for (k, v) in f.metadata() {
        assert!(f.get(k).is_some_and(|got| std::ptr::eq(got, v)));
    }
    if let Some(once) = rewrite(&f) {
        let g = GgufFile::from_bytes(once.clone()).expect("writer output must parse");
        assert_eq!(g.tensors().len(), f.tensors().len());
        let twice = rewrite(&g).expect("rewrite of writer output");
        assert!(once == twice, "rewrite is not a fixed point");
    }
});
