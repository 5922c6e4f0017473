//! Pre-tokenization: cutting text into words before BPE, as llama.cpp's `unicode_regex_split`
//! does for the vocabulary's `tokenizer.ggml.pre`.

mod custom;
pub(crate) mod patterns;
mod regex_split;

use std::ops::Range;

use crate::unicode::{flags, Flags};
use crate::ChatError;
use custom::Family;
use regex_split::RegexStep;

/// llama.cpp recognizes its fast paths by the exact regex text; so do we.
const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3_A: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const LLAMA3_B: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const NEWLINES: &str = "[^\\n]+|[\\n]+";
/// Not a regex llama.cpp ever runs for Kimi K2: only the trigger for its hand-written splitter
/// of the whole K2 pattern.
const KIMI_K2: &str = "\\p{Han}+";

enum Step {
    Gpt2,
    Llama3(Family),
    Newlines,
    KimiK2,
    Regex(RegexStep),
}

pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
}

impl PreTokenizer {
    pub fn new(pre: patterns::Pre) -> Result<Self, ChatError> {
        let steps = patterns::regexes(pre)
            .iter()
            .map(|&p| {
                Ok(match p {
                    GPT2 => Step::Gpt2,
                    LLAMA3_A | LLAMA3_B => Step::Llama3(Family::Llama3),
                    QWEN2 => Step::Llama3(Family::Qwen2),
                    QWEN35 => Step::Llama3(Family::Qwen35),
                    NEWLINES => Step::Newlines,
                    KIMI_K2 => Step::KimiK2,
                    _ => Step::Regex(RegexStep::new(p)?),
                })
            })
            .collect::<Result<_, ChatError>>()?;
        Ok(PreTokenizer { steps })
    }

    /// The words of `text`, as byte ranges, in order; together they cover `text` exactly.
    pub fn split(&self, text: &str) -> Vec<Range<usize>> {
        let cpts: Vec<char> = text.chars().collect();
        let fl: Vec<Flags> = cpts.iter().map(|&c| flags(c)).collect();
        let (mut collapsed, mut wide) = (None, None);
        let mut offsets = vec![cpts.len()];
        for step in &self.steps {
            offsets = match step {
                Step::Gpt2 => custom::gpt2(&cpts, &fl, &offsets),
                Step::Llama3(family) => custom::llama3_like(*family, &cpts, &fl, &offsets),
                Step::Newlines => custom::newlines(&cpts, &offsets),
                Step::KimiK2 => custom::kimi_k2(&cpts, &fl, &offsets),
                Step::Regex(re) if re.collapsed => {
                    re.split(collapsed.get_or_insert_with(|| regex_split::collapse_text(&cpts, &fl)), &offsets)
                }
                Step::Regex(re) => re.split(wide.get_or_insert_with(|| regex_split::wide_text(&cpts, &fl)), &offsets),
            };
        }
        let mut words = Vec::with_capacity(offsets.len());
        let mut chars = text.char_indices().map(|(i, _)| i).chain(std::iter::once(text.len()));
        let mut start = chars.next().unwrap_or(0);
        for len in offsets {
            if len == 0 {
                continue;
            }
            let end = chars.nth(len - 1).unwrap_or(text.len());
            words.push(start..end);
            start = end;
        }
        words
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let choice = patterns::choose(Some(pre)).unwrap();
        let p = PreTokenizer::new(choice.pre).unwrap();
        p.split(text).into_iter().map(|r| text[r].to_string()).collect()
    }

    #[test]
    fn qwen35_splits_like_its_regex() {
        assert_eq!(words("qwen35", "Hello world"), ["Hello", " world"]);
        assert_eq!(words("qwen35", "I'LL  go\n\n  x 123"), ["I", "'LL", " ", " go", "\n\n", " ", " x", " ", "1", "2", "3"]);
        assert_eq!(words("qwen35", "a   "), ["a", "   "]);
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(words("llama-bpe", "1234567"), ["123", "456", "7"]);
    }

    fn kimi(text: &str) -> Vec<String> {
        words("kimi-k2", text)
    }

    #[test]
    fn kimi_k2_keeps_han_runs_apart() {
        assert_eq!(kimi("你好世界abc"), ["你好世界", "abc"]);
        assert_eq!(kimi("abc你好"), ["abc", "你好"]);
        // A space cannot lead a Han run: the Han branch has no optional leading code point.
        assert_eq!(kimi(" 你好"), [" ", "你好"]);
        assert_eq!(kimi("你好，世界。"), ["你好", "，", "世界", "。"]);
        // Extension B and compatibility ideographs are in llama.cpp's blocks; 々 (U+3005) is
        // not, so it is an ordinary letter.
        assert_eq!(kimi("\u{20000}\u{F900}x"), ["\u{20000}\u{F900}", "x"]);
        assert_eq!(kimi("時々"), ["時", "々"]);
    }

