//! A failed read of qwen4exp's streamed PLE table (`experts::rows`) fails only the sequences
//! whose tokens needed the rows it could not read: in a batched step the other sequence, whose
//! rows are in the row cache, gets the bits it gets alone; the failed sequence's error names the
//! table; nothing unread is cached, so once the disk reads again the failed prompt gives the
//! mapped model's logits. The fault is a bad stretch of the file under the whole table
//! (`faults::fail_bytes`). One test in its own binary: the faults are process-wide.

use std::path::{Path, PathBuf};
use xwen_engine::experts::direct_read::faults;
use xwen_engine::{EngineConfig, LogitsMode, Model, SeqStep};

fn fixture() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond/qwen4exp/model-q8_0.gguf");
    assert!(p.exists(), "committed fixture {} is missing", p.display());
    p
}

fn cfg(budget: Option<u64>) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 256, ram_budget: budget, n_seq: 2, ..Default::default() }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The file bytes of the PLE table.
fn table_bytes(path: &Path) -> std::ops::Range<u64> {
    let f = xwen_gguf::GgufFile::open(path).unwrap();
    let t = f.tensor("per_layer_token_embd.weight").expect("the fixture has a PLE table");
    let start = f.data_offset() + t.offset;
    start..start + t.n_bytes
}

#[test]
fn a_failed_table_read_fails_only_the_sequences_that_needed_its_rows() {
    let path = fixture();
    let mapped = Model::load(&path, &cfg(None)).unwrap();
    // an ample budget: the table streams, and every row read stays in the row cache
    let streamed = Model::load(&path, &cfg(Some(1 << 50))).unwrap();
    assert!(streamed.streams_tensor("per_layer_token_embd.weight"));
    let v = mapped.n_vocab() as u32;
    let (pa, pb): (Vec<u32>, Vec<u32>) = ((0..7).map(|i| (i * 7919 + 13) % v).collect(), (0..9).map(|i| (i * 104_729 + 5) % v).collect());
    let tb = 11 % v;

    // B's prompt, then its next token from a copy of that state: both steps' rows now cached
    let mut sb = streamed.new_state();
    streamed.forward(&mut sb, &pb, LogitsMode::Last).unwrap();
    let want_b = streamed.forward(&mut sb.clone(), &[tb], LogitsMode::Last).unwrap();
    let mut mb = mapped.new_state();
    mapped.forward(&mut mb, &pb, LogitsMode::Last).unwrap();
    assert_eq!(bits(&want_b), bits(&mapped.forward(&mut mb, &[tb], LogitsMode::Last).unwrap()), "streamed rows give the mapped bits");
    let want_a = mapped.forward(&mut mapped.new_state(), &pa, LogitsMode::All).unwrap();

    // every read of the table fails from here: A's prompt needs rows no one read yet
    faults::fail_bytes(table_bytes(&path));
    let (mut sa, mut sb2) = (streamed.new_state(), sb.clone());
    let next_b = [tb];
    let got = {
        let mut steps = [SeqStep::new(&mut sa, &pa, LogitsMode::All), SeqStep::new(&mut sb2, &next_b, LogitsMode::Last)];
        streamed.forward_batch_each(&mut steps).unwrap()
    };
    let mut it = got.into_iter();
    let (a, b) = (it.next().unwrap(), it.next().unwrap());
    match a {
        Err(e) => assert!(e.to_string().contains("per_layer_token_embd"), "the error names the table: {e}"),
        Ok(_) => panic!("A's rows cannot be read, yet its step succeeded"),
    }
    assert_eq!(bits(&b.expect("B's rows are all cached: its step goes on").logits), bits(&want_b), "B in the failed step gets its own bits");

    // the disk reads again: the rows that failed were never cached as zeros
    faults::clear();
    let again = streamed.forward(&mut streamed.new_state(), &pa, LogitsMode::All).unwrap();
    assert_eq!(bits(&again), bits(&want_a), "A, retried, gets the mapped model's logits");
}
