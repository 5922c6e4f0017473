//! Speculative decoding's gate: greedy output with a drafter is token for token plain greedy
//! output — n-gram and a draft model, dense and MoE, mapped and with experts streamed — and
//! drafts are accepted where they should be (a repetitive prompt for n-gram, the target itself
//! as its own draft model).

use std::path::{Path, PathBuf};
use xwen_engine::{generate, generate_speculative, Drafter, EngineConfig, GenerateRequest, Model, ModelDrafter, MtpDrafter, NgramDrafter, Sampler, SamplerConfig};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity").join(rel)
}

fn cfg(budget: Option<u64>) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 512, ram_budget: budget, ..Default::default() }
}

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig::greedy().resolve(false))
}

fn plain(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let req = GenerateRequest { prompt, max_tokens: Some(n), stop_ids: &[], prefill_chunk: 0 };
    generate(m, &mut m.new_state(), &req, &mut greedy(), &mut |t| {
        out.push(t);
        true
    })
    .unwrap();
    out
}

fn drafted(m: &Model, prompt: &[u32], n: usize, d: &mut dyn Drafter, k: usize, stop: &[u32]) -> (Vec<u32>, xwen_engine::SpecStats) {
    let mut out = Vec::new();
    let req = GenerateRequest { prompt, max_tokens: Some(n), stop_ids: stop, prefill_chunk: 0 };
    let (_, s) = generate_speculative(m, &mut m.new_state(), &req, d, k, &mut greedy(), &mut |_, _| true, &mut |t| {
        out.push(t);
        true
    })
    .unwrap();
    (out, s)
}

/// A prompt that repeats itself, so prompt lookup has something to find.
fn repetitive(v: u32) -> Vec<u32> {
    let motif: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % v).collect();
    motif.iter().chain(&motif).chain(&motif[..5]).copied().collect()
}

fn check(m: &Model, what: &str) {
    let v = m.n_vocab() as u32;
    for prompt in [repetitive(v), (0..14).map(|i| (i * 7919 + 11) % v).collect::<Vec<_>>()] {
        let want = plain(m, &prompt, 40);
        for k in [1, 3, 8] {
            let (got, s) = drafted(m, &prompt, 40, &mut NgramDrafter::default(), k, &[]);
            assert_eq!(got, want, "{what}: ngram k={k} differs from plain greedy");
            assert!(s.active && s.steps > 0 && s.accepted() <= s.drafted(), "{what}: {s:?}");
        }
        // a stop id inside an accepted run ends there, as plain decoding does
        let stop = [want[17]];
        let (got, _) = drafted(m, &prompt, 40, &mut NgramDrafter::default(), 4, &stop);
        let cut = want.iter().position(|t| *t == want[17]).unwrap() + 1;
        assert_eq!(got, want[..cut], "{what}: stop id");
    }
}

#[test]
fn ngram_drafts_give_plain_greedy_output() {
    check(&Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap(), "dense q8_0");
    check(&Model::load(&fixture("cond/qwen3_5/model-q4_k_m.gguf"), &cfg(None)).unwrap(), "dense q4_k_m");
    let moe = fixture("cond/qwen3_5_moe/model-q8_0.gguf");
    check(&Model::load(&moe, &cfg(None)).unwrap(), "moe q8_0");
    let plan = Model::load(&moe, &cfg(Some(1 << 50))).unwrap().memory_plan().unwrap().clone();
    check(&Model::load(&moe, &cfg(Some(plan.floor() + plan.record_bytes))).unwrap(), "moe q8_0 streamed");
    check(&Model::load(&fixture("cond/qwen3_next/model-q4_k_m.gguf"), &cfg(None)).unwrap(), "qwen3next q4_k_m");
    check(&Model::load(&fixture("cond/kimi_linear/model-q8_0.gguf"), &cfg(None)).unwrap(), "kimi-linear q8_0");
    check(&Model::load(&fixture("cond/kimi_k3/model-q4_k_m.gguf"), &cfg(None)).unwrap(), "kimi-k3 q4_k_m");
    check(&Model::load(&fixture("cond/qwen4exp/model-q4_k_m.gguf"), &cfg(None)).unwrap(), "qwen4exp q4_k_m");
}

