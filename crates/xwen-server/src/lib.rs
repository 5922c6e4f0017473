//! xwen-server: OpenAI- and Anthropic-compatible HTTP over the library's engine
//! (`xwen_engine::Engine`). One engine thread owns the model and steps all running sequences
//! together; the HTTP side (axum on tokio) renders prompts, queues jobs and turns tokens back
//! into each dialect's replies (`openai`, `anthropic`), streamed or not. The crate calls only
//! the public API of xwen-engine and xwen-chat.
//!
//! - `engine`: starts the library's engine thread, delivers outputs to the routes, counts metrics;
//! - `generation`: one request's tokens → text pieces, stop strings, finish reasons;
//! - `reply`, `tool_parse` (from xwen-chat): reasoning / content / tool-call splitting of the reply text;
//! - `params`: strict reading of request fields; `error`: each dialect's error shape;
//! - `routes`: the router, auth, limits and the small routes; `common`: what routes share;
//!   `structured`: constrained decoding (llguidance); `metrics`: `/metrics`.

pub mod anthropic;
pub mod common;
pub mod engine;
pub mod error;
pub mod generation;
pub mod metrics;
pub mod openai;
pub mod params;
pub mod responses;
pub mod routes;
// the reply parsers live with the templates whose markup they read; every front end uses them
pub use xwen_chat::{reply, tool_parse};
pub mod structured;

use anyhow::{Context, Result};
use error::{ApiError, ApiResult, Dialect, Kind};
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use xwen_chat::{encode_segments, segments_text, ChatMessage, ChatTemplate, RenderOptions, Tokenizer};
use xwen_engine::Model;

/// How the server listens and admits work.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Sequences decoded together (llama-server's -np).
    pub parallel: usize,
    /// Requests that may wait for a slot before new ones get 429.
    pub queue_limit: usize,
    pub api_key: Option<String>,
    /// Largest request body, bytes (413 above).
    pub max_body: usize,
    /// Speculative decoding in the slots, for requests without a grammar or logprobs (None:
    /// off); output is what it is without drafting.
    pub draft: Option<DraftConfig>,
    /// Bytes of conversation states the prefix cache keeps in RAM (0: none).
    pub cache_ram: u64,
    /// Where the prefix cache also keeps its states, across restarts.
    pub cache_dir: Option<std::path::PathBuf>,
    /// One line on stderr per request (method, path, status, time).
    pub access_log: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig { host: "127.0.0.1".into(), port: 8080, parallel: 4, queue_limit: 64, api_key: None, max_body: 8 << 20, draft: None, cache_ram: 0, cache_dir: None, access_log: false }
    }
}

/// How the slots draft and where drafts come from: the engine's (`xwen_engine::DraftSettings`).
pub use xwen_engine::{DraftSettings as DraftConfig, DraftSource};

/// What is served: the model, its tokenizer and chat template, and the names it answers to
/// (the first is the id `/v1/models` lists).
pub struct ServedModel {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub names: Vec<String>,
}

/// A rendered chat prompt.
pub struct Rendered {
    pub ids: Vec<u32>,
    /// It ends inside an open `<think>`.
    pub in_reasoning: bool,
    /// The position where the next turn's rendering departs (a checkpoint goes there).
    pub boundary: Option<usize>,
    /// The prompt as text (llama-server's /apply-template).
    pub text: String,
}

/// Shared by every request.
pub struct App {
    pub engine: engine::EngineHandle,
    pub tok: Arc<Tokenizer>,
    pub template: Option<Arc<ChatTemplate>>,
    pub names: Vec<String>,
    pub max_ctx: usize,
    pub eog: Vec<u32>,
    pub metrics: Arc<metrics::Metrics>,
    pub api_key: Option<String>,
    pub parallel: usize,
    pub queue_limit: usize,
    /// Largest request body, bytes (named in the 413).
    pub max_body: usize,
    /// One line on stderr per request (`xwen serve -v`).
    pub access_log: bool,
    pub created: u64,
    pub architecture: String,
    /// The constrained-decoding compiler (None if the vocabulary could not be read into it).
    pub grammars: Option<structured::Grammars>,
    /// The markups of this model's replies (reasoning and tool calls).
    pub syntax: reply::CallSyntax,
}

