//! The Jinja environment chat templates run in: Hugging Face's settings (trim_blocks,
//! lstrip_blocks, `raise_exception`, `strftime_now`, Python-style `tojson`), the Python string
//! and dict methods templates call, lists that `append`/`pop` in place, and marker-aware
//! versions of every operation that cuts or trims text (see `taint`).

use std::sync::{Arc, Mutex};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{from_args, Kwargs, Object, ObjectRepr, Enumerator, ValueKind, ValueOrKwargs};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State, Value};

use super::json::{to_json, JsonStyle};
use super::taint::{self, Mangled};

/// Instructions one rendering may execute: a 1,500-message, 4 MB agent conversation with 40
/// tools renders within it; a runaway template stops in about a second.
const FUEL: u64 = 10_000_000;

pub(crate) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build();
    if let Ok(syntax) = syntax {
        env.set_syntax(syntax);
    }
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_formatter(super::display::formatter);
    // A template from an untrusted file must not spin forever.
    env.set_fuel(Some(FUEL));
    env.add_filter("string", |v: Value| Value::from(super::display::py_str(&v)));
    env.add_filter("trim", |v: Value, chars: Option<String>| text_op(&v, |s| taint::strip(s, chars.as_deref(), true, true)));
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_filter("tojson", tojson);
    env.add_filter("replace", |v: Value, old: String, new: String, count: Option<i64>| {
        text_op(&v, |s| taint::replace(s, &old, &new, count))
    });
    env.add_filter("upper", |v: Value| text_op(&v, |s| taint::remap(s, str::to_uppercase)));
    env.add_filter("lower", |v: Value| text_op(&v, |s| taint::remap(s, str::to_lowercase)));
    env.add_filter("title", |v: Value| text_op(&v, |s| taint::remap(s, |t| minijinja::filters::title(t.into()))));
    env.add_filter("capitalize", |v: Value| text_op(&v, |s| taint::remap(s, capitalize)));
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, taint::clean(&msg)))
    });
    env.add_function("strftime_now", |fmt: String| super::time::strftime_now(&fmt));
    env.add_function("namespace", namespace);
    env.set_unknown_method_callback(method);
    env
}

fn mangled() -> Error {
    Error::new(ErrorKind::InvalidOperation, "the template cut user-provided text in a way xwen cannot track")
}

/// Applies a marker-aware text operation to a string value (non-strings are stringified,
/// as Jinja does).
fn text_op(v: &Value, f: impl FnOnce(&str) -> Result<String, Mangled>) -> Result<Value, Error> {
    let s = match v.as_str() {
        Some(s) => f(s),
        None => f(&v.to_string()),
    };
    s.map(Value::from).map_err(|_| mangled())
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars.flat_map(char::to_lowercase)).collect(),
        None => String::new(),
    }
}

/// `length` / `count`: characters of the text itself, not of its markers.
fn length(v: Value) -> Result<Value, Error> {
    match v.as_str() {
        Some(s) => Ok(Value::from(s.chars().filter(|&c| !taint::is_marker(c)).count())),
        None => minijinja::filters::length(&v).map(Value::from),
    }
}

/// Hugging Face's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(v: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = indent.or(kwargs.get::<Option<Value>>("indent")?).filter(|i| !i.is_none() && !i.is_undefined());
    let indent = match indent {
        None => None,
        Some(i) => Some(match i.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(i.as_usize().ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "tojson: bad indent"))?),
        }),
    };
    let separators = match kwargs.get::<Option<Value>>("separators")? {
        Some(seps) if !seps.is_none() => {
            let seps: Vec<String> = seps.try_iter()?.map(|s| s.to_string()).collect();
            match seps.as_slice() {
                [a, b] => Some((a.clone(), b.clone())),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair")),
            }
        }
        _ => None,
    };
    let mut style = JsonStyle::new(indent, separators);
    style.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    style.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    to_json(&v, &style).map(Value::from_safe_string)
}

