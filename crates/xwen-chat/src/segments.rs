//! Rendered chat prompts as alternating template markup and user-provided content, so each
//! part is tokenized with the right rule: markup may produce special tokens, content never
//! produces control tokens.

use crate::Tokenizer;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// Text the chat template produced.
    Markup(String),
    /// Text a user, tool or earlier reply produced.
    Content(String),
}

impl Segment {
    pub fn text(&self) -> &str {
        match self {
            Segment::Markup(s) | Segment::Content(s) => s,
        }
    }
}

/// The full prompt text (markup and content joined).
pub fn segments_text(segs: &[Segment]) -> String {
    segs.iter().map(Segment::text).collect()
}

/// Token ids of a rendered prompt: special tokens in markup map to their ids (as
/// [`Tokenizer::encode_markup`]), content never yields a control token (as
/// [`Tokenizer::encode`]). The prompt is tokenized as one text
/// ([`Tokenizer::encode_with_content`]) so BPE merges across segment boundaries exactly as
/// llama.cpp does on the whole prompt: `"}"` ending a tool result and the template's `"\n"`
/// after it become llama.cpp's single `"}\n"` token, not two.
pub fn encode_segments(tok: &Tokenizer, segs: &[Segment]) -> Vec<u32> {
    let mut text = String::new();
    let mut content = Vec::new();
    for s in segs {
        let start = text.len();
        text.push_str(s.text());
        if matches!(s, Segment::Content(_)) && text.len() > start {
            content.push(start..text.len());
        }
    }
    tok.encode_with_content(&text, &content)
}
