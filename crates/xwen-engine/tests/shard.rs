//! A model split over ranks by its routed experts (`xwen_engine::shard`), the ranks threads of
//! this process meeting through the in-process collective: the logits of N ranks are the bits
//! of the one-rank model's — prompts in chunks, decode, and batches mixing several sequences'
//! decode rows with prompt chunks — on every MoE architecture's fixture, for several N; a
//! rank whose pass fails fails the group instead of hanging it. The same ranks behind the device
//! seam (`DeviceGroup`, each rank a stand-in device) serve the engine's requests with the CPU's
//! tokens: what a GPU per rank does, minus the GPUs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use xwen_engine::runtime::ranks::{DeviceGroup, GroupStep, ShardGroup};
use xwen_engine::shard::{Collective, ExpertPartition, LocalGroup, Shard};
use xwen_engine::{DeviceModel, EngineConfig, EngineError, EngineRequest, LogitsMode, Model, SamplerConfig, SeqStep};

#[path = "support/host_device.rs"]
mod host_device;
use host_device::{run_engine, HostDevice, MAX_ROWS};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(rel: &str) -> PathBuf {
    let p = repo_root().join("tests/fixtures/parity/cond").join(rel);
    assert!(p.exists(), "committed fixture {} is missing", p.display());
    p
}

fn cfg() -> EngineConfig {
    EngineConfig { threads: 1, max_ctx: 512, ..Default::default() }
}

fn prompt(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % n_vocab) as u32).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A prompt in chunks of `chunk` (every row's logits), then `steps` greedy decode steps: every
/// pass's logits, from the one-rank model.
fn one_rank(m: &Model, p: &[u32], chunk: usize, steps: usize) -> Vec<Vec<f32>> {
    let mut st = m.new_state();
    let mut out = vec![m.forward_chunks(&mut st, p, chunk, LogitsMode::All).unwrap()];
    for _ in 0..steps {
        let last = &out.last().unwrap()[out.last().unwrap().len() - m.n_vocab()..];
        let t = xwen_engine::ops::argmax(last);
        out.push(m.forward(&mut st, &[t], LogitsMode::Last).unwrap());
    }
    out
}

fn ranks_run(g: &ShardGroup, n_vocab: usize, p: &[u32], chunk: usize, steps: usize) -> Vec<Vec<f32>> {
    let mut st = g.new_state();
    let mut out = vec![g.forward_chunks(&mut st, p, chunk, LogitsMode::All).unwrap()];
    for _ in 0..steps {
        let last = &out.last().unwrap()[out.last().unwrap().len() - n_vocab..];
        let t = xwen_engine::ops::argmax(last);
        out.push(g.forward(&mut st, &[t], LogitsMode::Last).unwrap());
    }
    assert_eq!(st.pos(), p.len() + steps);
    out
}

fn n_ranks_give_one_ranks_bits(rel: &str, ranks: &[usize]) {
    let path = fixture(rel);
    let one = Model::load(&path, &cfg()).unwrap();
    let (n_expert, _, _) = one.moe_geometry().expect("a MoE fixture");
    let p = prompt(37, one.n_vocab());
    let want = one_rank(&one, &p, 16, 6);
    for &n in ranks {
        let g = ShardGroup::load(&path, &cfg(), n).unwrap();
        assert_eq!(g.size(), n);
        let part = g.partition().unwrap();
        assert_eq!((part.n_expert, part.ranks), (n_expert, n));
        let got = ranks_run(&g, one.n_vocab(), &p, 16, 6);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(bits(w), bits(g), "{rel}, {n} ranks of {n_expert} experts: pass {i} differs");
        }
    }
}

#[test]
fn qwen35moe_on_n_ranks_gives_the_bits_of_one() {
    let n_expert = Model::load(&fixture("qwen3_5_moe/model-q4_k_m.gguf"), &cfg()).unwrap().moe_geometry().unwrap().0;
    // two, an uneven three, and one expert a rank
    n_ranks_give_one_ranks_bits("qwen3_5_moe/model-q4_k_m.gguf", &[2, 3, n_expert]);
    n_ranks_give_one_ranks_bits("qwen3_5_moe/model-q8_0.gguf", &[2]);
}

