//! xwen-embed: the engine as a program that embeds xwen sees it, and the one API the C ABI
//! (`xwen-capi`) and the Python package (`xwen-py`) wrap. An `Xwen` owns a model with its
//! tokenizer, chat template and reply markup:
//!
//! - `load` (`load.rs`): a path, a checkpoint name, or the embedded demo model (`demo.rs`);
//! - `tokenize` / `detokenize`, `logits`, `plan` (the RAM plan, `plan.rs`);
//! - `generate` / `generate_batch` (`generate.rs`): sampling, stop strings and ids, a token
//!   limit, a per-token callback that may stop a sequence, a cancel flag; several prompts are
//!   decoded together as the engine's requests, each sequence's tokens those it gets alone;
//! - `chat` (`chat.rs`): messages (and tools) through the chat template, the reply split into
//!   reasoning, content and tool calls.
//!
//! Nothing here prints, exits or reads the environment (a name's lookup in the Hugging Face
//! cache aside: `xwen-hub` honours `HF_HOME` and `HF_TOKEN`, as the CLI does). Errors are
//! returned (`Error`). An `Xwen` is `Send + Sync`: tokenizing runs concurrently, while
//! generation, chat and logits on one model take turns (they share its worker threads).

mod chat;
mod demo;
mod error;
mod generate;
mod load;
mod plan;

pub use chat::{messages_from_json, ChatCompletion, ChatOptions};
pub use demo::{DEMO_GGUF, DEMO_PROMPT};
pub use error::{Error, Result};
pub use generate::{Completion, Event, FinishReason, GenerateOptions, Prompt, Usage};
pub use load::{LoadOptions, MAX_CTX};
pub use plan::{plan, plan_json};
pub use xwen_chat::tool_parse::ParsedCall;
pub use xwen_chat::ChatMessage;
pub use xwen_engine::{KvType, MemoryPlan, SamplerConfig};

use std::sync::{Arc, Mutex};
use xwen_chat::reply::CallSyntax;
use xwen_chat::{ChatTemplate, Tokenizer};
use xwen_engine::{EngineConfig, LogitsMode, Model};

pub struct Xwen {
    /// Shared with the engine each generation call runs.
    model: Arc<Model>,
    tok: Tokenizer,
    template: Option<ChatTemplate>,
    syntax: CallSyntax,
    is_demo: bool,
    cfg: EngineConfig,
    /// Held while the model computes: calls on one model take turns on its worker threads.
    compute: Mutex<()>,
    /// The thread holding `compute`: a callback that calls back into the model on that thread
    /// gets an error instead of waiting on itself.
    computing_on: Mutex<Option<std::thread::ThreadId>>,
    load_secs: f64,
}

/// What a loaded model is.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub name: Option<String>,
    pub architecture: String,
    pub n_vocab: usize,
    /// Positions a sequence may hold.
    pub context: usize,
    pub eos_ids: Vec<u32>,
    pub has_chat_template: bool,
    pub is_demo: bool,
    pub weight_bytes: u64,
    pub threads: usize,
    pub load_secs: f64,
}

impl Xwen {
    pub fn info(&self) -> ModelInfo {
        ModelInfo {
            name: self.model.name().map(str::to_string),
            architecture: self.model.architecture().to_string(),
            n_vocab: self.model.n_vocab(),
            context: self.model.max_context(),
            eos_ids: self.tok.eos_ids(),
            has_chat_template: self.template.is_some(),
            is_demo: self.is_demo,
            weight_bytes: self.model.weight_bytes(),
            threads: self.model.threads(),
            load_secs: self.load_secs,
        }
    }

    /// The engine model, for what this API does not cover.
    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// Token ids of `text`, no BOS/EOS added. As user text (`markup` false) special-token
    /// spellings such as `<|im_start|>` stay plain text; with `markup` they become their ids.
    pub fn tokenize(&self, text: &str, markup: bool) -> Vec<u32> {
        if markup {
            self.tok.encode_markup(text)
        } else {
            self.tok.encode(text)
        }
    }

    /// The text of `ids` (bytes that are not UTF-8 become U+FFFD). Ids outside the vocabulary
    /// are refused.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids)?;
        Ok(self.tok.decode(ids))
    }

    /// Float32 logits after `ids` from an empty state: the last position's (`n_vocab` values),
    /// or with `all` every position's, row by row (`ids.len() × n_vocab`).
    pub fn logits(&self, ids: &[u32], all: bool) -> Result<Vec<f32>> {
        if ids.is_empty() {
            return Err(Error::InvalidArgument("no token ids".into()));
        }
        self.check_ids(ids)?;
        self.check_fits(ids.len(), 0)?;
        let _turn = self.turn()?;
        let mut state = self.model.new_state();
        let mode = if all { LogitsMode::All } else { LogitsMode::Last };
        Ok(self.model.forward(&mut state, ids, mode)?)
    }

    /// The RAM plan this model runs under (with a budget), or the one it would need without.
    pub fn plan(&self) -> Result<MemoryPlan> {
        match self.model.memory_plan() {
            Some(p) => Ok(p.clone()),
            None => plan::plan_of(self.model.gguf(), &self.cfg),
        }
    }

    /// This call's turn on the model (released when dropped); an error on the thread that
    /// holds it already (a callback calling back in).
    pub(crate) fn turn(&self) -> Result<Turn<'_>> {
        let me = std::thread::current().id();
        if *self.computing_on.lock().unwrap_or_else(|p| p.into_inner()) == Some(me) {
            return Err(Error::InvalidArgument("the model is busy with the call this callback came from: compute after it returns".into()));
        }
        let guard = self.compute.lock().unwrap_or_else(|p| p.into_inner());
        *self.computing_on.lock().unwrap_or_else(|p| p.into_inner()) = Some(me);
        Ok(Turn { x: self, _guard: guard })
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let n = self.model.n_vocab();
        match ids.iter().find(|&&t| t as usize >= n) {
            Some(bad) => Err(Error::InvalidArgument(format!("token {bad} is outside the vocabulary (0..{n})"))),
            None => Ok(()),
        }
    }

    /// A prompt of `n` tokens must leave room for `room` more in the context.
    fn check_fits(&self, n: usize, room: usize) -> Result<()> {
        let ctx = self.model.max_context();
        if n + room > ctx {
            return Err(Error::InvalidArgument(format!(
                "the prompt ({n} tokens) does not fit the context of {ctx} positions{}: load with a larger ctx_size",
                if room > 0 { " with room to generate" } else { "" }
            )));
        }
        Ok(())
    }
}

pub(crate) struct Turn<'a> {
    x: &'a Xwen,
    _guard: std::sync::MutexGuard<'a, ()>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.x.computing_on.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<Xwen>();
    }
}
