//! `xwen pack MODEL.gguf [-o FILE] [--verify]`: writes the expert-packed sidecar
//! (`xwen_engine::experts::pack`) or checks one.

use crate::cli::PackArgs;
use anyhow::{anyhow, bail, Result};
use xwen_engine::experts::pack;
use xwen_gguf::GgufFile;

pub fn run(a: PackArgs) -> Result<()> {
    let f = GgufFile::open(&a.model).map_err(|e| anyhow!("{}: {e}", a.model.display()))?;
    let loaded = xwen_engine::models::load(&f)?;
    if loaded.experts.iter().all(|e| e.is_none()) {
        bail!("{} has no routed experts: nothing to pack", a.model.display());
    }
    let out = a.out.clone().unwrap_or_else(|| pack::sidecar_path(&a.model));
    if a.verify {
        let p = pack::Pack::open(&out, &f, &loaded.experts)?;
        let n = p.verify()?;
        println!("{}: {n} records, every header and checksum good", out.display());
        return Ok(());
    }
    crate::opts::refuse_non_regular_out(&out)?;
    let t0 = std::time::Instant::now();
    let rep = pack::write(&f, &loaded.experts, &out)?;
    println!("wrote {}: {} records, {:.2} GB, in {:.1} s", rep.path.display(), rep.records, rep.bytes as f64 / 1e9, t0.elapsed().as_secs_f64());
    for t in loaded.net.row_tables() {
        // a table row is one contiguous range of the GGUF already: the sidecar leaves it there
        println!(
            "{}: not packed: a row ({} bytes) is one read from the GGUF already, {:.3} blocks of 4 KiB on average",
            t.mat.info.name,
            t.mat.row_bytes(),
            xwen_engine::experts::rows::blocks_per_row(&t.mat, f.data_offset())
        );
    }
    if a.out.is_some() && rep.path != pack::sidecar_path(&a.model) {
        eprintln!("xwen pack: note: only a sidecar at {} is found by --ram-budget runs", pack::sidecar_path(&a.model).display());
    }
    Ok(())
}
