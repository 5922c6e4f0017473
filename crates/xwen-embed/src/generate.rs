//! Generation: prompts as requests to the engine (one sequence or several decoded together;
//! each sequence's tokens are those it gets alone), each sequence's text decoded as it streams,
//! cut at a stop string (xwen-chat's `TextStream`), handed to the caller token by token. A
//! sequence ends at an end-of-text id, a stop string, the token limit, the context's end, the
//! caller's callback returning false, or the cancel flag.

use crate::error::{Error, Result};
use crate::Xwen;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use xwen_chat::TextStream;
use xwen_engine::{Engine, EngineError, EngineOptions, EngineRequest, Output, RequestId, SamplerConfig, StopReason};

/// A prompt: text (tokenized as user text: special-token spellings stay text) or token ids.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    Text(&'a str),
    Ids(&'a [u32]),
}

/// How to generate. `Default`: sampling as the model card says (the demo model: greedy), a
/// random seed (reported in `Completion::seed`), until an end-of-text id or the context's end.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    /// Tokens to generate at most; None: no limit but the context.
    pub max_tokens: Option<usize>,
    /// Temperature (0: greedy), top-k/p, min-p, penalties, logit bias, seed; a field left None
    /// takes the model card's default (thinking mode's unless `thinking` is Some(false)).
    pub sampling: SamplerConfig,
    /// Which model-card defaults apply: None or Some(true) thinking, Some(false) not.
    pub thinking: Option<bool>,
    /// Stop strings: the text ends before the first one that appears (it is not included).
    pub stop: Vec<String>,
    /// Go on past end-of-text ids.
    pub ignore_eos: bool,
    /// Set it (from any thread) to stop every sequence of the call at its next token.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-text id (it is the last of `Completion::tokens`).
    Eos,
    /// A stop string (`Completion::stop_string`).
    StopString,
    /// `max_tokens`.
    Length,
    /// The context is full (recurrent state cannot be shifted: load with a larger context).
    ContextFull,
    /// The callback returned false or the cancel flag was set.
    Cancelled,
}

impl FinishReason {
    /// The name `xwen run --json` reports (`stop`), "cancelled" for a caller's stop.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::StopString => "stop_string",
            FinishReason::Length => "length",
            FinishReason::ContextFull => "context_full",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// From the call's start to the sequence's first token (a batch's prompts share steps).
    pub prefill_secs: f64,
    /// From the first token to the last.
    pub decode_secs: f64,
}

/// One sequence's result.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The generated text, without an end-of-text token's text or the stop string.
    pub text: String,
    /// Every sampled token, an end-of-text id included (as `xwen run --print-ids` prints them).
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stop_string: Option<String>,
    pub usage: Usage,
    /// The sampler's seed: passing it back repeats the sequence.
    pub seed: u64,
}

