//! One request's generation as the routes see it: a prepared prompt goes to the engine thread,
//! and its tokens come back as text pieces (reasoning, content, tool calls) with logprobs, cut at
//! stop strings, ending with a finish reason. Both dialects and both modes (streamed or not)
//! read the same `Gen`, so a streamed reply concatenates to exactly the non-streamed one.

use crate::engine::{ChannelSink, Out, SubmitError};
use crate::error::{ApiError, ApiResult, Dialect, Kind};
use crate::reply::{Piece, ReplyParser};
use crate::tool_parse::ToolSchemas;
use crate::App;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use xwen_chat::{TextStream, Tokenizer};
use xwen_engine::{EngineRequest, SamplingParams, StopReason};

/// A request ready for the engine.
pub struct Prepared {
    pub prompt: Vec<u32>,
    /// None: until the context is full.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stops: Vec<String>,
    pub logprobs: Option<usize>,
    /// The prompt ends inside an open `<think>`.
    pub in_reasoning: bool,
    /// Split reasoning out of the reply.
    pub reasoning: bool,
    /// Parse tool calls (the request has tools and did not say `none`).
    pub tools: Option<ToolSchemas>,
    /// llama-server's `ignore_eos`: end-of-generation tokens are banned, the reply runs to
    /// max_tokens.
    pub ignore_eos: bool,
    /// Prompt positions to checkpoint the slot's state at (message boundaries).
    pub checkpoints: Vec<usize>,
    /// A grammar the reply must follow (structured output, a forced tool call).
    pub processor: Option<Box<dyn xwen_engine::LogitsProcessor>>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Finish {
    /// An end-of-generation token.
    Stop,
    /// A stop string matched (the string).
    StopSequence(String),
    /// max_tokens, or the context is full.
    Length,
    ToolCalls,
    /// The server is shutting down.
    Shutdown,
    /// The engine failed (our fault: a 500 or an error event).
    Error(String),
}

/// One token's logprobs as text.
#[derive(Clone, Debug)]
pub struct LogprobEntry {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(String, Vec<u8>, f32)>,
}

#[derive(Debug, Default)]
pub struct Chunk {
    pub pieces: Vec<Piece>,
    pub logprobs: Vec<LogprobEntry>,
}

pub struct Gen {
    rx: UnboundedReceiver<Out>,
    cancel: Arc<AtomicBool>,
    tok: Arc<Tokenizer>,
    eog: Vec<u32>,
    /// The reply's tokens as text, cut at a stop string.
    stream: TextStream,
    parser: ReplyParser,
    pub prompt_tokens: usize,
    pub cached: usize,
    pub completion_tokens: usize,
    finish: Option<Finish>,
    /// When the request started (OpenAI's `created`, seconds since the epoch).
    pub created: u64,
}

/// Seconds since the epoch (OpenAI's `created`).
pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl App {
    /// Checks the prompt against the context and queues it; the error is the client's (400,
    /// 429) or the server's state (503 while shutting down).
    pub fn start(&self, d: Dialect, p: Prepared) -> ApiResult<Gen> {
        let n = p.prompt.len();
        if n == 0 {
            return Err(ApiError::bad(d, "the prompt is empty"));
        }
        if n >= self.max_ctx {
            return Err(ApiError::bad(
                d,
                format!("the prompt is {n} tokens and the context holds {} (the server's -c); shorten the prompt", self.max_ctx),
            )
            .with_code("context_length_exceeded"));
        }
        let room = self.max_ctx - n;
        let max_tokens = p.max_tokens.map_or(room, |m| m.min(room));
        let (tx, rx) = unbounded_channel();
        let mut sampling = p.sampling;
        if p.ignore_eos {
            sampling.logit_bias.extend(self.eog.iter().map(|&t| (t, f32::NEG_INFINITY)));
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let req = EngineRequest {
            logprobs: p.logprobs,
            processor: p.processor,
            checkpoints: p.checkpoints,
            ..EngineRequest::new(p.prompt, max_tokens, if p.ignore_eos { Vec::new() } else { self.eog.clone() }, sampling)
        };
        self.metrics.prompt_tokens.inc_by(n as u64);
        match self.engine.submit(req, Box::new(ChannelSink(tx)), cancel.clone()) {
            Ok(()) => {}
            Err(SubmitError::QueueFull) => {
                return Err(ApiError::new(d, Kind::QueueFull, format!("all {} slots are busy and {} requests wait; retry later", self.parallel, self.queue_limit)))
            }
            Err(SubmitError::ShuttingDown) => return Err(ApiError::new(d, Kind::Unavailable, "the server is shutting down")),
        }
        Ok(Gen {
            rx,
            cancel,
            tok: self.tok.clone(),
            eog: self.eog.clone(),
            stream: TextStream::new(p.stops),
            parser: ReplyParser::with_syntax(p.in_reasoning, p.reasoning, p.tools, self.syntax),
            prompt_tokens: n,
            cached: 0,
            completion_tokens: 0,
            finish: None,
            created: now_secs(),
        })
    }
}

impl Gen {
    /// Waits until the request holds a slot (a queued request waits here). An engine failure
    /// before any token is returned as a 500.
    pub async fn started(&mut self, d: Dialect) -> ApiResult<()> {
        match self.rx.recv().await {
            Some(Out::Started { cached }) => {
                self.cached = cached;
                Ok(())
            }
            Some(Out::Failed(e)) => Err(ApiError::new(d, Kind::Internal, format!("the engine failed: {e}"))),
            Some(Out::Shutdown) | None => Err(ApiError::new(d, Kind::Unavailable, "the server is shutting down")),
            Some(other) => Err(ApiError::new(d, Kind::Internal, format!("unexpected engine event {other:?}"))),
        }
    }

    pub fn finish(&self) -> Option<&Finish> {
        self.finish.as_ref()
    }

    fn entry(&self, id: u32, lp: &xwen_engine::TokenLogprobs) -> LogprobEntry {
        let text = |t: u32| {
            let b = self.tok.token_bytes(t).to_vec();
            (String::from_utf8_lossy(&b).into_owned(), b)
        };
        let (token, bytes) = text(id);
        let top = lp
            .top
            .iter()
            .map(|&(t, l)| {
                let (s, b) = text(t);
                (s, b, l)
            })
            .collect();
        LogprobEntry { token, bytes, logprob: lp.logprob, top }
    }

    /// The stream's text through the parser; a stop string ends the reply (and its request).
    fn text(&mut self, safe: &str, out: &mut Chunk) {
        out.pieces.extend(self.parser.push(safe));
        if let Some(s) = self.stream.stop() {
            let s = s.to_string();
            self.cancel.store(true, Ordering::Release);
            out.pieces.extend(self.parser.finish());
            self.finish = Some(Finish::StopSequence(s));
        }
    }

    fn flush(&mut self, out: &mut Chunk, fin: Finish) {
        let tail = self.stream.finish();
        self.text(&tail, out);
        if self.finish.is_some() {
            return;
        }
        out.pieces.extend(self.parser.finish());
        let fin = if fin == Finish::Stop && self.parser.calls() > 0 { Finish::ToolCalls } else { fin };
        self.finish = Some(fin);
    }

    /// The next part of the reply; None once it has finished (see `finish`).
    pub async fn next(&mut self) -> Option<Chunk> {
        if self.finish.is_some() {
            return None;
        }
        loop {
            let mut out = Chunk::default();
            match self.rx.recv().await {
                Some(Out::Token { id, logprobs }) => {
                    self.completion_tokens += 1;
                    if let Some(lp) = &logprobs {
                        out.logprobs.push(self.entry(id, lp));
                    }
                    if !self.eog.contains(&id) {
                        let t = self.stream.push(&self.tok, id);
                        self.text(&t, &mut out);
                    }
                }
                Some(Out::Done { stop, .. }) => {
                    let fin = match stop {
                        StopReason::StopToken | StopReason::Constraint | StopReason::Caller => Finish::Stop,
                        StopReason::Length | StopReason::ContextFull => Finish::Length,
                    };
                    self.flush(&mut out, fin);
                }
                Some(Out::Shutdown) => self.flush(&mut out, Finish::Shutdown),
                Some(Out::Failed(e)) => self.flush(&mut out, Finish::Error(e)),
                Some(Out::Started { .. } | Out::Prefill { .. }) => continue,
                None => self.flush(&mut out, Finish::Error("the engine thread ended".into())),
            }
            if !out.pieces.is_empty() || !out.logprobs.is_empty() || self.finish.is_some() {
                return Some(out);
            }
        }
    }
}

impl Drop for Gen {
    /// A request that goes away (client disconnected) stops its sequence at the next step.
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Release);
    }
}
