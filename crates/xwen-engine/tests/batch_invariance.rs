//! Batch invariance: sequences run together in one batched forward (`Model::forward_batch`) get
//! the logits each gets alone — bit for bit — for dense and MoE models, experts mapped and
//! streamed, with sequences joining and leaving between steps and prefill chunks mixed with
//! decode rows.

use std::path::{Path, PathBuf};
use xwen_engine::{EngineConfig, LogitsMode, Model, SeqStep};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(rel: &str) -> PathBuf {
    let p = repo_root().join("tests/fixtures/parity").join(rel);
    assert!(p.exists(), "committed fixture {} is missing", p.display());
    p
}

/// A trained tiny model from ../shared/models (its tests are ignored where it is absent).
fn trained(name: &str) -> PathBuf {
    let p = repo_root().join("../shared/models/gguf").join(name);
    assert!(p.exists(), "{} is missing", p.display());
    p
}

fn cfg(budget: Option<u64>) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 1024, ram_budget: budget, ..Default::default() }
}

/// One sequence's feed: chunks of tokens, each run at a given batch step with a logits mode.
struct Feed {
    chunks: Vec<(usize, Vec<u32>, LogitsMode)>,
}

/// Sequence `s`'s plan: joins at step `join`, a prompt fed as chunks of `prompt_chunks`
/// tokens on consecutive steps, then `decode` one-token steps; leaves after its last one.
fn plan(s: usize, join: usize, prompt_chunks: &[usize], decode: usize, vocab: usize) -> Feed {
    let tok = |i: usize| ((s * 7919 + i * 104_729 + 17) % vocab) as u32;
    let mut chunks = Vec::new();
    let mut step = join;
    let mut i = 0;
    for (c, &len) in prompt_chunks.iter().enumerate() {
        // the first chunk of sequence 1 asks for every row's logits
        let mode = if s == 1 && c == 0 { LogitsMode::All } else { LogitsMode::Last };
        chunks.push((step, (0..len).map(|k| tok(i + k)).collect(), mode));
        i += len;
        step += 1;
    }
    for _ in 0..decode {
        chunks.push((step, vec![tok(i)], LogitsMode::Last));
        i += 1;
        step += 1;
    }
    Feed { chunks }
}

fn feeds(vocab: usize) -> Vec<Feed> {
    vec![
        plan(0, 0, &[9], 12, vocab),       // prefill alone, then decodes beside the others
        plan(1, 1, &[5, 3], 6, vocab),     // joins while 0 decodes; leaves early
        plan(2, 3, &[1, 20], 7, vocab),    // a one-token first chunk, then a long one
        plan(3, 4, &[2], 9, vocab),        // joins late
        plan(4, 6, &[13, 4], 5, vocab),    // joins after 1 has left
        plan(5, 2, &[3], 10, vocab),       // 5..8: enough decode rows at once (8+) for the
        plan(6, 2, &[1], 10, vocab),       // token-lane kernels of every type
        plan(7, 3, &[6], 8, vocab),
        plan(8, 3, &[2], 9, vocab),
    ]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs every feed alone, then all together step by step, and compares each chunk's logits.
fn check(m: &Model, what: &str) {
    let feeds = feeds(m.n_vocab());
    let alone: Vec<Vec<Vec<f32>>> = feeds
        .iter()
        .map(|f| {
            let mut st = m.new_state();
            f.chunks.iter().map(|(_, toks, mode)| m.forward(&mut st, toks, *mode).unwrap()).collect()
        })
        .collect();
    let mut states: Vec<_> = feeds.iter().map(|_| m.new_state()).collect();
    let last_step = feeds.iter().flat_map(|f| f.chunks.iter().map(|c| c.0)).max().unwrap();
    let mut max_batch = 0;
    for step in 0..=last_step {
        let mut who = Vec::new();
        let mut steps = Vec::new();
        for (s, (f, st)) in feeds.iter().zip(states.iter_mut()).enumerate() {
            if let Some(c) = f.chunks.iter().position(|c| c.0 == step) {
                let (_, toks, mode) = &f.chunks[c];
                who.push((s, c));
                steps.push(SeqStep::new(st, toks, *mode));
            }
        }
        max_batch = max_batch.max(steps.iter().filter(|s| s.tokens.len() == 1).count());
        let got = m.forward_batch(&mut steps).unwrap();
        assert_eq!(got.len(), who.len());
        for ((s, c), g) in who.into_iter().zip(got) {
            assert!(
                bits(&g) == bits(&alone[s][c]),
                "{what}: sequence {s}, chunk {c} (step {step}): batched logits differ from the sequence run alone"
            );
        }
    }
    assert!(max_batch >= 8, "the schedule decodes at least 8 sequences at once");
}

#[test]
fn dense_sequences_batched_equal_each_alone() {
    for rel in ["cond/qwen3_5/model-q4_k_m.gguf", "cond/qwen3_5/model-q8_0.gguf", "cond/qwen3_5/model-f32.gguf"] {
        let m = Model::load(&fixture(rel), &cfg(None)).unwrap();
        check(&m, rel);
    }
}

#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn trained_dense_sequences_batched_equal_each_alone() {
    check(&Model::load(&trained("tiny-qwen35-q4_k_m.gguf"), &cfg(None)).unwrap(), "trained tiny-qwen35 q4_k_m");
}

