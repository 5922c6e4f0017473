//! OpenAI's Responses API: `POST /v1/responses` — `input` as a string or a list of items
//! (messages with text parts, `function_call`, `function_call_output`, `reasoning`),
//! `instructions`, flat function `tools` and `tool_choice`, `max_output_tokens`, `reasoning.effort`,
//! `text.format` (text, json_object, json_schema). The reply is a `response` object whose
//! `output` holds a `reasoning` item, a `message` with `output_text`, and `function_call` items;
//! streamed, the SSE events the SDKs fold into that object: response.created → in_progress →
//! per item output_item.added (… content_part.added, output_text.delta/.done, content_part.done
//! | reasoning_text.delta/.done | function_call_arguments.delta/.done) → output_item.done →
//! response.completed (or response.incomplete at the token limit), each with its sequence
//! number. Nothing is stored: `previous_response_id` and `store: true` are refused.

use crate::common::{body, counted, new_id, sse, AppState};
use crate::error::{ApiError, ApiResult, Dialect, Kind};
use crate::generation::{Finish, Gen, Prepared};
use crate::openai::{forced_tools_processor, format_processor, parse_tools, ToolChoice};
use crate::params::{content_text, parse_object, thinking_options, Body};
use crate::reply::Piece;
use crate::tool_parse::{tools_named, ParsedCall, ToolSchemas};
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

const D: Dialect = Dialect::OpenAi;

/// The request as parsed, with what the response object echoes back.
struct ResponsesReq {
    prepared: Prepared,
    stream: bool,
    parallel_calls: bool,
    echo: Map<String, Value>,
}

/// Responses' flat function tools → the chat-completions shape the template and parser take.
fn convert_tools(b: &Body) -> ApiResult<Option<Vec<Value>>> {
    let Some(tools) = b.array("tools")? else { return Ok(None) };
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => return Err(b.err("tools", format!("tools[{i}].type `{other}` is not supported (function tools only)"))),
            None => return Err(b.err("tools", format!("tools[{i}] needs a `type`"))),
        }
        let mut f = Map::new();
        for k in ["name", "description", "parameters", "strict"] {
            if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                f.insert(k.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": Value::Object(f)}));
    }
    parse_tools(D, Some(&out))
}

fn parse_tool_choice(b: &Body, tools: &Option<Vec<Value>>) -> ApiResult<ToolChoice> {
    let choice = match b.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => return Err(b.err("tool_choice", format!("`tool_choice` `{other}` is not one of auto, none, required or {{\"type\": \"function\", \"name\": …}}"))),
        },
        Some(v) => match (v.get("type").and_then(Value::as_str), v.get("name").and_then(Value::as_str)) {
            (Some("function"), Some(n)) => ToolChoice::Named(n.to_string()),
            _ => return Err(b.err("tool_choice", "`tool_choice` must be a string or {\"type\": \"function\", \"name\": …}")),
        },
    };
    match &choice {
        ToolChoice::Required if tools.is_none() => Err(b.err("tool_choice", "`tool_choice` is required but the request has no tools")),
        ToolChoice::Named(n) if tools_named(tools, n).is_empty() => Err(b.err("tool_choice", format!("`tool_choice` names `{n}`, which is not among the tools"))),
        _ => Ok(choice),
    }
}

