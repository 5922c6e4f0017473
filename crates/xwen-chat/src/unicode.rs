//! Code point classes and the GPT-2 byte↔unicode mapping, both exactly as llama.cpp
//! (src/unicode.cpp) has them: the pre-tokenizers branch on these classes, so any drift from
//! llama.cpp's table would change token ids.

use crate::unicode_data::{RANGE_FLAGS, WHITESPACE};

/// llama.cpp's `unicode_cpt_flags`: one category bit plus the whitespace helper bit.
/// `Flags::NONE` (all zero) stands for "outside the current chunk", as llama.cpp's
/// `_get_flags` returns for out-of-range positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flags(u16);

impl Flags {
    pub const NONE: Flags = Flags(0);
    const UNDEFINED: u16 = 0x0001;
    const NUMBER: u16 = 0x0002;
    const LETTER: u16 = 0x0004;
    const ACCENT_MARK: u16 = 0x0010;
    const PUNCTUATION: u16 = 0x0020;
    const SYMBOL: u16 = 0x0040;
    const CATEGORIES: u16 = 0x00FF;
    const WHITESPACE: u16 = 0x0100;

    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_accent_mark(self) -> bool {
        self.0 & Self::ACCENT_MARK != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// Non-zero for every real code point (each has a category), zero for `NONE`.
    pub fn any(self) -> bool {
        self.0 != 0
    }

    /// The single byte llama.cpp substitutes for a non-ASCII code point before running a
    /// std::regex over "collapsed" text (see `unicode_regex_split`).
    pub fn collapsed(self) -> char {
        if self.is_whitespace() {
            return '\u{0B}';
        }
        match self.0 & Self::CATEGORIES {
            Self::NUMBER => '\u{D1}',
            Self::LETTER => '\u{D2}',
            Self::PUNCTUATION => '\u{D3}',
            Self::ACCENT_MARK => '\u{D4}',
            Self::SYMBOL => '\u{D5}',
            _ => '\u{D0}',
        }
    }
}

static ASCII_FLAGS: [Flags; 128] = {
    let mut t = [Flags(0); 128];
    let mut c = 0;
    while c < 128 {
        t[c] = Flags(range_flags(c as u32) | ascii_space(c as u8));
        c += 1;
    }
    t
};

const fn ascii_space(c: u8) -> u16 {
    if matches!(c, 0x09..=0x0D | 0x20) {
        Flags::WHITESPACE
    } else {
        0
    }
}

const fn range_flags(cpt: u32) -> u16 {
    // Binary search for the last range starting at or before `cpt`.
    let (mut lo, mut hi) = (0usize, RANGE_FLAGS.len());
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if RANGE_FLAGS[mid].0 <= cpt {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    RANGE_FLAGS[lo].1
}

pub(crate) fn flags(c: char) -> Flags {
    let cpt = c as u32;
    if cpt < 128 {
        return ASCII_FLAGS[cpt as usize];
    }
    if cpt >= 0x110000 {
        return Flags(Flags::UNDEFINED);
    }
    let ws = if WHITESPACE.binary_search(&cpt).is_ok() { Flags::WHITESPACE } else { 0 };
    Flags(range_flags(cpt) | ws)
}

/// llama.cpp's `unicode_cpt_is_han`: the CJK ideograph blocks, by fixed code point ranges.
/// Kimi K2's pre-tokenizer keeps Han runs apart from other letters. This is llama.cpp's
/// block list, not Unicode's Han script: U+3005 (々) and U+3007 (〇) are Han in Unicode but
/// not here, and matching llama.cpp's list is what keeps the splits identical to its own.
pub(crate) fn is_han(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF         // CJK Unified Ideographs
        | 0x3400..=0x4DBF       // Extension A
        | 0x20000..=0x2A6DF     // Extension B
        | 0x2A700..=0x2B73F     // Extension C
        | 0x2B740..=0x2B81F     // Extension D
        | 0x2B820..=0x2CEAF     // Extension E
        | 0x2CEB0..=0x2EBEF     // Extension F
        | 0xF900..=0xFAFF       // CJK Compatibility Ideographs
        | 0x2F800..=0x2FA1F     // CJK Compatibility Ideographs Supplement
    )
}

const fn printable(b: u32) -> bool {
    (0x21 <= b && b <= 0x7E) || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF)
}

/// GPT-2's byte→code point table: printable Latin-1 bytes map to themselves, the other 68
/// bytes to U+0100.. in byte order.
static BYTE_TO_CPT: [u32; 256] = {
    let mut t = [0u32; 256];
    let (mut b, mut next) = (0u32, 256u32);
    while b < 256 {
        t[b as usize] = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        b += 1;
    }
    t
};

/// The 68 non-printable bytes, indexed by `code point - 0x100`.
static SHIFTED_TO_BYTE: [u8; 68] = {
    let mut t = [0u8; 68];
    let mut b = 0;
    while b < 256 {
        if !printable(b as u32) {
            t[(BYTE_TO_CPT[b] - 256) as usize] = b as u8;
        }
        b += 1;
    }
    t
};

/// GPT-2's bytes_to_unicode: the character a byte is spelled with in byte-level BPE token text.
pub fn byte_to_char(b: u8) -> char {
    // Every table entry is below U+0144, a valid scalar value.
    char::from_u32(BYTE_TO_CPT[b as usize]).unwrap_or('\0')
}

/// Inverse of [`byte_to_char`], for decoding token text back to bytes.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cpt = c as u32;
    if printable(cpt) {
        Some(cpt as u8)
    } else if (0x100..0x144).contains(&cpt) {
        Some(SHIFTED_TO_BYTE[(cpt - 0x100) as usize])
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(char_to_byte('Ā'), Some(0));
        assert_eq!(char_to_byte('中'), None);
    }

    #[test]
    fn classes_match_llama_cpp() {
        assert!(flags('a').is_letter() && flags('é').is_letter() && flags('中').is_letter());
        assert!(flags('7').is_number() && flags('٣').is_number());
        assert!(flags('\u{0301}').is_accent_mark());
        assert!(flags(' ').is_whitespace() && flags('\u{3000}').is_whitespace() && flags('\u{85}').is_whitespace());
        assert!(!flags('\u{1C}').is_whitespace());
        assert_eq!(flags('!').collapsed(), '\u{D3}');
        assert_eq!(flags('€').collapsed(), '\u{D5}');
        assert_eq!(flags('\u{2003}').collapsed(), '\u{0B}');
        assert!(flags('x').any() && !Flags::NONE.any());
    }

    #[test]
    fn han_uses_llama_cpp_blocks() {
        for c in ['中', '\u{4E00}', '\u{9FFF}', '\u{3400}', '\u{20000}', '\u{2EBEF}', '\u{F900}', '\u{2FA1F}'] {
            assert!(is_han(c), "{c:?}");
        }
        // Kana, Hangul, CJK punctuation, and the Han-script marks outside llama.cpp's blocks.
        for c in ['の', 'テ', '한', '，', '。', '\u{3005}', '\u{3007}', '\u{2EBF0}', 'a'] {
            assert!(!is_han(c), "{c:?}");
        }
    }
}
