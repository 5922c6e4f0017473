//! How values print (`{{ v }}`, `|string`): as Python's `str()`, which both Hugging Face's
//! Jinja2 and llama.cpp's engine follow — `True`/`False`/`None`, lists and dicts in Python's
//! literal syntax — where minijinja would write `true`, `none` or JSON.

use std::fmt::Write;

use minijinja::value::ValueKind;
use minijinja::{Error, Output, State, Value};

/// Python's `str(v)` (strings as they are).
pub(crate) fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        _ => py_repr(v),
    }
}

/// Python's `repr(v)` as llama.cpp writes it: strings in single quotes unless they hold one.
fn py_repr(v: &Value) -> String {
    let mut out = String::new();
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::String => {
            let s = v.as_str().unwrap_or_default();
            if s.contains('\'') {
                out.push_str(&super::json::to_json(v, &super::json::JsonStyle::new(None, None)).unwrap_or_default());
            } else {
                write!(out, "'{s}'").ok();
            }
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = v.try_iter().map(|it| it.map(|x| py_repr(&x)).collect()).unwrap_or_default();
            write!(out, "[{}]", items.join(", ")).ok();
        }
        ValueKind::Map => {
            let items: Vec<String> = v
                .try_iter()
                .map(|keys| keys.map(|k| format!("{}: {}", py_repr(&k), py_repr(&v.get_item(&k).unwrap_or_default()))).collect())
                .unwrap_or_default();
            write!(out, "{{{}}}", items.join(", ")).ok();
        }
        _ => write!(out, "{v}").unwrap_or_default(),
    }
    out
}

/// The output formatter: Python's `str()` for booleans, none and containers.
pub(crate) fn formatter(out: &mut Output, state: &mut State, v: &Value) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Bool | ValueKind::None | ValueKind::Seq | ValueKind::Map => {
            out.write_str(&py_str(v)).map_err(Error::from)
        }
        _ => minijinja::escape_formatter(out, state, v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_like_python() {
        let v = crate::template::context::template_value(&serde_json::json!({"a": [1, true, null, "x", "it's"], "b": 0.5}));
        assert_eq!(py_str(&v), r#"{'a': [1, True, None, 'x', "it's"], 'b': 0.5}"#);
        assert_eq!(py_str(&Value::from(false)), "False");
        assert_eq!(py_str(&Value::from("plain")), "plain");
    }
}
