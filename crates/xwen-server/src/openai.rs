//! OpenAI's dialect: `/v1/chat/completions` and `/v1/completions`, streamed (SSE chunks ending
//! in `data: [DONE]`) or not. Reasoning comes back as `reasoning_content` (llama-server's and
//! vLLM's field), tool calls as `tool_calls`, usage with `prompt_tokens_details.cached_tokens`.

use crate::error::{ApiError, ApiResult, Dialect};
use crate::generation::{Chunk, Finish, Gen, LogprobEntry, Prepared};
use crate::common::{body, counted, data, new_id, sse, AppState};
use crate::params::{content_text, parse_object, thinking_options, Body};
use crate::reply::Piece;
use crate::tool_parse::{tools_named, ParsedCall, ToolSchemas};
use crate::App;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tokio::sync::mpsc;
use xwen_chat::{ChatMessage, RenderOptions, ToolCall};

const D: Dialect = Dialect::OpenAi;

/// How the request wants tools used.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

impl ToolChoice {
    /// The choice as chat templates read it (`tool_choice`: Kimi-K3.jinja tells the model
    /// "You MUST call tools" / "MUST NOT"): None for auto.
    pub fn template_value(&self) -> Option<Value> {
        match self {
            ToolChoice::Auto => None,
            ToolChoice::None => Some(Value::String("none".into())),
            ToolChoice::Required | ToolChoice::Named(_) => Some(Value::String("required".into())),
        }
    }
}

/// Validates an OpenAI `tools` array; returns it (chat-completions shape).
pub fn parse_tools(d: Dialect, v: Option<&Vec<Value>>) -> ApiResult<Option<Vec<Value>>> {
    let Some(tools) = v else { return Ok(None) };
    for (i, t) in tools.iter().enumerate() {
        let ty = t.get("type").and_then(Value::as_str);
        if ty != Some("function") {
            return Err(ApiError::param(d, "tools", format!("tools[{i}].type must be \"function\"")));
        }
        let f = t.get("function").and_then(Value::as_object).ok_or_else(|| ApiError::param(d, "tools", format!("tools[{i}].function must be an object")))?;
        match f.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => {}
            _ => return Err(ApiError::param(d, "tools", format!("tools[{i}].function.name must be a non-empty string"))),
        }
        if let Some(p) = f.get("parameters") {
            if !p.is_object() {
                return Err(ApiError::param(d, "tools", format!("tools[{i}].function.parameters must be a JSON schema object")));
            }
        }
    }
    Ok((!tools.is_empty()).then(|| tools.clone()))
}


fn parse_tool_choice(b: &Body, tools: &Option<Vec<Value>>) -> ApiResult<ToolChoice> {
    let choice = match b.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => return Err(b.err("tool_choice", format!("`tool_choice` `{other}` is not one of auto, none, required or a named function"))),
        },
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(n) if v.get("type").and_then(Value::as_str) == Some("function") => ToolChoice::Named(n.to_string()),
            _ => return Err(b.err("tool_choice", "`tool_choice` must be a string or {\"type\": \"function\", \"function\": {\"name\": …}}")),
        },
    };
    match &choice {
        ToolChoice::Required if tools.is_none() => Err(b.err("tool_choice", "`tool_choice` is required but the request has no tools")),
        ToolChoice::Named(n) if tools_named(tools, n).is_empty() => Err(b.err("tool_choice", format!("`tool_choice` names `{n}`, which is not among the tools"))),
        _ => Ok(choice),
    }
}