/// qwen4exp's head (tests/fixtures/mtp/cond-qwen4exp: a sidecar beside the committed trunk)
/// drafts from the trunk's hc-wide residual; 72 greedy tokens each way, mapped and with the
/// experts and PLE rows streamed. The head is random, so few drafts agree: the gate is equality.
#[test]
fn qwen4exp_mtp_drafts_give_plain_greedy_output() {
    let trunk = fixture("cond/qwen4exp/model-q8_0.gguf");
    let sidecar = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mtp/cond-qwen4exp/mtp-q8_0.gguf");
    for budget in [None, Some(200u64 << 20)] {
        let m = Model::load(&trunk, &EngineConfig { mtp_sidecar: Some(sidecar.clone()), ..cfg(budget) }).unwrap();
        assert!(m.has_mtp());
        let v = m.n_vocab() as u32;
        for prompt in [repetitive(v), (0..14).map(|i| (i * 7919 + 11) % v).collect::<Vec<_>>()] {
            let want = plain(&m, &prompt, 72);
            for k in [1, 3, 8] {
                let (got, s) = drafted(&m, &prompt, 72, &mut MtpDrafter::new(), k, &[]);
                assert_eq!(got, want, "qwen4exp mtp k={k} (budget {budget:?}) differs from plain greedy");
                assert!(s.active && s.drafted() > 0 && s.accepted() <= s.drafted(), "qwen4exp mtp k={k}: {s:?}");
                eprintln!("qwen4exp mtp k={k} budget {budget:?}: accepted {} of {} drafted", s.accepted(), s.drafted());
            }
        }
    }
}

