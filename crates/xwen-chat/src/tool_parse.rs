//! Qwen's tool calls, parsed out of the reply text. Qwen3.5/3.6 templates ask for
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=ARG>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! and older Qwen3 for `<tool_call>{"name": …, "arguments": {…}}</tool_call>`; both are read.
//! Arguments may come in any order; a missing `</parameter>` ends at the next parameter or at
//! `</function>`; each value is typed by the tool's JSON schema (a `"string"` parameter stays
//! text, others are read as JSON when they parse), the cases users report breaking other
//! servers' parsers (llama.cpp #20260).

use serde_json::{Map, Value};
use std::collections::HashMap;

/// A parsed call: the function's name and its arguments object.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: Map<String, Value>,
}

/// Each tool's parameter types, from the request's `tools` (OpenAI shape).
#[derive(Clone, Debug, Default)]
pub struct ToolSchemas {
    params: HashMap<String, HashMap<String, Value>>,
}

impl ToolSchemas {
    /// From an OpenAI `tools` array (`[{type: function, function: {name, parameters}}]`).
    pub fn from_openai(tools: &[Value]) -> ToolSchemas {
        let mut params = HashMap::new();
        for t in tools {
            let f = t.get("function").unwrap_or(t);
            let Some(name) = f.get("name").and_then(Value::as_str) else { continue };
            let props = f
                .get("parameters")
                .and_then(|p| p.get("properties"))
                .and_then(Value::as_object)
                .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            params.insert(name.to_string(), props);
        }
        ToolSchemas { params }
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.params.keys().map(String::as_str)
    }

    /// A parameter's value typed by its schema: text for `"string"` (or an unknown parameter),
    /// else JSON when it parses as JSON of an allowed type, else the text.
    fn typed(&self, tool: &str, param: &str, raw: &str) -> Value {
        let schema = self.params.get(tool).and_then(|p| p.get(param));
        let types: Vec<&str> = match schema.and_then(|s| s.get("type")) {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => {
                // enum / anyOf / no type: JSON scalars and containers when they parse
                if schema.is_some_and(|s| s.get("anyOf").is_some() || s.get("oneOf").is_some() || s.get("enum").is_some()) {
                    if let Ok(v) = serde_json::from_str::<Value>(raw.trim()) {
                        if !v.is_string() {
                            return v;
                        }
                    }
                }
                return Value::String(raw.to_string());
            }
        };
        if types.iter().all(|t| *t == "string") {
            return Value::String(raw.to_string());
        }
        match serde_json::from_str::<Value>(raw.trim()) {
            Ok(v) if type_allowed(&v, &types) => v,
            _ => {
                // Python-style literals the models write for booleans and null
                match raw.trim() {
                    "True" if types.contains(&"boolean") => Value::Bool(true),
                    "False" if types.contains(&"boolean") => Value::Bool(false),
                    "None" if types.contains(&"null") => Value::Null,
                    _ => Value::String(raw.to_string()),
                }
            }
        }
    }
}

/// The tools (OpenAI shape) named `name`: the one a named tool choice forces.
pub fn tools_named(tools: &Option<Vec<Value>>, name: &str) -> Vec<Value> {
    tools.iter().flatten().filter(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name)).cloned().collect()
}

fn type_allowed(v: &Value, types: &[&str]) -> bool {
    types.iter().any(|t| match *t {
        // any length: a 42-digit id is an integer too (serde_json keeps its digits)
        "integer" => v.as_number().is_some_and(|n| is_integer_literal(&n.to_string())),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        "string" => v.is_string(),
        _ => false,
    })
}