/// `input` (and `instructions`) → the template's messages.
fn convert_input(b: &Body) -> ApiResult<Vec<ChatMessage>> {
    let mut out = Vec::new();
    if let Some(s) = b.str("instructions")? {
        if !s.is_empty() {
            out.push(ChatMessage::new("system", s));
        }
    }
    match b.get("input") {
        Some(Value::String(s)) => out.push(ChatMessage::new("user", s)),
        Some(Value::Array(items)) => {
            // a reasoning item is the thinking of the assistant turn that follows it
            let mut pending_reasoning: Option<String> = None;
            for (i, it) in items.iter().enumerate() {
                let field = format!("input[{i}]");
                let o = it.as_object().ok_or_else(|| b.err("input", format!("{field} must be an object")))?;
                let ty = o.get("type").and_then(Value::as_str).unwrap_or("message");
                match ty {
                    "message" => {
                        let role = o.get("role").and_then(Value::as_str).ok_or_else(|| b.err("input", format!("{field}.role must be a string")))?;
                        let role = match role {
                            "system" | "developer" => "system",
                            "user" | "assistant" => role,
                            other => return Err(b.err("input", format!("{field}.role `{other}` is not one of system, developer, user, assistant"))),
                        };
                        let mut m = ChatMessage::new(role, &content_text(D, "input", o.get("content"))?);
                        if role == "assistant" {
                            m.reasoning_content = pending_reasoning.take();
                        }
                        out.push(m);
                    }
                    "function_call" => {
                        let name = o.get("name").and_then(Value::as_str).ok_or_else(|| b.err("input", format!("{field}.name must be a string")))?;
                        let arguments = match o.get("arguments") {
                            Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
                            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                                Ok(v @ Value::Object(_)) => v,
                                _ => return Err(b.err("input", format!("{field}.arguments must be a JSON object (as a string)"))),
                            },
                            _ => return Err(b.err("input", format!("{field}.arguments must be a string"))),
                        };
                        let call = ToolCall { id: o.get("call_id").and_then(Value::as_str).map(str::to_string), name: name.to_string(), arguments };
                        // consecutive calls belong to one assistant turn
                        match out.last_mut() {
                            Some(last) if last.role == "assistant" && (last.content.is_empty() || !last.tool_calls.is_empty()) => last.tool_calls.push(call),
                            _ => {
                                let mut m = ChatMessage::new("assistant", "");
                                m.reasoning_content = pending_reasoning.take();
                                m.tool_calls.push(call);
                                out.push(m);
                            }
                        }
                    }
                    "function_call_output" => {
                        let output = match o.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            Some(v @ Value::Array(_)) => content_text(D, "input", Some(v))?,
                            _ => return Err(b.err("input", format!("{field}.output must be a string"))),
                        };
                        let mut m = ChatMessage::new("tool", &output);
                        m.tool_call_id = o.get("call_id").and_then(Value::as_str).map(str::to_string);
                        out.push(m);
                    }
                    "reasoning" => {
                        let mut text = String::new();
                        for key in ["content", "summary"] {
                            if let Some(Value::Array(parts)) = o.get(key) {
                                for p in parts {
                                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                                        text.push_str(t);
                                    }
                                }
                            }
                            if !text.is_empty() {
                                break;
                            }
                        }
                        pending_reasoning = Some(text);
                    }
                    other => return Err(b.err("input", format!("{field}.type `{other}` is not supported (message, function_call, function_call_output, reasoning)"))),
                }
            }
        }
        None | Some(Value::Null) => return Err(b.err("input", "`input` (a string or an array of items) is required")),
        Some(_) => return Err(b.err("input", "`input` must be a string or an array of items")),
    }
    if !out.iter().any(|m| m.role != "system") {
        return Err(b.err("input", "`input` holds no message"));
    }
    Ok(out)
}

