//! `xwen chat -m MODEL`: multi-turn chat on stdin/stdout. The sequence state persists between
//! turns (the library's `Session`): each turn renders the whole conversation with the GGUF's
//! chat template, keeps the longest prefix already in the state, and prefills only the rest;
//! templates that re-render history differently (Qwen3.6 drops old reasoning) are handled by
//! restoring the checkpoint taken before the last reply. Lines starting with `/` are commands
//! (`/exit`, `/reset`, `/system TEXT`, `/help`); a line that is not UTF-8 is reported and the
//! chat goes on; a full context ends the reply and says so.

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
        let mut raw = Vec::new();
        if stdin.lock().read_until(b'\n', &mut raw)? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        let Ok(line) = String::from_utf8(raw) else {
            eprintln!("xwen: that line is not valid UTF-8; nothing was sent");
            continue;
        };
        let line = line.trim_end_matches(['\n', '\r']).to_string();
        if line.is_empty() {
            continue;
        }
        if let Some(cmd) = line.strip_prefix('/') {
            let (name, arg) = cmd.split_once(' ').unwrap_or((cmd, ""));
            match name {
                "exit" | "quit" => return Ok(()),
                "reset" => {
                    messages.retain(|m| m.role == "system");
                    session.reset(&loaded.model);
                    eprintln!("xwen: conversation cleared");
                }
                "system" => {
                    messages.retain(|m| m.role != "system");
                    if !arg.trim().is_empty() {
                        messages.insert(0, msg("system", arg.trim().to_string()));
                    }
                    eprintln!("xwen: system prompt {}", if arg.trim().is_empty() { "removed" } else { "set" });
                }
                "help" => eprintln!("commands: /exit, /reset (clear the conversation), /system TEXT (set or, empty, remove the system prompt)"),
                other => eprintln!("xwen: unknown command `/{other}` (/help lists them)"),
            }
            continue;
        }
        messages.push(msg("user", line));
        let ids = encode_segments(tok, &template.render(&messages, &opts)?);
        // a reply must fit in the context: stop it where the context ends, and say so
        let room = loaded.model.max_context().saturating_sub(ids.len());
        if room == 0 {
            messages.pop();
            eprintln!(
                "xwen: the conversation ({} tokens) fills the context of {} positions (-c); /reset to start over (recurrent state cannot be shifted like a KV cache)",
                ids.len(),
                loaded.model.max_context()
            );
            continue;
        }
        let mut reply_ids = Vec::new();
        let mut dec = StreamDecoder::new();
        let (stats, _reuse) = session.generate(&loaded.model, &ids, n.min(room), &stop, &mut sampler, &mut |t| {
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
        if stats.stop == xwen_engine::StopReason::Length && n > room {
            eprintln!("xwen: the reply reached the end of the context (-c {}); /reset to start over", loaded.model.max_context());
        }
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
