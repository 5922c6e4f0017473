//! The command line's grammar: every subcommand and flag, parsed by clap (derive). Flags keep
//! llama.cpp's names where they mean the same; llama.cpp's multi-letter short flags (`-np`,
//! `-ngl`, `-ub`, ...) are spelled out to their long names before clap sees them
//! (`expand_llama_shorts`), since clap's short flags are one letter. A repeated flag keeps its
//! last value, as in llama.cpp. Every value is range-checked here, so a command starts only with
//! values it can use.

use clap::{Parser, Subcommand};

use crate::opts::{self, EngineOpts, EscapeOpts, SamplingOpts};

/// The multi-letter single-dash flags of llama.cpp that xwen accepts, and the long flag each
/// means. `-npl` is llama-batched-bench's name for `bench --parallel`.
pub const LLAMA_SHORTS: &[(&str, &str)] = &[
    ("-np", "--parallel"),
    ("-npl", "--parallel"),
    ("-ngl", "--n-gpu-layers"),
    ("-ub", "--ubatch-size"),
    ("-npp", "--n-prompt"),
    ("-ntg", "--n-gen"),
    ("-sys", "--system-prompt"),
    ("-mli", "--multiline-input"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-fa", "--flash-attn"),
    ("-md", "--model-draft"),
];

/// Rewrites llama.cpp's multi-letter short flags (`-np 4`, `-np=4`) to their long names. Only
/// whole arguments are rewritten, never a value that merely starts like one, and nothing after
/// `--`.
pub fn expand_llama_shorts(argv: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut literal = false;
    for a in argv {
        if literal || a == "--" {
            literal = true;
            out.push(a);
            continue;
        }
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (a.as_str(), None),
        };
        match LLAMA_SHORTS.iter().find(|(short, _)| *short == flag) {
            Some((_, long)) => out.push(match value {
                Some(v) => format!("{long}={v}"),
                None => long.to_string(),
            }),
            None => out.push(a),
        }
    }
    out
}

#[derive(Parser, Debug)]
#[command(
    name = "xwen",
    about = "xwen — a hybrid linear-attention / MoE inference engine for GGUF models (Qwen3.5/3.6/3.8 dense and MoE)",
    args_override_self = true,
    disable_help_subcommand = false,
    propagate_version = true,
    after_help = "\
Examples:
  xwen run                                   # the embedded demo model writes Python
  xwen run -m model.gguf -p 'The capital of France is' -n 32
  xwen chat -m model.gguf
  xwen serve -m model.gguf --port 8080 -np 4
  xwen inspect model.gguf --json
  xwen bench -m model.gguf -p 512 -n 128

Run `xwen <command> --help` for a command's flags; docs/cli.md lists them all."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a prompt (no -m: the embedded demo model)
    Run(RunArgs),
    /// Multi-turn chat on the terminal, with the model's chat template
    Chat(ChatArgs),
    /// OpenAI- and Anthropic-compatible HTTP server
    Serve(ServeArgs),
    /// Describe a GGUF file: architecture, metadata, special tokens, tensors, memory
    Inspect(InspectArgs),
    /// Print the token ids of a text
    Tokenize(TokenizeArgs),
    /// Write the logits of every position as .npy (parity tooling)
    Logits(LogitsArgs),
    /// Prefill / decode throughput with llama-bench's meaning (and llama-batched-bench's with --parallel)
    Bench(BenchArgs),
    /// Write a synthetic full-size GGUF with random weights, for benchmarks
    Synth(SynthArgs),
    /// RAM plan of a model: floor, trunk, state, scratch, expert cache (and its hit rate from a trace)
    Plan(PlanArgs),
    /// Write (or --verify) the expert-packed sidecar that makes a streamed expert one read
    Pack(PackArgs),
    /// Record a greedy run's MoE routing decisions, for `xwen replay` and `xwen plan --trace`
    Trace(TraceArgs),
    /// Hit rates of LRU, the shipped expert-cache policy and Belady's optimum on a routing trace
    Replay(ReplayArgs),
    /// Download a model into the Hugging Face cache (cache first) and print its path
    Pull(PullArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions(CompletionsArgs),
}