fn parse_message(i: usize, m: &Value) -> ApiResult<ChatMessage> {
    let field = format!("messages[{i}]");
    let o = m.as_object().ok_or_else(|| ApiError::param(D, "messages", format!("{field} must be an object")))?;
    let role = o.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::param(D, "messages", format!("{field}.role must be a string")))?;
    let role = match role {
        "system" | "developer" => "system",
        "user" | "assistant" | "tool" => role,
        other => return Err(ApiError::param(D, "messages", format!("{field}.role `{other}` is not one of system, developer, user, assistant, tool"))),
    };
    let mut msg = ChatMessage::new(role, &content_text(D, "messages", o.get("content"))?);
    if let Some(r) = o.get("reasoning_content").filter(|v| !v.is_null()) {
        msg.reasoning_content = Some(r.as_str().ok_or_else(|| ApiError::param(D, "messages", format!("{field}.reasoning_content must be a string")))?.to_string());
    }
    if let Some(calls) = o.get("tool_calls").filter(|v| !v.is_null()) {
        let calls = calls.as_array().ok_or_else(|| ApiError::param(D, "messages", format!("{field}.tool_calls must be an array")))?;
        for (j, c) in calls.iter().enumerate() {
            let name = c.pointer("/function/name").and_then(Value::as_str).ok_or_else(|| ApiError::param(D, "messages", format!("{field}.tool_calls[{j}].function.name must be a string")))?;
            let arguments = match c.pointer("/function/arguments") {
                Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                    Ok(v @ Value::Object(_)) => v,
                    _ if s.trim().is_empty() => Value::Object(Map::new()),
                    _ => return Err(ApiError::param(D, "messages", format!("{field}.tool_calls[{j}].function.arguments must be a JSON object (as a string)"))),
                },
                Some(v @ Value::Object(_)) => v.clone(),
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(_) => return Err(ApiError::param(D, "messages", format!("{field}.tool_calls[{j}].function.arguments must be a string"))),
            };
            msg.tool_calls.push(ToolCall { id: c.get("id").and_then(Value::as_str).map(str::to_string), name: name.to_string(), arguments });
        }
    }
    msg.tool_call_id = o.get("tool_call_id").and_then(Value::as_str).map(str::to_string);
    msg.name = o.get("name").and_then(Value::as_str).map(str::to_string);
    Ok(msg)
}

/// The constraint of a structured-output format (`type` text, json_object or json_schema with
/// its `schema`, found at `schema_path`): None for text. Shared by chat's `response_format`
/// and the Responses API's `text.format`.
pub fn format_processor(
    app: &App,
    b: &Body,
    field: &str,
    ty: Option<&str>,
    schema: Option<&Value>,
    // where the request spells the type and the schema, for the error messages
    paths: (&str, &str),
) -> ApiResult<Option<Box<dyn xwen_engine::LogitsProcessor>>> {
    let (type_path, schema_path) = paths;
    let grammar = match ty {
        Some("text") => return Ok(None),
        Some("json_object") => crate::structured::json_grammar(json!({"type": "object"})),
        Some("json_schema") => {
            let schema = schema.filter(|s| s.is_object() || s.is_boolean());
            let schema = schema.ok_or_else(|| b.err(field, format!("`{schema_path}` (a JSON schema) is required")))?;
            crate::structured::json_grammar(schema.clone())
        }
        _ => return Err(b.err(field, format!("`{type_path}` must be text, json_object or json_schema"))),
    };
    app.constraint(b.d, field, grammar).map(Some)
}

/// A tool choice that forces a call (required, or one named function) becomes the call
/// grammar; it cannot stand beside a format constraint (`format_field` names that one).
pub fn forced_tools_processor(
    app: &App,
    b: &Body,
    choice: &ToolChoice,
    tools: &Option<Vec<Value>>,
    processor: Option<Box<dyn xwen_engine::LogitsProcessor>>,
    format_field: &str,
) -> ApiResult<Option<Box<dyn xwen_engine::LogitsProcessor>>> {
    let forced: Option<Vec<Value>> = match choice {
        ToolChoice::Required => tools.clone(),
        ToolChoice::Named(n) => Some(tools_named(tools, n)),
        _ => None,
    };
    let Some(f) = forced else { return Ok(processor) };
    if processor.is_some() {
        return Err(b.err("tool_choice", format!("`tool_choice` required or named cannot be combined with a `{format_field}` schema")));
    }
    app.call_constraint(b.d, &f).map(Some)
}

/// `max_completion_tokens` (or the older `max_tokens`): None is until the context is full.
fn max_tokens(b: &Body) -> ApiResult<Option<usize>> {
    let a = b.int_in("max_completion_tokens", 0, i64::MAX)?;
    let c = b.int_in("max_tokens", -1, i64::MAX)?;
    Ok(a.or(c).filter(|&n| n >= 0).map(|n| n as usize))
}

