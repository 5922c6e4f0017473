//! Generation and chat: options, the per-token callback, the cancel flag, and the result.

use crate::model::{model_ref, xwen_model};
use crate::{boundary, invalid, put, slice, text, xwen_status, Failure};
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use xwen_embed::{ChatOptions, Completion, Event, GenerateOptions, Prompt, SamplerConfig};

/// How to generate. Fill it with `xwen_generate_options_init`, then change what you need.
#[repr(C)]
pub struct xwen_generate_options {
    /// Tokens to generate at most; -1: no limit but the context.
    pub max_tokens: i64,
    /// Temperature; 0: greedy; negative: the model card's default (the demo model: greedy).
    pub temperature: f32,
    /// Keep the K most likely tokens (0: all); -1: the default (20).
    pub top_k: i32,
    /// Nucleus sampling's P; negative: the default.
    pub top_p: f32,
    /// Drop tokens under P times the top one's probability; negative: the default (0).
    pub min_p: f32,
    /// Divide recent tokens' logits by this (1: off); negative: the default (1).
    pub repeat_penalty: f32,
    /// The sampler's seed; -1: a fresh one (reported by `xwen_completion_seed`).
    pub seed: i64,
    /// Stop strings: the text ends before the first that appears. `n_stop` of them.
    pub stop: *const *const c_char,
    pub n_stop: usize,
    /// Go on past end-of-text ids.
    pub ignore_eos: bool,
    /// `xwen_chat`: the template's `enable_thinking` (and the model card's defaults for it).
    pub thinking: bool,
    /// A cancel flag (`xwen_cancel_new`); NULL: none.
    pub cancel: *const xwen_cancel,
}

/// Defaults: the model card's sampling, a fresh seed, no limit but the context. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn xwen_generate_options_init(opts: *mut xwen_generate_options) -> xwen_status {
    boundary(|| {
        let d = xwen_generate_options {
            max_tokens: -1,
            temperature: -1.0,
            top_k: -1,
            top_p: -1.0,
            min_p: -1.0,
            repeat_penalty: -1.0,
            seed: -1,
            stop: std::ptr::null(),
            n_stop: 0,
            ignore_eos: false,
            thinking: true,
            cancel: std::ptr::null(),
        };
        put(opts, d, "opts")
    })
}

/// A flag that stops a running generation at its next token (opaque).
pub struct xwen_cancel {
    flag: Arc<AtomicBool>,
}

/// A new cancel flag, not set; NULL only if memory ran out. Free it with `xwen_cancel_free`
/// once no generation uses it. Thread-safe.
#[no_mangle]
pub extern "C" fn xwen_cancel_new() -> *mut xwen_cancel {
    std::panic::catch_unwind(|| Box::into_raw(Box::new(xwen_cancel { flag: Arc::new(AtomicBool::new(false)) }))).unwrap_or(std::ptr::null_mut())
}

/// Sets (`true`) or clears the flag. Thread-safe: call it from any thread while a generation
/// runs (a signal handler may not: it is not async-signal-safe to rely on).
#[no_mangle]
pub unsafe extern "C" fn xwen_cancel_set(cancel: *const xwen_cancel, on: bool) {
    if let Some(c) = cancel.as_ref() {
        c.flag.store(on, Ordering::Relaxed);
    }
}

/// Frees a cancel flag; null is ignored. No generation may be using it.
#[no_mangle]
pub unsafe extern "C" fn xwen_cancel_free(cancel: *mut xwen_cancel) {
    if !cancel.is_null() {
        drop(Box::from_raw(cancel));
    }
}

/// A sampled token and the text it added (`text` may be empty: a token can end inside a
/// character or inside what may become a stop string). `token` is -1 for the text held back
/// until the end.
pub const XWEN_EVENT_TOKEN: i32 = 0;
/// `xwen_chat`: reasoning text.
pub const XWEN_EVENT_REASONING: i32 = 1;
/// `xwen_chat`: reply content.
pub const XWEN_EVENT_CONTENT: i32 = 2;
/// `xwen_chat`: a complete tool call, `text` a JSON object `{"name", "arguments"}`.
pub const XWEN_EVENT_TOOL_CALL: i32 = 3;

