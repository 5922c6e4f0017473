//! Opening a model: a path, a checkpoint name (the Hugging Face cache, downloaded on a miss), or
//! the embedded demo model; the context size as `xwen run` settles it; the tokenizer, the chat
//! template and its reply markup.

use crate::error::{Error, Result};
use crate::Xwen;
use std::sync::{Arc, Mutex};
use xwen_chat::reply::{CallSyntax, KIMI_CALL_OPEN};
use xwen_chat::{ChatTemplate, Tokenizer};
use xwen_engine::{EngineConfig, KvType, Model};
use xwen_gguf::GgufFile;

/// The largest context a caller may ask for (the CLI's `-c` limit): 16M positions.
pub const MAX_CTX: usize = 1 << 24;

/// How to open a model. `Default` is what `xwen run` does with no flags.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Compute threads; None: every CPU.
    pub threads: Option<usize>,
    /// Positions per sequence. None: 32768, or the model's trained context where that is
    /// smaller; Some(0): the trained context.
    pub ctx_size: Option<usize>,
    /// A hard RAM ceiling in bytes (MoE experts then stream from disk); Some(0): 3/4 of what
    /// this process may use; None: every weight mapped.
    pub ram_budget: Option<u64>,
    /// Read the file into memory instead of mapping it.
    pub no_mmap: bool,
    /// KV cache element types (K, V); None: f16 for both, as llama.cpp.
    pub kv_types: Option<(KvType, KvType)>,
    /// A chat template (Jinja source) to use instead of the file's own.
    pub chat_template: Option<String>,
    /// Sequences generated at once (`Xwen::generate_batch`): the RAM plan holds their state.
    /// 0 or 1: one.
    pub parallel: usize,
}

impl LoadOptions {
    /// The engine configuration these options ask for, before the file's trained context is
    /// known (`settle_context`).
    pub fn engine_config(&self) -> Result<EngineConfig> {
        let mut cfg = EngineConfig::default();
        if let Some(t) = self.threads {
            if t == 0 {
                return Err(Error::InvalidArgument("threads must be at least 1 (None: every CPU)".into()));
            }
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            cfg.threads = t.min(cpus);
        }
        if let Some(c) = self.ctx_size {
            if c > MAX_CTX {
                return Err(Error::InvalidArgument(format!("ctx_size {c} is over the largest, {MAX_CTX}")));
            }
            cfg.max_ctx = c;
        }
        cfg.ram_budget = self.ram_budget;
        if let Some(kv) = self.kv_types {
            cfg.kv_types = kv;
        }
        cfg.n_seq = self.parallel.max(1);
        // nothing drafts here: a budget does not pay for an MTP head's KV
        cfg.load_mtp = false;
        Ok(cfg)
    }
}

/// The context a run gets, as `xwen run` settles it: 0 asks for the trained context, the default
/// stops at it, an explicit size beyond it is kept.
pub(crate) fn settle_context(cfg: &mut EngineConfig, asked: Option<usize>, file: &GgufFile) {
    let trained = file.architecture().and_then(|a| file.get_u64(&format!("{a}.context_length")));
    match (asked, trained) {
        (Some(0), Some(t)) => cfg.max_ctx = usize::try_from(t).unwrap_or(MAX_CTX).min(MAX_CTX),
        (Some(0), None) => cfg.max_ctx = EngineConfig::default().max_ctx,
        (None, Some(t)) if cfg.max_ctx as u64 > t && t > 0 => cfg.max_ctx = t as usize,
        _ => {}
    }
}

/// The file behind `path_or_name` (None: the demo model), and whether it is the demo.
pub(crate) fn open_file(path_or_name: Option<&str>, cfg: &EngineConfig, no_mmap: bool) -> Result<(GgufFile, Option<std::path::PathBuf>)> {
    let Some(m) = path_or_name else {
        let f = GgufFile::from_bytes(crate::demo::DEMO_GGUF.to_vec()).map_err(|e| Error::Load(format!("the embedded demo model: {e}")))?;
        return Ok((f, None));
    };
    let path = xwen_hub::hub::resolve(m).map_err(|e| Error::Load(format!("{e:#}")))?;
    let shown = path.display().to_string();
    let file = if no_mmap {
        let bytes = std::fs::read(&path).map_err(|e| Error::Load(format!("{shown}: {e}")))?;
        GgufFile::from_bytes(bytes).map_err(|e| Error::Load(format!("{shown}: {e}")))?
    } else {
        Model::open_file(&path, cfg).map_err(|e| Error::Load(format!("{shown}: {e}")))?
    };
    Ok((file, Some(path)))
}

impl Xwen {
    /// Opens a model: a GGUF path, an official checkpoint's name or `owner/repo[:FILE]` (looked
    /// up in the Hugging Face cache and downloaded on a miss), or with None the embedded demo
    /// model. Nothing is printed.
    pub fn load(path_or_name: Option<&str>, opts: &LoadOptions) -> Result<Xwen> {
        let t0 = std::time::Instant::now();
        let mut cfg = opts.engine_config()?;
        let (file, path) = open_file(path_or_name, &cfg, opts.no_mmap)?;
        settle_context(&mut cfg, opts.ctx_size, &file);
        let file = Arc::new(file);
        let tok = Tokenizer::from_gguf(&file)?;
        let template = match &opts.chat_template {
            Some(src) => Some(ChatTemplate::new(src)?),
            None => ChatTemplate::from_gguf(&file)?,
        };
        let model = Model::from_gguf_at(file, path.as_deref(), &cfg).map_err(|e| Error::Load(e.to_string()))?;
        let syntax = CallSyntax::detect(template.as_ref(), tok.token_id(KIMI_CALL_OPEN).is_some());
        Ok(Xwen {
            model: Arc::new(model),
            tok,
            template,
            syntax,
            is_demo: path_or_name.is_none(),
            cfg,
            compute: Mutex::new(()),
            computing_on: Mutex::new(None),
            load_secs: t0.elapsed().as_secs_f64(),
        })
    }

    /// The embedded demo model with default options.
    pub fn demo() -> Result<Xwen> {
        Xwen::load(None, &LoadOptions::default())
    }
}