fn logprobs_field(b: &Body) -> ApiResult<Option<usize>> {
    let on = b.bool("logprobs")?.unwrap_or(false);
    let top = b.int_in("top_logprobs", 0, 20)?;
    if top.is_some() && !on {
        return Err(b.err("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
    }
    Ok(on.then(|| top.unwrap_or(0) as usize))
}

fn check_n(b: &Body) -> ApiResult<()> {
    match b.int_in("n", 1, 1_000_000)? {
        None | Some(1) => Ok(()),
        Some(_) => Err(b.err("n", "only `n: 1` is supported")),
    }
}

struct ChatReq {
    prepared: Prepared,
    text: String,
    stream: bool,
    include_usage: bool,
    parallel_calls: bool,
}

fn parse_chat(app: &App, o: &Map<String, Value>) -> ApiResult<ChatReq> {
    let b = Body::new(D, o);
    app.check_model(D, b.str("model")?)?;
    check_n(&b)?;
    let msgs = b.array("messages")?.ok_or_else(|| b.err("messages", "`messages` (a non-empty array) is required"))?;
    if msgs.is_empty() {
        return Err(b.err("messages", "`messages` must not be empty"));
    }
    let messages = msgs.iter().enumerate().map(|(i, m)| parse_message(i, m)).collect::<ApiResult<Vec<_>>>()?;
    let tools = parse_tools(D, b.array("tools")?)?;
    let choice = parse_tool_choice(&b, &tools)?;
    let (mut thinking, mut extra) = thinking_options(&b, true)?;
    if let Some(tc) = choice.template_value() {
        extra.entry("tool_choice").or_insert(tc);
    }
    // a constraint covers the whole reply, so a constrained request does not think first
    let mut processor = None;
    if let Some(rf) = b.object("response_format")? {
        // templates that describe the format to the model read it (Kimi-K3.jinja)
        extra.entry("response_format").or_insert_with(|| Value::Object(rf.clone()));
        let schema = rf.get("json_schema").and_then(|j| j.get("schema"));
        processor = format_processor(app, &b, "response_format", rf.get("type").and_then(Value::as_str), schema, ("response_format.type", "response_format.json_schema.schema"))?;
    }
    processor = forced_tools_processor(app, &b, &choice, &tools, processor, "response_format")?;
    if processor.is_some() {
        thinking = false;
    }
    let stream = b.bool("stream")?.unwrap_or(false);
    let include_usage = match b.object("stream_options")? {
        Some(so) => Body::new(D, so).bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    let parallel_calls = b.bool("parallel_tool_calls")?.unwrap_or(true);
    let render_tools = if choice == ToolChoice::None { None } else { tools.clone().map(Value::Array) };
    let opts = RenderOptions { add_generation_prompt: true, enable_thinking: thinking, tools: render_tools, extra };
    let rendered = app.render(D, &messages, &opts)?;
    let cfg = b.sampler(app.tok.vocab_size())?;
    let schemas = (choice != ToolChoice::None).then(|| tools.as_ref().map(|t| ToolSchemas::from_openai(t))).flatten();
    Ok(ChatReq {
        prepared: Prepared {
            prompt: rendered.ids,
            max_tokens: max_tokens(&b)?,
            sampling: cfg.resolve(thinking),
            stops: b.stops("stop")?,
            logprobs: logprobs_field(&b)?,
            in_reasoning: rendered.in_reasoning,
            reasoning: true,
            tools: schemas,
            ignore_eos: b.bool("ignore_eos")?.unwrap_or(false),
            checkpoints: rendered.boundary.into_iter().collect(),
            processor,
        },
        stream,
        include_usage,
        parallel_calls,
        text: rendered.text,
    })
}

/// llama-server's `/apply-template`: the chat request's prompt as text, its token count and
/// the message boundary a checkpoint is taken at.
pub async fn apply_template(State(app): AppState, b: Result<Bytes, BytesRejection>) -> ApiResult<Json<Value>> {
    let o = parse_object(D, &body(D, app.max_body, b)?)?;
    let r = parse_chat(&app, &o)?;
    Ok(Json(json!({"prompt": r.text, "n_tokens": r.prepared.prompt.len(), "boundary": r.prepared.checkpoints.first()})))
}

pub fn finish_reason(f: Option<&Finish>) -> &'static str {
    match f {
        Some(Finish::Length) => "length",
        Some(Finish::ToolCalls) => "tool_calls",
        _ => "stop",
    }
}

fn usage(g: &Gen) -> Value {
    json!({
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "total_tokens": g.prompt_tokens + g.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": g.cached},
    })
}

fn logprob_json(e: &LogprobEntry) -> Value {
    json!({
        "token": e.token,
        "logprob": e.logprob,
        "bytes": e.bytes,
        "top_logprobs": e.top.iter().map(|(t, b, l)| json!({"token": t, "logprob": l, "bytes": b})).collect::<Vec<_>>(),
    })
}

pub(crate) fn call_json(c: &ParsedCall, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": new_id("call_"),
        "type": "function",
        "function": {"name": c.name, "arguments": Value::Object(c.arguments.clone()).to_string()},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

pub async fn chat_completions(State(app): AppState, b: Result<Bytes, BytesRejection>) -> Response {
    counted(&app, chat_inner(app.clone(), b)).await
}


async fn chat_inner(app: Arc<App>, b: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let o = parse_object(D, &body(D, app.max_body, b)?)?;
    let req = parse_chat(&app, &o)?;
    let mut g = app.start(D, req.prepared)?;
    g.started(D).await?;
    let id = new_id("chatcmpl-");
    let model = app.model_id().to_string();
    let parallel = req.parallel_calls;
    if !req.stream {
        let (mut content, mut reasoning, mut calls, mut lps) = (String::new(), String::new(), Vec::new(), Vec::new());
        while let Some(c) = g.next().await {
            collect(c, &mut content, &mut reasoning, &mut calls, &mut lps);
        }
        if let Some(Finish::Error(e)) = g.finish() {
            return Err(ApiError::new(D, crate::error::Kind::Internal, format!("the engine failed: {e}")));
        }
        if !parallel {
            calls.truncate(1);
        }
        let mut message = json!({"role": "assistant", "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(content) }});
        if !reasoning.is_empty() {
            message["reasoning_content"] = Value::String(reasoning);
        }
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls.iter().map(|c| call_json(c, None)).collect());
        }
        let logprobs = (!lps.is_empty()).then(|| json!({"content": lps.iter().map(logprob_json).collect::<Vec<_>>()}));
        return Ok(Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": g.created,
            "model": model,
            "system_fingerprint": concat!("xwen-", env!("CARGO_PKG_VERSION")),
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason(g.finish())}],
            "usage": usage(&g),
        }))
        .into_response());
    }
    let (tx, rx) = mpsc::channel(64);
    let include_usage = req.include_usage;
    tokio::spawn(async move {
        let created = g.created;
        let chunk = |delta: Value, finish: Option<&str>, lp: Option<Value>| {
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": concat!("xwen-", env!("CARGO_PKG_VERSION")),
                "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}],
            })
        };
        if tx.send(data(&chunk(json!({"role": "assistant", "content": ""}), None, None))).await.is_err() {
            return;
        }
        let mut calls = 0usize;
        while let Some(c) = g.next().await {
            let lp = (!c.logprobs.is_empty()).then(|| json!({"content": c.logprobs.iter().map(logprob_json).collect::<Vec<_>>()}));
            let mut events = Vec::new();
            for p in c.pieces {
                let delta = match p {
                    Piece::Content(t) => json!({"content": t}),
                    Piece::Reasoning(t) => json!({"reasoning_content": t}),
                    Piece::ToolCall(call) => {
                        if !parallel && calls > 0 {
                            continue;
                        }
                        calls += 1;
                        json!({"tool_calls": [call_json(&call, Some(calls - 1))]})
                    }
                };
                events.push(delta);
            }
            if events.is_empty() && lp.is_some() {
                events.push(json!({}));
            }
            let mut lp = lp;
            for delta in events {
                if tx.send(data(&chunk(delta, None, lp.take()))).await.is_err() {
                    return;
                }
            }
        }
        if let Some(Finish::Error(e)) = g.finish() {
            let err = ApiError::new(D, crate::error::Kind::Internal, format!("the engine failed: {e}"));
            let _ = tx.send(data(&err.body())).await;
            return;
        }
        let fin = finish_reason(g.finish());
        let _ = tx.send(data(&chunk(json!({}), Some(fin), None))).await;
        if include_usage {
            let u = json!({"id": id, "object": "chat.completion.chunk", "created": g.created, "model": model, "choices": [], "usage": usage(&g)});
            let _ = tx.send(data(&u)).await;
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Ok(sse(rx))
}

