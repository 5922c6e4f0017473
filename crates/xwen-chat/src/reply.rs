//! The reply's text, as it streams: stop strings cut it (`crate::TextStream`), then
//! `ReplyParser` splits it into reasoning (`<think>` … `</think>`), content and tool calls: Qwen's
//! `<tool_call>` … `</tool_call>` always, and where the vocabulary has Kimi's markers
//! (`CallSyntax::with_kimi`), Kimi's `<|tool_call_begin|>functions.NAME:i<|tool_call_argument_begin|>
//! {json}<|tool_call_end|>` inside `<|tool_calls_section_begin|>` … `<|tool_calls_section_end|>`
//! (llama.cpp's models/templates/Kimi-K2-*.jinja). Kimi K3's chat format (Kimi-K3.jinja, "XTML")
//! frames everything in `<|open|>TAG attrs<|sep|>` … `<|close|>TAG<|sep|>`: its reasoning is a
//! `think` element, its content a `response`, its calls `call` elements with `argument`s inside
//! a `tools` element (`CallSyntax::xtml`). Every parser holds back only the tail that could
//! still become a stop string or a tag, so streamed deltas never show text that the final reply
//! does not contain.

use crate::tool_parse::{parse_call, parse_kimi_call, parse_xtml_call, ParsedCall, ToolSchemas};
use crate::partial_suffix;

/// One part of the reply.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
    ToolCall(ParsedCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Reasoning,
    Content,
    Call,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
pub const KIMI_CALL_OPEN: &str = "<|tool_call_begin|>";
const KIMI_CALL_CLOSE: &str = "<|tool_call_end|>";
/// Kimi's section markers around its calls: neither content nor part of a call.
const KIMI_SECTION: [&str; 2] = ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"];
/// Kimi K3's reasoning element, and its call element (`<|open|>call tool="NAME" index="1"<|sep|>`).
pub const XTML_THINK_OPEN: &str = "<|open|>think<|sep|>";
const XTML_THINK_CLOSE: &str = "<|close|>think<|sep|>";
const XTML_CALL_OPEN: &str = "<|open|>call";
const XTML_CALL_CLOSE: &str = "<|close|>call<|sep|>";
/// K3's frame around the content and the calls: dropped wherever it stands.
const XTML_FRAME: [&str; 5] =
    ["<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|open|>tools<|sep|>", "<|close|>tools<|sep|>", "<|close|>message<|sep|>"];

/// Which reasoning and tool-call markups a reply may hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallSyntax {
    /// Kimi's token-delimited calls (a vocabulary that has `<|tool_call_begin|>`).
    pub kimi: bool,
    /// Kimi K3's XTML elements (a chat template that writes `<|open|>` … `<|sep|>`): reasoning,
    /// content and calls all take its tags, Qwen's `<think>` is text.
    pub xtml: bool,
}

impl CallSyntax {
    pub fn with_kimi(kimi: bool) -> Self {
        CallSyntax { kimi, xtml: false }
    }

    /// The syntax of replies to prompts `template` renders, for a vocabulary that `has_kimi_calls`
    /// (Kimi's `<|tool_call_begin|>` token): XTML when the template's generation prompt opens
    /// an `<|open|>message` element.
    pub fn detect(template: Option<&crate::ChatTemplate>, has_kimi_calls: bool) -> Self {
        let xtml = template.is_some_and(|t| {
            t.render_text(&[crate::ChatMessage::new("user", "hi")], &crate::RenderOptions::default())
                .is_ok_and(|s| s.contains("<|open|>message") && s.contains("<|sep|>"))
        });
        CallSyntax { kimi: has_kimi_calls, xtml }
    }

