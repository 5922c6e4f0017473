//! Random tiny geometries for parity sweeps (docs/parity.md "Random geometries"): one seed draws a whole model
//! shape of a family — widths, head counts and ratios, layer patterns, rope, experts, tied or
//! untied embeddings, eps — from the ranges real checkpoints and llama.cpp's graphs allow, so a
//! comparison against llama.cpp covers shapes nobody picked by hand.
//!
//! Widths are mostly multiples of 32 (every real checkpoint's are), sometimes not a multiple of
//! 256 (k-quants fall back, `mix::fallback`), now and then only of 16 (F16 fallback). What the
//! graphs require is kept: V heads a multiple of K heads (DeltaNet), query heads a multiple of
//! KV heads, rope over an even part of the head, at least one attention and one recurrent
//! layer, top-k no larger than the expert count.

use crate::{Geometry, Kimi, Ple, Preset, Qwen4x, Rng};

/// The model families `random_geometry` draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Qwen35,
    Qwen35Moe,
    Qwen3Next,
    KimiLinear,
    Qwen4Exp,
}

impl Family {
    pub const ALL: [Family; 5] = [Family::Qwen35, Family::Qwen35Moe, Family::Qwen3Next, Family::KimiLinear, Family::Qwen4Exp];

    /// llama.cpp's `general.architecture`.
    pub fn arch(self) -> &'static str {
        match self {
            Family::Qwen35 => "qwen35",
            Family::Qwen35Moe => "qwen35moe",
            Family::Qwen3Next => "qwen3next",
            Family::KimiLinear => "kimi-linear",
            Family::Qwen4Exp => "qwen4exp",
        }
    }
}

impl std::str::FromStr for Family {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Family::ALL.into_iter().find(|f| f.arch() == s).ok_or_else(|| {
            let names: Vec<&str> = Family::ALL.iter().map(|f| f.arch()).collect();
            format!("unknown family `{s}` (known: {})", names.join(", "))
        })
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.arch())
    }
}

/// Draws from a seeded stream.
struct Draw(Rng);

impl Draw {
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.0.below(xs.len())]
    }
    /// Uniform in lo..=hi.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.0.below(hi - lo + 1)
    }
    fn chance(&mut self, p: f64) -> bool {
        self.0.unit() < p
    }
    /// A matrix width: a multiple of 32 in lo..=hi, one time in `odd` a multiple of 16 only.
    fn width(&mut self, lo: usize, hi: usize, odd: f64) -> usize {
        if self.chance(odd) {
            16 * (2 * self.range(lo / 32, hi / 32 - 1) + 1)
        } else {
            32 * self.range(lo / 32, hi / 32)
        }
    }
}

