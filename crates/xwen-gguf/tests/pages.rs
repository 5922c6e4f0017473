//! The page-size advice on a weights mapping is only a hint: a file opened either way serves
//! the same bytes, the kernel's report of 2 MiB mappings is read back for a mapped file, and
//! dropping a file from the page cache loses nothing (it is read back on the next access).

use xwen_gguf::{evict_from_page_cache, GgmlType, GgufFile, GgufWriter, MapPages, Value};

fn write_fixture(name: &str) -> std::path::PathBuf {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::Str("qwen35".into()));
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    w.add_tensor("blob", GgmlType::I8, &[data.len() as u64], data).unwrap();
    let path = std::env::temp_dir().join(format!("xwen-pages-{}-{name}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}

#[test]
fn either_page_size_serves_the_same_bytes() {
    let path = write_fixture("same");
    let huge = GgufFile::open_with(&path, MapPages::Huge).unwrap();
    let small = GgufFile::open_with(&path, MapPages::Small).unwrap();
    let t = huge.tensor("blob").unwrap();
    assert_eq!(huge.tensor_data(t), small.tensor_data(small.tensor("blob").unwrap()));
    if cfg!(target_os = "linux") {
        let n = huge.huge_mapped_bytes().expect("smaps reports the mapping");
        assert!(n <= std::fs::metadata(&path).unwrap().len().next_multiple_of(2 << 20));
        assert_eq!(small.huge_mapped_bytes(), Some(0), "MADV_NOHUGEPAGE maps 4 KiB pages only");
    }
    // an in-memory file has no mapping to report on
    assert_eq!(GgufFile::from_bytes(std::fs::read(&path).unwrap()).unwrap().huge_mapped_bytes(), None);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn evicting_a_file_from_the_page_cache_loses_nothing() {
    let path = write_fixture("evict");
    let before = std::fs::read(&path).unwrap();
    evict_from_page_cache(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let t = f.tensor("blob").unwrap();
    let off = f.data_offset() as usize + t.offset as usize;
    assert_eq!(f.tensor_data(t), &before[off..off + t.n_bytes as usize]);
    std::fs::remove_file(&path).unwrap();
    assert!(evict_from_page_cache(&path).is_err(), "a missing file is an error, not a no-op");
}
