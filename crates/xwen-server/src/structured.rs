//! Constrained decoding with llguidance (the grammar engine llama.cpp, vLLM and SGLang use):
//! `response_format` json_object / json_schema, and `tool_choice` required or a named function,
//! which must produce a call in Qwen's XML format. Each constrained sequence carries a
//! `GrammarProcessor`, the engine's `LogitsProcessor`: before sampling it masks every token the
//! grammar forbids, after it feeds the sampled token to the grammar, and the sequence ends once
//! the grammar is complete. The token trie is built once from our own tokenizer (special tokens
//! marked as llguidance expects), and llguidance tokenizes through it, so its view of the
//! vocabulary is exactly the engine's.

use anyhow::Result;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;
use xwen_chat::Tokenizer;
use xwen_engine::LogitsProcessor;

struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // plain text (never control tokens); bytes that are not UTF-8 go through the trie
        match std::str::from_utf8(s) {
            Ok(t) => self.tok.encode(t),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// The grammar compiler for one tokenizer.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    pub fn new(tok: Arc<Tokenizer>) -> Result<Grammars> {
        let n = tok.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let b = tok.token_bytes(id).to_vec();
                if tok.is_special(id) {
                    let mut m = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    m.extend(b);
                    m
                } else {
                    b
                }
            })
            .collect();
        let eog = tok.eog_ids().first().copied().unwrap_or(0);
        let mut info = TokRxInfo::new(n as u32, eog);
        info.tok_end_of_turn = tok.eog_ids().get(1).copied();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.set_stderr_log_level(0);
        Ok(Grammars { factory })
    }

    /// A processor for `grammar`, or the compile error (a client's bad schema: a 400).
    pub fn processor(&self, grammar: TopLevelGrammar) -> Result<GrammarProcessor> {
        let parser = self.factory.create_parser(grammar)?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            anyhow::bail!(e);
        }
        Ok(GrammarProcessor { m })
    }
}

/// JSON written compactly (`, ` and `: `, no other whitespace): llguidance's default allows any
/// whitespace between tokens, which a weak model fills until max_tokens instead of closing the
/// object. A schema's own `x-guidance` options win.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// A JSON schema as a grammar (json_object is `{"type": "object"}`).
pub fn json_grammar(schema: Value) -> TopLevelGrammar {
    TopLevelGrammar::from_json_schema(compact(schema))
}

fn lark_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A grammar for exactly one Qwen XML tool call to one of `tools` (OpenAI shape): the function
/// name from the list, the required parameters in the schema's order, each string value as
/// text without `<`, every other value as JSON of its schema.
pub fn tool_call_grammar(tools: &[Value]) -> Option<TopLevelGrammar> {
    let mut rules = Vec::new();
    let mut alts = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let f = t.get("function").unwrap_or(t);
        let name = f.get("name")?.as_str()?;
        let params = f.get("parameters");
        let props = params.and_then(|p| p.get("properties")).and_then(Value::as_object);
        let required: Vec<&str> = params.and_then(|p| p.get("required")).and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let mut body = vec![lark_str(&format!("<function={name}>\n"))];
        // required ones in property order (any required key missing from properties is text)
        let mut keys: Vec<&str> = props.map(|p| p.keys().map(String::as_str).filter(|k| required.contains(k)).collect()).unwrap_or_default();
        for r in &required {
            if !keys.contains(r) {
                keys.push(r);
            }
        }
        for (j, k) in keys.iter().enumerate() {
            let schema = props.and_then(|p| p.get(*k)).cloned().unwrap_or(Value::Object(Default::default()));
            let is_string = schema.get("type").and_then(Value::as_str) == Some("string");
            let choices: Option<Vec<String>> = schema.get("enum").and_then(Value::as_array).map(|e| e.iter().filter_map(Value::as_str).map(lark_str).collect());
            // string values are raw text in Qwen's format (the parser reads them so)
            let value = if let (true, Some(c)) = (is_string, choices.filter(|c| !c.is_empty())) {
                format!("({})", c.join(" | "))
            } else if is_string || schema.as_object().is_some_and(|o| o.is_empty()) {
                r#"/[^<]*/"#.to_string()
            } else {
                format!("%json {}", compact(schema))
            };
            let rule = format!("p_{i}_{j}");
            rules.push(format!("{rule}: {} {value} {}", lark_str(&format!("<parameter={k}>\n")), lark_str("\n</parameter>\n")));
            body.push(rule);
        }
        body.push(lark_str("</function>\n"));
        rules.push(format!("f_{i}: {}", body.join(" ")));
        alts.push(format!("f_{i}"));
    }
    if alts.is_empty() {
        return None;
    }
    let lark = format!("start: {} ({}) {}\n{}\n", lark_str("<tool_call>\n"), alts.join(" | "), lark_str("</tool_call>"), rules.join("\n"));
    Some(TopLevelGrammar::from_lark(lark))
}

/// The engine-side grammar: masks logits, follows sampled tokens.
pub struct GrammarProcessor {
    m: Matcher,
}

impl LogitsProcessor for GrammarProcessor {
    fn process(&mut self, logits: &mut [f32]) {
        match self.m.compute_mask() {
            Ok(mask) => {
                for (i, l) in logits.iter_mut().enumerate() {
                    if !mask.is_allowed(i as TokenId) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            // a grammar in error allows nothing but the end
            Err(_) => logits.iter_mut().for_each(|l| *l = f32::NEG_INFINITY),
        }
    }

    fn accept(&mut self, token: u32) -> bool {
        self.m.consume_token(token).is_ok() && !self.m.is_stopped()
    }
}