/// What the callback sees. `text` (UTF-8, `text_len` bytes, NUL-terminated) is valid during
/// the call only.
#[repr(C)]
pub struct xwen_event {
    /// One of the `XWEN_EVENT_*` kinds.
    pub kind: i32,
    /// Which prompt of the call (its position; 0 for a single one).
    pub index: usize,
    /// The token id, or -1.
    pub token: i64,
    pub text: *const c_char,
    pub text_len: usize,
}

/// Called on the generating thread for every event; return false to stop that sequence. It
/// may tokenize with the same model; generation, chat or logits on it from the callback return
/// `XWEN_ERR_INVALID_ARGUMENT` (the model is busy with the call the callback came from).
pub type xwen_event_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, event: *const xwen_event) -> bool>;

/// A finished sequence (opaque): its text, tokens, finish reason, usage, and for chat the split reply.
pub struct xwen_completion {
    done: Completion,
    text: CString,
    finish: CString,
    json: CString,
}

fn options(o: *const xwen_generate_options) -> Result<(GenerateOptions, bool), Failure> {
    let Some(o) = (unsafe { o.as_ref() }) else { return Ok((GenerateOptions::default(), true)) };
    let opt_f = |v: f32| (v >= 0.0).then_some(v);
    let stops = unsafe { slice(o.stop, o.n_stop, "stop")? };
    let stop = stops.iter().enumerate().map(|(i, &s)| unsafe { text(s, &format!("stop[{i}]")) }.map(str::to_string)).collect::<Result<Vec<_>, _>>()?;
    if stop.iter().any(String::is_empty) {
        return Err(invalid("a stop string is empty"));
    }
    let cancel = unsafe { o.cancel.as_ref() }.map(|c| c.flag.clone());
    let sampling = SamplerConfig {
        temperature: opt_f(o.temperature),
        top_k: (o.top_k >= 0).then_some(o.top_k as usize),
        top_p: opt_f(o.top_p),
        min_p: opt_f(o.min_p),
        repeat_penalty: opt_f(o.repeat_penalty),
        seed: (o.seed >= 0).then_some(o.seed as u64),
        ..Default::default()
    };
    if o.seed < -1 {
        return Err(invalid("seed must be -1 or at least 0"));
    }
    let max_tokens = match o.max_tokens {
        -1 => None,
        n if n >= 0 => Some(n as usize),
        _ => return Err(invalid("max_tokens must be -1 or at least 0")),
    };
    Ok((GenerateOptions { max_tokens, sampling, thinking: Some(o.thinking), stop, ignore_eos: o.ignore_eos, cancel }, o.thinking))
}

/// The C callback as the library's.
fn forward(cb: xwen_event_fn, user: *mut c_void) -> impl FnMut(&Event) -> bool {
    move |e: &Event| {
        let Some(cb) = cb else { return true };
        let (kind, index, token, owned) = match e {
            Event::Token { index, token, text } => (crate::XWEN_EVENT_TOKEN, *index, token.map_or(-1, i64::from), text.to_string()),
            Event::Reasoning { text } => (crate::XWEN_EVENT_REASONING, 0, -1, text.to_string()),
            Event::Content { text } => (crate::XWEN_EVENT_CONTENT, 0, -1, text.to_string()),
            Event::ToolCall { call } => (crate::XWEN_EVENT_TOOL_CALL, 0, -1, call_json(call).to_string()),
        };
        let c = CString::new(owned.replace('\0', "\u{FFFD}")).unwrap_or_default();
        let ev = xwen_event { kind, index, token, text: c.as_ptr(), text_len: c.as_bytes().len() };
        unsafe { cb(user, &ev) }
    }
}

fn call_json(c: &xwen_embed::ParsedCall) -> serde_json::Value {
    serde_json::json!({"name": c.name, "arguments": serde_json::Value::Object(c.arguments.clone())})
}

fn completion(done: Completion, chat: Option<&xwen_embed::ChatCompletion>) -> *mut xwen_completion {
    let mut json = serde_json::json!({
        "text": done.text,
        "tokens": done.tokens,
        "finish_reason": done.finish.as_str(),
        "stop_string": done.stop_string,
        "seed": done.seed,
        "usage": {
            "prompt_tokens": done.usage.prompt_tokens,
            "completion_tokens": done.usage.completion_tokens,
            "prefill_secs": done.usage.prefill_secs,
            "decode_secs": done.usage.decode_secs,
        },
    });
    if let Some(c) = chat {
        json["content"] = c.content.clone().into();
        json["reasoning"] = c.reasoning.clone().into();
        json["tool_calls"] = c.tool_calls.iter().map(call_json).collect::<Vec<_>>().into();
    }
    let c = xwen_completion {
        text: CString::new(done.text.replace('\0', "\u{FFFD}")).unwrap_or_default(),
        finish: CString::new(done.finish.as_str()).unwrap_or_default(),
        json: CString::new(json.to_string()).unwrap_or_default(),
        done,
    };
    Box::into_raw(Box::new(c))
}