// ---- run ---------------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  xwen run                                        # demo model, its default prompt, greedy
  xwen run -m model.gguf -p 'def quicksort(xs):' -n 128 --temp 0
  xwen run -m model.gguf -f prompt.txt -n -1      # until end of text or the context is full
  xwen run -m model.gguf --ids 1,2,3 --print-ids
  xwen run -m model.gguf -p 'Hello' --json        # text, ids, timings and stop reason as JSON
  xwen run -m model.gguf -f edit.txt --temp 0 --draft ngram     # prompt-lookup drafting
  xwen run -m big.gguf -md small.gguf -p 'def f(' --temp 0      # a draft model")]
pub struct RunArgs {
    /// GGUF path, a directory holding one GGUF, a checkpoint name (Qwen3.6-35B-A3B) or owner/repo[:QUANT]; none: the embedded demo model
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// The prompt text
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with_all = ["file", "ids"])]
    pub prompt: Option<String>,
    /// Read the prompt from a file, `-` for standard input (bytes that are not UTF-8 become U+FFFD, as llama.cpp reads them; no escapes are processed)
    #[arg(short = 'f', long = "file", value_name = "FILE", conflicts_with = "ids")]
    pub file: Option<String>,
    /// The prompt as token ids (comma- or space-separated)
    #[arg(long = "ids", value_name = "IDS")]
    pub ids: Option<String>,
    /// Tokens to generate; -1: until an end-of-text token or the context is full
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 64, allow_negative_numbers = true, value_parser = opts::n_predict)]
    pub n_predict: i64,
    /// Print the generated token ids instead of the text
    #[arg(long = "print-ids")]
    pub print_ids: bool,
    /// Print one JSON object at the end: text, ids, prompt tokens, timings, stop reason, seed
    #[arg(long = "json")]
    pub json: bool,
    /// Stop when the output contains this text (repeatable)
    #[arg(long = "stop", value_name = "TEXT", action = clap::ArgAction::Append)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-text tokens
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Use the non-thinking sampling defaults (Qwen3.6 model cards)
    #[arg(long = "no-think")]
    pub no_think: bool,
    #[command(flatten)]
    pub escape: EscapeOpts,
    #[command(flatten)]
    pub draft: DraftOpts,
    #[command(flatten)]
    pub sampling: SamplingOpts,
    #[command(flatten)]
    pub engine: EngineOpts,
}

/// Speculative decoding (greedy output identical to plain decoding; sampling by rejection keeps the distribution).
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Speculative decoding")]
pub struct DraftOpts {
    /// Drafter: none, ngram (prompt lookup), model:FILE (a draft model; or model with -md FILE), mtp (the model's own MTP head; mtp:FILE or -md FILE for an MTP sidecar; the default where the file has one), dflash:FILE (a DFlash block-drafter sidecar GGUF, llama.cpp arch dflash), replay:FILE (a known continuation's token ids, as --print-ids writes them: every draft right, the verify's upper bound), contrary (every draft wrong: what drafting costs when it never pays); greedy output stays plain greedy's, sampled output keeps its distribution
    #[arg(long = "draft", value_name = "KIND", value_parser = opts::draft_kind)]
    pub draft: Option<String>,
    /// Draft model: a GGUF with the target's vocabulary (also -md; implies --draft model), or with --draft mtp an MTP-only sidecar GGUF
    #[arg(long = "model-draft", value_name = "FILE")]
    pub model_draft: Option<String>,
    /// Most tokens drafted per step
    #[arg(long = "draft-max", value_name = "N", default_value_t = 8, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub draft_max: u32,
    /// A draft model or MTP head stops drafting below this top probability (llama.cpp's --draft-p-min)
    #[arg(long = "draft-p-min", value_name = "P", default_value_t = 0.75, allow_negative_numbers = true, value_parser = opts::unit_interval)]
    pub draft_p_min: f32,
}

