//! The seams speculative decoding stands on: a verify of several drafted tokens in
//! one decode-order span gives each row the logits plain one-token decode gives it — bit for
//! bit, so drafted output equals greedy by construction — and a rollback to any of the last
//! kept positions (`SeqState::keep_history`) continues exactly as if the rejected tokens had
//! never been fed, without running anything again.

use std::path::{Path, PathBuf};
use xwen_engine::{EngineConfig, LogitsMode, Model, SeqState, SeqStep};

fn fixture(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity").join(rel);
    assert!(p.exists(), "committed fixture {} is missing", p.display());
    p
}

fn cfg(budget: Option<u64>) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 512, ram_budget: budget, ..Default::default() }
}

fn argmax(x: &[f32]) -> u32 {
    x.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Verify `draft` after `st`'s position in one decode-order span: every row's logits.
fn verify(m: &Model, st: &mut SeqState, draft: &[u32]) -> Vec<Vec<f32>> {
    let mut step = [SeqStep { state: st, tokens: draft, logits: LogitsMode::All, decode_order: true, hidden: false, banned: &[] }];
    let all = m.forward_batch(&mut step).unwrap().pop().unwrap();
    all.chunks_exact(m.n_vocab()).map(<[f32]>::to_vec).collect()
}

/// Plain greedy decode of `n` tokens after `prompt`: the tokens, and logits[i] after toks[..i].
fn plain_greedy(m: &Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut a = m.new_state();
    let mut logits = vec![m.forward(&mut a, prompt, LogitsMode::Last).unwrap()];
    let mut toks = Vec::new();
    for _ in 0..n {
        let t = argmax(logits.last().unwrap());
        toks.push(t);
        logits.push(m.forward(&mut a, &[t], LogitsMode::Last).unwrap());
    }
    (toks, logits)
}

fn check(m: &Model, what: &str) {
    check_after(m, what, 12);
}

/// `check` after a prompt of `n_prompt` tokens.
fn check_after(m: &Model, what: &str, n_prompt: u32) {
    let v = m.n_vocab() as u32;
    let prompt: Vec<u32> = (0..n_prompt).map(|i| (i * 7919 + 11) % v).collect();
    let (toks, logits) = plain_greedy(m, &prompt, 10);
    let p0 = prompt.len();
    let mut b = m.new_state();
    b.keep_history(5);
    assert_eq!(bits(&m.forward(&mut b, &prompt, LogitsMode::Last).unwrap()), bits(&logits[0]));
    // verify 1: three right drafts, then a wrong one, then one more
    let wrong = (toks[3] + 1) % v;
    let rows = verify(m, &mut b, &[toks[0], toks[1], toks[2], wrong, toks[4]]);
    for i in 0..3 {
        assert_eq!(bits(&rows[i]), bits(&logits[i + 1]), "{what}: verify row {i} differs from plain decode");
    }
    // accepted: the drafts greedy agrees with; roll back to before the wrong one
    let accepted = (0..5).take_while(|&i| [toks[0], toks[1], toks[2], wrong][..].get(i).is_some_and(|&d| d == argmax(if i == 0 { &logits[0] } else { &rows[i - 1] }))).count();
    assert_eq!(accepted, 3, "{what}");
    b.rollback(p0 + 3).unwrap();
    assert_eq!(b.pos, p0 + 3);
    assert_eq!(bits(&m.forward(&mut b, &[toks[3]], LogitsMode::Last).unwrap()), bits(&logits[4]), "{what}: after the rollback");
    // verify 2: every draft right, nothing to roll back; then plain decode goes on
    let rows = verify(m, &mut b, &toks[4..7]);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(bits(r), bits(&logits[5 + i]), "{what}: second verify row {i}");
    }
    assert_eq!(bits(&m.forward(&mut b, &[toks[7]], LogitsMode::Last).unwrap()), bits(&logits[8]), "{what}: decode after the verify");
    // a rollback past what is kept is refused and changes nothing
    assert!(b.rollback(p0).is_err());
    assert_eq!(b.pos, p0 + 8);
    // rejecting a whole verify: back to the position it started from
    let before = b.pos;
    verify(m, &mut b, &[wrong, wrong]);
    b.rollback(before).unwrap();
    assert_eq!(bits(&m.forward(&mut b, &[toks[8]], LogitsMode::Last).unwrap()), bits(&logits[9]), "{what}: after rejecting every draft");
}