fn parse(app: &App, o: &Map<String, Value>) -> ApiResult<ResponsesReq> {
    let b = Body::new(D, o);
    app.check_model(D, b.str("model")?)?;
    if b.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(b.err("previous_response_id", "responses are not stored here: send the conversation as `input` items"));
    }
    if b.bool("store")? == Some(true) {
        return Err(b.err("store", "responses are not stored here (`store: true` is not supported)"));
    }
    if b.bool("background")? == Some(true) {
        return Err(b.err("background", "`background` responses are not supported"));
    }
    let messages = convert_input(&b)?;
    let tools = convert_tools(&b)?;
    let choice = parse_tool_choice(&b, &tools)?;
    let (mut thinking, mut extra) = thinking_options(&b, true)?;
    if let Some(tc) = choice.template_value() {
        extra.entry("tool_choice").or_insert(tc);
    }
    if let Some(r) = b.object("reasoning")? {
        match r.get("effort") {
            None | Some(Value::Null) => {}
            Some(Value::String(e)) => match e.as_str() {
                "none" => thinking = false,
                "minimal" | "low" | "medium" | "high" | "xhigh" => {
                    thinking = true;
                    extra.insert("reasoning_effort".into(), Value::String(e.clone()));
                }
                other => return Err(b.err("reasoning", format!("`reasoning.effort` `{other}` is not one of none, minimal, low, medium, high, xhigh"))),
            },
            Some(_) => return Err(b.err("reasoning", "`reasoning.effort` must be a string")),
        }
    }
    let mut processor = None;
    if let Some(f) = b.object("text")?.and_then(|t| t.get("format")).filter(|v| !v.is_null()) {
        processor = format_processor(app, &b, "text", f.get("type").and_then(Value::as_str), f.get("schema"), ("text.format.type", "text.format.schema"))?;
    }
    processor = forced_tools_processor(app, &b, &choice, &tools, processor, "text.format")?;
    if processor.is_some() {
        thinking = false;
    }
    let max_tokens = b.int_in("max_output_tokens", 1, i64::MAX)?.map(|n| n as usize);
    let stream = b.bool("stream")?.unwrap_or(false);
    let parallel_calls = b.bool("parallel_tool_calls")?.unwrap_or(true);
    let render_tools = if choice == ToolChoice::None { None } else { tools.clone().map(Value::Array) };
    let opts = RenderOptions { add_generation_prompt: true, enable_thinking: thinking, tools: render_tools, extra };
    let rendered = app.render(D, &messages, &opts)?;
    let cfg = b.sampler(app.tok.vocab_size())?;
    let schemas = (choice != ToolChoice::None).then(|| tools.as_ref().map(|t| ToolSchemas::from_openai(t))).flatten();
    // what the response object echoes of the request
    let mut echo = Map::new();
    echo.insert("instructions".into(), b.get("instructions").cloned().unwrap_or(Value::Null));
    echo.insert("tools".into(), b.get("tools").cloned().unwrap_or_else(|| json!([])));
    echo.insert("tool_choice".into(), b.get("tool_choice").cloned().unwrap_or_else(|| json!("auto")));
    echo.insert("parallel_tool_calls".into(), json!(parallel_calls));
    echo.insert("temperature".into(), b.get("temperature").cloned().unwrap_or(Value::Null));
    echo.insert("top_p".into(), b.get("top_p").cloned().unwrap_or(Value::Null));
    echo.insert("max_output_tokens".into(), b.get("max_output_tokens").cloned().unwrap_or(Value::Null));
    echo.insert("metadata".into(), b.get("metadata").cloned().unwrap_or_else(|| json!({})));
    echo.insert("text".into(), b.get("text").cloned().unwrap_or_else(|| json!({"format": {"type": "text"}})));
    echo.insert("reasoning".into(), b.get("reasoning").cloned().unwrap_or(Value::Null));
    echo.insert("user".into(), b.get("user").cloned().unwrap_or(Value::Null));
    Ok(ResponsesReq {
        prepared: Prepared {
            prompt: rendered.ids,
            max_tokens,
            sampling: cfg.resolve(thinking),
            stops: Vec::new(),
            logprobs: None,
            in_reasoning: rendered.in_reasoning,
            reasoning: true,
            tools: schemas,
            ignore_eos: b.bool("ignore_eos")?.unwrap_or(false),
            checkpoints: rendered.boundary.into_iter().collect(),
            processor,
        },
        stream,
        parallel_calls,
        echo,
    })
}

fn usage(g: &Gen, reasoning_tokens: usize) -> Value {
    json!({
        "input_tokens": g.prompt_tokens,
        "input_tokens_details": {"cached_tokens": g.cached, "cache_write_tokens": 0},
        "output_tokens": g.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": g.prompt_tokens + g.completion_tokens,
    })
}

/// The response object: `status` in_progress while streaming, then completed / incomplete.
fn response_object(id: &str, model: &str, created: u64, echo: &Map<String, Value>, status: &str, output: Vec<Value>, usage: Value) -> Value {
    let mut o = Map::new();
    o.insert("id".into(), json!(id));
    o.insert("object".into(), json!("response"));
    o.insert("created_at".into(), json!(created));
    o.insert("status".into(), json!(status));
    o.insert("error".into(), Value::Null);
    o.insert("incomplete_details".into(), if status == "incomplete" { json!({"reason": "max_output_tokens"}) } else { Value::Null });
    o.insert("model".into(), json!(model));
    o.insert("output".into(), Value::Array(output));
    for (k, v) in echo {
        o.insert(k.clone(), v.clone());
    }
    o.insert("previous_response_id".into(), Value::Null);
    o.insert("store".into(), json!(false));
    o.insert("truncation".into(), json!("disabled"));
    o.insert("usage".into(), usage);
    Value::Object(o)
}