#[test]
fn qwen3next_kimi_linear_qwen4exp_and_k3_on_n_ranks_give_the_bits_of_one() {
    for rel in ["qwen3_next/model-q4_k_m.gguf", "kimi_linear/model-q4_k_m.gguf", "qwen4exp/model-q4_k_m.gguf", "kimi_k3/model-q4_k_m.gguf"] {
        n_ranks_give_one_ranks_bits(rel, &[2, 3]);
    }
}

/// Two sequences' decode rows with a third's prompt chunk in one step, then all decoding
/// together: each sequence's logits are the one-rank batch's.
#[test]
fn batches_of_decode_rows_and_prompt_chunks_on_ranks_give_the_bits_of_one() {
    let path = fixture("qwen3_5_moe/model-q4_k_m.gguf");
    let one = Model::load(&path, &cfg()).unwrap();
    let g = ShardGroup::load(&path, &cfg(), 3).unwrap();
    let nv = one.n_vocab();
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(9 + 5 * i, nv).into_iter().map(|t| (t + i as u32 * 31) % nv as u32).collect()).collect();
    let mut s1: Vec<_> = (0..3).map(|_| one.new_state()).collect();
    let mut sg: Vec<_> = (0..3).map(|_| g.new_state()).collect();
    // sequences 0 and 1 take their prompts first
    for i in 0..2 {
        let a = one.forward(&mut s1[i], &prompts[i], LogitsMode::Last).unwrap();
        let b = g.forward(&mut sg[i], &prompts[i], LogitsMode::Last).unwrap();
        assert_eq!(bits(&a), bits(&b));
    }
    let mut next = [5u32, 6, 7];
    for step in 0..4 {
        // step 0: 0 and 1 decode while 2's whole prompt runs beside them; then three decode rows
        let feeds: Vec<Vec<u32>> = (0..3).map(|i| if i == 2 && step == 0 { prompts[2].clone() } else { vec![next[i]] }).collect();
        let a = {
            let mut steps: Vec<SeqStep> = s1.iter_mut().zip(&feeds).map(|(s, f)| SeqStep::new(s, f, LogitsMode::Last)).collect();
            one.forward_batch(&mut steps).unwrap()
        };
        let b = {
            let mut steps: Vec<GroupStep> = sg.iter_mut().zip(&feeds).map(|(s, f)| GroupStep::new(s, f, LogitsMode::Last)).collect();
            g.forward_batch_out(&mut steps).unwrap()
        };
        for i in 0..3 {
            assert_eq!(bits(&a[i]), bits(&b[i].logits), "step {step}, sequence {i}");
            next[i] = xwen_engine::ops::argmax(&a[i]);
        }
    }
}

/// Greedy text of the trained tiny MoE on 2 and 4 ranks: the one-rank model's tokens.
#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn the_trained_moe_on_ranks_decodes_the_same_tokens() {
    let path = repo_root().join("../shared/models/gguf/tiny-qwen35moe-q4_k_m.gguf");
    let one = Model::load(&path, &cfg()).unwrap();
    let p = prompt(20, one.n_vocab());
    let want = one_rank(&one, &p, 512, 24);
    for n in [2, 4] {
        let g = ShardGroup::load(&path, &cfg(), n).unwrap();
        let got = ranks_run(&g, one.n_vocab(), &p, 512, 24);
        let toks = |v: &[Vec<f32>]| v.iter().map(|l| xwen_engine::ops::argmax(&l[l.len() - one.n_vocab()..])).collect::<Vec<_>>();
        assert_eq!(toks(&want), toks(&got), "{n} ranks");
        assert_eq!(bits(want.last().unwrap()), bits(got.last().unwrap()));
    }
}

/// A collective end that fails its `fail_at`-th call, as a lost peer would.
struct Failing {
    inner: LocalGroup,
    calls: AtomicUsize,
    fail_at: usize,
}

impl Collective for Failing {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_reduce_sum(&self, buf: &mut [f32]) -> xwen_engine::Result<()> {
        if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at {
            return Err(EngineError::Device("the link to rank 1's GPU went down".into()));
        }
        self.inner.all_reduce_sum(buf)
    }
    fn abort(&self, why: &str) {
        self.inner.abort(why)
    }
}