/// Python string, dict and list methods. Methods that cut or trim text keep markers
/// balanced; questions about text (`startswith`, `find`, …) see the text without markers.
fn method(state: &mut State, value: &Value, name: &str, args: &[Value]) -> Result<Value, Error> {
    let Some(s) = value.as_str() else {
        return minijinja_contrib::pycompat::unknown_method_callback(state, value, name, args);
    };
    let strip = |left, right| -> Result<Value, Error> {
        let (chars,): (Option<&str>,) = from_args(args)?;
        text_op(value, |s| taint::strip(s, chars, left, right))
    };
    match name {
        "strip" => strip(true, true),
        "lstrip" => strip(true, false),
        "rstrip" => strip(false, true),
        "split" => {
            let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
            if sep == Some("") {
                return Err(Error::new(ErrorKind::InvalidOperation, "empty separator"));
            }
            let parts = taint::split(s, sep, maxsplit).map_err(|_| mangled())?;
            Ok(parts.into_iter().map(Value::from).collect())
        }
        "replace" => {
            let (old, new, count): (&str, &str, Option<i64>) = from_args(args)?;
            text_op(value, |s| taint::replace(s, old, new, count))
        }
        "upper" => text_op(value, |s| taint::remap(s, str::to_uppercase)),
        "lower" => text_op(value, |s| taint::remap(s, str::to_lowercase)),
        "title" => text_op(value, |s| taint::remap(s, |t| minijinja::filters::title(t.into()))),
        "capitalize" => text_op(value, |s| taint::remap(s, capitalize)),
        // `join` and `format` build new text from marked pieces, which stay balanced.
        "join" | "format" => minijinja_contrib::pycompat::unknown_method_callback(state, value, name, args),
        _ => {
            let clean = Value::from(taint::clean(s));
            minijinja_contrib::pycompat::unknown_method_callback(state, &clean, name, args)
        }
    }
}

/// `namespace(...)` whose list attributes support Python's in-place `append`/`pop`, which
/// templates (Kimi's, for one) use to carry state across loop iterations.
fn namespace(defaults: Option<ValueOrKwargs>) -> Result<Value, Error> {
    let Some(defaults) = defaults else {
        return minijinja::functions::namespace(None);
    };
    let defaults = defaults.into_value();
    let mut pairs = Vec::new();
    for key in defaults.try_iter()? {
        let v = defaults.get_item(&key)?;
        let v = if v.kind() == ValueKind::Seq { Value::from_object(PyList::new(v.try_iter()?.collect())) } else { v };
        pairs.push((key, v));
    }
    minijinja::functions::namespace(Some(Value::from_pairs(pairs).into()))
}

/// A list with Python's mutating methods.
#[derive(Debug)]
pub(crate) struct PyList(Mutex<Vec<Value>>);

impl PyList {
    pub fn new(items: Vec<Value>) -> Self {
        PyList(Mutex::new(items))
    }
    fn items(&self) -> Vec<Value> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl Object for PyList {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let items = self.items();
        let i = i64::try_from(key.clone()).ok()?;
        let i = if i < 0 { items.len() as i64 + i } else { i };
        items.get(usize::try_from(i).ok()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.items())
    }

    fn call_method(self: &Arc<Self>, state: &mut State, method: &str, args: &[Value]) -> Result<Value, Error> {
        let poisoned = |_| Error::new(ErrorKind::InvalidOperation, "list lock poisoned");
        let mut items = self.0.lock().map_err(poisoned)?;
        match method {
            "append" => {
                let (v,): (Value,) = from_args(args)?;
                items.push(v);
                Ok(Value::UNDEFINED)
            }
            "extend" => {
                let (v,): (Value,) = from_args(args)?;
                items.extend(v.try_iter()?);
                Ok(Value::UNDEFINED)
            }
            "insert" => {
                let (i, v): (i64, Value) = from_args(args)?;
                let len = items.len() as i64;
                let i = if i < 0 { (len + i).max(0) } else { i.min(len) };
                items.insert(i as usize, v);
                Ok(Value::UNDEFINED)
            }
            "pop" => {
                let (i,): (Option<i64>,) = from_args(args)?;
                let len = items.len() as i64;
                let i = i.unwrap_or(-1);
                let i = if i < 0 { len + i } else { i };
                if i < 0 || i >= len {
                    return Err(Error::new(ErrorKind::InvalidOperation, "pop index out of range"));
                }
                Ok(items.remove(i as usize))
            }
            "clear" => {
                items.clear();
                Ok(Value::UNDEFINED)
            }
            _ => {
                let snapshot = Value::from(items.clone());
                drop(items);
                minijinja_contrib::pycompat::unknown_method_callback(state, &snapshot, method, args)
            }
        }
    }
}