#[test]
fn moe_sequences_batched_equal_each_alone_mapped_and_streamed() {
    let files = [
        fixture("cond/qwen3_5_moe/model-q4_k_m.gguf"),
        fixture("cond/qwen3_5_moe/model-q8_0.gguf"),
        fixture("cond/qwen3_next/model-q8_0.gguf"),
        fixture("cond/kimi_linear/model-q4_k_m.gguf"),
        fixture("cond/kimi_k3/model-q4_k_m.gguf"),
    ];
    for p in files {
        check_moe_mapped_and_streamed(&p);
    }
}

#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn trained_moe_sequences_batched_equal_each_alone_mapped_and_streamed() {
    check_moe_mapped_and_streamed(&trained("tiny-qwen35moe-q4_k_m.gguf"));
}

fn check_moe_mapped_and_streamed(p: &Path) {
    {
        let mapped = Model::load(&p, &cfg(None)).unwrap();
        check(&mapped, &format!("{} mapped", p.display()));
        // a cache one expert above its smallest size: every layer evicts
        // a budget holding the 9 sequences' states, the cache one expert above its smallest
        let budgeted = |b| EngineConfig { n_seq: 9, ..cfg(Some(b)) };
        let plan = Model::load(&p, &budgeted(1 << 50)).unwrap().memory_plan().unwrap().clone();
        let streamed = Model::load(&p, &budgeted(plan.floor() + plan.record_bytes)).unwrap();
        assert!(streamed.streams_experts());
        check(&streamed, &format!("{} streamed", p.display()));
    }
}

#[test]
fn a_budgeted_batch_refuses_more_sequences_than_its_plan_holds() {
    let p = fixture("cond/qwen3_5_moe/model-q8_0.gguf");
    let m = Model::load(&p, &EngineConfig { n_seq: 2, ..cfg(Some(1 << 50)) }).unwrap();
    let mut s: Vec<_> = (0..3).map(|_| m.new_state()).collect();
    let mut steps: Vec<SeqStep> = s.iter_mut().map(|st| SeqStep::new(st, &[1], LogitsMode::Last)).collect();
    let err = m.forward_batch(&mut steps).unwrap_err().to_string();
    assert!(err.contains("RAM plan"), "{err}");
    assert_eq!(m.forward_batch(&mut steps[..2]).unwrap().len(), 2);
}

#[test]
fn a_batch_refuses_the_same_state_twice_and_empty_spans() {
    let m = Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap();
    let mut a = m.new_state();
    let mut steps = [SeqStep::new(&mut a, &[], LogitsMode::Last)];
    assert!(m.forward_batch(&mut steps).is_err());
    assert!(m.forward_batch(&mut []).unwrap().is_empty());
}