    /// The reasoning block's open tag.
    pub fn think_open(&self) -> &'static str {
        if self.xtml {
            XTML_THINK_OPEN
        } else {
            THINK_OPEN
        }
    }

    fn think_close(&self) -> &'static str {
        if self.xtml {
            XTML_THINK_CLOSE
        } else {
            THINK_CLOSE
        }
    }

    /// (open, close) of each call markup.
    fn pairs(&self) -> Vec<(&'static str, &'static str)> {
        let mut v = vec![(CALL_OPEN, CALL_CLOSE)];
        if self.kimi {
            v.push((KIMI_CALL_OPEN, KIMI_CALL_CLOSE));
        }
        if self.xtml {
            v.push((XTML_CALL_OPEN, XTML_CALL_CLOSE));
        }
        v
    }

    /// Markers that are dropped wherever they stand outside a call when the request has tools.
    fn dropped(&self) -> &'static [&'static str] {
        if self.kimi {
            &KIMI_SECTION
        } else {
            &[]
        }
    }

    /// Markers that are dropped wherever they stand outside a call, tools or not.
    fn frame(&self) -> &'static [&'static str] {
        if self.xtml {
            &XTML_FRAME
        } else {
            &[]
        }
    }
}

pub struct ReplyParser {
    mode: Mode,
    syntax: CallSyntax,
    /// The close tag of the call being read (Mode::Call).
    call_close: &'static str,
    buf: String,
    reasoning: bool,
    tools: Option<ToolSchemas>,
    /// Content not shown yet because it is only whitespace (trimmed at the edges of the
    /// content, around reasoning and calls, as llama.cpp's parser does).
    ws: String,
    content_started: bool,
    /// Leading newlines of a reasoning block are dropped (`<think>\n` opens one).
    reasoning_started: bool,
    calls: usize,
}

impl ReplyParser {
    /// `in_reasoning`: the prompt ended inside a reasoning block (the template opened it);
    /// `reasoning`: split `<think>` blocks out at all; `tools`: parse tool calls.
    pub fn new(in_reasoning: bool, reasoning: bool, tools: Option<ToolSchemas>) -> Self {
        Self::with_syntax(in_reasoning, reasoning, tools, CallSyntax::default())
    }

    /// `new` for a model whose calls may also take `syntax`'s markups.
    pub fn with_syntax(in_reasoning: bool, reasoning: bool, tools: Option<ToolSchemas>, syntax: CallSyntax) -> Self {
        ReplyParser {
            mode: if in_reasoning && reasoning { Mode::Reasoning } else { Mode::Content },
            syntax,
            call_close: CALL_CLOSE,
            buf: String::new(),
            reasoning,
            tools,
            ws: String::new(),
            content_started: false,
            reasoning_started: false,
            calls: 0,
        }
    }