fn collect(c: Chunk, content: &mut String, reasoning: &mut String, calls: &mut Vec<ParsedCall>, lps: &mut Vec<LogprobEntry>) {
    for p in c.pieces {
        match p {
            Piece::Content(t) => content.push_str(&t),
            Piece::Reasoning(t) => reasoning.push_str(&t),
            Piece::ToolCall(call) => calls.push(call),
        }
    }
    lps.extend(c.logprobs);
}

/// `/v1/completions`: a prompt string (or one array of ids), no template.
pub async fn completions(State(app): AppState, b: Result<Bytes, BytesRejection>) -> Response {
    counted(&app, completions_inner(app.clone(), b)).await
}

fn completion_prompt(app: &App, b: &Body) -> ApiResult<Vec<u32>> {
    let vocab = app.tok.vocab_size();
    let ids = |a: &Vec<Value>| -> ApiResult<Vec<u32>> {
        a.iter().map(|t| t.as_u64().filter(|&x| (x as usize) < vocab).map(|x| x as u32).ok_or_else(|| b.err("prompt", format!("token ids in `prompt` must be below {vocab}")))).collect()
    };
    match b.get("prompt") {
        Some(Value::String(s)) => Ok(app.tok.encode(s)),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) && !a.is_empty() => ids(a),
        Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
            Value::String(s) => Ok(app.tok.encode(s)),
            Value::Array(x) => ids(x),
            _ => Err(b.err("prompt", "`prompt` must be a string, an array of token ids, or one of either in an array")),
        },
        Some(Value::Array(a)) if a.len() > 1 => Err(b.err("prompt", "one prompt per request is supported")),
        None => Err(b.err("prompt", "`prompt` is required")),
        _ => Err(b.err("prompt", "`prompt` must be a string, an array of token ids, or one of either in an array")),
    }
}

