//! Marking text a user or tool wrote as it flows through a chat template.
//!
//! Every user-provided string enters the template wrapped in a pair of markers (two Unicode
//! noncharacters, which no legitimate text contains and which are removed from inputs). The
//! template's own string operations that cut or trim text (`trim`, `strip`, `split`, …) are
//! replaced by versions that keep each marked run marked, so after rendering the marked runs
//! are exactly the characters that came from the inputs.

use std::ops::Range;

/// Starts a run of user-provided text.
pub(crate) const OPEN: char = '\u{FDD0}';
/// Ends a run of user-provided text.
pub(crate) const CLOSE: char = '\u{FDD1}';

pub(crate) fn is_marker(c: char) -> bool {
    c == OPEN || c == CLOSE
}


/// Removes marker characters an input might carry, so it cannot forge a run boundary.
pub(crate) fn sanitize(s: &str) -> String {
    s.replace([OPEN, CLOSE], "")
}

/// `s` as one marked run (empty strings stay empty, so they stay falsy in the template).
pub(crate) fn wrap(s: &str) -> String {
    let s = sanitize(s);
    if s.is_empty() {
        s
    } else {
        format!("{OPEN}{s}{CLOSE}")
    }
}

/// The text without markers.
pub(crate) fn clean(s: &str) -> String {
    s.replace([OPEN, CLOSE], "")
}

/// A string cut into runs: `(marked, text)` in order, markers removed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Runs<'a>(pub Vec<(bool, &'a str)>);

/// A marker out of place (nested or unmatched): the template cut text in a way these helpers
/// do not track.
#[derive(Debug)]
pub(crate) struct Mangled;

impl<'a> Runs<'a> {
    pub fn parse(s: &'a str) -> Result<Runs<'a>, Mangled> {
        let mut runs = Vec::new();
        let mut marked = false;
        let mut start = 0;
        for (i, c) in s.char_indices() {
            if !is_marker(c) {
                continue;
            }
            if (c == OPEN) == marked {
                return Err(Mangled);
            }
            if i > start {
                runs.push((marked, &s[start..i]));
            }
            marked = c == OPEN;
            start = i + c.len_utf8();
        }
        if marked {
            return Err(Mangled);
        }
        if start < s.len() {
            runs.push((false, &s[start..]));
        }
        Ok(Runs(runs))
    }

    pub fn clean(&self) -> String {
        self.0.iter().map(|(_, t)| *t).collect()
    }

    /// The marked text of the clean byte range `r`.
    pub fn slice(&self, r: Range<usize>) -> String {
        let mut out = String::new();
        let mut at = 0;
        for &(marked, text) in &self.0 {
            let (a, b) = (r.start.max(at), r.end.min(at + text.len()));
            if a < b {
                push_run(&mut out, marked, &text[a - at..b - at]);
            }
            at += text.len();
        }
        out
    }
}

/// Appends marked text, joining a marked run at its start to one at the end of `out`.
fn append(out: &mut String, marked: &str) {
    match marked.strip_prefix(OPEN) {
        Some(rest) if out.ends_with(CLOSE) => {
            out.pop();
            out.push_str(rest);
        }
        _ => out.push_str(marked),
    }
}

fn push_run(out: &mut String, marked: bool, text: &str) {
    if text.is_empty() {
        return;
    }
    if marked {
        // Merge with a marked run just before, so equal inputs give equal strings.
        if out.ends_with(CLOSE) {
            out.pop();
        } else {
            out.push(OPEN);
        }
        out.push_str(text);
        out.push(CLOSE);
    } else {
        out.push_str(text);
    }
}

/// llama.cpp's jinja `strip` (C `isspace` without `chars`), on the clean text.
pub(crate) fn strip(s: &str, chars: Option<&str>, left: bool, right: bool) -> Result<String, Mangled> {
    let runs = Runs::parse(s)?;
    let text = runs.clean();
    let strip_it = |c: char| match chars {
        Some(set) => set.contains(c),
        None => matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'),
    };
    let mut r = 0..text.len();
    if left {
        r.start = text.len() - text.trim_start_matches(strip_it).len();
    }
    if right {
        r.end = text.trim_end_matches(strip_it).len().max(r.start);
    }
    Ok(runs.slice(r))
}

/// Python's `str.split(sep, maxsplit)`: `sep = None` splits on whitespace runs and drops
/// empty pieces.
pub(crate) fn split(s: &str, sep: Option<&str>, maxsplit: Option<i64>) -> Result<Vec<String>, Mangled> {
    let runs = Runs::parse(s)?;
    let text = runs.clean();
    let mut left = maxsplit.filter(|&m| m >= 0).map(|m| m as usize);
    let mut pieces: Vec<Range<usize>> = Vec::new();
    match sep {
        Some(sep) => {
            let mut start = 0;
            while left != Some(0) {
                let Some(p) = text[start..].find(sep) else { break };
                pieces.push(start..start + p);
                start += p + sep.len();
                left = left.map(|n| n - 1);
            }
            pieces.push(start..text.len());
        }
        None => {
            let ws = |c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c);
            let mut i = text.len() - text.trim_start_matches(ws).len();
            while i < text.len() {
                if left == Some(0) {
                    // The remainder keeps its trailing whitespace, as in Python.
                    pieces.push(i..text.len());
                    break;
                }
                let end = text[i..].find(ws).map_or(text.len(), |p| i + p);
                pieces.push(i..end);
                i = end + text[end..].len() - text[end..].trim_start_matches(ws).len();
                left = left.map(|n| n - 1);
            }
        }
    }
    Ok(pieces.into_iter().map(|r| runs.slice(r)).collect())
}

