//! `xwen inspect FILE [--json] [--tensors]`: what a GGUF file holds — architecture,
//! hyperparameters, every metadata key, special tokens, tensors grouped by type (and each one) — and roughly how much memory running it takes.
//!
//! `--json` prints one object: `architecture`, `name`, `version`, `alignment`, `file_type`,
//! `file_bytes`, `data_offset`, `tensor_count`, `tensor_bytes`, `metadata` (key → value),
//! `tensor_types` (type → {count, bytes}), `memory_estimate`, `ram_budget_floor_bytes`,
//! `vram_bytes` (what `-ngl 99` holds on the device; null where the CUDA backend cannot say: a
//! build without it, an architecture it does not run), and `tensors` (array of
//! {name, type, shape, offset, bytes}; offset relative to the data section). Metadata arrays of
//! more than 64 elements become `{"type": element type, "len": N, "head": [first 16]}`; numbers
//! that JSON cannot hold (NaN, ±inf) become null.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use serde_json::{json, Map, Value as Json};
use xwen_engine::memory_plan::human_bytes;
use xwen_gguf::{GgufError, GgufFile, Value};

use crate::cli::InspectArgs;

const JSON_ARRAY_MAX: usize = 64;
const JSON_ARRAY_HEAD: usize = 16;
const TEXT_ARRAY_HEAD: usize = 6;
const TEXT_STR_MAX: usize = 72;
/// Context length the memory estimate is quoted at (capped by the model's own).
const ESTIMATE_CTX: u64 = 4096;

pub fn run(a: InspectArgs) -> Result<()> {
    let file = a.file.clone().or_else(|| a.model.clone()).ok_or_else(|| anyhow!("no model file given (xwen inspect FILE, or -m FILE)"))?;
    let path = file.display().to_string();
    if file.is_dir() {
        anyhow::bail!("{path} is a directory, not a GGUF file");
    }
    let f = GgufFile::open(&file).map_err(|e| match e {
        GgufError::Open { .. } => anyhow!("{e}"),
        _ => anyhow!("{path}: {e}"),
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&f))?);
    } else {
        print!("{}", to_text(&path, &f));
        if a.tensors {
            print!("{}", tensor_table(&f));
        }
    }
    Ok(())
}

/// The named special tokens llama.cpp reads (`tokenizer.ggml.*_token_id`), as
/// (name, id, text), in llama.cpp's order.
const SPECIAL_KEYS: &[&str] = &["bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "cls", "mask", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"];

fn special_tokens(f: &GgufFile) -> Vec<(&'static str, u64, Option<String>)> {
    let texts = f.get_array("tokenizer.ggml.tokens");
    SPECIAL_KEYS
        .iter()
        .filter_map(|k| {
            let id = f.get_u64(&format!("tokenizer.ggml.{k}_token_id"))?;
            let text = texts.and_then(|t| t.get(id as usize)).and_then(Value::as_str).map(str::to_string);
            Some((*k, id, text))
        })
        .collect()
}

/// The control tokens (token type 3: chat markup such as `<|im_start|>`), as (id, text).
fn control_tokens(f: &GgufFile) -> Vec<(usize, String)> {
    let (Some(texts), Some(types)) = (f.get_array("tokenizer.ggml.tokens"), f.get_array("tokenizer.ggml.token_type")) else {
        return Vec::new();
    };
    types.iter().enumerate().filter(|(_, t)| matches!(t, Value::I32(3) | Value::U32(3))).filter_map(|(i, _)| Some((i, texts.get(i)?.as_str()?.to_string()))).collect()
}

fn special_text(f: &GgufFile) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let named = special_tokens(f);
    let control = control_tokens(f);
    if named.is_empty() && control.is_empty() {
        return o;
    }
    let _ = writeln!(o, "\nspecial tokens:");
    for (name, id, text) in &named {
        let _ = writeln!(o, "  {name:<10} {id:>7}  {}", text.as_deref().map_or("(no such token)".to_string(), |t| format!("{t:?}")));
    }
    if let Some(b) = f.get_bool("tokenizer.ggml.add_bos_token") {
        let _ = writeln!(o, "  add_bos    {b}");
    }
    if !control.is_empty() {
        let list: Vec<String> = control.iter().map(|(i, t)| format!("{i} {t}")).collect();
        let _ = writeln!(o, "  control tokens ({}): {}", control.len(), list.join(", "));
    }
    o
}

/// `--tensors`: one line per tensor, in file order.
fn tensor_table(f: &GgufFile) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let w = f.tensors().iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(o, "\ntensors:\n  {:<w$} {:<7} {:<24} {:>14} {:>14}", "name", "type", "shape", "bytes", "offset");
    for t in f.tensors() {
        let shape = t.dims.iter().map(u64::to_string).collect::<Vec<_>>().join(" x ");
        let _ = writeln!(o, "  {:<w$} {:<7} {:<24} {:>14} {:>14}", t.name, t.ty.name(), shape, t.n_bytes, t.offset);
    }
    o
}

