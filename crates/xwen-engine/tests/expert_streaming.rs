//! Routed experts streamed from disk under a RAM budget (`EngineConfig::ram_budget`): the same
//! logits, bit for bit, as the experts read from the mapping, with a cache small enough that
//! experts are evicted and read again; budgets under the floor refused; a file that loses its
//! experts under a running model failing the forward pass with an error, not a panic.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use xwen_engine::{EngineConfig, EngineError, LogitsMode, Model};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// MoE GGUFs to check: the committed random-weight fixtures.
fn moe_files() -> Vec<PathBuf> {
    let v = vec![
        repo_root().join("tests/fixtures/parity/cond/qwen3_5_moe/model-q4_k_m.gguf"),
        repo_root().join("tests/fixtures/parity/cond/qwen3_5_moe/model-q8_0.gguf"),
        repo_root().join("tests/fixtures/parity/cond/qwen3_next/model-q4_k_m.gguf"),
        repo_root().join("tests/fixtures/parity/cond/kimi_linear/model-q8_0.gguf"),
        repo_root().join("tests/fixtures/parity/cond/kimi_k3/model-q8_0.gguf"),
    ];
    for f in &v {
        assert!(f.exists(), "committed fixture {} is missing", f.display());
    }
    v
}

/// The trained tiny MoE from ../shared/models (its tests are ignored where it is absent).
fn trained_moe() -> PathBuf {
    let p = repo_root().join("../shared/models/gguf/tiny-qwen35moe-q4_k_m.gguf");
    assert!(p.exists(), "{} is missing", p.display());
    p
}

fn cfg(budget: Option<u64>) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 4096, ram_budget: budget, ..Default::default() }
}

/// The floor this model plans for under `cfg`, and the bytes of one cached expert.
fn floor_and_record(path: &Path) -> (u64, u64) {
    let m = Model::load(path, &cfg(Some(1 << 50))).expect("an ample budget loads");
    let p = m.memory_plan().expect("a budget gives a plan");
    assert!(m.streams_experts());
    (p.floor(), p.record_bytes)
}

/// Prompt logits (every position) then `steps` greedy decode steps' logits.
fn run(m: &Model, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut st = m.new_state();
    let mut out = vec![m.forward(&mut st, prompt, LogitsMode::All).unwrap()];
    for _ in 0..steps {
        let last = out.last().unwrap();
        let row = &last[last.len() - m.n_vocab()..];
        let tok = row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
        out.push(m.forward(&mut st, &[tok], LogitsMode::Last).unwrap());
    }
    out
}

fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

#[test]
fn streamed_experts_give_the_resident_logits_bit_for_bit() {
    for path in moe_files() {
        streamed_gives_resident_bits(&path);
    }
}

#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn streamed_experts_give_the_resident_logits_bit_for_bit_on_the_trained_moe() {
    streamed_gives_resident_bits(&trained_moe());
}

fn streamed_gives_resident_bits(path: &Path) {
    {
        let resident = Model::load(&path, &cfg(None)).unwrap();
        assert!(!resident.streams_experts() && resident.memory_plan().is_none());
        let p = prompt(40, resident.n_vocab());
        let want = run(&resident, &p, 8);

        // a cache of the smallest size plus one expert: every layer evicts
        let (floor, record) = floor_and_record(&path);
        let streamed = Model::load(&path, &cfg(Some(floor + record))).unwrap();
        assert!(streamed.streams_experts());
        let plan = streamed.memory_plan().unwrap().clone();
        assert!(plan.cache_bytes >= plan.min_cache_bytes && plan.cache_bytes < plan.all_experts_bytes);
        let got = run(&streamed, &p, 8);
        assert_eq!(want.len(), got.len());
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let same = w.len() == g.len() && w.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{}: step {i} logits differ between resident and streamed experts", path.display());
        }
        let s = streamed.expert_cache_stats().expect("a streaming store counts");
        assert!(s.misses > 0 && s.evictions > 0, "{}: {s:?}", path.display());
        assert!(s.cached_bytes <= s.capacity_bytes && s.capacity_bytes == plan.cache_bytes, "{s:?}");
        assert!(s.bytes_read >= s.misses * plan.record_bytes / 2, "{s:?}");
        eprintln!(
            "{}: {} hits, {} misses, {} evictions, {:.1} MB read, direct I/O {}",
            path.file_name().unwrap().to_string_lossy(),
            s.hits,
            s.misses,
            s.evictions,
            s.bytes_read as f64 / 1e6,
            s.direct_io
        );

        // a cache holding every expert: after the first pass, decode only hits
        let full = Model::load(&path, &cfg(Some(1 << 50))).unwrap();
        let got = run(&full, &p, 2);
        full.reset_expert_cache_stats();
        let again = run(&full, &p, 2);
        assert_eq!(got, again);
        let s = full.expert_cache_stats().unwrap();
        assert_eq!(s.misses, 0, "{s:?}");
        assert!(s.hits > 0);
    }
}

