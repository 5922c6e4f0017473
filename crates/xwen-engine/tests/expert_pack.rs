//! The expert-packed sidecar (`experts::pack`): written from a committed MoE fixture, found
//! beside the GGUF and used by the streamed store (one read per expert) with the resident run's
//! logits bit for bit; `verify` checks every record's crc32; a corrupt record header fails the
//! forward pass naming layer and expert; a pack that does not match its GGUF is not used.

use std::path::{Path, PathBuf};
use xwen_engine::experts::pack;
use xwen_engine::{EngineConfig, LogitsMode, Model};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity").join(rel)
}

fn cfg(budget: Option<u64>) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 512, ram_budget: budget, ..Default::default() }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A copy of `rel` in a scratch folder (the sidecar goes beside it) and its pack.
fn packed(rel: &str, tag: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("xwen-pack-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = dir.join("model.gguf");
    std::fs::copy(fixture(rel), &gguf).unwrap();
    let f = xwen_gguf::GgufFile::open(&gguf).unwrap();
    let loaded = xwen_engine::models::load(&f).unwrap();
    let side = pack::sidecar_path(&gguf);
    let rep = pack::write(&f, &loaded.experts, &side).unwrap();
    assert_eq!(rep.records, loaded.experts.iter().flatten().count() * loaded.experts.iter().flatten().next().unwrap()[0].n_mats);
    (gguf, side)
}

fn streamed(gguf: &Path) -> Model {
    let plan = Model::load(gguf, &cfg(Some(1 << 50))).unwrap().memory_plan().unwrap().clone();
    let m = Model::load(gguf, &cfg(Some(plan.floor() + plan.record_bytes))).unwrap();
    assert!(m.streams_experts());
    m
}

#[test]
fn a_pack_serves_the_resident_logits_and_its_faults_are_named() {
    for (rel, tag) in [("cond/qwen3_5_moe/model-q4_k_m.gguf", "q35"), ("cond/kimi_linear/model-q8_0.gguf", "kimi")] {
        let (gguf, side) = packed(rel, tag);
        let resident = Model::load(&gguf, &EngineConfig { record_routes: true, ..cfg(None) }).unwrap();
        let p: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % resident.n_vocab() as u32).collect();
        let want = resident.forward(&mut resident.new_state(), &p, LogitsMode::All).unwrap();
        // an expert the prompt's first position routes to: its record is read by the run below
        let first = resident.take_routes().into_iter().min_by_key(|r| (r.pos, r.layer)).unwrap();
        let (layer, expert) = (first.layer, first.experts[0]);

        let m = streamed(&gguf);
        assert_eq!(m.expert_pack_status().0.as_deref(), Some(side.as_path()), "{tag}: the sidecar is not used");
        let got = m.forward(&mut m.new_state(), &p, LogitsMode::All).unwrap();
        assert_eq!(bits(&got), bits(&want), "{tag}: packed experts give other logits");

        // every record's checksum
        let gf = xwen_gguf::GgufFile::open(&gguf).unwrap();
        let loaded = xwen_engine::models::load(&gf).unwrap();
        let pk = pack::Pack::open(&side, &gf, &loaded.experts).unwrap();
        assert!(pk.verify().unwrap() > 0);

        // a record header changed on disk: the read names the record
        let r = pk.record_range(layer, expert).unwrap();
        let mut bytes = std::fs::read(&side).unwrap();
        bytes[r.start as usize + 8] ^= 0x7f; // the expert id in its header
        std::fs::write(&side, &bytes).unwrap();
        let m = streamed(&gguf);
        let msg = match m.forward(&mut m.new_state(), &p, LogitsMode::All) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{tag}: a corrupt record was served"),
        };
        assert!(msg.contains(&format!("expert {expert} of layer {layer}")) && msg.contains("corrupt"), "{tag}: {msg}");
        // a payload byte changed: --verify finds it
        bytes[r.start as usize + 8] ^= 0x7f;
        bytes[r.start as usize + 100] ^= 0x01;
        std::fs::write(&side, &bytes).unwrap();
        let err = pack::Pack::open(&side, &gf, &loaded.experts).unwrap().verify().unwrap_err().to_string();
        // the first record verify meets with a bad checksum is this one (records are in order,
        // and only this one changed)
        assert!(err.contains(&format!("expert {expert} of layer {layer}")) && err.contains("checksum"), "{tag}: {err}");
        // and the read path checks a record's checksum the first time it reads it: the run
        // fails naming it, never with a wrong token
        let m = streamed(&gguf);
        let msg = match m.forward(&mut m.new_state(), &p, LogitsMode::All) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{tag}: a record whose payload fails its checksum was served"),
        };
        assert!(msg.contains(&format!("expert {expert} of layer {layer}")) && msg.contains("checksum"), "{tag}: {msg}");

        // a truncated pack, and one made for another file, are not used (with the reason)
        std::fs::write(&side, &bytes[..bytes.len() / 2]).unwrap();
        let m = streamed(&gguf);
        let (used, note) = m.expert_pack_status();
        assert!(used.is_none() && note.as_deref().is_some_and(|n| n.contains("truncated")), "{tag}: {note:?}");
        let got = m.forward(&mut m.new_state(), &p, LogitsMode::All).unwrap();
        assert_eq!(bits(&got), bits(&want), "{tag}: the GGUF fallback differs");
        std::fs::remove_dir_all(gguf.parent().unwrap()).unwrap();
    }
    // another model's pack beside this one
    let (q35, q35_side) = packed("cond/qwen3_5_moe/model-q4_k_m.gguf", "mix");
    let (_, next_side) = packed("cond/qwen3_next/model-q4_k_m.gguf", "mix2");
    std::fs::copy(&next_side, &q35_side).unwrap();
    let m = streamed(&q35);
    let (used, note) = m.expert_pack_status();
    assert!(used.is_none() && note.is_some(), "another model's pack was used: {note:?}");
    for side in [q35_side, next_side] {
        let _ = std::fs::remove_dir_all(side.parent().unwrap());
    }
}

