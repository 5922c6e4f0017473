//! The device seam (`xwen_engine::device`) without a GPU: a stand-in device that computes its
//! passes with a second CPU model over states it keeps to itself, as a GPU keeps its own. A
//! model with it attached must give the plain CPU model's bits everywhere the engine reaches
//! it — passes and chunks, the engine's slots, checkpoints, states moved to and from the host,
//! a prefix-cache entry, and a speculative verify with its rollbacks — so the seam's plumbing
//! is held in CI; `crates/xwen-cuda/tests/engine.rs` holds the real device to the same tests.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use xwen_engine::{ContraryDrafter, EngineConfig, EngineRequest, LogitsMode, Model, PrefixCache, ReplayDrafter, SamplerConfig, SeqStep};

#[path = "support/host_device.rs"]
mod host_device;
use host_device::{run_engine, HostDevice, MAX_ROWS, PICKED_VERIFIES, ROLLBACKS, VERIFIES};

fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond/qwen3_5/model-q4_k_m.gguf")
}

fn cpu_model() -> Model {
    assert!(path().exists(), "committed fixture {} is missing", path().display());
    Model::load(&path(), &EngineConfig { threads: 2, max_ctx: 512, ..Default::default() }).unwrap()
}

/// A model whose passes run on the stand-in device.
fn device_model() -> (Model, Arc<HostDevice>) {
    let mut m = cpu_model();
    let dev = Arc::new(HostDevice::new(cpu_model()));
    m.attach_device(dev.clone()).unwrap();
    (m, dev)
}

/// A device whose memory is a second model's host states.
fn prompt(seed: usize, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((seed * 7919 + i * 104_729 + 5) % vocab) as u32).collect()
}

