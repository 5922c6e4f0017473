//! Token sampling: logit bias → repetition/presence/frequency penalties → top-k → top-p →
//! min-p → temperature → draw (llama.cpp's common chain order). Temperature ≤ 0 is greedy.
//! Defaults are mode-keyed per the Qwen3.6 model cards: thinking 1.0 / 0.95 / 20,
//! non-thinking 0.7 / 0.8 / 20; any explicitly set value wins over the mode default.

/// What a user or request asked for; `None` means "the mode default".
#[derive(Clone, Debug, Default)]
pub struct SamplerConfig {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// How many recent tokens the penalties look at (llama.cpp's penalty_last_n, default 64).
    pub penalty_last_n: Option<usize>,
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: Option<u64>,
}

/// Fully resolved sampling parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub penalty_last_n: usize,
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        SamplerConfig { temperature: Some(0.0), ..Default::default() }
    }

    pub fn resolve(&self, thinking: bool) -> SamplingParams {
        let (t, p, k) = if thinking { (1.0, 0.95, 20) } else { (0.7, 0.8, 20) };
        SamplingParams {
            temperature: self.temperature.unwrap_or(t),
            top_k: self.top_k.unwrap_or(k),
            top_p: self.top_p.unwrap_or(p),
            min_p: self.min_p.unwrap_or(0.0),
            repeat_penalty: self.repeat_penalty.unwrap_or(1.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            penalty_last_n: self.penalty_last_n.unwrap_or(64),
            logit_bias: self.logit_bias.clone(),
            seed: self.seed.unwrap_or(0x5eed),
        }
    }
}

#[derive(Clone)]
pub struct Sampler {
    p: SamplingParams,
    rng: SplitMix64,
    recent: Vec<u32>,
}

impl Sampler {
    pub fn new(p: SamplingParams) -> Self {
        let rng = SplitMix64(p.seed);
        Sampler { p, rng, recent: Vec::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.p
    }

    /// Whether `sample` is the plain argmax of the logits as given: temperature ≤ 0 with no
    /// logit bias and no penalty (a device may then pick the token itself).
    pub fn is_greedy(&self) -> bool {
        self.argmax_of_logits() && self.p.logit_bias.is_empty()
    }

    /// Whether the pick is the argmax of the logits after the bias (no temperature, no
    /// penalty): `is_greedy` with no bias, `greedy_bans` with bans only.
    fn argmax_of_logits(&self) -> bool {
        let p = &self.p;
        p.temperature <= 0.0 && p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0
    }

    /// Where the sampler is greedy but for tokens its logit bias bans (each biased by −∞, as
    /// llama-server's `ignore_eos` bans the end-of-generation tokens): those tokens. Its pick
    /// is then `ops::argmax_except` of the raw logits, which a device computes itself. None
    /// where the sampler draws, penalizes or biases otherwise; empty where `is_greedy`.
    pub fn greedy_bans(&self) -> Option<Vec<u32>> {
        let bias = &self.p.logit_bias;
        (self.argmax_of_logits() && bias.iter().all(|&(_, b)| b == f32::NEG_INFINITY)).then(|| bias.iter().map(|&(t, _)| t).collect())
    }

    /// Record a token of the context (prompt or generated) for the penalties.
    pub fn accept(&mut self, tok: u32) {
        self.recent.push(tok);
        let keep = self.p.penalty_last_n.max(1) * 4;
        if self.recent.len() > keep {
            self.recent.drain(..self.recent.len() - self.p.penalty_last_n);
        }
    }

    /// Pick the next token from `logits` (modified in place).
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        match self.distribution(logits) {
            None => argmax(logits),
            Some(dist) => self.draw(&dist),
        }
    }

    /// For a speculative verify: the next token given that a drafter proposed `draft` (a point
    /// mass). Greedy: the argmax, accepted when it is the draft. Sampling: the draft is kept
    /// with its probability p(draft), else a token is drawn from p with the draft left out and
    /// renormalized — so the token's distribution is exactly p (rejection sampling). Returns
    /// the token and whether it is the draft.
    pub fn sample_against(&mut self, logits: &mut [f32], draft: u32) -> (u32, bool) {
        let Some(dist) = self.distribution(logits) else {
            let t = argmax(logits);
            return (t, t == draft);
        };
        let p_draft = dist.iter().find(|c| c.0 == draft).map_or(0.0, |c| c.1);
        if p_draft > 0.0 && (self.rng.next_f64() as f32) < p_draft {
            return (draft, true);
        }
        let rest: Vec<(u32, f32)> = dist.iter().copied().filter(|c| c.0 != draft).collect();
        if rest.is_empty() {
            return (draft, true);
        }
        let total: f32 = rest.iter().map(|c| c.1).sum();
        let rest: Vec<(u32, f32)> = rest.into_iter().map(|(t, p)| (t, p / total)).collect();
        (self.draw(&rest), false)
    }

