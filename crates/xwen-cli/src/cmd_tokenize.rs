//! `xwen tokenize [-m MODEL.gguf] (TEXT | --text-file FILE) [--markup] [--show-pieces]`: the
//! token ids of a text, space-separated on one line (or, with `--show-pieces`, one token a line
//! with its text, as llama-tokenize prints them), built from the GGUF's tokenizer metadata
//! alone (no weights are read). No BOS/EOS is added. Without `-m` the embedded demo model's
//! tokenizer is used, as the other commands use the demo model.
//!
//! By default the text is tokenized as user content: special-token text such as
//! `<|im_start|>` stays plain text (llama.cpp `parse_special = false`, as its
//! test-tokenizer-0 runs). `--markup` parses special tokens (llama.cpp `parse_special = true`).
//! TEXT has its escapes processed (`\n`, as llama-tokenize does) unless `--no-escape`;
//! `--text-file` tokenizes the file's exact bytes (`-`: standard input); bytes that are not
//! UTF-8 become U+FFFD, one per byte, as llama.cpp decodes them.

use anyhow::{Context, Result};
use std::io::Write;
use xwen_chat::Tokenizer;
use xwen_gguf::GgufFile;

use crate::cli::TokenizeArgs;
use crate::opts::llama_lossy_utf8;
use crate::{model_arg, opts};

pub fn run(a: TokenizeArgs) -> Result<()> {
    let text = match (&a.file, &a.text) {
        (Some(path), _) => llama_lossy_utf8(&opts::read_input(path)?),
        (None, Some(text)) if a.no_escape => text.clone(),
        (None, Some(text)) => opts::process_escapes(text),
        (None, None) => anyhow::bail!("give a TEXT or -f FILE"),
    };
    let (f, name) = match &a.model {
        Some(m) => {
            let name = m.display().to_string();
            (GgufFile::open(m).with_context(|| name.clone())?, name)
        }
        None => (GgufFile::from_bytes(model_arg::DEMO_GGUF.to_vec()).context("embedded demo model")?, "the demo model".into()),
    };
    let tok = Tokenizer::from_gguf(&f).with_context(|| format!("{name}: tokenizer"))?;
    let ids = if a.markup { tok.encode_markup(&text) } else { tok.encode(&text) };
    let mut out = std::io::stdout().lock();
    if a.show_pieces {
        for &id in &ids {
            // a piece that is part of a character (byte-level BPE) shows as its bytes' U+FFFD
            writeln!(out, "{id:6} -> '{}'", llama_lossy_utf8(tok.token_bytes(id)))?;
        }
    } else {
        let line: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", line.join(" "))?;
    }
    out.flush()?;
    Ok(())
}
