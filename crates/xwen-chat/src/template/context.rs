//! What a template sees: the conversation and options as OpenAI-style JSON (the shape llama.cpp
//! and Hugging Face pass), with user-provided strings marked.

use serde_json::{json, Map, Value as Json};

use super::taint::{sanitize, wrap};

/// One message of a conversation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChatMessage {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    pub content: String,
    /// An assistant turn's reasoning (rendered inside `<think>` by Qwen templates).
    pub reasoning_content: Option<String>,
    /// Calls an assistant turn made.
    pub tool_calls: Vec<ToolCall>,
    /// For a "tool" message: the call it answers.
    pub tool_call_id: Option<String>,
    /// For a "tool" message: the tool's name.
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage { role: role.into(), content: content.into(), ..Default::default() }
    }
}

/// A function call in an assistant turn.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub id: Option<String>,
    pub name: String,
    /// The arguments object (a JSON string holding an object is accepted and parsed).
    pub arguments: Json,
}

/// Template inputs besides the messages.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderOptions {
    /// End with the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// Passed to the template as `enable_thinking`.
    pub enable_thinking: bool,
    /// The OpenAI `tools` array.
    pub tools: Option<Json>,
    /// Other template variables (e.g. `preserve_thinking`, `reasoning_effort`); they override
    /// the ones above. Not marked: callers validate them.
    pub extra: Map<String, Json>,
}

impl Default for RenderOptions {
    /// A generation prompt with thinking on, no tools.
    fn default() -> Self {
        RenderOptions { add_generation_prompt: true, enable_thinking: true, tools: None, extra: Map::new() }
    }
}

/// Which user-provided strings are marked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Marking {
    /// None: the reference rendering.
    Off,
    /// Message text, reasoning, tool results and call arguments only.
    Text,
    /// Also names, ids and tool descriptions.
    Full,
}

fn mark(s: &str, on: bool) -> Json {
    Json::String(if on { wrap(s) } else { sanitize(s) })
}

/// Marks every string inside `v` (not object keys); `skip` names keys whose string values a
/// template compares against literals, which therefore stay unmarked.
fn mark_tree(v: &Json, on: bool, skip: &[&str]) -> Json {
    match v {
        Json::String(s) => mark(s, on),
        Json::Array(a) => Json::Array(a.iter().map(|x| mark_tree(x, on, skip)).collect()),
        Json::Object(o) => Json::Object(
            o.iter()
                .map(|(k, x)| {
                    let on = on && !skip.contains(&k.as_str());
                    (sanitize(k), mark_tree(x, on, skip))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn message_json(m: &ChatMessage, marking: Marking) -> Json {
    let text = marking != Marking::Off;
    let full = marking == Marking::Full;
    let mut o = Map::new();
    o.insert("role".into(), Json::String(sanitize(&m.role)));
    o.insert("content".into(), mark(&m.content, text));
    // llama.cpp leaves out empty optional fields; templates test `is defined` / `is string`.
    if let Some(r) = m.reasoning_content.as_deref().filter(|r| !r.is_empty()) {
        o.insert("reasoning_content".into(), mark(r, text));
    }
    if let Some(n) = m.name.as_deref().filter(|n| !n.is_empty()) {
        o.insert("name".into(), mark(n, full));
    }
    if let Some(id) = m.tool_call_id.as_deref().filter(|id| !id.is_empty()) {
        o.insert("tool_call_id".into(), mark(id, full));
    }
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                let args = match &c.arguments {
                    Json::String(s) => serde_json::from_str::<Json>(s).ok().filter(Json::is_object).unwrap_or_else(|| c.arguments.clone()),
                    other => other.clone(),
                };
                let mut call = json!({
                    "type": "function",
                    "function": { "name": mark(&c.name, full), "arguments": mark_tree(&args, text, &[]) },
                });
                if let Some(id) = c.id.as_deref().filter(|id| !id.is_empty()) {
                    call["id"] = mark(id, full);
                }
                call
            })
            .collect();
        o.insert("tool_calls".into(), Json::Array(calls));
    }
    Json::Object(o)
}

/// The template's variables, as llama.cpp's `common_chat_template_direct_apply` sets them.
pub(crate) fn context(messages: &[ChatMessage], opts: &RenderOptions, bos: &str, eos: &str, marking: Marking) -> Json {
    let mut ctx = Map::new();
    ctx.insert("messages".into(), Json::Array(messages.iter().map(|m| message_json(m, marking)).collect()));
    ctx.insert("bos_token".into(), Json::String(sanitize(bos)));
    ctx.insert("eos_token".into(), Json::String(sanitize(eos)));
    ctx.insert("enable_thinking".into(), Json::Bool(opts.enable_thinking));
    if let Some(tools) = opts.tools.as_ref().filter(|t| t.as_array().is_some_and(|a| !a.is_empty())) {
        // Types and required-parameter lists are compared against literals and keys.
        ctx.insert("tools".into(), mark_tree(tools, marking == Marking::Full, &["type", "required"]));
    }
    ctx.insert("add_generation_prompt".into(), Json::Bool(opts.add_generation_prompt));
    for (k, v) in &opts.extra {
        ctx.insert(sanitize(k), mark_tree(v, false, &[]));
    }
    Json::Object(ctx)
}

/// `json` as a template value. serde_json keeps numbers as their literal text here
/// (`arbitrary_precision`, so a 42-digit integer argument survives a round trip) and serializes
/// them as a private struct, which minijinja would take for a map: numbers go over as integers
/// (to 128 bits) or floats instead.
pub(crate) fn template_value(json: &Json) -> minijinja::Value {
    minijinja::Value::from(minijinja::value::Serde(Plain(json)))
}

struct Plain<'a>(&'a Json);

impl serde::Serialize for Plain<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Json::Number(n) => {
                let text = n.to_string();
                if let Some(i) = n.as_i64() {
                    s.serialize_i64(i)
                } else if let Some(u) = n.as_u64() {
                    s.serialize_u64(u)
                } else if let Ok(i) = text.parse::<i128>() {
                    s.serialize_i128(i)
                } else if let Some(f) = n.as_f64().filter(|f| f.is_finite()) {
                    s.serialize_f64(f)
                } else {
                    s.serialize_str(&text)
                }
            }
            Json::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(&Plain(v))?;
                }
                seq.end()
            }
            Json::Object(o) => {
                let mut map = s.serialize_map(Some(o.len()))?;
                for (k, v) in o {
                    map.serialize_entry(k, &Plain(v))?;
                }
                map.end()
            }
            other => other.serialize(s),
        }
    }
}