fn status_of(f: Option<&Finish>) -> &'static str {
    match f {
        Some(Finish::Length) => "incomplete",
        _ => "completed",
    }
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "status": status, "summary": [], "content": [{"type": "reasoning_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]) };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, call_id: &str, c: &ParsedCall, status: &str) -> Value {
    let args = if status == "in_progress" { String::new() } else { Value::Object(c.arguments.clone()).to_string() };
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": c.name, "arguments": args, "status": status})
}

pub async fn responses(State(app): AppState, b: Result<Bytes, BytesRejection>) -> Response {
    counted(&app, inner(app.clone(), b)).await
}

async fn inner(app: Arc<App>, b: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let o = parse_object(D, &body(D, app.max_body, b)?)?;
    let req = parse(&app, &o)?;
    let mut g = app.start(D, req.prepared)?;
    g.started(D).await?;
    let id = new_id("resp_");
    let model = app.model_id().to_string();
    let parallel = req.parallel_calls;
    let echo = req.echo;
    if !req.stream {
        let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
        while let Some(c) = g.next().await {
            for p in c.pieces {
                match p {
                    Piece::Reasoning(t) => reasoning.push_str(&t),
                    Piece::Content(t) => content.push_str(&t),
                    Piece::ToolCall(call) => calls.push(call),
                }
            }
        }
        if let Some(Finish::Error(e)) = g.finish() {
            return Err(ApiError::new(D, Kind::Internal, format!("the engine failed: {e}")));
        }
        if !parallel {
            calls.truncate(1);
        }
        let mut output = Vec::new();
        if !reasoning.is_empty() {
            output.push(reasoning_item(&new_id("rs_"), &reasoning, "completed"));
        }
        if !content.is_empty() || (calls.is_empty() && reasoning.is_empty()) {
            output.push(message_item(&new_id("msg_"), &content, "completed"));
        }
        for c in &calls {
            output.push(call_item(&new_id("fc_"), &new_id("call_"), c, "completed"));
        }
        let status = status_of(g.finish());
        let reasoning_tokens = app.tok.encode(&reasoning).len().min(g.completion_tokens);
        return Ok(Json(response_object(&id, &model, g.created, &echo, status, output, usage(&g, reasoning_tokens))).into_response());
    }
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut s = Stream { tx, seq: 0 };
        let created = g.created;
        let empty_usage = Value::Null;
        let start = response_object(&id, &model, created, &echo, "in_progress", Vec::new(), empty_usage);
        if !s.send("response.created", json!({"response": start.clone()})).await || !s.send("response.in_progress", json!({"response": start})).await {
            return;
        }
        let mut output: Vec<Value> = Vec::new();
        // the open item: reasoning or message text, with its id and text so far
        let mut open: Option<Open> = None;
        let mut calls = 0usize;
        let mut reasoning = String::new();
        while let Some(c) = g.next().await {
            for p in c.pieces {
                let ok = match p {
                    Piece::Reasoning(t) | Piece::Content(t) if t.is_empty() => true,
                    Piece::Reasoning(t) => {
                        reasoning.push_str(&t);
                        s.text(&mut open, &mut output, Kind2::Reasoning, &t).await
                    }
                    Piece::Content(t) => s.text(&mut open, &mut output, Kind2::Message, &t).await,
                    Piece::ToolCall(call) => {
                        if !parallel && calls > 0 {
                            continue;
                        }
                        calls += 1;
                        s.close(&mut open, &mut output).await && s.call(&mut output, &call).await
                    }
                };
                if !ok {
                    return;
                }
            }
        }
        if let Some(Finish::Error(e)) = g.finish() {
            let err = ApiError::new(D, Kind::Internal, format!("the engine failed: {e}"));
            let _ = s.send("error", json!({"code": "server_error", "message": err.message, "param": Value::Null})).await;
            return;
        }
        if !s.close(&mut open, &mut output).await {
            return;
        }
        if output.is_empty() {
            // an empty reply is still a message
            if !s.text(&mut open, &mut output, Kind2::Message, "").await || !s.close(&mut open, &mut output).await {
                return;
            }
        }
        let status = status_of(g.finish());
        let reasoning_tokens = app.tok.encode(&reasoning).len().min(g.completion_tokens);
        let done = response_object(&id, &model, created, &echo, status, output, usage(&g, reasoning_tokens));
        let name = if status == "incomplete" { "response.incomplete" } else { "response.completed" };
        let _ = s.send(name, json!({"response": done})).await;
    });
    Ok(sse(rx))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind2 {
    Reasoning,
    Message,
}