#[test]
fn mtp_drafts_give_plain_greedy_output() {
    // the random qwen35 fixture carries a nextn block (its head is random: few drafts agree)
    let m = Model::load(&fixture("rand/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap();
    assert!(m.has_mtp());
    let v = m.n_vocab() as u32;
    for prompt in [repetitive(v), (0..14).map(|i| (i * 7919 + 11) % v).collect::<Vec<_>>()] {
        let want = plain(&m, &prompt, 40);
        for k in [1, 3, 8] {
            let (got, s) = drafted(&m, &prompt, 40, &mut MtpDrafter::new(), k, &[]);
            assert_eq!(got, want, "mtp k={k} differs from plain greedy");
            assert!(s.active && s.drafted() > 0 && s.accepted() <= s.drafted(), "mtp k={k}: {s:?}");
        }
        // chunked prefill: the head sees every chunk's rows
        let mut out = Vec::new();
        let req = GenerateRequest { prompt: &prompt, max_tokens: Some(40), stop_ids: &[], prefill_chunk: 5 };
        generate_speculative(&m, &mut m.new_state(), &req, &mut MtpDrafter::new(), 3, &mut greedy(), &mut |_, _| true, &mut |t| {
            out.push(t);
            true
        })
        .unwrap();
        assert_eq!(out, want, "mtp after a chunked prefill");
    }
    // the MoE head of a sidecar, over mapped and streamed trunk experts
    let moe = fixture("cond/qwen3_5_moe/model-q8_0.gguf");
    let sidecar = fixture("../mtp/cond-qwen35moe/mtp-q8_0.gguf");
    for budget in [None, Some(200 << 20)] {
        // under a budget the sidecar comes with the load, so the plan counts it
        let m = Model::load(&moe, &EngineConfig { mtp_sidecar: Some(sidecar.clone()), ..cfg(budget) }).unwrap();
        if budget.is_some() {
            let p = m.memory_plan().unwrap();
            let side = xwen_gguf::GgufFile::open(&sidecar).unwrap().tensor_bytes();
            assert!(p.draft_bytes > side, "the plan counts the sidecar's weights and the head's KV: {p:?}");
        }
        let prompt: Vec<u32> = (0..12).map(|i| (i * 131 + 3) % m.n_vocab() as u32).collect();
        let want = plain(&m, &prompt, 32);
        let (got, s) = drafted(&m, &prompt, 32, &mut MtpDrafter::new(), 4, &[]);
        assert_eq!(got, want, "moe mtp (budget {budget:?}) differs from plain greedy");
        assert!(s.drafted() > 0, "{s:?}");
    }
    // a model without a head: drafting with it is refused, not silently plain
    let dense = Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap();
    assert!(!dense.has_mtp());
    let req = GenerateRequest { prompt: &[1, 2, 3], max_tokens: Some(4), stop_ids: &[], prefill_chunk: 0 };
    let r = generate_speculative(&dense, &mut dense.new_state(), &req, &mut MtpDrafter::new(), 3, &mut greedy(), &mut |_, _| true, &mut |_| true);
    assert!(r.is_err(), "MTP drafting on a model without a head must be an error");
}

/// The trained heads (tools/oracle/mtp_train.py, llama.cpp's converter) on the trained tiny
/// models of ../shared: plain greedy output, and most drafts accepted.
#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn trained_mtp_heads_give_plain_greedy_output_and_are_mostly_accepted() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/gguf");
    for (trunk, head, least) in [("tiny-qwen35-q8_0.gguf", "mtp-tiny-qwen35-q8_0.gguf", 0.5), ("tiny-qwen35moe-q8_0.gguf", "mtp-tiny-qwen35moe-q8_0.gguf", 0.6)] {
        let path = shared.join(trunk);
        let mut m = Model::load(&path, &cfg(None)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        m.attach_mtp(&fixture("../mtp/trained").join(head)).unwrap();
        // "def fibonacci(n):\n    if n < 2:" in the trained models' tokenizer
        let prompt: Vec<u32> = vec![537, 288, 2680, 272, 729, 668, 1113, 286, 258, 353, 326, 718, 220, 17, 25];
        let want = plain(&m, &prompt, 96);
        let mut d = MtpDrafter::new();
        let (got, s) = drafted(&m, &prompt, 96, &mut d, 3, &[]);
        assert_eq!(got, want, "{head}: differs from plain greedy");
        assert!(s.acceptance() >= least, "{head}: acceptance {:.2} ({s:?})", s.acceptance());
    }
}

#[test]
fn a_draft_model_gives_plain_greedy_output() {
    let target = Model::load(&fixture("cond/qwen3_5_moe/model-q8_0.gguf"), &cfg(None)).unwrap();
    let v = target.n_vocab() as u32;
    let prompt: Vec<u32> = (0..11).map(|i| (i * 131 + 3) % v).collect();
    let want = plain(&target, &prompt, 48);
    // the dense fixture (same tokenizer) drafting for the MoE one
    let draft = Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap();
    let mut d = ModelDrafter::new(draft, 4);
    let (got, s) = drafted(&target, &prompt, 48, &mut d, 4, &[]);
    assert_eq!(got, want, "dense drafting for MoE differs from plain greedy ({s:?})");
    // the target as its own draft: every draft it is confident of is accepted
    let mut own = ModelDrafter::new(Model::load(&fixture("cond/qwen3_5_moe/model-q8_0.gguf"), &cfg(None)).unwrap(), 4);
    own.p_min = 0.0;
    let (got, s) = drafted(&target, &prompt, 48, &mut own, 4, &[]);
    assert_eq!(got, want);
    assert_eq!(s.accepted(), s.drafted(), "a model drafting for itself is always right: {s:?}");
    // every step accepts its drafts: at least two tokens a step but the cost model's two probe
    // steps (it may cap the depth at 1 where a deeper verify costs more than it saves here)
    assert!(s.steps <= 48 / 2 + 2, "{s:?}");
}

/// With temperature > 0 drafts are kept by rejection sampling (the distribution test is the
/// sampler's unit test): drafting runs, accepts some drafts, a seed repeats, and the first token
/// (drawn from the prefill, before any draft) is plain sampling's.
#[test]
fn sampling_drafts_by_rejection() {
    let m = Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap();
    let prompt = repetitive(m.n_vocab() as u32);
    let sampled = |spec: bool| {
        let mut s = Sampler::new(SamplerConfig { temperature: Some(0.8), seed: Some(5), ..Default::default() }.resolve(false));
        let mut out = Vec::new();
        let req = GenerateRequest { prompt: &prompt, max_tokens: Some(40), stop_ids: &[], prefill_chunk: 0 };
        let mut own = ModelDrafter::new(Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap(), 4);
        own.p_min = 0.0;
        let st = if spec {
            let (_, st) = generate_speculative(&m, &mut m.new_state(), &req, &mut own, 4, &mut s, &mut |_, _| true, &mut |t| {
                out.push(t);
                true
            })
            .unwrap();
            Some(st)
        } else {
            generate(&m, &mut m.new_state(), &req, &mut s, &mut |t| {
                out.push(t);
                true
            })
            .unwrap();
            None
        };
        (out, st)
    };
    let (plain, _) = sampled(false);
    let (a, st) = sampled(true);
    let (b, _) = sampled(true);
    let st = st.unwrap();
    assert_eq!(a, b, "a seed repeats a drafted sampled run");
    assert_eq!(a.len(), 40);
    assert_eq!(a[0], plain[0]);
    assert!(st.active && st.accepted() > 0 && st.accepted() <= st.drafted(), "{st:?}");
}

/// A drafter that is always wrong.
struct Contrary;

impl Drafter for Contrary {
    fn name(&self) -> &'static str {
        "contrary"
    }
    fn propose(&mut self, ctx: &[u32], max: usize) -> xwen_engine::Result<Vec<u32>> {
        // tokens the greedy continuation of these fixtures does not take: the last token's
        // neighbours, changing each step
        Ok((0..max).map(|i| (ctx[ctx.len() - 1] + 1 + i as u32) % 7 + 500).collect())
    }
}

/// A drafter that never agrees still gives plain output, and the controller pauses it: most
/// steps run without drafts, so it costs next to nothing over plain decoding.
#[test]
fn a_drafter_that_never_agrees_is_paused() {
    let m = Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap();
    let prompt: Vec<u32> = (0..14).map(|i| (i * 7919 + 11) % m.n_vocab() as u32).collect();
    let want = plain(&m, &prompt, 120);
    let (got, s) = drafted(&m, &prompt, 120, &mut Contrary, 8, &[]);
    assert_eq!(got, want);
    let drafted_steps_at_most = s.drafted(); // each drafted step drafts ≥ 1
    assert!(s.accepted() * 10 <= s.drafted().max(1), "{s:?}");
    assert!(drafted_steps_at_most < 40, "the controller did not pause a drafter that never agrees: {s:?}");
    // a cheap drafter that has never agreed: two verifies (8 drafts, then 1), then paused and
    // watched by shadow proposals, never verified again
    assert_eq!((s.tally.verify_steps, s.drafted()), (2, 9), "{s:?}");
}

/// Wrong for its first `wrong` proposals' contexts, then the target's own continuation.
struct RightLater {
    continuation: Vec<u32>,
    prompt_len: usize,
    wrong: usize,
}

impl Drafter for RightLater {
    fn name(&self) -> &'static str {
        "right-later"
    }
    fn propose(&mut self, ctx: &[u32], max: usize) -> xwen_engine::Result<Vec<u32>> {
        // ctx ends with the pending token: generated[..g] with g = ctx.len() − prompt_len
        let g = ctx.len() - self.prompt_len;
        if g < self.wrong {
            return Contrary.propose(ctx, max);
        }
        Ok(self.continuation[g.min(self.continuation.len())..(g + max).min(self.continuation.len())].to_vec())
    }
}