/// A streamed decode reads the next layer's guessed experts ahead (`ExpertStore::prefetch`):
/// reads do happen, the budget holds, and the logits are the resident run's and the run's
/// without read-ahead, bit for bit — on the trained tiny MoE, whose router guesses are good.
#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn reading_ahead_changes_which_reads_happen_and_no_bit_of_the_output() {
    let path = trained_moe();
    let resident = Model::load(&path, &cfg(None)).unwrap();
    let p = prompt(12, resident.n_vocab());
    let want = run(&resident, &p, 24);
    let (floor, record) = floor_and_record(&path);
    // about a quarter of the 96 experts cached
    let budget = floor + 20 * record;
    let mut runs = Vec::new();
    for prefetch in [true, false] {
        let m = Model::load(&path, &EngineConfig { expert_prefetch: prefetch, ..cfg(Some(budget)) }).unwrap();
        let got = run(&m, &p, 24);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert!(w.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits()), "prefetch {prefetch}: step {i} differs from the resident run");
        }
        let s = m.expert_cache_stats().unwrap();
        assert!(s.cached_bytes <= s.capacity_bytes, "{s:?}");
        runs.push(s);
    }
    let (on, off) = (runs[0], runs[1]);
    assert!(on.prefetch_reads > 0 && on.prefetch_used > 0, "nothing was read ahead: {on:?}");
    assert!(on.prefetch_used <= on.prefetch_reads && on.prefetch_waited <= on.prefetch_used, "{on:?}");
    assert_eq!((off.prefetch_reads, off.prefetch_used), (0, 0), "{off:?}");
}

#[test]
fn prompts_longer_than_a_batch_run_in_batches_under_a_budget() {
    let path = &moe_files()[0];
    let resident = Model::load(path, &cfg(None)).unwrap();
    let (floor, record) = floor_and_record(path);
    let streamed = Model::load(path, &cfg(Some(floor + 4 * record))).unwrap();
    let p = prompt(xwen_engine::memory_plan::PREFILL_BATCH + 37, resident.n_vocab());
    let want = resident.forward(&mut resident.new_state(), &p, LogitsMode::All).unwrap();
    let mut st = streamed.new_state();
    let got = streamed.forward(&mut st, &p, LogitsMode::All).unwrap();
    assert_eq!(st.pos, p.len());
    assert_eq!(got.len(), want.len());
    // the second batch's products see fewer tokens, so a routed expert may take another
    // kernel's float order (as llama.cpp's 512-token micro-batches do): close, not identical
    assert!(rel_l2(&want, &got) < 1e-3, "rel-L2 {}", rel_l2(&want, &got));
    // Last: the final batch's last row (the lm_head then runs on one row: a matvec's order)
    let last = streamed.forward(&mut streamed.new_state(), &p, LogitsMode::Last).unwrap();
    let tail = &got[got.len() - streamed.n_vocab()..];
    assert!(last.len() == tail.len() && rel_l2(tail, &last) < 1e-3, "rel-L2 {}", rel_l2(tail, &last));
}

fn rel_l2(want: &[f32], got: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in want.iter().zip(got) {
        num += ((a - b) as f64).powi(2);
        den += (*a as f64).powi(2);
    }
    (num / den).sqrt()
}

#[test]
fn a_budget_under_the_floor_is_refused_with_its_parts() {
    let path = &moe_files()[0];
    let (floor, _) = floor_and_record(path);
    for budget in [1, floor - 1] {
        match Model::load(path, &cfg(Some(budget))) {
            Err(EngineError::RamBudget(msg)) => {
                assert!(msg.contains("floor") && msg.contains("trunk") && msg.contains("expert cache"), "{msg}")
            }
            Err(e) => panic!("budget {budget}: wrong error {e}"),
            Ok(_) => panic!("budget {budget} under the floor {floor} was accepted"),
        }
    }
    assert!(Model::load(path, &cfg(Some(floor))).is_ok());
}

