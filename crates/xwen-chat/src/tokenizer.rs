//! The tokenizer: llama.cpp's BPE `tokenize` (special-token partition, pre-tokenizer, byte-level
//! BPE) and `token_to_piece`, built from a GGUF's `tokenizer.ggml.*` metadata.

use std::ops::Range;

use xwen_gguf::GgufFile;

use crate::bpe::Bpe;
use crate::pretok::patterns::{self, Pre};
use crate::pretok::PreTokenizer;
use crate::unicode::char_to_byte;
use crate::vocab::{attr, Vocab};
use crate::ChatError;

pub struct Tokenizer {
    vocab: Vocab,
    pre_kind: Pre,
    pre: PreTokenizer,
    bpe: Bpe,
    /// Decoded bytes of every token, concatenated; token `i` is `pieces[piece_at[i]..piece_at[i+1]]`.
    pieces: Vec<u8>,
    piece_at: Vec<usize>,
    /// Tokens split out of markup (control, user-defined, unknown), longest first.
    markup_specials: Vec<u32>,
    /// Tokens split out of plain content: llama.cpp's `parse_special = false` still splits
    /// user-defined tokens (as HF tokenizers does for non-special added tokens).
    content_specials: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab_size", &self.vocab_size()).field("pre", &self.pre_kind).finish()
    }
}

enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

impl Tokenizer {
    /// A tokenizer from the GGUF's `tokenizer.ggml.*` keys (model `gpt2`, i.e. byte-level BPE).
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, ChatError> {
        Self::from_gguf_with_pre(f, f.get_str("tokenizer.ggml.pre"))
    }

    /// As [`Tokenizer::from_gguf`] with `tokenizer.ggml.pre` replaced by `pre` (for files whose
    /// converter could not name the pre-tokenizer). `None` means llama.cpp's "default".
    pub fn from_gguf_with_pre(f: &GgufFile, pre: Option<&str>) -> Result<Tokenizer, ChatError> {
        let model = f.get_str("tokenizer.ggml.model").ok_or(ChatError::MissingKey("tokenizer.ggml.model"))?;
        if model != "gpt2" {
            return Err(ChatError::UnsupportedTokenizer(format!("tokenizer.ggml.model = {model:?} (only \"gpt2\" byte-level BPE)")));
        }
        let choice = patterns::choose(pre)
            .ok_or_else(|| ChatError::UnsupportedTokenizer(format!("tokenizer.ggml.pre = {:?}", pre.unwrap_or(""))))?;
        let vocab = Vocab::from_gguf(f)?;
        let pre = PreTokenizer::new(choice.pre)?;
        let merges = match crate::vocab::merges(f) {
            // llama.cpp loads a kimi-k2 vocabulary without `tokenizer.ggml.merges` (it then
            // merges nothing); every other pre-tokenizer needs them.
            Err(ChatError::MissingKey(_)) if choice.pre == Pre::KimiK2 => Vec::new(),
            merges => merges?,
        };
        let bpe = Bpe::new(&vocab.token_to_id, merges.into_iter(), choice.ignore_merges);
        let (mut pieces, mut piece_at) = (Vec::new(), Vec::with_capacity(vocab.text.len() + 1));
        for id in 0..vocab.text.len() {
            piece_at.push(pieces.len());
            append_piece(&vocab, id, &mut pieces);
        }
        piece_at.push(pieces.len());
        let markup_specials = vocab.special_tokens();
        let content_specials = markup_specials
            .iter()
            .copied()
            .filter(|&id| vocab.attr[id as usize] & (attr::CONTROL | attr::UNKNOWN) == 0)
            .collect();
        Ok(Tokenizer { vocab, pre_kind: choice.pre, pre, bpe, pieces, piece_at, markup_specials, content_specials })
    }

