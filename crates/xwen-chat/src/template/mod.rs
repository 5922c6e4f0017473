//! Chat templates: the model's Jinja template (minijinja with Hugging Face's extensions),
//! rendered into segments that separate the template's markup from the text users and tools
//! wrote.
//!
//! Rendering runs the template twice: once on the plain inputs (the reference text, what
//! llama.cpp renders) and once with user-provided strings marked (see `taint`). The marked
//! rendering must reduce to the reference exactly, else marking changed what the template did
//! and the content/markup split cannot be trusted: xwen then retries marking less (message
//! text only) and otherwise fails with an error rather than guess.

mod context;
mod display;
mod env;
mod json;
mod taint;
mod time;

use minijinja::Environment;
use xwen_gguf::GgufFile;

pub use context::{ChatMessage, RenderOptions, ToolCall};
use context::Marking;

use crate::{ChatError, Segment};

const NAME: &str = "chat";

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bos_token", &self.bos_token).field("eos_token", &self.eos_token).finish()
    }
}

impl ChatTemplate {
    /// Compiles a template; `bos_token` / `eos_token` render as empty strings.
    pub fn new(source: &str) -> Result<Self, ChatError> {
        let mut env = env::environment();
        // Marker characters in the template itself would forge content boundaries.
        env.add_template_owned(NAME, taint::sanitize(source)).map_err(template_error)?;
        Ok(ChatTemplate { env, bos_token: String::new(), eos_token: String::new() })
    }

    /// The GGUF's `tokenizer.chat_template`, with its BOS/EOS token texts; `None` if it has none.
    pub fn from_gguf(f: &GgufFile) -> Result<Option<Self>, ChatError> {
        let Some(source) = f.get_str("tokenizer.chat_template") else {
            return Ok(None);
        };
        let token = |key: &str| -> String {
            let tokens = f.get_array("tokenizer.ggml.tokens");
            f.get_u32(key)
                .and_then(|id| tokens?.get(id as usize)?.as_str().map(String::from))
                .unwrap_or_default()
        };
        let mut t = Self::new(source)?;
        t.bos_token = token("tokenizer.ggml.bos_token_id");
        t.eos_token = token("tokenizer.ggml.eos_token_id");
        Ok(Some(t))
    }

    /// Sets the texts the template sees as `bos_token` and `eos_token`.
    pub fn with_special_tokens(mut self, bos_token: &str, eos_token: &str) -> Self {
        self.bos_token = bos_token.into();
        self.eos_token = eos_token.into();
        self
    }

    /// Renders the conversation. Joined, the segments are exactly the template's output;
    /// every character that came from a message, reasoning, tool call or tool result is in a
    /// `Content` segment.
    pub fn render(&self, messages: &[ChatMessage], opts: &RenderOptions) -> Result<Vec<Segment>, ChatError> {
        let reference = self.render_raw(messages, opts, Marking::Off)?;
        let mut last_err = None;
        for marking in [Marking::Full, Marking::Text] {
            match self.render_raw(messages, opts, marking).map(|s| split_segments(&s)) {
                Ok(Ok(segs)) if crate::segments_text(&segs) == reference => return Ok(segs),
                Ok(Ok(_)) => last_err = Some("marking user text changed the rendering".to_string()),
                Ok(Err(e)) | Err(ChatError::Template(e)) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(ChatError::Template(format!(
            "cannot tell this template's markup from user text ({}); refusing to render",
            last_err.unwrap_or_default()
        )))
    }

    /// The plain rendered text (no content/markup split).
    pub fn render_text(&self, messages: &[ChatMessage], opts: &RenderOptions) -> Result<String, ChatError> {
        self.render_raw(messages, opts, Marking::Off)
    }

    fn render_raw(&self, messages: &[ChatMessage], opts: &RenderOptions, marking: Marking) -> Result<String, ChatError> {
        let ctx = context::context(messages, opts, &self.bos_token, &self.eos_token, marking);
        let tmpl = self.env.get_template(NAME).map_err(template_error)?;
        tmpl.render(context::template_value(&ctx)).map_err(template_error)
    }
}

fn template_error(e: minijinja::Error) -> ChatError {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    ChatError::Template(taint::clean(&msg))
}

/// Cuts a marked rendering into segments; a marker out of place is an error.
fn split_segments(marked: &str) -> Result<Vec<Segment>, String> {
    let runs = taint::Runs::parse(marked).map_err(|_| "the template cut user-provided text apart".to_string())?;
    let mut segs: Vec<Segment> = Vec::new();
    for (is_content, text) in runs.0 {
        match (segs.last_mut(), is_content) {
            (Some(Segment::Content(s)), true) | (Some(Segment::Markup(s)), false) => s.push_str(text),
            (_, true) => segs.push(Segment::Content(text.to_string())),
            (_, false) => segs.push(Segment::Markup(text.to_string())),
        }
    }
    Ok(segs)
}
