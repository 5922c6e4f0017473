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
use xwen_engine::{generate, GenerateRequest, Sampler, Snapshot};

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
    let mut state = loaded.model.new_state();
    let mut consumed: Vec<u32> = Vec::new();
    let mut before_reply: Option<(Snapshot, usize)> = None;
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
        let common = consumed.iter().zip(&ids).take_while(|(a, b)| a == b).count();
        if common < consumed.len() {
            // History re-rendered differently: fall back to the snapshot before the last reply.
            match &before_reply {
                Some((snap, p)) if *p <= common => {
                    state.restore(snap);
                    consumed.truncate(*p);
                }
                _ => {
                    state = loaded.model.new_state();
                    consumed.clear();
                }
            }
        }
        let new = ids[consumed.len()..].to_vec();
        // Keep one token back so the prefill returns logits for the next position.
        let (head, last) = new.split_at(new.len().saturating_sub(1));
        if !head.is_empty() {
            loaded.model.forward(&mut state, head, xwen_engine::LogitsMode::None)?;
        }
        consumed.extend_from_slice(head);
        before_reply = Some((state.snapshot(), consumed.len()));
        let mut reply_ids = Vec::new();
        let mut dec = StreamDecoder::new();
        let req = GenerateRequest { prompt: last, max_tokens: n, stop_ids: &stop };
        let stats = generate(&loaded.model, &mut state, &req, &mut sampler, &mut |t| {
            reply_ids.push(t);
            if !stop.contains(&t) {
                print!("{}", dec.push(tok, t));
                let _ = std::io::stdout().flush();
            }
            true
        })?;
        println!("{}", dec.finish());
        consumed.extend_from_slice(last);
        consumed.extend_from_slice(&reply_ids);
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