#[test]
fn an_automatic_budget_takes_a_share_of_ram() {
    let path = &moe_files()[0];
    let m = Model::load(path, &cfg(Some(0))).unwrap();
    let p = m.memory_plan().unwrap();
    assert!(p.auto && p.budget >= p.floor());
    // a tiny model fits whole: the cache holds every expert
    assert_eq!(p.cache_bytes, p.all_experts_bytes);
    assert!(p.summary().contains("automatic"), "{}", p.summary());
}

#[test]
fn a_dense_model_under_a_budget_streams_nothing() {
    let path = repo_root().join("tests/fixtures/parity/cond/qwen3_5/model-q4_k_m.gguf");
    let m = Model::load(&path, &cfg(Some(1 << 40))).unwrap();
    assert!(!m.streams_experts() && m.expert_cache_stats().is_none());
    assert_eq!(m.memory_plan().unwrap().record_bytes, 0);
    assert!(matches!(Model::load(&path, &cfg(Some(1 << 20))), Err(EngineError::RamBudget(_))));
}

#[test]
fn an_in_memory_moe_model_cannot_stream() {
    let path = &moe_files()[0];
    let file = Arc::new(xwen_gguf::GgufFile::from_bytes(std::fs::read(path).unwrap()).unwrap());
    match Model::from_gguf(file, &cfg(Some(1 << 40))) {
        Err(EngineError::RamBudget(msg)) => assert!(msg.contains("path"), "{msg}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("an in-memory MoE model cannot stream experts from a file"),
    }
}

#[test]
fn experts_missing_from_the_file_fail_the_forward_pass_cleanly() {
    let path = &moe_files()[0];
    let bytes = std::fs::read(path).unwrap();
    let file = Arc::new(xwen_gguf::GgufFile::from_bytes(bytes.clone()).unwrap());
    // the experts stream from a copy cut short after its first expert stack: the mapping the
    // trunk reads stays whole, the store's reads run past the end
    let first_exps = file.tensors().iter().filter(|t| t.name.ends_with("_exps.weight")).map(|t| t.offset).min().unwrap();
    let cut = file.data_offset() + first_exps + 100;
    let short = std::env::temp_dir().join(format!("xwen-short-{}.gguf", std::process::id()));
    std::fs::write(&short, &bytes[..cut as usize]).unwrap();
    let (floor, record) = floor_and_record(path);
    let m = Model::from_gguf_at(file, Some(&short), &cfg(Some(floor + record))).unwrap();
    for n in [1usize, 12] {
        let mut st = m.new_state();
        match m.forward(&mut st, &prompt(n, m.n_vocab()), LogitsMode::Last) {
            Err(EngineError::ExpertStore(msg)) => assert!(msg.contains("reading expert"), "{msg}"),
            Err(e) => panic!("wrong error {e}"),
            Ok(_) => panic!("a forward pass over experts the file no longer holds succeeded"),
        }
    }
    std::fs::remove_file(&short).unwrap();
}

/// A budget whose cache holds every expert reads them all in once, in the background: soon
/// after load the cache holds them all, and decoding then reads nothing more from the disk —
/// with the resident run's logits.
#[test]
fn a_cache_that_holds_every_expert_is_read_in_in_the_background() {
    let path = &moe_files()[1];
    let resident = Model::load(path, &cfg(None)).unwrap();
    let p = prompt(16, resident.n_vocab());
    let want = run(&resident, &p, 4);
    let plan = Model::load(path, &cfg(Some(1 << 50))).unwrap().memory_plan().unwrap().clone();
    let m = Model::load(path, &cfg(Some(plan.floor() - plan.min_cache_bytes + plan.all_experts_bytes))).unwrap();
    assert!(m.streams_experts() && m.memory_plan().unwrap().cache_bytes >= plan.all_experts_bytes);
    // the read-in is done when the cache stops growing (a poll 50 ms after another)
    let t0 = std::time::Instant::now();
    let mut last = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = m.expert_cache_stats().unwrap().cached_bytes;
        if now > 0 && now == last {
            break;
        }
        last = now;
        assert!(t0.elapsed().as_secs() < 30, "the background read-in did not settle: {:?}", m.expert_cache_stats());
    }
    let before = m.expert_cache_stats().unwrap();
    let got = run(&m, &p, 4);
    let after = m.expert_cache_stats().unwrap();
    assert_eq!(after.bytes_read, before.bytes_read, "decode read experts a full cache holds");
    assert_eq!(after.misses, before.misses);
    for (a, b) in got.iter().zip(&want) {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "logits differ from the resident run");
    }
}

