//! The runtime layer: the engine's continuous batching gives every sequence the tokens it
//! gets alone (sequences joining, leaving, cancelled, stopped by a stop id, prompts longer than
//! a prefill chunk), and a session's turns equal a fresh greedy run of the whole transcript
//! (continuing, and restoring a checkpoint when the transcript departs from what the state
//! holds). State checkpoints restore without copying KV rows and refuse what they cannot prove.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use xwen_engine::{Engine, EngineConfig, EngineOptions, EngineRequest, LogitsMode, Model, Output, Sampler, SamplerConfig, SeqStep, Session, StopReason};

fn fixture(rel: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity").join(rel);
    assert!(p.exists(), "committed fixture {} is missing", p.display());
    p
}

fn cfg(budget: Option<u64>) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 1024, ram_budget: budget, ..Default::default() }
}

fn prompt(seed: usize, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((seed * 7919 + i * 104_729 + 5) % vocab) as u32).collect()
}

/// A greedy prompt on its own (no slot's prefix), as a fresh scheduled sequence runs.
fn request(p: Vec<u32>, max_tokens: usize, stop_ids: Vec<u32>) -> EngineRequest {
    EngineRequest { one_shot: true, ..EngineRequest::new(p, max_tokens, stop_ids, SamplerConfig::greedy().resolve(false)) }
}

/// Runs an engine of 8 slots until it drains; (tokens, stop) per request. `joins[s]` = step at
/// which request s joins; `cancel` (s, step) cancels request s before that step.
fn drive(m: &Arc<Model>, reqs: &[(Vec<u32>, usize, Vec<u32>)], joins: &[usize], cancel: Option<(usize, usize)>) -> Vec<(Vec<u32>, Option<StopReason>)> {
    let mut e = Engine::new(m.clone(), EngineOptions { parallel: 8, draft: None, prefix: None });
    let mut ids = vec![0u64; reqs.len()];
    let mut out: Vec<(Vec<u32>, Option<StopReason>)> = vec![(Vec::new(), None); reqs.len()];
    let mut step = 0;
    let record = |ids: &[u64], id: u64, o: Output, out: &mut Vec<(Vec<u32>, Option<StopReason>)>| {
        let s = ids.iter().position(|&i| i == id).unwrap();
        match o {
            Output::Token { id: token, .. } => out[s].0.push(token),
            Output::Done { stop, usage, .. } => {
                assert_eq!(usage.completion_tokens, out[s].0.len());
                out[s].1 = Some(stop);
            }
            Output::Failed(error) => panic!("sequence {s} failed: {error}"),
            Output::Shutdown => panic!("sequence {s} shut down"),
            Output::Started { .. } | Output::Prefill { .. } => {}
        }
    };
    loop {
        for (s, r) in reqs.iter().enumerate() {
            if joins[s] == step {
                ids[s] = e.submit(request(r.0.clone(), r.1, r.2.clone()));
            }
        }
        if let Some((s, at)) = cancel {
            if at == step {
                let done = e.cancel(ids[s]);
                assert!(matches!(done, Some(Output::Done { stop: StopReason::Caller, .. })), "a running request's cancel: {done:?}");
            }
        }
        if !e.has_work() && joins.iter().all(|&j| j < step) {
            return out;
        }
        for (id, o) in e.step() {
            record(&ids, id, o, &mut out);
        }
        step += 1;
        assert!(step < 10_000, "the engine never drains");
    }
}

fn check_scheduler(m: &Arc<Model>, what: &str) {
    let v = m.n_vocab();
    let mut reqs: Vec<(Vec<u32>, usize, Vec<u32>)> = vec![
        (prompt(0, 9, v), 12, vec![]),
        (prompt(1, 30, v), 6, vec![]),
        (prompt(2, 1, v), 10, vec![]),
        (prompt(3, 600, v), 4, vec![]), // two prefill chunks
        (prompt(4, 17, v), 9, vec![]),
        (prompt(5, 5, v), 0, vec![]),
        (prompt(6, 12, v), 8, vec![]),
    ];
    // a stop id: the third token request 6 produces alone
    let alone6 = drive(m, &reqs[6..7], &[0], None);
    reqs[6].2 = vec![alone6[0].0[2]];
    let together = drive(m, &reqs, &[0, 1, 1, 2, 4, 3, 0], Some((4, 6)));
    for (s, r) in reqs.iter().enumerate() {
        let alone = drive(m, std::slice::from_ref(r), &[0], None);
        if s == 4 {
            // cancelled at step 6, two steps after joining: a prefix of its own tokens, its Done
            // the cancel's (not recorded)
            assert!(together[s].1.is_none() && alone[0].0.starts_with(&together[s].0), "{what}: cancelled request");
            continue;
        }
        assert_eq!(together[s], alone[0], "{what}: request {s} batched differs from alone");
        // short prompts: the same as the one-sequence runtime
        if r.0.len() <= 512 && r.1 > 0 {
            let mut sess = Session::new(m);
            let mut toks = Vec::new();
            sess.generate(m, &r.0, r.1, &r.2, &mut Sampler::new(SamplerConfig::greedy().resolve(false)), &mut |t| {
                toks.push(t);
                true
            })
            .unwrap();
            assert_eq!(toks, together[s].0, "{what}: request {s} differs from Session::generate");
        }
    }
    assert_eq!(together[5], (vec![], Some(StopReason::Length)));
    assert_eq!(together[6].1, Some(StopReason::StopToken));
    assert_eq!(together[6].0.len(), 3);
}

