//! Cross-layer residual attention (Kimi K3's `attn_res`, llama.cpp `kimi-k3.cpp` `res_push` /
//! `res_mix`): every `block`-th layer banks its raw input as a checkpoint and restarts the
//! residual stream from its mixer's output; before each mixer, each FFN and the output norm the
//! stream is replaced by a softmax-weighted mix of the banked checkpoints and itself.
//!
//! Per token, with checkpoints c_1..c_k and the current stream x (all of the model's width) and
//! a score vector w (the converter's fused `*_res_norm · *_res_proj`):
//!   s_i = Σ_j (rms_norm(c_i)·w)_j,  s_x = Σ_j (rms_norm(x)·w)_j     (f64 sums, as ggml_sum_rows)
//!   p   = softmax(s_1 … s_k, s_x)
//!   mix = Σ_i p_i·c_i  +  x·p_x
//! The scores read the normed values, the sum the raw ones. Σ_i p_i·c_i is ggml's
//! `dsv4_hc_pre` (one f32 accumulator per element over the checkpoints in bank order,
//! `sum += xv * wv` rounded twice, as GCC 13.3 compiles it for the AVX2 build the fixtures come
//! from; GCC 12.2 contracts it into an FMA, so llama.cpp's own builds differ there by an ulp of
//! the mix — measured with both builds, docs/parity.md); x·p_x is a separate ggml_mul and the
//! two a ggml_add.

use crate::backend::Backend;

/// A model's cross-layer residual attention: the bank interval and the score vector of the
/// final mix (`output_res_score`, before the output norm).
pub struct AttnRes {
    pub block: usize,
    pub output: Vec<f32>,
}

/// A layer's two score vectors.
pub struct LayerRes {
    pub attn: Vec<f32>, // [hidden], before the mixer
    pub ffn: Vec<f32>,  // [hidden], before the FFN
}

/// The checkpoints banked so far in one forward pass: each n × hidden, in bank order.
#[derive(Default)]
pub struct Bank {
    ckpts: Vec<Vec<f32>>,
}

impl Bank {
    /// Banks the residual stream `x` (n × hidden) as it is.
    pub fn push(&mut self, x: &[f32]) {
        self.ckpts.push(x.to_vec());
    }

    pub fn is_empty(&self) -> bool {
        self.ckpts.is_empty()
    }

    /// The mix of the bank and `x` (rows as wide as `score`) under `score`; `x` itself while
    /// the bank is empty (layer 0's mixer).
    pub fn mix(&self, backend: &dyn Backend, x: &[f32], score: &[f32], eps: f32) -> Vec<f32> {
        if self.ckpts.is_empty() {
            return x.to_vec();
        }
        let bank: Vec<&[f32]> = self.ckpts.iter().map(Vec::as_slice).collect();
        let mut out = vec![0.0f32; x.len()];
        backend.residual_mix(&bank, x, score, eps, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::Cpu;
    use xwen_kernels::Pool;

    #[test]
    fn an_empty_bank_passes_the_stream_through() {
        let b = Bank::default();
        let x = [1.0f32, -2.0, 3.0, 0.5];
        assert_eq!(b.mix(&Cpu::new(Pool::new(1)), &x, &[1.0; 2], 1e-5), x.to_vec());
    }

    /// Equal scores (a zero score vector) weigh the checkpoints and the stream alike; a score
    /// vector that favours one direction moves the mix toward the rows that point along it.
    #[test]
    fn the_mix_is_the_softmax_weighted_sum() {
        let mut b = Bank::default();
        b.push(&[2.0, 0.0]);
        b.push(&[0.0, 4.0]);
        let x = [1.0f32, 1.0];
        let cpu = Cpu::new(Pool::new(1));
        let m = b.mix(&cpu, &x, &[0.0, 0.0], 1e-6);
        let third = 1.0f32 / 3.0;
        assert!((m[0] - (2.0 + 1.0) * third).abs() < 1e-6 && (m[1] - (4.0 + 1.0) * third).abs() < 1e-6, "{m:?}");
        let m = b.mix(&cpu, &x, &[10.0, 0.0], 1e-6);
        assert!(m[0] > 1.9 && m[1] < 0.1, "{m:?}");
    }
}
