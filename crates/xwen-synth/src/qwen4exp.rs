//! Qwen3.8-Flash-Next (`qwen4exp`) files: the family's trunk (Gated DeltaNet, gated attention,
//! MoE with a shared expert) plus hyper-connections, QSA's indexer and one PLE n-gram layer.
//! Tensor names, shapes and keys are llama.cpp b11434's (`src/models/qwen4exp.cpp`
//! `load_arch_hparams` / `load_arch_tensors`, written as `conversion/qwen4exp.py` writes them);
//! the PLE hash constants are derived as transformers 5.23 `models/qwen4_exp` derives them (the
//! seeded per-layer multipliers, one prime vocabulary per head), so the rows a token reads
//! spread over the table as they do in the real model.

use crate::{mix, Fill, Geometry, Preset, TensorPlan};
use xwen_gguf::{GgmlType, Value};

/// What qwen4exp adds to a geometry.
#[derive(Clone, Copy, Debug)]
pub struct Qwen4x {
    /// Hyper-connection streams (`hc_count`) and the rank of their mixer (`hc_lowrank`).
    pub hc: usize,
    pub hc_rank: usize,
    /// QSA's indexer: query heads of `idx_dim` (one key head), the token budget, and the block
    /// size (compress ratio) of every full-attention layer; 0 leaves them dense.
    pub idx_heads: usize,
    pub idx_dim: usize,
    pub idx_budget: usize,
    pub idx_ratio: usize,
    pub ple: Option<Ple>,
}

/// The PLE layer (one DeltaNet layer): n-grams up to `ngram`, `heads_per_ngram` hashed heads per
/// order (n_embd / heads wide each), a conv of `kernel` taps dilated by `ngram`, head
/// vocabularies the primes after `vocab_base`.
#[derive(Clone, Copy, Debug)]
pub struct Ple {
    pub layer: usize,
    pub ngram: usize,
    pub heads_per_ngram: usize,
    pub kernel: usize,
    pub vocab_base: u64,
}

impl Ple {
    pub fn n_heads(&self) -> usize {
        (self.ngram - 1) * self.heads_per_ngram
    }

    /// Each head's prime vocabulary: the (h+1)-th prime after base − 1 (transformers
    /// `_find_nth_prime_after`, one PLE module, so the global head index is h).
    pub fn head_vocab_sizes(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.n_heads());
        let mut p = self.vocab_base - 1;
        for _ in 0..self.n_heads() {
            p += 1;
            while !is_prime(p) {
                p += 1;
            }
            out.push(p);
        }
        out
    }

    /// Rows of `per_layer_token_embd`: the heads' vocabularies back to back, padded to a
    /// multiple of 128 (`make_ngram_vocab_size_divisible_by`).
    pub fn table_rows(&self) -> u64 {
        self.head_vocab_sizes().iter().sum::<u64>().next_multiple_of(128)
    }

    /// The per-order hash multipliers of the first PLE module (transformers
    /// `_build_layer_multipliers`: odd, below i64::MAX / vocab so a product never overflows).
    pub fn multipliers(&self, n_vocab: usize, seed: u64) -> Vec<u64> {
        let half_bound = ((i64::MAX as u64) / n_vocab.max(1) as u64 / 2).max(1);
        (0..self.ngram as u64)
            .map(|i| {
                let v = seed.wrapping_add(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1));
                2 * (crate::Rng::new(v).next_u64() % half_bound) + 1
            })
            .collect()
    }
}

