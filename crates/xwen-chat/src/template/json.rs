//! `tojson` as Hugging Face's chat templates (Python `json.dumps`) and llama.cpp's jinja engine
//! write it: `", "` / `": "` separators, non-ASCII kept, keys in insertion order. Content
//! markers pass through unescaped so marked text stays marked inside JSON strings.

use std::fmt::Write;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

use super::taint::is_marker;

pub(crate) struct JsonStyle {
    pub ensure_ascii: bool,
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl JsonStyle {
    /// Python's defaults: `", "` between items unless indenting (then `","`), `": "` after keys.
    pub fn new(indent: Option<String>, separators: Option<(String, String)>) -> Self {
        let (item_sep, key_sep) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        JsonStyle { ensure_ascii: false, indent, item_sep, key_sep, sort_keys: false }
    }
}

pub(crate) fn to_json(v: &Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, v, style, 0)?;
    Ok(out)
}

fn newline(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn write_value(out: &mut String, v: &Value, style: &JsonStyle, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                write!(out, "{v}").ok();
            } else {
                out.push_str(&py_float(f64::try_from(v.clone())?));
            }
        }
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if style.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, depth + 1);
                match k.as_str() {
                    Some(s) => write_str(out, s, style.ensure_ascii),
                    None => write_str(out, &k.to_string(), style.ensure_ascii),
                }
                out.push_str(&style.key_sep);
                write_value(out, &v.get_item(k)?, style, depth + 1)?;
            }
            newline(out, style, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, depth + 1);
                write_value(out, item, style, depth + 1)?;
            }
            newline(out, style, depth);
            out.push(']');
        }
        kind => return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: cannot serialize {kind}"))),
    }
    Ok(())
}

fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                write!(out, "\\u{:04x}", c as u32).ok();
            }
            c if ensure_ascii && !c.is_ascii() && !is_marker(c) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    write!(out, "\\u{unit:04x}").ok();
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` as `json.dumps` writes it.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        return format!("{mant}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_python_json_dumps() {
        let v = crate::template::context::template_value(&serde_json::json!({"b": [1, 2.5, 1.0, 1e20, 1.5e-7], "a": {"x": "é\"\n"}, "c": null, "d": true, "e": []}));
        let s = to_json(&v, &JsonStyle::new(None, None)).unwrap();
        // Insertion order is kept (serde_json's preserve_order is on for this crate).
        assert_eq!(s, r#"{"b": [1, 2.5, 1.0, 1e+20, 1.5e-07], "a": {"x": "é\"\n"}, "c": null, "d": true, "e": []}"#);
        let mut style = JsonStyle::new(Some("  ".into()), None);
        style.ensure_ascii = true;
        assert_eq!(to_json(&crate::template::context::template_value(&serde_json::json!({"k": ["é", "😀"]})), &style).unwrap(),
            "{\n  \"k\": [\n    \"\\u00e9\",\n    \"\\ud83d\\ude00\"\n  ]\n}");
    }
}
