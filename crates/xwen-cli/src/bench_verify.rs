//! `xwen bench --verify 1,2,4,8`: what a speculative verify of k drafted tokens costs relative
//! to decoding one — the number that decides whether drafting pays. From a state
//! holding `-p` random tokens, each repetition times one decode-order span of k random tokens
//! (as `generate_speculative` runs a greedy verify: each row's pick, no logits where a device
//! picks them) and rolls it back; k = 1 is plain decode. Medians of -r. The state keeps one
//! row more than a drafted run does (the one before the first row, to roll back to), which
//! costs a device a copy of the recurrent states a verify.
//! With an acceptance rate a and depth k, a step yields 1 + a + … + a^k tokens for the printed
//! cost: the predicted speedup is that sum over the ratio.

use crate::lcg::Lcg;
use anyhow::Result;
use serde_json::json;
use std::time::Instant;
use xwen_engine::{LogitsMode, Model, SeqStep};

pub fn run(model: &Model, depths: &[usize], n_prompt: usize, reps: usize, as_json: bool) -> Result<()> {
    let v = model.n_vocab() as u32;
    let mut rng = Lcg(7);
    let max_k = depths.iter().copied().max().unwrap_or(1);
    let mut st = model.new_state();
    st.keep_history(max_k + 1);
    let prompt: Vec<u32> = (0..n_prompt.max(1)).map(|_| rng.below(v)).collect();
    model.forward(&mut st, &prompt, LogitsMode::None)?;
    let pos = st.pos;
    let mut base = None;
    if !as_json {
        println!("| k | verify ms | × one decode | predicted speedup at 70% / 90% acceptance |");
        println!("|---|---|---|---|");
    }
    for &k in depths {
        let toks: Vec<u32> = (0..k).map(|_| rng.below(v)).collect();
        let mut samples = Vec::new();
        for i in 0..reps + 1 {
            let t0 = Instant::now();
            // greedy, as a drafted greedy run verifies: each row's pick (a device picks it and
            // copies back a token a row; the CPU returns the rows' logits)
            let mut step = [SeqStep { state: &mut st, tokens: &toks, logits: LogitsMode::AllArgmax, decode_order: true, hidden: false, banned: &[] }];
            model.forward_batch(&mut step)?;
            let dt = t0.elapsed().as_secs_f64();
            st.rollback(pos)?;
            if i > 0 {
                samples.push(dt); // the first is a warm-up
            }
        }
        samples.sort_by(f64::total_cmp);
        let med = samples[samples.len() / 2];
        let one = *base.get_or_insert(if k == 1 { med } else { f64::NAN });
        let ratio = med / one;
        // tokens a step yields: 1 + a + ... + a^(k-1) drafted-and-accepted plus the bonus row
        let gain = |a: f64| (0..k).map(|i| a.powi(i as i32)).sum::<f64>() / ratio;
        if as_json {
            println!("{}", json!({"k": k, "verify_ms": med * 1e3, "ratio": ratio, "speedup_a70": gain(0.7), "speedup_a90": gain(0.9), "n_prompt": n_prompt}));
        } else {
            println!("| {k} | {:.2} | {ratio:.2} | {:.2} / {:.2} |", med * 1e3, gain(0.7), gain(0.9));
        }
    }
    Ok(())
}