/// Prompt logits fed in `PREFILL_BATCH` chunks one by one (every position).
fn chunk_by_chunk(m: &Model, p: &[u32]) -> Vec<f32> {
    chunk_by_chunk_into(m, &mut m.new_state(), p)
}

/// A prompt of several batches under a budget passes each layer as one wave: every chunk's
/// logits are the bits feeding the chunks one by one gives (mapped or streamed), decode after
/// it goes on the same, and a wave reads each expert at most once per layer — where the
/// chunks fed one by one read an evicted expert again for each.
#[test]
fn a_long_prompt_passes_each_layer_as_one_wave_reading_each_expert_once() {
    // (K3 too: its residual attention mixes and banks the wave's rows before its mixers)
    for path in moe_files().iter() {
        one_wave_reads_each_expert_once(path);
    }
}

#[test]
#[cfg_attr(xwen_no_shared_models, ignore = "needs ../shared/models beside the repository (README.md, \"Tests\")")]
fn a_long_prompt_passes_each_layer_as_one_wave_on_the_trained_moe() {
    one_wave_reads_each_expert_once(&trained_moe());
}

fn one_wave_reads_each_expert_once(path: &Path) {
    use xwen_engine::memory_plan::{PREFILL_BATCH, PREFILL_WAVE_BATCHES};
    {
        let resident = Model::load(path, &cfg(None)).unwrap();
        let p = prompt(PREFILL_WAVE_BATCHES * PREFILL_BATCH + 3 * PREFILL_BATCH / 2 + 1, resident.n_vocab());
        let want = chunk_by_chunk(&resident, &p);
        // a budget whose cache holds about a third of the experts beside the widest wave,
        // asked for (on these tiny geometries the wave outweighs every expert)
        let ample = Model::load(path, &cfg(Some(1 << 50))).unwrap().memory_plan().unwrap().clone();
        let budget = ample.floor() + ample.wave_bytes + ample.all_experts_bytes / 3;
        let c = EngineConfig { prefill_wave: Some(PREFILL_WAVE_BATCHES), ..cfg(Some(budget)) };
        let streamed = Model::load(path, &c).unwrap();
        let plan = streamed.memory_plan().unwrap().clone();
        assert_eq!(plan.wave_rows, PREFILL_WAVE_BATCHES * PREFILL_BATCH, "{}: {}", path.display(), plan.summary());
        assert!(plan.cache_bytes < plan.all_experts_bytes && plan.summary().contains("prefill wave"), "{}", plan.summary());
        let (n_expert, _, n_moe) = streamed.moe_geometry().unwrap();
        streamed.reset_expert_cache_stats();
        let mut st = streamed.new_state();
        let got = streamed.forward(&mut st, &p, LogitsMode::All).unwrap();
        let waved = streamed.expert_cache_stats().unwrap();
        assert_eq!(st.pos, p.len());
        assert!(got == want, "{}: a wave's logits differ from the chunks fed one by one", path.display());
        // each expert at most once per layer and wave (prefetch is decode's only)
        let waves = p.len().div_ceil(plan.wave_rows) as u64;
        assert!(waved.reads <= waves * (n_moe * n_expert) as u64, "{}: {waved:?}", path.display());
        // decode goes on from the wave's state with the chunked run's bits
        let tok = [p[3]];
        let mut st2 = resident.new_state();
        chunk_by_chunk_into(&resident, &mut st2, &p);
        assert!(streamed.forward(&mut st, &tok, LogitsMode::Last).unwrap() == resident.forward(&mut st2, &tok, LogitsMode::Last).unwrap());

        // the same prompt chunk by chunk through the streamed model: more reads
        streamed.reset_expert_cache_stats();
        let chunked = chunk_by_chunk(&streamed, &p);
        assert!(chunked == want);
        let fed = streamed.expert_cache_stats().unwrap();
        eprintln!("{}: wave reads {} vs chunk by chunk {} ({} experts a layer)", path.display(), waved.reads, fed.reads, n_expert);
        assert!(waved.reads < fed.reads, "{}: {waved:?} vs {fed:?}", path.display());
    }
}