    /// The distribution the next token is drawn from, after bias, penalties, top-k, top-p,
    /// min-p and temperature: candidates with their probabilities. None when greedy.
    pub fn distribution(&mut self, logits: &mut [f32]) -> Option<Vec<(u32, f32)>> {
        for &(id, b) in &self.p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        self.apply_penalties(logits);
        if self.p.temperature <= 0.0 {
            return None;
        }
        // Candidates sorted by logit, descending, truncated by top-k.
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        let k = if self.p.top_k == 0 { cand.len() } else { self.p.top_k.min(cand.len()) };
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
            cand.truncate(k);
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1));
        // Softmax over the survivors (before temperature, like llama.cpp's top-p/min-p).
        let probs = softmax(&cand, 1.0);
        let mut keep = cand.len();
        if self.p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, &p) in probs.iter().enumerate() {
                cum += p;
                if cum >= self.p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if self.p.min_p > 0.0 {
            let thr = probs[0] * self.p.min_p;
            keep = keep.min(probs.iter().take_while(|&&p| p >= thr).count().max(1));
        }
        cand.truncate(keep.max(1));
        let probs = softmax(&cand, self.p.temperature);
        Some(cand.iter().zip(probs).map(|(c, p)| (c.0, p)).collect())
    }

    /// One draw from `dist` (probabilities summing to 1, in order).
    fn draw(&mut self, dist: &[(u32, f32)]) -> u32 {
        let r = self.rng.next_f64() as f32;
        let mut cum = 0.0;
        for &(t, p) in dist {
            cum += p;
            if r < cum {
                return t;
            }
        }
        dist[dist.len() - 1].0
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.p;
        if p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        let start = self.recent.len().saturating_sub(p.penalty_last_n);
        let mut counts: std::collections::HashMap<u32, u32> = Default::default();
        for &t in &self.recent[start..] {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &c) in &counts {
            let Some(l) = logits.get_mut(t as usize) else { continue };
            if *l <= 0.0 {
                *l *= p.repeat_penalty;
            } else {
                *l /= p.repeat_penalty;
            }
            *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }
}

pub use crate::ops::argmax;

fn softmax(cand: &[(u32, f32)], temp: f32) -> Vec<f32> {
    let max = cand[0].1;
    let mut e: Vec<f32> = cand.iter().map(|&(_, l)| ((l - max) / temp).exp()).collect();
    let s: f32 = e.iter().sum();
    for v in e.iter_mut() {
        *v /= s;
    }
    e
}