impl App {
    /// The id clients see.
    pub fn model_id(&self) -> &str {
        &self.names[0]
    }

    /// A request's `model`: absent is this model; any other name than ours is a 404.
    pub fn check_model(&self, d: Dialect, name: Option<&str>) -> ApiResult<()> {
        match name {
            None => Ok(()),
            Some(n) if self.names.iter().any(|m| m == n) => Ok(()),
            Some(n) => Err(ApiError::new(d, Kind::NotFound, format!("model `{n}` does not exist; this server serves `{}`", self.model_id()))
                .with_code("model_not_found")),
        }
    }

    /// A constraint's processor, or a 400 naming `param` (a schema llguidance cannot compile).
    pub fn constraint(&self, d: Dialect, param: &str, g: llguidance::api::TopLevelGrammar) -> ApiResult<Box<dyn xwen_engine::LogitsProcessor>> {
        let Some(gr) = &self.grammars else {
            return Err(ApiError::new(d, Kind::Unavailable, "structured output is not available on this server"));
        };
        match gr.processor(g) {
            Ok(p) => Ok(Box::new(p)),
            Err(e) => Err(ApiError::param(d, param, format!("`{param}` cannot be enforced: {e}"))),
        }
    }

    /// The grammar of one forced call to one of `tools`, in this model's call markup (its
    /// marker tokens where the vocabulary has them), as a processor; a 400 naming `tools`.
    pub fn call_constraint(&self, d: Dialect, tools: &[serde_json::Value]) -> ApiResult<Box<dyn xwen_engine::LogitsProcessor>> {
        let format = structured::CallFormat::of(self.syntax);
        let g = structured::tool_call_grammar(tools, format, &|m| self.tok.token_id(m))
            .ok_or_else(|| ApiError::param(d, "tools", "the tools cannot be turned into a call grammar"))?;
        self.constraint(d, "tools", g)
    }

    /// Renders a conversation with the chat template (client text as content, never control
    /// tokens).
    pub fn render(&self, d: Dialect, messages: &[ChatMessage], opts: &RenderOptions) -> ApiResult<Rendered> {
        let Some(t) = &self.template else {
            return Err(ApiError::bad(d, "this model has no chat template (start the server with --chat-template-file); use /v1/completions"));
        };
        // Kimi K3's template reads its switch as `thinking` (Kimi-K3.jinja), not
        // `enable_thinking`, and its effort as `thinking_effort` (low, high or max), not
        // `reasoning_effort`: pass the request's choices on unless the client set them
        let k3_opts;
        let opts = if self.syntax.xtml {
            let mut o = opts.clone();
            o.extra.entry("thinking").or_insert(serde_json::Value::Bool(opts.enable_thinking));
            if let Some(e) = opts.extra.get("reasoning_effort").and_then(|v| v.as_str()).and_then(k3_thinking_effort) {
                o.extra.entry("thinking_effort").or_insert(serde_json::Value::String(e.into()));
            }
            k3_opts = o;
            &k3_opts
        } else {
            opts
        };
        let segs = t.render(messages, opts).map_err(|e| ApiError::bad(d, format!("the chat template could not render this conversation: {e}")))?;
        let text = segments_text(&segs);
        let in_reasoning = text.trim_end().ends_with(self.syntax.think_open());
        let ids = encode_segments(&self.tok, &segs);
        // Where the next turn's rendering departs from this prompt: the conversation with a
        // reply and a next user message renders the reply's turn differently from the
        // generation prompt (Qwen drops the `<think>` part of turns before the last query), so
        // the prefix they share is the message boundary a checkpoint must sit at for the next
        // turn to reuse everything before it.
        let mut next = messages.to_vec();
        next.push(ChatMessage::new("assistant", "x"));
        next.push(ChatMessage::new("user", "y"));
        let boundary = t
            .render(&next, &RenderOptions { add_generation_prompt: false, ..opts.clone() })
            .map(|s| encode_segments(&self.tok, &s))
            .map(|n| n.iter().zip(&ids).take_while(|(a, b)| a == b).count())
            .ok();
        Ok(Rendered { ids, in_reasoning, boundary, text })
    }
}

