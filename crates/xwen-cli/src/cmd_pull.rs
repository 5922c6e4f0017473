//! `xwen pull MODEL`: resolve MODEL cache-first, downloading it on a miss, and print the local
//! path on stdout (progress and notes go to stderr), so scripts can `m=$(xwen pull X)`.

use anyhow::Result;

use crate::cli::PullArgs;

pub fn run(a: PullArgs) -> Result<()> {
    let path = xwen_hub::hub::resolve(&a.model)?;
    println!("{}", path.display());
    Ok(())
}