/// What a callback sees as a sequence streams.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event<'a> {
    /// Sequence `index` (a prompt's position in the call) sampled `token` (None: the text
    /// held back at the end, after the last token) and its text grew by `text` (may be empty:
    /// a token can end inside a character, or inside what may become a stop string).
    Token { index: usize, token: Option<u32>, text: &'a str },
    /// `chat`: reasoning text.
    Reasoning { text: &'a str },
    /// `chat`: reply content.
    Content { text: &'a str },
    /// `chat`: a complete tool call.
    ToolCall { call: &'a xwen_chat::tool_parse::ParsedCall },
}

/// One sequence while it runs.
struct Seq {
    /// Its request in the engine (None: nothing to run, `max_tokens` 0).
    id: Option<RequestId>,
    prompt_tokens: usize,
    seed: u64,
    text_stream: TextStream,
    text: String,
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
    first_at: Option<Instant>,
    end_at: Option<Instant>,
}

impl Xwen {
    /// Generate from one prompt; `on_event` sees every token (return false to stop).
    pub fn generate(&self, prompt: Prompt, opts: &GenerateOptions, on_event: &mut dyn FnMut(&Event) -> bool) -> Result<Completion> {
        let mut out = self.generate_batch(&[prompt], opts, on_event)?;
        Ok(out.remove(0))
    }

    /// Generate from several prompts at once, decoded together (continuous batching; as many
    /// at a time as the RAM plan holds, `LoadOptions::parallel`). Sequence `i` samples with
    /// the seed plus `i`. `on_event` returning false stops that sequence only.
    pub fn generate_batch(&self, prompts: &[Prompt], opts: &GenerateOptions, on_event: &mut dyn FnMut(&Event) -> bool) -> Result<Vec<Completion>> {
        let ids: Vec<Vec<u32>> = prompts.iter().map(|p| self.prompt_ids(p)).collect::<Result<_>>()?;
        self.run(ids, opts, on_event)
    }

    pub(crate) fn prompt_ids(&self, p: &Prompt) -> Result<Vec<u32>> {
        let ids = match p {
            Prompt::Text(t) => self.tok.encode(t),
            Prompt::Ids(ids) => ids.to_vec(),
        };
        if ids.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty (or tokenizes to nothing)".into()));
        }
        self.check_ids(&ids)?;
        self.check_fits(ids.len(), 1)?;
        Ok(ids)
    }

    /// The sampler settings a request resolves to: the demo model is greedy unless asked
    /// otherwise (a code model; as `xwen run`), a missing seed is drawn.
    fn sampler_config(&self, opts: &GenerateOptions) -> SamplerConfig {
        let mut s = opts.sampling.clone();
        if self.is_demo && s.temperature.is_none() {
            s.temperature = Some(0.0);
        }
        if s.seed.is_none() {
            s.seed = Some(random_seed());
        }
        s
    }

    /// The prompts as one-shot requests to an engine over the model (each sequence's tokens
    /// those it gets alone, whatever ran before), their tokens turned into text as they stream.
    pub(crate) fn run(&self, prompts: Vec<Vec<u32>>, opts: &GenerateOptions, on_event: &mut dyn FnMut(&Event) -> bool) -> Result<Vec<Completion>> {
        let scfg = self.sampler_config(opts);
        let base_seed = scfg.seed.unwrap_or_default();
        let thinking = opts.thinking.unwrap_or(true);
        let stop_ids = if opts.ignore_eos { Vec::new() } else { self.tok.eos_ids() };
        let max_tokens = opts.max_tokens.unwrap_or(usize::MAX);
        let cancelled = || opts.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed));
        let _turn = self.turn()?;
        let t0 = Instant::now();
        let mut engine = Engine::new(self.model.clone(), EngineOptions { parallel: prompts.len(), draft: None, prefix: None });
        let mut seqs: Vec<Seq> = Vec::with_capacity(prompts.len());
        for (i, prompt) in prompts.into_iter().enumerate() {
            let seed = base_seed.wrapping_add(i as u64);
            let params = SamplerConfig { seed: Some(seed), ..scfg.clone() }.resolve(thinking);
            let prompt_tokens = prompt.len();
            // max_tokens 0: the prompt is not run (the engine would run it and sample nothing)
            let id = (max_tokens > 0).then(|| engine.submit(EngineRequest { one_shot: true, ..EngineRequest::new(prompt, max_tokens, stop_ids.clone(), params) }));
            let finish = id.is_none().then_some(FinishReason::Length);
            seqs.push(Seq {
                id,
                prompt_tokens,
                seed,
                text_stream: TextStream::new(opts.stop.clone()),
                text: String::new(),
                tokens: Vec::new(),
                finish,
                first_at: None,
                end_at: None,
            });
        }
        while engine.has_work() {
            if cancelled() {
                for s in seqs.iter_mut().filter(|s| s.finish.is_none()) {
                    if let Some(id) = s.id {
                        engine.cancel(id);
                    }
                    s.finish = Some(FinishReason::Cancelled);
                }
                break;
            }
            for (id, out) in engine.step() {
                let Some(i) = seqs.iter().position(|s| s.id == Some(id)) else { continue };
                let s = &mut seqs[i];
                match out {
                    Output::Token { id: token, .. } => {
                        if s.finish.is_some() {
                            continue;
                        }
                        s.first_at.get_or_insert_with(Instant::now);
                        s.tokens.push(token);
                        if stop_ids.contains(&token) {
                            continue;
                        }
                        let kept = s.text_stream.push(&self.tok, token);
                        s.text.push_str(&kept);
                        let go_on = on_event(&Event::Token { index: i, token: Some(token), text: &kept });
                        let stop = if s.text_stream.stop().is_some() {
                            Some(FinishReason::StopString)
                        } else if !go_on || cancelled() {
                            Some(FinishReason::Cancelled)
                        } else {
                            None
                        };
                        if let Some(f) = stop {
                            s.finish = Some(f);
                            s.end_at = Some(Instant::now());
                            engine.cancel(id);
                        }
                    }
                    Output::Done { stop, .. } => {
                        s.end_at.get_or_insert_with(Instant::now);
                        s.finish.get_or_insert(match stop {
                            StopReason::StopToken => FinishReason::Eos,
                            StopReason::Length => FinishReason::Length,
                            StopReason::ContextFull => FinishReason::ContextFull,
                            StopReason::Caller | StopReason::Constraint => FinishReason::Cancelled,
                        });
                    }
                    Output::Failed(error) => return Err(Error::Engine(EngineError::State(error))),
                    Output::Shutdown => return Err(Error::Engine(EngineError::State("the engine shut down".into()))),
                    Output::Started { .. } | Output::Prefill { .. } => {}
                }
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        for (i, mut s) in seqs.into_iter().enumerate() {
            // the text the stream still held: no stop string came (or the held text completes one)
            let tail = s.text_stream.finish();
            if !tail.is_empty() {
                s.text.push_str(&tail);
                on_event(&Event::Token { index: i, token: None, text: &tail });
            }
            if s.text_stream.stop().is_some() {
                s.finish = Some(FinishReason::StopString);
            }
            let end = s.end_at.unwrap_or_else(Instant::now);
            let first = s.first_at.unwrap_or(end);
            out.push(Completion {
                text: s.text,
                usage: Usage {
                    prompt_tokens: s.prompt_tokens,
                    completion_tokens: s.tokens.len(),
                    prefill_secs: first.duration_since(t0).as_secs_f64(),
                    decode_secs: end.duration_since(first).as_secs_f64(),
                },
                tokens: s.tokens,
                finish: s.finish.unwrap_or(FinishReason::Cancelled),
                stop_string: s.text_stream.stop().map(str::to_string),
                seed: s.seed,
            });
        }
        Ok(out)
    }
}

/// A seed no two calls share: the clock's nanoseconds and the process id through SplitMix64's
/// finalizer, kept to 32 bits as llama.cpp prints seeds (the CLI draws its seeds the same way).
fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ ((std::process::id() as u64) << 32);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) & 0xffff_ffff
}
