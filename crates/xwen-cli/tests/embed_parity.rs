//! `xwen run` and the embedding API (what the C ABI and the Python package call) complete the
//! demo prompt with the same greedy tokens, the same text and the same finish reason; with a
//! stop string and with sampling at a given seed too.

use std::process::Command;
use xwen_embed::{GenerateOptions, LoadOptions, Prompt, SamplerConfig, Xwen};

fn run_json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_xwen")).args(["run", "-q", "--json"]).args(args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn tokens(v: &serde_json::Value) -> Vec<u32> {
    v["ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect()
}

#[test]
fn xwen_run_and_the_library_agree() {
    let x = Xwen::load(None, &LoadOptions::default()).unwrap();
    let lib = |opts: GenerateOptions| x.generate(Prompt::Text(xwen_embed::DEMO_PROMPT), &opts, &mut |_| true).unwrap();
    // greedy (the demo's default in both), to a token limit
    let cli = run_json(&["-n", "64"]);
    let c = lib(GenerateOptions { max_tokens: Some(64), ..Default::default() });
    assert_eq!(tokens(&cli), c.tokens);
    assert_eq!((cli["text"].as_str().unwrap(), cli["stop"].as_str().unwrap()), (c.text.as_str(), c.finish.as_str()));
    // a stop string
    let stop = &c.text[c.text.len() / 2..][..2];
    let cli = run_json(&["-n", "64", "--stop", stop, "--no-escape"]);
    let c = lib(GenerateOptions { max_tokens: Some(64), stop: vec![stop.to_string()], ..Default::default() });
    assert_eq!((tokens(&cli), cli["text"].as_str().unwrap(), cli["stop"].as_str().unwrap()), (c.tokens.clone(), c.text.as_str(), "stop_string"));
    // sampling at one seed
    let cli = run_json(&["-n", "32", "--temp", "0.9", "-s", "1234"]);
    let c = lib(GenerateOptions { max_tokens: Some(32), sampling: SamplerConfig { temperature: Some(0.9), seed: Some(1234), ..Default::default() }, ..Default::default() });
    assert_eq!(tokens(&cli), c.tokens);
}
