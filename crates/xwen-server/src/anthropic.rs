//! Anthropic's dialect: `/v1/messages` (system, content blocks, tool_use / tool_result,
//! thinking blocks, stop_sequences) and `/v1/messages/count_tokens`. A stream is the exact event
//! sequence the SDKs expect: message_start, ping, then per block content_block_start / _delta /
//! _stop, then message_delta (stop reason, output tokens) and message_stop.

use crate::error::{ApiError, ApiResult, Dialect, Kind};
use crate::generation::{Finish, Gen, Prepared};
use crate::common::{body, counted, new_id, sse, AppState};
use crate::params::{parse_object, thinking_options, Body};
use crate::reply::Piece;
use crate::tool_parse::{tools_named, ToolSchemas};
use crate::App;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc;
use xwen_chat::{ChatMessage, RenderOptions, ToolCall};

const D: Dialect = Dialect::Anthropic;

fn text_of_blocks(field: &str, v: &Value) -> ApiResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => out.push_str(b.get("text").and_then(Value::as_str).ok_or_else(|| ApiError::param(D, field, format!("a text block in `{field}` needs a string `text`")))?),
                    Some(t) => return Err(ApiError::param(D, field, format!("blocks of type `{t}` are not supported in `{field}` (text only)"))),
                    None => return Err(ApiError::param(D, field, format!("each block in `{field}` needs a `type`"))),
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::param(D, field, format!("`{field}` must be a string or an array of text blocks"))),
    }
}

/// Anthropic messages → the template's messages (tool results become "tool" turns).
fn convert_messages(system: Option<&Value>, msgs: &[Value]) -> ApiResult<Vec<ChatMessage>> {
    let mut out = Vec::new();
    if let Some(s) = system {
        let s = text_of_blocks("system", s)?;
        if !s.is_empty() {
            out.push(ChatMessage::new("system", &s));
        }
    }
    let mut names: std::collections::HashMap<String, String> = Default::default();
    for (i, m) in msgs.iter().enumerate() {
        let field = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::param(D, "messages", format!("{field}.role must be a string")))?;
        if role != "user" && role != "assistant" {
            return Err(ApiError::param(D, "messages", format!("{field}.role `{role}` is not user or assistant (the system prompt goes in `system`)")));
        }
        let content = m.get("content").ok_or_else(|| ApiError::param(D, "messages", format!("{field}.content is required")))?;
        let blocks: Vec<Value> = match content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(a) => a.clone(),
            _ => return Err(ApiError::param(D, "messages", format!("{field}.content must be a string or an array of blocks"))),
        };
        let mut msg = ChatMessage::new(role, "");
        for (j, b) in blocks.iter().enumerate() {
            let bf = format!("{field}.content[{j}]");
            let ty = b.get("type").and_then(Value::as_str).ok_or_else(|| ApiError::param(D, "messages", format!("{bf}.type must be a string")))?;
            let s = |k: &str| b.get(k).and_then(Value::as_str).map(str::to_string).ok_or_else(|| ApiError::param(D, "messages", format!("{bf}.{k} must be a string")));
            match (role, ty) {
                (_, "text") => msg.content.push_str(&s("text")?),
                ("assistant", "thinking") => msg.reasoning_content.get_or_insert_with(String::new).push_str(&s("thinking")?),
                ("assistant", "redacted_thinking") => {}
                ("assistant", "tool_use") => {
                    let input = b.get("input").cloned().unwrap_or(Value::Object(Map::new()));
                    if !input.is_object() {
                        return Err(ApiError::param(D, "messages", format!("{bf}.input must be an object")));
                    }
                    let (id, name) = (s("id")?, s("name")?);
                    names.insert(id.clone(), name.clone());
                    msg.tool_calls.push(ToolCall { id: Some(id), name, arguments: input });
                }
                ("user", "tool_result") => {
                    let id = s("tool_use_id")?;
                    let text = match b.get("content") {
                        None => String::new(),
                        Some(c) => text_of_blocks("messages", c)?,
                    };
                    let mut t = ChatMessage::new("tool", &text);
                    t.name = names.get(&id).cloned();
                    t.tool_call_id = Some(id);
                    out.push(t);
                }
                (_, other) => return Err(ApiError::param(D, "messages", format!("{bf}: blocks of type `{other}` are not supported in a {role} message"))),
            }
        }
        if !(msg.content.is_empty() && msg.tool_calls.is_empty() && msg.reasoning_content.is_none() && role == "user") {
            out.push(msg);
        }
    }
    Ok(out)
}

