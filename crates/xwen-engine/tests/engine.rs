//! The engine object: requests queued beyond the slots are admitted as slots free up, each
//! gets the tokens it gets alone (`Session::generate`), a conversation's next turn finds its
//! prefix in the slot it left while a one-shot request starts from nothing, a cancelled request
//! frees its slot at once, and the engine on its own thread delivers the same outputs through a
//! handle.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use xwen_engine::runtime::engine_thread;
use xwen_engine::{Engine, EngineConfig, EngineOptions, EngineRequest, Model, Output, Sampler, SamplerConfig, Session, StopReason};

fn model() -> Model {
    let p: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond/qwen3_5/model-q4_k_m.gguf");
    assert!(p.exists(), "committed fixture {} is missing", p.display());
    Model::load(&p, &EngineConfig { threads: 2, max_ctx: 1024, ..Default::default() }).unwrap()
}

fn prompt(seed: usize, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((seed * 7919 + i * 104_729 + 5) % vocab) as u32).collect()
}

fn greedy_request(p: Vec<u32>, n: usize) -> EngineRequest {
    EngineRequest::new(p, n, Vec::new(), SamplerConfig::greedy().resolve(false))
}

fn alone(m: &Model, p: &[u32], n: usize) -> Vec<u32> {
    let mut toks = Vec::new();
    Session::new(m)
        .generate(m, p, n, &[], &mut Sampler::new(SamplerConfig::greedy().resolve(false)), &mut |t| {
            toks.push(t);
            true
        })
        .unwrap();
    toks
}

/// Steps until nothing is left; every request's outputs in order.
fn drain(e: &mut Engine, n: usize) -> Vec<Vec<Output>> {
    let mut outs: Vec<Vec<Output>> = (0..n).map(|_| Vec::new()).collect();
    let mut steps = 0;
    while e.has_work() {
        for (id, o) in e.step() {
            outs[id as usize - 1].push(o);
        }
        steps += 1;
        assert!(steps < 10_000, "the engine never drains");
    }
    outs
}

fn tokens(outs: &[Output]) -> Vec<u32> {
    outs.iter().filter_map(|o| if let Output::Token { id, .. } = o { Some(*id) } else { None }).collect()
}

#[test]
fn queued_requests_get_their_tokens_alone_and_a_next_turn_reuses_its_slot() {
    let m = model();
    let v = m.n_vocab();
    let reqs: Vec<(Vec<u32>, usize)> = vec![(prompt(0, 9, v), 7), (prompt(1, 30, v), 5), (prompt(2, 3, v), 9), (prompt(3, 14, v), 4)];
    let want: Vec<Vec<u32>> = reqs.iter().map(|(p, n)| alone(&m, p, *n)).collect();
    let mut e = Engine::new(m, EngineOptions { parallel: 2, draft: None, prefix: None });
    for (p, n) in &reqs {
        e.submit(greedy_request(p.clone(), *n));
    }
    assert_eq!(e.queued(), 4);
    let outs = drain(&mut e, reqs.len());
    for (s, o) in outs.iter().enumerate() {
        assert!(matches!(o.first(), Some(Output::Started { cached: 0 })), "request {s} starts first: {:?}", o.first());
        assert_eq!(tokens(o), want[s], "request {s} differs from Session::generate");
        match o.last() {
            Some(Output::Done { stop: StopReason::Length, usage, .. }) => {
                assert_eq!((usage.prompt_tokens, usage.completion_tokens), (reqs[s].0.len(), reqs[s].1), "request {s}'s usage")
            }
            other => panic!("request {s} ends with {other:?}"),
        }
    }
    // the last conversation's next turn (its slot is still idle): its prompt and reply, then more
    let mut next = reqs[3].0.clone();
    next.extend(&want[3]);
    next.extend(prompt(9, 5, v));
    let id = e.submit(greedy_request(next.clone(), 6));
    let outs = drain(&mut e, id as usize);
    let turn = &outs[id as usize - 1];
    match turn.first() {
        Some(Output::Started { cached }) => assert!(*cached >= reqs[3].0.len(), "the next turn found {cached} tokens of its prefix"),
        other => panic!("the next turn starts with {other:?}"),
    }
    assert_eq!(tokens(turn), alone(e.model(), &next, 6), "the next turn differs from a fresh run of its transcript");
}