// ---- chat --------------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
In the chat: /exit (or exit, quit, Ctrl-D) leaves; Ctrl-C stops the reply being written, or
clears the message being typed, and keeps the chat; /reset clears the conversation; /system TEXT sets the system prompt; /save FILE and
/load FILE write and read the conversation as JSON; /help lists them.

Examples:
  xwen chat                                       # the embedded demo model
  xwen chat -m model.gguf --system 'You are terse.'
  xwen chat -m model.gguf --no-think -n 512")]
pub struct ChatArgs {
    /// GGUF path, a directory holding one GGUF, a checkpoint name or owner/repo[:QUANT]; none: the embedded demo model
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// The system prompt
    #[arg(long = "system", visible_alias = "system-prompt", value_name = "TEXT")]
    pub system: Option<String>,
    /// Longest reply in tokens; -1: until the end-of-turn token or the context is full
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = -1, allow_negative_numbers = true, value_parser = opts::n_predict)]
    pub n_predict: i64,
    /// Thinking off: the template's non-thinking form and its sampling defaults
    #[arg(long = "no-think")]
    pub no_think: bool,
    /// Accepted for llama-cli compatibility: a line ending in `\` continues on the next line either way
    #[arg(long = "multiline-input", hide = true)]
    pub multiline_input: bool,
    #[command(flatten)]
    pub escape: EscapeOpts,
    #[command(flatten)]
    pub draft: DraftOpts,
    #[command(flatten)]
    pub sampling: SamplingOpts,
    #[command(flatten)]
    pub engine: EngineOpts,
}

// ---- serve -------------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  xwen serve -m model.gguf --port 8080 &
  curl -s localhost:8080/v1/chat/completions -H 'content-type: application/json' \\
    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"def add(a, b):\"}], \"max_tokens\": 32}'
  xwen serve -m model.gguf --host 0.0.0.0 --api-key secret -np 8 -c 16384")]
pub struct ServeArgs {
    /// GGUF path, a directory holding one GGUF, a checkpoint name or owner/repo[:QUANT]; none: the embedded demo model
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// Address to bind (default: loopback only)
    #[arg(long = "host", value_name = "HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 picks a free one)
    #[arg(long = "port", value_name = "PORT", default_value_t = 8080)]
    pub port: u16,
    /// Sequences decoded together, one slot each (also -np)
    #[arg(long = "parallel", value_name = "N", default_value_t = 4, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
    /// Require `Authorization: Bearer KEY` or `x-api-key: KEY`
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_key: Option<String>,
    /// The model id clients see and send
    #[arg(short = 'a', long = "alias", value_name = "NAME")]
    pub alias: Option<String>,
    /// A Jinja chat template instead of the GGUF's
    #[arg(long = "chat-template-file", value_name = "FILE")]
    pub chat_template_file: Option<String>,
    /// Requests that may wait for a slot before the server answers 429
    #[arg(long = "queue", value_name = "N", default_value_t = 64, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub queue: u32,
    /// Largest request body (e.g. 8M)
    #[arg(long = "max-body", value_name = "SIZE", default_value = "8M", allow_hyphen_values = true, value_parser = opts::nonzero_size)]
    pub max_body: u64,
    /// RAM for the prefix cache of conversation states, in MiB (llama-server's --cache-ram; 0: none in RAM; part of --ram-budget when one is given)
    #[arg(long = "cache-ram", value_name = "MIB", default_value_t = 1024, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=1 << 24))]
    pub cache_ram: u64,
    /// Also keep the prefix cache in this directory, so it survives a restart
    #[arg(long = "cache-dir", value_name = "DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub draft: DraftOpts,
    #[command(flatten)]
    pub engine: EngineOpts,
}

// ---- inspect -----------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  xwen inspect model.gguf
  xwen inspect model.gguf --tensors
  xwen inspect -m model.gguf
  xwen inspect model.gguf --json | jq .special_tokens")]