#[test]
fn scheduled_sequences_get_the_tokens_they_get_alone() {
    check_scheduler(&Arc::new(Model::load(&fixture("cond/qwen3_5/model-q4_k_m.gguf"), &cfg(None)).unwrap()), "dense q4_k_m");
    let moe = fixture("cond/qwen3_5_moe/model-q8_0.gguf");
    check_scheduler(&Arc::new(Model::load(&moe, &cfg(None)).unwrap()), "moe q8_0");
    // a budget that holds 8 sequences' states and one expert above the smallest cache
    let streamed = |budget| EngineConfig { n_seq: 8, ..cfg(Some(budget)) };
    let plan = Model::load(&moe, &streamed(1 << 50)).unwrap().memory_plan().unwrap().clone();
    check_scheduler(&Arc::new(Model::load(&moe, &streamed(plan.floor() + plan.record_bytes)).unwrap()), "moe q8_0 streamed");
}

fn greedy(m: &Model, sess: &mut Session, p: &[u32], n: usize) -> Vec<u32> {
    let mut toks = Vec::new();
    sess.generate(m, p, n, &[], &mut Sampler::new(SamplerConfig::greedy().resolve(false)), &mut |t| {
        toks.push(t);
        true
    })
    .unwrap();
    toks
}

#[test]
fn session_turns_equal_a_fresh_run_of_the_transcript() {
    let m = Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap();
    let v = m.n_vocab();
    let mut sess = Session::new(&m);
    let mut transcript = prompt(10, 14, v);
    for turn in 0..4 {
        let reply = greedy(&m, &mut sess, &transcript, 7);
        let fresh = greedy(&m, &mut Session::new(&m), &transcript, 7);
        assert_eq!(reply, fresh, "turn {turn}");
        // the state holds the transcript and the reply but its last token (never fed)
        assert_eq!(sess.tokens().len(), transcript.len() + reply.len() - 1);
        transcript.extend_from_slice(&reply);
        transcript.extend(prompt(20 + turn, 5, v));
    }
    // a transcript that departs inside the last reply (a template that re-renders it):
    // restored from the checkpoint at the end of the prompt before it
    let held = sess.tokens().to_vec();
    let mut edited = held[..held.len() - 3].to_vec();
    edited.extend(prompt(99, 4, v));
    let (logits, reuse) = sess.prefill(&m, &edited).unwrap();
    assert!(reuse.restored && reuse.reused > 0 && reuse.reused < held.len() - 3, "{reuse:?}");
    let mut fresh = Session::new(&m);
    let (want, _) = fresh.prefill(&m, &edited).unwrap();
    let argmax = |x: &[f32]| x.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
    assert_eq!(argmax(&logits), argmax(&want));
    assert_eq!(sess.tokens(), &edited[..]);
}

