//! A failed expert read fails only the sequences whose rows needed that expert: in a batched
//! decode step (`Model::forward_batch_each`) and through the engine (`Output::Failed`), the
//! step's other sequences get the bits they get without the fault, and go on. The fault is a
//! bad stretch of the file under one expert (`faults::fail_bytes`): every read of it fails, the
//! other experts read. One test in its own binary: the faults are process-wide.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use xwen_engine::experts::direct_read::faults;
use xwen_engine::{Engine, EngineConfig, EngineOptions, EngineRequest, LogitsMode, Model, Output, PrefixCache, SamplerConfig, SeqState, SeqStep};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond/qwen3_5_moe/model-q8_0.gguf")
}

fn cfg(budget: Option<u64>, routes: bool) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 512, ram_budget: budget, n_seq: 4, record_routes: routes, ..Default::default() }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The file bytes of expert `e`'s gate matrix in MoE layer `layer`.
fn gate_bytes(path: &Path, layer: usize, e: usize) -> std::ops::Range<u64> {
    let f = xwen_gguf::GgufFile::open(path).unwrap();
    let t = f.tensor(&format!("blk.{layer}.ffn_gate_exps.weight")).expect("a routed gate stack");
    let n_expert = *t.dims.last().unwrap();
    let per = t.n_bytes / n_expert;
    let start = f.data_offset() + t.offset + e as u64 * per;
    start..start + per
}

/// The (layer, experts) of every routed row at position `from` or later in what the mapped
/// model computed since the last call.
fn routes_from(m: &Model, from: usize) -> Vec<(usize, Vec<usize>)> {
    m.take_routes().into_iter().filter(|r| r.pos >= from).map(|r| (r.layer, r.experts)).collect()
}

fn greedy_request(prompt: Vec<u32>, n: usize) -> EngineRequest {
    EngineRequest::new(prompt, n, Vec::new(), SamplerConfig::greedy().resolve(false))
}

/// An engine of `slots` over `m` whose requests start from `states` (a prompt's prefilled
/// state, found by the prefix cache), so a streamed model's expert cache sees only their rows.
fn engine_from(m: &Arc<Model>, slots: usize, states: &[(&[u32], SeqState)]) -> Engine {
    let mut cache = PrefixCache::new(m, 1 << 40, None).unwrap();
    for (tokens, state) in states {
        cache.insert(tokens, state.clone());
    }
    Engine::new(m.clone(), EngineOptions { parallel: slots, draft: None, prefix: Some(cache) })
}

/// What the engine generates for `req` alone on `m`, from `start`'s state.
fn alone(m: &Arc<Model>, start: (&[u32], SeqState), req: EngineRequest) -> Vec<u32> {
    let mut e = engine_from(m, 1, &[start]);
    e.submit(req);
    let mut out = Vec::new();
    while e.has_work() {
        for (_, o) in e.step() {
            match o {
                Output::Started { cached } => assert!(cached > 0, "the request starts from its state"),
                Output::Token { id, .. } => out.push(id),
                Output::Failed(error) => panic!("{error}"),
                _ => {}
            }
        }
    }
    out
}