/// llama.cpp's `general.file_type` (enum llama_ftype) names.
fn file_type_name(ft: u64) -> &'static str {
    match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        39 => "NVFP4",
        40 => "Q1_0",
        41 => "Q2_0",
        _ => "unknown",
    }
}

/// Memory for one sequence: weights as stored, an f16 KV cache (the default, as llama.cpp's) for the
/// full-attention layers and the f32 recurrent state (conv + delta-rule matrix) of the
/// linear-attention layers, from the `{arch}.*` hyperparameters. Compute scratch and the
/// tokenizer are not counted.
struct MemoryEstimate {
    n_ctx: u64,
    attn_layers: u64,
    recurrent_layers: u64,
    kv_bytes_per_token: u64,
    recurrent_bytes: u64,
    tensor_bytes: u64,
}

impl MemoryEstimate {
    /// For an architecture xwen runs, the registry's own figures (its state shapes: MLA's latent
    /// K/V, KDA's per-channel state, ...); for any other GGUF, a reading of the common keys.
    fn of(f: &GgufFile) -> MemoryEstimate {
        Self::from_registry(f).unwrap_or_else(|| Self::from_keys(f))
    }

    fn from_registry(f: &GgufFile) -> Option<MemoryEstimate> {
        use xwen_engine::state::LayerState;
        let loaded = xwen_engine::models::load(f).ok()?;
        let n_ctx = f.get_u64(&f.arch_key("context_length")).unwrap_or(ESTIMATE_CTX).min(ESTIMATE_CTX);
        let f16 = (xwen_engine::KvType::F16, xwen_engine::KvType::F16);
        let at = |ctx: u64| loaded.net.plan_figures(ctx as usize, f16).state_bytes;
        let (none, full) = (at(0), at(n_ctx));
        let layers = loaded.net.new_state().layers;
        let attn_layers = layers.iter().filter(|l| matches!(l, LayerState::Attn(_))).count() as u64;
        Some(MemoryEstimate {
            n_ctx,
            attn_layers,
            recurrent_layers: layers.len() as u64 - attn_layers,
            kv_bytes_per_token: full.saturating_sub(none) / n_ctx.max(1),
            recurrent_bytes: none,
            tensor_bytes: f.tensor_bytes(),
        })
    }

    fn from_keys(f: &GgufFile) -> MemoryEstimate {
        let hp = |s: &str| f.get_u64(&f.arch_key(s));
        let n_layer = hp("block_count").unwrap_or(0);
        // Hybrid models list which layers are recurrent; otherwise a full-attention interval, or
        // with no SSM keys at all, every layer attends.
        let recurrent_layers = match f.get_array(&f.arch_key("attention.recurrent_layers")) {
            Some(flags) => flags.iter().filter(|v| v.as_bool() == Some(true)).count() as u64,
            None => match (hp("full_attention_interval"), hp("ssm.state_size")) {
                (Some(i), _) if i > 0 => n_layer - n_layer / i,
                (_, Some(_)) => n_layer,
                _ => 0,
            },
        };
        let attn_layers = n_layer.saturating_sub(recurrent_layers);
        let n_head = hp("attention.head_count").unwrap_or(1).max(1);
        let n_head_kv = hp("attention.head_count_kv").unwrap_or(n_head);
        let default_head_dim = hp("embedding_length").unwrap_or(0) / n_head;
        let k_len = hp("attention.key_length").unwrap_or(default_head_dim);
        let v_len = hp("attention.value_length").unwrap_or(default_head_dim);
        // K and V in f16 (the default; `-ctk f32 -ctv f32 -fa off` doubles this)
        let kv_bytes_per_token = attn_layers * n_head_kv * (k_len + v_len) * 2;
        let (d_state, inner) = (hp("ssm.state_size").unwrap_or(0), hp("ssm.inner_size").unwrap_or(0));
        let conv_channels = inner + 2 * hp("ssm.group_count").unwrap_or(0) * d_state;
        let conv = hp("ssm.conv_kernel").unwrap_or(1).saturating_sub(1) * conv_channels * 4;
        let delta = d_state * inner * 4;
        let n_ctx = hp("context_length").unwrap_or(ESTIMATE_CTX).min(ESTIMATE_CTX);
        MemoryEstimate { n_ctx, attn_layers, recurrent_layers, kv_bytes_per_token, recurrent_bytes: recurrent_layers * (conv + delta), tensor_bytes: f.tensor_bytes() }
    }

    fn total(&self) -> u64 {
        self.tensor_bytes + self.kv_bytes_per_token * self.n_ctx + self.recurrent_bytes
    }

