//! A reply's tokens as text, as they stream: every front end (the server's routes, `xwen run`,
//! `xwen chat`, xwen-embed and the bindings over it) turns sampled tokens into text deltas
//! here, and nowhere else. Two things make this more than concatenating token texts:
//! - a character's bytes may be split across tokens (byte-level BPE, byte-fallback tokens), so
//!   bytes are held until they form complete UTF-8, and bytes that never can are U+FFFD at once;
//! - a stop string may arrive across tokens, so text that may still become one is held back
//!   (`StopFilter`): a delta never shows what the final text does not contain.

use crate::stop::StopFilter;
use crate::Tokenizer;

/// Tokens in, text deltas out, cut before the first stop string.
#[derive(Clone, Debug, Default)]
pub struct TextStream {
    /// Bytes of an incomplete character at the end of what came so far.
    pending: Vec<u8>,
    stops: StopFilter,
}

impl TextStream {
    /// A stream that ends before the first of `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        TextStream { pending: Vec::new(), stops: StopFilter::new(stops) }
    }

    /// Adds token `id`'s text; returns the text now certain to be the reply's (possibly empty:
    /// the token ended inside a character or inside what may become a stop string). Nothing
    /// once a stop string matched.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.push_bytes(tok.token_bytes(id))
    }

    /// `push` for a token's bytes.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        if self.stops.hit().is_some() {
            return String::new();
        }
        self.pending.extend_from_slice(bytes);
        let text = complete_utf8(&mut self.pending);
        self.stops.push(&text)
    }

    /// The stop string that ended the text, once one did.
    pub fn stop(&self) -> Option<&str> {
        self.stops.hit()
    }

    /// The reply ended: what was held back (an incomplete last character as U+FFFD, text that
    /// did not become a stop string). Empty after a stop string; check `stop` after it, since
    /// the replacement character may complete one.
    pub fn finish(&mut self) -> String {
        if self.stops.hit().is_some() {
            return String::new();
        }
        let tail = String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned();
        let kept = self.stops.push(&tail);
        kept + &self.stops.finish()
    }
}

/// Takes the complete UTF-8 at the front of `bytes`, leaving an incomplete character at the
/// end; a byte sequence that can never become valid UTF-8 becomes U+FFFD at once.
fn complete_utf8(bytes: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut rest: &[u8] = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                rest = &[];
                break;
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                // from_utf8 has just validated this prefix
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                match e.error_len() {
                    // an incomplete character at the end: wait for the next token
                    None => {
                        rest = after;
                        break;
                    }
                    Some(bad) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        rest = &after[bad..];
                    }
                }
            }
        }
    }
    *bytes = rest.to_vec();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deltas of `tokens` and the final tail, joined by `|`, and the stop that matched.
    fn run(stops: &[&str], tokens: &[&[u8]]) -> (String, Option<String>) {
        let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut deltas: Vec<String> = tokens.iter().map(|t| s.push_bytes(t)).collect();
        deltas.push(s.finish());
        (deltas.join("|"), s.stop().map(str::to_string))
    }

    #[test]
    fn text_without_stops_passes_token_by_token() {
        assert_eq!(run(&[], &[b"ab", b"c"]), ("ab|c|".into(), None));
    }

    #[test]
    fn a_stop_string_across_token_boundaries_is_held_back_then_cut() {
        assert_eq!(run(&["STOP"], &[b"abc ST", b"O", b"P and more", b"ignored"]), ("abc ||||".into(), Some("STOP".into())));
    }

    #[test]
    fn held_text_that_does_not_become_a_stop_string_comes_out() {
        assert_eq!(run(&["STOP"], &[b"ST", b"Ox", b"y"]), ("|STOx|y|".into(), None));
        // held at the end of the reply: it is the reply's
        assert_eq!(run(&["STOP"], &[b"a", b"STO"]), ("a||STO".into(), None));
    }

    #[test]
    fn a_stop_string_at_the_very_start_leaves_no_text() {
        assert_eq!(run(&["\n"], &[b"\nhello"]), ("|".into(), Some("\n".into())));
        assert_eq!(run(&["<end>"], &[b"<", b"end>"]), ("||".into(), Some("<end>".into())));
    }

    #[test]
    fn the_stop_string_that_starts_first_wins_and_is_reported() {
        assert_eq!(run(&["STOP", "\n\n"], &[b"y\n", b"\nzSTOP"]), ("y||".into(), Some("\n\n".into())));
        // "abcd" starts before "bc" inside it, though "bc" is complete first
        assert_eq!(run(&["bc", "abcd"], &[b"xab", b"cd"]), ("x||".into(), Some("abcd".into())));
    }

    #[test]
    fn a_character_split_across_tokens_comes_out_whole() {
        // "é€" as bytes C3 A9 E2 82 AC, cut inside both characters
        assert_eq!(run(&[], &[&[0xC3], &[0xA9, 0xE2], &[0x82], &[0xAC, b'!']]), ("|é||€!|".into(), None));
    }

    #[test]
    fn a_stop_string_is_never_cut_inside_a_character() {
        // the held tail "é" is a partial "é!", and is let go whole at the end
        assert_eq!(run(&["é!"], &["aé".as_bytes()]), ("a|é".into(), None));
        // a stop string whose first character arrives in two tokens
        assert_eq!(run(&["é!"], &[b"a", &[0xC3], &[0xA9, b'!', b'b']]), ("a|||".into(), Some("é!".into())));
        // "€" shares its lead byte with the stop string's "₀": the text holds whole characters
        assert_eq!(run(&["₀x"], &["a€".as_bytes(), "₀".as_bytes(), b"y"]), ("a€||₀y|".into(), None));
    }

    #[test]
    fn invalid_bytes_from_byte_fallback_tokens_become_replacement_characters() {
        // a byte that never starts UTF-8, at once
        assert_eq!(run(&[], &[&[0xFF], b"a"]), ("\u{FFFD}|a|".into(), None));
        // a lead byte whose next token is not its continuation
        assert_eq!(run(&[], &[&[0xE2], b"A"]), ("|\u{FFFD}A|".into(), None));
        // a character still incomplete when the reply ends
        assert_eq!(run(&[], &[b"a", &[0xE2, 0x82]]), ("a||\u{FFFD}".into(), None));
        // a replacement character may complete a stop string at the end
        assert_eq!(run(&["x\u{FFFD}"], &[b"ax", &[0xE2]]), ("a||".into(), Some("x\u{FFFD}".into())));
    }

    #[test]
    fn nothing_comes_after_a_stop() {
        let mut s = TextStream::new(vec!["!".into()]);
        assert_eq!(s.push_bytes(b"hi!"), "hi");
        assert_eq!(s.push_bytes(b"more"), "");
        assert_eq!(s.finish(), "");
        assert_eq!(s.stop(), Some("!"));
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        assert_eq!(run(&[""], &[b"ab"]), ("ab|".into(), None));
    }
}
