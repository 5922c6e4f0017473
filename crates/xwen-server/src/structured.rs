//! Constrained decoding with llguidance (the grammar engine llama.cpp, vLLM and SGLang use):
//! `response_format` json_object / json_schema, and `tool_choice` required or a named function,
//! which must produce one call in the model's own markup (Qwen's XML, Kimi's marker tokens or
//! Kimi K3's XTML: `CallFormat`). Each constrained sequence carries a
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

/// Plain text to token ids, never control tokens.
pub type TextEncoder = Box<dyn Fn(&str) -> Vec<TokenId> + Send + Sync>;

struct Env {
    trie: TokTrie,
    /// Plain text to token ids, never control tokens (the engine's own tokenizer).
    encode: TextEncoder,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // bytes that are not UTF-8 go through the trie
        match std::str::from_utf8(s) {
            Ok(t) => (self.encode)(t),
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
        let words: Vec<(Vec<u8>, bool)> = (0..n as u32).map(|id| (tok.token_bytes(id).to_vec(), tok.is_special(id))).collect();
        let eog = tok.eog_ids().to_vec();
        Grammars::from_words(&words, &eog, Box::new(move |t| tok.encode(t)))
    }

    /// From each token's (bytes, special), the end-of-generation ids (the first ends a
    /// grammar's reply) and the plain-text encoder.
    pub fn from_words(words: &[(Vec<u8>, bool)], eog: &[TokenId], encode: TextEncoder) -> Result<Grammars> {
        let marked: Vec<Vec<u8>> = words
            .iter()
            .map(|(b, special)| {
                if *special {
                    // special tokens as llguidance expects them: never matched by text
                    let mut m = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    m.extend(b);
                    m
                } else {
                    b.clone()
                }
            })
            .collect();
        let mut info = TokRxInfo::new(words.len() as u32, eog.first().copied().unwrap_or(0));
        info.tok_end_of_turn = eog.get(1).copied();
        let trie = TokTrie::from(&info, &marked);
        let env: TokEnv = Arc::new(Env { trie, encode });
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
/// object. A schema's own `x-guidance` options win. Objects that list their properties are
/// closed (`close_objects`).
fn compact(mut schema: Value) -> Value {
    // an allOf of several members composes objects (a $ref'd base and more properties): a
    // member or a definition closed alone would forbid the others' keys, so such a schema
    // keeps JSON Schema's open objects
    if !composes(&schema) {
        close_objects(&mut schema);
    }
    if let Value::Object(o) = &mut schema {
        o.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// Whether an `allOf` of two or more members appears anywhere in the schema.
fn composes(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.iter().any(|(k, c)| (k == "allOf" && c.as_array().is_some_and(|a| a.len() > 1)) || composes(c)),
        Value::Array(a) => a.iter().any(composes),
        _ => false,
    }
}

/// An object schema that lists `properties` and says nothing of other keys takes no other keys,
/// as llama.cpp's json-schema-to-grammar (and vLLM's xgrammar in its default strict mode) read
/// it: JSON Schema's own default (any additional property) let a model add keys until
/// max_tokens where the caller asked for exactly these. `additionalProperties`,
/// `patternProperties` or `unevaluatedProperties` written in the schema win; a schema that
/// composes objects with an `allOf` of several members is left open (`compact`). Applied
/// through every subschema: properties, items, definitions, the branches of anyOf / oneOf.
fn close_objects(v: &mut Value) {
    let Value::Object(o) = v else { return };
    let lists = o.get("properties").is_some_and(Value::is_object);
    let says = ["additionalProperties", "patternProperties", "unevaluatedProperties"].iter().any(|k| o.contains_key(*k));
    if lists && !says {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, child) in o.iter_mut() {
        match k.as_str() {
            // maps of name → schema
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                if let Value::Object(m) = child {
                    m.values_mut().for_each(close_objects);
                }
            }
            // one schema (or, for `items` in older drafts, a list of them)
            "items" | "additionalItems" | "unevaluatedItems" | "additionalProperties" | "unevaluatedProperties" | "contains" | "not" | "if" | "then" | "else" | "propertyNames" => match child {
                Value::Array(a) => a.iter_mut().for_each(close_objects),
                other => close_objects(other),
            },
            // (an allOf here has one member: `compact` leaves composing schemas open)
            "prefixItems" | "anyOf" | "oneOf" | "allOf" => {
                if let Value::Array(a) = child {
                    a.iter_mut().for_each(close_objects);
                }
            }
            // values (const, enum, default, examples) and keywords without subschemas
            _ => {}
        }
    }
}

/// A JSON schema as a grammar (json_object is `{"type": "object"}`).
pub fn json_grammar(schema: Value) -> TopLevelGrammar {
    TopLevelGrammar::from_json_schema(compact(schema))
}

fn lark_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The markup a forced call is written in: the model's own (`reply::CallSyntax`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallFormat {
    /// Qwen's `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>`.
    QwenXml,
    /// Kimi K2 / Kimi-Linear: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
    /// <|tool_call_argument_begin|>{json}<|tool_call_end|><|tool_calls_section_end|>`
    /// (models/templates/Kimi-K2-*.jinja).
    Kimi,
    /// Kimi K3's XTML, after the prompt opened the `response` element: it closes it, then
    /// `tools` › `call tool="NAME" index="1"` › `json type="object"` (Kimi-K3.jinja's rendering
    /// of a call whose arguments are a JSON string, as OpenAI clients send them).
    Xtml,
}

impl CallFormat {
    pub fn of(syntax: crate::reply::CallSyntax) -> CallFormat {
        if syntax.xtml {
            CallFormat::Xtml
        } else if syntax.kimi {
            CallFormat::Kimi
        } else {
            CallFormat::QwenXml
        }
    }
}

/// Writes grammar literals: a marker the vocabulary holds as one token is that token
/// (`<[id]>`, so the model's own control token is what the grammar allows), anything else text.
struct Lit<'a> {
    token: &'a dyn Fn(&str) -> Option<TokenId>,
}

