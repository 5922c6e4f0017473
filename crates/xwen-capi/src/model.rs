//! Opening a model and what needs no generation: tokens, logits, the RAM plan.

use crate::{boundary, invalid, owned_string, put, slice, text, xwen_status, Failure, XWEN_ERR_BUFFER_TOO_SMALL};
use std::ffi::c_char;
use xwen_embed::{KvType, LoadOptions, Xwen};

/// A loaded model (opaque).
pub struct xwen_model {
    pub(crate) inner: Xwen,
}

/// How to open a model. Fill it with `xwen_load_options_init`, then change what you need.
#[repr(C)]
pub struct xwen_load_options {
    /// Compute threads; 0: every CPU.
    pub threads: u32,
    /// Positions per sequence; -1: 32768 or the model's trained context where smaller; 0: the
    /// trained context.
    pub ctx_size: i64,
    /// A hard RAM ceiling in bytes (MoE experts stream from disk under it); -1: none (every
    /// weight mapped); 0: 3/4 of what this process may use.
    pub ram_budget: i64,
    /// Read the file into memory instead of mapping it.
    pub no_mmap: bool,
    /// KV cache type of K and of V: "f16" (default), "f32" or "q8_0"; NULL: f16.
    pub kv_type_k: *const c_char,
    pub kv_type_v: *const c_char,
    /// A chat template (Jinja source) to use instead of the file's own; NULL: the file's.
    pub chat_template: *const c_char,
    /// Sequences `xwen_generate_batch` decodes at once (the RAM plan holds their state); 0: 1.
    pub parallel: u32,
}

/// Defaults: what `xwen run` does with no flags. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn xwen_load_options_init(opts: *mut xwen_load_options) -> xwen_status {
    boundary(|| {
        let d = xwen_load_options { threads: 0, ctx_size: -1, ram_budget: -1, no_mmap: false, kv_type_k: std::ptr::null(), kv_type_v: std::ptr::null(), chat_template: std::ptr::null(), parallel: 0 };
        put(opts, d, "opts")
    })
}

pub(crate) unsafe fn load_options(o: *const xwen_load_options) -> Result<LoadOptions, Failure> {
    let Some(o) = o.as_ref() else { return Ok(LoadOptions::default()) };
    let kv = |p: *const c_char, what: &str| -> Result<KvType, Failure> {
        if p.is_null() {
            return Ok(KvType::F16);
        }
        text(p, what)?.parse::<KvType>().map_err(invalid)
    };
    let size = |v: i64, what: &str| -> Result<Option<u64>, Failure> {
        match v {
            -1 => Ok(None),
            v if v >= 0 => Ok(Some(v as u64)),
            _ => Err(invalid(format!("{what} must be -1 or at least 0"))),
        }
    };
    Ok(LoadOptions {
        threads: (o.threads > 0).then_some(o.threads as usize),
        ctx_size: size(o.ctx_size, "ctx_size")?.map(|c| c.min(usize::MAX as u64) as usize),
        ram_budget: size(o.ram_budget, "ram_budget")?,
        no_mmap: o.no_mmap,
        kv_types: Some((kv(o.kv_type_k, "kv_type_k")?, kv(o.kv_type_v, "kv_type_v")?)),
        chat_template: if o.chat_template.is_null() { None } else { Some(text(o.chat_template, "chat_template")?.to_string()) },
        parallel: o.parallel as usize,
    })
}

/// Opens a model: a GGUF path, an official checkpoint's name or `owner/repo[:FILE]` (looked up
/// in the Hugging Face cache, downloaded on a miss), or NULL for the embedded demo model
/// (tiny-qwen35, what `xwen run` runs with no -m). `opts` NULL: defaults. On success `*out`
/// holds the model, to free with `xwen_model_free`. Thread-safe (loads are independent).
#[no_mangle]
pub unsafe extern "C" fn xwen_model_load(path_or_name: *const c_char, opts: *const xwen_load_options, out: *mut *mut xwen_model) -> xwen_status {
    boundary(|| {
        let name = if path_or_name.is_null() { None } else { Some(text(path_or_name, "path_or_name")?) };
        let opts = load_options(opts)?;
        if out.is_null() {
            return Err(invalid("out is null"));
        }
        let m = Xwen::load(name, &opts)?;
        put(out, Box::into_raw(Box::new(xwen_model { inner: m })), "out")
    })
}

/// Frees a model; null is ignored. No other call may be using it (not thread-safe with them).
#[no_mangle]
pub unsafe extern "C" fn xwen_model_free(model: *mut xwen_model) {
    if !model.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(Box::from_raw(model))));
    }
}

pub(crate) unsafe fn model_ref<'a>(m: *const xwen_model) -> Result<&'a Xwen, Failure> {
    m.as_ref().map(|m| &m.inner).ok_or_else(|| invalid("model is null"))
}