    fn to_json(&self) -> Json {
        json!({
            "n_ctx": self.n_ctx,
            "attention_layers": self.attn_layers,
            "recurrent_layers": self.recurrent_layers,
            "tensor_bytes": self.tensor_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes": self.kv_bytes_per_token * self.n_ctx,
            "recurrent_state_bytes": self.recurrent_bytes,
            "total_bytes": self.total(),
            "method": "tensor bytes + f16 K/V (the default cache type) for attention layers at n_ctx + f32 conv and delta-rule state of recurrent layers, one sequence, compute scratch excluded",
        })
    }
}

fn tensor_types(f: &GgufFile) -> BTreeMap<&'static str, (u64, u64)> {
    let mut by_type: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    for t in f.tensors() {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    by_type
}

// ---- text -------------------------------------------------------------------------------

fn short_str(s: &str) -> String {
    if s.chars().count() <= TEXT_STR_MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(TEXT_STR_MAX).collect();
        format!("{head:?}… ({} bytes)", s.len())
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::Str(s) => short_str(s),
        Value::Array(items) => {
            let elem = items.first().map_or("?", Value::type_name);
            let head: Vec<String> = items.iter().take(TEXT_ARRAY_HEAD).map(value_text).collect();
            if items.len() <= TEXT_ARRAY_HEAD {
                format!("[{}]", head.join(", "))
            } else {
                format!("[{elem}; {}] {}, …", items.len(), head.join(", "))
            }
        }
        Value::U8(x) => x.to_string(),
        Value::I8(x) => x.to_string(),
        Value::U16(x) => x.to_string(),
        Value::I16(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        Value::Bool(x) => x.to_string(),
    }
}

fn to_text(path: &str, f: &GgufFile) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let arch = f.architecture().unwrap_or("(none)");
    let ft = f.get_u64("general.file_type");
    let _ = writeln!(o, "file:          {path} ({})", human_bytes(f.file_len()));
    let _ = writeln!(o, "architecture:  {arch}");
    let _ = writeln!(o, "name:          {}", f.get_str("general.name").unwrap_or("(none)"));
    let ft_text = ft.map_or("(not stated)".to_string(), |ft| format!("{} ({ft})", file_type_name(ft)));
    let _ = writeln!(o, "file type:     {ft_text}");
    let _ = writeln!(o, "GGUF version:  {} (alignment {}, tensor data at offset {})", f.version(), f.alignment(), f.data_offset());
    let _ = writeln!(o, "tensors:       {}", f.tensors().len());

    let prefix = format!("{arch}.");
    let _ = writeln!(o, "\nhyperparameters ({prefix}*):");
    for (k, v) in f.metadata().iter().filter(|(k, _)| k.starts_with(&prefix)) {
        let _ = writeln!(o, "  {:<40} {}", &k[prefix.len()..], value_text(v));
    }

    let _ = writeln!(o, "\nmetadata ({} keys):", f.metadata().len());
    for (k, v) in f.metadata() {
        let ty = match v.as_array() {
            Some(items) => format!("arr[{}]", items.first().map_or("?", Value::type_name)),
            None => v.type_name().to_string(),
        };
        let _ = writeln!(o, "  {k}: {ty} = {}", value_text(v));
    }

    let _ = writeln!(o, "\ntensors by type:");
    let _ = writeln!(o, "  {:<8} {:>7} {:>16} {:>12}", "type", "count", "bytes", "");
    for (ty, (count, bytes)) in tensor_types(f) {
        let _ = writeln!(o, "  {ty:<8} {count:>7} {bytes:>16} {:>12}", human_bytes(bytes));
    }
    let total = f.tensor_bytes();
    let _ = writeln!(o, "  {:<8} {:>7} {total:>16} {:>12}", "total", f.tensors().len(), human_bytes(total));

    o += &special_text(f);

    let m = MemoryEstimate::of(f);
    let _ = writeln!(
        o,
        "\nmemory a run needs ≈ {} = tensors {} + KV cache {} ({} attention layers × {} B/token × n_ctx {}, f16; an f32 cache doubles it) + recurrent state {} ({} layers, f32); one sequence, compute scratch not included",
        human_bytes(m.total()),
        human_bytes(m.tensor_bytes),
        human_bytes(m.kv_bytes_per_token * m.n_ctx),
        m.attn_layers,
        m.kv_bytes_per_token / m.attn_layers.max(1),
        m.n_ctx,
        human_bytes(m.recurrent_bytes),
        m.recurrent_layers,
    );
    match crate::gpu::vram_estimate(f, m.n_ctx as usize) {
        Ok(b) => {
            let _ = writeln!(o, "on a GPU (-ngl 99) ≈ {} on the device at n_ctx {} (weights as stored, KV caches f16, recurrent states, scratch)", human_bytes(b), m.n_ctx);
        }
        Err(why) => {
            let _ = writeln!(o, "on a GPU (-ngl 99): no estimate ({why})");
        }
    }
    if let Some(p) = streaming_plan(f, m.n_ctx) {
        let _ = writeln!(
            o,
            "with --ram-budget the routed experts ({}) stream from disk: the smallest budget is {} at n_ctx {} (trunk {} + state {} + scratch {} + experts in flight {} + smallest cache {}); one token's experts take {}",
            human_bytes(p.all_experts_bytes),
            human_bytes(p.floor()),
            m.n_ctx,
            human_bytes(p.trunk_bytes),
            human_bytes(p.state_bytes),
            human_bytes(p.scratch_bytes),
            human_bytes(p.in_flight_bytes),
            human_bytes(p.min_cache_bytes),
            human_bytes(p.token_set_bytes),
        );
    }
    o
}