    /// Tool calls parsed so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn content(&mut self, out: &mut Vec<Piece>, text: &str) {
        if text.is_empty() {
            return;
        }
        if text.trim().is_empty() {
            self.ws.push_str(text);
            return;
        }
        let mut s = std::mem::take(&mut self.ws);
        s.push_str(text);
        let s = if self.content_started { s } else { s.trim_start().to_string() };
        // keep trailing whitespace back until more content follows
        let trimmed = s.trim_end();
        self.ws = s[trimmed.len()..].to_string();
        self.content_started = true;
        push_merge(out, Piece::Content(trimmed.to_string()));
    }

    fn reasoning_text(out: &mut Vec<Piece>, text: &str) {
        if !text.is_empty() {
            push_merge(out, Piece::Reasoning(text.to_string()));
        }
    }

    /// The earliest call open tag in the buffer: (position, its close tag).
    fn find_call(&self) -> Option<(usize, &'static str)> {
        self.tools.as_ref()?;
        self.syntax.pairs().into_iter().filter_map(|(o, c)| self.buf.find(o).map(|i| (i, c))).min_by_key(|x| x.0)
    }

    /// How much of the buffer's tail could still become a call open tag.
    fn call_prefix_len(&self) -> usize {
        if self.tools.is_none() {
            return 0;
        }
        self.syntax.pairs().into_iter().map(|(o, _)| partial_suffix(&self.buf, o)).max().unwrap_or(0)
    }

    /// Removes the markers that are neither content nor calls (Kimi's section tags, K3's frame);
    /// returns how much of the tail could still become one.
    fn drop_markers(&mut self) -> usize {
        let tool_markers = if self.tools.is_some() { self.syntax.dropped() } else { &[] };
        let mut keep = 0;
        for m in tool_markers.iter().chain(self.syntax.frame()) {
            while let Some(i) = self.buf.find(m) {
                self.buf.replace_range(i..i + m.len(), "");
            }
            keep = keep.max(partial_suffix(&self.buf, m));
        }
        keep
    }

    /// Adds text; returns the pieces now complete.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.mode {
                Mode::Reasoning => {
                    if !self.reasoning_started {
                        let n = self.buf.len() - self.buf.trim_start_matches('\n').len();
                        self.buf.drain(..n);
                        if self.buf.is_empty() {
                            return out;
                        }
                        self.reasoning_started = true;
                    }
                    let dropped_keep = self.drop_markers();
                    let think_close = self.syntax.think_close();
                    let close = self.buf.find(think_close).map(|i| (i, think_close.len(), Mode::Content, CALL_CLOSE));
                    let call = self.find_call().map(|(i, c)| (i, 0, Mode::Call, c));
                    match [close, call].into_iter().flatten().min_by_key(|x| x.0) {
                        Some((i, skip, next, call_close)) => {
                            let r = self.buf[..i].to_string();
                            Self::reasoning_text(&mut out, r.trim_end_matches('\n'));
                            self.buf.drain(..i + skip);
                            self.mode = next;
                            self.call_close = call_close;
                        }
                        None => {
                            let keep = partial_suffix(&self.buf, think_close).max(self.call_prefix_len()).max(dropped_keep);
                            // a trailing newline may be the one before `</think>`
                            let cut = self.buf.len() - keep;
                            let body = &self.buf[..cut];
                            let nl = body.len() - body.trim_end_matches('\n').len();
                            let r = body[..body.len() - nl].to_string();
                            Self::reasoning_text(&mut out, &r);
                            self.buf.drain(..cut - nl);
                            return out;
                        }
                    }
                }
                Mode::Content => {
                    let dropped_keep = self.drop_markers();
                    let call = self.find_call().map(|(i, c)| (i, Mode::Call, c));
                    let think_open = self.syntax.think_open();
                    let think = self.reasoning.then(|| self.buf.find(think_open)).flatten().map(|i| (i, Mode::Reasoning, CALL_CLOSE));
                    match [call, think].into_iter().flatten().min_by_key(|x| x.0) {
                        Some((i, next, call_close)) => {
                            self.call_close = call_close;
                            let c = self.buf[..i].to_string();
                            self.content(&mut out, &c);
                            let skip = if next == Mode::Reasoning { think_open.len() } else { 0 };
                            self.buf.drain(..i + skip);
                            if next == Mode::Reasoning {
                                self.reasoning_started = false;
                            }
                            self.mode = next;
                        }
                        None => {
                            let mut keep = self.call_prefix_len().max(dropped_keep);
                            if self.reasoning {
                                keep = keep.max(partial_suffix(&self.buf, think_open));
                            }
                            let cut = self.buf.len() - keep;
                            let c = self.buf[..cut].to_string();
                            self.content(&mut out, &c);
                            self.buf.drain(..cut);
                            return out;
                        }
                    }
                }
                Mode::Call => match self.buf.find(self.call_close) {
                    Some(i) => {
                        let n = self.call_close.len();
                        let body = self.buf[..i + n].to_string();
                        self.buf.drain(..i + n);
                        self.finish_call(&mut out, &body);
                        self.mode = Mode::Content;
                    }
                    None => return out,
                },
            }
        }
    }

    fn finish_call(&mut self, out: &mut Vec<Piece>, body: &str) {
        let schemas = self.tools.clone().unwrap_or_default();
        let head = body.trim_start();
        let parsed = if head.starts_with(KIMI_CALL_OPEN) {
            parse_kimi_call(body)
        } else if head.starts_with(XTML_CALL_OPEN) {
            parse_xtml_call(body)
        } else {
            parse_call(body, &schemas)
        };
        match parsed {
            Some(call) => {
                self.calls += 1;
                // whitespace between calls is not content
                self.ws.clear();
                out.push(Piece::ToolCall(call));
            }
            // not a call after all: the text is content
            None => self.content(out, body),
        }
    }

    /// The reply ended: whatever is held is flushed (an unclosed call is parsed as far as it
    /// goes; an unclosed reasoning block stays reasoning).
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.mode {
            Mode::Reasoning => Self::reasoning_text(&mut out, rest.trim_end_matches('\n')),
            Mode::Content => self.content(&mut out, &rest),
            Mode::Call => self.finish_call(&mut out, &rest),
        }
        self.ws.clear();
        out
    }
}

