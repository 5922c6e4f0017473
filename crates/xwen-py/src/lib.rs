//! `xwen._native`, the compiled half of the Python package `xwen` (the Python half,
//! python/xwen/__init__.py, gives it its shape: objects, numpy, iterators). Every call that
//! computes releases the GIL; results cross as JSON text where they are structured (Python's
//! `json` reads integers of any length exactly), logits as raw float32 bytes.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use xwen_embed::{ChatOptions, Completion, Event, GenerateOptions, KvType, LoadOptions, Prompt, SamplerConfig, Xwen};

create_exception!(_native, XwenError, PyException, "An error from xwen (its message says which argument or what failed).");
create_exception!(_native, InvalidArgument, XwenError, "An argument xwen cannot use.");
create_exception!(_native, LoadError, XwenError, "The model could not be opened.");
create_exception!(_native, TemplateError, XwenError, "The chat template is missing or failed.");
create_exception!(_native, EngineError, XwenError, "The engine failed while running.");

fn err(e: xwen_embed::Error) -> PyErr {
    let msg = e.to_string();
    match e {
        xwen_embed::Error::InvalidArgument(_) => InvalidArgument::new_err(msg),
        xwen_embed::Error::Load(_) => LoadError::new_err(msg),
        xwen_embed::Error::Template(_) => TemplateError::new_err(msg),
        xwen_embed::Error::Engine(_) => EngineError::new_err(msg),
    }
}

/// A prompt: text or token ids.
#[derive(FromPyObject)]
enum PromptArg {
    Text(String),
    Ids(Vec<u32>),
}

impl PromptArg {
    fn as_prompt(&self) -> Prompt<'_> {
        match self {
            PromptArg::Text(t) => Prompt::Text(t),
            PromptArg::Ids(i) => Prompt::Ids(i),
        }
    }
}

/// A loaded model. Shared between Python threads freely: generation on one model takes turns.
#[pyclass(frozen, module = "xwen._native")]
struct Model {
    inner: Arc<Xwen>,
}

fn kv(s: Option<&str>) -> PyResult<KvType> {
    s.map_or(Ok(KvType::F16), |s| s.parse::<KvType>().map_err(InvalidArgument::new_err))
}

#[allow(clippy::too_many_arguments)]
fn gen_options(max_tokens: Option<i64>, temperature: Option<f32>, top_k: Option<usize>, top_p: Option<f32>, min_p: Option<f32>, repeat_penalty: Option<f32>, seed: Option<u64>, stop: Option<Vec<String>>, ignore_eos: bool, thinking: Option<bool>, cancel: Option<Arc<AtomicBool>>) -> PyResult<GenerateOptions> {
    let max_tokens = match max_tokens {
        None => None,
        Some(n) if n >= 0 => Some(n as usize),
        Some(_) => return Err(InvalidArgument::new_err("max_tokens must be at least 0 (None: no limit but the context)")),
    };
    let stop = stop.unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(InvalidArgument::new_err("a stop string is empty"));
    }
    Ok(GenerateOptions {
        max_tokens,
        sampling: SamplerConfig { temperature, top_k, top_p, min_p, repeat_penalty, seed, ..Default::default() },
        thinking,
        stop,
        ignore_eos,
        cancel,
    })
}

fn completion_json(c: &Completion) -> serde_json::Value {
    serde_json::json!({
        "text": c.text,
        "tokens": c.tokens,
        "finish_reason": c.finish.as_str(),
        "stop_string": c.stop_string,
        "seed": c.seed,
        "usage": {"prompt_tokens": c.usage.prompt_tokens, "completion_tokens": c.usage.completion_tokens, "prefill_secs": c.usage.prefill_secs, "decode_secs": c.usage.decode_secs},
    })
}

fn chat_json(r: &xwen_embed::ChatCompletion) -> serde_json::Value {
    let mut j = completion_json(&r.completion);
    j["content"] = r.content.clone().into();
    j["reasoning"] = r.reasoning.clone().into();
    j["tool_calls"] = r.tool_calls.iter().map(call_json).collect::<Vec<_>>().into();
    j
}

fn call_json(c: &xwen_embed::ParsedCall) -> serde_json::Value {
    serde_json::json!({"name": c.name, "arguments": serde_json::Value::Object(c.arguments.clone())})
}