#[test]
fn checkpoints_restore_without_the_kv_and_refuse_what_they_cannot_prove() {
    let m = Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap();
    let v = m.n_vocab();
    let p = prompt(3, 20, v);
    let mut a = m.new_state();
    m.forward(&mut a, &p[..12], LogitsMode::None).unwrap();
    let ck = a.checkpoint().unwrap();
    let want = m.forward(&mut a.clone(), &p[12..], LogitsMode::Last).unwrap();
    m.forward(&mut a, &p[12..16], LogitsMode::None).unwrap();
    assert!(ck.bytes() > 0 && ck.bytes() < a.bytes(), "a checkpoint holds no KV rows");
    a.restore_checkpoint(&ck).unwrap();
    assert_eq!(a.pos, 12);
    let got = m.forward(&mut a, &p[12..], LogitsMode::Last).unwrap();
    assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "restored state continues bit for bit");
    // another sequence's checkpoint, a checkpoint ahead of the state, one cut below
    let b = m.new_state();
    assert!(m.new_state().restore_checkpoint(&ck).is_err());
    let mut early = b.clone();
    let ahead = a.checkpoint().unwrap();
    let ck8 = {
        let mut c = m.new_state();
        m.forward(&mut c, &p[..8], LogitsMode::None).unwrap();
        let ck8 = c.checkpoint().unwrap();
        m.forward(&mut c, &p[8..10], LogitsMode::None).unwrap();
        let ck10 = c.checkpoint().unwrap();
        c.restore_checkpoint(&ck8).unwrap();
        m.forward(&mut c, &p[..3], LogitsMode::None).unwrap(); // other tokens at 8..11
        assert!(c.restore_checkpoint(&ck10).is_err(), "cut below it since");
        assert!(c.restore_checkpoint(&ck8).is_ok(), "rows below 8 are unchanged");
        ck8
    };
    assert!(early.restore_checkpoint(&ahead).is_err());
    assert!(early.restore_checkpoint(&ck8).is_err());
}

#[test]
fn kv_caches_reserve_the_context_once_and_never_move() {
    use xwen_engine::state::LayerState;
    // a context that is no power of two, and a first prompt that is none either: growth by
    // doubling would have reserved 2 × 96 past 150 positions, copying every row on the way
    let c = EngineConfig { max_ctx: 150, ..cfg(None) };
    let m = Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &c).unwrap();
    let v = m.n_vocab();
    let mut st = m.new_state();
    let caps = |st: &xwen_engine::SeqState| -> Vec<(usize, usize, usize)> {
        st.layers
            .iter()
            .filter_map(|l| match l {
                LayerState::Attn(kv) => Some((kv.k.capacity(), kv.v.capacity(), kv.k.len())),
                LayerState::Delta(_) => None,
            })
            .collect()
    };
    m.forward(&mut st, &prompt(5, 23, v), LogitsMode::None).unwrap();
    let first = caps(&st);
    assert!(!first.is_empty(), "the fixture has attention layers");
    for &(kc, vc, len) in &first {
        let width = len / 23;
        assert_eq!(kc, 150 * width, "K room for the context, exactly");
        assert!(vc >= 150 && vc % 150 == 0, "V room for the context");
    }
    for i in 0..126 {
        m.forward(&mut st, &prompt(6 + i, 1, v), LogitsMode::None).unwrap();
    }
    assert_eq!(st.pos, 149);
    let last = caps(&st);
    for (a, b) in first.iter().zip(&last) {
        assert_eq!((a.0, a.1), (b.0, b.1), "no reallocation on the way to the context");
    }
    // past the context is refused, not grown into
    m.forward(&mut st, &prompt(1, 1, v), LogitsMode::None).unwrap();
    assert!(m.forward(&mut st, &prompt(2, 1, v), LogitsMode::None).is_err());
}

#[test]
fn a_budget_plans_the_state_of_n_sequences_and_the_engine_admits_no_more() {
    let moe = fixture("cond/qwen3_5_moe/model-q8_0.gguf");
    let plan = |n_seq: usize, budget: u64| Model::load(&moe, &EngineConfig { n_seq, ..cfg(Some(budget)) }).map(|m| m.memory_plan().unwrap().clone());
    let one = plan(1, 1 << 50).unwrap();
    let four = plan(4, 1 << 50).unwrap();
    assert_eq!(four.state_bytes, 4 * one.state_bytes);
    assert_eq!(four.floor() - one.floor(), 3 * one.state_bytes);
    // between the two floors: enough for one sequence, refused for four, with the count named
    let between = one.floor() + one.state_bytes;
    assert!(plan(1, between).is_ok());
    let err = plan(4, between).unwrap_err().to_string();
    assert!(err.contains("4 sequences"), "{err}");
    let m = Model::load(&moe, &EngineConfig { n_seq: 2, ..cfg(Some(1 << 50)) }).unwrap();
    assert_eq!(m.max_sequences(), 2);
    let v = m.n_vocab();
    let mut e = Engine::new(m, EngineOptions { parallel: 8, draft: None, prefix: None });
    assert_eq!(e.parallel(), 2, "the slots are the plan's two");
    for seed in 1..=3 {
        e.submit(request(prompt(seed, 4, v), 2, vec![]));
    }
    e.admit();
    assert_eq!((e.running(), e.queued()), (2, 1), "a third sequence over the plan's two waits");
    assert_eq!(Model::load(&moe, &cfg(None)).unwrap().max_sequences(), usize::MAX);
}

