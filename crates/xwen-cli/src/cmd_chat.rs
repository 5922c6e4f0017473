//! `xwen chat -m MODEL`: multi-turn chat on stdin/stdout, a client of the library's `Engine`
//! with one slot. The sequence state persists between turns (the slot's `Session`): each turn
//! renders the whole conversation with the GGUF's chat template, keeps the longest prefix
//! already in the state, and prefills only the rest; templates that re-render history
//! differently (Qwen3.6 drops old reasoning) are handled by restoring the checkpoint taken
//! before the last reply. So every turn's state holds exactly the tokens of the rendered
//! transcript.
//!
//! Lines starting with `/` are commands (`/exit`, `/reset`, `/system TEXT`, `/save FILE`,
//! `/load FILE`, `/help`); `exit` and `quit` alone leave too. A line ending in `\` continues
//! on the next. Ctrl-C stops the reply being written and keeps the chat (at the prompt it
//! leaves). A line that is not UTF-8, a file that cannot be read, a conversation that fills
//! the context: each is reported and the chat goes on.

use crate::cli::ChatArgs;
use crate::prefill_progress::PrefillProgress;
use crate::{interrupt, model_arg, opts};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use xwen_chat::{encode_segments, ChatMessage, ChatTemplate, RenderOptions, TextStream};
use xwen_engine::{Engine, EngineOptions, EngineRequest, Output, RequestStats, Sampler, StopReason, Usage};

const HELP: &str = "commands: /exit (also exit, quit, Ctrl-D), /reset (clear the conversation), /system TEXT (set the \
system prompt; empty removes it), /save FILE and /load FILE (the conversation as JSON), /help; Ctrl-C stops a reply; \
a line ending in \\ continues on the next";

