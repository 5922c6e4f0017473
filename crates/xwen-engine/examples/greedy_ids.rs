//! Greedy continuation from token ids (a debugging aid): greedy_ids MODEL N ID,ID,...
use xwen_engine::{EngineConfig, LogitsMode, Model};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let model = Model::load(std::path::Path::new(&a[1]), &EngineConfig { threads: 2, ..Default::default() }).unwrap();
    let n: usize = a[2].parse().unwrap();
    let ids: Vec<u32> = a[3].split(',').map(|x| x.parse().unwrap()).collect();
    let mut st = model.new_state();
    let t0 = std::time::Instant::now();
    let mut logits = model.forward(&mut st, &ids, LogitsMode::Last).unwrap();
    let tp = t0.elapsed();
    let mut out = Vec::new();
    let t1 = std::time::Instant::now();
    for _ in 0..n {
        let t = xwen_engine::sampler::argmax(&logits);
        out.push(t);
        logits = model.forward(&mut st, &[t], LogitsMode::Last).unwrap();
    }
    let td = t1.elapsed();
    println!("{}", out.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","));
    eprintln!("prefill {:?} decode {:.1} tok/s", tp, n as f64 / td.as_secs_f64());
}
