//! llama.cpp's tokenizer test vectors (`models/ggml-vocab-*.gguf.inp/.out`, checked by its
//! tests/test-tokenizer-0.cpp with add_special = false, parse_special = false, which is our
//! `Tokenizer::encode`). The committed fixtures cover Qwen3.5/Qwen2, GPT-2 and DeepSeek-Coder;
//! with `XWEN_LLAMA_CPP_DIR` set to a llama.cpp source tree every byte-level BPE vocabulary in
//! its models/ folder is checked too.

use std::path::{Path, PathBuf};

use xwen_chat::Tokenizer;
use xwen_gguf::GgufFile;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/vocab")
}

/// test-tokenizer-0.cpp's `read_tests`: inputs separated by a marker line, one output line of
/// space-separated ids per input.
fn read_tests(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    let raw = std::fs::read_to_string(inp).unwrap_or_else(|e| panic!("{}: {e}", inp.display()));
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < raw.len() {
        match raw[pos..].find(sep) {
            Some(n) => {
                inputs.push(raw[pos..pos + n].to_string());
                pos += n + sep.len();
            }
            None => {
                inputs.push(raw[pos..].to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = std::fs::read_to_string(out)
        .unwrap_or_else(|e| panic!("{}: {e}", out.display()))
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{}: input and output counts differ", inp.display());
    inputs.into_iter().zip(outputs).collect()
}

/// Checks every vector; returns the number of cases.
fn check(tok: &Tokenizer, name: &str, inp: &Path, out: &Path) -> usize {
    let tests = read_tests(inp, out);
    let mut failures = Vec::new();
    for (text, want) in &tests {
        let got = tok.encode(text);
        if &got != want {
            failures.push(format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), tests.len(), failures.join("\n"));
    tests.len()
}

fn vocab(name: &str) -> GgufFile {
    let path = fixtures().join(format!("ggml-vocab-{name}.gguf"));
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn committed(name: &str) {
    let f = vocab(name);
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let base = fixtures().join(format!("ggml-vocab-{name}.gguf"));
    let n = check(&tok, name, &base.with_extension("gguf.inp"), &base.with_extension("gguf.out"));
    assert!(n > 30, "{name}: only {n} vectors");
}

#[test]
fn qwen35_vectors() {
    committed("qwen35");
}

#[test]
fn gpt2_vectors() {
    committed("gpt-2");
}

#[test]
fn deepseek_coder_vectors() {
    committed("deepseek-coder");
}

/// llama.cpp's qwen2 vocabulary file is the qwen35 one with `tokenizer.ggml.pre = qwen2`
/// (identical tokens, types and merges), so only its vectors are committed.
#[test]
fn qwen2_vectors() {
    let f = vocab("qwen35");
    let tok = Tokenizer::from_gguf_with_pre(&f, Some("qwen2")).unwrap();
    let base = fixtures().join("ggml-vocab-qwen2.gguf");
    check(&tok, "qwen2", &base.with_extension("gguf.inp"), &base.with_extension("gguf.out"));
}

#[test]
#[cfg_attr(xwen_no_llama_cpp, ignore = "set XWEN_LLAMA_CPP_DIR to a llama.cpp source tree (README.md, \"Tests\")")]
fn every_llama_cpp_bpe_vocab() {
    let dir = std::env::var_os("XWEN_LLAMA_CPP_DIR").expect("XWEN_LLAMA_CPP_DIR");
    let models = Path::new(&dir).join("models");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&models)
        .unwrap_or_else(|e| panic!("{}: {e}", models.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf") && p.with_extension("gguf.inp").exists())
        .collect();
    names.sort();
    let mut checked = 0;
    for path in names {
        let f = GgufFile::open(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if f.get_str("tokenizer.ggml.model") != Some("gpt2") {
            eprintln!("not byte-level BPE, not checked: {name}");
            continue;
        }
        let tok = Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{name}: {e}"));
        let n = check(&tok, &name, &path.with_extension("gguf.inp"), &path.with_extension("gguf.out"));
        eprintln!("{name}: {n} vectors match");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} vocabularies checked");
}

/// Random text over every pre-tokenizer branch, compared with llama.cpp's own `llama-tokenize`
/// (`XWEN_LLAMA_CPP_DIR/build/bin`) in both modes, for each committed vocabulary.
#[test]
#[cfg_attr(xwen_no_llama_cpp, ignore = "set XWEN_LLAMA_CPP_DIR to a llama.cpp source tree (README.md, \"Tests\")")]
fn matches_llama_tokenize_on_random_text() {
    let dir = std::env::var_os("XWEN_LLAMA_CPP_DIR").expect("XWEN_LLAMA_CPP_DIR");
    let bin = Path::new(&dir).join("build/bin/llama-tokenize");
    assert!(bin.exists(), "{} is not built", bin.display());
    let pool: Vec<&str> = "a b c X Y Z 0 1 9 _ ' \" ( ) [ ] { } < > : ; . , ! ? - + * / = # é ß ж ع 中 文 한 😀 ½ ٣ ① ǅ ﬁ"
        .split(' ')
        .chain(["  ", " ", "\n", "\r\n", "\t", "\u{3000}", "\u{a0}", "\u{2028}", "\u{0b}", "\u{1c}", "e\u{301}", "\u{300}", "\u{200d}", "👍🏽"])
        .chain(["'s", "'LL", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "<|fim_prefix|>", "    return "])
        .collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let text: String = (0..40_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            pool[(state % pool.len() as u64) as usize]
        })
        .collect();
    let tmp = std::env::temp_dir().join(format!("xwen-chat-llama-tokenize-{}.txt", std::process::id()));
    std::fs::write(&tmp, &text).unwrap();
    for name in ["qwen35", "gpt-2", "deepseek-coder"] {
        let gguf = fixtures().join(format!("ggml-vocab-{name}.gguf"));
        let tok = Tokenizer::from_gguf(&GgufFile::open(&gguf).unwrap()).unwrap();
        for markup in [false, true] {
            let mut cmd = std::process::Command::new(&bin);
            cmd.arg("-m").arg(&gguf).arg("-f").arg(&tmp).args(["--ids", "--no-bos", "--no-escape", "--log-disable"]);
            if !markup {
                cmd.arg("--no-parse-special");
            }
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{name}: llama-tokenize failed");
            let want: Vec<u32> = String::from_utf8_lossy(&out.stdout)
                .split(|c: char| !c.is_ascii_digit())
                .filter(|t| !t.is_empty())
                .map(|t| t.parse().unwrap())
                .collect();
            let got = if markup { tok.encode_markup(&text) } else { tok.encode(&text) };
            assert_eq!(got.len(), want.len(), "{name} markup={markup}: token counts differ");
            assert!(got == want, "{name} markup={markup}: ids differ");
            eprintln!("{name} markup={markup}: {} ids match llama-tokenize", got.len());
        }
    }
    std::fs::remove_file(&tmp).ok();
}

/// The kimi-k2 pre-tokenizer (Kimi-Linear, Kimi K2/K3) against llama.cpp's ids for the same
/// inputs. No Kimi vocabulary is committed, so the reference (tools/oracle/vocab_refs.sh) runs
/// the kimi-k2 split over Qwen3.5's BPE: the vocabulary below is that file with only
/// `tokenizer.ggml.pre` changed, exactly as the oracle made it.
#[test]
fn kimi_k2_split_matches_llama_cpp() {
    let qwen = vocab("qwen35");
    let mut w = xwen_gguf::GgufWriter::new();
    for (k, v) in qwen.metadata() {
        let v = if k == "tokenizer.ggml.pre" { xwen_gguf::Value::Str("kimi-k2".into()) } else { v.clone() };
        w.add_kv(k, v);
    }
    assert!(qwen.tensors().is_empty(), "a vocab-only file");
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let n = check(&tok, "kimi-k2", &fixtures().join("kimi-k2.inp"), &fixtures().join("kimi-k2.out"));
    assert!(n > 60, "only {n} vectors");
}
