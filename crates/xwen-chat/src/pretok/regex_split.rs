//! llama.cpp's general regex path (src/unicode.cpp `unicode_regex_split` fallback): patterns
//! that use `\p{..}` classes run over a "collapsed" text where each non-ASCII code point is
//! replaced by one stand-in character for its class, with `\p{..}` rewritten to match that
//! stand-in; patterns without `\p{..}` run over the code points with non-ASCII whitespace
//! replaced by U+000B. Both are reproduced here so that classification follows llama.cpp's
//! table, not the regex engine's Unicode version.

use fancy_regex::Regex;

use crate::unicode::Flags;
use crate::ChatError;

/// Unicode classes llama.cpp knows how to collapse: `(class, stand-in, its ASCII members)`.
const CLASSES: [(&str, char, &str); 10] = [
    ("\\p{N}", '\u{D1}', "0-9"),
    ("\\p{L}", '\u{D2}', "A-Za-z"),
    ("\\p{P}", '\u{D3}', "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"),
    ("\\p{M}", '\u{D4}', ""),
    ("\\p{S}", '\u{D5}', "\\$\\+<->^`\\|\\~"),
    ("\\p{Lu}", '\u{D2}', "A-Za-z"),
    ("\\p{Ll}", '\u{D2}', "A-Za-z"),
    ("\\p{Lt}", '\u{D2}', "A-Za-z"),
    ("\\p{Lm}", '\u{D2}', "A-Za-z"),
    ("\\p{Lo}", '\u{D2}', "A-Za-z"),
];

pub(crate) fn uses_classes(pattern: &str) -> bool {
    CLASSES.iter().any(|(class, _, _)| pattern.contains(class))
}

/// A pattern ready to run, with which text representation it expects.
pub(crate) struct RegexStep {
    re: Regex,
    pub collapsed: bool,
}

impl RegexStep {
    pub fn new(pattern: &str) -> Result<Self, ChatError> {
        let collapsed = uses_classes(pattern);
        let source = if collapsed { collapse_pattern(pattern)? } else { pattern.to_string() };
        let re = Regex::new(&source).map_err(|e| ChatError::Regex(format!("{pattern}: {e}")))?;
        Ok(RegexStep { re, collapsed })
    }

    /// Splits every piece of `hay` (one char per code point) at the pattern's matches; text
    /// between matches becomes a piece too.
    pub fn split(&self, hay: &[char], offsets: &[usize]) -> Vec<usize> {
        let mut out = Vec::with_capacity(offsets.len());
        let mut start = 0;
        let mut s = String::new();
        let mut char_at = Vec::new();
        for &len in offsets {
            s.clear();
            char_at.clear();
            // char_at maps a byte offset of `s` to its code point index within the piece.
            for (i, &c) in hay[start..start + len].iter().enumerate() {
                char_at.extend(std::iter::repeat_n(i, c.len_utf8()));
                s.push(c);
            }
            char_at.push(len);
            let mut done = 0;
            for m in self.re.find_iter(&s) {
                // A regex that gives up (backtrack limit) leaves the rest of the piece whole.
                let Ok(m) = m else { break };
                let (a, b) = (char_at[m.start()], char_at[m.end()]);
                if a > done {
                    out.push(a - done);
                }
                out.push(b - a);
                done = b;
            }
            if done < len {
                out.push(len - done);
            }
            start += len;
        }
        out
    }
}

/// The collapsed text: ASCII kept, anything else replaced by its class stand-in.
pub(crate) fn collapse_text(cpts: &[char], flags: &[Flags]) -> Vec<char> {
    cpts.iter().zip(flags).map(|(&c, f)| if (c as u32) < 128 { c } else { f.collapsed() }).collect()
}

/// The text for patterns without classes: non-ASCII whitespace becomes U+000B, which
/// std::wregex's `\s` recognizes.
pub(crate) fn wide_text(cpts: &[char], flags: &[Flags]) -> Vec<char> {
    cpts.iter().zip(flags).map(|(&c, f)| if (c as u32) > 0x7F && f.is_whitespace() { '\u{0B}' } else { c }).collect()
}

/// Rewrites each `\p{..}` into a bracket expression over its stand-in and ASCII members (or
/// splices those into an enclosing bracket expression), exactly as llama.cpp does.
fn collapse_pattern(pattern: &str) -> Result<String, ChatError> {
    if !pattern.is_ascii() {
        return Err(ChatError::Regex(format!("{pattern}: unicode classes mixed with non-ASCII text")));
    }
    let r = pattern.as_bytes();
    let mut out = String::new();
    let mut inside = false;
    let mut i = 0;
    while i < r.len() {
        if r[i] == b'[' && (i == 0 || r[i - 1] != b'\\') {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && r[i] == b']' && r[i - 1] != b'\\' {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if r[i] == b'\\' && i + 3 < r.len() && r[i + 1] == b'p' && r[i + 2] == b'{' {
            if let Some(close) = pattern[i + 3..].find('}').map(|k| k + i + 3) {
                if close <= i + 10 {
                    let name = &pattern[i..=close];
                    if let Some((_, stand_in, members)) = CLASSES.iter().find(|(c, _, _)| *c == name) {
                        if !inside {
                            out.push('[');
                        }
                        out.push(*stand_in);
                        out.push_str(members);
                        if !inside {
                            out.push(']');
                        }
                        i = close + 1;
                        continue;
                    }
                }
            }
        }
        out.push(r[i] as char);
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapses_like_llama_cpp() {
        assert_eq!(collapse_pattern("\\p{N}+").unwrap(), "[\u{D1}0-9]+");
        assert_eq!(collapse_pattern("[^\\s\\p{L}]").unwrap(), "[^\\s\u{D2}A-Za-z]");
        assert_eq!(collapse_pattern("\\p{M}").unwrap(), "[\u{D4}]");
    }

    #[test]
    fn every_ported_pattern_compiles() {
        for pre in crate::pretok::patterns::ALL {
            for p in crate::pretok::patterns::regexes(*pre) {
                RegexStep::new(p).unwrap_or_else(|e| panic!("{pre:?}: {e}"));
            }
        }
    }
}
