//! Streamed experts under read faults (`experts::direct_read::faults`: an EIO, a short read, as
//! a failing disk gives them): the forward pass that meets one fails with an error naming the
//! layer and the expert — never a wrong token — and the model goes on: the next request, on a
//! fresh state, gets the mapped run's logits bit for bit, and nothing half-read was cached.
//! One test in its own binary: the faults are process-wide.

use std::path::{Path, PathBuf};
use xwen_engine::experts::direct_read::faults::{self, Fault};
use xwen_engine::{EngineConfig, EngineError, LogitsMode, Model};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity/cond/qwen3_5_moe/model-q8_0.gguf")
}

fn cfg(budget: Option<u64>) -> EngineConfig {
    EngineConfig { threads: 2, max_ctx: 512, ram_budget: budget, ..Default::default() }
}

fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_failed_expert_read_fails_the_request_and_nothing_else() {
    let path = fixture();
    let resident = Model::load(&path, &cfg(None)).unwrap();
    let p = prompt(12, resident.n_vocab());
    let want = resident.forward(&mut resident.new_state(), &p, LogitsMode::All).unwrap();

    let plan = Model::load(&path, &cfg(Some(1 << 50))).unwrap().memory_plan().unwrap().clone();
    // a cache of one expert over the smallest: every layer misses and evicts
    let m = Model::load(&path, &cfg(Some(plan.floor() + plan.record_bytes))).unwrap();
    assert!(m.streams_experts());
    for (fault, text) in [(Fault::Eio, "Input/output error"), (Fault::ShortRead, "short read")] {
        for skip in [0u64, 3] {
            faults::inject(fault, skip, 1);
            let got = m.forward(&mut m.new_state(), &p, LogitsMode::All);
            faults::clear();
            match got {
                Err(EngineError::ExpertStore(msg)) => {
                    assert!(msg.contains("reading expert") && msg.contains("of layer"), "{fault:?}: {msg}");
                    assert!(msg.contains(text), "{fault:?}: {msg}");
                }
                Err(e) => panic!("{fault:?}: wrong error {e}"),
                Ok(_) => panic!("{fault:?} after {skip} reads: the forward pass succeeded"),
            }
            // the same model serves the next request exactly
            let again = m.forward(&mut m.new_state(), &p, LogitsMode::All).unwrap();
            assert_eq!(bits(&again), bits(&want), "{fault:?}: the run after a fault differs from the mapped one");
        }
    }
    // decode rows meet the fault too
    let mut st = m.new_state();
    m.forward(&mut st, &p, LogitsMode::Last).unwrap();
    faults::inject(Fault::Eio, 0, 1000);
    let got = m.forward(&mut st, &[5], LogitsMode::Last);
    faults::clear();
    assert!(matches!(got, Err(EngineError::ExpertStore(_))), "a decode step through a failing disk succeeded");
}