#[test]
fn routes_are_recorded_per_sequence_position_and_layer() {
    let moe = fixture("cond/qwen3_5_moe/model-q8_0.gguf");
    let rec = |budget| EngineConfig { record_routes: true, n_seq: 2, ..cfg(budget) };
    let m = Model::load(&moe, &rec(None)).unwrap();
    let v = m.n_vocab();
    let (p, q) = (prompt(1, 7, v), prompt(2, 3, v));
    let mut a = m.new_state();
    m.forward(&mut a, &p, LogitsMode::Last).unwrap();
    let alone = m.take_routes();
    let n_layers = alone.iter().map(|r| r.layer).max().unwrap() + 1;
    assert_eq!(alone.len(), 7 * n_layers);
    assert!(alone.iter().all(|r| r.seq == 0 && r.margin >= 0.0 && r.experts.len() == r.weights.len()));
    assert_eq!((alone[0].pos, alone[0].layer), (0, 0));
    assert_eq!((alone.last().unwrap().pos, alone.last().unwrap().layer), (6, n_layers - 1));
    // batched with another sequence: sequence 1's decisions are its own run's, at its positions
    let (mut b, mut c) = (m.new_state(), m.new_state());
    m.forward(&mut c, &q[..1], LogitsMode::None).unwrap();
    m.take_routes();
    let mut steps = [SeqStep::new(&mut b, &p, LogitsMode::Last), SeqStep::new(&mut c, &q[1..2], LogitsMode::Last)];
    m.forward_batch(&mut steps).unwrap();
    let both = m.take_routes();
    let seq0: Vec<_> = both.iter().filter(|r| r.seq == 0).cloned().collect();
    assert_eq!(seq0, alone);
    assert!(both.iter().filter(|r| r.seq == 1).all(|r| r.pos == 1));
    // the same decisions when the experts stream
    let plan = Model::load(&moe, &rec(Some(1 << 50))).unwrap().memory_plan().unwrap().clone();
    let s = Model::load(&moe, &rec(Some(plan.floor() + plan.record_bytes))).unwrap();
    let mut st = s.new_state();
    s.forward(&mut st, &p, LogitsMode::Last).unwrap();
    assert_eq!(s.take_routes(), alone);
    // off by default
    let quiet = Model::load(&moe, &cfg(None)).unwrap();
    quiet.forward(&mut quiet.new_state(), &p, LogitsMode::Last).unwrap();
    assert!(quiet.take_routes().is_empty());
}

/// A conversation continued through the scheduler (a server's slot) beside other requests:
/// each turn's tokens are `Session::generate`'s on the same conversation, its prefix reused as
/// much as the session reuses it.
#[test]
fn scheduled_sessions_reuse_their_prefix_and_equal_session_generate() {
    let m = Arc::new(Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap());
    let v = m.n_vocab();
    let greedy = || Sampler::new(SamplerConfig::greedy().resolve(false));
    let mut reference = Session::new(&m);
    let mut e = Engine::new(m.clone(), EngineOptions { parallel: 4, draft: None, prefix: None });
    let mut transcript = prompt(40, 20, v);
    for turn in 0..3 {
        let mut want = Vec::new();
        let (_, reuse) = reference
            .generate(&m, &transcript, 6, &[], &mut greedy(), &mut |t| {
                want.push(t);
                true
            })
            .unwrap();
        // another conversation shares the steps; the transcript finds its slot by its prefix
        e.submit(EngineRequest::new(prompt(50 + turn, 9, v), 8, vec![], SamplerConfig::greedy().resolve(false)));
        let id = e.submit(EngineRequest::new(transcript.clone(), 6, vec![], SamplerConfig::greedy().resolve(false)));
        let (mut got, mut cached) = (Vec::new(), None);
        while e.has_work() {
            for (i, o) in e.step() {
                match o {
                    Output::Started { cached: c } if i == id => cached = Some(c),
                    Output::Token { id: token, .. } if i == id => got.push(token),
                    _ => {}
                }
            }
        }
        assert_eq!(got, want, "turn {turn}");
        assert_eq!(cached, Some(reuse.reused), "turn {turn}: the prefix reused, as the session reuses it");
        if turn > 0 {
            assert!(reuse.reused > 0);
        }
        transcript.extend_from_slice(&want);
        transcript.extend(prompt(60 + turn, 4, v));
    }
}
