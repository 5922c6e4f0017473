//! qwen4exp's PLE n-gram table streamed from disk under a RAM budget (`experts::rows`): the
//! same logits, bit for bit, as the table read from the mapping — for a prompt, for decode, for
//! a batch of sequences and across a speculative verify and its rollback — with a row cache
//! small enough that rows are evicted and read again; the plan counting the table beside the
//! experts and refusing a budget under its floor with the parts named; an expert-packed sidecar
//! beside the GGUF leaving the table's rows to the GGUF.

use std::path::{Path, PathBuf};
use xwen_engine::{EngineConfig, LogitsMode, Model, SeqState, SeqStep};

fn fixture(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond/qwen4exp").join(rel);
    assert!(p.exists(), "committed fixture {} is missing", p.display());
    p
}

fn cfg(budget: Option<u64>) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 256, ram_budget: budget, ..Default::default() }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn argmax(x: &[f32]) -> u32 {
    x.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32
}

/// The model at its floor: the smallest row cache (one token's rows) and expert cache.
fn at_floor(path: &Path) -> Model {
    at_floor_for(path, 1)
}

/// `at_floor` with the state of `n_seq` sequences planned.
fn at_floor_for(path: &Path, n_seq: usize) -> Model {
    let c = |b| EngineConfig { n_seq, ..cfg(Some(b)) };
    let plan = Model::load(path, &c(1 << 50)).unwrap().memory_plan().unwrap().clone();
    let m = Model::load(path, &c(plan.floor())).unwrap();
    let p = m.memory_plan().unwrap();
    assert_eq!(p.row_cache_bytes, p.min_row_cache_bytes, "at the floor the row cache is one token's rows");
    m
}

/// Every position's logits of `prompt`, then `steps` greedy decode steps' logits.
fn run(m: &Model, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut st = m.new_state();
    let mut out = vec![m.forward(&mut st, prompt, LogitsMode::All).unwrap()];
    for _ in 0..steps {
        let last = out.last().unwrap();
        let tok = argmax(&last[last.len() - m.n_vocab()..]);
        out.push(m.forward(&mut st, &[tok], LogitsMode::Last).unwrap());
    }
    out
}

fn prompt(n: usize, vocab: usize, seed: usize) -> Vec<u32> {
    // repeated stretches: a step asks for some rows twice (read once)
    (0..n).map(|i| (((i % 11) * 7919 + seed) % vocab) as u32).collect()
}

#[test]
fn streamed_table_rows_give_the_mapped_logits_bit_for_bit() {
    for rel in ["model-q8_0.gguf", "model-q4_k_m.gguf"] {
        let path = fixture(rel);
        let mapped = Model::load(&path, &cfg(None)).unwrap();
        assert!(mapped.row_cache_stats().is_none(), "{rel}: no budget, nothing streams");
        let streamed = at_floor(&path);
        let v = mapped.n_vocab();
        let p = prompt(40, v, 13);
        let want = run(&mapped, &p, 6);
        let got = run(&streamed, &p, 6);
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_eq!(bits(a), bits(b), "{rel}: step {i} (0: the prompt) differs from the mapped run");
        }
        let s = streamed.row_cache_stats().expect("the table streams under a budget");
        assert!(s.misses > 0 && s.reads > 0 && s.bytes_read > 0, "{rel}: {s:?}");
        assert!(s.evictions > 0, "{rel}: a cache of one token's rows evicts: {s:?}");
        assert!(s.hits + s.misses < s.rows_asked, "{rel}: rows asked twice in a step are looked up once: {s:?}");
        // the same prompt again: its rows were evicted, so they are read again
        streamed.reset_row_cache_stats();
        assert_eq!(bits(&run(&streamed, &p, 0)[0]), bits(&want[0]), "{rel}: the prompt again");
        let again = streamed.row_cache_stats().unwrap();
        assert!(again.misses > 0 && again.bytes_read > 0, "{rel}: evicted rows are read again: {again:?}");
        assert!(again.cached_bytes <= again.capacity_bytes, "{rel}: {again:?}");

        // a cache that holds every row: the second pass reads nothing
        let ample = Model::load(&path, &cfg(Some(1 << 50))).unwrap();
        assert_eq!(bits(&run(&ample, &p, 0)[0]), bits(&want[0]), "{rel}: ample budget");
        ample.reset_row_cache_stats();
        assert_eq!(bits(&run(&ample, &p, 0)[0]), bits(&want[0]), "{rel}: ample budget, cached rows");
        let warm = ample.row_cache_stats().unwrap();
        assert!(warm.misses == 0 && warm.bytes_read == 0 && warm.hits > 0, "{rel}: {warm:?}");
    }
}

#[test]
fn a_batch_of_sequences_reads_its_rows_together_and_gets_each_ones_own_logits() {
    let path = fixture("model-q8_0.gguf");
    let mapped = Model::load(&path, &cfg(None)).unwrap();
    let streamed = at_floor_for(&path, 3);
    let v = mapped.n_vocab();
    let (a, b, c) = (prompt(9, v, 5), prompt(17, v, 5), prompt(3, v, 101));
    let batch = |m: &Model| {
        let (mut sa, mut sb, mut sc) = (m.new_state(), m.new_state(), m.new_state());
        let mut steps = [SeqStep::new(&mut sa, &a, LogitsMode::All), SeqStep::new(&mut sb, &b, LogitsMode::All), SeqStep::new(&mut sc, &c, LogitsMode::Last)];
        let mut out = m.forward_batch(&mut steps).unwrap();
        // then one decode row each, together
        let mut steps = [SeqStep::new(&mut sa, &[7], LogitsMode::Last), SeqStep::new(&mut sb, &[7], LogitsMode::Last), SeqStep::new(&mut sc, &[8], LogitsMode::Last)];
        out.extend(m.forward_batch(&mut steps).unwrap());
        out
    };
    let (want, got) = (batch(&mapped), batch(&streamed));
    for (i, (x, y)) in want.iter().zip(&got).enumerate() {
        assert_eq!(bits(x), bits(y), "batch output {i}");
    }
}

