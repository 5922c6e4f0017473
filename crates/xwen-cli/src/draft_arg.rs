//! `--draft` / `-md`: the drafter a run or chat asks for (`xwen_engine::runtime::speculative`),
//! and its figures for the closing line.

use crate::cli::DraftOpts;
use anyhow::{bail, Context, Result};
use xwen_engine::{Drafter, ModelDrafter, MtpDrafter, NgramDrafter, SpecStats};

/// `--draft KIND[:FILE]` and `-md FILE` as one: the kind (None: not given) and the file, which
/// may come from either spelling but not from both with different files.
pub fn spec(a: &DraftOpts) -> Result<DraftOpts> {
    let mut out = a.clone();
    if let Some((kind, file)) = a.draft.as_deref().and_then(|d| d.split_once(':')) {
        if let Some(md) = a.model_draft.as_deref().filter(|md| *md != file) {
            bail!("--draft {kind}:{file} and -md {md} name two files: give one");
        }
        out.draft = Some(kind.to_string());
        out.model_draft = Some(file.to_string());
    }
    Ok(out)
}

/// The draft model `-md` / `--draft model:FILE` names, checked against the target's vocabulary.
pub fn draft_model(a: &DraftOpts, target: &xwen_engine::Model, cfg: &xwen_engine::EngineConfig) -> Result<xwen_engine::Model> {
    let path = a.model_draft.as_deref().unwrap_or_default();
    let resolved = crate::hub::resolve(path)?;
    let dm = xwen_engine::Model::load(&resolved, &xwen_engine::EngineConfig { ram_budget: None, n_seq: 1, ..cfg.clone() })
        .with_context(|| format!("-md {path}"))?;
    if dm.n_vocab() != target.n_vocab() {
        bail!("-md {path}: its vocabulary has {} tokens, the model's {}: a draft model needs the same vocabulary", dm.n_vocab(), target.n_vocab());
    }
    Ok(dm)
}

/// The drafter `--draft` / `-md` ask for (None: plain decoding).
/// `--draft mtp` attaches `-md`'s MTP sidecar to the target, hence `&mut`.
pub fn drafter(a: &DraftOpts, target: &mut xwen_engine::Model, cfg: &xwen_engine::EngineConfig) -> Result<Option<Box<dyn Drafter>>> {
    let a = &spec(a)?;
    let kind = match (a.draft.as_deref(), &a.model_draft) {
        (Some("none"), _) => return Ok(None),
        (Some("mtp"), _) => {
            mtp_head(a, target)?;
            return Ok(Some(mtp_drafter(a)));
        }
        (Some("model") | None, Some(_)) => "model",
        (Some("model"), None) => bail!("--draft model needs a draft model: -md FILE"),
        (Some(k), _) => if k == "ngram" { "ngram" } else { return Ok(None) },
        // a file that carries an MTP head drafts with it unless told otherwise (seed 000)
        (None, None) if target.has_mtp() => return Ok(Some(mtp_drafter(a))),
        (None, None) => return Ok(None),
    };
    if kind == "ngram" {
        return Ok(Some(Box::new(NgramDrafter::default())));
    }
    let dm = draft_model(a, target, cfg)?;
    let mut d = ModelDrafter::new(dm, a.draft_max as usize);
    d.p_min = a.draft_p_min;
    Ok(Some(Box::new(d)))
}

/// `--draft mtp`'s head: `-md`'s sidecar attached where given, else the model file's own; an
/// error when there is none.
pub fn mtp_head(a: &DraftOpts, target: &mut xwen_engine::Model) -> Result<()> {
    if let Some(path) = &a.model_draft {
        let resolved = crate::hub::resolve(path)?;
        target.attach_mtp(&resolved).with_context(|| format!("-md {path}"))?;
    }
    if !target.has_mtp() {
        bail!("--draft mtp: this model file has no MTP head (nextn block); use its \"-MTP\" GGUF, or give the head's sidecar GGUF with -md FILE");
    }
    Ok(())
}

fn mtp_drafter(a: &DraftOpts) -> Box<dyn Drafter> {
    let mut d = MtpDrafter::new();
    d.p_min = a.draft_p_min;
    Box::new(d)
}

/// The drafter's figures for the closing line.
pub fn draft_line(name: &str, s: &SpecStats, generated: usize) -> String {
    if !s.active {
        return String::new();
    }
    format!(
        "; draft {name}: {} drafted, {} accepted ({:.0}%), {:.2} tokens per step",
        s.drafted,
        s.accepted,
        100.0 * s.acceptance(),
        generated.saturating_sub(1) as f64 / s.steps.max(1) as f64
    )
}