#[test]
fn a_rank_that_fails_mid_pass_fails_the_group_with_its_cause_and_hangs_nobody() {
    let path = fixture("qwen3_5_moe/model-q4_k_m.gguf");
    let file = Arc::new(Model::open_file(&path, &cfg()).unwrap());
    let comms: Vec<Arc<dyn Collective>> = LocalGroup::new(3)
        .into_iter()
        .map(|g| {
            let fail_at = if g.rank() == 1 { 3 } else { usize::MAX };
            Arc::new(Failing { inner: g, calls: AtomicUsize::new(0), fail_at }) as Arc<dyn Collective>
        })
        .collect();
    let g = ShardGroup::with_comms(file, Some(&path), &cfg(), comms).unwrap();
    let mut st = g.new_state();
    let e = g.forward(&mut st, &prompt(12, 64), LogitsMode::Last).unwrap_err();
    assert!(e.to_string().contains("link to rank 1"), "the cause, not an abort: {e}");
    // the group stays failed: a later pass errors at once instead of waiting for rank 1
    let mut st = g.new_state();
    assert!(g.forward(&mut st, &[1, 2, 3], LogitsMode::Last).is_err());
}

#[test]
fn a_dense_model_or_more_ranks_than_experts_is_refused_with_the_reason() {
    let e = ShardGroup::load(&fixture("qwen3_5/model-q4_k_m.gguf"), &cfg(), 2).err().expect("a dense model is refused");
    assert!(e.to_string().contains("no routed experts"), "{e}");
    let moe = fixture("qwen3_5_moe/model-q4_k_m.gguf");
    let n_expert = Model::load(&moe, &cfg()).unwrap().moe_geometry().unwrap().0;
    let e = ShardGroup::load(&moe, &cfg(), n_expert + 1).err().expect("too many ranks");
    assert!(e.to_string().contains("more ranks than"), "{e}");
    // one rank is the model itself
    assert_eq!(ShardGroup::load(&moe, &cfg(), 1).unwrap().size(), 1);
}

/// A model whose passes run on a `DeviceGroup` of `n` ranks, each a sharded CPU model behind
/// the stand-in device, meeting through the in-process collective.
fn on_device_group(path: &Path, n: usize) -> (Model, Vec<Arc<HostDevice>>) {
    let file = Arc::new(Model::open_file(path, &cfg()).unwrap());
    let comms: Vec<Arc<LocalGroup>> = LocalGroup::new(n).into_iter().map(Arc::new).collect();
    let mut root = Model::from_gguf_at(Arc::clone(&file), Some(path), &cfg()).unwrap();
    let part = ExpertPartition { n_expert: root.moe_geometry().unwrap().0, ranks: n };
    let hosts: Vec<Arc<HostDevice>> = comms
        .iter()
        .map(|c| {
            let mut m = Model::from_gguf_at(Arc::clone(&file), Some(path), &cfg()).unwrap();
            m.join_shard(Shard { comm: Arc::clone(c) as Arc<dyn Collective>, experts: part.block(c.rank()) }).unwrap();
            Arc::new(HostDevice::new(m))
        })
        .collect();
    let ranks: Vec<Arc<dyn DeviceModel>> = hosts.iter().map(|h| Arc::clone(h) as Arc<dyn DeviceModel>).collect();
    let group = DeviceGroup::new(ranks, Arc::new(move |r: usize, why: &str| comms[r].abort(why))).unwrap();
    assert_eq!(group.size(), n);
    root.attach_device(Arc::new(group)).unwrap();
    (root, hosts)
}


