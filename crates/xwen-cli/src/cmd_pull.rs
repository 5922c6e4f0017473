//! `xwen pull MODEL`: resolve MODEL cache-first, downloading it on a miss, and print the local
//! path on stdout (progress and notes go to stderr), so scripts can `m=$(xwen pull X)`.

use anyhow::{bail, Result};

use crate::args::Args;

pub fn run(args: &[String]) -> Result<()> {
    let pos = Args::new(args).finish()?;
    let [model] = pos.as_slice() else {
        bail!("usage: xwen pull MODEL   (a .gguf path, Qwen3.6-27B | Qwen3.6-35B-A3B | Qwen3.8-27B, owner/repo[:QUANT|:FILE.gguf])");
    };
    let path = crate::hub::resolve(model)?;
    println!("{}", path.display());
    Ok(())
}