impl Lit<'_> {
    fn mark(&self, m: &str) -> String {
        match (self.token)(m) {
            Some(id) => format!("<[{id}]>"),
            None => lark_str(m),
        }
    }

    fn text(&self, s: &str) -> String {
        lark_str(s)
    }

    /// An XTML tag: `<|open|>` / `<|close|>`, its text, `<|sep|>`.
    fn xtml(&self, open: bool, tag: &str) -> String {
        format!("{} {} {}", self.mark(if open { "<|open|>" } else { "<|close|>" }), self.text(tag), self.mark("<|sep|>"))
    }
}

/// One tool's (name, parameters schema) in OpenAI's shape (`function` wrapper or flat).
fn tool_name_params(t: &Value) -> Option<(&str, Option<&Value>)> {
    let f = t.get("function").unwrap_or(t);
    Some((f.get("name")?.as_str()?, f.get("parameters")))
}

/// A call's arguments as one JSON object of the tool's schema (an absent schema: any object).
fn args_json(params: Option<&Value>) -> String {
    let schema = match params {
        Some(p) if p.is_object() && !p.as_object().is_some_and(|o| o.is_empty()) => p.clone(),
        _ => serde_json::json!({"type": "object"}),
    };
    format!("%json {}", compact(schema))
}

fn escape_attr(v: &str) -> String {
    v.replace('&', "&amp;").replace('"', "&quot;")
}

