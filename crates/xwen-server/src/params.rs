//! Request fields read strictly: each has a type and a range, and a wrong one is a 400 naming the
//! field — never a silent default. Sampling fields (OpenAI's and llama-server's names) fill the
//! engine's `SamplerConfig`; what the request leaves out takes the mode-keyed default (thinking or
//! not) when the config is resolved.

use crate::error::{ApiError, ApiResult, Dialect};
use serde_json::{Map, Value};
use xwen_engine::SamplerConfig;

/// A request body: a JSON object, with the dialect its errors take.
pub struct Body<'a> {
    pub d: Dialect,
    pub o: &'a Map<String, Value>,
}

/// Parses a request body as a JSON object.
pub fn parse_object(d: Dialect, bytes: &[u8]) -> ApiResult<Map<String, Value>> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::bad(d, format!("the body is not valid JSON: {e}")))?;
    match v {
        Value::Object(o) => Ok(o),
        _ => Err(ApiError::bad(d, "the body must be a JSON object")),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> Body<'a> {
    pub fn new(d: Dialect, o: &'a Map<String, Value>) -> Self {
        Body { d, o }
    }

    /// The field, absent when missing or null.
    pub fn get(&self, k: &str) -> Option<&'a Value> {
        self.o.get(k).filter(|v| !v.is_null())
    }

    pub fn err(&self, k: &str, msg: impl Into<String>) -> ApiError {
        ApiError::param(self.d, k, msg)
    }

    pub fn f32_in(&self, k: &str, lo: f64, hi: f64) -> ApiResult<Option<f32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x >= lo && x <= hi => Ok(Some(x as f32)),
                Some(x) => Err(self.err(k, format!("`{k}` must be between {lo} and {hi}, got {x}"))),
                None => Err(self.err(k, format!("`{k}` must be a number, got {}", type_name(v)))),
            },
        }
    }

    pub fn int_in(&self, k: &str, lo: i64, hi: i64) -> ApiResult<Option<i64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_i64() {
                Some(x) if x >= lo && x <= hi => Ok(Some(x)),
                Some(x) => Err(self.err(k, format!("`{k}` must be an integer between {lo} and {hi}, got {x}"))),
                None if v.as_u64().is_some() => Err(self.err(k, format!("`{k}` must be an integer between {lo} and {hi}"))),
                None => Err(self.err(k, format!("`{k}` must be an integer, got {}", type_name(v)))),
            },
        }
    }

    pub fn bool(&self, k: &str) -> ApiResult<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(k, format!("`{k}` must be a boolean, got {}", type_name(v)))),
        }
    }

    pub fn str(&self, k: &str) -> ApiResult<Option<&'a str>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(k, format!("`{k}` must be a string, got {}", type_name(v)))),
        }
    }

    pub fn array(&self, k: &str) -> ApiResult<Option<&'a Vec<Value>>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.err(k, format!("`{k}` must be an array, got {}", type_name(v)))),
        }
    }

    pub fn object(&self, k: &str) -> ApiResult<Option<&'a Map<String, Value>>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(v) => Err(self.err(k, format!("`{k}` must be an object, got {}", type_name(v)))),
        }
    }

    /// `stop` / `stop_sequences`: a string or an array of strings (at most 16).
    pub fn stops(&self, k: &str) -> ApiResult<Vec<String>> {
        let out: Vec<String> = match self.get(k) {
            None => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_str().map(str::to_string).ok_or_else(|| self.err(k, format!("`{k}` must hold strings only"))))
                .collect::<ApiResult<_>>()?,
            Some(v) => Err(self.err(k, format!("`{k}` must be a string or an array of strings, got {}", type_name(v))))?,
        };
        if out.len() > 16 {
            return Err(self.err(k, format!("`{k}` holds {} strings; at most 16", out.len())));
        }
        Ok(out)
    }

    /// The sampling fields both dialects share plus OpenAI's and llama-server's extras.
    pub fn sampler(&self, vocab: usize) -> ApiResult<SamplerConfig> {
        let mut c = SamplerConfig {
            temperature: self.f32_in("temperature", 0.0, 2.0)?,
            top_p: self.f32_in("top_p", 0.0, 1.0)?,
            min_p: self.f32_in("min_p", 0.0, 1.0)?,
            presence_penalty: self.f32_in("presence_penalty", -2.0, 2.0)?,
            frequency_penalty: self.f32_in("frequency_penalty", -2.0, 2.0)?,
            ..Default::default()
        };
        c.top_k = self.int_in("top_k", 0, i64::from(u32::MAX))?.map(|k| k as usize);
        for k in ["repetition_penalty", "repeat_penalty"] {
            if let Some(p) = self.f32_in(k, 0.0, 10.0)? {
                if p == 0.0 {
                    return Err(self.err(k, format!("`{k}` must be above 0")));
                }
                c.repeat_penalty = Some(p);
            }
        }
        c.penalty_last_n = self.int_in("repeat_last_n", 0, 1 << 20)?.map(|n| n as usize);
        c.seed = match self.get("seed") {
            None => None,
            Some(v) => match (v.as_u64(), v.as_i64()) {
                (Some(s), _) => Some(s),
                // llama-server's -1: a random seed
                (None, Some(-1)) => None,
                (None, Some(s)) => Some(s as u64),
                _ => return Err(self.err("seed", "`seed` must be an integer")),
            },
        };
        if c.seed.is_none() {
            c.seed = Some(random_seed());
        }
        if let Some(bias) = self.object("logit_bias")? {
            for (tok, b) in bias {
                let id: u32 = tok.parse().map_err(|_| self.err("logit_bias", format!("`logit_bias` key `{tok}` is not a token id")))?;
                if id as usize >= vocab {
                    return Err(self.err("logit_bias", format!("`logit_bias` token {id} is outside the vocabulary of {vocab}")));
                }
                let b = b.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| self.err("logit_bias", format!("`logit_bias` for {tok} must be a number between -100 and 100")))?;
                // OpenAI's -100 bans a token
                c.logit_bias.push((id, if b <= -100.0 { f32::NEG_INFINITY } else { b as f32 }));
            }
        }
        Ok(c)
    }
}

