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

enum Step {
    Gpt2,
    Llama3(Family),
    Newlines,
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
