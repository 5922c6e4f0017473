//! The embedding API on the embedded demo model: generation and its stop conditions, batches
//! against single runs, chat through the demo's template, tokens, logits and the plan.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use xwen_embed::{ChatMessage, ChatOptions, Error, Event, FinishReason, GenerateOptions, LoadOptions, Prompt, SamplerConfig, Xwen};

fn demo() -> Xwen {
    Xwen::load(None, &LoadOptions { threads: Some(2), ..Default::default() }).unwrap()
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: Some(n), sampling: SamplerConfig::greedy(), ..Default::default() }
}

#[test]
fn generate_streams_what_it_returns_and_batches_agree_with_single_runs() {
    let x = demo();
    let mut streamed = String::new();
    let mut ids = Vec::new();
    let c = x
        .generate(Prompt::Text("def fibonacci(n):\n"), &greedy(40), &mut |e| {
            if let Event::Token { text, token, index } = e {
                assert_eq!(*index, 0);
                streamed.push_str(text);
                ids.extend(token);
            }
            true
        })
        .unwrap();
    assert_eq!(c.finish, FinishReason::Length);
    assert_eq!(c.tokens.len(), 40);
    assert_eq!((streamed.as_str(), ids.as_slice()), (c.text.as_str(), c.tokens.as_slice()));
    assert_eq!(c.text, x.detokenize(&c.tokens).unwrap());
    assert_eq!((c.usage.prompt_tokens, c.usage.completion_tokens), (x.tokenize("def fibonacci(n):\n", false).len(), 40));
    // the demo model is greedy unless asked otherwise, as `xwen run`
    let plain = x.generate(Prompt::Text("def fibonacci(n):\n"), &GenerateOptions { max_tokens: Some(40), ..Default::default() }, &mut |_| true).unwrap();
    assert_eq!(plain.tokens, c.tokens);
    // three prompts decoded together: each gets its single run's tokens
    let prompts = ["import os\n", "def fibonacci(n):\n", "class Stack:\n"];
    let batch = x.generate_batch(&prompts.map(Prompt::Text), &greedy(24), &mut |_| true).unwrap();
    for (p, b) in prompts.iter().zip(&batch) {
        let alone = x.generate(Prompt::Text(p), &greedy(24), &mut |_| true).unwrap();
        assert_eq!(b.tokens, alone.tokens, "{p:?}");
    }
    // token ids as the prompt
    let by_ids = x.generate(Prompt::Ids(&x.tokenize("def fibonacci(n):\n", false)), &greedy(40), &mut |_| true).unwrap();
    assert_eq!(by_ids.tokens, c.tokens);
}

#[test]
fn stop_strings_callbacks_and_the_cancel_flag_end_a_sequence() {
    let x = demo();
    let full = x.generate(Prompt::Text("def fibonacci(n):\n"), &greedy(40), &mut |_| true).unwrap();
    // a stop string cut out of the greedy text: the text ends before it
    let cut = full.text.char_indices().map(|(i, _)| i).find(|&i| i >= 10).unwrap();
    let stop = full.text[cut..].chars().take(3).collect::<String>();
    let first = full.text.find(&stop).unwrap();
    let opts = GenerateOptions { stop: vec![stop.clone()], ..greedy(40) };
    let c = x.generate(Prompt::Text("def fibonacci(n):\n"), &opts, &mut |_| true).unwrap();
    assert_eq!((c.finish, c.stop_string.as_deref(), c.text.as_str()), (FinishReason::StopString, Some(stop.as_str()), &full.text[..first]));
    // the callback stops after three tokens
    let mut n = 0;
    let c = x
        .generate(Prompt::Text("def fibonacci(n):\n"), &greedy(40), &mut |e| {
            n += matches!(e, Event::Token { token: Some(_), .. }) as usize;
            n < 3
        })
        .unwrap();
    assert_eq!((c.finish, c.tokens.as_slice()), (FinishReason::Cancelled, &full.tokens[..3]));
    // a flag set beforehand: nothing is generated
    let cancel = Arc::new(AtomicBool::new(true));
    let c = x.generate(Prompt::Text("def fibonacci(n):\n"), &GenerateOptions { cancel: Some(cancel), ..greedy(40) }, &mut |_| true).unwrap();
    assert_eq!((c.finish, c.tokens.len()), (FinishReason::Cancelled, 0));
    // a callback that calls back into the model: tokenizing works, computing is refused
    let mut inner = None;
    x.generate(Prompt::Text("x"), &greedy(1), &mut |_| {
        assert!(!x.tokenize("y", false).is_empty());
        inner = Some(x.logits(&[1], false).map(|_| ()));
        true
    })
    .unwrap();
    assert!(matches!(inner, Some(Err(Error::InvalidArgument(_)))), "{inner:?}");
    // max_tokens 0
    let c = x.generate(Prompt::Text("x"), &greedy(0), &mut |_| true).unwrap();
    assert_eq!((c.finish, c.tokens.len()), (FinishReason::Length, 0));
}

