//! `xwen` — the command line. Every subcommand is a thin client of the library crates:
//! argument parsing and printing live here, logic does not.

mod args;
mod download;
mod bench_parallel;
mod cmd_bench;
mod cmd_chat;
mod cmd_synth;
mod cmd_inspect;
mod cmd_logits;
mod cmd_pull;
mod cmd_run;
mod cmd_serve;
mod cmd_tokenize;
mod hub;
mod lcg;
mod model_arg;
mod npy;

use std::process::ExitCode;

const USAGE: &str = "\
xwen — hybrid linear-attention / MoE inference engine

usage: xwen <command> [options]

commands:
  run       generate text from a prompt (no -m: the embedded demo model)
  chat      multi-turn chat
  serve     OpenAI- and Anthropic-compatible HTTP server
  inspect   describe a GGUF file (--json for machine-readable output)
  tokenize  print token ids of a text
  logits    write logits of every position as .npy
  bench     prefill / decode throughput (llama-bench compatible --json)
  synth     write a synthetic full-size GGUF for benchmarks
  pull      download a model into the Hugging Face cache and print its path
";

fn main() -> ExitCode {
    if std::env::var_os("XWEN_DEFAULT_MALLOC").is_none() {
        xwen_engine::heap::keep_freed_memory();
    }
    // A closed output pipe (`xwen inspect M --json | head -1`) ends the process quietly, as it
    // does C tools, instead of a panic at the next print.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Arguments that are not UTF-8 are refused by name, not with a panic.
    let mut argv: Vec<String> = Vec::new();
    for (i, a) in std::env::args_os().skip(1).enumerate() {
        match a.into_string() {
            Ok(s) => argv.push(s),
            Err(raw) => {
                eprintln!("xwen: argument {} is not valid UTF-8: {}", i + 1, raw.to_string_lossy());
                return ExitCode::from(2);
            }
        }
    }
    let Some(cmd) = argv.first().map(String::as_str) else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &argv[1..];
    let result = match cmd {
        "inspect" => cmd_inspect::run(rest),
        "run" => cmd_run::run(rest),
        "chat" => cmd_chat::run(rest),
        "serve" => cmd_serve::run(rest),
        "bench" => cmd_bench::run(rest),
        "synth" => cmd_synth::run(rest),
        "logits" => cmd_logits::run(rest),
        "tokenize" => cmd_tokenize::run(rest),
        "pull" => cmd_pull::run(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(anyhow::anyhow!("unknown command `{other}`; run `xwen --help`")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xwen: {e:#}");
            ExitCode::FAILURE
        }
    }
}