/// Kimi K3's `thinking_effort` (Kimi-K3.jinja accepts low, high and max) for an OpenAI
/// `reasoning_effort`: each level to the nearest one at or above it.
pub fn k3_thinking_effort(reasoning_effort: &str) -> Option<&'static str> {
    match reasoning_effort {
        "minimal" | "low" => Some("low"),
        "medium" | "high" => Some("high"),
        "xhigh" => Some("max"),
        _ => None,
    }
}

/// How long connections may take to finish after SIGINT/SIGTERM before the server exits anyway.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the server until SIGINT or SIGTERM; `on_ready` gets the bound address. In-flight
/// replies end with their final event when the server shuts down.
pub fn serve(m: ServedModel, cfg: ServerConfig, on_ready: impl FnOnce(SocketAddr) + Send) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("xwen-http").enable_all().build().context("tokio runtime")?;
    rt.block_on(async move {
        let metrics = Arc::new(metrics::Metrics::default());
        let max_ctx = m.model.max_context();
        let architecture = m.model.architecture().to_string();
        let eog = m.tokenizer.eos_ids();
        let prefix = if cfg.cache_ram > 0 || cfg.cache_dir.is_some() {
            let c = xwen_engine::PrefixCache::new(&m.model, cfg.cache_ram, cfg.cache_dir.as_deref()).context("the prefix cache")?;
            if let Some(d) = &cfg.cache_dir {
                eprintln!("xwen: prefix cache: {} MiB in RAM, {} states of this model in {}", cfg.cache_ram >> 20, c.len(), d.display());
            }
            Some(c)
        } else {
            None
        };
        let (engine, engine_thread) = engine::start(m.model, cfg.parallel, cfg.queue_limit, cfg.draft.clone(), prefix, metrics.clone()).context("starting the engine thread")?;
        let parallel = engine.parallel();
        let tok = Arc::new(m.tokenizer);
        let grammars = structured::Grammars::new(tok.clone()).map_err(|e| eprintln!("xwen: structured output is off: {e}")).ok();
        // Kimi vocabularies call tools with their own marker tokens; Kimi K3's template frames
        // replies in XTML elements
        let syntax = reply::CallSyntax::detect(m.template.as_ref(), tok.token_id(reply::KIMI_CALL_OPEN).is_some());
        let app = Arc::new(App {
            engine: engine.clone(),
            grammars,
            tok,
            template: m.template.map(Arc::new),
            names: m.names,
            max_ctx,
            eog,
            metrics,
            api_key: cfg.api_key.clone(),
            parallel,
            queue_limit: cfg.queue_limit,
            max_body: cfg.max_body,
            access_log: cfg.access_log,
            created: generation::now_secs(),
            architecture,
            syntax,
        });
        let router = routes::router(app, cfg.max_body);
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
        on_ready(listener.local_addr()?);
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let shutdown = {
            let engine = engine.clone();
            async move {
                wait_for_signal().await;
                // running streams get their final event, then connections close
                engine.shutdown();
                let _ = stop_tx.send(true);
            }
        };
        let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
        let server = axum::serve(listener, service).with_graceful_shutdown(shutdown).into_future();
        tokio::pin!(server);
        tokio::select! {
            r = &mut server => r.context("serving")?,
            _ = async {
                let _ = stop_rx.wait_for(|s| *s).await;
                // a client that stopped reading cannot hold the shutdown forever
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => {}
        }
        engine.shutdown();
        let _ = tokio::task::spawn_blocking(move || engine_thread.join()).await;
        Ok(())
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