pub fn run(a: ChatArgs) -> Result<()> {
    let mut cfg = a.engine.engine_config()?;
    let mut draft = crate::draft_arg::prepare(&a.draft, &mut cfg, 1)?;
    if a.model.is_none() {
        eprintln!("{}", model_arg::DEMO_NOTE);
    }
    let mut loaded = model_arg::load(a.model.as_deref(), cfg, &a.engine)?;
    crate::gpu::place(&a.engine, &mut loaded.model)?;
    draft.place_model(&a.engine, &loaded.model)?;
    draft.attach(&mut loaded.model)?;
    let tok = &loaded.tokenizer;
    let template = ChatTemplate::from_gguf(loaded.model.gguf())
        .context("chat template")?
        .context("this GGUF has no tokenizer.chat_template; use `xwen run` for plain completion")?;
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(msg("system", a.escape.apply(s)));
    }
    let params = a.sampling.sampler_config().resolve(!a.no_think);
    if params.temperature > 0.0 && !a.engine.quiet {
        eprintln!("xwen: seed {} (--seed {} repeats this chat)", params.seed, params.seed);
    }
    // one sampler for the whole chat: each turn's sampling goes on from the last's
    let mut sampler = Some(Sampler::new(params.clone()));
    let drafter = draft.drafter(&loaded.model)?;
    let draft_name = drafter.as_ref().map_or("none", |d| d.name());
    // handed to the first turn; it then follows the slot's session from turn to turn
    let mut drafter = drafter.map(|d| (d, a.draft.draft_max as usize));

    let stop = tok.eos_ids();
    let opts = RenderOptions { add_generation_prompt: true, enable_thinking: !a.no_think, ..Default::default() };
    let limit = opts::token_limit(a.n_predict).unwrap_or(usize::MAX);
    let max_ctx = loaded.model.max_context();
    // one slot, whose session holds exactly the transcript's tokens and checkpoints between
    // turns: prefix reuse lives in the library
    let mut engine = Engine::new(loaded.model, EngineOptions { parallel: 1, draft: None, prefix: None });
    interrupt::install();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    eprintln!("xwen: chat ready; /help lists the commands");
    loop {
        let Some(line) = read_message(&stdin, &mut out)? else {
            writeln!(out)?;
            return Ok(());
        };
        if line.trim().is_empty() {
            continue;
        }
        let trimmed = line.trim();
        if trimmed == "exit" || trimmed == "quit" {
            return Ok(());
        }
        if let Some(cmd) = trimmed.strip_prefix('/') {
            let (name, arg) = cmd.split_once(' ').unwrap_or((cmd, ""));
            let arg = arg.trim();
            match name {
                "exit" | "quit" | "bye" => return Ok(()),
                "reset" | "clear" => {
                    messages.retain(|m| m.role == "system");
                    engine.reset_sessions();
                    eprintln!("xwen: conversation cleared");
                }
                "system" => {
                    messages.retain(|m| m.role != "system");
                    if !arg.is_empty() {
                        messages.insert(0, msg("system", arg.to_string()));
                    }
                    eprintln!("xwen: system prompt {}", if arg.is_empty() { "removed" } else { "set" });
                }
                "save" if !arg.is_empty() => match save(arg, &messages) {
                    Ok(()) => eprintln!("xwen: saved {} messages to {arg}", messages.len()),
                    Err(e) => eprintln!("xwen: /save {arg}: {e:#}"),
                },
                "load" if !arg.is_empty() => match load(arg) {
                    Ok(m) => {
                        messages = m;
                        // the state is kept: the next turn reuses what it shares with the loaded transcript
                        eprintln!("xwen: loaded {} messages from {arg}", messages.len());
                    }
                    Err(e) => eprintln!("xwen: /load {arg}: {e:#}"),
                },
                "save" | "load" => eprintln!("xwen: /{name} needs a file name: /{name} FILE"),
                "help" | "?" => eprintln!("{HELP}"),
                other => eprintln!("xwen: unknown command `/{other}` (/help lists them)"),
            }
            continue;
        }
        messages.push(msg("user", line));
        let ids = match template.render(&messages, &opts) {
            Ok(segs) => encode_segments(tok, &segs),
            Err(e) => {
                messages.pop();
                eprintln!("xwen: the chat template failed on this conversation: {e}");
                continue;
            }
        };
        // a reply must fit in the context: stop it where the context ends, and say so
        if ids.len() >= max_ctx {
            messages.pop();
            eprintln!(
                "xwen: the conversation ({} tokens) fills the context of {max_ctx} positions (-c); /reset to start over \
                 (a context shift is not possible: the recurrent layers' state cannot drop old tokens)",
                ids.len()
            );
            continue;
        }
        let mut reply_ids = Vec::new();
        let mut stream = TextStream::default();
        let mut progress = PrefillProgress::new(a.engine.quiet);
        interrupt::begin_reply();
        let req = EngineRequest {
            prefill_chunk: a.engine.prefill_chunk(),
            progress: true,
            draft: drafter.take(),
            sampler: sampler.take(),
            ..EngineRequest::new(ids.clone(), limit, stop.clone(), params.clone())
        };
        let id = engine.submit(req);
        let mut on_output = |o: Output, end: &mut Option<Result<(StopReason, Usage, RequestStats), String>>| match o {
            Output::Started { .. } => {}
            Output::Prefill { done, total } => progress.update(done, total),
            Output::Token { id: t, .. } => {
                progress.finish();
                reply_ids.push(t);
                if !stop.contains(&t) {
                    print!("{}", stream.push(tok, t));
                    let _ = std::io::stdout().flush();
                }
            }
            Output::Done { stop: why, usage, stats } => *end = Some(Ok((why, usage, stats))),
            Output::Failed(e) => *end = Some(Err(e)),
            Output::Shutdown => *end = Some(Err("the engine shut down".into())),
        };
        let mut end = None;
        while end.is_none() {
            if !engine.has_work() {
                end = Some(Err("the engine dropped the request".into()));
                break;
            }
            for (_, o) in engine.step() {
                on_output(o, &mut end);
            }
            // Ctrl-C: the reply ends after the tokens it has (before any, in the prefill)
            if end.is_none() && interrupt::stop_requested() {
                if let Some(o) = engine.cancel(id) {
                    on_output(o, &mut end);
                }
            }
        }
        progress.finish();
        let interrupted = interrupt::end_reply();
        sampler = Some(engine.take_sampler(id).unwrap_or_else(|| Sampler::new(params.clone())));
        let (stop_reason, usage, stats) = match end.expect("the loop ends with an end") {
            Ok(r) => r,
            Err(e) => {
                messages.pop();
                eprintln!("xwen: {e}");
                continue;
            }
        };
        println!("{}", stream.finish());
        if reply_ids.is_empty() {
            // stopped during the prefill: the turn is dropped, as if not sent
            messages.pop();
            eprintln!("xwen: stopped before the reply began; the message was not kept");
            continue;
        }
        let text = tok.decode(reply_ids.iter().copied().filter(|t| !stop.contains(t)).collect::<Vec<_>>().as_slice());
        messages.push(msg("assistant", text));
        match stop_reason {
            StopReason::ContextFull => eprintln!("xwen: the reply reached the end of the context (-c {max_ctx}); /reset to start over"),
            StopReason::Caller if interrupted => eprintln!("xwen: reply stopped (Ctrl-C); the chat goes on"),
            _ => {}
        }
        if a.engine.verbose {
            eprintln!(
                "xwen: prompt {} tokens: {} reused from the state{}, {} computed at {:.1} tok/s",
                ids.len(),
                usage.cached_tokens,
                if stats.restored { " (after restoring a checkpoint)" } else { "" },
                usage.prompt_tokens - usage.cached_tokens,
                stats.prefill_tps(&usage)
            );
        }
        if !a.engine.quiet {
            let generated = usage.completion_tokens;
            let draft = stats.drafts.as_ref().map(|s| crate::draft_arg::draft_line(draft_name, s, generated)).unwrap_or_default();
            eprintln!("[{generated} tok, {}{draft}]", crate::cmd_run::rate_text(generated.saturating_sub(1), stats.decode_tps(&usage)));
        }
    }
}