async fn completions_inner(app: Arc<App>, b: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let o = parse_object(D, &body(D, app.max_body, b)?)?;
    let b = Body::new(D, &o);
    app.check_model(D, b.str("model")?)?;
    check_n(&b)?;
    if b.bool("echo")?.unwrap_or(false) {
        return Err(b.err("echo", "`echo` is not supported"));
    }
    let prompt = completion_prompt(&app, &b)?;
    let top = b.int_in("logprobs", 0, 20)?.map(|n| n as usize);
    let stream = b.bool("stream")?.unwrap_or(false);
    let include_usage = match b.object("stream_options")? {
        Some(so) => Body::new(D, so).bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    let cfg = b.sampler(app.tok.vocab_size())?;
    // OpenAI's completions default is 16 tokens
    let max = b.int_in("max_tokens", -1, i64::MAX)?.map_or(Some(16), |n| (n >= 0).then_some(n as usize));
    let prepared = Prepared { prompt, max_tokens: max, sampling: cfg.resolve(false), stops: b.stops("stop")?, logprobs: top, in_reasoning: false, reasoning: false, tools: None, ignore_eos: b.bool("ignore_eos")?.unwrap_or(false), checkpoints: Vec::new(), processor: None };
    let mut g = app.start(D, prepared)?;
    g.started(D).await?;
    let id = new_id("cmpl-");
    let model = app.model_id().to_string();
    let lp_json = |lps: &[LogprobEntry], offset0: usize| {
        let mut off = offset0;
        let mut offsets = Vec::new();
        for e in lps {
            offsets.push(off);
            off += e.token.len();
        }
        json!({
            "tokens": lps.iter().map(|e| e.token.clone()).collect::<Vec<_>>(),
            "token_logprobs": lps.iter().map(|e| e.logprob).collect::<Vec<_>>(),
            "top_logprobs": lps.iter().map(|e| e.top.iter().map(|(t, _, l)| (t.clone(), json!(l))).collect::<Map<_, _>>()).collect::<Vec<_>>(),
            "text_offset": offsets,
        })
    };
    if !stream {
        let (mut text, mut r, mut calls, mut lps) = (String::new(), String::new(), Vec::new(), Vec::new());
        while let Some(c) = g.next().await {
            collect(c, &mut text, &mut r, &mut calls, &mut lps);
        }
        if let Some(Finish::Error(e)) = g.finish() {
            return Err(ApiError::new(D, crate::error::Kind::Internal, format!("the engine failed: {e}")));
        }
        let logprobs = top.map(|_| lp_json(&lps, 0));
        return Ok(Json(json!({
            "id": id, "object": "text_completion", "created": g.created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason(g.finish())}],
            "usage": usage(&g),
        }))
        .into_response());
    }
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut offset = 0;
        while let Some(c) = g.next().await {
            let mut text = String::new();
            for p in &c.pieces {
                if let Piece::Content(t) | Piece::Reasoning(t) = p {
                    text.push_str(t);
                }
            }
            let lp = top.map(|_| lp_json(&c.logprobs, offset));
            offset += text.len();
            let v = json!({"id": id, "object": "text_completion", "created": g.created, "model": model,
                "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": Value::Null}]});
            if tx.send(data(&v)).await.is_err() {
                return;
            }
        }
        if let Some(Finish::Error(e)) = g.finish() {
            let err = ApiError::new(D, crate::error::Kind::Internal, format!("the engine failed: {e}"));
            let _ = tx.send(data(&err.body())).await;
            return;
        }
        let v = json!({"id": id, "object": "text_completion", "created": g.created, "model": model,
            "choices": [{"text": "", "index": 0, "logprobs": Value::Null, "finish_reason": finish_reason(g.finish())}]});
        let _ = tx.send(data(&v)).await;
        if include_usage {
            let u = json!({"id": id, "object": "text_completion", "created": g.created, "model": model, "choices": [], "usage": usage(&g)});
            let _ = tx.send(data(&u)).await;
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Ok(sse(rx))
}
