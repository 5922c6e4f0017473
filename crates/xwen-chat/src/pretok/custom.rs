//! llama.cpp's hand-written equivalents of the most common split regexes (src/unicode.cpp
//! `unicode_regex_split_custom_*`), ported branch for branch. They are what llama.cpp actually
//! runs for GPT-2, Llama-3, Qwen2, Qwen3.5 and Kimi K2 vocabularies, so matching them (rather than the
//! regex they stand for) is what keeps our ids identical to llama.cpp's on odd input.
//!
//! Every function maps piece lengths (in code points) to finer piece lengths.

use crate::unicode::{is_han, Flags};

/// One piece of the input being split: llama.cpp's `_get_cpt` / `_get_flags` / `_add_token`
/// lambdas. Positions outside the piece read as "no code point" and `Flags::NONE`.
struct Piece<'a> {
    cpts: &'a [char],
    flags: &'a [Flags],
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Piece<'_> {
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.ini <= pos && pos < self.end).then(|| self.cpts[pos])
    }
    fn fl(&self, pos: usize) -> Flags {
        if self.ini <= pos && pos < self.end {
            self.flags[pos]
        } else {
            Flags::NONE
        }
    }
    fn is_cr_or_lf(&self, pos: usize) -> bool {
        matches!(self.cpt(pos), Some('\r' | '\n'))
    }
    fn is_han(&self, pos: usize) -> bool {
        self.cpt(pos).is_some_and(is_han)
    }
    /// Kimi K2's word letters: `[\p{L}&&[^\p{Han}]]`, by llama.cpp's letter class.
    fn is_non_han_letter(&self, pos: usize) -> bool {
        self.fl(pos).is_letter() && !self.is_han(pos)
    }
    /// Emits the piece from the previous cut to `end`; returns its length.
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d`, optionally case-insensitive. Returns the match length.
    fn contraction(&self, pos: usize, ignore_case: bool) -> usize {
        if self.cpt(pos) != Some('\'') || pos + 1 >= self.end {
            return 0;
        }
        // llama.cpp lowercases with its Unicode table; the only code points that lowercase to
        // s, t, m, d, r, v, e or l there are their ASCII capitals.
        let lower = |c: Option<char>| c.map(|c| if ignore_case { c.to_ascii_lowercase() } else { c });
        let next = lower(self.cpt(pos + 1));
        if matches!(next, Some('s' | 't' | 'm' | 'd')) {
            return 2;
        }
        if pos + 2 < self.end {
            let next2 = lower(self.cpt(pos + 2));
            if matches!((next, next2), (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))) {
                return 3;
            }
        }
        0
    }

    /// `\p{N}{1,3}` repeated over the digit run at `pos`: cuts after every third digit and at
    /// the run's end. Returns the position after the run.
    fn digits_by_three(&mut self, mut pos: usize) -> usize {
        let mut ini = pos;
        while self.fl(pos).is_number() {
            pos += 1;
            if pos - ini >= 3 {
                self.add(pos);
                ini = pos;
            }
        }
        self.add(pos);
        pos
    }

    /// Counts the whitespace run at `pos`; also returns the end of its last CR/LF, if any.
    fn whitespace_run(&self, pos: usize) -> (usize, Option<usize>) {
        let (mut n, mut last_cr_lf) = (0, None);
        while self.fl(pos + n).is_whitespace() {
            if self.is_cr_or_lf(pos + n) {
                last_cr_lf = Some(pos + n + 1);
            }
            n += 1;
        }
        (n, last_cr_lf)
    }

    /// `\s+(?!\S)|\s+` at `pos` (shared tail of every pattern). Returns the new position.
    /// The splitters' last patterns, in order: `\s*[\r\n]+`, then `\s+(?!\S)` and `\s+`
    /// (`trailing_whitespace`), from `pos`; returns where the next piece starts.
    fn whitespace_tail(&mut self, pos: usize) -> usize {
        let (n, last_cr_lf) = self.whitespace_run(pos);
        if let Some(end) = last_cr_lf {
            self.add(end);
            return end;
        }
        self.trailing_whitespace(pos, n)
    }

    fn trailing_whitespace(&mut self, pos: usize, n: usize) -> usize {
        if n > 1 && self.cpt(pos + n).is_some() {
            self.add(pos + n - 1);
            return pos + n - 1;
        }
        if n > 0 {
            self.add(pos + n);
            return pos + n;
        }
        // No branch matched: the code point becomes a piece of its own.
        self.add(pos + 1);
        pos + 1
    }
}

fn for_each_piece(cpts: &[char], flags: &[Flags], offsets: &[usize], mut f: impl FnMut(&mut Piece)) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let mut piece = Piece { cpts, flags, ini: start, end: start + len, prev_end: start, out: &mut out };
        f(&mut piece);
        start += len;
    }
    out
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
pub(crate) fn gpt2(cpts: &[char], flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    for_each_piece(cpts, flags, offsets, |p| {
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let n = p.contraction(pos, false);
            if n > 0 {
                pos += p.add(pos + n);
                continue;
            }
            let space = cpt == Some(' ');
            let mut f2 = if space { p.fl(pos + 1) } else { p.fl(pos) };
            let classes: [fn(Flags) -> bool; 3] = [
                Flags::is_letter,
                Flags::is_number,
                |f| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any(),
            ];
            if let Some(class) = classes.into_iter().find(|class| class(f2)) {
                pos += space as usize;
                while class(f2) {
                    pos += 1;
                    f2 = p.fl(pos);
                }
                p.add(pos);
                continue;
            }
            let (n, _) = p.whitespace_run(pos);
            pos = p.trailing_whitespace(pos, n);
        }
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    /// `\p{N}{1,3}`, letters `\p{L}+`.
    Llama3,
    /// `\p{N}`, letters `\p{L}+`.
    Qwen2,
    /// `\p{N}`, letters `[\p{L}\p{M}]+`.
    Qwen35,
}

/// The Llama-3 / Qwen2 / Qwen3.5 pattern:
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
/// with the per-family differences noted on [`Family`].
pub(crate) fn llama3_like(family: Family, cpts: &[char], flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    let marks = family == Family::Qwen35;
    let wordish = move |f: Flags| f.is_letter() || (marks && f.is_accent_mark());
    for_each_piece(cpts, flags, offsets, |p| {
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let fl = p.fl(pos);
            let n = p.contraction(pos, true);
            if n > 0 {
                pos += p.add(pos + n);
                continue;
            }

            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(p.is_cr_or_lf(pos) || fl.is_number()) && (wordish(fl) || wordish(p.fl(pos + 1))) {
                pos += 1;
                while wordish(p.fl(pos)) {
                    pos += 1;
                }
                p.add(pos);
                continue;
            }

            if fl.is_number() {
                if family == Family::Llama3 {
                    pos = p.digits_by_three(pos);
                } else {
                    pos += 1;
                    p.add(pos);
                }
                continue;
            }

            // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (llama.cpp tests the first code point's own
            // flags, not the one after the space, for "is a code point at all").
            let space = cpt == Some(' ');
            let mut f2 = if space { p.fl(pos + 1) } else { fl };
            let other = move |f: Flags| !(f.is_whitespace() || wordish(f) || f.is_number());
            if other(f2) && fl.any() {
                pos += space as usize;
                while other(f2) && f2.any() {
                    pos += 1;
                    f2 = p.fl(pos);
                }
                while p.is_cr_or_lf(pos) {
                    pos += 1;
                }
                p.add(pos);
                continue;
            }

            pos = p.whitespace_tail(pos);
        }
    })
}

/// Kimi K2's pattern (tokenization_kimi.py), which llama.cpp selects by the trigger regex
/// `\p{Han}+` and runs as `unicode_regex_split_custom_kimi_k2`:
/// `[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
///
/// Where llama.cpp's code departs from that regex we follow the code, since its ids are the
/// reference: the two word branches become one (no upper/lower case split, and `\p{M}` marks
/// are not word characters but punctuation-like), and "Han" is llama.cpp's block list.
pub(crate) fn kimi_k2(cpts: &[char], flags: &[Flags], offsets: &[usize]) -> Vec<usize> {
    for_each_piece(cpts, flags, offsets, |p| {
        let mut pos = p.ini;
        while pos < p.end {
            let cpt = p.cpt(pos);
            let fl = p.fl(pos);

            // [\p{Han}]+ comes first, so Han never joins a word (Han code points are letters).
            if p.is_han(pos) {
                while p.is_han(pos) {
                    pos += 1;
                }
                p.add(pos);
                continue;
            }

            if let Some(end) = kimi_word_end(p, pos) {
                pos = end;
                p.add(pos);
                continue;
            }

            if fl.is_number() {
                pos = p.digits_by_three(pos);
                continue;
            }

            // <space>?[^\s\p{L}\p{N}]+[\r\n]*  (unlike the Llama-3 port, llama.cpp tests "is a
            // code point at all" on the code point after the space here).
            let space = cpt == Some(' ');
            let other = |f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any();
            if other(if space { p.fl(pos + 1) } else { fl }) {
                pos += space as usize;
                while other(p.fl(pos)) {
                    pos += 1;
                }
                while p.is_cr_or_lf(pos) {
                    pos += 1;
                }
                p.add(pos);
                continue;
            }

            pos = p.whitespace_tail(pos);
        }
    })
}

/// K2's word, as llama.cpp matches it: `[^\r\n\p{L}\p{N}]?`, non-Han letters, then an optional
/// case-insensitive contraction. `None` when no word starts at `pos`.
///
/// llama.cpp only enters its word branch when a non-Han letter is at `pos` or right after the
/// leading code point, so its "leading code point but no letters: backtrack" branch can never
/// run and has no counterpart here.
fn kimi_word_end(p: &Piece, pos: usize) -> Option<usize> {
    let fl = p.fl(pos);
    let can_lead = !(p.is_cr_or_lf(pos) || fl.is_letter() || fl.is_number());
    let mut end = if p.is_non_han_letter(pos) {
        pos
    } else if can_lead && p.is_non_han_letter(pos + 1) {
        pos + 1
    } else {
        return None;
    };
    while p.is_non_han_letter(end) {
        end += 1;
    }
    Some(end + p.contraction(end, true))
}

/// `[^\n]+|[\n]+`: runs of newlines and runs of everything else.
pub(crate) fn newlines(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let end = start + len;
        let mut pos = start;
        while pos < end {
            let nl = cpts[pos] == '\n';
            let run = pos;
            while pos < end && (cpts[pos] == '\n') == nl {
                pos += 1;
            }
            out.push(pos - run);
        }
        start = end;
    }
    out
}