/// A tiny model of `family` drawn from `seed` (the same seed, the same geometry).
pub fn random_geometry(family: Family, seed: u64) -> Geometry {
    let mut d = Draw(Rng::new(seed ^ crate::fnv1a(family.arch().as_bytes())));
    let base = match family {
        Family::KimiLinear => Preset::KimiLinearTiny.geometry(),
        Family::Qwen3Next => Preset::Qwen3NextTiny.geometry(),
        Family::Qwen35Moe => Preset::Qwen35MoeTiny.geometry(),
        Family::Qwen35 => Preset::Qwen35Tiny.geometry(),
        Family::Qwen4Exp => Preset::Qwen4ExpTiny.geometry(),
    };
    let interval = d.range(2, 4);
    let n_layer = d.range(interval, 2 * interval + 1);
    let mut g = Geometry {
        size_label: "random",
        n_layer,
        n_embd: d.width(64, 512, 0.1),
        rms_eps: d.pick(&[1e-6, 1e-5]),
        rope_freq_base: d.pick(&[1e4, 1e6, 1e7]),
        full_attn_interval: interval,
        n_vocab: d.range(crate::vocab::MIN_SYNTHETIC_VOCAB, 1200),
        tied: d.chance(0.4),
        ctx_train: 4096,
        ..base
    };
    if family == Family::KimiLinear {
        // KDA: n_head heads of ssm_state; MLA: absorbed, one latent KV head, rope on its own part.
        // At least two heads: with one, W_k_b is 2-D to ggml, gets repacked, and the repack's
        // 4-row activation quantizer reads the strided q_nope rows as if contiguous (llama.cpp
        // b11434 repack.cpp forward_mul_mat) — a reference bug no checkpoint reaches (Kimi has 32)
        let n_head = d.range(2, 4);
        let rope = d.pick(&[16, 32, 64]);
        let kv_lora = d.pick(&[64, 128, 256]);
        let n_ff_exp = d.width(32, 256, 0.0);
        g = Geometry {
            n_head,
            n_head_kv: 1,
            rope_dims: rope,
            head_dim: kv_lora + rope,
            ssm_state: d.pick(&[32, 64, 128]),
            ssm_groups: n_head,
            ssm_dt_rank: n_head,
            n_ff: d.width(64, 512, 0.1),
            n_expert: d.pick(&[4, 6, 8, 16]),
            n_ff_exp,
            n_ff_shexp: n_ff_exp * d.range(1, 2),
            kimi: Some(Kimi {
                kv_lora,
                qk_nope: d.pick(&[32, 64, 128]),
                v_head: d.pick(&[32, 64, 128]),
                n_dense_lead: d.range(0, 2.min(n_layer - 1)),
                w_scale: d.pick(&[1.0, 2.446]),
                mla_last: d.chance(0.3),
            }),
            ..g
        };
        g.n_expert_used = d.range(1, g.n_expert.min(4));
        // llama.cpp's kimi-linear loader requires output.weight
        g.tied = false;
        return g;
    }
    let n_head_kv = d.pick(&[1, 2, 4]);
    let head_dim: usize = d.pick(&[32, 64, 96, 128, 256]);
    let rope_dims = head_dim / d.pick(&[4, 2, 1]);
    let half = rope_dims / 2;
    let a = (half * 11).div_ceil(32).min(half / 2);
    let ssm_groups = d.pick(&[1, 2, 4]);
    g = Geometry {
        n_head: n_head_kv * d.range(1, 4),
        n_head_kv,
        head_dim,
        rope_dims,
        rope_sections: [a as i32, a as i32, (half - 2 * a) as i32, 0],
        ssm_state: d.pick(&[32, 64, 96, 128]),
        ssm_groups,
        ssm_dt_rank: ssm_groups * d.range(1, 3),
        ..g
    };
    if !matches!(family, Family::Qwen35Moe | Family::Qwen4Exp) {
        g.n_ff = d.width(64, 768, 0.15);
    }
    if family != Family::Qwen35 {
        g.n_expert = d.pick(&[4, 6, 8, 16]);
        g.n_expert_used = d.range(1, g.n_expert.min(4));
        g.n_ff_exp = d.width(32, 384, 0.15);
        g.n_ff_shexp = d.width(32, 384, 0.15);
    }
    if family == Family::Qwen4Exp {
        g.q4x = Some(random_qwen4x(&mut d, &g));
    }
    g
}

