//! `cargo run -p xwen-gguf --release --example parse_time -- FILE.gguf...`: header parse time
//! (best of 5, warm page cache) and the size of the largest metadata array.
use std::time::Instant;

fn main() {
    for arg in std::env::args().skip(1) {
        let path = std::path::Path::new(&arg);
        let mut best = f64::MAX;
        let mut summary = String::new();
        for _ in 0..5 {
            let t0 = Instant::now();
            let f = match xwen_gguf::GgufFile::open(path) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("{arg}: {e}");
                    break;
                }
            };
            best = best.min(t0.elapsed().as_secs_f64());
            let longest = f
                .metadata()
                .iter()
                .filter_map(|(_, v)| v.as_array())
                .map(<[_]>::len)
                .max();
            summary = format!(
                "{} keys, {} tensors, longest array {:?}",
                f.metadata().len(),
                f.tensors().len(),
                longest
            );
        }
        println!("{arg}: {summary}: {:.1} ms", best * 1e3);
    }
}
