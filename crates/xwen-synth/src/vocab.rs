//! Tokenizer metadata for synthetic models: copied from a real vocabulary file and padded, or a
//! small byte-level BPE vocabulary that llama.cpp and xwen both accept.

use crate::{Result, SynthError};
use xwen_gguf::{GgufFile, Value};

const TOKENS: &str = "tokenizer.ggml.tokens";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const SCORES: &str = "tokenizer.ggml.scores";
/// llama_token_type values (llama.h).
const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;
const TYPE_UNUSED: i32 = 5;

fn pad_token(id: usize) -> Value {
    // convert_hf_to_gguf's name for ids the tokenizer does not define.
    Value::Str(format!("[PAD{id}]"))
}

/// Every `tokenizer.*` key of `vocab`, with the per-token arrays padded to `n_vocab` entries
/// (the embedding rows), as convert_hf_to_gguf pads a vocabulary smaller than the matrix.
pub(super) fn from_gguf(vocab: &GgufFile, n_vocab: usize) -> Result<Vec<(String, Value)>> {
    let n = vocab.get_array(TOKENS).map(<[Value]>::len).ok_or_else(|| SynthError::Invalid(format!("the vocabulary file has no `{TOKENS}`")))?;
    if n > n_vocab {
        return Err(SynthError::Invalid(format!(
            "the vocabulary file has {n} tokens, more than the preset's {n_vocab} embedding rows"
        )));
    }
    let mut out = Vec::new();
    for (k, v) in vocab.metadata() {
        if !k.starts_with("tokenizer.") {
            continue;
        }
        let padded = match (k.as_str(), v) {
            (TOKENS, Value::Array(a)) => Value::Array(a.iter().cloned().chain((n..n_vocab).map(pad_token)).collect()),
            (TOKEN_TYPE, Value::Array(a)) => {
                // Keep the file's element type (i32 in every converter we know of).
                let unused = match a.first() {
                    Some(Value::U32(_)) => Value::U32(TYPE_UNUSED as u32),
                    _ => Value::I32(TYPE_UNUSED),
                };
                Value::Array(a.iter().cloned().chain(std::iter::repeat_n(unused, n_vocab - a.len())).collect())
            }
            (SCORES, Value::Array(a)) => {
                Value::Array(a.iter().cloned().chain(std::iter::repeat_n(Value::F32(-1000.0), n_vocab - a.len())).collect())
            }
            _ => v.clone(),
        };
        if let Value::Array(a) = &padded {
            if matches!(k.as_str(), TOKENS | TOKEN_TYPE | SCORES) && a.len() != n_vocab {
                return Err(SynthError::Invalid(format!("`{k}` has {} entries, `{TOKENS}` has {n}", a.len())));
            }
        }
        out.push((k.clone(), padded));
    }
    Ok(out)
}

/// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the rest are
/// shifted to U+0100 and up, so every byte is a visible one-character token.
fn byte_token(b: u8) -> char {
    let printable = |c: u8| (b'!'..=b'~').contains(&c) || (0xa1..=0xac).contains(&c) || (0xae..=0xff).contains(&c);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).expect("U+0100..U+0143 are chars")
}

/// Special tokens of the Qwen chat format, as the tiny trained models define them.
const SPECIALS: [&str; 7] =
    ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"];
/// A few merges, so the BPE merge table is a real one (llama.cpp rejects a file without it).
const MERGES: [(&str, &str); 4] = [("Ġ", "t"), ("Ġ", "a"), ("i", "n"), ("h", "e")];
const CHAT_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + \
message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- \
'<|im_start|>assistant\n' }}{%- endif %}";

/// The smallest vocabulary `synthetic` can make.
pub(super) const MIN_SYNTHETIC_VOCAB: usize = 256 + MERGES.len() + SPECIALS.len();

/// A byte-level BPE vocabulary (256 byte tokens, a few merges, the chat specials) padded to
/// `n_vocab`, with the qwen35 pre-tokenizer.
pub(super) fn synthetic(n_vocab: usize) -> Vec<(String, Value)> {
    assert!(n_vocab >= MIN_SYNTHETIC_VOCAB, "synthetic vocabulary needs {MIN_SYNTHETIC_VOCAB} rows");
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_token(b).to_string()).collect();
    let mut types = vec![TYPE_NORMAL; 256];
    for (a, b) in MERGES {
        tokens.push(format!("{a}{b}"));
        types.push(TYPE_NORMAL);
    }
    let eos = tokens.len() as u32;
    for s in SPECIALS {
        tokens.push(s.to_string());
        types.push(TYPE_CONTROL);
    }
    let n = tokens.len();
    let mut tok_values: Vec<Value> = tokens.into_iter().map(Value::Str).collect();
    tok_values.extend((n..n_vocab).map(pad_token));
    types.resize(n_vocab, TYPE_UNUSED);
    vec![
        ("tokenizer.ggml.model".into(), "gpt2".into()),
        ("tokenizer.ggml.pre".into(), "qwen35".into()),
        (TOKENS.into(), Value::Array(tok_values)),
        (TOKEN_TYPE.into(), Value::Array(types.into_iter().map(Value::I32).collect())),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(MERGES.iter().map(|(a, b)| Value::Str(format!("{a} {b}"))).collect()),
        ),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.padding_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        ("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)),
        ("tokenizer.chat_template".into(), CHAT_TEMPLATE.into()),
    ]
}