/// Generates from a text prompt (tokenized as user text). `opts` NULL: defaults; `callback`
/// NULL: none. On success `*out` holds the completion (free it with `xwen_completion_free`).
/// Thread-safe; calls on one model take turns.
#[no_mangle]
pub unsafe extern "C" fn xwen_generate(model: *mut xwen_model, prompt: *const c_char, opts: *const xwen_generate_options, callback: xwen_event_fn, user_data: *mut c_void, out: *mut *mut xwen_completion) -> xwen_status {
    boundary(|| {
        let m = model_ref(model)?;
        let p = text(prompt, "prompt")?;
        let (o, _) = options(opts)?;
        if out.is_null() {
            return Err(invalid("out is null"));
        }
        let done = m.generate(Prompt::Text(p), &o, &mut forward(callback, user_data))?;
        put(out, completion(done, None), "out")
    })
}

/// `xwen_generate` from `n` token ids. Thread-safe; calls on one model take turns.
#[no_mangle]
pub unsafe extern "C" fn xwen_generate_ids(model: *mut xwen_model, ids: *const u32, n: usize, opts: *const xwen_generate_options, callback: xwen_event_fn, user_data: *mut c_void, out: *mut *mut xwen_completion) -> xwen_status {
    boundary(|| {
        let m = model_ref(model)?;
        let ids = slice(ids, n, "ids")?;
        let (o, _) = options(opts)?;
        if out.is_null() {
            return Err(invalid("out is null"));
        }
        let done = m.generate(Prompt::Ids(ids), &o, &mut forward(callback, user_data))?;
        put(out, completion(done, None), "out")
    })
}

/// Generates from `n` text prompts decoded together (continuous batching; as many at once as
/// the load's `parallel` allows); each sequence's tokens are those it gets alone. Prompt `i`
/// samples with the seed plus `i`; its events carry `index` i; the callback returning false
/// stops that sequence only. `outs` has room for `n` completions (each to free). Thread-safe;
/// calls on one model take turns.
#[no_mangle]
pub unsafe extern "C" fn xwen_generate_batch(model: *mut xwen_model, prompts: *const *const c_char, n: usize, opts: *const xwen_generate_options, callback: xwen_event_fn, user_data: *mut c_void, outs: *mut *mut xwen_completion) -> xwen_status {
    boundary(|| {
        let m = model_ref(model)?;
        let ps = slice(prompts, n, "prompts")?;
        let texts = ps.iter().enumerate().map(|(i, &p)| text(p, &format!("prompts[{i}]"))).collect::<Result<Vec<_>, _>>()?;
        let (o, _) = options(opts)?;
        if n == 0 {
            return Ok(());
        }
        if outs.is_null() {
            return Err(invalid("outs is null"));
        }
        let prompts: Vec<Prompt> = texts.iter().map(|t| Prompt::Text(t)).collect();
        let done = m.generate_batch(&prompts, &o, &mut forward(callback, user_data))?;
        for (i, d) in done.into_iter().enumerate() {
            outs.add(i).write(completion(d, None));
        }
        Ok(())
    })
}