/// A paused cheap drafter that starts agreeing drafts again within a few steps (its shadow
/// proposals end the pause), alone and on the engine's slots, the tokens plain greedy's.
#[test]
fn a_paused_cheap_drafter_resumes_once_it_agrees() {
    use xwen_engine::{Engine, EngineOptions, EngineRequest, Output, SpecStats};
    let m = std::sync::Arc::new(Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap());
    let prompt: Vec<u32> = (0..14).map(|i| (i * 7919 + 11) % m.n_vocab() as u32).collect();
    let n = 120;
    let want = plain(&m, &prompt, n);
    let drafter = || RightLater { continuation: want.clone(), prompt_len: prompt.len(), wrong: 40 };
    // the argmax without being greedy (top-k 1): depths by acceptance alone, not by this
    // machine's step timings (on the CPU a verify's cost pauses drafting for cost)
    let argmax = || SamplerConfig { temperature: Some(1.0), top_k: Some(1), top_p: Some(1.0), min_p: Some(0.0), seed: Some(5), ..Default::default() }.resolve(false);
    let check = |s: &SpecStats, what: &str| {
        // probed by verifies, the pauses after the first two verifies (24 steps, then 48)
        // would end near token 76; the shadow proposals end them a few steps after the
        // drafter starts agreeing (token 40), so most of the remaining 80 tokens come from
        // accepted drafts (~60 accepted in ~59 steps; ~32 in ~86 without shadows)
        assert!(s.accepted() >= 50, "{what}: {s:?}");
        assert!(s.steps < 70, "{what}: {s:?}");
    };
    let mut got = Vec::new();
    let req = GenerateRequest { prompt: &prompt, max_tokens: Some(n), stop_ids: &[], prefill_chunk: 0 };
    let (_, s) = generate_speculative(&m, &mut m.new_state(), &req, &mut drafter(), 4, &mut Sampler::new(argmax()), &mut |_, _| true, &mut |t| {
        got.push(t);
        true
    })
    .unwrap();
    assert_eq!(got, want);
    check(&s, "alone");
    let mut e = Engine::new(m.clone(), EngineOptions { parallel: 1, draft: None, prefix: None });
    let id = e.submit(EngineRequest { draft: Some((Box::new(drafter()), 4)), ..EngineRequest::new(prompt.clone(), n, vec![], argmax()) });
    let (mut out, mut stats) = (Vec::new(), None);
    while e.has_work() {
        for (i, o) in e.step() {
            match o {
                Output::Token { id: token, .. } if i == id => out.push(token),
                Output::Done { stats: st, .. } if i == id => stats = st.drafts,
                _ => {}
            }
        }
    }
    assert_eq!(out, want);
    check(&stats.expect("it drafted"), "on the engine");
}