/// Anthropic tools (`{name, description, input_schema}`) in the OpenAI shape templates read.
fn convert_tools(tools: Option<&Vec<Value>>) -> ApiResult<Option<Vec<Value>>> {
    let Some(tools) = tools else { return Ok(None) };
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let name = t.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| ApiError::param(D, "tools", format!("tools[{i}].name must be a non-empty string")))?;
        let schema = t.get("input_schema").cloned().unwrap_or(json!({"type": "object", "properties": {}}));
        if !schema.is_object() {
            return Err(ApiError::param(D, "tools", format!("tools[{i}].input_schema must be a JSON schema object")));
        }
        let mut f = json!({"name": name, "parameters": schema});
        if let Some(d) = t.get("description").and_then(Value::as_str) {
            f["description"] = json!(d);
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok((!out.is_empty()).then_some(out))
}

struct MessagesReq {
    prepared: Prepared,
    stream: bool,
    single_call: bool,
}

fn parse(app: &App, o: &Map<String, Value>, for_count: bool) -> ApiResult<MessagesReq> {
    let b = Body::new(D, o);
    app.check_model(D, b.str("model")?)?;
    let max_tokens = if for_count {
        None
    } else {
        Some(b.int_in("max_tokens", 0, i64::MAX)?.ok_or_else(|| b.err("max_tokens", "`max_tokens` (an integer) is required"))? as usize)
    };
    let msgs = b.array("messages")?.ok_or_else(|| b.err("messages", "`messages` (a non-empty array) is required"))?;
    if msgs.is_empty() {
        return Err(b.err("messages", "`messages` must not be empty"));
    }
    let messages = convert_messages(b.get("system"), msgs)?;
    let tools = convert_tools(b.array("tools")?)?;
    let (mut choice_none, mut single_call) = (false, false);
    // `any` / `tool`: the reply is one call, enforced by a grammar
    let mut forced: Option<Vec<Value>> = None;
    if let Some(tc) = b.object("tool_choice")? {
        match tc.get("type").and_then(Value::as_str) {
            Some("auto") => {}
            Some("any") => {
                forced = Some(tools.clone().ok_or_else(|| b.err("tool_choice", "`tool_choice` any needs `tools`"))?);
            }
            Some("none") => choice_none = true,
            Some("tool") => {
                let n = tc.get("name").and_then(Value::as_str).ok_or_else(|| b.err("tool_choice", "`tool_choice` of type tool needs a `name`"))?;
                let named = tools_named(&tools, n);
                if named.is_empty() {
                    return Err(b.err("tool_choice", format!("`tool_choice` names `{n}`, which is not among the tools")));
                }
                forced = Some(named);
            }
            _ => return Err(b.err("tool_choice", "`tool_choice.type` must be auto, any, tool or none")),
        }
        single_call = tc.get("disable_parallel_tool_use").and_then(Value::as_bool).unwrap_or(false);
    }
    // thinking: off unless the request enables it (`thinking: {type: "enabled"}`), as
    // Anthropic's API answers; `chat_template_kwargs.enable_thinking` may still turn it on
    let mut thinking = false;
    if let Some(t) = b.object("thinking")? {
        match t.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive") => {
                thinking = true;
                let budget = t.get("budget_tokens").and_then(Value::as_i64);
                if budget.is_some_and(|x| x < 1) {
                    return Err(b.err("thinking", "`thinking.budget_tokens` must be positive"));
                }
            }
            Some("disabled") => thinking = false,
            _ => return Err(b.err("thinking", "`thinking.type` must be enabled, adaptive or disabled")),
        }
    }
    let (mut thinking, mut extra) = thinking_options(&b, thinking)?;
    // the choice as chat templates read it (Kimi-K3.jinja)
    if forced.is_some() || choice_none {
        extra.entry("tool_choice").or_insert_with(|| Value::String(if choice_none { "none" } else { "required" }.into()));
    }
    let processor = match forced {
        Some(f) if !for_count => {
            // the grammar covers the whole reply: no thinking first
            thinking = false;
            Some(app.call_constraint(D, &f)?)
        }
        _ => None,
    };
    // Anthropic's temperature is 0..1 (the shared reader allows OpenAI's 0..2)
    b.f32_in("temperature", 0.0, 1.0)?;
    let sampler = b.sampler(app.tok.vocab_size())?;
    let render_tools = if choice_none { None } else { tools.clone().map(Value::Array) };
    let opts = RenderOptions { add_generation_prompt: true, enable_thinking: thinking, tools: render_tools, extra };
    let rendered = app.render(D, &messages, &opts)?;
    let schemas = if choice_none { None } else { tools.as_ref().map(|t| ToolSchemas::from_openai(t)) };
    Ok(MessagesReq {
        prepared: Prepared {
            prompt: rendered.ids,
            max_tokens,
            sampling: sampler.resolve(thinking),
            stops: b.stops("stop_sequences")?,
            logprobs: None,
            in_reasoning: rendered.in_reasoning,
            reasoning: true,
            tools: schemas,
            ignore_eos: b.bool("ignore_eos")?.unwrap_or(false),
            checkpoints: rendered.boundary.into_iter().collect(),
            processor,
        },
        stream: b.bool("stream")?.unwrap_or(false),
        single_call,
    })
}

