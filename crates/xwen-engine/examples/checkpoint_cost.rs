//! Bytes and time of a state checkpoint (the recurrent states and the position; KV rows are
//! truncated on restore, never copied) against a whole-state snapshot, on any GGUF — e.g. a
//! synthetic 35B-A3B (`xwen synth --preset qwen35moe-35b-a3b`).
//! usage: cargo run --release -p xwen-engine --example checkpoint_cost -- MODEL.gguf [POSITIONS]

use std::time::Instant;
use xwen_engine::{EngineConfig, LogitsMode, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or("usage: checkpoint_cost MODEL.gguf [POSITIONS]")?;
    let n: usize = args.get(1).map_or(Ok(256), |s| s.parse())?;
    let m = Model::load(path.as_ref(), &EngineConfig { threads: 2, max_ctx: n + 8, ..Default::default() })?;
    let mut st = m.new_state();
    let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7919 + 3) % m.n_vocab() as u32).collect();
    m.forward(&mut st, &ids, LogitsMode::None)?;
    let reps = 5;
    let t0 = Instant::now();
    let mut ck = st.checkpoint().unwrap();
    for _ in 1..reps {
        ck = st.checkpoint().unwrap();
    }
    let take = t0.elapsed().as_secs_f64() / reps as f64;
    let t1 = Instant::now();
    for _ in 0..reps {
        st.restore_checkpoint(&ck)?;
    }
    let restore = t1.elapsed().as_secs_f64() / reps as f64;
    let t2 = Instant::now();
    let snap = st.snapshot();
    let snap_take = t2.elapsed().as_secs_f64();
    println!(
        "{path} at {n} positions: checkpoint {:.1} MiB (take {:.2} ms, restore {:.2} ms); whole state {:.1} MiB (snapshot {:.2} ms)",
        ck.bytes() as f64 / (1 << 20) as f64,
        take * 1e3,
        restore * 1e3,
        st.bytes() as f64 / (1 << 20) as f64,
        snap_take * 1e3
    );
    drop(snap);
    Ok(())
}