/// The engine with drafting sequences (a server's slots): each sequence's tokens are the ones
/// it gets without drafts, whatever else shares the steps — drafted and plain sequences mixed,
/// joining at different steps, greedy and sampled.
/// Runs `prompts` through one engine, each joining a step after the one before; those
/// `drafted` draft with `make()`. Returns each one's tokens and the most one took in a step.
fn scheduled(m: &std::sync::Arc<Model>, prompts: &[Vec<u32>], drafted: &[bool], make: &dyn Fn() -> Box<dyn Drafter>) -> (Vec<Vec<u32>>, usize) {
    use xwen_engine::{Engine, EngineOptions, EngineRequest, Output};
    let sampling = |i: usize| {
        let t = if i == 3 { Some(0.8) } else { Some(0.0) };
        SamplerConfig { temperature: t, seed: Some(11), ..Default::default() }.resolve(false)
    };
    let mut e = Engine::new(m.clone(), EngineOptions { parallel: 8, draft: None, prefix: None });
    let mut ids = vec![0u64; prompts.len()];
    let mut out = vec![Vec::new(); prompts.len()];
    let mut step = 0;
    let mut most_per_step = 0;
    loop {
        for (i, p) in prompts.iter().enumerate() {
            if i == step {
                let draft = drafted[i].then(|| (make(), 4));
                ids[i] = e.submit(EngineRequest { one_shot: true, draft, ..EngineRequest::new(p.clone(), 30, vec![], sampling(i)) });
            }
        }
        if !e.has_work() && step >= prompts.len() {
            return (out, most_per_step);
        }
        let mut per = vec![0usize; prompts.len()];
        for (id, o) in e.step() {
            if let Output::Token { id: token, .. } = o {
                let i = ids.iter().position(|&x| x == id).unwrap();
                out[i].push(token);
                per[i] += 1;
            }
        }
        most_per_step = most_per_step.max(per.into_iter().max().unwrap_or(0));
        step += 1;
        assert!(step < 1000);
    }
}

