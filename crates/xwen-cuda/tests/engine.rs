//! The CUDA model behind the engine's device seam (`xwen_cuda::attach`): what `run`, `chat`
//! and `serve` compute with `-ngl 99`. Batch invariance on the GPU (a sequence's logits bit
//! for bit alone and in a batch of several, each with its own span sizes); the engine's slots,
//! prefix cache and speculative verify with rollbacks giving the device's own greedy tokens;
//! states moved between the host and the device (a CPU prefix continued on the GPU within the
//! model tests' bound, a device state read back and uploaded again bit for bit). Ignored
//! without a GPU; scripts/gpu-check runs them.

use std::path::{Path, PathBuf};
use xwen_cuda::CudaOptions;
use xwen_engine::{
    generate, generate_speculative, ContraryDrafter, Engine, EngineConfig, EngineOptions, EngineRequest, GenerateRequest, LogitsMode, Model, MtpDrafter, Output, PrefixCache, ReplayDrafter,
    Sampler, SamplerConfig, SeqStep, SpecStats,
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fixtures these tests run: both architectures, and a trained model where present.
/// `XWEN_GPU_MODELS=DIR` (scripts/gpu-check, the fixtures as scripts/gpu-pack names them)
/// takes them from DIR.
fn files() -> Vec<PathBuf> {
    if let Ok(dir) = std::env::var("XWEN_GPU_MODELS") {
        let dir = PathBuf::from(dir);
        let out: Vec<PathBuf> =
            ["qwen3_5-model-q4_k_m.gguf", "qwen3_5_moe-model-q4_k_m.gguf", "tiny-qwen35moe-q4_k_m.gguf"].iter().map(|f| dir.join(f)).filter(|p| p.exists()).collect();
        assert!(!out.is_empty(), "no fixtures in XWEN_GPU_MODELS={}", dir.display());
        return out;
    }
    let fx = repo().join("tests/fixtures/parity/cond");
    let mut out = vec![fx.join("qwen3_5/model-q4_k_m.gguf"), fx.join("qwen3_5_moe/model-q4_k_m.gguf")];
    let trained = repo().join("../shared/models/gguf/tiny-qwen35moe-q4_k_m.gguf");
    if trained.exists() {
        out.push(trained);
    }
    out
}

const CTX: usize = 512;

fn cpu(path: &Path) -> Model {
    Model::load(path, &EngineConfig { max_ctx: CTX, ..Default::default() }).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn on_gpu(path: &Path) -> Model {
    let mut m = cpu(path);
    let on = xwen_cuda::attach(&mut m, &CudaOptions { device: 0, n_ctx: CTX, graph: true, ubatch: 64, vram_budget: None, n_seq: 2, cpu_experts: 0, read_ahead: false, shard: None }).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.device().is_some_and(|d| d == on));
    m
}

fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % n_vocab as u64) as u32
        })
        .collect()
}

/// Steps `e` until its `n` requests (ids 1..=n) are done: each request's tokens.
fn drain(e: &mut Engine, n: usize, what: &str) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut steps = 0;
    while e.has_work() {
        for (id, o) in e.step() {
            match o {
                Output::Token { id: t, .. } => out[id as usize - 1].push(t),
                Output::Failed(msg) => panic!("{what}: request {id}: {msg}"),
                _ => {}
            }
        }
        steps += 1;
        assert!(steps < 100_000, "{what}: the engine never drains");
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn a_sequences_logits_are_the_same_bits_alone_and_in_a_batch() {
    for path in files() {
        let m = on_gpu(&path);
        let v = m.n_vocab();
        // three sequences: prompts of 40, 7 and 90 tokens, then steps mixing decode rows
        // and a chunk; each alone first, with the same span sizes
        let prompts: Vec<Vec<u32>> = [(40, 1), (7, 2), (90, 3)].iter().map(|&(n, s)| tokens(n, v, s)).collect();
        let steps: Vec<Vec<Vec<u32>>> = (0..3).map(|i| (0..4).map(|k| tokens(if (i + k) % 3 == 0 { 5 } else { 1 }, v, 100 + (i * 10 + k) as u64)).collect()).collect();
        let mut alone = Vec::new();
        for i in 0..3 {
            let mut s = m.new_state();
            let mut out = vec![m.forward(&mut s, &prompts[i], LogitsMode::Last).unwrap()];
            for t in &steps[i] {
                out.push(m.forward(&mut s, t, LogitsMode::All).unwrap());
            }
            alone.push(out);
        }
        let mut states: Vec<_> = (0..3).map(|_| m.new_state()).collect();
        let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 3];
        {
            let mut batch: Vec<SeqStep> = states.iter_mut().zip(&prompts).map(|(s, p)| SeqStep::new(s, p, LogitsMode::Last)).collect();
            for (i, l) in m.forward_batch(&mut batch).unwrap().into_iter().enumerate() {
                got[i].push(l);
            }
        }
        for k in 0..4 {
            let mut batch: Vec<SeqStep> = states.iter_mut().enumerate().map(|(i, s)| SeqStep::new(s, &steps[i][k], LogitsMode::All)).collect();
            for (i, l) in m.forward_batch(&mut batch).unwrap().into_iter().enumerate() {
                got[i].push(l);
            }
        }
        for i in 0..3 {
            for (k, (a, b)) in alone[i].iter().zip(&got[i]).enumerate() {
                assert_eq!(bits(a), bits(b), "{}: sequence {i}, step {k}", path.display());
            }
        }
        eprintln!("{}: 3 sequences, 5 steps each, bit-identical alone and batched", path.display());
    }
}

