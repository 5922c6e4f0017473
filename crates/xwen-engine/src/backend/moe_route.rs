//! A MoE router's decision as llama.cpp's `build_moe_ffn` makes it: probabilities (softmax or
//! sigmoid of the router's logits), the top k selected on them plus the selection bias where
//! the model has one (`exp_probs_b`: DeepSeek-V3, Kimi), the chosen *unbiased* probabilities
//! renormalized (sum clamped at 6.103515625e-5; Kimi K3 may skip it), then scaled. The rule is
//! a backend op (`Backend::route`, over every row of a batch's router logits); `route_with` is
//! its reference body, which the CPU backend runs.

use crate::ops;

/// How router logits become expert probabilities (llama.cpp's `expert_gating_func`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
}

impl Gating {
    /// From `expert_gating_func` (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax, 2 sigmoid).
    pub fn from_gguf(v: u64) -> Option<Gating> {
        match v {
            1 => Some(Gating::Softmax),
            2 => Some(Gating::Sigmoid),
            _ => None,
        }
    }
}

/// How a layer's router logits become each token's experts and weights.
#[derive(Clone, Copy, Debug)]
pub struct RouteRule<'a> {
    /// Logits per token (the router's rows).
    pub n_expert: usize,
    pub n_used: usize,
    pub gating: Gating,
    /// Added to the probabilities for the selection only ([n_expert]).
    pub bias: Option<&'a [f32]>,
    /// Multiplies the chosen weights (1 = none).
    pub w_scale: f32,
    /// Whether the chosen weights are renormalized to sum 1.
    pub norm_w: bool,
}

impl RouteRule<'_> {
    /// One token's decision from its `n_expert` logits.
    pub fn apply(&self, logits: &[f32]) -> Route {
        route_with(logits, self.n_used, self.gating, self.bias, self.w_scale, self.norm_w)
    }
}

/// The routing decision of one token: expert ids (descending probability) and their weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
    /// The last chosen expert's probability less the best unchosen one's: how near the
    /// decision was to a tie (0 = a tie the order of the sort decided).
    pub margin: f32,
}

/// The softmax router's decision (qwen35moe, qwen3next): `route_with` without a bias or scale.
pub fn route(logits: &[f32], n_used: usize) -> Route {
    route_with(logits, n_used, Gating::Softmax, None, 1.0, true)
}

/// One token's routing decision, in build_moe_ffn's order: probabilities, selection on
/// probs + bias, the chosen *unbiased* probs renormalized (where `norm_w`), then scaled.
pub fn route_with(logits: &[f32], n_used: usize, gating: Gating, bias: Option<&[f32]>, w_scale: f32, norm_w: bool) -> Route {
    let mut probs = logits.to_vec();
    match gating {
        Gating::Softmax => ops::softmax_inplace(&mut probs),
        Gating::Sigmoid => probs.iter_mut().for_each(|p| *p = ops::sigmoid(*p)),
    }
    let sel: Vec<f32> = match bias {
        Some(b) => probs.iter().zip(b).map(|(p, b)| p + b).collect(),
        None => probs.clone(),
    };
    let mut idx: Vec<usize> = (0..sel.len()).collect();
    // Stable sort, descending: ties keep the lower id first.
    idx.sort_by(|&a, &b| sel[b].partial_cmp(&sel[a]).unwrap_or(std::cmp::Ordering::Equal));
    let margin = match (idx.get(n_used.wrapping_sub(1)), idx.get(n_used)) {
        (Some(&last), Some(&next)) => sel[last] - sel[next],
        _ => f32::INFINITY,
    };
    idx.truncate(n_used);
    let mut w: Vec<f32> = idx.iter().map(|&i| probs[i]).collect();
    if norm_w {
        // ggml_sum_rows accumulates in f64 and rounds once; then clamp and divide in f32.
        let sum = (w.iter().map(|&x| x as f64).sum::<f64>() as f32).max(6.103_515_6e-5);
        for x in w.iter_mut() {
            *x /= sum;
        }
    }
    if w_scale != 0.0 && w_scale != 1.0 {
        for x in w.iter_mut() {
            *x *= w_scale;
        }
    }
    Route { experts: idx, weights: w, margin }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kimi's router: selection on sigmoid + bias, weights the unbiased sigmoids renormalized
    /// and scaled.
    #[test]
    fn sigmoid_routes_select_on_the_biased_probs_and_weigh_the_unbiased() {
        let logits = [0.0f32, 1.0, 2.0, -1.0];
        let bias = [0.0f32, 0.0, -1.0, 2.0];
        let r = route_with(&logits, 2, Gating::Sigmoid, Some(&bias), 2.0, true);
        // sigmoid: 0.5, 0.73, 0.88, 0.27; + bias: 0.5, 0.73, -0.12, 2.27 -> experts 3, 1
        assert_eq!(r.experts, vec![3, 1]);
        let (p3, p1) = (ops::sigmoid(-1.0), ops::sigmoid(1.0));
        let sum = p3 + p1;
        assert!((r.weights[0] - 2.0 * p3 / sum).abs() < 1e-6 && (r.weights[1] - 2.0 * p1 / sum).abs() < 1e-6);
        // no bias, no scale: the softmax router's renormalized top-k
        assert_eq!(route_with(&logits, 2, Gating::Softmax, None, 1.0, true), route(&logits, 2));
        // without renormalization the weights are the scaled sigmoids themselves
        let raw = route_with(&logits, 2, Gating::Sigmoid, Some(&bias), 2.0, false);
        assert_eq!(raw.experts, vec![3, 1]);
        assert_eq!(raw.weights, vec![p3 * 2.0, p1 * 2.0]);
    }

    #[test]
    fn route_picks_top_k_and_renormalizes() {
        let r = route(&[0.1, 3.0, -1.0, 2.0, 2.5], 2);
        assert_eq!(r.experts, vec![1, 4]);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(r.weights[0] > r.weights[1]);
    }

    #[test]
    fn a_rule_applies_route_with_to_one_row() {
        let logits = [0.3f32, -0.2, 1.5, 0.9, 0.0, 2.2];
        let bias = [0.0f32, 1.0, 0.0, 0.0, 0.0, -3.0];
        let rule = RouteRule { n_expert: 6, n_used: 3, gating: Gating::Sigmoid, bias: Some(&bias), w_scale: 2.5, norm_w: false };
        assert_eq!(rule.apply(&logits), route_with(&logits, 3, Gating::Sigmoid, Some(&bias), 2.5, false));
    }
}