/// A grammar for exactly one tool call to one of `tools` (OpenAI shape), in `format`;
/// `token` gives the id of a marker the vocabulary holds as one token. Qwen's XML takes the
/// required parameters in the schema's order, each string value as text without `<`, every
/// other value as JSON of its schema; Kimi's two formats take the arguments as one JSON object
/// of the tool's schema.
pub fn tool_call_grammar(tools: &[Value], format: CallFormat, token: &dyn Fn(&str) -> Option<TokenId>) -> Option<TopLevelGrammar> {
    let lit = Lit { token };
    let mut rules = Vec::new();
    let mut alts = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let (name, params) = tool_name_params(t)?;
        let body = match format {
            CallFormat::QwenXml => qwen_call_body(i, name, params, &mut rules),
            CallFormat::Kimi => vec![
                lit.mark("<|tool_call_begin|>"),
                lit.text(&format!("functions.{name}:0")),
                lit.mark("<|tool_call_argument_begin|>"),
                args_json(params),
                lit.mark("<|tool_call_end|>"),
            ],
            CallFormat::Xtml => vec![
                lit.xtml(true, &format!("call tool=\"{}\" index=\"1\"", escape_attr(name))),
                lit.xtml(true, "json type=\"object\""),
                args_json(params),
                lit.xtml(false, "json"),
                lit.xtml(false, "call"),
            ],
        };
        rules.push(format!("f_{i}: {}", body.join(" ")));
        alts.push(format!("f_{i}"));
    }
    if alts.is_empty() {
        return None;
    }
    let (open, close) = match format {
        CallFormat::QwenXml => (lark_str("<tool_call>\n"), lark_str("</tool_call>")),
        CallFormat::Kimi => (lit.mark("<|tool_calls_section_begin|>"), lit.mark("<|tool_calls_section_end|>")),
        CallFormat::Xtml => (format!("{} {}", lit.xtml(false, "response"), lit.xtml(true, "tools")), lit.xtml(false, "tools")),
    };
    let lark = format!("start: {open} ({}) {close}\n{}\n", alts.join(" | "), rules.join("\n"));
    Some(TopLevelGrammar::from_lark(lark))
}

