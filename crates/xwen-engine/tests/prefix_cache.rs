//! The prefix cache (`PrefixCache`): a state saved at a message boundary — in RAM, or on disk and
//! read back by a new process's cache — continues exactly as the original state would have,
//! bit for bit; files of another model or damaged ones are refused; the RAM limit holds.

use std::path::{Path, PathBuf};
use xwen_engine::{EngineConfig, LogitsMode, Model, PrefixCache};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity").join(rel)
}

fn model(rel: &str) -> Model {
    Model::load(&fixture(rel), &EngineConfig { threads: 2, max_ctx: 512, ..EngineConfig::default() }).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xwen-prefix-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 500).collect()
}

/// A restored state continues with the logits the original would give, for hybrid trunks with
/// gated attention (qwen35), MLA and KDA (kimi-linear), from RAM and after a restart from disk.
#[test]
fn a_saved_prefix_continues_bit_for_bit_from_ram_and_from_disk() {
    for rel in ["cond/qwen3_5/model-q8_0.gguf", "cond/kimi_linear/model-q4_k_m.gguf", "cond/qwen3_5_moe/model-q4_k_m.gguf"] {
        let m = model(rel);
        let p = prompt(40);
        let (head, tail) = p.split_at(29);
        let mut st = m.new_state();
        m.forward(&mut st, head, LogitsMode::Last).unwrap();
        let saved = st.clone();
        let want = m.forward(&mut st, tail, LogitsMode::All).unwrap();

        let dir = scratch(&rel.replace('/', "-"));
        let mut c = PrefixCache::new(&m, 1 << 30, Some(&dir)).unwrap();
        c.insert(head, saved);
        let hit = c.lookup(&m, &p, 0).expect("the prefix is cached");
        assert!(hit.len == head.len() && !hit.from_disk, "{rel}");
        let mut st = hit.state;
        assert_eq!(m.forward(&mut st, tail, LogitsMode::All).unwrap(), want, "{rel}: from RAM");
        c.flush();
        drop(c);

        // a new process: the entry is known from the directory and read on first use
        let mut c = PrefixCache::new(&m, 1 << 30, Some(&dir)).unwrap();
        assert_eq!(c.len(), 1);
        let hit = c.lookup(&m, &p, 0).expect("the prefix survives a restart");
        assert!(hit.from_disk && hit.len == head.len());
        let mut st = hit.state;
        assert_eq!(m.forward(&mut st, tail, LogitsMode::All).unwrap(), want, "{rel}: from disk");
        // a prompt that does not begin with it, or is no longer than it, finds nothing
        assert!(c.lookup(&m, &prompt(20), 0).is_none());
        assert!(c.lookup(&m, head, 0).is_none(), "at least one token must be left to feed");
        // nor one the caller already holds as much of
        assert!(c.lookup(&m, &p, head.len()).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn files_of_another_model_or_damaged_are_refused() {
    let m = model("cond/qwen3_5/model-q8_0.gguf");
    let p = prompt(30);
    let mut st = m.new_state();
    m.forward(&mut st, &p[..20], LogitsMode::Last).unwrap();
    let dir = scratch("refused");
    let c = {
        let mut c = PrefixCache::new(&m, 1 << 30, Some(&dir)).unwrap();
        c.insert(&p[..20], st);
        c.flush();
        c
    };
    drop(c);
    // another model (and another cache type of the same model) does not see it
    let other = model("cond/qwen3_5/model-q4_k_m.gguf");
    assert!(PrefixCache::new(&other, 1 << 30, Some(&dir)).unwrap().is_empty());
    let f32_cache = Model::load(&fixture("cond/qwen3_5/model-q8_0.gguf"), &EngineConfig { threads: 2, max_ctx: 512, ..EngineConfig::default() }.with_f32_cache_no_flash()).unwrap();
    assert!(PrefixCache::new(&f32_cache, 1 << 30, Some(&dir)).unwrap().is_empty());
    // one flipped byte in the state: skipped, with nothing loaded
    let file = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "xwenprefix")).unwrap();
    let mut b = std::fs::read(&file).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x40;
    std::fs::write(&file, &b).unwrap();
    let mut c = PrefixCache::new(&m, 1 << 30, Some(&dir)).unwrap();
    assert_eq!(c.len(), 1, "the header still reads");
    assert!(c.lookup(&m, &p, 0).is_none(), "a damaged state is never returned");
    assert!(c.is_empty(), "and it leaves the index");
    // a truncated file
    std::fs::write(&file, &b[..b.len() / 3]).unwrap();
    let mut c = PrefixCache::new(&m, 1 << 30, Some(&dir)).unwrap();
    assert!(c.lookup(&m, &p, 0).is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_ram_limit_holds_and_disk_keeps_what_ram_drops() {
    let m = model("cond/qwen3_5/model-q8_0.gguf");
    let states: Vec<(Vec<u32>, xwen_engine::SeqState)> = (0..3)
        .map(|k| {
            let p: Vec<u32> = prompt(20 + k).into_iter().map(|t| (t + 100 * k as u32) % 500).collect();
            let mut st = m.new_state();
            m.forward(&mut st, &p, LogitsMode::Last).unwrap();
            (p, st)
        })
        .collect();
    let one = states[0].1.bytes() as u64;
    // room for one state in RAM, none on disk: the older entries are forgotten
    let mut c = PrefixCache::new(&m, one + one / 2, None).unwrap();
    for (p, st) in &states {
        c.insert(p, st.clone());
        assert!(c.ram_bytes() <= one + one / 2);
    }
    assert_eq!(c.len(), 1);
    // with a directory, what RAM drops stays findable on disk
    let dir = scratch("ram");
    let mut c = PrefixCache::new(&m, one + one / 2, Some(&dir)).unwrap();
    for (p, st) in &states {
        c.insert(p, st.clone());
    }
    c.flush();
    assert_eq!(c.len(), 3);
    let mut longer = states[0].0.clone();
    longer.push(7);
    let hit = c.lookup(&m, &longer, 0).expect("the first entry, from disk");
    assert!(hit.from_disk);
    assert!(c.ram_bytes() <= one + one / 2);
    let _ = std::fs::remove_dir_all(&dir);
}