fn greedy(logits: &[f32]) -> u32 {
    logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn passes_on_the_device_give_the_hosts_bits_and_the_state_comes_back_whole() {
    let cpu = cpu_model();
    let (dev, stand_in) = device_model();
    let p = prompt(1, 37, cpu.n_vocab());
    let (mut a, mut b) = (cpu.new_state(), dev.new_state());
    assert!(!b.is_on_device());
    let la = cpu.forward_chunks(&mut a, &p, 16, LogitsMode::All).unwrap();
    let lb = dev.forward_chunks(&mut b, &p, 16, LogitsMode::All).unwrap();
    assert!(b.is_on_device(), "a pass moves the state onto the device");
    assert!(stand_in.passes.load(Ordering::Relaxed) >= 3, "the device ran the chunks");
    assert_eq!(bits(&la), bits(&lb));
    let mut t = greedy(&la[la.len() - cpu.n_vocab()..]);
    for _ in 0..6 {
        let la = cpu.forward(&mut a, &[t], LogitsMode::Last).unwrap();
        let lb = dev.forward(&mut b, &[t], LogitsMode::Last).unwrap();
        assert_eq!(bits(&la), bits(&lb));
        t = greedy(&la);
    }
    assert_eq!(a.pos, b.pos);
    // the host form read back is the CPU's state, byte for byte
    let back = b.to_host().unwrap();
    assert!(!back.is_on_device());
    let (ea, eb) = (format!("{:?}", a.layers), format!("{:?}", back.layers));
    assert_eq!(ea, eb);
    // a host state continued on the device, and a device state continued on the host
    let mut a2 = a.clone();
    let mut moved = a.clone();
    let l1 = cpu.forward(&mut a2, &[t, 3, 4], LogitsMode::All).unwrap();
    let l2 = dev.forward(&mut moved, &[t, 3, 4], LogitsMode::All).unwrap();
    assert_eq!(bits(&l1), bits(&l2));
    let mut back2 = b.to_host().unwrap();
    let l3 = cpu.forward(&mut back2, &[t, 3, 4], LogitsMode::All).unwrap();
    assert_eq!(bits(&l1), bits(&l3));
}

#[test]
fn checkpoints_clones_and_rollbacks_hold_on_the_device() {
    let cpu = cpu_model();
    let (dev, _) = device_model();
    let v = cpu.n_vocab();
    let p = prompt(2, 20, v);
    let mut s = dev.new_state();
    dev.forward(&mut s, &p, LogitsMode::None).unwrap();
    let ck = s.checkpoint().unwrap();
    let snap = s.clone();
    dev.forward(&mut s, &prompt(3, 9, v), LogitsMode::None).unwrap();
    // the host form at the checkpoint (the prefix cache's copy): its KV rows read back, its
    // recurrent states the checkpoint's
    let mut at = s.to_host_at(&ck).unwrap();
    assert!(!at.is_on_device());
    assert_eq!(at.pos, 20);
    s.restore_checkpoint(&ck).unwrap();
    assert_eq!(s.pos, 20);
    let mut c = cpu.new_state();
    cpu.forward(&mut c, &p, LogitsMode::None).unwrap();
    let want = cpu.forward(&mut c.clone(), &[7, 8], LogitsMode::All).unwrap();
    assert_eq!(bits(&cpu.forward(&mut at, &[7, 8], LogitsMode::All).unwrap()), bits(&want), "the host form at the checkpoint");
    assert_eq!(bits(&dev.forward(&mut s, &[7, 8], LogitsMode::All).unwrap()), bits(&want));
    let mut snap = snap;
    assert!(snap.is_on_device());
    assert_eq!(bits(&dev.forward(&mut snap, &[7, 8], LogitsMode::All).unwrap()), bits(&want));
    // a verify of 4 rows in the one-token order, then a rollback to its second
    let mut r = dev.new_state();
    dev.forward(&mut r, &p, LogitsMode::None).unwrap();
    r.keep_history(4);
    let mut step = [SeqStep { state: &mut r, tokens: &[5, 6, 9, 11], logits: LogitsMode::All, decode_order: true, hidden: false, banned: &[] }];
    dev.forward_batch(&mut step).unwrap();
    r.rollback(22).unwrap();
    let mut c2 = c.clone();
    cpu.forward(&mut c2, &[5, 6], LogitsMode::None).unwrap();
    assert_eq!(bits(&dev.forward(&mut r, &[1], LogitsMode::Last).unwrap()), bits(&cpu.forward(&mut c2, &[1], LogitsMode::Last).unwrap()));
    assert!(r.rollback(3).is_err(), "a position never kept is refused");
    // states asked to be kept while still on the host are kept on the device too
    let mut h = dev.new_state();
    h.keep_history(3);
    dev.forward(&mut h, &p, LogitsMode::None).unwrap();
    let mut step = [SeqStep { state: &mut h, tokens: &[5, 6, 9], logits: LogitsMode::All, decode_order: true, hidden: false, banned: &[] }];
    dev.forward_batch(&mut step).unwrap();
    h.rollback(21).expect("kept on the device");
    let mut c3 = c.clone();
    cpu.forward(&mut c3, &[5], LogitsMode::None).unwrap();
    assert_eq!(bits(&dev.forward(&mut h, &[1], LogitsMode::Last).unwrap()), bits(&cpu.forward(&mut c3, &[1], LogitsMode::Last).unwrap()));
}


#[test]
fn checkpoints_stay_on_the_device_where_it_has_room_and_go_through_the_host_where_not() {
    let cpu = cpu_model();
    let (dev, stand_in) = device_model();
    let v = cpu.n_vocab();
    let p = prompt(4, 18, v);
    let mut c = cpu.new_state();
    cpu.forward(&mut c, &p, LogitsMode::None).unwrap();
    let want = cpu.forward(&mut c.clone(), &[7, 8], LogitsMode::All).unwrap();
    let mut s = dev.new_state();
    dev.forward(&mut s, &p, LogitsMode::None).unwrap();
    let one = s.checkpoint().unwrap();
    assert!(one.on_device(), "room for it: kept on the device");
    // room for exactly one: a second checkpoint is read back, and room given back is used again
    stand_in.room.left.store(0, Ordering::Relaxed);
    let two = s.checkpoint().unwrap();
    assert!(!two.on_device(), "no room left: read back");
    assert_eq!(one.bytes(), two.bytes());
    stand_in.room.left.store(0, Ordering::Relaxed);
    drop(one);
    assert_eq!(stand_in.room.left.load(Ordering::Relaxed), two.bytes(), "a dropped snapshot gives its room back");
    let three = s.checkpoint().unwrap();
    assert!(three.on_device());
    dev.forward(&mut s, &prompt(6, 7, v), LogitsMode::None).unwrap();
    for ck in [&two, &three] {
        // the host form at the checkpoint (the prefix cache's copy), then the restore
        let mut at = s.to_host_at(ck).unwrap();
        assert_eq!(bits(&cpu.forward(&mut at, &[7, 8], LogitsMode::All).unwrap()), bits(&want), "host form, on_device {}", ck.on_device());
        let mut r = s.clone();
        let before = stand_in.room.restored.load(Ordering::Relaxed);
        r.restore_checkpoint(ck).unwrap();
        assert_eq!(stand_in.room.restored.load(Ordering::Relaxed) - before, usize::from(ck.on_device()), "a device copy for a snapshot");
        assert_eq!(bits(&dev.forward(&mut r, &[7, 8], LogitsMode::All).unwrap()), bits(&want), "restored, on_device {}", ck.on_device());
        // a state back in host memory takes a device snapshot's states from the host form
        let mut h = s.to_host().unwrap();
        h.restore_checkpoint(ck).unwrap();
        assert_eq!(bits(&cpu.forward(&mut h, &[7, 8], LogitsMode::All).unwrap()), bits(&want), "host state restored, on_device {}", ck.on_device());
    }
}

/// An ended request's state at its message boundary reaches the prefix cache though its
/// recurrent states sit in a device checkpoint read back off the steps' thread: a later
/// request on a slot that forgot it resumes from the cache with the tokens a fresh run gives.
#[test]
fn a_device_checkpoint_read_back_off_the_step_serves_the_next_request_from_the_prefix_cache() {
    use xwen_engine::{Engine, EngineOptions, Output};
    let cpu = cpu_model();
    let v = cpu.n_vocab();
    let (dev, stand_in) = device_model();
    let head = prompt(11, 26, v);
    let mut longer = head.clone();
    longer.extend(prompt(12, 7, v));
    let greedy = || SamplerConfig::greedy().resolve(false);
    let want = run_engine(cpu_model(), vec![EngineRequest::new(longer.clone(), 6, Vec::new(), greedy())], 1, None).remove(0);
    let cache = PrefixCache::new(&dev, 1 << 30, None).unwrap();
    let mut e = Engine::new(dev, EngineOptions { parallel: 1, draft: None, prefix: Some(cache) });
    let first = EngineRequest { checkpoints: vec![head.len()], ..EngineRequest::new(head.clone(), 3, Vec::new(), greedy()) };
    e.submit(first);
    // an unrelated one-shot request takes the one slot and empties it
    e.submit(EngineRequest { one_shot: true, ..EngineRequest::new(prompt(13, 9, v), 2, Vec::new(), greedy()) });
    let id = e.submit(EngineRequest::new(longer, 6, Vec::new(), greedy()));
    let (mut got, mut cached) = (Vec::new(), None);
    while e.has_work() {
        for (i, o) in e.step() {
            match o {
                Output::Started { cached: c } if i == id => cached = Some(c),
                Output::Token { id: t, .. } if i == id => got.push(t),
                Output::Failed(m) => panic!("request {i} failed: {m}"),
                _ => {}
            }
        }
    }
    assert!(stand_in.room.taken.load(Ordering::Relaxed) > 0, "the boundary's checkpoint stayed on the device");
    // (the boundary of a prompt ending at head.len() is the state before its last token)
    assert_eq!(cached, Some(head.len() - 1), "the prefix came from the cache");
    assert_eq!(got, want);
}

fn requests(v: usize) -> Vec<EngineRequest> {
    [(9, 7), (30, 5), (3, 9), (14, 4), (22, 6)]
        .iter()
        .enumerate()
        .map(|(i, &(len, n))| EngineRequest { prefill_chunk: 8, ..EngineRequest::new(prompt(i, len, v), n, Vec::new(), SamplerConfig::greedy().resolve(false)) })
        .collect()
}

#[test]
fn an_engine_on_the_device_gives_each_request_the_cpus_tokens() {
    let cpu = cpu_model();
    let v = cpu.n_vocab();
    let want = run_engine(cpu, requests(v), 3, None);
    let (dev, host) = device_model();
    let prefix = PrefixCache::new(&dev, 1 << 30, None).unwrap();
    assert_eq!(run_engine(dev, requests(v), 3, Some(prefix)), want);
    // three slots decoding at once came to the device as decode batches (of its two rows at most)
    assert_eq!(host.widest.load(Ordering::Relaxed), MAX_ROWS, "the slots' decode rows were batched");
    // the requests' prompt chunks that ran in one step came to the device together
    assert_eq!(host.widest_prompts.load(Ordering::Relaxed), 3, "the step's prompt spans were not handed over together");
    // and the engine had the device make those batches ready before the first request
    assert_eq!(host.prepared.load(Ordering::Relaxed), MAX_ROWS, "the decode batches were not prepared at start");
}

/// A greedy request whose logit bias bans tokens (as `ignore_eos` bans the end-of-generation
/// ones) gets the sampler's tokens on the device — the device's argmax skips the banned ids —
/// and its decode rows come back as one id each, not as logits.
#[test]
fn greedy_rows_with_banned_tokens_take_the_devices_argmax_and_the_samplers_tokens() {
    let v = cpu_model().n_vocab();
    // ban what plain greedy picks first and second, so the bans change every reply
    let plain = run_engine(cpu_model(), requests(v), 3, None);
    let banned = |i: usize| -> Vec<(u32, f32)> { plain[i][..2].iter().map(|&t| (t, f32::NEG_INFINITY)).collect() };
    let with_bans = || -> Vec<EngineRequest> {
        requests(v)
            .into_iter()
            .enumerate()
            .map(|(i, mut r)| {
                r.sampling.logit_bias = banned(i);
                r
            })
            .collect()
    };
    let want = run_engine(cpu_model(), with_bans(), 3, None);
    for (i, w) in want.iter().enumerate() {
        assert!(w.iter().all(|t| !plain[i][..2].contains(t)), "request {i}: a banned token was sampled");
    }
    assert_ne!(want, plain, "the bans changed nothing");
    let (dev, host) = device_model();
    assert_eq!(run_engine(dev, with_bans(), 3, None), want);
    assert_eq!(host.logit_rows.load(Ordering::Relaxed), 0, "a banned-greedy decode row copied its logits back");
    // a bias that is not a ban leaves the row to the sampler: its logits come back
    let (dev, host) = device_model();
    let mut reqs = requests(v);
    reqs[0].sampling.logit_bias = vec![(plain[0][0], -2.5)];
    run_engine(dev, reqs, 3, None);
    assert!(host.logit_rows.load(Ordering::Relaxed) > 0, "a biased row took the argmax path");
}

#[test]
fn drafted_output_on_the_device_is_plain_greedy() {
    let cpu = cpu_model();
    let v = cpu.n_vocab();
    let p = prompt(5, 12, v);
    let plain = run_engine(cpu, vec![EngineRequest::new(p.clone(), 24, Vec::new(), SamplerConfig::greedy().resolve(false))], 1, None).remove(0);
    for depth in [1, 4] {
        // always right (a verify of depth + 1 rows accepted whole), always wrong (a rollback
        // after every verify)
        let drafters: Vec<Box<dyn xwen_engine::Drafter>> = vec![Box::new(ReplayDrafter::new(plain.clone())), Box::new(ContraryDrafter::new(v))];
        for d in drafters {
            let (dev, stand_in) = device_model();
            let (v0, r0, p0) = (VERIFIES.load(Ordering::Relaxed), ROLLBACKS.load(Ordering::Relaxed), PICKED_VERIFIES.load(Ordering::Relaxed));
            let contrary = d.name() == "contrary";
            let req = EngineRequest { draft: Some((d, depth)), ..EngineRequest::new(p.clone(), 24, Vec::new(), SamplerConfig::greedy().resolve(false)) };
            assert_eq!(run_engine(dev, vec![req], 1, None).remove(0), plain, "depth {depth}");
            assert!(VERIFIES.load(Ordering::Relaxed) > v0, "the drafts were verified on the device");
            // greedy: the device picked each verified row's token (no logits came back)
            assert!(PICKED_VERIFIES.load(Ordering::Relaxed) > p0, "a greedy verify's rows were not picked on the device");
            // and made its verifies ready when the drafted request came in
            assert_eq!(stand_in.prepared_verifies.load(Ordering::Relaxed), (depth + 1).min(MAX_ROWS), "depth {depth}: the verifies were not prepared");
            // and the sequence reserved its kept states (made when its state went to the device)
            assert_eq!(stand_in.room.reserved_kept.load(Ordering::Relaxed), depth, "depth {depth}: the kept states were not reserved");
            if contrary {
                assert!(ROLLBACKS.load(Ordering::Relaxed) > r0, "wrong drafts were rolled back on the device");
            }
        }
    }
}

#[test]
fn what_the_device_does_not_compute_is_refused() {
    let (mut dev, _) = device_model();
    // (a step's hidden rows do come back from a device that collects them: the CPU's bits)
    let cpu = cpu_model();
    let (mut s, mut c) = (dev.new_state(), cpu.new_state());
    let mut step = [SeqStep { state: &mut s, tokens: &[1, 2], logits: LogitsMode::All, decode_order: false, hidden: true, banned: &[] }];
    let on_dev = dev.forward_batch_each(&mut step).unwrap().pop().unwrap().unwrap();
    let mut step = [SeqStep { state: &mut c, tokens: &[1, 2], logits: LogitsMode::All, decode_order: false, hidden: true, banned: &[] }];
    let on_cpu = cpu.forward_batch_each(&mut step).unwrap().pop().unwrap().unwrap();
    assert_eq!(bits(&on_dev.hidden), bits(&on_cpu.hidden), "hidden rows from the device");
    assert_eq!(on_dev.hidden.len(), 2 * cpu.hidden_width());
    let e = dev.attach_dflash(&path()).unwrap_err().to_string();
    assert!(e.contains("not on the device"), "{e}");
    let mut budgeted = Model::load(&path(), &EngineConfig { threads: 2, max_ctx: 512, ram_budget: Some(1 << 30), ..Default::default() }).unwrap();
    let stand_in = Arc::new(HostDevice::new(cpu_model()));
    assert!(budgeted.attach_device(stand_in.clone()).is_err(), "a RAM plan is the CPU's");
    let mut q8 = Model::load(&path(), &EngineConfig { threads: 2, max_ctx: 512, kv_types: (xwen_engine::KvType::Q8_0, xwen_engine::KvType::Q8_0), ..Default::default() }).unwrap();
    assert!(q8.attach_device(stand_in).is_err(), "the device keeps f16 rows");
}

#[test]
fn a_device_state_in_the_prefix_cache_continues_from_ram_and_from_disk() {
    let cpu = cpu_model();
    let (dev, _) = device_model();
    let v = cpu.n_vocab();
    let p = prompt(8, 40, v);
    let (head, tail) = p.split_at(29);
    let mut c = cpu.new_state();
    cpu.forward(&mut c, head, LogitsMode::Last).unwrap();
    let want = cpu.forward(&mut c, tail, LogitsMode::All).unwrap();
    let mut st = dev.new_state();
    dev.forward(&mut st, head, LogitsMode::Last).unwrap();
    assert!(st.is_on_device());
    let dir = std::env::temp_dir().join(format!("xwen-device-prefix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cache = PrefixCache::new(&dev, 1 << 30, Some(&dir)).unwrap();
    cache.insert(head, st);
    let hit = cache.lookup(&dev, &p, 0).expect("the prefix is cached");
    // entries are kept in host memory; a device model's hit is uploaded from the entry (no host copy)
    assert!(hit.state.is_on_device(), "a hit for a model on a device goes straight to it");
    let mut s = hit.state;
    assert_eq!(bits(&dev.forward(&mut s, tail, LogitsMode::All).unwrap()), bits(&want), "from RAM");
    // the entry is still there for the next hit, and the CPU model takes a host copy of it
    let again = cache.lookup(&cpu, &p, 0).expect("still cached");
    assert!(!again.state.is_on_device());
    let mut h = again.state;
    assert_eq!(bits(&cpu.forward(&mut h, tail, LogitsMode::All).unwrap()), bits(&want), "a host copy for the CPU");
    cache.flush();
    drop(cache);
    let mut cache = PrefixCache::new(&dev, 1 << 30, Some(&dir)).unwrap();
    let hit = cache.lookup(&dev, &p, 0).expect("the prefix survives a restart");
    assert!(hit.from_disk);
    let mut s = hit.state;
    assert_eq!(bits(&dev.forward(&mut s, tail, LogitsMode::All).unwrap()), bits(&want), "from disk");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An MTP head on the device: the steps' final hidden rows come back from the device
/// (`DeviceSeq::collect_hidden`), the head's state lives there and its draft steps run there
/// (`DeviceModel::mtp_forward`). Drafting gives plain greedy output, its drafts accepted as
/// often as the CPU head's (the stand-in computes as the CPU does), alone and on the engine's slots.
#[test]
fn an_mtp_head_on_the_device_drafts_as_the_cpus_does() {
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let moe = fx.join("parity/cond/qwen3_5_moe/model-q4_k_m.gguf");
    let cfg = EngineConfig { threads: 2, max_ctx: 512, mtp_sidecar: Some(fx.join("mtp/cond-qwen35moe/mtp-q8_0.gguf")), ..Default::default() };
    let cpu = Model::load(&moe, &cfg).unwrap();
    let mut m = Model::load(&moe, &cfg).unwrap();
    m.attach_device(Arc::new(HostDevice::new(Model::load(&moe, &cfg).unwrap()))).unwrap();
    assert!(m.has_mtp(), "the head is the device's");
    let p = prompt(5, 13, cpu.n_vocab());
    let greedy = || xwen_engine::Sampler::new(SamplerConfig::greedy().resolve(false));
    let run = |model: &Model, drafted: bool| {
        let mut out = Vec::new();
        let req = xwen_engine::GenerateRequest { prompt: &p, max_tokens: Some(32), stop_ids: &[], prefill_chunk: 0 };
        let mut d = xwen_engine::MtpDrafter::new();
        let stats = if drafted {
            xwen_engine::generate_speculative(model, &mut model.new_state(), &req, &mut d, 4, &mut greedy(), &mut |_, _| true, &mut |t| {
                out.push(t);
                true
            })
            .unwrap()
            .1
        } else {
            xwen_engine::generate(model, &mut model.new_state(), &req, &mut greedy(), &mut |t| {
                out.push(t);
                true
            })
            .unwrap();
            xwen_engine::SpecStats::default()
        };
        (out, stats)
    };
    let (want, _) = run(&cpu, false);
    let before = host_device::MTP_PASSES.load(Ordering::Relaxed);
    let (on_cpu, sc) = run(&cpu, true);
    let (on_dev, sd) = run(&m, true);
    assert_eq!(on_cpu, want);
    assert_eq!(on_dev, want, "drafted on the device: not plain greedy");
    assert!(host_device::MTP_PASSES.load(Ordering::Relaxed) > before, "the head ran on the device");
    assert!(sd.drafted() > 0);
    // (the depth the controller picks follows measured costs, so the counts may differ a little)
    assert!((sd.acceptance() - sc.acceptance()).abs() <= 0.15, "the device's drafts are the CPU head's: {sd:?} against {sc:?}");
    // three requests drafting at once on the engine's slots, each giving its tokens alone
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(11 + i, 9 + 4 * i, cpu.n_vocab())).collect();
    let req = |p: &Vec<u32>, drafted: bool| EngineRequest {
        prefill_chunk: 8,
        draft: drafted.then(|| (Box::new(xwen_engine::MtpDrafter::new()) as Box<dyn xwen_engine::Drafter>, 3)),
        ..EngineRequest::new(p.clone(), 20, Vec::new(), SamplerConfig::greedy().resolve(false))
    };
    let alone = run_engine(cpu, prompts.iter().map(|p| req(p, false)).collect(), 1, None);
    let together = run_engine(m, prompts.iter().map(|p| req(p, true)).collect(), 3, None);
    assert_eq!(together, alone, "MTP-drafted requests on the device's slots");
}