pub struct InspectArgs {
    /// The GGUF file
    #[arg(value_name = "FILE", required_unless_present = "model")]
    pub file: Option<std::path::PathBuf>,
    /// The GGUF file, as the other commands take it (llama.cpp's `-m`)
    #[arg(short = 'm', long = "model", value_name = "FILE", conflicts_with = "file")]
    pub model: Option<std::path::PathBuf>,
    /// One JSON object instead of text
    #[arg(long = "json")]
    pub json: bool,
    /// A table of every tensor (name, type, shape, bytes, offset)
    #[arg(long = "tensors")]
    pub tensors: bool,
}

// ---- tokenize ----------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  xwen tokenize 'def f(x):'                       # the embedded demo model's tokenizer
  xwen tokenize -m model.gguf 'Hello, world' --show-pieces
  xwen tokenize -m model.gguf --markup '<|im_start|>user'
  echo hi | xwen tokenize -m model.gguf -f -")]
pub struct TokenizeArgs {
    /// The GGUF whose tokenizer is used (no weights are read); none: the embedded demo model's
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<std::path::PathBuf>,
    /// The text (escapes such as \n are processed unless --no-escape)
    #[arg(value_name = "TEXT", required_unless_present = "file", conflicts_with = "file")]
    pub text: Option<String>,
    /// Tokenize a file's exact bytes, `-` for standard input (bytes that are not UTF-8 become U+FFFD, one per byte)
    #[arg(short = 'f', long = "text-file", visible_alias = "file", value_name = "FILE")]
    pub file: Option<std::path::PathBuf>,
    /// Parse special-token text such as <|im_start|> as the special token
    #[arg(long = "markup")]
    pub markup: bool,
    /// One token a line: its id and its text (llama-tokenize's output)
    #[arg(long = "show-pieces")]
    pub show_pieces: bool,
    /// Take TEXT literally, backslashes and all
    #[arg(long = "no-escape")]
    pub no_escape: bool,
}

// ---- pack --------------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
The sidecar sits beside the GGUF as MODEL.gguf.xwenpack, where `--ram-budget` runs find it and
use it when it matches the GGUF (its expert tensor table and a sample of their bytes): each
expert's gate, up and down then come in one read instead of three. Every record header is
checked on the read path; --verify also checks every record's crc32.

Examples:
  xwen pack moe.gguf
  xwen pack moe.gguf --verify")]
pub struct PackArgs {
    /// The MoE GGUF
    #[arg(value_name = "MODEL.gguf")]
    pub model: std::path::PathBuf,
    /// Where the sidecar goes (default: beside the GGUF, MODEL.gguf.xwenpack)
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
    /// Check an existing sidecar (every header and crc32) instead of writing one
    #[arg(long = "verify")]
    pub verify: bool,
}

// ---- plan / trace / replay ----------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  xwen plan -m moe.gguf                          # the floor and what an expert cache holds
  xwen plan -m moe.gguf --ram-budget 8G -c 8192 -np 4
  xwen plan -m moe.gguf --ram-budget auto --trace routes.jsonl")]
pub struct PlanArgs {
    /// GGUF path, a directory holding one GGUF, a checkpoint name or owner/repo[:QUANT]; none: the embedded demo model
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// Sequences the plan holds state for (a server's -np)
    #[arg(long = "parallel", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
    /// RAM a server keeps inside the budget for its prefix cache, in MiB (`xwen serve
    /// --cache-ram`; counted only under --ram-budget)
    #[arg(long = "cache-ram", value_name = "MIB", default_value_t = 0)]
    pub cache_ram: u64,
    /// A routing trace (`xwen trace`): the hit rate expected at the plan's cache size
    #[arg(long = "trace", value_name = "TRACE.jsonl")]
    pub trace: Option<std::path::PathBuf>,
    /// One JSON object instead of text
    #[arg(long = "json")]
    pub json: bool,
    /// The drafter the plan makes room for (a draft model, an MTP head's KV or sidecar)
    #[command(flatten)]
    pub draft: DraftOpts,
    #[command(flatten)]
    pub engine: EngineOpts,
}

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  xwen trace -m moe.gguf -p 'def quicksort(xs):' -n 256 -o routes.jsonl
  xwen trace -m moe.gguf -f prompt.txt -n 0 -o prefill-routes.jsonl")]