/// `chunk_by_chunk` into a given state.
fn chunk_by_chunk_into(m: &Model, st: &mut xwen_engine::SeqState, p: &[u32]) -> Vec<f32> {
    let mut out = Vec::new();
    for c in p.chunks(xwen_engine::memory_plan::PREFILL_BATCH) {
        let mut step = [xwen_engine::SeqStep::new(st, c, LogitsMode::All)];
        out.extend(m.forward_batch(&mut step).unwrap().pop().unwrap());
    }
    out
}

/// Several sequences' prompt chunks in one streamed step share their experts' reads (each
/// expert at most once per layer) and each gets the logits it gets alone.
#[test]
fn prompt_chunks_of_several_sequences_in_one_step_read_each_expert_once() {
    let path = &moe_files()[0];
    let c = |b| EngineConfig { n_seq: 3, ..cfg(b) };
    let floor = Model::load(path, &c(Some(1 << 50))).unwrap().memory_plan().unwrap().floor();
    let (_, record) = floor_and_record(path);
    let m = Model::load(path, &c(Some(floor + record))).unwrap();
    let (n_expert, _, n_moe) = m.moe_geometry().unwrap();
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(40 + 9 * i, m.n_vocab()).into_iter().map(|t| (t + i as u32 * 31) % m.n_vocab() as u32).collect()).collect();
    let alone: Vec<Vec<f32>> = prompts.iter().map(|p| m.forward(&mut m.new_state(), p, LogitsMode::All).unwrap()).collect();
    let mut states: Vec<_> = prompts.iter().map(|_| m.new_state()).collect();
    m.reset_expert_cache_stats();
    let mut steps: Vec<_> = states.iter_mut().zip(&prompts).map(|(s, p)| xwen_engine::SeqStep::new(s, p, LogitsMode::All)).collect();
    let together = m.forward_batch(&mut steps).unwrap();
    let stats = m.expert_cache_stats().unwrap();
    assert!(together == alone, "a sequence's logits depend on what shares its step");
    assert!(stats.reads <= (n_moe * n_expert) as u64, "{stats:?}");
}

/// A micro-batch other than 512 (`forward_chunks`, llama.cpp's -ub): a wave of 200-token
/// chunks gives each chunk the bits feeding them one by one gives.
#[test]
fn a_wave_of_smaller_chunks_keeps_each_chunks_bits() {
    use xwen_engine::memory_plan::PREFILL_WAVE_BATCHES;
    let path = &moe_files()[0];
    let resident = Model::load(path, &cfg(None)).unwrap();
    let p = prompt(1234, resident.n_vocab());
    let mut st = resident.new_state();
    let mut want = Vec::new();
    for c in p.chunks(200) {
        let mut step = [xwen_engine::SeqStep::new(&mut st, c, LogitsMode::All)];
        want.extend(resident.forward_batch(&mut step).unwrap().pop().unwrap());
    }
    let ample = Model::load(path, &cfg(Some(1 << 50))).unwrap().memory_plan().unwrap().clone();
    let budget = ample.floor() + ample.wave_bytes + ample.all_experts_bytes / 3;
    let m = Model::load(path, &EngineConfig { prefill_wave: Some(PREFILL_WAVE_BATCHES), ..cfg(Some(budget)) }).unwrap();
    assert_eq!(m.wave_tokens(200), 2000, "as many whole chunks as the wave's rows hold");
    let mut st = m.new_state();
    assert!(m.forward_chunks(&mut st, &p, 200, LogitsMode::All).unwrap() == want);
    // Last: the final chunk's last row only (the lm head then takes one row: its own order)
    let mut st = resident.new_state();
    let mut want_last = Vec::new();
    for (i, c) in p.chunks(200).enumerate() {
        let mode = if (i + 1) * 200 >= p.len() { LogitsMode::Last } else { LogitsMode::None };
        let mut step = [xwen_engine::SeqStep::new(&mut st, c, mode)];
        want_last = resident.forward_batch(&mut step).unwrap().pop().unwrap();
    }
    let last = m.forward_chunks(&mut m.new_state(), &p, 200, LogitsMode::Last).unwrap();
    assert!(last == want_last && last.len() == m.n_vocab());
}