/// Verify `draft` after `st`'s position in one decode-order span: every row's logits.
fn verify(m: &Model, st: &mut SeqState, draft: &[u32]) -> Vec<Vec<f32>> {
    let mut step = [SeqStep { state: st, tokens: draft, logits: LogitsMode::All, decode_order: true, hidden: false, banned: &[] }];
    m.forward_batch(&mut step).unwrap().pop().unwrap().chunks_exact(m.n_vocab()).map(<[f32]>::to_vec).collect()
}

#[test]
fn a_verify_and_its_rollback_on_streamed_rows_follow_plain_mapped_decode() {
    let path = fixture("model-q8_0.gguf");
    let mapped = Model::load(&path, &cfg(None)).unwrap();
    let streamed = at_floor(&path);
    let v = mapped.n_vocab() as u32;
    // past QSA's dense start (position 19), so the verify rows are sparse too
    let p: Vec<u32> = (0..24).map(|i| (i * 7919 + 11) % v).collect();
    // plain greedy on the mapped table: the tokens, and logits[i] after toks[..i]
    let mut st = mapped.new_state();
    let mut logits = vec![mapped.forward(&mut st, &p, LogitsMode::Last).unwrap()];
    let mut toks = Vec::new();
    for _ in 0..8 {
        toks.push(argmax(logits.last().unwrap()));
        logits.push(mapped.forward(&mut st, &[*toks.last().unwrap()], LogitsMode::Last).unwrap());
    }
    let mut b = streamed.new_state();
    b.keep_history(5);
    assert_eq!(bits(&streamed.forward(&mut b, &p, LogitsMode::Last).unwrap()), bits(&logits[0]));
    // three right drafts and a wrong one: the PLE's n-gram window and conv history roll back
    let wrong = (toks[3] + 1) % v;
    let rows = verify(&streamed, &mut b, &[toks[0], toks[1], toks[2], wrong]);
    for i in 0..3 {
        assert_eq!(bits(&rows[i]), bits(&logits[i + 1]), "verify row {i}");
    }
    b.rollback(p.len() + 3).unwrap();
    for i in 3..8 {
        assert_eq!(bits(&streamed.forward(&mut b, &[toks[i]], LogitsMode::Last).unwrap()), bits(&logits[i + 1]), "decode {i} after the rollback");
    }
}

#[test]
fn the_plan_counts_the_table_beside_the_experts_and_names_it_under_the_floor() {
    let path = fixture("model-q8_0.gguf");
    let m = Model::load(&path, &cfg(Some(1 << 50))).unwrap();
    let p = m.memory_plan().unwrap().clone();
    let f = m.gguf();
    let table = f.tensors().iter().find(|t| t.name == "per_layer_token_embd.weight").expect("the fixture has a PLE table");
    assert_eq!(p.table_bytes, table.n_bytes);
    assert_eq!(p.rows_per_token, 16, "3-grams × 8 heads: 16 rows a token");
    assert!(p.row_slot_bytes > 0 && p.row_in_flight_bytes > 0);
    // the table is not in the trunk: the trunk and the table together are no more than the file
    assert!(p.trunk_bytes + p.table_bytes <= f.file_len() + (2 << 20), "{} + {}", p.trunk_bytes, p.table_bytes);
    assert!(p.row_cache_bytes >= p.table_rows * p.row_slot_bytes, "an ample budget caches every row");
    assert!(p.summary().contains("row cache"), "{}", p.summary());
    assert!(m.streams_tensor("per_layer_token_embd.weight") && !m.streams_tensor("token_embd.weight"));
    assert!(m.mapped_weight_bytes() + table.n_bytes <= m.weight_bytes());
    let err = Model::load(&path, &cfg(Some(p.floor() - 1))).err().expect("a budget under the floor is refused").to_string();
    for part in ["trunk", "experts in flight", "smallest expert cache", "table rows in flight", "smallest row cache"] {
        assert!(err.contains(part), "the refusal names {part}: {err}");
    }
}

#[test]
fn an_expert_pack_beside_the_gguf_leaves_the_table_rows_to_the_gguf() {
    let dir = std::env::temp_dir().join(format!("xwen-table-pack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model-q8_0.gguf");
    std::fs::copy(fixture("model-q8_0.gguf"), &path).unwrap();
    let mapped = Model::load(&path, &cfg(None)).unwrap();
    let file = xwen_gguf::GgufFile::open(&path).unwrap();
    let loaded = xwen_engine::models::load(&file).unwrap();
    xwen_engine::experts::pack::write(&file, &loaded.experts, &xwen_engine::experts::pack::sidecar_path(&path)).unwrap();
    let streamed = at_floor(&path);
    assert!(streamed.expert_pack_status().0.is_some(), "the sidecar is used: {:?}", streamed.expert_pack_status().1);
    let p = prompt(30, mapped.n_vocab(), 29);
    let (want, got) = (run(&mapped, &p, 4), run(&streamed, &p, 4));
    for (i, (a, b)) in want.iter().zip(&got).enumerate() {
        assert_eq!(bits(a), bits(b), "step {i} with the sidecar");
    }
    assert!(streamed.row_cache_stats().unwrap().bytes_read > 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