#[test]
fn a_one_shot_request_starts_empty_whatever_its_slot_held() {
    let m = Arc::new(model());
    let v = m.n_vocab();
    let one_shot = |p: Vec<u32>, n| EngineRequest { one_shot: true, ..greedy_request(p, n) };
    let first = prompt(5, 12, v);
    let mut e = Engine::new(m.clone(), EngineOptions { parallel: 1, draft: None, prefix: None });
    e.submit(greedy_request(first.clone(), 6));
    let reply = tokens(&drain(&mut e, 1)[0]);
    // the idle slot holds `first` and its reply: a one-shot prompt that extends them takes none
    // of it, and gets the tokens it gets on an engine that never ran anything
    let mut next = first;
    next.extend(&reply);
    next.extend(prompt(6, 4, v));
    let id = e.submit(one_shot(next.clone(), 5));
    let admitted = e.admit();
    assert!(matches!(admitted.as_slice(), [(i, Output::Started { cached: 0 })] if *i == id), "admitted alone, from nothing: {admitted:?}");
    assert_eq!((e.running(), e.queued()), (1, 0), "admitting runs nothing");
    let got = tokens(&drain(&mut e, id as usize)[id as usize - 1]);
    let mut fresh = Engine::new(m, EngineOptions { parallel: 1, draft: None, prefix: None });
    fresh.submit(one_shot(next, 5));
    assert_eq!(got, tokens(&drain(&mut fresh, 1)[0]), "a one-shot request's tokens depend on what its slot held");
}

#[test]
fn a_cancelled_request_ends_at_once_and_frees_its_slot() {
    let m = model();
    let v = m.n_vocab();
    let mut e = Engine::new(m, EngineOptions { parallel: 1, draft: None, prefix: None });
    let a = e.submit(greedy_request(prompt(0, 9, v), 50));
    let b = e.submit(greedy_request(prompt(1, 9, v), 3));
    let c = e.submit(greedy_request(prompt(2, 9, v), 3));
    let mut seen = 0;
    while seen < 2 {
        seen += e.step().iter().filter(|(id, o)| *id == a && matches!(o, Output::Token { .. })).count();
    }
    assert_eq!((e.running(), e.queued()), (1, 2));
    assert!(e.cancel(c).is_none(), "a queued request leaves the queue without output");
    match e.cancel(a) {
        Some(Output::Done { stop: StopReason::Caller, usage, .. }) => assert_eq!(usage.completion_tokens, seen),
        other => panic!("a running request's cancel is {other:?}"),
    }
    let outs = e.step();
    assert!(outs.iter().any(|(id, o)| *id == b && matches!(o, Output::Started { .. })), "the freed slot takes the next request");
    while e.has_work() {
        e.step();
    }
}

#[test]
fn the_engine_thread_delivers_what_the_engine_gives() {
    let m = model();
    let v = m.n_vocab();
    let p = prompt(4, 11, v);
    let want = alone(&m, &p, 6);
    let (handle, thread) = engine_thread::start(Engine::new(m, EngineOptions { parallel: 2, draft: None, prefix: None }), 4, None).unwrap();
    let (tx, rx) = mpsc::channel();
    handle.submit(greedy_request(p, 6), Box::new(tx), Arc::new(AtomicBool::new(false))).unwrap();
    let mut got = Vec::new();
    loop {
        let o = rx.recv().unwrap();
        let last = o.is_last();
        got.push(o);
        if last {
            break;
        }
    }
    assert_eq!(tokens(&got), want);
    assert!(matches!(got.last(), Some(Output::Done { stop: StopReason::Length, .. })));
    handle.shutdown();
    thread.join().unwrap();
}

