//! The vocabulary as llama.cpp sees it after `llama_vocab::impl::load`: token texts, token
//! attributes (including llama.cpp's name-based corrections) and the end-of-generation set.
//! Reading only `tokenizer.ggml.*` keys keeps this independent of the model architecture.

use xwen_gguf::{GgufFile, Value};

use crate::bpe::FxMap;
use crate::ChatError;

/// llama.cpp's `llama_token_attr` bits.
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
}

/// Token texts that end generation, from llama.cpp's EOG list.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
];

/// Fill-in-the-middle token families: `(GGUF keys, candidate texts, ends generation)`. When no
/// key names the token, llama.cpp finds it by text and forces it to CONTROL.
const FIM: &[(&[&str], &[&str], bool)] = &[
    (&["tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"],
     &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"], false),
    (&["tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"],
     &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"], false),
    (&["tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"],
     &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"], false),
    (&["tokenizer.ggml.fim_pad_token_id"], &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"], true),
    (&["tokenizer.ggml.fim_rep_token_id"], &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"], true),
    (&["tokenizer.ggml.fim_sep_token_id"], &["<|file_sep|>"], true),
];

pub(crate) struct Vocab {
    /// Token texts as stored (GPT-2 byte-level text for normal tokens).
    pub text: Vec<Box<str>>,
    pub attr: Vec<u32>,
    pub token_to_id: FxMap<Box<str>, u32>,
    pub eos: Option<u32>,
    /// llama.cpp's `special_eog_ids`, ascending.
    pub eog: Vec<u32>,
}

/// `tokenizer.ggml.merges`, in rank order.
pub(crate) fn merges(f: &GgufFile) -> Result<Vec<&str>, ChatError> {
    str_array(f, "tokenizer.ggml.merges")
}

fn str_array<'a>(f: &'a GgufFile, key: &'static str) -> Result<Vec<&'a str>, ChatError> {
    let arr = f.get_array(key).ok_or(ChatError::MissingKey(key))?;
    arr.iter()
        .map(|v| v.as_str().ok_or_else(|| ChatError::BadMetadata(format!("{key}: expected strings, found {}", v.type_name()))))
        .collect()
}

fn token_id(f: &GgufFile, key: &str, n: usize) -> Option<u32> {
    f.get_u32(key).filter(|&id| (id as usize) < n)
}

impl Vocab {
    pub fn from_gguf(f: &GgufFile) -> Result<Vocab, ChatError> {
        let tokens = str_array(f, "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        let types: Option<Vec<i64>> = match f.get_array("tokenizer.ggml.token_type") {
            None => None,
            Some(arr) => Some(
                arr.iter()
                    .map(Value::as_i64)
                    .collect::<Option<_>>()
                    .filter(|t: &Vec<i64>| t.len() >= n)
                    .ok_or_else(|| ChatError::BadMetadata("tokenizer.ggml.token_type: not one integer per token".into()))?,
            ),
        };

        let mut text = Vec::with_capacity(n);
        let mut attr = Vec::with_capacity(n);
        let mut token_to_id = FxMap::default();
        for (i, t) in tokens.iter().enumerate() {
            let t: Box<str> = if t.is_empty() { format!("[EMPTY_{i}]").into() } else { (*t).into() };
            token_to_id.insert(t.clone(), i as u32);
            text.push(t);
            attr.push(match types.as_ref().map(|ty| ty[i]) {
                None | Some(1) => attr::NORMAL,
                Some(2) => attr::UNKNOWN,
                Some(3) => attr::CONTROL,
                Some(4) => attr::USER_DEFINED,
                Some(5) => attr::UNUSED,
                Some(6) => attr::BYTE,
                Some(_) => 0,
            });
        }
        let mut v = Vocab { text, attr, token_to_id, eos: token_id(f, "tokenizer.ggml.eos_token_id", n), eog: Vec::new() };
        v.apply_llama_corrections(f);
        Ok(v)
    }

    pub fn id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// llama.cpp's text-based fix-ups of token attributes and its end-of-generation set.
    fn apply_llama_corrections(&mut self, f: &GgufFile) {
        let n = self.text.len();
        let mut eog: Vec<u32> = Vec::new();
        for (keys, candidates, ends) in FIM {
            let keyed = keys.iter().find_map(|k| token_id(f, k, n));
            let found = keyed.or_else(|| {
                let id = candidates.iter().find_map(|c| self.id(c))?;
                self.attr[id as usize] |= attr::CONTROL;
                Some(id)
            });
            if let (Some(id), true) = (found, *ends) {
                eog.push(id);
            }
        }
        for t in EOG_TEXTS {
            if let Some(id) = self.id(t) {
                self.attr[id as usize] |= attr::CONTROL;
                eog.push(id);
            }
        }
        // gpt-oss: these structure tokens are always rendered, so llama.cpp makes them
        // user-defined whatever the file says.
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.id(t) {
                self.attr[id as usize] = attr::USER_DEFINED;
            }
        }
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            eog.extend(token_id(f, key, n));
        }
        eog.sort_unstable();
        eog.dedup();
        // o200k_harmony / solar-open: `<|end|>` ends a message, not the generation.
        let has = |t: &str| self.id(t).is_some_and(|id| eog.contains(&id));
        let harmony = has("<|return|>") && has("<|call|>") || has("<|calls|>") && has("<|flush|>");
        if let (true, Some(end)) = (harmony && has("<|end|>"), self.id("<|end|>")) {
            eog.retain(|&id| id != end);
            self.attr[end as usize] = attr::USER_DEFINED;
        }
        self.eog = eog;
    }

    /// llama.cpp's `cache_special_tokens`: tokens split out of text before BPE, longest first.
    pub fn special_tokens(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..self.text.len() as u32)
            .filter(|&id| self.attr[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        ids.sort_by_key(|&id| std::cmp::Reverse(self.text[id as usize].len()));
        ids
    }
}