/// Mutations of a valid pack (bit flips, random bytes, truncations, u64 extremes in its header
/// and records) never panic the reader: opening either refuses the file with a reason or
/// accepts it, and every record read of an accepted one is its bytes or an error.
#[test]
fn mutated_packs_never_panic_the_reader() {
    let (gguf, side) = packed("cond/qwen3_5_moe/model-q8_0.gguf", "fuzz");
    let f = xwen_gguf::GgufFile::open(&gguf).unwrap();
    let loaded = xwen_engine::models::load(&f).unwrap();
    let base = std::fs::read(&side).unwrap();
    let n_expert = loaded.experts.iter().flatten().next().unwrap()[0].n_mats;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..400 {
        let mut b = base.clone();
        // the header and the first records take most hits: that is where the parser works
        let span = if case % 2 == 0 { 4096.min(b.len()) } else { b.len() };
        for _ in 0..1 + next() % 3 {
            let span = span.min(b.len());
            if span == 0 {
                break;
            }
            match next() % 4 {
                0 => {
                    let i = (next() as usize) % span;
                    b[i] ^= 1 << (next() % 8);
                }
                1 => {
                    let i = (next() as usize) % span;
                    b[i] = next() as u8;
                }
                2 => b.truncate((next() as usize) % (b.len() + 1)),
                _ => {
                    let v = [0u64, 1, u64::MAX, 1 << 32, 1 << 62][(next() % 5) as usize];
                    if span >= 8 {
                        let i = (next() as usize) % (span - 7);
                        b[i..i + 8].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
        std::fs::write(&side, &b).unwrap();
        match pack::Pack::open(&side, &f, &loaded.experts) {
            Err(e) => {
                assert!(!e.to_string().is_empty());
                refused += 1;
            }
            Ok(p) => {
                accepted += 1;
                for (il, l) in loaded.experts.iter().enumerate() {
                    if l.is_some() {
                        for x in 0..n_expert {
                            let _ = p.read(il, x);
                        }
                    }
                }
                let _ = p.verify();
            }
        }
    }
    assert!(accepted > 0 && refused > 0, "accepted {accepted}, refused {refused}");
    std::fs::remove_dir_all(gguf.parent().unwrap()).unwrap();
}