/// qwen4exp's additions: 2–4 streams, a mixer rank that k-quants may not divide, an indexer
/// whose heads cover the rope, blocks of 2–8 with a budget of 1–6 blocks (so the random-id
/// prompts of 30+ tokens select), now and then no QSA at all; a PLE layer on a random DeltaNet
/// layer (mostly), 2- to 4-grams with heads that divide the width, small prime vocabularies.
fn random_qwen4x(d: &mut Draw, g: &Geometry) -> Qwen4x {
    let idx_ratio = if d.chance(0.1) { 0 } else { d.pick(&[2, 4, 8]) };
    let blocks = d.range(1, 6);
    let idx_budget = if idx_ratio == 0 { d.pick(&[8, 16, 32]) } else { idx_ratio * blocks };
    let idx_dim = d.pick(&[32, 64, 128]).max(g.rope_dims);
    let mut q = Qwen4x { hc: d.pick(&[2, 3, 4]), hc_rank: d.pick(&[16, 32, 64, 96]), idx_heads: d.pick(&[1, 2, 4]), idx_dim, idx_budget, idx_ratio, ple: None };
    if d.chance(0.85) {
        let recurrent: Vec<usize> = (0..g.n_layer).filter(|&il| g.is_recurrent(il)).collect();
        let layer = d.pick(&recurrent);
        let ngram = if g.n_embd.is_multiple_of(3) { d.pick(&[2, 3, 4]) } else { d.pick(&[2, 3]) };
        let mut heads_per_ngram = d.pick(&[1, 2, 4, 8]);
        while !g.n_embd.is_multiple_of((ngram - 1) * heads_per_ngram) {
            heads_per_ngram /= 2;
        }
        q.ple = Some(Ple { layer, ngram, heads_per_ngram, kernel: d.pick(&[2, 3, 4]), vocab_base: d.range(100, 3000) as u64 });
    }
    q
}

/// Overrides one field of a geometry by its name (`n_embd=256`, `tied=false`, ...): to shrink
/// a failing draw to the one feature that matters.
pub fn set_field(g: &mut Geometry, assignment: &str) -> Result<(), String> {
    let (key, value) = assignment.split_once('=').ok_or_else(|| format!("`{assignment}` is not KEY=VALUE"))?;
    let num = || value.parse::<usize>().map_err(|e| format!("{key}: {e}"));
    let float = || value.parse::<f32>().map_err(|e| format!("{key}: {e}"));
    match key {
        "n_layer" => g.n_layer = num()?,
        "n_embd" => g.n_embd = num()?,
        "n_head" => g.n_head = num()?,
        "n_head_kv" => g.n_head_kv = num()?,
        "head_dim" => g.head_dim = num()?,
        "rope_dims" => g.rope_dims = num()?,
        "rope_sections" => {
            let v: Vec<i32> = value.split(',').map(|x| x.parse().map_err(|e| format!("{key}: {e}"))).collect::<Result<_, _>>()?;
            g.rope_sections = v.try_into().map_err(|_| format!("{key}: four counts"))?;
        }
        "rope_freq_base" => g.rope_freq_base = float()?,
        "rms_eps" => g.rms_eps = float()?,
        "full_attn_interval" => g.full_attn_interval = num()?,
        "n_ff" => g.n_ff = num()?,
        "n_expert" => g.n_expert = num()?,
        "n_expert_used" => g.n_expert_used = num()?,
        "n_ff_exp" => g.n_ff_exp = num()?,
        "n_ff_shexp" => g.n_ff_shexp = num()?,
        "ssm_state" => g.ssm_state = num()?,
        "ssm_groups" => g.ssm_groups = num()?,
        "ssm_dt_rank" => g.ssm_dt_rank = num()?,
        "n_vocab" => g.n_vocab = num()?,
        "tied" => g.tied = value.parse().map_err(|e| format!("{key}: {e}"))?,
        "nextn" => g.nextn = value.parse().map_err(|e| format!("{key}: {e}"))?,
        "hc" | "hc_rank" | "idx_heads" | "idx_dim" | "idx_budget" | "idx_ratio" => {
            let q = g.q4x.as_mut().ok_or_else(|| format!("{key}: a qwen4exp field"))?;
            let v = num()?;
            match key {
                "hc" => q.hc = v,
                "hc_rank" => q.hc_rank = v,
                "idx_heads" => q.idx_heads = v,
                "idx_dim" => q.idx_dim = v,
                "idx_budget" => q.idx_budget = v,
                _ => q.idx_ratio = v,
            }
        }
        "ple" if value == "none" => g.q4x.as_mut().ok_or_else(|| format!("{key}: a qwen4exp field"))?.ple = None,
        "ple_layer" | "ple_ngram" | "ple_heads_per_ngram" | "ple_kernel" | "ple_vocab_base" => {
            let p = g.q4x.as_mut().and_then(|q| q.ple.as_mut()).ok_or_else(|| format!("{key}: a qwen4exp geometry with a PLE layer"))?;
            let v = num()?;
            match key {
                "ple_layer" => p.layer = v,
                "ple_ngram" => p.ngram = v,
                "ple_heads_per_ngram" => p.heads_per_ngram = v,
                "ple_kernel" => p.kernel = v,
                _ => p.vocab_base = v as u64,
            }
        }
        _ => return Err(format!("unknown geometry field `{key}`")),
    }
    Ok(())
}