/// The engine (what `xwen serve` steps) feeds a long prompt that has the step to itself as
/// prefill waves: the tokens are those of the mapped model fed chunk by chunk, and the experts
/// are read fewer times than with one chunk a step (`--prefill-wave 1`). Two long prompts
/// queued together each get their waves in turn, and the same tokens as alone.
#[test]
fn the_scheduler_feeds_a_lone_long_prompt_as_prefill_waves() {
    use std::sync::Arc;
    use xwen_engine::memory_plan::{PREFILL_BATCH, PREFILL_WAVE_BATCHES};
    use xwen_engine::{Engine, EngineOptions, EngineRequest, Output, SamplerConfig};
    let path = &moe_files()[0];
    let resident = Arc::new(Model::load(path, &cfg(None)).unwrap());
    let v = resident.n_vocab() as u32;
    let prompts: Vec<Vec<u32>> = [PREFILL_WAVE_BATCHES * PREFILL_BATCH + 300, 3 * PREFILL_BATCH / 2 + 7]
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(n, v as usize).into_iter().map(|t| (t + 97 * i as u32) % v).collect())
        .collect();
    // every request's tokens (up to `max_tokens`) and the step count, all submitted before the
    // first step
    let run_for = |m: &Arc<Model>, ps: &[Vec<u32>], max_tokens: usize| -> (Vec<Vec<u32>>, usize) {
        let mut e = Engine::new(m.clone(), EngineOptions { parallel: 4, draft: None, prefix: None });
        let ids: Vec<u64> =
            ps.iter().map(|p| e.submit(EngineRequest { one_shot: true, ..EngineRequest::new(p.clone(), max_tokens, vec![], SamplerConfig::greedy().resolve(false)) })).collect();
        let mut out = vec![Vec::new(); ps.len()];
        let mut steps = 0;
        while e.has_work() {
            for (id, o) in e.step() {
                match o {
                    Output::Token { id: token, .. } => out[ids.iter().position(|&i| i == id).unwrap()].push(token),
                    Output::Failed(error) => panic!("{error}"),
                    _ => {}
                }
            }
            steps += 1;
        }
        (out, steps)
    };
    let run = |m: &Arc<Model>, ps: &[Vec<u32>]| run_for(m, ps, 5);
    let alone: Vec<Vec<u32>> = prompts.iter().map(|p| run(&resident, std::slice::from_ref(p)).0.remove(0)).collect();
    let two = |b| EngineConfig { n_seq: 2, ..cfg(b) };
    let ample = Model::load(path, &two(Some(1 << 50))).unwrap().memory_plan().unwrap().clone();
    let budget = ample.floor() + ample.wave_bytes + ample.all_experts_bytes / 3;
    let load = |w| Arc::new(Model::load(path, &EngineConfig { prefill_wave: Some(w), ..two(Some(budget)) }).unwrap());
    let (waved, chunked) = (load(PREFILL_WAVE_BATCHES), load(1));
    assert!(waved.wave_tokens(PREFILL_BATCH) == PREFILL_WAVE_BATCHES * PREFILL_BATCH && chunked.wave_tokens(PREFILL_BATCH) == PREFILL_BATCH);
    for (m, waves) in [(&waved, true), (&chunked, false)] {
        m.reset_expert_cache_stats();
        let (got, steps) = run(m, &prompts[..1]);
        assert_eq!(got[0], alone[0], "the long prompt's tokens differ (wave {waves})");
        // 5 chunks: two steps as waves (4 chunks, then 1), five one by one; then 4 decodes
        assert_eq!(steps, if waves { 2 } else { 5 } + 4, "wave {waves}");
        let (got, _) = run(m, &prompts);
        assert_eq!(got, alone, "two queued long prompts (wave {waves})");
    }
    // cold caches of the same size: the wave's rows come out of the budget, so the model fed
    // one chunk a step gets that much less
    let wave_bytes = waved.memory_plan().unwrap().wave_bytes;
    drop((waved, chunked));
    let waved = load(PREFILL_WAVE_BATCHES);
    let chunked = Arc::new(Model::load(path, &EngineConfig { prefill_wave: Some(1), ..two(Some(budget - wave_bytes)) }).unwrap());
    assert_eq!(waved.memory_plan().unwrap().cache_bytes, chunked.memory_plan().unwrap().cache_bytes);
    // the prompt alone (one token sampled after it)
    let reads = |m: &Arc<Model>| {
        run_for(m, &prompts[..1], 1);
        m.expert_cache_stats().unwrap().reads
    };
    let (w, c) = (reads(&waved), reads(&chunked));
    eprintln!("engine prefill: {w} expert reads as waves, {c} one chunk a step");
    assert!(w < c, "{w} reads as waves, {c} chunk by chunk");
}