#[test]
fn a_failed_expert_read_fails_only_the_sequences_that_needed_it() {
    let path = fixture();
    let mapped = Arc::new(Model::load(&path, &cfg(None, true)).unwrap());
    let v = mapped.n_vocab() as u32;
    let pa: Vec<u32> = (0..9).map(|i| (i * 7919 + 13) % v).collect();
    let ta = 3 % v;
    let qa: Vec<u32> = pa.iter().chain([&ta]).copied().collect();
    // the prompts' states, from the mapped model (a state is the same bits whichever store
    // computed it), so the streamed models below start with empty expert caches
    let prefilled = |p: &[u32]| {
        let mut st = mapped.new_state();
        mapped.forward(&mut st, p, LogitsMode::Last).unwrap();
        st
    };
    // A's row for `ta`
    let mut sa = prefilled(&pa);
    mapped.take_routes();
    mapped.forward(&mut sa, &[ta], LogitsMode::Last).unwrap();
    let ra = routes_from(&mapped, pa.len());
    // a B whose rows from `tb` on, as the engine generates them, never need an expert A's row
    // needs (4 experts, 2 a row: a few tries)
    const B_TOKENS: usize = 3;
    let (pb, tb, want_tokens, layer, bad) = (0..64u32)
        .find_map(|seed| {
            let pb: Vec<u32> = (0..11).map(|i| (i * 104_729 + 5 + seed * 7_907) % v).collect();
            let tb = (7 + seed * 31) % v;
            let qb: Vec<u32> = pb.iter().chain([&tb]).copied().collect();
            let start = prefilled(&pb);
            mapped.take_routes();
            let toks = alone(&mapped, (&pb, start), greedy_request(qb, B_TOKENS));
            let rb = routes_from(&mapped, pb.len());
            let (l, e) = ra.iter().find_map(|(l, ea)| ea.iter().find(|e| !rb.iter().any(|(lb, eb)| lb == l && eb.contains(e))).map(|&e| (*l, e)))?;
            Some((pb, tb, toks, l, e))
        })
        .expect("a B whose rows route apart from A's row somewhere");
    assert_eq!(want_tokens.len(), B_TOKENS);
    let qb: Vec<u32> = pb.iter().chain([&tb]).copied().collect();
    let want_b = {
        let mut sb = prefilled(&pb);
        mapped.forward(&mut sb, &[tb], LogitsMode::Last).unwrap()
    };

    // streamed through a cache of one expert over the smallest; the bad stretch under the
    // expert's gate fails every read of it
    let plan = Model::load(&path, &cfg(Some(1 << 50), false)).unwrap().memory_plan().unwrap().clone();
    let streamed = || Arc::new(Model::load(&path, &cfg(Some(plan.floor() + plan.record_bytes), false)).unwrap());
    // decode rows (one-token order, the experts' union read at once) and 1-token prefill
    // chunks (grouped by expert, read in batches) alike
    for decode_order in [true, false] {
        let m = streamed();
        assert!(m.streams_experts());
        faults::fail_bytes(gate_bytes(&path, layer, bad));
        let got = {
            let (mut sa, mut sb) = (prefilled(&pa), prefilled(&pb));
            let (a, b) = ([ta], [tb]);
            let step = |state, tokens| SeqStep { state, tokens, logits: LogitsMode::Last, decode_order, hidden: false, banned: &[] };
            let mut steps = [step(&mut sa, &a[..]), step(&mut sb, &b[..])];
            m.forward_batch_each(&mut steps).unwrap()
        };
        let mut it = got.into_iter();
        let (a, b) = (it.next().unwrap(), it.next().unwrap());
        match a {
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(&format!("expert {bad} of layer {layer}")), "decode order {decode_order}: {msg}");
            }
            Ok(_) => panic!("decode order {decode_order}: A's row needed expert {bad} of layer {layer}, which cannot be read"),
        }
        let b = b.unwrap_or_else(|e| panic!("decode order {decode_order}: B never needed the bad expert: {e}"));
        assert_eq!(bits(&b.logits), bits(&want_b), "decode order {decode_order}: B's row changed with A's fault");
    }
    // forward_batch_out (all or nothing) fails the batch
    {
        let m = streamed();
        let (mut sa, mut sb) = (prefilled(&pa), prefilled(&pb));
        let (a, b) = ([ta], [tb]);
        let mut steps = [SeqStep::new(&mut sa, &a, LogitsMode::Last), SeqStep::new(&mut sb, &b, LogitsMode::Last)];
        assert!(m.forward_batch_out(&mut steps).is_err());
    }

    // through the engine: A fails with the error, B generates what it generates alone
    let m = streamed();
    let mut e = engine_from(&m, 2, &[(&pa, prefilled(&pa)), (&pb, prefilled(&pb))]);
    let ida = e.submit(greedy_request(qa.clone(), B_TOKENS));
    let idb = e.submit(greedy_request(qb.clone(), B_TOKENS));
    let (mut failed, mut toks_b, mut done_b) = (None, Vec::new(), false);
    for _ in 0..100 {
        if !e.has_work() {
            break;
        }
        for (id, o) in e.step() {
            match o {
                Output::Started { cached } => assert!(cached > 0, "request {id} starts from its state"),
                Output::Failed(error) if id == ida => failed = Some(error),
                Output::Token { id: token, .. } if id == idb => toks_b.push(token),
                Output::Done { .. } if id == idb => done_b = true,
                other => panic!("unexpected {other:?} for request {id}"),
            }
        }
    }
    faults::clear();
    let failed = failed.expect("A's request failed");
    assert!(failed.contains(&format!("expert {bad} of layer {layer}")), "{failed}");
    assert!(done_b && !e.has_work(), "B finished, A left");
    assert_eq!(toks_b, want_tokens, "B's tokens differ from B alone");
}