/// The next message: one line, or several joined where a line ends in `\`. None at the end of
/// input. A line that is not UTF-8 is reported and dropped.
fn read_message(stdin: &std::io::Stdin, out: &mut std::io::Stdout) -> Result<Option<String>> {
    let mut text = String::new();
    crate::interrupt::take_cleared();
    loop {
        write!(out, "{}", if text.is_empty() { "> " } else { ". " })?;
        out.flush()?;
        let mut raw = Vec::new();
        let n = stdin.lock().read_until(b'\n', &mut raw)?;
        if crate::interrupt::take_cleared() {
            // Ctrl-C while this message was typed: what came before it is dropped too
            text.clear();
        }
        if n == 0 {
            return Ok(if text.is_empty() { None } else { Some(text) });
        }
        let Ok(line) = String::from_utf8(raw) else {
            eprintln!("xwen: that line is not valid UTF-8; nothing was sent");
            text.clear();
            continue;
        };
        let line = line.trim_end_matches(['\n', '\r']);
        match line.strip_suffix('\\') {
            Some(head) => {
                text.push_str(head);
                text.push('\n');
            }
            None => {
                text.push_str(line);
                return Ok(Some(text));
            }
        }
    }
}

fn save(path: &str, messages: &[ChatMessage]) -> Result<()> {
    let items: Vec<Value> = messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect();
    let text = serde_json::to_string_pretty(&json!({"messages": items}))?;
    std::fs::write(path, text + "\n")?;
    Ok(())
}

/// A conversation saved by /save: `{"messages": [{"role", "content"}, ...]}` (a bare array of
/// messages, as the OpenAI API takes them, reads too).
fn load(path: &str) -> Result<Vec<ChatMessage>> {
    let bytes = std::fs::read(path)?;
    let v: Value = serde_json::from_slice(&bytes).context("not JSON")?;
    let items = match &v {
        Value::Array(a) => a,
        Value::Object(o) => match o.get("messages") {
            Some(Value::Array(a)) => a,
            _ => bail!("no \"messages\" array"),
        },
        _ => bail!("not a conversation (an object with \"messages\", or an array)"),
    };
    let mut out = Vec::new();
    for (i, m) in items.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).with_context(|| format!("message {i}: no \"role\""))?;
        if !matches!(role, "system" | "user" | "assistant") {
            bail!("message {i}: role `{role}` is not system, user or assistant");
        }
        let content = m.get("content").and_then(Value::as_str).with_context(|| format!("message {i}: \"content\" is not text"))?;
        out.push(msg(role, content.to_string()));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_conversation_loads_back() {
        let dir = std::env::temp_dir().join(format!("xwen-chat-save-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.json");
        let f = f.to_str().unwrap();
        let m = vec![msg("system", "be brief".into()), msg("user", "hi\nthere".into()), msg("assistant", "hello".into())];
        save(f, &m).unwrap();
        let back = load(f).unwrap();
        assert_eq!(back.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect::<Vec<_>>(), [("system", "be brief"), ("user", "hi\nthere"), ("assistant", "hello")]);
        std::fs::write(f, r#"[{"role": "tool", "content": "x"}]"#).unwrap();
        assert!(load(f).unwrap_err().to_string().contains("role"));
        std::fs::write(f, "not json").unwrap();
        assert!(load(f).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