/// A chat turn: `messages_json` is a JSON array of OpenAI-style messages (`role`, `content`,
/// `tool_calls`, `tool_call_id`, `name`), `tools_json` a JSON array of tools (NULL: none),
/// rendered by the chat template; the reply's reasoning, content and tool calls come as events
/// and in `xwen_completion_json` (`content`, `reasoning`, `tool_calls`). Thread-safe; calls on
/// one model take turns.
#[no_mangle]
pub unsafe extern "C" fn xwen_chat(model: *mut xwen_model, messages_json: *const c_char, tools_json: *const c_char, opts: *const xwen_generate_options, callback: xwen_event_fn, user_data: *mut c_void, out: *mut *mut xwen_completion) -> xwen_status {
    boundary(|| {
        let m = model_ref(model)?;
        let parse = |s: &str, what: &str| serde_json::from_str::<serde_json::Value>(s).map_err(|e| invalid(format!("{what}: {e}")));
        let messages = xwen_embed::messages_from_json(&parse(text(messages_json, "messages_json")?, "messages_json")?)?;
        let tools = if tools_json.is_null() {
            Vec::new()
        } else {
            match parse(text(tools_json, "tools_json")?, "tools_json")? {
                serde_json::Value::Array(a) => a,
                _ => return Err(invalid("tools_json must be a JSON array")),
            }
        };
        let (generate, thinking) = options(opts)?;
        if out.is_null() {
            return Err(invalid("out is null"));
        }
        let copts = ChatOptions { generate, tools, thinking: Some(thinking), ..Default::default() };
        let r = m.chat(&messages, &copts, &mut forward(callback, user_data))?;
        put(out, completion(r.completion.clone(), Some(&r)), "out")
    })
}

/// The generated text (NUL-terminated UTF-8, without an end-of-text token's text or the stop
/// string), valid until the completion is freed; `*len` (if not NULL) gets its length.
/// Thread-safe for reading.
#[no_mangle]
pub unsafe extern "C" fn xwen_completion_text(c: *const xwen_completion, len: *mut usize) -> *const c_char {
    match c.as_ref() {
        Some(c) => {
            if let Some(l) = len.as_mut() {
                *l = c.text.as_bytes().len();
            }
            c.text.as_ptr()
        }
        None => std::ptr::null(),
    }
}

/// Every sampled token id (an end-of-text id included, as `xwen run --print-ids` prints them);
/// `*n` gets the count. Valid until the completion is freed. Thread-safe for reading.
#[no_mangle]
pub unsafe extern "C" fn xwen_completion_tokens(c: *const xwen_completion, n: *mut usize) -> *const u32 {
    let Some(c) = c.as_ref() else { return std::ptr::null() };
    if let Some(n) = n.as_mut() {
        *n = c.done.tokens.len();
    }
    c.done.tokens.as_ptr()
}

/// Why the sequence ended: "eos", "stop_string", "length", "context_full" or "cancelled".
/// Valid until the completion is freed. Thread-safe for reading.
#[no_mangle]
pub unsafe extern "C" fn xwen_completion_finish_reason(c: *const xwen_completion) -> *const c_char {
    c.as_ref().map_or(std::ptr::null(), |c| c.finish.as_ptr())
}

/// Tokens of the prompt and of the completion, and the seconds to the first token and after it.
#[repr(C)]
pub struct xwen_usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub prefill_secs: f64,
    pub decode_secs: f64,
}

/// The completion's usage into `*out`. Thread-safe for reading.
#[no_mangle]
pub unsafe extern "C" fn xwen_completion_usage(c: *const xwen_completion, out: *mut xwen_usage) -> xwen_status {
    boundary(|| {
        let c = c.as_ref().ok_or_else(|| invalid("completion is null"))?;
        let u = c.done.usage;
        put(out, xwen_usage { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens, prefill_secs: u.prefill_secs, decode_secs: u.decode_secs }, "out")
    })
}

/// The sampler's seed (passing it back in the options repeats the sequence); 0 for NULL.
/// Thread-safe for reading.
#[no_mangle]
pub unsafe extern "C" fn xwen_completion_seed(c: *const xwen_completion) -> u64 {
    c.as_ref().map_or(0, |c| c.done.seed)
}

/// Everything as one JSON object: `text`, `tokens`, `finish_reason`, `stop_string`, `seed`,
/// `usage`, and after `xwen_chat` `content`, `reasoning`, `tool_calls` (`[{"name",
/// "arguments"}]`). Valid until the completion is freed. Thread-safe for reading.
#[no_mangle]
pub unsafe extern "C" fn xwen_completion_json(c: *const xwen_completion) -> *const c_char {
    c.as_ref().map_or(std::ptr::null(), |c| c.json.as_ptr())
}

/// Frees a completion; null is ignored. No other call may be reading it.
#[no_mangle]
pub unsafe extern "C" fn xwen_completion_free(c: *mut xwen_completion) {
    if !c.is_null() {
        drop(Box::from_raw(c));
    }
}