/// xwen's RAM plan for a MoE model it can run, with every expert cacheable (what the floor
/// and the expert sizes are); None for other files.
fn streaming_plan(f: &GgufFile, n_ctx: u64) -> Option<xwen_engine::MemoryPlan> {
    let xwen_engine::models::Loaded { net, experts } = xwen_engine::models::load(f).ok()?;
    experts.iter().any(|e| e.is_some()).then_some(())?;
    xwen_engine::MemoryPlan::new(
        f,
        &net.plan_figures(n_ctx as usize, (xwen_engine::KvType::F16, xwen_engine::KvType::F16)),
        &experts,
        &net.row_tables(),
        n_ctx as usize,
        1,
        u64::MAX,
        xwen_engine::Reserved::default(),
        None,
    )
    .ok()
}

// ---- json -------------------------------------------------------------------------------

fn value_json(v: &Value) -> Json {
    match v {
        Value::Array(items) if items.len() > JSON_ARRAY_MAX => json!({
            "type": items.first().map_or("?", Value::type_name),
            "len": items.len(),
            "head": items.iter().take(JSON_ARRAY_HEAD).map(value_json).collect::<Vec<_>>(),
        }),
        Value::Array(items) => Json::Array(items.iter().map(value_json).collect()),
        Value::Str(s) => json!(s),
        Value::Bool(b) => json!(b),
        // Through its shortest decimal, so 1e-6f32 prints as 1e-6, not 9.999999974752427e-7.
        Value::F32(x) => json!(x.to_string().parse::<f64>().ok().filter(|v| v.is_finite())),
        Value::F64(x) => json!(x),
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
    }
}

fn to_json(f: &GgufFile) -> Json {
    let estimate = MemoryEstimate::of(f);
    let metadata: Map<String, Json> = f.metadata().iter().map(|(k, v)| (k.clone(), value_json(v))).collect();
    let tensors: Vec<Json> = f.tensors().iter().map(|t| json!({"name": t.name, "type": t.ty.name(), "shape": t.dims, "offset": t.offset, "bytes": t.n_bytes})).collect();
    let types: Map<String, Json> = tensor_types(f).into_iter().map(|(ty, (count, bytes))| (ty.to_string(), json!({"count": count, "bytes": bytes}))).collect();
    let ft = f.get_u64("general.file_type");
    json!({
        "architecture": f.architecture(),
        "name": f.get_str("general.name"),
        "version": f.version(),
        "alignment": f.alignment(),
        "file_type": ft.map(|ft| json!({"id": ft, "name": file_type_name(ft)})),
        "file_bytes": f.file_len(),
        "data_offset": f.data_offset(),
        "tensor_count": f.tensors().len(),
        "tensor_bytes": f.tensor_bytes(),
        "tensor_types": types,
        "memory_estimate": estimate.to_json(),
        "ram_budget_floor_bytes": streaming_plan(f, estimate.n_ctx).map(|p| p.floor()),
        "vram_bytes": crate::gpu::vram_estimate(f, estimate.n_ctx as usize).ok(),
        "special_tokens": special_tokens(f).into_iter().map(|(k, id, text)| (k.to_string(), json!({"id": id, "text": text}))).collect::<Map<String, Json>>(),
        "control_tokens": control_tokens(f).into_iter().map(|(id, text)| json!({"id": id, "text": text})).collect::<Vec<_>>(),
        "metadata": metadata,
        "tensors": tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_arrays_are_summarized_in_json() {
        let v = Value::Array((0..100u32).map(Value::U32).collect());
        let j = value_json(&v);
        assert_eq!(j["type"], "u32");
        assert_eq!(j["len"], 100);
        assert_eq!(j["head"].as_array().unwrap().len(), JSON_ARRAY_HEAD);
        let short = value_json(&Value::Array((0..64u32).map(Value::U32).collect()));
        assert_eq!(short.as_array().unwrap().len(), 64);
        assert_eq!(value_json(&Value::F32(f32::NAN)), Json::Null);
    }
}