pub struct TraceArgs {
    /// GGUF path, a directory holding one GGUF, a checkpoint name or owner/repo[:QUANT]; none: the embedded demo model
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// The prompt text
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<std::path::PathBuf>,
    /// Tokens to generate greedily after the prompt
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub n_predict: u32,
    /// Where the trace goes (JSON lines)
    #[arg(short = 'o', long = "out", value_name = "TRACE.jsonl")]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub engine: EngineOpts,
}

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  xwen replay routes.jsonl
  xwen replay routes.jsonl --cache 10,25,50,75,90 --json")]
pub struct ReplayArgs {
    /// A routing trace written by `xwen trace`
    #[arg(value_name = "TRACE.jsonl")]
    pub trace: std::path::PathBuf,
    /// Shares of the model's experts cached, in percent
    #[arg(long = "cache", value_name = "PCT,..", default_value = "25,50,75", value_parser = opts::percent_list)]
    pub cache: opts::List,
    /// Also replay a GPU run's two tiers: a VRAM expert cache of these shares of the experts
    /// above a RAM cache of each --cache share (where each lookup is served: VRAM, RAM, disk;
    /// against Belady's optimum for the VRAM tier and for both tiers' room)
    #[arg(long = "vram", value_name = "PCT,..", value_parser = opts::percent_list)]
    pub vram: Option<opts::List>,
    /// One JSON object instead of a table
    #[arg(long = "json")]
    pub json: bool,
}

// ---- logits ------------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  xwen logits -m model.gguf --ids 1,2,3 --out logits.npy
  xwen logits -m moe.gguf --ids 1,2,3 --out logits.npy --dump-routes routes.jsonl
  xwen logits -m model.gguf --ids 1,2,3 --out logits.npy --dump-tensors xwen-dump

--dump-tensors writes each layer's named intermediates in llama.cpp's names (attn_norm-N, the
mixer's attn_output-N / linear_attn_out-N / kda_out-N / mla_out-N, attn_residual-N,
attn_post_norm-N, ffn_out-N, l_out-N, result_norm) as raw float32 DIR/NAME.bin with
DIR/index.txt (`NAME ne0 ne1 1 1`), the layout of tools/oracle/llama_dump.cpp's dumps;
tools/oracle/compare_dumps.py names the first one that differs.")]
pub struct LogitsArgs {
    /// GGUF path, a directory holding one GGUF, a checkpoint name or owner/repo[:QUANT]; none: the embedded demo model
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// The token ids (comma- or space-separated)
    #[arg(long = "ids", value_name = "IDS")]
    pub ids: String,
    /// Where the float32 logits go, shape [n_ids, n_vocab]
    #[arg(short = 'o', long = "out", value_name = "FILE.npy")]
    pub out: std::path::PathBuf,
    /// Also write every MoE routing decision, one JSON line per position and layer
    #[arg(long = "dump-routes", value_name = "FILE.jsonl")]
    pub dump_routes: Option<std::path::PathBuf>,
    /// Also write the named intermediate tensors of the forward into this directory
    #[arg(long = "dump-tensors", value_name = "DIR")]
    pub dump_tensors: Option<std::path::PathBuf>,
    /// Only the tensors whose name contains one of these (comma-separated; default: all)
    #[arg(long = "dump-filter", value_name = "NAMES", requires = "dump_tensors")]
    pub dump_filter: Option<String>,
    #[command(flatten)]
    pub engine: EngineOpts,
}

// ---- bench -------------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
-p 0 / -n 0 skip the prefill / decode test; t/s is the median ± sample stddev of the repetitions;
weights are paged in before the first test unless --no-prefault (llama.cpp populates its mapping).
--parallel (-npl) N,..: llama-batched-bench's test: N sequences each prefill -p tokens, then decode
-n tokens together; prints PP TG B N_KV T_PP S_PP T_TG S_TG S_TG/seq T S, or with --json its jsonl
fields (pl, pp, tg, speed_pp, speed_tg, speed, ...).
--draft KIND: each repetition decodes -n tokens greedily after the prompt (--draft-file,
--draft-prompt, else -p random tokens) plainly and then with the drafter; prints both rates, the
speedup, acceptance, tokens per step and acceptance by draft position (--json: the counts), and
fails if the drafted tokens ever differ from the plain ones. bench drafts only when asked.