#[test]
fn scheduled_drafting_gives_the_undrafted_tokens() {
    let m = std::sync::Arc::new(Model::load(&fixture("cond/qwen3_5_moe/model-q8_0.gguf"), &cfg(None)).unwrap());
    let v = m.n_vocab() as u32;
    let prompts: Vec<Vec<u32>> = vec![repetitive(v), (0..14).map(|i| (i * 7919 + 11) % v).collect(), repetitive(v)[3..].to_vec(), vec![5, 6, 7]];
    let ngram = || Box::new(NgramDrafter::default()) as Box<dyn Drafter>;
    let (plain_out, plain_most) = scheduled(&m, &prompts, &[false; 4], &ngram);
    let (mixed, _) = scheduled(&m, &prompts, &[true, false, true, false], &ngram);
    let (all, all_most) = scheduled(&m, &prompts, &[true; 4], &ngram);
    assert_eq!(plain_most, 1);
    assert!(all_most > 1, "no step accepted a draft");
    // greedy sequences: identical; the sampled one only where it is not drafted
    for i in 0..3 {
        assert_eq!(mixed[i], plain_out[i], "sequence {i} mixed");
        assert_eq!(all[i], plain_out[i], "sequence {i} all drafted");
    }
    assert_eq!(mixed[3], plain_out[3]);
    assert_eq!(all[3].len(), 30);
    assert_eq!(plain_out.iter().map(Vec::len).collect::<Vec<_>>(), vec![30; 4]);
}

