//! `xwen tokenize -m MODEL.gguf (TEXT | --text-file FILE) [--markup]`: the token ids of a text,
//! space-separated on one line, built from the GGUF's tokenizer metadata alone (no weights
//! are read). No BOS/EOS is added.
//!
//! By default the text is tokenized as user content: special-token text such as
//! `<|im_start|>` stays plain text (llama.cpp `parse_special = false`, as its
//! test-tokenizer-0 runs). `--markup` parses special tokens (llama.cpp `parse_special = true`).
//! `--text-file` tokenizes the file's exact bytes; bytes that are not UTF-8 become U+FFFD,
//! one per byte, as llama.cpp decodes them.

use anyhow::{Context, Result};
use xwen_chat::Tokenizer;
use xwen_gguf::GgufFile;

use crate::cli::TokenizeArgs;
use crate::cmd_run::llama_lossy_utf8;

pub fn run(a: TokenizeArgs) -> Result<()> {
    let text = match (&a.file, &a.text) {
        (Some(path), _) => {
            let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            llama_lossy_utf8(&bytes)
        }
        (None, Some(text)) => text.clone(),
        (None, None) => anyhow::bail!("give a TEXT or -f FILE"),
    };
    let model = a.model.display().to_string();
    let f = GgufFile::open(&a.model).with_context(|| model.clone())?;
    let tok = Tokenizer::from_gguf(&f).with_context(|| format!("{model}: tokenizer"))?;
    let ids = if a.markup { tok.encode_markup(&text) } else { tok.encode(&text) };
    let line: Vec<String> = ids.iter().map(u32::to_string).collect();
    println!("{}", line.join(" "));
    Ok(())
}