/// Small, seedable, reproducible generator (SplitMix64).
#[derive(Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 5.0, 3.0, 4.5, -2.0, 0.0]
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplerConfig::greedy().resolve(false));
        assert_eq!(s.sample(&mut logits()), 1);
    }

    #[test]
    fn greedy_with_bans_is_the_argmax_of_the_rest() {
        let mut p = SamplerConfig::greedy().resolve(false);
        assert_eq!(Sampler::new(p.clone()).greedy_bans(), Some(vec![]));
        p.logit_bias = vec![(1, f32::NEG_INFINITY), (3, f32::NEG_INFINITY)];
        let mut s = Sampler::new(p.clone());
        assert_eq!(s.greedy_bans(), Some(vec![1, 3]));
        assert!(!s.is_greedy());
        assert_eq!(s.sample(&mut logits()), crate::ops::argmax_except(&logits(), &[1, 3]));
        // a bias that is not a ban, a penalty or a temperature: the sampler's own
        p.logit_bias.push((2, -1.0));
        assert_eq!(Sampler::new(p.clone()).greedy_bans(), None);
        let q = SamplingParams { repeat_penalty: 1.1, ..SamplerConfig::greedy().resolve(false) };
        assert_eq!(Sampler::new(q).greedy_bans(), None);
        assert_eq!(Sampler::new(SamplerConfig::default().resolve(false)).greedy_bans(), None);
    }

    #[test]
    fn mode_defaults_and_explicit_values_win() {
        let p = SamplerConfig::default().resolve(true);
        assert_eq!((p.temperature, p.top_p, p.top_k), (1.0, 0.95, 20));
        let p = SamplerConfig::default().resolve(false);
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.7, 0.8, 20));
        let p = SamplerConfig { temperature: Some(0.3), ..Default::default() }.resolve(true);
        assert_eq!((p.temperature, p.top_p), (0.3, 0.95));
    }

    /// Rejection sampling against a point-mass draft keeps the target distribution: over many
    /// seeds the tokens' frequencies match `distribution` (every token within 4 standard errors).
    #[test]
    fn sampling_against_a_draft_keeps_the_distribution() {
        let logits: Vec<f32> = (0..12).map(|i| ((i * 7 % 5) as f32) * 0.6 - (i as f32) * 0.1).collect();
        let cfg = SamplerConfig { temperature: Some(0.9), top_k: Some(0), top_p: Some(0.97), ..Default::default() };
        let want = Sampler::new(cfg.resolve(false)).distribution(&mut logits.clone()).unwrap();
        let n = 60_000;
        for draft in [want[0].0, want[3].0, 11] {
            let mut counts = std::collections::HashMap::new();
            let mut s = Sampler::new(SamplerConfig { seed: Some(99), ..cfg.clone() }.resolve(false));
            let mut accepted = 0;
            for _ in 0..n {
                let (t, acc) = s.sample_against(&mut logits.clone(), draft);
                *counts.entry(t).or_insert(0usize) += 1;
                accepted += acc as usize;
            }
            let p_draft = want.iter().find(|c| c.0 == draft).map_or(0.0, |c| c.1) as f64;
            assert!((accepted as f64 / n as f64 - p_draft).abs() < 0.01, "acceptance is p(draft)");
            for &(t, p) in &want {
                let f = *counts.get(&t).unwrap_or(&0) as f64 / n as f64;
                let se = (p as f64 * (1.0 - p as f64) / n as f64).sqrt().max(1e-4);
                assert!((f - p as f64).abs() < 4.0 * se, "token {t}: {f} vs {p} (draft {draft})");
            }
            assert!(counts.keys().all(|t| want.iter().any(|c| c.0 == *t)), "only candidates are drawn");
        }
    }

    #[test]
    fn seed_reproducible_and_top_k_respected() {
        let cfg = SamplerConfig { temperature: Some(1.5), top_k: Some(2), top_p: Some(1.0), seed: Some(7), ..Default::default() };
        let draw = |cfg: &SamplerConfig| {
            let mut s = Sampler::new(cfg.resolve(false));
            (0..200).map(|_| s.sample(&mut logits())).collect::<Vec<_>>()
        };
        let a = draw(&cfg);
        assert_eq!(a, draw(&cfg));
        assert!(a.iter().all(|&t| t == 1 || t == 3), "top-k 2 allows only ids 1 and 3");
        assert!(a.contains(&1) && a.contains(&3));
    }

    #[test]
    fn logit_bias_and_penalties_change_the_choice() {
        let mut s = Sampler::new(SamplerConfig { logit_bias: vec![(2, 10.0)], ..SamplerConfig::greedy() }.resolve(false));
        assert_eq!(s.sample(&mut logits()), 2);
        let mut s = Sampler::new(SamplerConfig { repeat_penalty: Some(2.0), ..SamplerConfig::greedy() }.resolve(false));
        s.accept(1);
        assert_eq!(s.sample(&mut logits()), 3, "5.0/2 < 4.5");
        let mut s = Sampler::new(SamplerConfig { presence_penalty: Some(1.0), ..SamplerConfig::greedy() }.resolve(false));
        s.accept(1);
        assert_eq!(s.sample(&mut logits()), 3);
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        let cfg = SamplerConfig { temperature: Some(1.0), top_k: Some(0), top_p: Some(1.0), min_p: Some(0.5), seed: Some(3), ..Default::default() };
        let mut s = Sampler::new(cfg.resolve(false));
        for _ in 0..100 {
            let t = s.sample(&mut logits());
            assert!(t == 1 || t == 3, "min-p 0.5 keeps only tokens within 2x of the best, got {t}");
        }
        let cfg = SamplerConfig { temperature: Some(1.0), top_k: Some(0), top_p: Some(0.1), seed: Some(3), ..Default::default() };
        let mut s = Sampler::new(cfg.resolve(false));
        for _ in 0..50 {
            assert_eq!(s.sample(&mut logits()), 1);
        }
    }
}
