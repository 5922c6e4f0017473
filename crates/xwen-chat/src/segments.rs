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

/// Token ids of a rendered prompt: markup via [`Tokenizer::encode_markup`], content via
/// [`Tokenizer::encode`]. Each segment is tokenized on its own, so no BPE merge spans a
/// markup/content boundary (llama.cpp's special-token partition cuts there too whenever the
/// boundary is a special token).
pub fn encode_segments(tok: &Tokenizer, segs: &[Segment]) -> Vec<u32> {
    let mut out = Vec::new();
    for s in segs {
        match s {
            Segment::Markup(t) => out.extend(tok.encode_markup(t)),
            Segment::Content(t) => out.extend(tok.encode(t)),
        }
    }
    out
}