#[test]
fn a_small_context_fills_and_sampling_repeats_with_its_seed() {
    let x = Xwen::load(None, &LoadOptions { ctx_size: Some(16), ..Default::default() }).unwrap();
    let c = x.generate(Prompt::Text("def fibonacci(n):\n"), &GenerateOptions { max_tokens: None, ignore_eos: true, ..greedy(0) }, &mut |_| true).unwrap();
    assert_eq!(c.finish, FinishReason::ContextFull);
    assert_eq!(c.usage.prompt_tokens + c.tokens.len(), 16 + 1, "the last sampled token is not fed");
    let x = demo();
    let hot = GenerateOptions { max_tokens: Some(30), sampling: SamplerConfig { temperature: Some(1.0), ..Default::default() }, ..Default::default() };
    let a = x.generate(Prompt::Text("import "), &hot, &mut |_| true).unwrap();
    let again = GenerateOptions { sampling: SamplerConfig { seed: Some(a.seed), ..hot.sampling.clone() }, ..hot.clone() };
    let b = x.generate(Prompt::Text("import "), &again, &mut |_| true).unwrap();
    assert_eq!(a.tokens, b.tokens);
}

#[test]
fn refusals_are_errors_not_panics() {
    let x = Xwen::load(None, &LoadOptions { ctx_size: Some(8), ..Default::default() }).unwrap();
    let g = greedy(4);
    assert!(matches!(x.generate(Prompt::Text(""), &g, &mut |_| true), Err(Error::InvalidArgument(_))));
    assert!(matches!(x.generate(Prompt::Ids(&[1 << 30]), &g, &mut |_| true), Err(Error::InvalidArgument(_))));
    assert!(matches!(x.generate(Prompt::Text(&"def f(): pass\n".repeat(8)), &g, &mut |_| true), Err(Error::InvalidArgument(_))));
    assert!(matches!(x.detokenize(&[u32::MAX]), Err(Error::InvalidArgument(_))));
    assert!(matches!(x.logits(&[], false), Err(Error::InvalidArgument(_))));
    assert!(matches!(Xwen::load(Some("/nonexistent/model.gguf"), &LoadOptions::default()), Err(Error::Load(_))));
    assert!(matches!(Xwen::load(None, &LoadOptions { chat_template: Some("{% for %}".into()), ..Default::default() }), Err(Error::Template(_))));
    assert!(matches!(Xwen::load(None, &LoadOptions { threads: Some(0), ..Default::default() }), Err(Error::InvalidArgument(_))));
}

#[test]
fn tokens_logits_and_the_plan() {
    let x = demo();
    let info = x.info();
    assert!(info.is_demo && info.has_chat_template && info.context == 4096, "{info:?}");
    let ids = x.tokenize("def f(x):\n    return x\n", false);
    assert_eq!(x.detokenize(&ids).unwrap(), "def f(x):\n    return x\n");
    // user text never becomes a control token; markup does
    assert!(x.tokenize("<|endoftext|>", false).len() > 1);
    assert_eq!(x.tokenize("<|endoftext|>", true), info.eos_ids[..1]);
    let all = x.logits(&ids, true).unwrap();
    assert_eq!(all.len(), ids.len() * info.n_vocab);
    let last = x.logits(&ids, false).unwrap();
    // the last row of every position's logits is the last position's (to rounding: a step
    // with every row's logits takes another product order)
    let diff = last.iter().zip(&all[(ids.len() - 1) * info.n_vocab..]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(last.len() == info.n_vocab && diff < 1e-3, "{diff}");
    let argmax = last.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
    let c = x.generate(Prompt::Ids(&ids), &greedy(1), &mut |_| true).unwrap();
    assert_eq!(c.tokens, [argmax]);
    let plan = x.plan().unwrap();
    assert!(plan.trunk_bytes > 0 && plan.floor() >= plan.trunk_bytes);
    let json = xwen_embed::plan_json(&plan);
    assert_eq!(json["max_ctx"], 4096);
    assert!(json["budget_bytes"].is_null());
    let budgeted = xwen_embed::plan(None, &LoadOptions { ram_budget: Some(1 << 30), ..Default::default() }).unwrap();
    assert_eq!(xwen_embed::plan_json(&budgeted)["budget_bytes"], 1u64 << 30);
    assert!(matches!(xwen_embed::plan(None, &LoadOptions { ram_budget: Some(1 << 10), ..Default::default() }), Err(Error::InvalidArgument(_))));
}

#[test]
fn chat_renders_the_template_and_splits_the_reply() {
    let x = demo();
    let messages = xwen_embed::messages_from_json(&serde_json::json!([
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": [{"type": "text", "text": "def add(a, b):"}]},
    ]))
    .unwrap();
    assert_eq!(messages[1], ChatMessage::new("user", "def add(a, b):"));
    let mut content = String::new();
    let opts = ChatOptions { generate: greedy(20), ..Default::default() };
    let r = x
        .chat(&messages, &opts, &mut |e| {
            if let Event::Content { text } = e {
                content.push_str(text);
            }
            true
        })
        .unwrap();
    assert_eq!(r.completion.tokens.len(), 20);
    assert_eq!(content, r.content);
    assert!(r.tool_calls.is_empty());
    // the same ids as the template's rendering generated directly
    let rendered = "<|im_start|>system\nYou write Python.<|im_end|>\n<|im_start|>user\ndef add(a, b):<|im_end|>\n<|im_start|>assistant\n";
    let direct = x.generate(Prompt::Ids(&x.tokenize(rendered, true)), &greedy(20), &mut |_| true).unwrap();
    assert_eq!(direct.tokens, r.completion.tokens);
    assert!(xwen_embed::messages_from_json(&serde_json::json!([{"role": "robot", "content": "x"}])).is_err());
    assert!(xwen_embed::messages_from_json(&serde_json::json!({"role": "user"})).is_err());
}
