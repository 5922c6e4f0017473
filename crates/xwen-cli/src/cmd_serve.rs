//! `xwen serve -m MODEL`: the OpenAI- and Anthropic-compatible HTTP server (crate xwen-server)
//! over the model. Flags keep llama-server's names where they mean the same.

use crate::cli::ServeArgs;
use crate::draft_arg::Kind;
use crate::model_arg;
use anyhow::{Context, Result};
use xwen_chat::ChatTemplate;
use xwen_server::{DraftConfig, DraftSource, ServedModel, ServerConfig};

pub fn run(a: ServeArgs) -> Result<()> {
    let mut scfg = ServerConfig { host: a.host.clone(), port: a.port, parallel: a.parallel as usize, queue_limit: a.queue as usize, ..ServerConfig::default() };
    scfg.access_log = a.engine.verbose;
    if a.api_key.is_none() && !is_loopback(&a.host) && !a.engine.quiet {
        eprintln!(
            "xwen: warning: --host {} takes requests from other machines and no --api-key is set: anyone who can reach this port can use the model",
            a.host
        );
    }
    scfg.max_body = usize::try_from(a.max_body).unwrap_or(usize::MAX);
    scfg.api_key = a.api_key.clone().filter(|k| !k.is_empty());
    scfg.cache_ram = a.cache_ram.saturating_mul(1 << 20);
    scfg.cache_dir = a.cache_dir.clone();
    let alias = a.alias.clone();
    let template_file = a.chat_template_file.clone();
    let model = a.model.clone();
    let mut cfg = a.engine.engine_config()?;
    cfg.n_seq = scfg.parallel;
    // the prefix cache's RAM is part of the budget (bounded inside --ram-budget)
    cfg.reserved_ram = scfg.cache_ram;
    if model.is_none() {
        eprintln!("{}", model_arg::DEMO_NOTE);
    }
    let mut draft = crate::draft_arg::prepare(&a.draft, &mut cfg, scfg.parallel)?;
    let mut loaded = model_arg::load(model.as_deref(), cfg, &a.engine)?;
    crate::gpu::place(&a.engine, &mut loaded.model)?;
    draft.place_model(&a.engine, &loaded.model)?;
    draft.attach(&mut loaded.model)?;
    let source = match draft.kind(&loaded.model)? {
        Kind::Off | Kind::Auto => None,
        Kind::Ngram => Some(DraftSource::Ngram),
        Kind::Replay => anyhow::bail!("--draft replay is a benchmark of one known continuation: run and bench take it, serve does not"),
        Kind::Contrary => anyhow::bail!("--draft contrary is a benchmark of a drafter that is never right: run and bench take it, serve does not"),
        Kind::Mtp => {
            if a.draft.draft.is_none() && a.draft.model_draft.is_none() {
                eprintln!("xwen: drafting with the model's MTP head (--draft none turns it off)");
            }
            Some(DraftSource::Mtp)
        }
        Kind::Dflash => Some(DraftSource::Dflash),
        Kind::Model => Some(DraftSource::Model(std::sync::Arc::new(draft.take_model().expect("a draft model was loaded")))),
    };
    scfg.draft = source.map(|source| DraftConfig { source, max: draft.max(), p_min: draft.p_min() });
    let template = match &template_file {
        Some(f) => {
            let src = std::fs::read(f).with_context(|| format!("--chat-template-file {f}"))?;
            let src = String::from_utf8(src).map_err(|_| anyhow::anyhow!("--chat-template-file {f}: not UTF-8"))?;
            Some(ChatTemplate::new(&src).with_context(|| format!("--chat-template-file {f}"))?)
        }
        None => ChatTemplate::from_gguf(loaded.model.gguf()).context("the GGUF's chat template")?,
    };
    if template.is_none() {
        eprintln!("xwen: this GGUF has no chat template: chat routes answer 400 (give --chat-template-file); /v1/completions works");
    }
    // the names the model answers to; the first is the id /v1/models lists
    let mut names: Vec<String> = Vec::new();
    let file_name = model.as_deref().and_then(|m| std::path::Path::new(m).file_name()).map(|n| n.to_string_lossy().to_string());
    let checkpoint = loaded.model.checkpoint(file_name.as_deref());
    names.extend(alias);
    names.extend(checkpoint.map(|c| c.full_name().to_string()));
    if loaded.is_demo {
        names.push("tiny-qwen35".into());
    }
    if let Some(f) = &file_name {
        names.push(f.trim_end_matches(".gguf").to_string());
        names.push(f.clone());
    }
    names.extend(loaded.model.name().map(str::to_string));
    if let Some(m) = &model {
        names.push(m.clone());
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| !n.is_empty() && seen.insert(n.clone()));
    let served = ServedModel { model: loaded.model, tokenizer: loaded.tokenizer, template, names };
    let parallel = scfg.parallel;
    xwen_server::serve(served, scfg, |addr| {
        eprintln!("xwen: serving on http://{addr} ({parallel} slots); a chat page at http://{addr}/; Ctrl-C stops");
        eprintln!("xwen: {ENDPOINTS}");
    })
}

/// The startup line's list of what the server answers.
const ENDPOINTS: &str = "endpoints: POST /v1/chat/completions, /v1/completions, /v1/responses (OpenAI), \
/v1/messages (Anthropic), /tokenize, /detokenize, /apply-template; GET /v1/models, /health, /metrics, /props, /openapi.json";

/// Whether HOST (`--host`) binds the loopback interface only: `localhost`, 127.0.0.0/8, `::1`.
fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1", "localhost", "::1", "[::1]", "127.1.2.3"] {
            assert!(super::is_loopback(h), "{h}");
        }
        for h in ["0.0.0.0", "::", "192.168.1.2", "example.com"] {
            assert!(!super::is_loopback(h), "{h}");
        }
    }
}