/// Qwen's XML call body for tool `i`; each parameter's rule goes to `rules`.
fn qwen_call_body(i: usize, name: &str, params: Option<&Value>, rules: &mut Vec<String>) -> Vec<String> {
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
        // string values are raw text in Qwen's format (the parser reads them so); a text value
        // takes its own closing newline (the lexer is greedy: a `[^<]*` value followed by
        // "\n</parameter>" would swallow the newline and never close), the parser drops it
        let (value, close) = if let (true, Some(c)) = (is_string, choices.filter(|c| !c.is_empty())) {
            (format!("({})", c.join(" | ")), "\n</parameter>\n")
        } else if is_string || schema.as_object().is_some_and(|o| o.is_empty()) {
            (r#"/[^<]*/"#.to_string(), "</parameter>\n")
        } else {
            (format!("%json {}", compact(schema)), "\n</parameter>\n")
        };
        let rule = format!("p_{i}_{j}");
        rules.push(format!("{rule}: {} {value} {}", lark_str(&format!("<parameter={k}>\n")), lark_str(close)));
        body.push(rule);
    }
    body.push(lark_str("</function>\n"));
    body
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::{CallSyntax, Piece, ReplyParser};
    use crate::tool_parse::ToolSchemas;
    use serde_json::json;

    const MARKERS: [&str; 8] = [
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
        "<|open|>",
        "<|close|>",
        "<|sep|>",
    ];

    /// A byte-level vocabulary (ids 0..256) plus, when `with_markers`, Kimi's markers as special
    /// tokens, then an end-of-turn token.
    struct Vocab {
        specials: Vec<String>,
    }

    impl Vocab {
        fn new(with_markers: bool) -> Vocab {
            let mut specials: Vec<String> = if with_markers { MARKERS.iter().map(|s| s.to_string()).collect() } else { vec![] };
            specials.push("<|im_end|>".into());
            Vocab { specials }
        }

        fn id(&self, m: &str) -> Option<TokenId> {
            self.specials.iter().position(|s| s == m).map(|i| 256 + i as TokenId)
        }

        fn eog(&self) -> TokenId {
            self.id("<|im_end|>").unwrap()
        }

        fn grammars(&self) -> Grammars {
            let mut words: Vec<(Vec<u8>, bool)> = (0..=255u8).map(|b| (vec![b], false)).collect();
            words.extend(self.specials.iter().map(|s| (s.as_bytes().to_vec(), true)));
            Grammars::from_words(&words, &[self.eog()], Box::new(|t| t.bytes().map(TokenId::from).collect())).unwrap()
        }

        /// `text` as this vocabulary's model would write it: its markers as their tokens.
        fn ids(&self, text: &str) -> Vec<TokenId> {
            let mut out = Vec::new();
            let mut rest = text;
            'outer: while !rest.is_empty() {
                for m in &self.specials {
                    if let Some(r) = rest.strip_prefix(m.as_str()) {
                        out.push(self.id(m).unwrap());
                        rest = r;
                        continue 'outer;
                    }
                }
                out.push(rest.as_bytes()[0] as TokenId);
                rest = &rest[1..];
            }
            out
        }
    }

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]}}}),
            json!({"type": "function", "function": {"name": "noop"}}),
        ]
    }

    /// Whether `format`'s call grammar over `vocab` takes `text` whole and ends there.
    fn accepts(vocab: &Vocab, format: CallFormat, text: &str) -> bool {
        let g = tool_call_grammar(&tools(), format, &|m| vocab.id(m)).unwrap();
        let mut p = vocab.grammars().processor(g).unwrap();
        for t in vocab.ids(text) {
            if p.m.consume_token(t).is_err() {
                return false;
            }
        }
        p.m.is_accepting().unwrap_or(false)
    }

    fn parsed(syntax: CallSyntax, text: &str) -> Vec<Piece> {
        let schemas = ToolSchemas::from_openai(&tools());
        let mut r = ReplyParser::with_syntax(false, true, Some(schemas), syntax);
        let mut v = r.push(text);
        v.extend(r.finish());
        v
    }

    fn the_call(pieces: &[Piece]) -> (String, Value) {
        let calls: Vec<_> = pieces.iter().filter_map(|p| if let Piece::ToolCall(c) = p { Some(c) } else { None }).collect();
        assert_eq!(calls.len(), 1, "{pieces:?}");
        (calls[0].name.clone(), Value::Object(calls[0].arguments.clone()))
    }

    const QWEN: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    const KIMI: &str = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 3}<|tool_call_end|><|tool_calls_section_end|>";
    const XTML: &str = "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{\"city\": \"Paris\", \"days\": 3}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>";

    #[test]
    fn forced_calls_take_the_models_own_markup() {
        let want = ("get_weather".to_string(), json!({"city": "Paris", "days": 3}));
        let kimi = Vocab::new(true);
        // Kimi's vocabulary: its marker tokens, arguments as JSON of the schema
        assert!(accepts(&kimi, CallFormat::Kimi, KIMI));
        assert!(!accepts(&kimi, CallFormat::Kimi, QWEN));
        assert!(!accepts(&kimi, CallFormat::Kimi, &KIMI.replace("\"days\": 3", "\"days\": \"3\"")), "days is an integer");
        assert!(!accepts(&kimi, CallFormat::Kimi, &KIMI.replace("get_weather", "get_time")), "not a tool");
        assert!(accepts(&kimi, CallFormat::Kimi, &KIMI.replace("get_weather", "noop").replace("{\"city\": \"Paris\", \"days\": 3}", "{}")));
        assert_eq!(the_call(&parsed(CallSyntax::with_kimi(true), KIMI)), want);
        // K3: the XTML markers as tokens where the vocabulary has them, as text where not
        assert!(accepts(&kimi, CallFormat::Xtml, XTML));
        let plain = Vocab::new(false);
        assert!(accepts(&plain, CallFormat::Xtml, XTML));
        assert!(!accepts(&plain, CallFormat::Xtml, KIMI));
        assert_eq!(the_call(&parsed(CallSyntax { kimi: false, xtml: true }, &format!("{XTML}<|close|>message<|sep|>"))), want);
        // Qwen's XML stays as it was
        assert!(accepts(&plain, CallFormat::QwenXml, QWEN));
        assert!(!accepts(&plain, CallFormat::QwenXml, KIMI));
        assert_eq!(the_call(&parsed(CallSyntax::default(), QWEN)), want);
        // a marker the vocabulary holds is only ever that token, never its spelling in text
        let spelled: Vec<TokenId> = KIMI.bytes().map(TokenId::from).collect();
        let g = tool_call_grammar(&tools(), CallFormat::Kimi, &|m| kimi.id(m)).unwrap();
        let mut p = kimi.grammars().processor(g).unwrap();
        assert!(p.m.consume_tokens(&spelled).is_err());
    }

    #[test]
    fn a_forced_calls_long_integer_goes_back_as_that_number() {
        let big = "123456789012345678901234567890123456789012";
        let text = QWEN.replace("\n3\n", &format!("\n{big}\n"));
        assert!(accepts(&Vocab::new(false), CallFormat::QwenXml, &text), "the grammar takes any length");
        let pieces = parsed(CallSyntax::default(), &text);
        let (_, args) = the_call(&pieces);
        let Piece::ToolCall(call) = pieces.iter().find(|p| matches!(p, Piece::ToolCall(_))).unwrap() else { unreachable!() };
        // OpenAI (streamed and not: one call_json), the arguments as a JSON string
        let openai = crate::openai::call_json(call, Some(0));
        assert_eq!(openai["function"]["arguments"], format!("{{\"city\":\"Paris\",\"days\":{big}}}"));
        // Anthropic's tool_use input, as the body is written
        let body = json!({"type": "tool_use", "input": args}).to_string();
        assert!(body.contains(&format!("\"days\":{big}}}")), "{body}");
        // Kimi's JSON arguments too
        let kimi = KIMI.replace("\"days\": 3", &format!("\"days\": {big}"));
        assert!(accepts(&Vocab::new(true), CallFormat::Kimi, &kimi));
        let (_, args) = the_call(&parsed(CallSyntax::with_kimi(true), &kimi));
        assert_eq!(args["days"].to_string(), big);
    }

    /// Whether the grammar of `schema` takes `text` whole and ends there.
    fn json_accepts(schema: Value, text: &str) -> bool {
        let vocab = Vocab::new(false);
        let mut p = vocab.grammars().processor(json_grammar(schema)).unwrap();
        vocab.ids(text).into_iter().all(|t| p.m.consume_token(t).is_ok()) && p.m.is_accepting().unwrap_or(false)
    }

    #[test]
    fn listed_properties_are_the_only_keys_unless_the_schema_says_otherwise() {
        let point = json!({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}, "required": ["n"]});
        assert!(json_accepts(point.clone(), r#"{"n": 1, "s": "a"}"#));
        assert!(json_accepts(point.clone(), r#"{"n": 1}"#));
        assert!(!json_accepts(point.clone(), r#"{"n": 1, "sw": 0}"#), "a key the schema does not list");
        let mut open = point.clone();
        open["additionalProperties"] = json!(true);
        assert!(json_accepts(open, r#"{"n": 1, "sw": 0}"#), "the schema's own word wins");
        // nested objects, array items and definitions are closed too; free-form objects are not
        let nested = json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/pt"}, "l": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "integer"}}}}, "any": {"type": "object"}},
            "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}}}}});
        assert!(json_accepts(nested.clone(), r#"{"p": {"x": 1}, "l": [{"a": 2}], "any": {"k": 3}}"#));
        assert!(!json_accepts(nested.clone(), r#"{"p": {"x": 1, "y": 2}}"#));
        assert!(!json_accepts(nested, r#"{"l": [{"a": 2, "b": 3}]}"#));
        // allOf's members stay open, so their properties combine — a $ref'd base too
        let both = json!({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "object", "properties": {"b": {"type": "integer"}}}]});
        assert!(json_accepts(both, r#"{"a": 1, "b": 2}"#));
        let derived = json!({"$defs": {"base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
            "allOf": [{"$ref": "#/$defs/base"}, {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]});
        assert!(json_accepts(derived, r#"{"a": 1, "b": 2}"#));
        // a one-member allOf (pydantic's wrapper of a $ref) composes nothing: closed as usual
        let wrapped = json!({"type": "object", "properties": {"p": {"allOf": [{"$ref": "#/$defs/pt"}]}}, "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}}}}});
        assert!(json_accepts(wrapped.clone(), r#"{"p": {"x": 1}}"#));
        assert!(!json_accepts(wrapped, r#"{"p": {"x": 1, "y": 2}}"#));
        assert!(json_accepts(json!({"type": "object"}), r#"{"k": 1}"#), "json_object mode takes any object");
    }

    #[test]
    fn call_formats_follow_the_reply_syntax() {
        assert_eq!(CallFormat::of(CallSyntax::default()), CallFormat::QwenXml);
        assert_eq!(CallFormat::of(CallSyntax::with_kimi(true)), CallFormat::Kimi);
        assert_eq!(CallFormat::of(CallSyntax { kimi: true, xtml: true }), CallFormat::Xtml);
    }
}
