//! `xwen run`: complete a prompt (raw text or token ids) and stream the continuation.

use crate::args::Args;
use crate::model_arg;
use anyhow::{bail, Result};
use std::io::Write;
use xwen_engine::{generate, GenerateRequest, Sampler, SamplerConfig};

pub fn sampler_config(a: &mut Args) -> Result<SamplerConfig> {
    Ok(SamplerConfig {
        temperature: a.parsed(&["--temp", "--temperature"])?,
        top_k: a.parsed(&["--top-k"])?,
        top_p: a.parsed(&["--top-p"])?,
        min_p: a.parsed(&["--min-p"])?,
        repeat_penalty: a.parsed(&["--repeat-penalty"])?,
        presence_penalty: a.parsed(&["--presence-penalty"])?,
        frequency_penalty: a.parsed(&["--frequency-penalty"])?,
        penalty_last_n: a.parsed(&["--repeat-last-n"])?,
        logit_bias: Vec::new(),
        seed: a.parsed(&["--seed", "-s"])?,
    })
}

pub fn run(argv: &[String]) -> Result<()> {
    let mut a = Args::new(argv);
    let model = a.value(&["-m", "--model"])?;
    let prompt = a.value(&["-p", "--prompt"])?;
    let ids = a.value(&["--ids"])?;
    let n: usize = a.parsed(&["-n", "--n-predict"])?.unwrap_or(64);
    let print_ids = a.flag(&["--print-ids"]);
    let no_think = a.flag(&["--no-think"]);
    let quiet = a.flag(&["-q", "--quiet"]);
    let mut scfg = sampler_config(&mut a)?;
    let cfg = model_arg::engine_config(&mut a)?;
    let rest = a.finish()?;
    if !rest.is_empty() {
        bail!("unexpected argument `{}`", rest[0]);
    }
    if model.is_none() && !quiet {
        eprintln!("{}", model_arg::DEMO_NOTE);
    }
    let loaded = model_arg::load(model.as_deref(), &cfg, quiet)?;
    if !quiet {
        eprintln!(
            "xwen: loaded {} ({}) in {:.2}s: {:.1} MiB of weights (memory-mapped), {} threads",
            loaded.model.name().unwrap_or("model"),
            loaded.model.architecture(),
            loaded.load_secs,
            loaded.model.weight_bytes() as f64 / (1 << 20) as f64,
            loaded.model.threads()
        );
    }
    let tok = &loaded.tokenizer;
    let prompt = match (&prompt, &ids) {
        (None, None) if loaded.is_demo => Some("def fibonacci(n):\n".to_string()),
        _ => prompt,
    };
    let prompt_ids = match (&prompt, &ids) {
        (Some(_), Some(_)) => bail!("give either -p TEXT or --ids, not both"),
        (_, Some(s)) => model_arg::parse_ids(s)?,
        (Some(p), None) => tok.encode(p),
        (None, None) => bail!("no prompt: give -p TEXT or --ids 1,2,3"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    // The demo is a code model: greedy unless asked otherwise.
    if loaded.is_demo && scfg.temperature.is_none() {
        scfg.temperature = Some(0.0);
    }
    let mut sampler = Sampler::new(scfg.resolve(!no_think));
    let mut state = loaded.model.new_state();
    let stop = tok.eos_ids();
    let mut out = std::io::stdout().lock();
    let mut generated = Vec::new();
    let mut dec = xwen_chat::StreamDecoder::new();
    if let (false, Some(p)) = (print_ids, &prompt) {
        write!(out, "{p}")?;
    }
    let req = GenerateRequest { prompt: &prompt_ids, max_tokens: n, stop_ids: &stop };
    let stats = generate(&loaded.model, &mut state, &req, &mut sampler, &mut |t| {
        generated.push(t);
        if !print_ids && !stop.contains(&t) {
            let s = dec.push(tok, t);
            let _ = write!(out, "{s}");
            let _ = out.flush();
        }
        true
    })?;
    if print_ids {
        let s: Vec<String> = generated.iter().map(|t| t.to_string()).collect();
        writeln!(out, "{}", s.join(" "))?;
    } else {
        writeln!(out, "{}", dec.finish())?;
    }
    if !quiet {
        eprintln!(
            "xwen: prefill {} tok at {:.1} tok/s, decode {} tok at {:.1} tok/s",
            stats.prompt_tokens,
            stats.prefill_tps(),
            stats.generated,
            stats.decode_tps()
        );
    }
    model_arg::print_profile(&loaded.model);
    if !quiet {
        model_arg::print_expert_cache(&loaded.model);
    }
    Ok(())
}