/// The geometries of the qwen4exp presets; `base` and `tiny` are the family's full-size and toy
/// defaults (`Preset::geometry`).
pub(crate) fn preset_geometry(p: Preset, base: Geometry, tiny: Geometry) -> Geometry {
    match p {
        // llama.cpp's qwen4exp.cpp names 48 layers "A3B"; the trunk's widths are the
        // family's (Qwen3-Next-80B's attention and DeltaNet, 512 experts of 512 top-10,
        // a shared expert of 512), hc 4 of rank 320, PLE of 3-grams × 8 heads from primes
        // after 20M (transformers 5.23's defaults: 16 heads of 128, 320M rows, the "~45B"
        // table). Our choice where nothing official was at hand: the PLE on layer 1 (as
        // the fixture's config), QSA's indexer of 8 heads of 128, a budget of 2048 tokens
        // in blocks of 4.
        Preset::Qwen4ExpFlashNext => Geometry {
            arch: "qwen4exp",
            size_label: "A3B",
            n_layer: 48,
            n_embd: 2048,
            n_head: 16,
            n_head_kv: 2,
            n_expert: 512,
            n_expert_used: 10,
            n_ff_exp: 512,
            n_ff_shexp: 512,
            ssm_dt_rank: 32,
            q4x: Some(Qwen4x {
                hc: 4,
                hc_rank: 320,
                idx_heads: 8,
                idx_dim: 128,
                idx_budget: 2048,
                idx_ratio: 4,
                ple: Some(Ple { layer: 1, ngram: 3, heads_per_ngram: 8, kernel: 4, vocab_base: 20_000_000 }),
            }),
            ..base
        },
        // What a token reads stays the full model's (layers, widths, top-10, 16 table rows
        // per PLE token); only the experts and table rows it can choose from shrink.
        Preset::Qwen4ExpFlashNextScaled => {
            let mut g = preset_geometry(Preset::Qwen4ExpFlashNext, base, tiny);
            g.size_label = "A3B-scaled";
            g.n_expert = 256;
            if let Some(Ple { vocab_base, .. }) = g.q4x.as_mut().and_then(|q| q.ple.as_mut()) {
                *vocab_base = 5_000_000;
            }
            g
        }
        // The parity fixture's shape (tools/oracle/qwen4exp.py) with 8 experts.
        Preset::Qwen4ExpTiny => Geometry {
            arch: "qwen4exp",
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 256,
            n_ff_shexp: 256,
            q4x: Some(Qwen4x {
                hc: 4,
                hc_rank: 32,
                idx_heads: 2,
                idx_dim: 64,
                idx_budget: 16,
                idx_ratio: 4,
                ple: Some(Ple { layer: 1, ngram: 3, heads_per_ngram: 8, kernel: 4, vocab_base: 1000 }),
            }),
            ..tiny
        },
        Preset::Qwen4ExpSmall => Geometry {
            arch: "qwen4exp",
            size_label: "small",
            n_embd: 1024,
            n_head: 8,
            n_expert: 64,
            n_expert_used: 8,
            n_ff_exp: 512,
            n_ff_shexp: 512,
            q4x: Some(Qwen4x {
                hc: 4,
                hc_rank: 64,
                idx_heads: 4,
                idx_dim: 64,
                idx_budget: 64,
                idx_ratio: 4,
                ple: Some(Ple { layer: 1, ngram: 3, heads_per_ngram: 8, kernel: 4, vocab_base: 20_000 }),
            }),
            ..tiny
        },
        _ => unreachable!("{p} is not a qwen4exp preset"),
    }
}

/// transformers' PLE hash seed (`Qwen4ExpTextConfig.seed`).
const PLE_SEED: u64 = 1234;

