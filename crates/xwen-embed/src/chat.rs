//! Chat: messages (and tools) rendered with the model's chat template — text the caller wrote
//! is tokenized as text, never as control tokens — then generated, the reply split as it
//! streams into reasoning, content and tool calls in the model's own markup.

use crate::error::{Error, Result};
use crate::generate::{Completion, Event, GenerateOptions};
use crate::Xwen;
use serde_json::{Map, Value};
use xwen_chat::reply::{Piece, ReplyParser};
use xwen_chat::tool_parse::{ParsedCall, ToolSchemas};
use xwen_chat::{encode_segments, segments_text, ChatMessage, RenderOptions, ToolCall};

/// How to chat: generation as `generate` takes it, plus the template's inputs.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    pub generate: GenerateOptions,
    /// Tools the model may call (OpenAI shape: `{"type": "function", "function": {"name",
    /// "description", "parameters"}}`): the template lists them, the reply's calls are parsed
    /// and their arguments typed by the schemas.
    pub tools: Vec<Value>,
    /// The template's `enable_thinking` (None: on); it also picks the sampling defaults.
    pub thinking: Option<bool>,
    /// More template variables (e.g. `reasoning_effort`).
    pub template_vars: Map<String, Value>,
}

/// A chat reply: the generation, and its text split up.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatCompletion {
    /// `text` is the raw reply, markup included.
    pub completion: Completion,
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ParsedCall>,
}

impl Xwen {
    /// Renders `messages` with the chat template and generates the assistant's reply.
    /// `on_event` sees each token (`Event::Token`) and each piece of the split reply
    /// (`Reasoning`, `Content`, `ToolCall`); returning false stops.
    pub fn chat(&self, messages: &[ChatMessage], opts: &ChatOptions, on_event: &mut dyn FnMut(&Event) -> bool) -> Result<ChatCompletion> {
        let template = self.template.as_ref().ok_or_else(|| Error::Template("this model has no chat template: load it with a chat_template".into()))?;
        let thinking = opts.thinking.unwrap_or(true);
        let mut ropts = RenderOptions { add_generation_prompt: true, enable_thinking: thinking, tools: None, extra: opts.template_vars.clone() };
        if !opts.tools.is_empty() {
            ropts.tools = Some(Value::Array(opts.tools.clone()));
        }
        if self.syntax.xtml {
            // Kimi K3's template reads its switch as `thinking`
            ropts.extra.entry("thinking").or_insert(Value::Bool(thinking));
        }
        let segs = template.render(messages, &ropts)?;
        let in_reasoning = segments_text(&segs).trim_end().ends_with(self.syntax.think_open());
        let ids = encode_segments(&self.tok, &segs);
        if ids.is_empty() {
            return Err(Error::InvalidArgument("the conversation renders to nothing".into()));
        }
        self.check_fits(ids.len(), 1)?;
        let schemas = (!opts.tools.is_empty()).then(|| ToolSchemas::from_openai(&opts.tools));
        let mut parser = ReplyParser::with_syntax(in_reasoning, true, schemas, self.syntax);
        let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
        let mut take = |pieces: Vec<Piece>, on_event: &mut dyn FnMut(&Event) -> bool| {
            let mut go_on = true;
            for p in pieces {
                go_on &= match &p {
                    Piece::Reasoning(t) => on_event(&Event::Reasoning { text: t }),
                    Piece::Content(t) => on_event(&Event::Content { text: t }),
                    Piece::ToolCall(c) => on_event(&Event::ToolCall { call: c }),
                };
                match p {
                    Piece::Reasoning(t) => reasoning.push_str(&t),
                    Piece::Content(t) => content.push_str(&t),
                    Piece::ToolCall(c) => calls.push(c),
                }
            }
            go_on
        };
        let gen = GenerateOptions { thinking: Some(thinking), ..opts.generate.clone() };
        let mut out = self.run(vec![ids], &gen, &mut |ev| {
            let go_on = on_event(ev);
            match ev {
                Event::Token { text, .. } if !text.is_empty() => take(parser.push(text), on_event) && go_on,
                _ => go_on,
            }
        })?;
        take(parser.finish(), on_event);
        Ok(ChatCompletion { completion: out.remove(0), content, reasoning, tool_calls: calls })
    }
}

/// Messages in OpenAI's shape (`[{"role", "content", "tool_calls", "tool_call_id", "name",
/// "reasoning_content"}]`; content a string or a list of text parts; `developer` reads as
/// `system`).
pub fn messages_from_json(v: &Value) -> Result<Vec<ChatMessage>> {
    let bad = |s: String| Error::InvalidArgument(s);
    let items = v.as_array().ok_or_else(|| bad("messages must be a JSON array".into()))?;
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let o = m.as_object().ok_or_else(|| bad(format!("messages[{i}] must be an object")))?;
        let role = match o.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => "system",
            Some(r @ ("user" | "assistant" | "tool")) => r,
            Some(r) => return Err(bad(format!("messages[{i}].role `{r}` is not one of system, developer, user, assistant, tool"))),
            None => return Err(bad(format!("messages[{i}].role must be a string"))),
        };
        let mut msg = ChatMessage::new(role, &content_text(o.get("content")).ok_or_else(|| bad(format!("messages[{i}].content must be a string or a list of text parts")))?);
        msg.reasoning_content = o.get("reasoning_content").and_then(Value::as_str).map(str::to_string);
        if let Some(calls) = o.get("tool_calls").filter(|c| !c.is_null()) {
            let calls = calls.as_array().ok_or_else(|| bad(format!("messages[{i}].tool_calls must be an array")))?;
            for (j, c) in calls.iter().enumerate() {
                let f = c.get("function").unwrap_or(c);
                let name = f.get("name").and_then(Value::as_str).ok_or_else(|| bad(format!("messages[{i}].tool_calls[{j}] has no function name")))?;
                let arguments = match f.get("arguments") {
                    Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
                    Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object).ok_or_else(|| bad(format!("messages[{i}].tool_calls[{j}] arguments are not a JSON object")))?,
                    Some(v @ Value::Object(_)) => v.clone(),
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(_) => return Err(bad(format!("messages[{i}].tool_calls[{j}] arguments must be an object or a JSON string"))),
                };
                msg.tool_calls.push(ToolCall { id: c.get("id").and_then(Value::as_str).map(str::to_string), name: name.to_string(), arguments });
            }
        }
        msg.tool_call_id = o.get("tool_call_id").and_then(Value::as_str).map(str::to_string);
        msg.name = o.get("name").and_then(Value::as_str).map(str::to_string);
        out.push(msg);
    }
    Ok(out)
}

fn content_text(v: Option<&Value>) -> Option<String> {
    match v {
        None | Some(Value::Null) => Some(String::new()),
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => parts.iter().map(|p| p.get("text").and_then(Value::as_str)).collect::<Option<Vec<_>>>().map(|t| t.concat()),
        Some(_) => None,
    }
}