pub async fn count_tokens(State(app): AppState, b: Result<Bytes, BytesRejection>) -> ApiResult<Json<Value>> {
    let o = parse_object(D, &body(D, app.max_body, b)?)?;
    let r = parse(&app, &o, true)?;
    Ok(Json(json!({"input_tokens": r.prepared.prompt.len()})))
}

fn stop_reason(f: Option<&Finish>) -> (&'static str, Value) {
    match f {
        Some(Finish::Length) => ("max_tokens", Value::Null),
        Some(Finish::ToolCalls) => ("tool_use", Value::Null),
        Some(Finish::StopSequence(s)) => ("stop_sequence", Value::String(s.clone())),
        _ => ("end_turn", Value::Null),
    }
}

fn usage(g: &Gen) -> Value {
    json!({
        "input_tokens": g.prompt_tokens - g.cached,
        "cache_read_input_tokens": g.cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": g.completion_tokens,
    })
}

pub async fn messages(State(app): AppState, b: Result<Bytes, BytesRejection>) -> Response {
    counted(&app, inner(app.clone(), b)).await
}

fn ev(name: &str, v: Value) -> Result<Event, Infallible> {
    Ok(Event::default().event(name).data(v.to_string()))
}

async fn inner(app: Arc<App>, b: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let o = parse_object(D, &body(D, app.max_body, b)?)?;
    let req = parse(&app, &o, false)?;
    let mut g = app.start(D, req.prepared)?;
    g.started(D).await?;
    let id = new_id("msg_");
    let model = app.model_id().to_string();
    let single = req.single_call;
    if !req.stream {
        let mut content: Vec<Value> = Vec::new();
        let mut calls = 0;
        while let Some(c) = g.next().await {
            for p in c.pieces {
                match (p, content.last_mut()) {
                    (Piece::Reasoning(t), Some(last)) if last["type"] == "thinking" => {
                        let s = format!("{}{t}", last["thinking"].as_str().unwrap_or(""));
                        last["thinking"] = json!(s);
                    }
                    (Piece::Reasoning(t), _) => content.push(json!({"type": "thinking", "thinking": t, "signature": ""})),
                    (Piece::Content(t), Some(last)) if last["type"] == "text" => {
                        let s = format!("{}{t}", last["text"].as_str().unwrap_or(""));
                        last["text"] = json!(s);
                    }
                    (Piece::Content(t), _) => content.push(json!({"type": "text", "text": t})),
                    (Piece::ToolCall(call), _) => {
                        if single && calls > 0 {
                            continue;
                        }
                        calls += 1;
                        content.push(json!({"type": "tool_use", "id": new_id("toolu_"), "name": call.name, "input": Value::Object(call.arguments)}));
                    }
                }
            }
        }
        if let Some(Finish::Error(e)) = g.finish() {
            return Err(ApiError::new(D, Kind::Internal, format!("the engine failed: {e}")));
        }
        let (reason, seq) = stop_reason(g.finish());
        return Ok(Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": seq, "usage": usage(&g),
        }))
        .into_response());
    }
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": Value::Null, "stop_sequence": Value::Null,
            "usage": {"input_tokens": g.prompt_tokens - g.cached, "cache_read_input_tokens": g.cached, "cache_creation_input_tokens": 0, "output_tokens": 0},
        }});
        if tx.send(ev("message_start", start)).await.is_err() || tx.send(ev("ping", json!({"type": "ping"}))).await.is_err() {
            return;
        }
        // the open block: its index and kind ("thinking" / "text")
        let mut open: Option<(usize, &'static str)> = None;
        let mut next_index = 0usize;
        let mut calls = 0;
        let mut events: Vec<(&'static str, Value)> = Vec::new();
        let close = |open: &mut Option<(usize, &'static str)>, events: &mut Vec<(&'static str, Value)>| {
            if let Some((i, kind)) = open.take() {
                if kind == "thinking" {
                    events.push(("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": {"type": "signature_delta", "signature": ""}})));
                }
                events.push(("content_block_stop", json!({"type": "content_block_stop", "index": i})));
            }
        };
        while let Some(c) = g.next().await {
            for p in c.pieces {
                match p {
                    Piece::Reasoning(t) | Piece::Content(t) if t.is_empty() => {}
                    Piece::Reasoning(t) => {
                        if open.map(|o| o.1) != Some("thinking") {
                            close(&mut open, &mut events);
                            open = Some((next_index, "thinking"));
                            events.push(("content_block_start", json!({"type": "content_block_start", "index": next_index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}})));
                            next_index += 1;
                        }
                        let i = open.map_or(0, |o| o.0);
                        events.push(("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": {"type": "thinking_delta", "thinking": t}})));
                    }
                    Piece::Content(t) => {
                        if open.map(|o| o.1) != Some("text") {
                            close(&mut open, &mut events);
                            open = Some((next_index, "text"));
                            events.push(("content_block_start", json!({"type": "content_block_start", "index": next_index, "content_block": {"type": "text", "text": ""}})));
                            next_index += 1;
                        }
                        let i = open.map_or(0, |o| o.0);
                        events.push(("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": t}})));
                    }
                    Piece::ToolCall(call) => {
                        if single && calls > 0 {
                            continue;
                        }
                        calls += 1;
                        close(&mut open, &mut events);
                        let i = next_index;
                        next_index += 1;
                        events.push(("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": new_id("toolu_"), "name": call.name, "input": {}}})));
                        events.push(("content_block_delta", json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": Value::Object(call.arguments).to_string()}})));
                        events.push(("content_block_stop", json!({"type": "content_block_stop", "index": i})));
                    }
                }
            }
            for (name, v) in events.drain(..) {
                if tx.send(ev(name, v)).await.is_err() {
                    return;
                }
            }
        }
        if let Some(Finish::Error(e)) = g.finish() {
            let err = ApiError::new(D, Kind::Internal, format!("the engine failed: {e}"));
            let _ = tx.send(ev("error", err.body())).await;
            return;
        }
        close(&mut open, &mut events);
        let (reason, seq) = stop_reason(g.finish());
        events.push(("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": {"output_tokens": g.completion_tokens}})));
        events.push(("message_stop", json!({"type": "message_stop"})));
        for (name, v) in events.drain(..) {
            if tx.send(ev(name, v)).await.is_err() {
                return;
            }
        }
    });
    Ok(sse(rx))
}