#[test]
fn scheduled_mtp_drafting_gives_the_undrafted_tokens() {
    // the MTP head reads the hidden rows of every prefill chunk and kept verify row of its own
    // sequence, whatever shares the step
    let m = std::sync::Arc::new(Model::load(&fixture("rand/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap());
    let v = m.n_vocab() as u32;
    let prompts: Vec<Vec<u32>> = vec![repetitive(v), (0..14).map(|i| (i * 7919 + 11) % v).collect(), (0..300).map(|i| (i * 31 + 7) % v).collect(), vec![5, 6, 7]];
    let mtp = || Box::new(MtpDrafter::new()) as Box<dyn Drafter>;
    let (plain_out, _) = scheduled(&m, &prompts, &[false; 4], &mtp);
    let (mixed, _) = scheduled(&m, &prompts, &[true, false, true, false], &mtp);
    let (all, _) = scheduled(&m, &prompts, &[true; 4], &mtp);
    for i in 0..3 {
        assert_eq!(mixed[i], plain_out[i], "sequence {i} mixed");
        assert_eq!(all[i], plain_out[i], "sequence {i} all drafted");
    }
    assert_eq!(all[3].len(), 30);
}

/// A server's slots draft together: `ModelDrafter::propose_many` batches their catch-up spans
/// and draft steps, and every drafter proposes exactly what it proposes alone — contexts that
/// grow, part (a rejected draft: rollback) and jump (a new conversation), mixed depths, a
/// drafter with nothing to do — mapped and on a budgeted draft model whose RAM plan holds
/// fewer sequences than the group (batched in parts).
#[test]
fn drafters_batched_across_sequences_propose_what_each_proposes_alone() {
    let budgeted = |p: &str| {
        let c = EngineConfig { n_seq: 2, ..cfg(Some(1 << 50)) };
        Model::load(&fixture(p), &c).unwrap()
    };
    for (what, draft) in [
        ("dense", Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap()),
        ("moe, a plan of 2 sequences", budgeted("cond/qwen3_5_moe/model-q8_0.gguf")),
    ] {
        let draft = std::sync::Arc::new(draft);
        let v = draft.n_vocab() as u32;
        let n = 5;
        let mk = || {
            let mut d = ModelDrafter::new(draft.clone(), 4);
            d.p_min = 0.0;
            d
        };
        let mut together: Vec<ModelDrafter> = (0..n).map(|_| mk()).collect();
        let mut alone: Vec<ModelDrafter> = (0..n).map(|_| mk()).collect();
        let mut ctxs: Vec<Vec<u32>> = (0..n).map(|s| (0..3 + 4 * s as u32).map(|i| (i * 97 + 13 * s as u32 + 5) % v).collect()).collect();
        for round in 0..7 {
            let maxes: Vec<usize> = (0..n).map(|s| if s == 2 && round == 1 { 0 } else { 1 + (s + round) % 4 }).collect();
            let jobs: Vec<(&[u32], usize)> = ctxs.iter().zip(&maxes).map(|(c, &m)| (&c[..], m)).collect();
            let mut refs: Vec<&mut ModelDrafter> = together.iter_mut().collect();
            let got = ModelDrafter::propose_many(&mut refs, &jobs).unwrap();
            for s in 0..n {
                let want = alone[s].propose(&ctxs[s], maxes[s]).unwrap();
                assert_eq!(got[s], want, "{what}: round {round}, sequence {s}");
                assert!(got[s].len() <= maxes[s]);
            }
            // next contexts: accept some drafts and a fresh token; one rejects everything and
            // goes back two tokens; one starts a new conversation
            for (s, c) in ctxs.iter_mut().enumerate() {
                match (s + round) % 3 {
                    0 => c.extend_from_slice(&got[s][..got[s].len() / 2]),
                    1 => {
                        let keep = c.len().saturating_sub(2).max(1);
                        c.truncate(keep);
                    }
                    _ if s == 4 && round == 3 => *c = vec![(round as u32 * 31 + 7) % v, 11 % v],
                    _ => c.extend_from_slice(&got[s]),
                }
                c.push((c.len() as u32 * 53 + s as u32) % v);
            }
        }
    }
}

/// A draft model that did not follow a long stretch of the context (its controller paused it)
/// starts over on the last 64 tokens instead of being fed the stretch: it then proposes what a
/// fresh drafter given only those tokens proposes, alone and batched. A prompt is fed whole.
#[test]
fn a_draft_model_resuming_after_a_long_gap_catches_up_on_the_last_tokens() {
    let draft = std::sync::Arc::new(Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap());
    let v = draft.n_vocab() as u32;
    let mk = || {
        let mut d = ModelDrafter::new(draft.clone(), 4);
        d.p_min = 0.0;
        d
    };
    let window = |c: &[u32]| mk().propose(&c[c.len() - 65..], 4).unwrap();
    // a prompt of 100 tokens and 150 more the drafter did not follow, on which a drafter fed
    // everything proposes otherwise than one fed the last 64 (random weights: find one)
    let (prompt, mut ctx) = (0..40u32)
        .map(|seed| {
            let prompt: Vec<u32> = (0..100).map(|i| (i * 131 + 7 + seed * 977) % v).collect();
            let mut ctx = prompt.clone();
            ctx.extend((0..150).map(|i| (i * 211 + 3 + seed * 59) % v));
            (prompt, ctx)
        })
        .find(|(_, ctx)| mk().propose(ctx, 4).unwrap() != window(ctx))
        .expect("a context whose drafts depend on more than the last 64 tokens");
    // the prompt is fed whole, then the stretch is skipped: it proposes what the window gives
    let (mut resumed, mut batched) = (mk(), mk());
    let first = resumed.propose(&prompt, 4).unwrap();
    assert_eq!(ModelDrafter::propose_many(&mut [&mut batched], &[(&prompt, 4)]).unwrap()[0], first);
    let got = resumed.propose(&ctx, 4).unwrap();
    assert_eq!(got, window(&ctx));
    assert_ne!(got, mk().propose(&ctx, 4).unwrap());
    assert_eq!(ModelDrafter::propose_many(&mut [&mut batched], &[(&ctx, 4)]).unwrap()[0], got);
    // and follows on from there: accept two drafts, a fresh token, propose again
    ctx.extend_from_slice(&got[..2]);
    ctx.push(17 % v);
    let next = resumed.propose(&ctx, 4).unwrap();
    assert_eq!(ModelDrafter::propose_many(&mut [&mut batched], &[(&ctx, 4)]).unwrap()[0], next);
    let mut fresh_window = mk();
    let base = ctx.len() - 4 - 64; // where the resumed drafter started over
    fresh_window.propose(&ctx[base..ctx.len() - 3], 4).unwrap();
    assert_eq!(fresh_window.propose(&ctx[base..], 4).unwrap(), next);
}

/// `Contrary`, counting its proposals.
struct CountingContrary(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drafter for CountingContrary {
    fn name(&self) -> &'static str {
        "counting-contrary"
    }
    fn propose(&mut self, ctx: &[u32], max: usize) -> xwen_engine::Result<Vec<u32>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Contrary.propose(ctx, max)
    }
}

/// What a slot's drafting controller learned follows its drafter to the slot's next request
/// (the engine keeps both with the slot; a request that brings no drafter drafts on with
/// them): a drafter that never agreed on the first request stays paused on the second, where
/// a fresh controller drafts again from the start. The tokens are plain greedy's either way.
#[test]
fn a_controller_follows_its_drafter_to_the_next_request() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use xwen_engine::{Engine, EngineOptions, EngineRequest, Output, SpecStats};
    let m = Arc::new(Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &cfg(None)).unwrap());
    let v = m.n_vocab() as u32;
    let first: Vec<u32> = (0..14).map(|i| (i * 7919 + 11) % v).collect();
    let second: Vec<u32> = (0..9).map(|i| (i * 104729 + 3) % v).collect();
    // one slot: every request takes it, with the drafter that followed it
    let mut e = Engine::new(m.clone(), EngineOptions { parallel: 1, draft: None, prefix: None });
    let mut run = |req: EngineRequest| -> (Vec<u32>, Option<SpecStats>) {
        let id = e.submit(req);
        let (mut out, mut drafts) = (Vec::new(), None);
        while e.has_work() {
            for (i, o) in e.step() {
                match o {
                    Output::Token { id: token, .. } if i == id => out.push(token),
                    Output::Done { stats, .. } if i == id => drafts = stats.drafts,
                    _ => {}
                }
            }
        }
        (out, drafts)
    };
    let greedy_request = |p: &[u32], n| EngineRequest::new(p.to_vec(), n, vec![], SamplerConfig::greedy().resolve(false));
    let count = Arc::new(AtomicUsize::new(0));
    let (out, drafts) = run(EngineRequest { draft: Some((Box::new(CountingContrary(count.clone())), 8)), ..greedy_request(&first, 60) });
    assert_eq!(out, plain(&m, &first, 60));
    assert!(drafts.is_some(), "the first request drafted");
    // the second request, with the first's drafter and what its controller learned, then with
    // a fresh drafter
    let second_plain = plain(&m, &second, 20);
    count.store(0, Ordering::Relaxed);
    let (out, drafts) = run(greedy_request(&second, 20));
    assert_eq!(out, second_plain);
    assert!(drafts.is_some(), "the slot's drafter drafts the next request");
    let with_memory = count.load(Ordering::Relaxed);
    count.store(0, Ordering::Relaxed);
    let (out, _) = run(EngineRequest { draft: Some((Box::new(CountingContrary(count.clone())), 8)), ..greedy_request(&second, 20) });
    assert_eq!(out, second_plain);
    let fresh = count.load(Ordering::Relaxed);
    assert!(fresh >= 2 && with_memory < fresh, "proposals on the second request: {with_memory} with the first's memory, {fresh} fresh");
}