    /// Token ids of text a user or tool wrote: control tokens' text is tokenized as plain
    /// text, never as the control id. (llama.cpp `tokenize(text, add_special=false,
    /// parse_special=false)`; user-defined tokens such as `<think>` still map to their ids,
    /// as they do in llama.cpp and HF tokenizers.)
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenize(text, &self.content_specials)
    }

    /// Token ids of template markup: every special token's text maps to its id
    /// (llama.cpp `parse_special=true`). Never call this on user-provided text.
    pub fn encode_markup(&self, text: &str) -> Vec<u32> {
        self.tokenize(text, &self.markup_specials)
    }

    /// Token ids of a prompt in which the byte ranges `content` (sorted, disjoint) hold text
    /// users or tools wrote: special tokens are split out as by [`Tokenizer::encode_markup`],
    /// except that a control token may not overlap any content byte. BPE then runs across
    /// markup/content boundaries exactly as llama.cpp runs it over a whole prompt, so benign
    /// content yields llama.cpp's ids.
    pub fn encode_with_content(&self, text: &str, content: &[Range<usize>]) -> Vec<u32> {
        let overlaps = |r: Range<usize>| {
            let i = content.partition_point(|c| c.end <= r.start);
            content.get(i).is_some_and(|c| c.start < r.end)
        };
        self.tokenize_with(text, &self.markup_specials, |id, r| !self.is_special(id) || !overlaps(r))
    }

    fn tokenize(&self, text: &str, specials: &[u32]) -> Vec<u32> {
        self.tokenize_with(text, specials, |_, _| true)
    }

    fn tokenize_with(&self, text: &str, specials: &[u32], allowed: impl Fn(u32, Range<usize>) -> bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        for frag in self.partition(text, specials, allowed) {
            match frag {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(r) => {
                    let piece = &text[r];
                    for w in self.pre.split(piece) {
                        self.bpe.encode_word(&piece.as_bytes()[w], &self.vocab.token_to_id, &mut out);
                    }
                }
            }
        }
        out
    }

    /// llama.cpp's `tokenizer_st_partition`: for each special token, longest first, cut every
    /// remaining text fragment at each of its occurrences (those `allowed` accepts).
    fn partition(&self, text: &str, specials: &[u32], allowed: impl Fn(u32, Range<usize>) -> bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0..text.len()));
        for &id in specials {
            let pat = &*self.vocab.text[id as usize];
            if !text.contains(pat) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Fragment::Text(mut r) = frag else {
                    next.push(frag);
                    continue;
                };
                let mut from = r.start;
                while let Some(off) = text[from..r.end].find(pat) {
                    let p = from + off;
                    if !allowed(id, p..p + pat.len()) {
                        from = p + text[p..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    if p > r.start {
                        next.push(Fragment::Text(r.start..p));
                    }
                    next.push(Fragment::Token(id));
                    r.start = p + pat.len();
                    from = r.start;
                }
                if !r.is_empty() {
                    next.push(Fragment::Text(r));
                }
            }
            frags = next;
        }
        frags
    }

    /// Text of `ids`, special tokens rendered as their text; invalid UTF-8 is replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes token `id` stands for: llama.cpp's `token_to_piece(special = true)`. Empty for
    /// an id outside the vocabulary and for unused/undefined tokens.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_at.len() {
            return &[];
        }
        &self.pieces[self.piece_at[i]..self.piece_at[i + 1]]
    }

    /// The id of the token whose vocabulary text is `text` (byte-level text for normal tokens).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.text.len()
    }

    /// Tokens that stop generation: `tokenizer.ggml.eos_token_id`, and for Qwen vocabularies
    /// both `<|im_end|>` and `<|endoftext|>` (Qwen GGUFs advertise only one of them).
    pub fn eos_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.vocab.eos.into_iter().collect();
        if matches!(self.pre_kind, Pre::Qwen2 | Pre::Qwen35) {
            for t in ["<|im_end|>", "<|endoftext|>"] {
                if let Some(id) = self.vocab.id(t).filter(|id| !ids.contains(id)) {
                    ids.push(id);
                }
            }
        }
        ids
    }

    /// llama.cpp's end-of-generation set (`special_eog_ids`), ascending: a superset of
    /// [`Tokenizer::eos_ids`] that also holds FIM padding/separator tokens.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    /// Control (or unknown) tokens: the ids plain content can never produce.
    pub fn is_special(&self, id: u32) -> bool {
        self.vocab.attr.get(id as usize).is_some_and(|a| a & (attr::CONTROL | attr::UNKNOWN) != 0)
    }
}

/// llama.cpp's `token_to_piece` for a byte-level BPE vocabulary.
fn append_piece(vocab: &Vocab, id: usize, out: &mut Vec<u8>) {
    let (text, a) = (&vocab.text[id], vocab.attr[id]);
    if a & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if a & attr::NORMAL != 0 {
        let mut buf = [0u8; 4];
        for c in text.chars() {
            // llama.cpp prints an "[UNK_BYTE_..]" marker for a character outside the byte
            // table; such a character cannot come from a byte-level converter, so keep it.
            match char_to_byte(c) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
            }
        }
    } else if a & attr::BYTE != 0 {
        if let Some(b) = text.strip_prefix("<0x").and_then(|h| h.get(..2)).and_then(|h| u8::from_str_radix(h, 16).ok()) {
            out.push(b);
        }
    }
}