Examples:
  xwen bench -m model.gguf                        # pp512 and tg128, 5 repetitions
  xwen bench -m model.gguf -p 512,2048 -n 0 --json
  xwen bench -m model.gguf -p 512 -n 128 -d 0,4096   # also at 4096 tokens of context
  xwen bench -m model.gguf --parallel 1,2,4,8 -p 128 -n 128
  xwen bench -m model.gguf --verify 1,2,4,8 -p 512   # speculative verify cost per depth
  xwen bench -m model.gguf --draft ngram --draft-file edit.txt -n 256 -r 3
  xwen bench --membw")]
pub struct BenchArgs {
    /// GGUF path, a directory holding one GGUF, a checkpoint name or owner/repo[:QUANT]
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// Prompt lengths to prefill (comma-separated; 0 skips; default 512, or 128 with --parallel)
    #[arg(short = 'p', long = "n-prompt", value_name = "N,..", allow_negative_numbers = true, value_parser = opts::count_list)]
    pub n_prompt: Option<opts::List>,
    /// Tokens to decode (comma-separated; 0 skips; default 128)
    #[arg(short = 'n', long = "n-gen", value_name = "N,..", allow_negative_numbers = true, value_parser = opts::count_list)]
    pub n_gen: Option<opts::List>,
    /// Context already in the sequence before each pp / tg test (comma-separated; llama-bench's
    /// -d: prefilled once per depth, untimed, and restored before every repetition)
    #[arg(short = 'd', long = "n-depth", value_name = "N,..", allow_negative_numbers = true, value_parser = opts::count_list)]
    pub n_depth: Option<opts::List>,
    /// Repetitions of each test (default 5, or 1 with --parallel)
    #[arg(short = 'r', long = "repetitions", value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub repetitions: Option<u32>,
    /// llama-batched-bench's test: numbers of sequences decoded together (also -npl)
    #[arg(long = "parallel", value_name = "N,..", allow_negative_numbers = true, value_parser = opts::parallel_list)]
    pub parallel: Option<opts::List>,
    /// The cost of a speculative verify of k tokens relative to one decode, for each k (k = 1 first)
    #[arg(long = "verify", value_name = "K,..", value_parser = opts::depth_list, conflicts_with = "parallel")]
    pub verify: Option<opts::List>,
    /// Skip the warm-up run before each test
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// Do not page the weights in before the first test
    #[arg(long = "no-prefault")]
    pub no_prefault: bool,
    /// llama-bench's `-o json` fields instead of a table
    #[arg(long = "json")]
    pub json: bool,
    /// Output format (llama-bench's -o)
    #[arg(short = 'o', long = "output", value_name = "FORMAT", value_parser = ["md", "json"])]
    pub output: Option<String>,
    /// With --draft: the prompt whose continuation is decoded, from a file (default: -p random tokens)
    #[arg(long = "draft-file", value_name = "FILE", conflicts_with = "draft_prompt")]
    pub draft_file: Option<String>,
    /// With --draft: the prompt whose continuation is decoded, as text
    #[arg(long = "draft-prompt", value_name = "TEXT")]
    pub draft_prompt: Option<String>,
    /// Measure memory read bandwidth instead of a model (the bound of decode)
    #[arg(long = "membw", conflicts_with = "model")]
    pub membw: bool,
    /// Buffer size of --membw in MiB
    #[arg(long = "membw-mib", value_name = "MIB", default_value_t = 512, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub membw_mib: u32,
    #[command(flatten)]
    pub draft: DraftOpts,
    #[command(flatten)]
    pub engine: EngineOpts,
}