fn is_prime(v: u64) -> bool {
    if v < 2 {
        return false;
    }
    if v.is_multiple_of(2) {
        return v == 2;
    }
    let mut d = 3;
    while d * d <= v {
        if v.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// The tensors of a qwen4exp file, in the synthetic Q4_K_M mix the other families use
/// (attention, DeltaNet, hyper-connection, PLE and shared-expert matrices Q8_0; routed experts,
/// token_embd and the n-gram table Q4_K; output Q6_K; norms, routers, conv taps F32), with
/// llama-quantize's fallbacks for rows a type does not divide. The indexer projections stay
/// F32 (llama-quantize never quantizes them); the PLE conv is a matrix to llama-quantize, so a
/// quantized mix leaves its 4-wide rows F16.
pub(crate) fn tensor_plan(g: &Geometry, q: &Qwen4x) -> Vec<TensorPlan> {
    use GgmlType::{F32, Q4_K, Q6_K, Q8_0};
    let t = |name: String, ty: GgmlType, dims: &[usize], fill| TensorPlan {
        name,
        ty: if fill == Fill::Matrix { mix::fallback(ty, dims[0] as u64) } else { ty },
        dims: dims.iter().map(|&d| d as u64).collect(),
        fill,
    };
    let e = g.n_embd;
    let wide = q.hc * e;
    let mut out = Vec::new();
    let mut head = |name: &str, ty, dims: &[usize], fill| out.push(t(name.into(), ty, dims, fill));
    if !g.tied {
        head("output.weight", Q6_K, &[e, g.n_vocab], Fill::Matrix);
    }
    // the final mixer is the output norm
    head("output_hc_down.weight", Q8_0, &[wide, q.hc_rank], Fill::Matrix);
    head("output_hc_norm.weight", F32, &[wide], Fill::Norm);
    head("output_hc_up.weight", Q8_0, &[q.hc_rank, wide], Fill::Matrix);
    if let Some(p) = &q.ple {
        head("per_layer_token_embd.weight", Q4_K, &[e / p.n_heads(), p.table_rows() as usize], Fill::Matrix);
    }
    head("token_embd.weight", if g.tied { Q6_K } else { Q4_K }, &[e, g.n_vocab], Fill::Matrix);

    for il in 0..g.n_layer {
        let mut layer = Vec::new();
        let mut add = |suffix: &str, ty, dims: &[usize], fill| layer.push(t(format!("blk.{il}.{suffix}"), ty, dims, fill));
        for m in ["attn", "ffn"] {
            add(&format!("hc_{m}_down.weight"), Q8_0, &[wide, q.hc_rank], Fill::Matrix);
            add(&format!("hc_{m}_up.weight"), Q8_0, &[q.hc_rank, wide], Fill::Matrix);
            add(&format!("hc_{m}_inject.weight"), Q8_0, &[wide, q.hc], Fill::Matrix);
            add(&format!("hc_{m}_norm.weight"), F32, &[wide], Fill::Norm);
        }
        crate::mixer_tensors(g, il, &mut add);
        if !g.is_recurrent(il) {
            // llama.cpp loads the indexer on every full-attention layer, sparse or not
            add("indexer.q_proj.weight", F32, &[e, q.idx_heads * q.idx_dim], Fill::Normal(crate::WEIGHT_STD));
            add("indexer.k_proj.weight", F32, &[e, q.idx_dim], Fill::Normal(crate::WEIGHT_STD));
            add("indexer.q_norm.weight", F32, &[q.idx_dim], Fill::Norm);
            add("indexer.k_norm.weight", F32, &[q.idx_dim], Fill::Norm);
        }
        if let Some(p) = q.ple.filter(|p| p.layer == il) {
            add("ple_key.weight", Q8_0, &[e, wide], Fill::Matrix);
            add("ple_value.weight", Q8_0, &[e, e], Fill::Matrix);
            add("ple_norm_key.weight", F32, &[wide], Fill::Norm);
            add("ple_norm_query.weight", F32, &[wide], Fill::Norm);
            add("ple_norm_conv.weight", F32, &[wide], Fill::Norm);
            add("ple_conv1d.weight", Q8_0, &[p.kernel, wide], Fill::Matrix);
        }
        crate::moe_tensors(g, &mut add);
        layer.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(layer);
    }
    out
}

/// qwen4exp's keys beyond the family's (conversion/qwen4exp.py `set_gguf_parameters`); `eos`
/// is the id the PLE hash resets its n-grams on.
pub(crate) fn metadata(g: &Geometry, q: &Qwen4x, eos: u32) -> Vec<(String, Value)> {
    let a = g.arch;
    let u = |x: usize| Value::U32(x as u32);
    let u64s = |v: Vec<u64>| Value::Array(v.into_iter().map(Value::U64).collect());
    let mut kv = vec![
        (format!("{a}.hyper_connection.count"), u(q.hc)),
        (format!("{a}.hyper_connection.low_rank"), u(q.hc_rank)),
        (format!("{a}.attention.indexer.head_count"), u(q.idx_heads)),
        (format!("{a}.attention.indexer.key_length"), u(q.idx_dim)),
        (format!("{a}.attention.indexer.top_k"), u(q.idx_budget)),
        (
            format!("{a}.attention.compress_ratios"),
            Value::Array((0..g.n_layer).map(|il| Value::I32(if g.is_recurrent(il) { 0 } else { q.idx_ratio as i32 })).collect()),
        ),
    ];
    if let Some(p) = &q.ple {
        let vocab = p.head_vocab_sizes();
        let offsets: Vec<u64> = vocab.iter().scan(0, |at, &v| Some(std::mem::replace(at, *at + v))).collect();
        kv.extend([
            (format!("{a}.ple.layers"), Value::Array(vec![Value::I32(p.layer as i32)])),
            (format!("{a}.ple.ngram_size"), u(p.ngram)),
            (format!("{a}.ple.heads_per_ngram"), u(p.heads_per_ngram)),
            (format!("{a}.ple.conv_kernel"), u(p.kernel)),
            (format!("{a}.ple.eos_token_id"), Value::U32(eos)),
            (format!("{a}.embedding_length_per_layer_input"), u(g.n_embd / p.n_heads())),
            (format!("{a}.ple.layer_multipliers"), u64s(p.multipliers(g.n_vocab, PLE_SEED))),
            (format!("{a}.ple.head_offsets"), u64s(offsets)),
            (format!("{a}.ple.head_vocab_sizes"), u64s(vocab)),
        ]);
    }
    kv
}

/// Checks what llama.cpp's loader and transformers' config require of the additions.
pub(crate) fn validate(g: &Geometry, q: &Qwen4x) -> Result<(), String> {
    if q.hc < 2 || q.hc_rank == 0 {
        return Err(format!("hyper-connections: {} streams of rank {} (at least 2 streams)", q.hc, q.hc_rank));
    }
    if q.idx_heads == 0 || q.idx_dim == 0 || q.idx_budget == 0 || q.idx_dim < g.rope_dims || q.idx_dim % 2 != 0 {
        return Err(format!("QSA indexer: {} heads of {} (rope over {}), budget {}", q.idx_heads, q.idx_dim, g.rope_dims, q.idx_budget));
    }
    if q.idx_ratio == 1 || (q.idx_ratio > 0 && !q.idx_budget.is_multiple_of(q.idx_ratio)) {
        return Err(format!("QSA: a compress ratio above 1 that divides the budget, got {} and {}", q.idx_ratio, q.idx_budget));
    }
    if let Some(p) = &q.ple {
        if p.layer >= g.n_layer || !g.is_recurrent(p.layer) {
            return Err(format!("PLE layer {} is not a linear-attention layer", p.layer));
        }
        if !(2..=8).contains(&p.ngram) || p.heads_per_ngram == 0 || p.n_heads() > 64 || !g.n_embd.is_multiple_of(p.n_heads()) || p.kernel == 0 {
            return Err(format!("PLE: {}-grams, {} heads for width {}", p.ngram, p.n_heads(), g.n_embd));
        }
        if p.vocab_base < 2 || p.table_rows() > i32::MAX as u64 {
            return Err(format!("PLE: head vocabularies from {} do not fit llama.cpp's int32 rows", p.vocab_base));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants transformers derives for the parity fixture's config (tools/oracle/
    /// qwen4exp.py: vocab 512, 3-grams, 8 heads per order, base 1000, seed 1234), as its GGUF
    /// holds them.
    #[test]
    fn ple_constants_follow_transformers() {
        let p = Ple { layer: 1, ngram: 3, heads_per_ngram: 8, kernel: 4, vocab_base: 1000 };
        assert_eq!(p.multipliers(512, PLE_SEED), [4295158889763781, 17440218147737327, 1270917961434445]);
        let v = p.head_vocab_sizes();
        assert_eq!(v[..4], [1009, 1013, 1019, 1021]);
        assert_eq!(v[15], 1097);
        assert_eq!(p.table_rows(), 16896);
    }
}