/// A one-line description of a geometry, for logs and fixture manifests.
pub fn describe(g: &Geometry) -> String {
    let mut s = format!(
        "{} L{} (attn every {}) e{} vocab{} heads {}/{}x{} rope{} eps{:e}{} ",
        g.arch,
        g.n_layer,
        g.full_attn_interval,
        g.n_embd,
        g.n_vocab,
        g.n_head,
        g.n_head_kv,
        g.head_dim,
        g.rope_dims,
        g.rms_eps,
        if g.tied { " tied" } else { "" },
    );
    s += &format!("ssm {}k/{}v x{}", g.ssm_groups, g.ssm_dt_rank, g.ssm_state);
    if g.n_ff > 0 {
        s += &format!(" ff{}", g.n_ff);
    }
    if g.n_expert > 0 {
        s += &format!(" experts {} top{} x{} shared{}", g.n_expert, g.n_expert_used, g.n_ff_exp, g.n_ff_shexp);
    }
    if let Some(k) = g.kimi {
        s += &format!(
            " mla lora{} nope{} v{} dense-lead{} scale{}{}",
            k.kv_lora,
            k.qk_nope,
            k.v_head,
            k.n_dense_lead,
            k.w_scale,
            if k.mla_last { " mla-last" } else { "" }
        );
    }
    if let Some(q) = &g.q4x {
        s += &format!(" hc{}r{} qsa {}x{} budget{} ratio{}", q.hc, q.hc_rank, q.idx_heads, q.idx_dim, q.idx_budget, q.idx_ratio);
        if let Some(p) = &q.ple {
            s += &format!(" ple@{} {}-gram x{} k{} vocab{}", p.layer, p.ngram, p.heads_per_ngram, p.kernel, p.vocab_base);
        }
    }
    if g.nextn {
        s += " +mtp";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_reproducible_and_valid() {
        for family in Family::ALL {
            let mut seen = std::collections::HashSet::new();
            for seed in 0..200 {
                let g = random_geometry(family, seed);
                assert_eq!(describe(&g), describe(&random_geometry(family, seed)), "seed {seed} reproducible");
                seen.insert(describe(&g));
                assert_eq!(g.arch, family.arch());
                assert!(g.n_head.is_multiple_of(g.n_head_kv) && g.ssm_dt_rank.is_multiple_of(g.ssm_groups));
                assert!(g.rope_dims.is_multiple_of(2) && g.rope_dims <= g.head_dim);
                let recurrent = (0..g.n_layer).filter(|&il| g.is_recurrent(il)).count();
                assert!(recurrent > 0 && recurrent < g.n_layer, "{}", describe(&g));
                assert!(g.n_expert_used <= g.n_expert);
                assert!(g.n_vocab >= crate::vocab::MIN_SYNTHETIC_VOCAB);
                if let Some(q) = &g.q4x {
                    crate::qwen4exp::validate(&g, q).unwrap_or_else(|e| panic!("{}: {e}", describe(&g)));
                }
            }
            assert!(seen.len() > 150, "{family}: {} distinct geometries of 200", seen.len());
        }
    }
}
