//! `xwen tokenize -m MODEL.gguf (TEXT | --text-file FILE) [--markup]`: the token ids of a text,
//! space-separated on one line, built from the GGUF's tokenizer metadata alone (no weights
//! are read). No BOS/EOS is added.
//!
//! By default the text is tokenized as user content: special-token text such as
//! `<|im_start|>` stays plain text (llama.cpp `parse_special = false`, as its
//! test-tokenizer-0 runs). `--markup` parses special tokens (llama.cpp `parse_special = true`).
//! `--text-file` tokenizes the file's exact bytes; bytes that are not UTF-8 become U+FFFD,
//! one per byte, as llama.cpp decodes them.

use std::path::Path;

use anyhow::{bail, Context, Result};
use xwen_chat::Tokenizer;
use xwen_gguf::GgufFile;

use crate::args::Args;

const USAGE: &str = "usage: xwen tokenize -m MODEL.gguf (TEXT | --text-file FILE) [--markup]";

pub fn run(args: &[String]) -> Result<()> {
    let mut a = Args::new(args);
    let model = a.value(&["-m", "--model"])?;
    let file = a.value(&["--text-file", "-f"])?;
    let markup = a.flag(&["--markup"]);
    let pos = a.finish()?;
    let Some(model) = model else { bail!("{USAGE}") };
    let text = match (file, pos.as_slice()) {
        (Some(path), []) => {
            let bytes = std::fs::read(&path).with_context(|| format!("reading {path}"))?;
            llama_lossy_utf8(&bytes)
        }
        (None, [text]) => text.clone(),
        _ => bail!("{USAGE}"),
    };
    let f = GgufFile::open(Path::new(&model)).with_context(|| model.clone())?;
    let tok = Tokenizer::from_gguf(&f).with_context(|| format!("{model}: tokenizer"))?;
    let ids = if markup { tok.encode_markup(&text) } else { tok.encode(&text) };
    let line: Vec<String> = ids.iter().map(u32::to_string).collect();
    println!("{}", line.join(" "));
    Ok(())
}

/// UTF-8 decoding as llama.cpp's `unicode_cpts_from_utf8` does it: a byte that does not start
/// a well-formed character becomes one U+FFFD and decoding resumes at the next byte.
fn llama_lossy_utf8(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                break;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                out.push(char::REPLACEMENT_CHARACTER);
                rest = &bad[1..];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_bytes_become_one_replacement_each() {
        assert_eq!(llama_lossy_utf8(b"a\xE4\xB8b"), "a\u{FFFD}\u{FFFD}b");
        assert_eq!(llama_lossy_utf8("é😀".as_bytes()), "é😀");
        assert_eq!(llama_lossy_utf8(b"\xF0\x9F\x98A"), "\u{FFFD}\u{FFFD}\u{FFFD}A");
        assert_eq!(llama_lossy_utf8(b""), "");
    }
}