/// Passes on a group of ranks behind the device seam give the CPU model's bits, and the state
/// comes back whole; the engine's slots, decode batches and prompt chunks on the group give each
/// request the CPU's tokens.
#[test]
fn a_device_group_of_ranks_serves_the_engine_with_the_cpus_tokens() {
    let path = fixture("qwen3_5_moe/model-q4_k_m.gguf");
    let cpu = Model::load(&path, &cfg()).unwrap();
    let v = cpu.n_vocab();
    let (grouped, hosts) = on_device_group(&path, 3);
    assert!(grouped.device().unwrap().starts_with("3 ranks, expert parallel"));
    let p = prompt(29, v);
    let (mut a, mut b) = (cpu.new_state(), grouped.new_state());
    let want = cpu.forward_chunks(&mut a, &p, 8, LogitsMode::All).unwrap();
    assert_eq!(bits(&want), bits(&grouped.forward_chunks(&mut b, &p, 8, LogitsMode::All).unwrap()));
    for t in [3u32, 17, 40] {
        assert_eq!(bits(&cpu.forward(&mut a, &[t], LogitsMode::Last).unwrap()), bits(&grouped.forward(&mut b, &[t], LogitsMode::Last).unwrap()));
    }
    // a clone, and a checkpoint restored after a detour, continue with the same bits on every rank
    let ck = b.checkpoint().unwrap();
    let mut c = b.clone();
    grouped.forward(&mut b, &p[..5], LogitsMode::None).unwrap();
    b.restore_checkpoint(&ck).unwrap();
    let want9 = cpu.forward(&mut a, &[9], LogitsMode::Last).unwrap();
    assert_eq!(bits(&grouped.forward(&mut c, &[9], LogitsMode::Last).unwrap()), bits(&want9));
    assert_eq!(bits(&grouped.forward(&mut b, &[9], LogitsMode::Last).unwrap()), bits(&want9));
    let reqs = || {
        [(9, 7), (30, 5), (3, 9), (14, 4)]
            .iter()
            .enumerate()
            .map(|(i, &(len, n))| EngineRequest {
                prefill_chunk: 8,
                ..EngineRequest::new(prompt(len + i, v).into_iter().map(|t| (t + 11 * i as u32) % v as u32).collect(), n, Vec::new(), SamplerConfig::greedy().resolve(false))
            })
            .collect::<Vec<_>>()
    };
    let want = run_engine(cpu, reqs(), 3, None);
    assert_eq!(run_engine(grouped, reqs(), 3, None), want);
    for h in &hosts {
        assert_eq!(h.widest.load(Ordering::Relaxed), MAX_ROWS, "every rank took the slots' decode rows as batches");
    }
}

/// A request the group cannot run — a token outside the vocabulary, no tokens, a full context —
/// is refused before any rank starts, and the group serves the next one.
#[test]
fn a_bad_request_fails_alone_and_the_group_goes_on() {
    let path = fixture("qwen3_5_moe/model-q4_k_m.gguf");
    let one = Model::load(&path, &cfg()).unwrap();
    let g = ShardGroup::load(&path, &cfg(), 2).unwrap();
    let mut st = g.new_state();
    let bad = one.n_vocab() as u32;
    assert!(matches!(g.forward(&mut st, &[1, bad], LogitsMode::Last), Err(EngineError::TokenOutOfRange { .. })));
    assert!(matches!(g.forward(&mut st, &[], LogitsMode::Last), Err(EngineError::EmptyInput)));
    assert!(matches!(g.forward(&mut st, &vec![1; 513], LogitsMode::Last), Err(EngineError::ContextFull { .. })));
    assert_eq!(st.pos(), 0);
    let p = prompt(9, one.n_vocab());
    let mut a = one.new_state();
    assert_eq!(bits(&g.forward(&mut st, &p, LogitsMode::Last).unwrap()), bits(&one.forward(&mut a, &p, LogitsMode::Last).unwrap()));
    // through the device seam too: the root model checks before the group's ranks see it
    let (grouped, _) = on_device_group(&path, 2);
    let mut s = grouped.new_state();
    assert!(matches!(grouped.forward(&mut s, &[bad], LogitsMode::Last), Err(EngineError::TokenOutOfRange { .. })));
    // (the stand-in device computes every row's logits: the CPU's head on all rows)
    let mut b = one.new_state();
    let all = one.forward(&mut b, &p, LogitsMode::All).unwrap();
    assert_eq!(bits(&grouped.forward(&mut s, &p, LogitsMode::Last).unwrap()), bits(&all[all.len() - one.n_vocab()..]));
}