/// A JSON integer as written: an optional minus and digits, no fraction or exponent.
fn is_integer_literal(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Parses the text inside one `<tool_call>` … `</tool_call>` (either tag may be missing).
/// None when no function name can be found.
pub fn parse_call(body: &str, schemas: &ToolSchemas) -> Option<ParsedCall> {
    let body = body.trim_start().strip_prefix("<tool_call>").unwrap_or(body);
    let body = match body.find("</tool_call>") {
        Some(i) => &body[..i],
        None => body,
    };
    let t = body.trim();
    if t.starts_with('{') {
        return parse_json_call(t);
    }
    let start = t.find("<function=")? + "<function=".len();
    let rest = &t[start..];
    let close = rest.find('>')?;
    let name = rest[..close].trim().to_string();
    if name.is_empty() {
        return None;
    }
    let mut inner = &rest[close + 1..];
    if let Some(end) = inner.find("</function>") {
        inner = &inner[..end];
    }
    let mut arguments = Map::new();
    let mut cursor = inner;
    while let Some(p) = cursor.find("<parameter=") {
        let after = &cursor[p + "<parameter=".len()..];
        let Some(close) = after.find('>') else { break };
        let key = after[..close].trim().to_string();
        let value_all = &after[close + 1..];
        // the value ends at its closing tag, or (closing tag missing) at the next parameter
        let end_tag = value_all.find("</parameter>");
        let next_param = value_all.find("<parameter=");
        let (end, skip) = match (end_tag, next_param) {
            (Some(e), Some(n)) if n < e => (n, 0),
            (Some(e), _) => (e, "</parameter>".len()),
            (None, Some(n)) => (n, 0),
            (None, None) => (value_all.len(), 0),
        };
        let mut value = &value_all[..end];
        value = value.strip_prefix('\n').unwrap_or(value);
        value = value.strip_suffix('\n').unwrap_or(value);
        if !key.is_empty() {
            arguments.insert(key.clone(), schemas.typed(&name, &key, value));
        }
        cursor = &value_all[end + skip..];
    }
    Some(ParsedCall { name, arguments })
}

/// One of Kimi's calls: `<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>
/// {json}<|tool_call_end|>` (either end tag may be missing). The name is the id's part between
/// `functions.` and the index; None when there is no name or no argument marker.
pub fn parse_kimi_call(body: &str) -> Option<ParsedCall> {
    let body = body.trim_start();
    let body = body.strip_prefix("<|tool_call_begin|>").unwrap_or(body);
    let body = match body.find("<|tool_call_end|>") {
        Some(i) => &body[..i],
        None => body,
    };
    let (id, args) = body.split_once("<|tool_call_argument_begin|>")?;
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = match id.rsplit_once(':') {
        Some((n, i)) if i.chars().all(|c| c.is_ascii_digit()) => n,
        _ => id,
    };
    if name.is_empty() {
        return None;
    }
    let arguments = match serde_json::from_str::<Value>(args.trim()) {
        Ok(Value::Object(o)) => o,
        _ => Map::new(),
    };
    Some(ParsedCall { name: name.to_string(), arguments })
}

/// One of Kimi K3's calls (Kimi-K3.jinja): `<|open|>call tool="NAME" index="I"<|sep|>` then
/// `<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>` per argument (T says
/// how to read VALUE: `string` as is, the JSON types as JSON), or one
/// `<|open|>json type="object"<|sep|>{…}<|close|>json<|sep|>`; `<|close|>call<|sep|>` (an end
/// tag may be missing where the reply ran out). Attribute values are `&amp;`/`&quot;`-escaped.
pub fn parse_xtml_call(body: &str) -> Option<ParsedCall> {
    let body = body.trim_start().strip_prefix("<|open|>call")?;
    let (attrs, mut rest) = body.split_once("<|sep|>").unwrap_or((body, ""));
    let name = xtml_attr(attrs, "tool")?;
    if name.is_empty() {
        return None;
    }
    if let Some(i) = rest.find("<|close|>call<|sep|>") {
        rest = &rest[..i];
    }
    let mut arguments = Map::new();
    while let Some(i) = rest.find("<|open|>") {
        let el = &rest[i + "<|open|>".len()..];
        let (head, after) = el.split_once("<|sep|>").unwrap_or((el, ""));
        let tag = head.split_whitespace().next().unwrap_or("");
        let close = format!("<|close|>{tag}<|sep|>");
        let (value, next) = match after.find(&close) {
            Some(j) => (&after[..j], &after[j + close.len()..]),
            None => (after, ""),
        };
        match tag {
            "argument" => {
                if let Some(key) = xtml_attr(head, "key") {
                    let ty = xtml_attr(head, "type").unwrap_or_default();
                    let v = if ty == "string" { Value::String(value.to_string()) } else { serde_json::from_str(value.trim()).unwrap_or_else(|_| Value::String(value.to_string())) };
                    arguments.insert(key, v);
                }
            }
            "json" => {
                if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(value.trim()) {
                    arguments.extend(o);
                }
            }
            _ => {}
        }
        rest = next;
    }
    Some(ParsedCall { name, arguments })
}

/// The value of `key="…"` in an XTML open tag's attributes, unescaped.
fn xtml_attr(attrs: &str, key: &str) -> Option<String> {
    let pat = format!("{key}=\"");
    let mut at = 0;
    // the key must start the attribute (not end another's name)
    let start = loop {
        let i = attrs[at..].find(&pat)? + at;
        if i == 0 || attrs[..i].ends_with(char::is_whitespace) {
            break i + pat.len();
        }
        at = i + pat.len();
    };
    let end = attrs[start..].find('"')? + start;
    Some(attrs[start..end].replace("&quot;", "\"").replace("&amp;", "&"))
}

fn parse_json_call(t: &str) -> Option<ParsedCall> {
    let v: Value = serde_json::from_str(t).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::Object(o)) => o.clone(),
        Some(Value::String(s)) => serde_json::from_str::<Map<String, Value>>(s).unwrap_or_default(),
        _ => Map::new(),
    };
    Some(ParsedCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schemas() -> ToolSchemas {
        ToolSchemas::from_openai(&[json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}, "tags": {"type": "array"}, "zip": {"type": "string"}}
        }}})])
    }

    #[test]
    fn xml_call_with_typed_arguments_in_any_order() {
        let body = "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n<parameter=city>\nParis\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=tags>\n[\"a\", 1]\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n</function>\n</tool_call>";
        let c = parse_call(body, &schemas()).unwrap();
        assert_eq!(c.name, "get_weather");
        assert_eq!(Value::Object(c.arguments), json!({"days": 3, "city": "Paris", "metric": true, "tags": ["a", 1], "zip": "75001"}));
    }

    #[test]
    fn missing_closing_parameter_tags() {
        let body = "<function=get_weather>\n<parameter=city>\nNew York\n<parameter=days>\n2\n</function>";
        let c = parse_call(body, &schemas()).unwrap();
        assert_eq!(Value::Object(c.arguments), json!({"city": "New York", "days": 2}));
        // nothing closed at all (the reply ran out)
        let c = parse_call("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo", &schemas()).unwrap();
        assert_eq!(Value::Object(c.arguments), json!({"city": "Oslo"}));
    }

    #[test]
    fn multi_line_string_values_keep_their_lines() {
        let body = "<function=write>\n<parameter=text>\nline 1\nline 2\n\n</parameter>\n</function>";
        let c = parse_call(body, &ToolSchemas::default()).unwrap();
        assert_eq!(c.arguments["text"], json!("line 1\nline 2\n"));
    }

    #[test]
    fn wrong_typed_values_stay_text_and_python_literals_read() {
        let body = "<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=metric>\nFalse\n</parameter>\n</function>";
        let c = parse_call(body, &schemas()).unwrap();
        assert_eq!(Value::Object(c.arguments), json!({"days": "three", "metric": false}));
    }

    #[test]
    fn kimi_k3_calls() {
        let c = parse_xtml_call("<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>\"Q&A\" 7<|close|>argument<|sep|><|open|>argument key=\"tags\" type=\"array\"<|sep|>[1, \"a\"]<|close|>argument<|sep|><|open|>argument key=\"ok\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|><|close|>call<|sep|>").unwrap();
        assert_eq!((c.name.as_str(), Value::Object(c.arguments)), ("get_weather", json!({"city": "\"Q&A\" 7", "tags": [1, "a"], "ok": true})));
        // escaped attribute values, a JSON block, and a call cut short
        let c = parse_xtml_call("<|open|>call index=\"2\" tool=\"a&amp;b\"<|sep|><|open|>json type=\"object\"<|sep|>{\"x\": {\"y\": 1}}<|close|>json<|sep|>").unwrap();
        assert_eq!((c.name.as_str(), Value::Object(c.arguments)), ("a&b", json!({"x": {"y": 1}})));
        let c = parse_xtml_call("<|open|>call tool=\"f\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>4").unwrap();
        assert_eq!(Value::Object(c.arguments), json!({"n": 4}));
        assert!(parse_xtml_call("<|open|>call index=\"1\"<|sep|>").is_none());
        assert!(parse_xtml_call("<|open|>call mytool=\"x\"<|sep|>").is_none());
    }

    #[test]
    fn integers_of_any_length_are_numbers_with_their_digits() {
        let big = "123456789012345678901234567890123456789012";
        let body = format!("<function=get_weather>\n<parameter=days>\n{big}\n</parameter>\n<parameter=zip>\n{big}\n</parameter>\n</function>");
        let c = parse_call(&body, &schemas()).unwrap();
        assert!(c.arguments["days"].is_number(), "{:?}", c.arguments["days"]);
        assert_eq!(c.arguments["zip"], json!(big), "a string parameter stays text");
        let text = Value::Object(c.arguments).to_string();
        assert_eq!(text, format!("{{\"days\":{big},\"zip\":\"{big}\"}}"));
        // negative, and not an integer: a fraction, an exponent
        let days = |v: &str| parse_call(&format!("<function=get_weather>\n<parameter=days>\n{v}\n</parameter>\n</function>"), &schemas()).unwrap().arguments["days"].clone();
        assert_eq!(days(&format!("-{big}")).to_string(), format!("-{big}"));
        assert_eq!(days("2.5"), json!("2.5"));
        assert_eq!(days("1e50"), json!("1e50"));
        // the JSON forms keep the digits too
        let c = parse_call(&format!("<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"x\": {big}}}}}\n</tool_call>"), &ToolSchemas::default()).unwrap();
        assert_eq!(Value::Object(c.arguments).to_string(), format!("{{\"x\":{big}}}"));
    }

    #[test]
    fn json_form_and_garbage() {
        let c = parse_call("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>", &ToolSchemas::default()).unwrap();
        assert_eq!((c.name.as_str(), Value::Object(c.arguments)), ("f", json!({"x": 1})));
        assert!(parse_call("<tool_call>\nhello\n</tool_call>", &ToolSchemas::default()).is_none());
        assert!(parse_call("<function=>", &ToolSchemas::default()).is_none());
        assert!(parse_call("", &ToolSchemas::default()).is_none());
    }
}