/// What `xwen chat` asks of the engine: its own prompt chunks (`-ub`), one sampler across
/// turns, its own drafter kept with the slot, the prefill's progress and the turn's stats —
/// and the tokens a drafted `Session` gives with the same chunks, sampler and drafter, turn
/// after turn (sampled, so the drafts' verify draws what the session's draws).
#[test]
fn a_callers_chunks_sampler_and_drafter_give_a_sessions_tokens() {
    let m = model();
    let v = m.n_vocab();
    let params = SamplerConfig { temperature: Some(0.8), seed: Some(5), ..Default::default() }.resolve(false);
    let p1 = prompt(4, 30, v);
    let mut session = Session::new(&m);
    session.set_prefill_chunk(7);
    let mut sampler = Sampler::new(params.clone());
    let mut ngram = xwen_engine::NgramDrafter::default();
    let mut want1 = Vec::new();
    session
        .generate_drafted(&m, &p1, 12, &[], &mut sampler, &mut ngram, 4, &mut |_, _| true, &mut |t| {
            want1.push(t);
            true
        })
        .unwrap();
    let mut p2 = p1.clone();
    p2.extend_from_slice(&want1);
    p2.extend_from_slice(&prompt(5, 9, v));
    let mut want2 = Vec::new();
    session
        .generate_drafted(&m, &p2, 12, &[], &mut sampler, &mut ngram, 4, &mut |_, _| true, &mut |t| {
            want2.push(t);
            true
        })
        .unwrap();

    let mut e = Engine::new(model(), EngineOptions { parallel: 1, draft: None, prefix: None });
    let drafter: Box<dyn xwen_engine::Drafter> = Box::new(xwen_engine::NgramDrafter::default());
    let req = EngineRequest {
        prefill_chunk: 7,
        progress: true,
        draft: Some((drafter, 4)),
        sampler: Some(Sampler::new(params.clone())),
        ..EngineRequest::new(p1, 12, Vec::new(), params.clone())
    };
    let id1 = e.submit(req);
    let outs = drain(&mut e, 1).remove(0);
    assert_eq!(tokens(&outs), want1, "turn 1");
    let progress: Vec<(usize, usize)> = outs.iter().filter_map(|o| if let Output::Prefill { done, total } = o { Some((*done, *total)) } else { None }).collect();
    // the head in chunks of 7, cut where the checkpoint before the last token falls
    assert_eq!(progress, [(7, 30), (14, 30), (21, 30), (28, 30), (29, 30)]);
    match outs.last() {
        Some(Output::Done { stats, usage, .. }) => {
            let d = stats.drafts.as_ref().expect("it drafted");
            assert!(d.active && d.steps > 0 && d.steps <= usage.completion_tokens, "{d:?}");
            assert!(stats.prefill_secs > 0.0 && !stats.restored);
        }
        other => panic!("turn 1 ended with {other:?}"),
    }
    let sampler = e.take_sampler(id1).expect("the caller's sampler comes back");
    // turn 2 brings no drafter: the one that followed the slot drafts on
    let req = EngineRequest { prefill_chunk: 7, sampler: Some(sampler), ..EngineRequest::new(p2, 12, Vec::new(), params) };
    e.submit(req);
    let outs = drain(&mut e, 2).remove(1);
    assert_eq!(tokens(&outs), want2, "turn 2");
    assert!(matches!(outs.first(), Some(Output::Started { cached }) if *cached >= 30), "{:?}", outs.first());
    assert!(matches!(outs.last(), Some(Output::Done { stats, .. }) if stats.drafts.is_some()), "{:?}", outs.last());
}

/// Every step's report, kept where the test can read it after the engine took the observer.
struct Reports(Arc<std::sync::Mutex<Vec<xwen_engine::StepReport>>>);

impl xwen_engine::EngineObserver for Reports {
    fn step(&mut self, step: &xwen_engine::StepReport) {
        self.0.lock().unwrap().push(*step);
    }
}

#[test]
fn each_step_reports_its_rows_prompts_and_where_its_time_went() {
    let m = model();
    let v = m.n_vocab();
    // two prompts of 9 and 30 tokens (30 is one chunk: PREFILL_CHUNK is larger), 3 and 5 tokens
    let reqs = [(prompt(4, 9, v), 3), (prompt(5, 30, v), 5)];
    let mut e = Engine::new(m, EngineOptions { parallel: 2, draft: None, prefix: None });
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    e.set_observer(Box::new(Reports(Arc::clone(&seen))));
    for (p, n) in &reqs {
        e.submit(greedy_request(p.clone(), *n));
    }
    let outs = drain(&mut e, reqs.len());
    let seen = seen.lock().unwrap();
    let generated: usize = outs.iter().map(|o| tokens(o).len()).sum();
    assert_eq!(generated, 8);
    assert_eq!(seen.iter().map(|s| s.tokens).sum::<u64>(), 8, "every sampled token is counted once");
    // a session's prompt runs its head, then its last token alone (the checkpoint before it)
    assert_eq!(seen.iter().map(|s| s.shape.prompt_tokens).sum::<usize>(), 8 + 29 + 2, "{seen:?}");
    assert!(seen.iter().map(|s| s.shape.prompts).sum::<usize>() >= 2);
    assert!(seen.iter().map(|s| s.shape.checkpoint_secs).sum::<f64>() > 0.0, "each prompt's checkpoint is timed");
    for s in seen.iter() {
        assert!(s.shape.rows >= s.shape.prompt_tokens && s.shape.rows >= s.sequences.min(1), "{s:?}");
        assert!(s.shape.forward_secs + s.shape.checkpoint_secs + s.release_secs <= s.secs + 1e-9, "{s:?}");
    }
    // the steps that ran only decode rows: one row a sequence
    assert!(seen.iter().any(|s| s.shape.prompts == 0 && s.shape.rows == 2), "{seen:?}");
}