    #[test]
    fn kimi_k2_words_take_one_leading_code_point() {
        assert_eq!(kimi("Hello, world!"), ["Hello", ",", " world", "!"]);
        // Only one: after a space, punctuation goes with the space and the word stands alone.
        assert_eq!(kimi(".hello $foo (bar"), [".hello", " $", "foo", " (", "bar"]);
        assert_eq!(kimi("..hello"), ["..", "hello"]);
        assert_eq!(kimi("\tfoo"), ["\tfoo"]);
        // CR and LF never lead a word.
        assert_eq!(kimi("\nfoo"), ["\n", "foo"]);
        // Case does not split a word (both K2 word branches collapse into one in llama.cpp).
        assert_eq!(kimi("HelloWORLD camelCase"), ["HelloWORLD", " camelCase"]);
    }

    #[test]
    fn kimi_k2_contractions_stay_on_their_word() {
        assert_eq!(kimi("I'm"), ["I'm"]);
        assert_eq!(kimi("THEY'LL don't we'RE"), ["THEY'LL", " don't", " we'RE"]);
        assert_eq!(kimi("I'x"), ["I", "'x"]);
        // A contraction cut short by the end of the text is not one.
        assert_eq!(kimi("THEY'L"), ["THEY", "'L"]);
        assert_eq!(kimi("I'"), ["I", "'"]);
    }

    #[test]
    fn kimi_k2_groups_digits_by_three() {
        assert_eq!(kimi("12345"), ["123", "45"]);
        assert_eq!(kimi("1234567"), ["123", "456", "7"]);
        assert_eq!(kimi("abc123 456"), ["abc", "123", " ", "456"]);
        assert_eq!(kimi("\u{661}\u{662}\u{663}\u{664}"), ["\u{661}\u{662}\u{663}", "\u{664}"]);
    }

    #[test]
    fn kimi_k2_punctuation_takes_a_space_and_trailing_newlines() {
        assert_eq!(kimi("!!!\n\nx"), ["!!!\n\n", "x"]);
        assert_eq!(kimi("a ...\r\nfoo"), ["a", " ...\r\n", "foo"]);
        assert_eq!(kimi("😁😁 ok"), ["😁😁", " ok"]);
        // A combining mark is not a word character in llama.cpp's K2 code (the regex says
        // \p{M} is): it ends the word, then leads the next one or joins a punctuation run.
        assert_eq!(kimi("e\u{301}x"), ["e", "\u{301}x"]);
        assert_eq!(kimi("e\u{301}\u{301}!"), ["e", "\u{301}\u{301}!"]);
    }

    #[test]
    fn kimi_k2_whitespace() {
        // \s*[\r\n]+ takes the spaces before the newlines, \s+(?!\S) leaves the last space to
        // lead the next word.
        assert_eq!(kimi("a  \n\n  b"), ["a", "  \n\n", " ", " b"]);
        assert_eq!(kimi("hi   there"), ["hi", "  ", " there"]);
        // At the end of the text all of the trailing whitespace is one piece.
        assert_eq!(kimi("a   "), ["a", "   "]);
        assert_eq!(kimi("x \t\n"), ["x", " \t\n"]);
    }

    #[test]
    fn kimi_k2_mixed_scripts() {
        assert_eq!(kimi("日本語のテキスト"), ["日本語", "のテキスト"]);
        assert_eq!(kimi("Привет мир"), ["Привет", " мир"]);
        assert_eq!(kimi("한국어123中文"), ["한국어", "123", "中文"]);
        assert_eq!(kimi("我想在apple工作1314151天～"), ["我想在", "apple", "工作", "131", "415", "1", "天", "～"]);
    }

    #[test]
    fn regex_path_matches_fast_path() {
        // The qwen2 pattern through the general regex engine must agree with its fast path
        // (built directly, a RegexStep never takes the fast path).
        let step = RegexStep::new(QWEN2).unwrap();
        let text = "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～\n\n\t x  \u{3000}y";
        let cpts: Vec<char> = text.chars().collect();
        let fl: Vec<Flags> = cpts.iter().map(|&c| flags(c)).collect();
        let slow = step.split(&regex_split::collapse_text(&cpts, &fl), &[cpts.len()]);
        let fast = custom::llama3_like(Family::Qwen2, &cpts, &fl, &[cpts.len()]);
        assert_eq!(slow, fast);
    }
}