/// What the model is, as a JSON object (`name`, `architecture`, `n_vocab`, `context`,
/// `eos_ids`, `has_chat_template`, `is_demo`, `weight_bytes`, `threads`, `load_secs`), into
/// `*out_json` (free it with `xwen_string_free`). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn xwen_model_info_json(model: *const xwen_model, out_json: *mut *mut c_char) -> xwen_status {
    boundary(|| {
        let i = model_ref(model)?.info();
        let v = serde_json::json!({
            "name": i.name, "architecture": i.architecture, "n_vocab": i.n_vocab, "context": i.context,
            "eos_ids": i.eos_ids, "has_chat_template": i.has_chat_template, "is_demo": i.is_demo,
            "weight_bytes": i.weight_bytes, "threads": i.threads, "load_secs": i.load_secs,
        });
        put(out_json, owned_string(v.to_string()), "out_json")
    })
}

/// The vocabulary's size (the width of a logits row) into `*out`. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn xwen_model_n_vocab(model: *const xwen_model, out: *mut usize) -> xwen_status {
    boundary(|| put(out, model_ref(model)?.info().n_vocab, "out"))
}

/// Token ids of `len` bytes of UTF-8 `text` (no BOS/EOS added) into `ids` (room for `cap`);
/// `*n_ids` gets the count. With `markup` false, special-token spellings such as `<|im_start|>`
/// stay text; true makes them their ids. `XWEN_ERR_BUFFER_TOO_SMALL`: `*n_ids` is the count
/// needed and `ids` is untouched. Thread-safe, also beside a running generation.
#[no_mangle]
pub unsafe extern "C" fn xwen_tokenize(model: *const xwen_model, text: *const c_char, len: usize, markup: bool, ids: *mut u32, cap: usize, n_ids: *mut usize) -> xwen_status {
    boundary(|| {
        let m = model_ref(model)?;
        let bytes = slice(text.cast::<u8>(), len, "text")?;
        let s = std::str::from_utf8(bytes).map_err(|_| invalid("text is not UTF-8"))?;
        let toks = m.tokenize(s, markup);
        put(n_ids, toks.len(), "n_ids")?;
        if toks.len() > cap {
            return Err(Failure(XWEN_ERR_BUFFER_TOO_SMALL, format!("{} tokens need room for {}, ids has {cap}", toks.len(), toks.len())));
        }
        if !toks.is_empty() {
            if ids.is_null() {
                return Err(invalid("ids is null"));
            }
            std::ptr::copy_nonoverlapping(toks.as_ptr(), ids, toks.len());
        }
        Ok(())
    })
}

/// The text of `n` token ids into `*out_text` (NUL-terminated UTF-8; bytes that are not UTF-8
/// become U+FFFD; free it with `xwen_string_free`). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn xwen_detokenize(model: *const xwen_model, ids: *const u32, n: usize, out_text: *mut *mut c_char) -> xwen_status {
    boundary(|| {
        let m = model_ref(model)?;
        let s = m.detokenize(slice(ids, n, "ids")?)?;
        put(out_text, owned_string(s), "out_text")
    })
}

/// Float32 logits after `n` token ids from an empty state: the last position's (`n_vocab`
/// values) or, with `all`, every position's row by row (`n × n_vocab`), into `out` (room for
/// `cap` floats); `*n_out` gets the count (the count needed on `XWEN_ERR_BUFFER_TOO_SMALL`,
/// which computes nothing). Thread-safe; takes turns with other computation on the model.
#[no_mangle]
pub unsafe extern "C" fn xwen_logits(model: *const xwen_model, ids: *const u32, n: usize, all: bool, out: *mut f32, cap: usize, n_out: *mut usize) -> xwen_status {
    boundary(|| {
        let m = model_ref(model)?;
        let ids = slice(ids, n, "ids")?;
        let need = if all { n * m.info().n_vocab } else { m.info().n_vocab };
        put(n_out, need, "n_out")?;
        if need > cap {
            return Err(Failure(XWEN_ERR_BUFFER_TOO_SMALL, format!("the logits need room for {need} floats, out has {cap}")));
        }
        let v = m.logits(ids, all)?;
        if out.is_null() {
            return Err(invalid("out is null"));
        }
        std::ptr::copy_nonoverlapping(v.as_ptr(), out, v.len());
        Ok(())
    })
}

/// The RAM plan the model runs under (or would need without a budget), as a JSON object of
/// byte counts (`floor_bytes`, `trunk_bytes`, `state_bytes`, `scratch_bytes`,
/// `expert_cache_bytes`, ... as `xwen plan --json`), into `*out_json` (free it with
/// `xwen_string_free`). Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn xwen_model_plan_json(model: *const xwen_model, out_json: *mut *mut c_char) -> xwen_status {
    boundary(|| {
        let p = model_ref(model)?.plan()?;
        put(out_json, owned_string(xwen_embed::plan_json(&p).to_string()), "out_json")
    })
}

/// The RAM plan of a model that is not loaded (`path_or_name` as `xwen_model_load`, NULL: the
/// demo model), as `xwen_model_plan_json` gives it; the file is read, not run. A budget under
/// the plan's floor is `XWEN_ERR_INVALID_ARGUMENT`, its message naming the parts. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn xwen_plan_json(path_or_name: *const c_char, opts: *const xwen_load_options, out_json: *mut *mut c_char) -> xwen_status {
    boundary(|| {
        let name = if path_or_name.is_null() { None } else { Some(text(path_or_name, "path_or_name")?) };
        let p = xwen_embed::plan(name, &load_options(opts)?)?;
        put(out_json, owned_string(xwen_embed::plan_json(&p).to_string()), "out_json")
    })
}