/// A step's prompt chunks reach the device together (`DeviceModel::forward_prompts`), and the
/// CUDA model runs those that ask for their last row as shared passes (`feed_spans`: up to the
/// pass's `ubatch` rows, longest first): each chunk's rows keep the bits they get alone. The
/// lengths put spans of each product's kernel (one launch of `mm` under 16 rows, `mm_tc` from
/// 16, a cuBLAS GEMM a span from 32) side by side in a pass, at offsets off every tile; one
/// prompt asks for every row's logits and one is longer than a pass (both run alone beside
/// the shared passes); then decode steps read the states the passes left. Half the rows ask
/// for their argmax on the device, half for their logits.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn prompt_chunks_stepped_together_give_each_their_bits_alone() {
    // with a ubatch of 96, first fit longest first: [45, 33, 15, 2] and [32, 31]; 16 asks for
    // every row, 100 is cut in two
    const LENS: [usize; 8] = [2, 15, 16, 31, 32, 45, 33, 100];
    let mode = |i: usize| match i {
        2 => LogitsMode::All,
        _ if i % 2 == 0 => LogitsMode::LastArgmax,
        _ => LogitsMode::Last,
    };
    let one = |m: &Model, s: &mut xwen_engine::SeqState, t: &[u32], mode: LogitsMode| {
        let mut st = [SeqStep::new(s, t, mode)];
        m.forward_batch_each(&mut st).unwrap().pop().unwrap().unwrap()
    };
    for path in files() {
        let mut m = cpu(&path);
        xwen_cuda::attach(&mut m, &CudaOptions { device: 0, n_ctx: CTX, graph: true, ubatch: 96, vram_budget: None, n_seq: LENS.len(), cpu_experts: 0, read_ahead: false, shard: None }).unwrap_or_else(|e| panic!("{e}"));
        let v = m.n_vocab();
        let prompts: Vec<Vec<u32>> = LENS.iter().enumerate().map(|(i, &n)| tokens(n, v, 300 + i as u64)).collect();
        let next: Vec<Vec<u32>> = (0..LENS.len()).map(|i| tokens(3, v, 400 + i as u64)).collect();
        let mut alone = Vec::new();
        for (i, (p, t)) in prompts.iter().zip(&next).enumerate() {
            let mut s = m.new_state();
            let mut out = vec![one(&m, &mut s, p, mode(i))];
            for &tok in t {
                out.push(one(&m, &mut s, &[tok], mode(i)));
            }
            alone.push(out);
        }
        let mut states: Vec<_> = (0..LENS.len()).map(|_| m.new_state()).collect();
        let mut got: Vec<Vec<xwen_engine::models::SpanOut>> = vec![Vec::new(); LENS.len()];
        {
            let mut batch: Vec<SeqStep> = states.iter_mut().zip(&prompts).enumerate().map(|(i, (s, p))| SeqStep::new(s, p, mode(i))).collect();
            for (i, o) in m.forward_batch_each(&mut batch).unwrap().into_iter().enumerate() {
                got[i].push(o.unwrap());
            }
        }
        for k in 0..3 {
            let mut batch: Vec<SeqStep> = states.iter_mut().zip(&next).enumerate().map(|(i, (s, t))| SeqStep::new(s, &t[k..k + 1], mode(i))).collect();
            for (i, o) in m.forward_batch_each(&mut batch).unwrap().into_iter().enumerate() {
                got[i].push(o.unwrap());
            }
        }
        for (i, (a, b)) in alone.iter().zip(&got).enumerate() {
            for (k, (x, y)) in a.iter().zip(b).enumerate() {
                assert_eq!((bits(&x.logits), x.argmax), (bits(&y.logits), y.argmax), "{}: the prompt of {} tokens, step {k}", path.display(), LENS[i]);
                assert!(!x.logits.is_empty() || x.argmax.is_some(), "a step gives its logits or its argmax");
            }
        }
        eprintln!("{}: prompts of {LENS:?} tokens in one step, then 3 decode steps: bit-identical to each alone", path.display());
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn decode_batches_of_every_size_give_each_row_its_bits_alone() {
    const N: usize = 8;
    for path in files() {
        let mut m = cpu(&path);
        xwen_cuda::attach(&mut m, &CudaOptions { device: 0, n_ctx: CTX, graph: true, ubatch: 64, vram_budget: None, n_seq: N, cpu_experts: 0, read_ahead: false, shard: None }).unwrap_or_else(|e| panic!("{e}"));
        let v = m.n_vocab();
        let prompts: Vec<Vec<u32>> = (0..N).map(|i| tokens(3 + 11 * i, v, 50 + i as u64)).collect();
        let feeds: Vec<Vec<u32>> = (0..N).map(|i| tokens(12, v, 200 + i as u64)).collect();
        // batches of 1 to 8 rows, then the odd sequences, then every third: each sequence's
        // rows at its own positions; even sequences ask for the argmax alone, odd for logits
        let mut rounds: Vec<Vec<usize>> = (0..N).map(|k| (0..=k).collect()).collect();
        rounds.push((0..N).filter(|i| i % 2 == 1).collect());
        rounds.push((0..N).filter(|i| i % 3 == 0).collect());
        let mode = |i: usize| if i % 2 == 0 { LogitsMode::LastArgmax } else { LogitsMode::Last };
        let one = |m: &Model, s: &mut xwen_engine::SeqState, t: &[u32], mode: LogitsMode| {
            let mut st = [SeqStep::new(s, t, mode)];
            m.forward_batch_each(&mut st).unwrap().pop().unwrap().unwrap()
        };
        let mut want: Vec<Vec<xwen_engine::models::SpanOut>> = Vec::new();
        for i in 0..N {
            let mut s = m.new_state();
            one(&m, &mut s, &prompts[i], LogitsMode::None);
            let rows = rounds.iter().filter(|r| r.contains(&i)).count();
            want.push(feeds[i][..rows].iter().map(|&t| one(&m, &mut s, &[t], mode(i))).collect());
        }
        let mut states: Vec<_> = (0..N).map(|_| m.new_state()).collect();
        {
            let mut batch: Vec<SeqStep> = states.iter_mut().zip(&prompts).map(|(s, p)| SeqStep::new(s, p, LogitsMode::None)).collect();
            m.forward_batch_each(&mut batch).unwrap();
        }
        let mut fed = [0usize; N];
        for (k, round) in rounds.iter().enumerate() {
            let toks: Vec<[u32; 1]> = round.iter().map(|&i| [feeds[i][fed[i]]]).collect();
            let mut batch: Vec<SeqStep> =
                states.iter_mut().enumerate().filter(|(i, _)| round.contains(i)).zip(&toks).map(|((i, s), t)| SeqStep::new(s, t, mode(i))).collect();
            let outs = m.forward_batch_each(&mut batch).unwrap();
            for (&i, o) in round.iter().zip(outs) {
                let o = o.unwrap();
                let w = &want[i][fed[i]];
                assert_eq!((bits(&o.logits), o.argmax), (bits(&w.logits), w.argmax), "{}: round {k} ({} rows), sequence {i}", path.display(), round.len());
                if i % 2 == 0 {
                    assert!(o.argmax.is_some() && o.logits.is_empty(), "a pure-greedy row gives its argmax alone");
                } else {
                    assert_eq!(o.logits.len(), v);
                }
                fed[i] += 1;
            }
        }
        eprintln!("{}: decode batches of 1 to {N} rows gave each row the bits it gets alone", path.display());
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn a_verify_pass_gives_each_row_the_decode_bits_and_rolls_back_to_any_row() {
    for path in files() {
        let m = on_gpu(&path);
        let v = m.n_vocab();
        let p = tokens(30, v, 11);
        let draft = tokens(6, v, 12);
        // the rows decoded one by one
        let mut a = m.new_state();
        m.forward(&mut a, &p, LogitsMode::None).unwrap();
        let mut want = Vec::new();
        for &t in &draft {
            want.extend(m.forward(&mut a, &[t], LogitsMode::Last).unwrap());
        }
        // the same rows as one verify (one pass on the device), states kept for a rollback to
        // any row, to any row but the first (what the engine keeps: a verify's first row is
        // never rolled back), and none
        for keep in [draft.len() + 1, draft.len() - 1, 0] {
            let mut b = m.new_state();
            b.keep_history(keep);
            m.forward(&mut b, &p, LogitsMode::None).unwrap();
            let pos = b.pos;
            let got = {
                let mut st = [SeqStep { state: &mut b, tokens: &draft, logits: LogitsMode::All, decode_order: true, hidden: false, banned: &[] }];
                m.forward_batch(&mut st).unwrap().pop().unwrap()
            };
            assert_eq!(bits(&got), bits(&want), "{}: a verify's rows (keeping {keep}) against decode", path.display());
            if keep == 0 {
                continue;
            }
            // back to before each row kept, last first: that row decoded again gives its bits
            let first = draft.len() - keep.min(draft.len());
            for r in (first..draft.len()).rev() {
                b.rollback(pos + r).unwrap();
                let l = m.forward(&mut b, &draft[r..r + 1], LogitsMode::Last).unwrap();
                assert_eq!(bits(&l), bits(&want[r * v..(r + 1) * v]), "{}: row {r} after a rollback to it", path.display());
            }
        }
        eprintln!("{}: a verify of {} rows gave decode's bits and rolled back to each row", path.display(), draft.len());
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_engines_slots_prefix_cache_and_drafting_on_the_gpu_give_each_requests_tokens_alone() {
    for path in files() {
        let m = on_gpu(&path);
        let v = m.n_vocab();
        let prompts: Vec<Vec<u32>> = (0..4).map(|i| tokens(10 + 23 * i, v, 7 + i as u64)).collect();
        let n = 24;
        let greedy = || SamplerConfig::greedy().resolve(false);
        let req = |p: &Vec<u32>| EngineRequest { prefill_chunk: 64, ..EngineRequest::new(p.clone(), n, Vec::new(), greedy()) };
        // each request alone in an engine of one slot
        let mut e = Engine::new(m, EngineOptions { parallel: 1, draft: None, prefix: None });
        let mut want = Vec::new();
        for p in &prompts {
            e.submit(req(p));
            let mut out = Vec::new();
            while e.has_work() {
                for (_, o) in e.step() {
                    match o {
                        Output::Token { id: t, .. } => out.push(t),
                        Output::Failed(msg) => panic!("{}: {msg}", path.display()),
                        _ => {}
                    }
                }
            }
            want.push(out);
        }
        drop(e);
        let m = on_gpu(&path);
        // the four again on two slots with a prefix cache, and drafted: always right and
        // always wrong
        let prefix = PrefixCache::new(&m, 1 << 30, None).unwrap();
        let mut e = Engine::new(m, EngineOptions { parallel: 2, draft: None, prefix: Some(prefix) });
        for p in &prompts {
            e.submit(req(p));
        }
        for (i, p) in prompts.iter().enumerate().take(2) {
            let replay: Box<dyn xwen_engine::Drafter> = Box::new(ReplayDrafter::new(want[i].clone()));
            e.submit(EngineRequest { prefill_chunk: 64, draft: Some((replay, 4)), ..EngineRequest::new(p.clone(), n, Vec::new(), greedy()) });
            let contrary: Box<dyn xwen_engine::Drafter> = Box::new(ContraryDrafter::new(v));
            e.submit(EngineRequest { prefill_chunk: 64, draft: Some((contrary, 3)), ..EngineRequest::new(p.clone(), n, Vec::new(), greedy()) });
        }
        let got = drain(&mut e, 8, &path.display().to_string());
        for (i, w) in want.iter().enumerate() {
            assert_eq!(&got[i], w, "{}: request {i}", path.display());
        }
        for (k, i) in [(4, 0), (5, 0), (6, 1), (7, 1)] {
            assert_eq!(&got[k], &want[i], "{}: drafted request {k}", path.display());
        }
        eprintln!("{}: 8 requests on 2 slots (4 drafted) gave each request's tokens alone", path.display());
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn states_move_between_the_host_and_the_device() {
    for path in files() {
        let host = cpu(&path);
        let m = on_gpu(&path);
        let v = m.n_vocab();
        let p = tokens(60, v, 5);
        let next = tokens(6, v, 6);
        // a device state read back and uploaded again continues bit for bit
        let mut a = m.new_state();
        m.forward(&mut a, &p, LogitsMode::None).unwrap();
        let mut b = a.to_host().unwrap();
        assert!(a.is_on_device() && !b.is_on_device());
        let la = m.forward(&mut a, &next, LogitsMode::All).unwrap();
        let lb = m.forward(&mut b, &next, LogitsMode::All).unwrap();
        assert_eq!(bits(&la), bits(&lb), "{}: a state read back and uploaded again", path.display());
        // a checkpoint kept on the device (the card has room): its host form (the prefix
        // cache's copy) and its restore by a device copy continue bit for bit
        let mut c = m.new_state();
        m.forward(&mut c, &p, LogitsMode::None).unwrap();
        let ck = c.checkpoint().unwrap();
        assert!(ck.on_device(), "{}: a checkpoint with room on the card stays there", path.display());
        m.forward(&mut c, &tokens(9, v, 8), LogitsMode::None).unwrap();
        let mut at = c.to_host_at(&ck).unwrap();
        assert_eq!(bits(&m.forward(&mut at, &next, LogitsMode::All).unwrap()), bits(&la), "{}: a device checkpoint's host form", path.display());
        c.restore_checkpoint(&ck).unwrap();
        assert_eq!(bits(&m.forward(&mut c, &next, LogitsMode::All).unwrap()), bits(&la), "{}: a restored checkpoint", path.display());
        // the CPU's prefix continued on the GPU: the layouts agree (within the model tests' bound)
        let mut h = host.new_state();
        host.forward(&mut h, &p, LogitsMode::None).unwrap();
        let mut hc = h.clone();
        let want = host.forward(&mut hc, &next, LogitsMode::All).unwrap();
        let got = m.forward(&mut h, &next, LogitsMode::All).unwrap();
        let worst = (0..next.len()).map(|r| rel_l2(&got[r * v..(r + 1) * v], &want[r * v..(r + 1) * v])).fold(0.0, f64::max);
        assert!(worst < 1e-1, "{}: the CPU's state on the GPU: rel-L2 {worst:.2e}", path.display());
        eprintln!("{}: CPU prefix continued on the GPU, worst rel-L2 {worst:.2e}", path.display());
    }
}

#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn decode_batches_under_a_vram_budget_give_the_bits_of_the_whole_model() {
    const N: usize = 6;
    for path in files() {
        let file = xwen_gguf::GgufFile::open(&path).unwrap();
        let base = CudaOptions { device: 0, n_ctx: CTX, graph: true, ubatch: 64, vram_budget: None, n_seq: N, cpu_experts: 0, read_ahead: false, shard: None };
        let plan = xwen_cuda::device_plan(&file, &base).unwrap();
        if plan.expert_bytes == 0 {
            continue;
        }
        // the floor: a decode batch of N rows needs more experts a layer than the pool holds
        let budget = plan.resident_bytes() + plan.n_used as u64 * plan.expert_slot_bytes;
        let run = |opts: &CudaOptions| {
            let mut m = cpu(&path);
            xwen_cuda::attach(&mut m, opts).unwrap_or_else(|e| panic!("{e}"));
            let v = m.n_vocab();
            let mut states: Vec<_> = (0..N).map(|_| m.new_state()).collect();
            let prompts: Vec<Vec<u32>> = (0..N).map(|i| tokens(5 + 13 * i, v, 70 + i as u64)).collect();
            let mut out = Vec::new();
            {
                let mut batch: Vec<SeqStep> = states.iter_mut().zip(&prompts).map(|(s, p)| SeqStep::new(s, p, LogitsMode::Last)).collect();
                out.extend(m.forward_batch(&mut batch).unwrap());
            }
            for k in 0..6 {
                let toks: Vec<Vec<u32>> = (0..N).map(|i| tokens(if k == 3 && i == 0 { 5 } else { 1 }, v, 300 + (10 * k + i) as u64)).collect();
                let mut batch: Vec<SeqStep> = states.iter_mut().zip(&toks).map(|(s, t)| SeqStep::new(s, t, LogitsMode::All)).collect();
                out.extend(m.forward_batch(&mut batch).unwrap());
            }
            (out, m.device().unwrap_or_default())
        };
        let (want, _) = run(&base);
        let (got, on) = run(&CudaOptions { vram_budget: Some(budget), ..base.clone() });
        assert!(on.contains("VRAM expert cache"), "{on}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(bits(a), bits(b), "{}: output {i}", path.display());
        }
        eprintln!("{}: {N} sequences' prompts and decode batches at the floor's VRAM budget ({on}): bit-identical to the whole model", path.display());
    }
}

/// A model split over ranks by its routed experts (`xwen_cuda::attach_group`), here 2 and 3
/// ranks sharing the one GPU (reductions through host memory; on a host of several GPUs the
/// same code reduces through NCCL): prompts, decode batches and a prompt chunk among them, and
/// the engine's requests, give the bits of the whole model on one GPU.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn ranks_of_a_sharded_model_give_the_bits_of_one_gpu() {
    const N: usize = 3;
    for path in files() {
        let file = xwen_gguf::GgufFile::open(&path).unwrap();
        let base = CudaOptions { device: 0, n_ctx: CTX, graph: true, ubatch: 64, vram_budget: None, n_seq: N, cpu_experts: 0, read_ahead: false, shard: None };
        if xwen_cuda::device_plan(&file, &base).unwrap().expert_bytes == 0 {
            continue;
        }
        let run = |devices: &[usize]| {
            let mut m = cpu(&path);
            let on = xwen_cuda::attach_group(&mut m, &base, devices).unwrap_or_else(|e| panic!("{e}"));
            let v = m.n_vocab();
            let mut states: Vec<_> = (0..N).map(|_| m.new_state()).collect();
            let prompts: Vec<Vec<u32>> = (0..N).map(|i| tokens(5 + 37 * i, v, 90 + i as u64)).collect();
            let mut out = Vec::new();
            {
                let mut batch: Vec<SeqStep> = states.iter_mut().zip(&prompts).map(|(s, p)| SeqStep::new(s, p, LogitsMode::Last)).collect();
                out.extend(m.forward_batch(&mut batch).unwrap());
            }
            for k in 0..5 {
                let toks: Vec<Vec<u32>> = (0..N).map(|i| tokens(if k == 2 && i == 1 { 9 } else { 1 }, v, 500 + (10 * k + i) as u64)).collect();
                let mut batch: Vec<SeqStep> = states.iter_mut().zip(&toks).map(|(s, t)| SeqStep::new(s, t, LogitsMode::All)).collect();
                out.extend(m.forward_batch(&mut batch).unwrap());
            }
            let reqs: Vec<EngineRequest> = (0..N)
                .map(|i| EngineRequest { prefill_chunk: 16, ..EngineRequest::new(tokens(20 + 9 * i, v, 40 + i as u64), 8, Vec::new(), SamplerConfig::greedy().resolve(false)) })
                .collect();
            let mut e = Engine::new(m, EngineOptions { parallel: N, draft: None, prefix: None });
            for r in reqs {
                e.submit(r);
            }
            let toks = drain(&mut e, N, &path.display().to_string());
            (out, toks, on)
        };
        let (want, want_toks, _) = run(&[0]);
        for devices in [&[0usize, 0][..], &[0, 0, 0][..]] {
            let (got, got_toks, on) = run(devices);
            assert!(on.contains(&format!("{} ranks, expert parallel", devices.len())), "{on}");
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(bits(a), bits(b), "{}: {} ranks, output {i}", path.display(), devices.len());
            }
            assert_eq!(got_toks, want_toks, "{}: {} ranks, the engine's tokens", path.display(), devices.len());
            eprintln!("{}: {on}: bit-identical to one GPU", path.display());
        }
    }
}

/// The trained tiny-qwen35moe and its trained MTP head (a sidecar): from `XWEN_GPU_MODELS`
/// (scripts/gpu-pack puts both there) or ../shared and tests/fixtures; None where absent.
fn trained_with_mtp() -> Option<(PathBuf, PathBuf)> {
    let (trunk, head) = match std::env::var("XWEN_GPU_MODELS") {
        Ok(dir) => (PathBuf::from(&dir).join("tiny-qwen35moe-q4_k_m.gguf"), PathBuf::from(&dir).join("mtp-tiny-qwen35moe-q8_0.gguf")),
        Err(_) => (repo().join("../shared/models/gguf/tiny-qwen35moe-q4_k_m.gguf"), repo().join("tests/fixtures/mtp/trained/mtp-tiny-qwen35moe-q8_0.gguf")),
    };
    (trunk.exists() && head.exists()).then_some((trunk, head))
}

fn greedy_sampler() -> Sampler {
    Sampler::new(SamplerConfig::greedy().resolve(false))
}

/// A sampler that takes the argmax without being greedy (temperature 1, top-k 1): a drafting
/// run's depths then follow acceptance alone, not its controller's timings.
fn argmax_sampler() -> Sampler {
    Sampler::new(SamplerConfig { temperature: Some(1.0), top_k: Some(1), top_p: Some(1.0), min_p: Some(0.0), seed: Some(7), ..SamplerConfig::default() }.resolve(false))
}

/// Decoding of `n` tokens after `prompt` by `sampler`, drafted by `draft` (drafter, depth) or
/// plain.
fn sampled_tokens(m: &Model, prompt: &[u32], n: usize, draft: Option<(&mut dyn xwen_engine::Drafter, usize)>, sampler: &mut Sampler) -> (Vec<u32>, SpecStats) {
    let mut out = Vec::new();
    let req = GenerateRequest { prompt, max_tokens: Some(n), stop_ids: &[], prefill_chunk: 0 };
    let mut on_token = |t| {
        out.push(t);
        true
    };
    let stats = match draft {
        Some((d, k)) => generate_speculative(m, &mut m.new_state(), &req, d, k, sampler, &mut |_, _| true, &mut on_token).map(|(_, s)| s),
        None => generate(m, &mut m.new_state(), &req, sampler, &mut on_token).map(|_| SpecStats::default()),
    };
    let stats = stats.unwrap_or_else(|e| panic!("{e}"));
    (out, stats)
}

/// Greedy decoding of `n` tokens after `prompt`, drafted by `draft` (drafter, depth) or plain.
fn greedy_tokens(m: &Model, prompt: &[u32], n: usize, draft: Option<(&mut dyn xwen_engine::Drafter, usize)>) -> (Vec<u32>, SpecStats) {
    sampled_tokens(m, prompt, n, draft, &mut greedy_sampler())
}

/// The trained MTP head on the device (it goes there with the model: `xwen_cuda::attach`):
/// drafting with it gives the device's plain greedy tokens; its drafts are accepted about as
/// often as the CPU head's (a head computing the wrong thing would be accepted almost never);
/// and the engine's slots draft several requests with it at once, each giving its tokens alone.
#[test]
#[ignore = "needs a CUDA GPU (scripts/gpu-check runs it)"]
fn the_mtp_head_on_the_device_drafts_the_plain_greedy_tokens() {
    let Some((trunk, head)) = trained_with_mtp() else {
        eprintln!("skipped: the trained tiny-qwen35moe or its MTP head is absent");
        return;
    };
    let load = || Model::load(&trunk, &EngineConfig { max_ctx: CTX, mtp_sidecar: Some(head.clone()), ..Default::default() }).unwrap_or_else(|e| panic!("{e}"));
    let host = load();
    let m = loaded_on_gpu(&load);
    assert!(m.has_mtp(), "the head went onto the device with the model");
    // "def fibonacci(n):\n    if n < 2:" in the trained models' tokenizer
    let prompt: Vec<u32> = vec![537, 288, 2680, 272, 729, 668, 1113, 286, 258, 353, 326, 718, 220, 17, 25];
    let n = 96;
    let (want, _) = greedy_tokens(&m, &prompt, n, None);
    let (got, s) = greedy_tokens(&m, &prompt, n, Some((&mut MtpDrafter::new(), 3)));
    assert_eq!(got, want, "drafted by the MTP head on the device: not plain greedy");
    eprintln!("MTP head on the device: {} of {} drafts accepted ({:.2})", s.accepted(), s.drafted(), s.acceptance());
    assert!(s.drafted() > 0 && s.acceptance() >= 0.5, "device {s:?}");
    // the device head's acceptance against the CPU head's under one depth schedule: a greedy
    // run's controller chooses depths by its own step timings (the CPU's pause a drafter that
    // cannot pay there), so both run a sampler that takes the argmax (top-k 1) without being
    // greedy, whose depths follow acceptance alone
    let (same, on_gpu) = sampled_tokens(&m, &prompt, n, Some((&mut MtpDrafter::new(), 3)), &mut argmax_sampler());
    assert_eq!(same, want, "drafted by the MTP head on the device with a top-k 1 sampler: not plain greedy");
    let (_, on_cpu) = sampled_tokens(&host, &prompt, n, Some((&mut MtpDrafter::new(), 3)), &mut argmax_sampler());
    eprintln!(
        "the same depth schedule: on the device {} of {} drafts accepted ({:.2}), on the CPU {} of {} ({:.2})",
        on_gpu.accepted(),
        on_gpu.drafted(),
        on_gpu.acceptance(),
        on_cpu.accepted(),
        on_cpu.drafted(),
        on_cpu.acceptance()
    );
    assert!(on_cpu.drafted() > 0 && (on_gpu.acceptance() - on_cpu.acceptance()).abs() <= 0.15, "device {on_gpu:?} against the CPU's {on_cpu:?}");
    // three requests on the engine's slots drafting with their own head states, against each
    // alone on one slot, plain (the engine feeds a prompt in its own spans, so `generate`'s
    // tokens may part from it at a near-tie: reported, not required)
    let prompts: Vec<Vec<u32>> = vec![prompt.clone(), prompt[..9].to_vec(), prompt[3..].to_vec()];
    let by_generate: Vec<Vec<u32>> = prompts.iter().map(|p| greedy_tokens(&m, p, 40, None).0).collect();
    drop(m);
    let engine = |parallel: usize, drafted: bool| {
        let mut outs = Vec::new();
        for group in prompts.chunks(parallel) {
            let mut e = Engine::new(loaded_on_gpu(&load), EngineOptions { parallel, draft: None, prefix: None });
            for p in group {
                let d = drafted.then(|| (Box::new(MtpDrafter::new()) as Box<dyn xwen_engine::Drafter>, 3));
                e.submit(EngineRequest { prefill_chunk: 64, draft: d, ..EngineRequest::new(p.clone(), 40, Vec::new(), SamplerConfig::greedy().resolve(false)) });
            }
            outs.extend(drain(&mut e, group.len(), "MTP-drafted slots"));
        }
        outs
    };
    let alone = engine(1, false);
    let same = alone.iter().zip(&by_generate).filter(|(a, g)| a == g).count();
    eprintln!("the engine alone and generate: {same} of {} requests' tokens equal", alone.len());
    for (what, parallel) in [("1 slot", 1), ("3 slots", 3)] {
        assert_eq!(engine(parallel, true), alone, "MTP-drafted requests on {what} against each alone, plain");
    }
    eprintln!("MTP-drafted requests on 1 and 3 slots gave each its tokens alone");
}

/// `load`'s model on the GPU (each engine takes a copy of its own).
fn loaded_on_gpu(load: &dyn Fn() -> Model) -> Model {
    let mut m = load();
    xwen_cuda::attach(&mut m, &CudaOptions { device: 0, n_ctx: CTX, graph: true, ubatch: 64, vram_budget: None, n_seq: 4, cpu_experts: 0, read_ahead: false, shard: None }).unwrap_or_else(|e| panic!("{e}"));
    m
}
