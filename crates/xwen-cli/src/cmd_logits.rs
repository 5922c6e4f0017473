//! `xwen logits -m MODEL --ids 1,2,3 --out FILE.npy`: float32 logits of every position,
//! shape [n_ids, n_vocab] — the interface the parity tooling relies on.

use crate::args::Args;
use crate::{model_arg, npy};
use anyhow::{bail, Context, Result};
use xwen_engine::LogitsMode;

pub fn run(argv: &[String]) -> Result<()> {
    let mut a = Args::new(argv);
    let model = a.value(&["-m", "--model"])?;
    let ids = a.value(&["--ids"])?.context("--ids is required")?;
    let out = a.value(&["--out", "-o"])?.context("--out FILE.npy is required")?;
    let cfg = model_arg::engine_config(&mut a)?;
    let rest = a.finish()?;
    if !rest.is_empty() {
        bail!("unexpected argument `{}`", rest[0]);
    }
    let ids = model_arg::parse_ids(&ids)?;
    if ids.is_empty() {
        bail!("--ids is empty");
    }
    let loaded = model_arg::load(model.as_deref(), &cfg, false)?;
    let mut st = loaded.model.new_state();
    let logits = loaded.model.forward(&mut st, &ids, LogitsMode::All)?;
    npy::write_f32(std::path::Path::new(&out), &[ids.len(), loaded.model.n_vocab()], &logits)
        .with_context(|| format!("writing {out}"))?;
    Ok(())
}
