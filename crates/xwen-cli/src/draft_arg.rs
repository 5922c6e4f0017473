//! `--draft` / `-md`: the drafter a run or chat asks for (`xwen_engine::runtime::speculative`),
//! and its figures for the closing line.

use crate::cli::DraftOpts;
use anyhow::{bail, Context, Result};
use xwen_engine::{ContraryDrafter, DflashDrafter, Drafter, ModelDrafter, MtpDrafter, NgramDrafter, ReplayDrafter, SpecStats};

/// `--draft KIND[:FILE]` and `-md FILE` as one: the kind (None: not given) and the file, which
/// may come from either spelling but not from both with different files.
fn spec(a: &DraftOpts) -> Result<DraftOpts> {
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

/// What `--draft` asks for, settled before the target loads: a draft model is loaded first
/// and an MTP sidecar named in the engine config, so that under `--ram-budget` the target's plan
/// counts them (`EngineConfig::draft_ram`, `EngineConfig::mtp_sidecar`).
pub struct Prepared {
    kind: Kind,
    opts: DraftOpts,
    draft_model: Option<xwen_engine::Model>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// `--draft none`, or nothing asked and (maybe) a file without a head
    Off,
    /// Not asked: the target's own MTP head where its file has one (as llama.cpp's MTP path does)
    Auto,
    Ngram,
    Mtp,
    /// A DFlash sidecar (`--draft dflash:FILE`), attached to the target once it is loaded
    Dflash,
    Model,
    /// A known continuation (`ReplayDrafter`): the verify machinery's upper bound
    Replay,
    /// Every draft wrong (`ContraryDrafter`): what drafting costs when it never pays
    Contrary,
}

/// Reads `--draft` / `-md` and prepares what the target's load needs to know; `n_seq`
/// sequences will draft at once (a server's slots).
pub fn prepare(a: &DraftOpts, cfg: &mut xwen_engine::EngineConfig, n_seq: usize) -> Result<Prepared> {
    let mut a = spec(a)?;
    let kind = match (a.draft.as_deref(), &a.model_draft) {
        (Some("none"), _) => Kind::Off,
        (Some("mtp"), _) => Kind::Mtp,
        (Some("dflash"), Some(_)) => Kind::Dflash,
        (Some("dflash"), None) => bail!("--draft dflash needs its sidecar: --draft dflash:FILE"),
        (Some("model") | None, Some(_)) => Kind::Model,
        (Some("model"), None) => bail!("--draft model needs a draft model: --draft model:FILE or -md FILE"),
        (Some("ngram"), _) => Kind::Ngram,
        (Some("replay"), Some(_)) => Kind::Replay,
        (Some("contrary"), _) => Kind::Contrary,
        _ => Kind::Auto,
    };
    let mut draft_model = None;
    // the file's own head only where it will draft: otherwise a budget would pay for its KV
    cfg.load_mtp = matches!(kind, Kind::Mtp | Kind::Auto);
    // a budget counts the states the deepest verify keeps for its rollback
    cfg.draft_depth = if kind == Kind::Off { 0 } else { a.draft_max as usize };
    match kind {
        Kind::Mtp => {
            if let Some(path) = &a.model_draft {
                cfg.mtp_sidecar = Some(xwen_hub::hub::resolve(path)?);
            }
        }
        Kind::Model => {
            let path = a.model_draft.as_deref().unwrap_or_default();
            let resolved = xwen_hub::hub::resolve(path)?;
            let dm = xwen_engine::Model::load(&resolved, &xwen_engine::EngineConfig { ram_budget: None, n_seq, draft_ram: 0, mtp_sidecar: None, ..cfg.clone() })
                .with_context(|| format!("-md {path}"))?;
            // counted by a budgeted target's plan (the engine ignores it without a budget)
            cfg.draft_ram = dm.ram_needed(n_seq);
            draft_model = Some(dm);
        }
        Kind::Dflash => {
            let path = a.model_draft.as_deref().unwrap_or_default();
            let resolved = xwen_hub::hub::resolve(path)?;
            a.model_draft = Some(resolved.to_string_lossy().into_owned());
            // attached at load, so a RAM budget's plan counts its weights and caches
            cfg.dflash_sidecar = Some(resolved);
        }
        _ => {}
    }
    Ok(Prepared { kind, opts: a, draft_model })
}

impl Prepared {
    /// What drafts, now that `target` is loaded (and placed): Mtp needs its head (the sidecar
    /// was attached at load; on a GPU the head went there with the model), Auto becomes Mtp
    /// where the model has a head (else no drafting), a draft model needs the same vocabulary.
    pub fn kind(&self, target: &xwen_engine::Model) -> Result<Kind> {
        match self.kind {
            Kind::Mtp if !target.has_mtp() => bail!("--draft mtp: this model file has no MTP head (nextn block); use its \"-MTP\" GGUF, or give the head's sidecar GGUF with -md FILE"),
            Kind::Auto if target.has_mtp() => Ok(Kind::Mtp),
            Kind::Auto => Ok(Kind::Off),
            Kind::Model => {
                let dm = self.draft_model.as_ref().expect("loaded by prepare");
                if dm.n_vocab() != target.n_vocab() {
                    let path = self.opts.model_draft.as_deref().unwrap_or_default();
                    bail!("-md {path}: its vocabulary has {} tokens, the model's {}: a draft model needs the same vocabulary", dm.n_vocab(), target.n_vocab());
                }
                Ok(Kind::Model)
            }
            k => Ok(k),
        }
    }

    /// Attaches what drafts on the target itself once it is loaded: a DFlash sidecar.
    pub fn attach(&self, target: &mut xwen_engine::Model) -> Result<()> {
        if self.kind == Kind::Dflash {
            let path = self.opts.model_draft.as_deref().unwrap_or_default();
            target.attach_dflash(std::path::Path::new(path)).with_context(|| format!("--draft dflash:{path}"))?;
        }
        Ok(())
    }

    /// The draft model (`--draft model`) goes where its target went: onto the GPU beside a
    /// target there, so its proposals run at the device's speed and its states stay there. Under
    /// `--vram-budget` it stays on the CPU (the budget is the target's alone).
    pub fn place_model(&mut self, engine: &crate::opts::EngineOpts, target: &xwen_engine::Model) -> Result<()> {
        if let (Some(dm), true, None) = (self.draft_model.as_mut(), target.device().is_some(), engine.vram_budget) {
            crate::gpu::place(engine, dm).context("the draft model (-md) on the GPU")?;
        }
        Ok(())
    }

    /// The draft model (`--draft model`), for a server's slots to share.
    pub fn take_model(&mut self) -> Option<xwen_engine::Model> {
        self.draft_model.take()
    }

    pub fn max(&self) -> usize {
        self.opts.draft_max as usize
    }

    pub fn p_min(&self) -> f32 {
        self.opts.draft_p_min
    }

    /// The drafter of a run or a chat (None: plain decoding).
    pub fn drafter(mut self, target: &xwen_engine::Model) -> Result<Option<Box<dyn Drafter>>> {
        Ok(match self.kind(target)? {
            Kind::Off | Kind::Auto => None,
            Kind::Ngram => Some(Box::new(NgramDrafter::default())),
            Kind::Contrary => Some(Box::new(ContraryDrafter::new(target.n_vocab()))),
            Kind::Replay => {
                let path = self.opts.model_draft.as_deref().unwrap_or_default();
                let text = std::fs::read_to_string(path).with_context(|| format!("--draft replay:{path}"))?;
                let ids = crate::model_arg::parse_ids(&text).with_context(|| format!("--draft replay:{path}"))?;
                if let Some(&bad) = ids.iter().find(|&&t| t as usize >= target.n_vocab()) {
                    bail!("--draft replay:{path}: token {bad} is outside the vocabulary (0..{})", target.n_vocab());
                }
                Some(Box::new(ReplayDrafter::new(ids)))
            }
            Kind::Mtp => {
                let mut d = MtpDrafter::new();
                d.p_min = self.p_min();
                Some(Box::new(d))
            }
            Kind::Dflash => {
                let mut d = DflashDrafter::new();
                d.p_min = self.p_min();
                Some(Box::new(d))
            }
            Kind::Model => {
                let mut d = ModelDrafter::new(self.take_model().expect("loaded by prepare"), self.max());
                d.p_min = self.p_min();
                Some(Box::new(d))
            }
        })
    }
}

/// The drafter's figures for the closing line.
pub fn draft_line(name: &str, s: &SpecStats, generated: usize) -> String {
    if !s.active {
        return String::new();
    }
    let (drafted, plain) = s.step_micros();
    let drafted = drafted.map_or(String::new(), |(v, d)| format!("; a drafted step {:.0} µs (verify {v:.0}, drafting {d:.0})", v + d));
    let plain = plain.map_or(String::new(), |p| format!(", a step without drafts {p:.0} µs"));
    format!(
        "; draft {name}: {} drafted, {} accepted ({:.0}%), {:.2} tokens per step{drafted}{plain}",
        s.drafted(),
        s.accepted(),
        100.0 * s.acceptance(),
        tokens_per_step(s, generated)
    )
}

/// Tokens each verify step produced: the first token comes from the prefill, every later one
/// from a step (its accepted drafts and the token after them).
pub fn tokens_per_step(s: &SpecStats, generated: usize) -> f64 {
    generated.saturating_sub(1) as f64 / s.steps.max(1) as f64
}