/// `str.replace(old, new, count)` on the clean text. A replacement inside one run takes that
/// run's marking; one that spans runs is marked if any part of the original was.
pub(crate) fn replace(s: &str, old: &str, new: &str, count: Option<i64>) -> Result<String, Mangled> {
    let runs = Runs::parse(s)?;
    let text = runs.clean();
    let marked_at = |r: Range<usize>| {
        let mut at = 0;
        runs.0.iter().any(|&(m, t)| {
            let hit = m && r.start < at + t.len() && at < r.end.max(r.start + 1);
            at += t.len();
            hit
        })
    };
    let mut out = String::new();
    let (mut start, mut left) = (0, count.filter(|&c| c >= 0));
    while left != Some(0) {
        let p = if old.is_empty() {
            // Python inserts `new` between characters and at both ends.
            if start > text.len() {
                break;
            }
            start
        } else {
            match text[start..].find(old) {
                Some(p) => start + p,
                None => break,
            }
        };
        append(&mut out, &runs.slice(start..p));
        push_run(&mut out, marked_at(p..p + old.len()), new);
        if old.is_empty() {
            let step = text[p..].chars().next().map_or(1, char::len_utf8);
            append(&mut out, &runs.slice(p..(p + step).min(text.len())));
            start = p + step;
        } else {
            start = p + old.len();
        }
        left = left.map(|n| n - 1);
    }
    if start <= text.len() {
        append(&mut out, &runs.slice(start..text.len()));
    }
    Ok(out)
}

/// Applies a text transformation run by run when it maps characters one to one (case
/// changes), else to the whole text, marked if any of it was.
pub(crate) fn remap(s: &str, f: impl Fn(&str) -> String) -> Result<String, Mangled> {
    let runs = Runs::parse(s)?;
    let text = runs.clean();
    let mapped = f(&text);
    if mapped.chars().count() != text.chars().count() {
        let mut out = String::new();
        push_run(&mut out, runs.0.iter().any(|&(m, _)| m), &mapped);
        return Ok(out);
    }
    let mut out = String::new();
    let mut chars = mapped.chars();
    for &(marked, t) in &runs.0 {
        let piece: String = chars.by_ref().take(t.chars().count()).collect();
        push_run(&mut out, marked, &piece);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> String {
        s.replace('[', &OPEN.to_string()).replace(']', &CLOSE.to_string())
    }

    #[test]
    fn strip_keeps_runs_marked() {
        assert_eq!(strip(&m("[  hi  ]"), None, true, true).unwrap(), m("[hi]"));
        assert_eq!(strip(&m("\n[ \n]"), None, true, true).unwrap(), "");
        assert_eq!(strip(&m("<x>[\n\nhi]"), Some("\n"), false, true).unwrap(), m("<x>[\n\nhi]"));
        assert_eq!(strip(&m("[\n\nhi\n]\n"), Some("\n"), true, false).unwrap(), m("[hi\n]\n"));
    }

    #[test]
    fn split_rebalances_pieces() {
        let s = m("<a>[why</think>ans]");
        assert_eq!(split(&s, Some("</think>"), None).unwrap(), vec![m("<a>[why]"), m("[ans]")]);
        assert_eq!(split(&m("[a  b] c"), None, None).unwrap(), vec![m("[a]"), m("[b]"), "c".to_string()]);
        assert_eq!(split(&m("[a,b,c]"), Some(","), Some(1)).unwrap(), vec![m("[a]"), m("[b,c]")]);
        assert_eq!(split("a,,b", Some(","), None).unwrap(), vec!["a", "", "b"]);
        assert_eq!(split("  a b  ", None, Some(1)).unwrap(), vec!["a", "b  "]);
    }

    #[test]
    fn replace_and_remap() {
        assert_eq!(replace(&m("x[a-b]"), "-", "+", None).unwrap(), m("x[a+b]"));
        assert_eq!(replace(&m("x[ab]"), "xa", "Y", None).unwrap(), m("[Yb]"));
        assert_eq!(replace("ab", "", "-", None).unwrap(), "-a-b-");
        assert_eq!(remap(&m("a[bc]"), |t| t.to_uppercase()).unwrap(), m("A[BC]"));
        assert_eq!(remap(&m("[ß]"), |t| t.to_uppercase()).unwrap(), m("[SS]"));
    }

    #[test]
    fn parse_rejects_mangled_markers() {
        assert!(Runs::parse(&m("[a")).is_err());
        assert!(Runs::parse(&m("a]")).is_err());
        assert!(Runs::parse(&m("[[a]]")).is_err());
        assert_eq!(Runs::parse(&m("a[b]c")).unwrap().0, vec![(false, "a"), (true, "b"), (false, "c")]);
        assert_eq!(wrap(&m("x[y")), m("[xy]"));
    }
}