/// Appends, merging with the previous piece of the same kind.
fn push_merge(out: &mut Vec<Piece>, p: Piece) {
    match (out.last_mut(), p) {
        (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
        (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
        (_, p) => out.push(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Feeds `text` one char at a time (the hardest split) and whole, and checks they agree.
    fn run(text: &str, in_reasoning: bool, tools: bool) -> Vec<Piece> {
        let schemas = || tools.then(|| ToolSchemas::from_openai(&[json!({"function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}})]));
        let mut whole = ReplyParser::new(in_reasoning, true, schemas());
        let mut a = whole.push(text);
        a.extend(whole.finish());
        let mut p = ReplyParser::new(in_reasoning, true, schemas());
        let mut b = Vec::new();
        for ch in text.chars() {
            for x in p.push(&ch.to_string()) {
                match x {
                    Piece::Content(s) => push_merge(&mut b, Piece::Content(s)),
                    Piece::Reasoning(s) => push_merge(&mut b, Piece::Reasoning(s)),
                    other => b.push(other),
                }
            }
        }
        for x in p.finish() {
            push_merge(&mut b, x);
        }
        assert_eq!(merge_all(a.clone()), b, "split by char differs for {text:?}");
        merge_all(a)
    }

    fn merge_all(v: Vec<Piece>) -> Vec<Piece> {
        let mut out = Vec::new();
        for p in v {
            push_merge(&mut out, p);
        }
        out
    }

    fn r(s: &str) -> Piece {
        Piece::Reasoning(s.into())
    }
    fn c(s: &str) -> Piece {
        Piece::Content(s.into())
    }

    #[test]
    fn reasoning_then_content() {
        assert_eq!(run("I think.\n</think>\n\nHello!", true, false), vec![r("I think."), c("Hello!")]);
        assert_eq!(run("<think>\nhmm\n</think>\n\nHi", false, false), vec![r("hmm"), c("Hi")]);
        assert_eq!(run("plain answer", false, false), vec![c("plain answer")]);
        // the reply ran out inside the reasoning
        assert_eq!(run("still thinking\n", true, false), vec![r("still thinking")]);
    }

    #[test]
    fn tool_calls_after_text_and_inside_unclosed_reasoning() {
        let call = "<tool_call>\n<function=f>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>";
        let want = Piece::ToolCall(ParsedCall { name: "f".into(), arguments: json!({"n": 7}).as_object().unwrap().clone() });
        assert_eq!(run(&format!("Let me check.\n\n{call}"), false, true), vec![c("Let me check."), want.clone()]);
        // a call that ends an unclosed reasoning block
        assert_eq!(run(&format!("need a tool\n{call}"), true, true), vec![r("need a tool"), want.clone()]);
        // two calls separated by a newline, and an unclosed one at the end
        assert_eq!(run(&format!("{call}\n{call}"), false, true), vec![want.clone(), want.clone()]);
        assert_eq!(run("<tool_call>\n<function=f>\n<parameter=n>\n7", false, true), vec![want]);
        // without tools the tags are text
        assert_eq!(run("<tool_call>x</tool_call>", false, false), vec![c("<tool_call>x</tool_call>")]);
    }

    /// Feeds `text` whole and one char at a time to a parser of `syntax` (tools: one
    /// `get_weather` function), checks the two agree, and returns the pieces.
    fn run_with(text: &str, in_reasoning: bool, tools: bool, syntax: CallSyntax) -> Vec<Piece> {
        let schemas = || tools.then(|| ToolSchemas::from_openai(&[json!({"function": {"name": "get_weather", "parameters": {}}})]));
        let mut whole = ReplyParser::with_syntax(in_reasoning, true, schemas(), syntax);
        let mut a = whole.push(text);
        a.extend(whole.finish());
        let mut p = ReplyParser::with_syntax(in_reasoning, true, schemas(), syntax);
        let mut b = Vec::new();
        for ch in text.chars() {
            b.extend(p.push(&ch.to_string()));
        }
        b.extend(p.finish());
        assert_eq!(merge_all(a.clone()), merge_all(b), "split by char differs for {text:?}");
        merge_all(a)
    }

    /// A parser that knows Kimi's markups.
    fn run_kimi(text: &str, tools: bool) -> Vec<Piece> {
        run_with(text, false, tools, CallSyntax::with_kimi(true))
    }

    #[test]
    fn kimi_calls_in_their_section() {
        let call = |i: usize, city: &str| {
            format!("<|tool_call_begin|>functions.get_weather:{i}<|tool_call_argument_begin|>{{\"city\": \"{city}\"}}<|tool_call_end|>")
        };
        let want = |city: &str| Piece::ToolCall(ParsedCall { name: "get_weather".into(), arguments: json!({"city": city}).as_object().unwrap().clone() });
        let text = format!("Checking.<|tool_calls_section_begin|>{}{}<|tool_calls_section_end|>", call(0, "Paris"), call(1, "Oslo"));
        assert_eq!(run_kimi(&text, true), vec![c("Checking."), want("Paris"), want("Oslo")]);
        // reasoning first, then the section
        let text = format!("<think>need weather</think><|tool_calls_section_begin|>{}<|tool_calls_section_end|>", call(0, "Rome"));
        assert_eq!(run_kimi(&text, true), vec![r("need weather"), want("Rome")]);
        // a call cut short at the end still parses as far as its JSON goes, and Qwen's markup
        // still works beside Kimi's
        assert_eq!(run_kimi("<tool_call>\n<function=get_weather>\n</function>\n</tool_call>", true).len(), 1);
        // without tools the markers are text
        let plain = run_kimi("<|tool_calls_section_begin|>x", false);
        assert_eq!(plain, vec![c("<|tool_calls_section_begin|>x")]);
    }

    /// A parser of Kimi K3's XTML replies.
    fn run_xtml(text: &str, in_reasoning: bool, tools: bool) -> Vec<Piece> {
        run_with(text, in_reasoning, tools, CallSyntax { kimi: false, xtml: true })
    }

    /// K3's reply as Kimi-K3.jinja renders an assistant turn: think, response, tools, message end.
    #[test]
    fn kimi_k3_reasoning_content_and_calls() {
        let text = "need the weather<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>\
                    <|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>\
                    <|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>\
                    <|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>\
                    <|open|>call tool=\"get_weather\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"city\": \"Oslo\"}<|close|>json<|sep|><|close|>call<|sep|>\
                    <|close|>tools<|sep|><|close|>message<|sep|>";
        let call = |v: serde_json::Value| Piece::ToolCall(ParsedCall { name: "get_weather".into(), arguments: v.as_object().unwrap().clone() });
        assert_eq!(
            run_xtml(text, true, true),
            vec![r("need the weather"), c("Checking."), call(json!({"city": "Paris", "days": 3})), call(json!({"city": "Oslo"}))]
        );
        // thinking off: the prompt opened the response element; the frame is never content,
        // and Qwen's <think> is text to K3
        let text = "Hello <think>x</think><|close|>response<|sep|><|close|>message<|sep|>";
        assert_eq!(run_xtml(text, false, false), vec![c("Hello <think>x</think>")]);
    }
}