struct Open {
    kind: Kind2,
    id: String,
    text: String,
}

/// The SSE side of a streamed response: every event carries its `type` and sequence number.
struct Stream {
    tx: mpsc::Sender<Result<Event, Infallible>>,
    seq: u64,
}

impl Stream {
    async fn send(&mut self, ty: &str, mut v: Value) -> bool {
        v["type"] = json!(ty);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.tx.send(Ok(Event::default().event(ty).data(v.to_string()))).await.is_ok()
    }

    /// Text of `kind`: opens its item (closing another kind's) and sends the delta.
    async fn text(&mut self, open: &mut Option<Open>, output: &mut Vec<Value>, kind: Kind2, t: &str) -> bool {
        if open.as_ref().map(|o| o.kind) != Some(kind) {
            if !self.close(open, output).await {
                return false;
            }
            let index = output.len();
            let (id, item) = match kind {
                Kind2::Reasoning => {
                    let id = new_id("rs_");
                    let item = json!({"type": "reasoning", "id": id, "status": "in_progress", "summary": [], "content": []});
                    (id, item)
                }
                Kind2::Message => {
                    let id = new_id("msg_");
                    (id.clone(), message_item(&id, "", "in_progress"))
                }
            };
            if !self.send("response.output_item.added", json!({"output_index": index, "item": item})).await {
                return false;
            }
            let part = match kind {
                Kind2::Reasoning => json!({"type": "reasoning_text", "text": ""}),
                Kind2::Message => json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
            };
            if !self.send("response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": part})).await {
                return false;
            }
            // the item's slot in `output`, filled when it closes
            output.push(Value::Null);
            *open = Some(Open { kind, id, text: String::new() });
        }
        let Some(o) = open.as_mut() else { return false };
        if t.is_empty() {
            return true;
        }
        o.text.push_str(t);
        let index = output.len() - 1;
        let ty = match kind {
            Kind2::Reasoning => "response.reasoning_text.delta",
            Kind2::Message => "response.output_text.delta",
        };
        let mut ev = json!({"item_id": o.id, "output_index": index, "content_index": 0, "delta": t});
        if kind == Kind2::Message {
            ev["logprobs"] = json!([]);
        }
        self.send(ty, ev).await
    }

    /// Closes the open item: its text's done event, the part's, the item's.
    async fn close(&mut self, open: &mut Option<Open>, output: &mut [Value]) -> bool {
        let Some(o) = open.take() else { return true };
        let index = output.len() - 1;
        let (done_ty, part, item) = match o.kind {
            Kind2::Reasoning => ("response.reasoning_text.done", json!({"type": "reasoning_text", "text": o.text}), reasoning_item(&o.id, &o.text, "completed")),
            Kind2::Message => (
                "response.output_text.done",
                json!({"type": "output_text", "text": o.text, "annotations": [], "logprobs": []}),
                message_item(&o.id, &o.text, "completed"),
            ),
        };
        let mut done = json!({"item_id": o.id, "output_index": index, "content_index": 0, "text": o.text});
        if o.kind == Kind2::Message {
            done["logprobs"] = json!([]);
        }
        output[index] = item.clone();
        self.send(done_ty, done).await
            && self.send("response.content_part.done", json!({"item_id": o.id, "output_index": index, "content_index": 0, "part": part})).await
            && self.send("response.output_item.done", json!({"output_index": index, "item": item})).await
    }

    async fn call(&mut self, output: &mut Vec<Value>, c: &ParsedCall) -> bool {
        let (id, call_id) = (new_id("fc_"), new_id("call_"));
        let index = output.len();
        let args = Value::Object(c.arguments.clone()).to_string();
        let item = call_item(&id, &call_id, c, "completed");
        output.push(item.clone());
        self.send("response.output_item.added", json!({"output_index": index, "item": call_item(&id, &call_id, c, "in_progress")})).await
            && self.send("response.function_call_arguments.delta", json!({"item_id": id, "output_index": index, "delta": args})).await
            && self.send("response.function_call_arguments.done", json!({"item_id": id, "output_index": index, "name": c.name, "arguments": args})).await
            && self.send("response.output_item.done", json!({"output_index": index, "item": item})).await
    }
}
