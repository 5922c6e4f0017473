//! `xwen` — the command line. Every subcommand is a thin client of the library crates:
//! argument parsing (cli.rs, clap) and printing live here, logic does not.

mod bench_draft;
mod bench_parallel;
mod bench_verify;
mod cli;
#[cfg(test)]
mod cli_doc;
mod cmd_bench;
mod cmd_chat;
mod cmd_inspect;
mod cmd_logits;
mod cmd_pack;
mod cmd_plan;
mod cmd_pull;
mod cmd_replay;
mod cmd_run;
mod cmd_serve;
mod cmd_synth;
mod cmd_tokenize;
mod cmd_trace;
mod draft_arg;
mod gpu;
mod heap;
mod interrupt;
mod lcg;
mod model_arg;
mod npy;
mod opts;
mod prefill_progress;
mod stats;

use clap::{CommandFactory, FromArgMatches};
use std::process::ExitCode;

use cli::{Cli, Command};

/// `xwen --version`: the version, the commit, the kernel set this CPU gets and the CUDA device.
fn long_version() -> String {
    use xwen_kernels::dispatch::{detected, Isa};
    let isa = match detected() {
        Isa::Avx512 => "AVX-512 (F, BW, VL, VNNI) + AVX2 + FMA + F16C",
        Isa::Avx2 => "AVX2 + FMA + F16C",
        Isa::Neon => "NEON",
        Isa::Scalar => "scalar (no SIMD kernel set this CPU supports)",
    };
    // the GPU line only when the version is asked for: opening the driver takes a moment
    let gpu = if std::env::args().any(|a| a == "--version") { format!("\n{}", gpu::version_line()) } else { String::new() };
    format!("{} (commit {})\nkernels: {isa}{gpu}", env!("CARGO_PKG_VERSION"), env!("XWEN_GIT_HASH"))
}

/// The clap command with its run-time pieces: the version strings and a fixed help width (the
/// width docs/cli.md is generated at, so help reads the same everywhere).
pub fn command() -> clap::Command {
    Cli::command()
        .version(concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("XWEN_GIT_HASH"), ")"))
        .long_version(&*Box::leak(long_version().into_boxed_str()))
        .term_width(100)
}

fn main() -> ExitCode {
    if std::env::var_os("XWEN_DEFAULT_MALLOC").is_none() {
        heap::keep_freed_memory();
    }
    // A closed output pipe (`xwen inspect M --json | head -1`) ends the process quietly, as it
    // does C tools, instead of a panic at the next print.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // Arguments that are not UTF-8 are refused by name, not with a panic.
    let mut argv: Vec<String> = vec!["xwen".into()];
    for (i, a) in std::env::args_os().skip(1).enumerate() {
        match a.into_string() {
            Ok(s) => argv.push(s),
            Err(raw) => {
                eprintln!("xwen: argument {} is not valid UTF-8: {}", i + 1, raw.to_string_lossy());
                return ExitCode::from(2);
            }
        }
    }
    let argv = cli::expand_llama_shorts(argv);
    let cli = match command().try_get_matches_from(&argv).and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(c) => c,
        Err(e) => return usage_error(e, &argv),
    };
    // The server writes to sockets its clients may close at any moment: there a closed pipe is
    // an error of one connection (EPIPE), never a signal that ends the process. `tokenize`
    // writes its one answer with checked writes: a reader that has gone (`| head -c 10`) ends
    // it with exit 0 whether it left before or after the write (with the signal, which of the
    // two happened decided between a kill and exit 0).
    #[cfg(unix)]
    if matches!(cli.command, Command::Serve(_) | Command::Tokenize(_)) {
        // SAFETY: still before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
    }
    let result = match cli.command {
        Command::Run(a) => cmd_run::run(a),
        Command::Chat(a) => cmd_chat::run(a),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Inspect(a) => cmd_inspect::run(a),
        Command::Tokenize(a) => cmd_tokenize::run(a),
        Command::Logits(a) => cmd_logits::run(a),
        Command::Bench(a) => cmd_bench::run(a),
        Command::Synth(a) => cmd_synth::run(a),
        Command::Plan(a) => cmd_plan::run(a),
        Command::Pack(a) => cmd_pack::run(a),
        Command::Trace(a) => cmd_trace::run(a),
        Command::Replay(a) => cmd_replay::run(a),
        Command::Pull(a) => cmd_pull::run(a),
        Command::Completions(a) => {
            clap_complete::generate(a.shell, &mut command(), "xwen", &mut std::io::stdout());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) => ExitCode::SUCCESS,
        Err(e) => {
            // one line: a message's own line breaks would read as separate errors
            eprintln!("xwen: {}", format!("{e:#}").replace('\n', "; "));
            ExitCode::FAILURE
        }
    }
}

/// Help and version go to stdout (exit 0); a usage error is one line on stderr naming the
/// problem, plus where help is (exit 2).
fn usage_error(e: clap::Error, argv: &[String]) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
        _ => {}
    }
    // clap's message spans lines (the problem, its items, a tip, the usage): one line of it
    let text = e.to_string();
    let mut first = String::new();
    let mut usage = String::new();
    let sub = argv.get(1).filter(|s| command().get_subcommands().any(|c| c.get_name() == s.as_str()));
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(u) = line.strip_prefix("Usage: ") {
            // clap's usage after an error lists the flags given as if they were required
            // (`xwen run --model <MODEL>`): the command's own usage line instead
            usage = format!("; usage: {}", sub.map_or_else(|| u.to_string(), |s| subcommand_usage(s)));
        } else if !(line.starts_with("For more information") || line.starts_with("tip:")) {
            if !first.is_empty() {
                first.push(' ');
            }
            first.push_str(line.trim_start_matches("error: "));
        }
    }
    let tip = match e.get(ContextKind::SuggestedArg).or_else(|| e.get(ContextKind::SuggestedSubcommand)) {
        Some(ContextValue::String(s)) => format!(" (did you mean `{s}`?)"),
        Some(ContextValue::Strings(v)) if !v.is_empty() => format!(" (did you mean `{}`?)", v[0]),
        _ => String::new(),
    };
    let help = match sub {
        Some(s) => format!("xwen {s} --help"),
        None => "xwen --help".into(),
    };
    eprintln!("xwen: {first}{tip}{usage}; see `{help}`");
    ExitCode::from(2)
}

/// A subcommand's usage as its `--help` opens (`xwen run [OPTIONS]`), without the flags of
/// one command line.
fn subcommand_usage(name: &str) -> String {
    let mut cmd = command();
    cmd.build();
    cmd.find_subcommand_mut(name).map_or_else(
        || format!("xwen {name}"),
        |c| c.render_usage().to_string().trim().trim_start_matches("Usage: ").to_string(),
    )
}