#[test]
fn verified_drafts_equal_plain_decode_and_rollback_needs_no_rerun() {
    for rel in ["cond/qwen3_5/model-q4_k_m.gguf", "cond/qwen3_5/model-q8_0.gguf", "cond/qwen3_5/model-f32.gguf"] {
        check(&Model::load(&fixture(rel), &cfg(None)).unwrap(), rel);
    }
    let moe = fixture("cond/qwen3_5_moe/model-q4_k_m.gguf");
    check(&Model::load(&moe, &cfg(None)).unwrap(), "moe q4_k_m mapped");
    // qwen4exp: the PLE layer's n-gram window and dilated-conv history roll back with the
    // DeltaNet states; after 24 tokens every verify row is past QSA's dense start (position 19)
    let q4x = Model::load(&fixture("cond/qwen4exp/model-q8_0.gguf"), &cfg(None)).unwrap();
    check(&q4x, "qwen4exp q8_0");
    check_after(&q4x, "qwen4exp q8_0 sparse", 24);
    let plan = Model::load(&moe, &cfg(Some(1 << 50))).unwrap().memory_plan().unwrap().clone();
    check(&Model::load(&moe, &cfg(Some(plan.floor() + plan.record_bytes))).unwrap(), "moe q4_k_m streamed");
}

/// Verify after verify, each rolled back to a different accepted length: every accepted row
/// is plain decode's, and the states let go are reused for the next verify's kept states —
/// what the sequence holds for rollbacks stays within twice the kept depth per layer, and
/// nothing once nothing is kept.
#[test]
fn kept_states_are_reused_across_verifies_and_stay_bounded() {
    let m = Model::load(&fixture("cond/qwen3_5/model-q4_k_m.gguf"), &cfg(None)).unwrap();
    let v = m.n_vocab() as u32;
    let prompt: Vec<u32> = (0..9).map(|i| (i * 104_729 + 5) % v).collect();
    let (toks, logits) = plain_greedy(&m, &prompt, 40);
    let depth = 4;
    let mut b = m.new_state();
    let one_state = b.layers.iter().map(|l| match l {
        xwen_engine::state::LayerState::Delta(d) => (d.conv.len() + d.s.len()) * 4,
        xwen_engine::state::LayerState::Attn(_) => 0,
    });
    let per_depth: usize = one_state.sum();
    assert!(per_depth > 0, "the fixture has recurrent layers");
    b.keep_history(depth + 1);
    m.forward(&mut b, &prompt, LogitsMode::Last).unwrap();
    let mut done = 0; // tokens of `toks` the state holds
    let mut cycle = 0;
    while done + depth < toks.len() {
        // drafts right up to `right`, then wrong
        let right = cycle % (depth + 1);
        let draft: Vec<u32> = (0..depth).map(|i| if i < right { toks[done + 1 + i] } else { (toks[done + 1 + i] + 1) % v }).collect();
        let fed: Vec<u32> = std::iter::once(toks[done]).chain(draft.iter().copied()).take(depth).collect();
        let rows = verify(&m, &mut b, &fed);
        // row 0 follows toks[done], which is right; row i follows draft i − 1
        for (i, r) in rows.iter().enumerate().take(right.min(depth - 1) + 1) {
            assert_eq!(bits(r), bits(&logits[done + 1 + i]), "cycle {cycle}: row {i}");
        }
        let keep = 1 + right.min(depth - 1);
        b.rollback(prompt.len() + done + keep).unwrap();
        done += keep;
        assert!(b.history_bytes() <= 2 * (depth + 1) * per_depth, "cycle {cycle}: {} bytes held for rollbacks", b.history_bytes());
        cycle += 1;
    }
    assert!(cycle >= 8);
    assert_eq!(bits(&m.forward(&mut b, &[toks[done]], LogitsMode::Last).unwrap()), bits(&logits[done + 1]));
    // rollbacks left spare buffers; a snapshot (clone) starts without them
    let spare: usize = b
        .layers
        .iter()
        .map(|l| match l {
            xwen_engine::state::LayerState::Delta(d) => d.spare_count() * d.s.len() * 4,
            xwen_engine::state::LayerState::Attn(_) => 0,
        })
        .sum();
    assert!(spare > 0, "the rolled-back states were kept for reuse");
    assert_eq!(b.clone().history_bytes(), b.history_bytes() - spare);
    b.keep_history(0);
    assert_eq!(b.history_bytes(), 0, "nothing is held once nothing is kept");
}

/// Under a budget the plan counts what verifies of up to `draft_depth` tokens keep for their
/// rollbacks — twice the depth in recurrent states, every sequence — where a drafter will run.
#[test]
fn a_budget_counts_the_states_a_verify_keeps() {
    let moe = fixture("cond/qwen3_5_moe/model-q4_k_m.gguf");
    let draft_bytes = |depth: usize, load_mtp: bool| {
        let c = EngineConfig { draft_depth: depth, load_mtp, n_seq: 2, ..cfg(Some(1 << 50)) };
        Model::load(&moe, &c).unwrap().memory_plan().unwrap().draft_bytes
    };
    // one sequence's recurrent state: a fresh state holds no KV rows
    let recurrent = Model::load(&moe, &cfg(None)).unwrap().new_state().bytes() as u64;
    assert!(recurrent > 0);
    // an external drafter (the file's head not loaded): 2 × depth states × 2 sequences
    assert_eq!(draft_bytes(5, false) - draft_bytes(0, false), 2 * 5 * recurrent * 2);
    // the file's own head would draft, but this file has none: nothing is kept
    assert_eq!(draft_bytes(5, true), draft_bytes(0, true));
}