/// A seed from the clock and a counter: requests without one differ, as OpenAI's do.
pub fn random_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let mut z = t ^ N.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Text of an OpenAI message `content`: a string, or an array of `{type: "text", text}` parts.
pub fn content_text(d: Dialect, field: &str, v: Option<&Value>) -> ApiResult<String> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") | Some("input_text") | Some("output_text") => match p.get("text").and_then(Value::as_str) {
                        Some(t) => out.push_str(t),
                        None => return Err(ApiError::param(d, field, format!("a text part of `{field}` needs a string `text`"))),
                    },
                    Some(other) => return Err(ApiError::param(d, field, format!("content parts of type `{other}` are not supported (text only)"))),
                    None => return Err(ApiError::param(d, field, format!("each part of `{field}` needs a `type`"))),
                }
            }
            Ok(out)
        }
        Some(v) => Err(ApiError::param(d, field, format!("`{field}` must be a string or an array of parts, got {}", type_name(v)))),
    }
}

/// Thinking on or off, and the template variables the request sets (validated).
pub fn thinking_options(b: &Body, default_on: bool) -> ApiResult<(bool, Map<String, Value>)> {
    let mut on = default_on;
    let mut extra = Map::new();
    if let Some(e) = b.str("reasoning_effort")? {
        match e {
            "none" => on = false,
            "minimal" | "low" | "medium" | "high" | "xhigh" => {
                on = true;
                extra.insert("reasoning_effort".into(), Value::String(e.into()));
            }
            other => return Err(b.err("reasoning_effort", format!("`reasoning_effort` `{other}` is not one of none, minimal, low, medium, high, xhigh"))),
        }
    }
    if let Some(kw) = b.object("chat_template_kwargs")? {
        for (k, v) in kw {
            match k.as_str() {
                "enable_thinking" => on = v.as_bool().ok_or_else(|| b.err("chat_template_kwargs", "`chat_template_kwargs.enable_thinking` must be a boolean"))?,
                "preserve_thinking" => {
                    v.as_bool().ok_or_else(|| b.err("chat_template_kwargs", "`chat_template_kwargs.preserve_thinking` must be a boolean"))?;
                    extra.insert(k.clone(), v.clone());
                }
                "reasoning_effort" => match v.as_str() {
                    Some("low" | "medium" | "high" | "minimal" | "xhigh") => {
                        extra.insert(k.clone(), v.clone());
                    }
                    Some("none") => on = false,
                    _ => return Err(b.err("chat_template_kwargs", "`chat_template_kwargs.reasoning_effort` must be one of none, minimal, low, medium, high, xhigh")),
                },
                _ => {
                    extra.insert(k.clone(), v.clone());
                }
            }
        }
    }
    Ok((on, extra))
}