/// An event as the Python side takes it: (kind, index, token or None, text).
type EventTuple = (&'static str, usize, Option<u32>, String);

fn event_tuple(e: &Event) -> EventTuple {
    match e {
        Event::Token { index, token, text } => ("token", *index, *token, text.to_string()),
        Event::Reasoning { text } => ("reasoning", 0, None, text.to_string()),
        Event::Content { text } => ("content", 0, None, text.to_string()),
        Event::ToolCall { call } => ("tool_call", 0, None, call_json(call).to_string()),
    }
}

/// What a request runs: generate (one prompt or several) or chat.
enum Job {
    Generate(Vec<PromptArg>),
    Chat(Vec<xwen_embed::ChatMessage>, Box<ChatOptions>),
}

impl Job {
    /// Runs the job; the result as JSON text (a list for several prompts).
    fn run(&self, x: &Xwen, opts: &GenerateOptions, on_event: &mut dyn FnMut(&Event) -> bool) -> xwen_embed::Result<String> {
        Ok(match self {
            Job::Generate(ps) if ps.len() == 1 => completion_json(&x.generate(ps[0].as_prompt(), opts, on_event)?).to_string(),
            Job::Generate(ps) => {
                let prompts: Vec<Prompt> = ps.iter().map(PromptArg::as_prompt).collect();
                serde_json::Value::Array(x.generate_batch(&prompts, opts, on_event)?.iter().map(completion_json).collect()).to_string()
            }
            Job::Chat(messages, copts) => {
                let copts = ChatOptions { generate: opts.clone(), ..(**copts).clone() };
                chat_json(&x.chat(messages, &copts, on_event)?).to_string()
            }
        })
    }
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (path_or_name=None, *, threads=None, ctx_size=None, ram_budget=None, no_mmap=false, kv_type_k=None, kv_type_v=None, chat_template=None, parallel=1))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, path_or_name: Option<String>, threads: Option<usize>, ctx_size: Option<usize>, ram_budget: Option<u64>, no_mmap: bool, kv_type_k: Option<&str>, kv_type_v: Option<&str>, chat_template: Option<String>, parallel: usize) -> PyResult<Model> {
        let opts = LoadOptions { threads, ctx_size, ram_budget, no_mmap, kv_types: Some((kv(kv_type_k)?, kv(kv_type_v)?)), chat_template, parallel };
        let x = py.detach(move || Xwen::load(path_or_name.as_deref(), &opts)).map_err(err)?;
        Ok(Model { inner: Arc::new(x) })
    }

    /// The model's facts as JSON text.
    fn info_json(&self) -> String {
        let i = self.inner.info();
        serde_json::json!({
            "name": i.name, "architecture": i.architecture, "n_vocab": i.n_vocab, "context": i.context,
            "eos_ids": i.eos_ids, "has_chat_template": i.has_chat_template, "is_demo": i.is_demo,
            "weight_bytes": i.weight_bytes, "threads": i.threads, "load_secs": i.load_secs,
        })
        .to_string()
    }

    #[pyo3(signature = (text, markup=false))]
    fn tokenize(&self, py: Python<'_>, text: String, markup: bool) -> Vec<u32> {
        let x = self.inner.clone();
        py.detach(move || x.tokenize(&text, markup))
    }

    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        self.inner.detokenize(&ids).map_err(err)
    }

    /// Logits as raw little-endian float32 bytes, with (rows, n_vocab).
    #[pyo3(signature = (ids, all=false))]
    fn logits<'py>(&self, py: Python<'py>, ids: Vec<u32>, all: bool) -> PyResult<(Bound<'py, PyBytes>, usize, usize)> {
        let x = self.inner.clone();
        let rows = if all { ids.len() } else { 1 };
        let v = py.detach(move || x.logits(&ids, all)).map_err(err)?;
        let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
        Ok((PyBytes::new(py, &bytes), rows, self.inner.info().n_vocab))
    }

    /// The RAM plan as JSON text.
    fn plan_json(&self, py: Python<'_>) -> PyResult<String> {
        let x = self.inner.clone();
        py.detach(move || x.plan().map(|p| xwen_embed::plan_json(&p).to_string())).map_err(err)
    }

    /// Generates (a prompt, or a list of prompts decoded together) and returns the result as
    /// JSON text; `callback(kind, index, token, text)` returning False stops that sequence.
    /// Messages and tools (JSON text) make it a chat turn instead.
    #[pyo3(signature = (prompts=None, *, messages_json=None, tools_json=None, max_tokens=None, temperature=None, top_k=None, top_p=None, min_p=None, repeat_penalty=None, seed=None, stop=None, ignore_eos=false, thinking=None, callback=None))]
    #[allow(clippy::too_many_arguments)]
    fn run(&self, py: Python<'_>, prompts: Option<Vec<PromptArg>>, messages_json: Option<String>, tools_json: Option<String>, max_tokens: Option<i64>, temperature: Option<f32>, top_k: Option<usize>, top_p: Option<f32>, min_p: Option<f32>, repeat_penalty: Option<f32>, seed: Option<u64>, stop: Option<Vec<String>>, ignore_eos: bool, thinking: Option<bool>, callback: Option<Py<PyAny>>) -> PyResult<String> {
        let job = job(prompts, messages_json, tools_json, thinking)?;
        let opts = gen_options(max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, stop, ignore_eos, thinking, None)?;
        let x = self.inner.clone();
        // a callback's exception stops generation and is raised once the engine is done
        let raised: Mutex<Option<PyErr>> = Mutex::new(None);
        let out = py.detach(|| {
            job.run(&x, &opts, &mut |e| {
                let Some(cb) = &callback else { return true };
                let (kind, index, token, text) = event_tuple(e);
                Python::attach(|py| match cb.call1(py, (kind, index, token, text)).and_then(|r| r.is_truthy(py)) {
                    Ok(go_on) => go_on,
                    Err(e) => {
                        *raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        false
                    }
                })
            })
        });
        if let Some(e) = raised.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        out.map_err(err)
    }

    /// As `run`, on a thread of its own: the events come from the returned iterator.
    #[pyo3(signature = (prompts=None, *, messages_json=None, tools_json=None, max_tokens=None, temperature=None, top_k=None, top_p=None, min_p=None, repeat_penalty=None, seed=None, stop=None, ignore_eos=false, thinking=None))]
    #[allow(clippy::too_many_arguments)]
    fn stream(&self, prompts: Option<Vec<PromptArg>>, messages_json: Option<String>, tools_json: Option<String>, max_tokens: Option<i64>, temperature: Option<f32>, top_k: Option<usize>, top_p: Option<f32>, min_p: Option<f32>, repeat_penalty: Option<f32>, seed: Option<u64>, stop: Option<Vec<String>>, ignore_eos: bool, thinking: Option<bool>) -> PyResult<Stream> {
        let job = job(prompts, messages_json, tools_json, thinking)?;
        let cancel = Arc::new(AtomicBool::new(false));
        let opts = gen_options(max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, stop, ignore_eos, thinking, Some(cancel.clone()))?;
        let x = self.inner.clone();
        let (tx, rx) = channel::<Item>();
        std::thread::Builder::new()
            .name("xwen-stream".into())
            .spawn(move || {
                let events = tx.clone();
                let r = job.run(&x, &opts, &mut |e| events.send(Item::Event(event_tuple(e))).is_ok());
                let _ = tx.send(Item::Done(r.map_err(|e| e.to_string())));
            })
            .map_err(|e| EngineError::new_err(format!("starting the generation thread: {e}")))?;
        Ok(Stream { rx: Mutex::new(Some(rx)), cancel })
    }
}

