//! `xwen serve -m MODEL`: the OpenAI- and Anthropic-compatible HTTP server (crate xwen-server)
//! over the model. Flags keep llama-server's names where they mean the same.

use crate::args::Args;
use crate::model_arg;
use anyhow::{bail, Context, Result};
use xwen_chat::ChatTemplate;
use xwen_server::{ServedModel, ServerConfig};

pub const HELP: &str = "\
usage: xwen serve [-m MODEL] [options]

  -m, --model MODEL          GGUF path or checkpoint name (no -m: the embedded demo model)
      --host HOST            address to bind (default 127.0.0.1: loopback only)
      --port PORT            port (default 8080; 0 picks a free one)
  -np, --parallel N          sequences decoded together, one slot each (default 4)
  -c, --ctx-size N           positions per sequence (default 32768)
      --api-key KEY          require `Authorization: Bearer KEY` or `x-api-key: KEY`
      --alias NAME           the model id clients see and send
      --chat-template-file F a Jinja chat template instead of the GGUF's
      --queue N              requests that may wait for a slot before 429 (default 64)
      --max-body BYTES       largest request body (default 8M)
      --ram-budget SIZE      hard RAM ceiling; MoE experts stream from disk (e.g. 12G, auto)
  -t, --threads N            compute threads (default: all cores)

example:
  xwen serve -m model.gguf --port 8080 &
  curl -s localhost:8080/v1/chat/completions -H 'content-type: application/json' \\
    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"def add(a, b):\"}], \"max_tokens\": 32}'
";

pub fn run(argv: &[String]) -> Result<()> {
    let mut a = Args::new(argv);
    if a.flag(&["-h", "--help"]) {
        print!("{HELP}");
        return Ok(());
    }
    let model = a.value(&["-m", "--model"])?;
    let mut scfg = ServerConfig::default();
    if let Some(h) = a.value(&["--host"])? {
        scfg.host = h;
    }
    if let Some(p) = a.parsed::<u16>(&["--port"])? {
        scfg.port = p;
    }
    if let Some(n) = a.parsed::<usize>(&["-np", "--parallel"])? {
        if n == 0 || n > 256 {
            bail!("--parallel: {n} is outside 1..=256");
        }
        scfg.parallel = n;
    }
    if let Some(q) = a.parsed::<usize>(&["--queue"])? {
        scfg.queue_limit = q;
    }
    if let Some(b) = a.value(&["--max-body"])? {
        let n = model_arg::parse_size(&b).with_context(|| format!("--max-body: `{b}` is not a size"))?;
        if n == 0 {
            bail!("--max-body: must be above 0");
        }
        scfg.max_body = usize::try_from(n).unwrap_or(usize::MAX);
    }
    scfg.api_key = a.value(&["--api-key"])?.filter(|k| !k.is_empty());
    let alias = a.value(&["--alias", "-a"])?;
    let template_file = a.value(&["--chat-template-file"])?;
    let mut cfg = model_arg::engine_config(&mut a)?;
    cfg.n_seq = scfg.parallel;
    let rest = a.finish()?;
    if !rest.is_empty() {
        bail!("unexpected argument `{}`", rest[0]);
    }
    if model.is_none() {
        eprintln!("{}", model_arg::DEMO_NOTE);
    }
    let loaded = model_arg::load(model.as_deref(), &cfg, false)?;
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
        eprintln!("xwen: serving on http://{addr} ({parallel} slots); Ctrl-C stops");
    })
}