// ---- synth -------------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Presets: qwen35moe-35b-a3b (~20.4 GB), qwen35-27b (~19.1 GB), qwen35-4b (~3.5 GB),
qwen3next-80b-a3b (~45 GB), kimi-linear-48b-a3b (~28 GB), qwen4exp-flash-next (~75 GB: 512
experts top-10, a 41B-parameter n-gram table) and qwen4exp-flash-next-scaled (~32 GB: the same
per-token work, 256 experts, a quarter of the table), qwen35moe-small and qwen3next-small,
kimi-linear-small, qwen4exp-small (~230-300 MB, nearly all routed experts: for --ram-budget
runs),
qwen35moe-tiny, qwen35-tiny, qwen3next-tiny, kimi-linear-tiny, qwen4exp-tiny (a few MB); the
small and tiny ones, and any whose vocabulary is smaller than Qwen3.5's, with a synthetic
byte-level vocabulary.

--random SEED draws a tiny geometry of --family instead (widths, heads, ratios, layer pattern,
rope, experts, tied embeddings, eps: the parity sweep of tools/oracle/random_sweep.sh) and
prints it; --mix sets the matrices' types (q4_k_m, random: a type per matrix, or one type:
f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs),
falling back as llama-quantize does where a row does not fit the type's blocks.

Examples:
  xwen synth --preset qwen35-4b --out qwen35-4b.gguf
  xwen synth --preset qwen35moe-small --out small.gguf --seed 7
  xwen synth --random 3 --family qwen35moe --mix random --out g.gguf")]
pub struct SynthArgs {
    /// Which checkpoint's geometry
    #[arg(long = "preset", value_name = "NAME", required_unless_present = "random", conflicts_with = "random")]
    pub preset: Option<xwen_synth::Preset>,
    /// Draw a random tiny geometry from this seed instead of a preset
    #[arg(long = "random", value_name = "SEED")]
    pub random: Option<u64>,
    /// The family of a --random geometry: qwen35, qwen35moe, qwen3next, kimi-linear, qwen4exp
    #[arg(long = "family", value_name = "ARCH", default_value = "qwen35", requires = "random")]
    pub family: xwen_synth::Family,
    /// Override a field of the geometry (n_embd=256, tied=false, rope_sections=11,11,10,0 ...; repeatable)
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// The matrices' types: q4_k_m (the official files' mix), random, or one type name
    #[arg(long = "mix", value_name = "MIX", default_value = "q4_k_m")]
    pub mix: String,
    /// The GGUF to write
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: std::path::PathBuf,
    /// A GGUF whose tokenizer to copy (default: tests/fixtures/vocab/ggml-vocab-qwen35.gguf when present)
    #[arg(long = "vocab", value_name = "VOCAB.gguf")]
    pub vocab: Option<std::path::PathBuf>,
    /// Seed of the random weights
    #[arg(long = "seed", value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Add an MTP (NextN) block after the trunk, as the official "-MTP" GGUFs carry (qwen35, qwen35moe; random weights: drafts it proposes are rarely accepted)
    #[arg(long = "mtp")]
    pub mtp: bool,
}

// ---- pull --------------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
MODEL is a .gguf path, Qwen3.6-27B | Qwen3.6-35B-A3B | Qwen3.8-27B, owner/repo (its Q4_K_M),
owner/repo:QUANT or owner/repo:FILE.gguf. HF_HUB_CACHE / HF_HOME place the cache, HF_TOKEN
authenticates, HF_HUB_OFFLINE=1 never touches the network.

Examples:
  xwen pull Qwen3.6-35B-A3B
  m=$(xwen pull unsloth/Qwen3.6-27B-GGUF:Q8_0) && xwen run -m \"$m\"")]
pub struct PullArgs {
    /// The model to resolve
    #[arg(value_name = "MODEL")]
    pub model: String,
}

// ---- completions -------------------------------------------------------------------------

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  xwen completions bash > ~/.local/share/bash-completion/completions/xwen
  xwen completions zsh > \"${fpath[1]}/_xwen\"
  xwen completions fish > ~/.config/fish/completions/xwen.fish")]
pub struct CompletionsArgs {
    /// The shell
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}