fn job(prompts: Option<Vec<PromptArg>>, messages_json: Option<String>, tools_json: Option<String>, thinking: Option<bool>) -> PyResult<Job> {
    match (prompts, messages_json) {
        (Some(p), None) if !p.is_empty() => Ok(Job::Generate(p)),
        (None, Some(m)) => {
            let parse = |s: &str, what: &str| serde_json::from_str::<serde_json::Value>(s).map_err(|e| InvalidArgument::new_err(format!("{what}: {e}")));
            let messages = xwen_embed::messages_from_json(&parse(&m, "messages")?).map_err(err)?;
            let tools = match tools_json.as_deref().map(|t| parse(t, "tools")).transpose()? {
                None | Some(serde_json::Value::Null) => Vec::new(),
                Some(serde_json::Value::Array(a)) => a,
                Some(_) => return Err(InvalidArgument::new_err("tools must be a list")),
            };
            Ok(Job::Chat(messages, Box::new(ChatOptions { tools, thinking, ..Default::default() })))
        }
        _ => Err(InvalidArgument::new_err("give a prompt (or prompts), or messages")),
    }
}

enum Item {
    Event(EventTuple),
    Done(Result<String, String>),
}

/// The events of a generation running on its own thread, then ("done", result JSON text).
/// Dropping it early stops the generation.
#[pyclass(module = "xwen._native")]
struct Stream {
    rx: Mutex<Option<Receiver<Item>>>,
    cancel: Arc<AtomicBool>,
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next event as (kind, index, token, text); the last is ("done", 0, None, json).
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<EventTuple>> {
        let mut guard = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        // wait without the GIL; wake now and then so Ctrl-C (a pending signal) gets through
        loop {
            let Some(rx) = guard.take() else { return Ok(None) };
            let (rx, got) = py.detach(move || {
                let got = rx.recv_timeout(std::time::Duration::from_millis(100));
                (rx, got)
            });
            *guard = Some(rx);
            match got {
                Ok(Item::Event(e)) => return Ok(Some(e)),
                Ok(Item::Done(r)) => {
                    *guard = None;
                    return r.map(|j| Some(("done", 0, None, j))).map_err(XwenError::new_err);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        self.cancel.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    *guard = None;
                    return Err(EngineError::new_err("the generation thread ended without a result"));
                }
            }
        }
    }

    /// Stops the generation at its next token (the iterator then ends with its result).
    fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_class::<Stream>()?;
    m.add("XwenError", m.py().get_type::<XwenError>())?;
    m.add("InvalidArgument", m.py().get_type::<InvalidArgument>())?;
    m.add("LoadError", m.py().get_type::<LoadError>())?;
    m.add("TemplateError", m.py().get_type::<TemplateError>())?;
    m.add("EngineError", m.py().get_type::<EngineError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
