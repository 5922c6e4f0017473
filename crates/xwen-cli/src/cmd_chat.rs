//! `xwen chat -m MODEL`: multi-turn chat on stdin/stdout. The sequence state persists between
//! turns: each turn renders the whole conversation with the GGUF's chat template, keeps the
//! longest prefix already in the state, and prefills only the rest. Templates that re-render
//! history differently (Qwen3.6 drops old reasoning) are handled by restoring the snapshot taken
//! before the last reply.

use crate::args::Args;
use crate::cmd_run::sampler_config;
use crate::model_arg;
use anyhow::{bail, Context, Result};
use std::io::{BufRead, Write};
use xwen_chat::{encode_segments, ChatMessage, ChatTemplate, RenderOptions, StreamDecoder};
use xwen_engine::{Sampler, Session};

pub fn run(argv: &[String]) -> Result<()> {
    let mut a = Args::new(argv);
    let model = a.value(&["-m", "--model"])?;
    let system = a.value(&["--system"])?;
    let n: usize = a.parsed(&["-n", "--n-predict"])?.unwrap_or(1024);
    let no_think = a.flag(&["--no-think"]);
    let scfg = sampler_config(&mut a)?;
    let cfg = model_arg::engine_config(&mut a)?;
    let rest = a.finish()?;
    if !rest.is_empty() {
        bail!("unexpected argument `{}`", rest[0]);
    }
    if model.is_none() {
        eprintln!("{}", model_arg::DEMO_NOTE);
    }
    let loaded = model_arg::load(model.as_deref(), &cfg, false)?;
    let tok = &loaded.tokenizer;
    let template = ChatTemplate::from_gguf(loaded.model.gguf())
        .context("chat template")?
        .context("this GGUF has no tokenizer.chat_template; use `xwen run` for plain completion")?;
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(s) = system {
        messages.push(msg("system", s));
    }
    let mut sampler = Sampler::new(scfg.resolve(!no_think));
    let stop = tok.eos_ids();
    // the state, exactly the tokens it holds, and checkpoints: prefix reuse lives in the library
    let mut session = Session::new(&loaded.model);
    let opts = RenderOptions { add_generation_prompt: true, enable_thinking: !no_think, ..Default::default() };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        write!(out, "> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']).to_string();
        if line.is_empty() {
            continue;
        }
        messages.push(msg("user", line));
        let ids = encode_segments(tok, &template.render(&messages, &opts)?);
        let mut reply_ids = Vec::new();
        let mut dec = StreamDecoder::new();
        let (stats, _reuse) = session.generate(&loaded.model, &ids, n, &stop, &mut sampler, &mut |t| {
            reply_ids.push(t);
            if !stop.contains(&t) {
                print!("{}", dec.push(tok, t));
                let _ = std::io::stdout().flush();
            }
            true
        })?;
        println!("{}", dec.finish());
        let text = tok.decode(reply_ids.iter().copied().filter(|t| !stop.contains(t)).collect::<Vec<_>>().as_slice());
        messages.push(msg("assistant", text));
        eprintln!("[{} tok, {:.1} tok/s]", stats.generated, stats.decode_tps());
    }
}

fn msg(role: &str, content: String) -> ChatMessage {
    ChatMessage {
        role: role.to_string(),
        content,
        reasoning_content: None,
        tool_calls: Vec::new(),
        tool_call_id: None,
        name: None,
    }
}
