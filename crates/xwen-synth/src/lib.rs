//! Synthetic full-size GGUF models for benchmarks (`xwen synth`, docs/bench.md).
//!
//! A preset reproduces the exact tensor names, shapes, types and metadata of a llama.cpp
//! `qwen35` / `qwen35moe` Q4_K_M file (references: llama.cpp b11434 `src/models/qwen35.cpp` and
//! `qwen35moe.cpp`, `load_arch_hparams` / `load_arch_tensors`; the official files' type mix), so
//! llama.cpp and xwen both load it and do exactly the work the real checkpoint costs. Only the
//! weights are fake.
//!
//! Weights: each quantized type has a small pool of blocks made by quantizing N(0, 0.02²)
//! values with the reference quantizer; a tensor is a random sequence of pool blocks. That keeps
//! every block one a real quantizer could emit (finite f16 scales of realistic magnitude, so
//! activations stay finite through 64 layers) while writing at disk speed, and memory stays at
//! a few MB whatever the file size (20 GB presets are streamed).

mod mix;
mod qwen4exp;
mod random;
mod vocab;

pub use mix::Mix;
pub use qwen4exp::{Ple, Qwen4x};
pub use random::{describe, random_geometry, set_field, Family};

/// What can go wrong writing a synthetic model.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Gguf(#[from] xwen_gguf::GgufError),
    #[error("{0}")]
    Invalid(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, SynthError>;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use xwen_gguf::{GgmlType, GgufFile, GgufWriter, Value};

/// The geometries `xwen synth` can write.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Qwen3.6-35B-A3B: 40 layers, 256 experts top-8, about 20 GB.
    Qwen35Moe35bA3b,
    /// Qwen3.6-27B: 64 layers, hidden 5120, dense FFN 17408.
    Qwen35_27b,
    /// The size llama.cpp names "4B" for qwen35 (32 layers, n_embd 2560); see `geometry`.
    Qwen35_4b,
    /// A few MB, for smoke tests: the MoE graph at toy size.
    Qwen35MoeTiny,
    /// ~230 MB, nearly all routed experts (64 of width 512 per layer): a MoE model that a test
    /// can run under a RAM budget well below its size.
    Qwen35MoeSmall,
    /// A few MB, for smoke tests: the dense graph at toy size.
    Qwen35Tiny,
    /// Qwen3.5-122B-A10B: 48 layers, hidden 3072, 256 experts of 1024 top-8; about 74 GB.
    Qwen35Moe122bA10b,
    /// The same per-token work at a size a 64 GiB disk holds: every layer, width and top-k of
    /// `Qwen35Moe122bA10b`, 160 experts a layer; about 47 GB.
    Qwen35Moe122bA10bScaled,
    /// Qwen3-Next-80B-A3B: 48 layers, 512 experts top-10, about 45 GB.
    Qwen3Next80bA3b,
    /// A few MB, for smoke tests: qwen3next's graph (fused DeltaNet projections, grouped V
    /// heads) at toy size.
    Qwen3NextTiny,
    /// ~300 MB, nearly all routed experts: qwen3next's graph at qwen35moe-small's size.
    Qwen3NextSmall,
    /// Kimi-Linear-48B-A3B: 27 layers (KDA with MLA every 4th and last), 256 experts top-8.
    KimiLinear48bA3b,
    /// A few MB: kimi-linear's graph (KDA, MLA, a dense first layer, sigmoid router) at toy size.
    KimiLinearTiny,
    /// ~250 MB, nearly all routed experts: kimi-linear's graph at qwen35moe-small's size.
    KimiLinearSmall,
    /// Qwen3.8-Flash-Next as far as its geometry is known (`geometry` says which parts are our
    /// choice): 48 layers, 512 experts top-10, a 41B-parameter n-gram table; about 75 GB.
    Qwen4ExpFlashNext,
    /// The same per-token work at a size these disks hold: every layer, width and top-k of
    /// `Qwen4ExpFlashNext`, 256 experts and a quarter of the n-gram table; about 32 GB.
    Qwen4ExpFlashNextScaled,
    /// A few MB: qwen4exp's graph (hyper-connections, QSA, PLE, MoE) at toy size.
    Qwen4ExpTiny,
    /// ~270 MB, nearly all routed experts: qwen4exp at qwen35moe-small's size.
    Qwen4ExpSmall,
}

impl Preset {
    pub const ALL: [Preset; 18] = [
        Preset::Qwen35Moe35bA3b,
        Preset::Qwen35Moe122bA10b,
        Preset::Qwen35Moe122bA10bScaled,
        Preset::Qwen35_27b,
        Preset::Qwen35_4b,
        Preset::Qwen35MoeTiny,
        Preset::Qwen35MoeSmall,
        Preset::Qwen35Tiny,
        Preset::Qwen3Next80bA3b,
        Preset::Qwen3NextTiny,
        Preset::Qwen3NextSmall,
        Preset::KimiLinear48bA3b,
        Preset::KimiLinearTiny,
        Preset::KimiLinearSmall,
        Preset::Qwen4ExpFlashNext,
        Preset::Qwen4ExpFlashNextScaled,
        Preset::Qwen4ExpTiny,
        Preset::Qwen4ExpSmall,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Qwen35Moe35bA3b => "qwen35moe-35b-a3b",
            Preset::Qwen35Moe122bA10b => "qwen35moe-122b-a10b",
            Preset::Qwen35Moe122bA10bScaled => "qwen35moe-122b-a10b-scaled",
            Preset::Qwen35_27b => "qwen35-27b",
            Preset::Qwen35_4b => "qwen35-4b",
            Preset::Qwen35MoeTiny => "qwen35moe-tiny",
            Preset::Qwen35MoeSmall => "qwen35moe-small",
            Preset::Qwen35Tiny => "qwen35-tiny",
            Preset::Qwen3Next80bA3b => "qwen3next-80b-a3b",
            Preset::Qwen3NextTiny => "qwen3next-tiny",
            Preset::Qwen3NextSmall => "qwen3next-small",
            Preset::KimiLinear48bA3b => "kimi-linear-48b-a3b",
            Preset::KimiLinearTiny => "kimi-linear-tiny",
            Preset::KimiLinearSmall => "kimi-linear-small",
            Preset::Qwen4ExpFlashNext => "qwen4exp-flash-next",
            Preset::Qwen4ExpFlashNextScaled => "qwen4exp-flash-next-scaled",
            Preset::Qwen4ExpTiny => "qwen4exp-tiny",
            Preset::Qwen4ExpSmall => "qwen4exp-small",
        }
    }

    /// Toy presets use a small synthetic vocabulary: a real one would outweigh the model.
    pub fn is_tiny(self) -> bool {
        matches!(
            self,
            Preset::Qwen35MoeTiny
                | Preset::Qwen35MoeSmall
                | Preset::Qwen35Tiny
                | Preset::Qwen3NextTiny
                | Preset::Qwen3NextSmall
                | Preset::KimiLinearTiny
                | Preset::KimiLinearSmall
                | Preset::Qwen4ExpTiny
                | Preset::Qwen4ExpSmall
        )
    }

    pub fn geometry(self) -> Geometry {
        const FULL_VOCAB: usize = 248_320;
        let base = Geometry {
            arch: "qwen35",
            size_label: "",
            n_layer: 0,
            n_embd: 0,
            n_head: 0,
            n_head_kv: 0,
            head_dim: 256,
            rope_dims: 64,
            rope_sections: [11, 11, 10, 0],
            rope_freq_base: 1e7,
            rms_eps: 1e-6,
            ctx_train: 262_144,
            full_attn_interval: 4,
            n_ff: 0,
            n_expert: 0,
            n_expert_used: 0,
            n_ff_exp: 0,
            n_ff_shexp: 0,
            ssm_conv: 4,
            ssm_state: 128,
            ssm_groups: 16,
            ssm_dt_rank: 0,
            n_vocab: FULL_VOCAB,
            kimi: None,
            q4x: None,
            tied: false,
            nextn: false,
        };
        // Toy geometry of the trained tiny models (head dims 64, rope over 16 dims), but with a
        // 4-layer stack: three DeltaNet layers and one attention layer cover both mixers.
        let tiny = Geometry {
            size_label: "tiny",
            n_layer: 4,
            n_embd: 256,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            rope_dims: 16,
            rope_sections: [3, 3, 2, 0],
            ctx_train: 4096,
            ssm_state: 64,
            ssm_groups: 2,
            ssm_dt_rank: 4,
            n_vocab: 1024,
            ..base.clone()
        };
        match self {
            Preset::Qwen35Moe35bA3b => Geometry {
                arch: "qwen35moe",
                size_label: "35B-A3B",
                n_layer: 40,
                n_embd: 2048,
                n_head: 16,
                n_head_kv: 2,
                n_expert: 256,
                n_expert_used: 8,
                n_ff_exp: 512,
                n_ff_shexp: 512,
                ssm_dt_rank: 32,
                ..base
            },
            // Qwen3.5-122B-A10B as its card gives it: 48 layers (every fourth attention), hidden
            // 3072, 32 heads / 2 KV of 256, 256 routed experts top-8 and a shared one; the
            // experts' width (1024) is what the 122B total and 10B active imply; the DeltaNet
            // widths (16 K-heads, 64 V-heads of 128) our choice where the card is silent.
            Preset::Qwen35Moe122bA10b | Preset::Qwen35Moe122bA10bScaled => Geometry {
                arch: "qwen35moe",
                size_label: if self == Preset::Qwen35Moe122bA10b { "122B-A10B" } else { "122B-A10B-scaled" },
                n_layer: 48,
                n_embd: 3072,
                n_head: 32,
                n_head_kv: 2,
                n_expert: if self == Preset::Qwen35Moe122bA10b { 256 } else { 160 },
                n_expert_used: 8,
                n_ff_exp: 1024,
                n_ff_shexp: 1024,
                ssm_dt_rank: 64,
                ..base
            },
            Preset::Qwen35_27b => Geometry {
                size_label: "27B",
                n_layer: 64,
                n_embd: 5120,
                n_head: 24,
                n_head_kv: 4,
                n_ff: 17408,
                ssm_dt_rank: 48,
                ..base
            },
            // Our choice where no official geometry was at hand: llama.cpp's qwen35.cpp calls
            // 32 layers of n_embd 2560 "4B"; heads, FFN and DeltaNet widths follow the family.
            Preset::Qwen35_4b => Geometry {
                size_label: "4B",
                n_layer: 32,
                n_embd: 2560,
                n_head: 16,
                n_head_kv: 4,
                n_ff: 9216,
                ssm_dt_rank: 32,
                ..base
            },
            Preset::Qwen35MoeTiny => Geometry {
                arch: "qwen35moe",
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 256,
                n_ff_shexp: 256,
                ..tiny
            },
            Preset::Qwen35MoeSmall => Geometry {
                arch: "qwen35moe",
                size_label: "small",
                n_embd: 1024,
                n_head: 8,
                n_expert: 64,
                n_expert_used: 8,
                n_ff_exp: 512,
                n_ff_shexp: 512,
                ..tiny
            },
            Preset::Qwen35Tiny => Geometry { n_ff: 768, ..tiny },
            // Qwen3-Next-80B-A3B's config.json: hidden 2048, 48 layers, 16 heads / 2 KV of 256
            // (rope over 64), DeltaNet 16 K-heads / 32 V-heads of 128, 512 experts of width 512
            // top-10, a shared expert of 512, intermediate_size 5120, Qwen3's 151,936 tokens.
            Preset::Qwen3Next80bA3b => Geometry {
                arch: "qwen3next",
                size_label: "80B-A3B",
                n_layer: 48,
                n_embd: 2048,
                n_head: 16,
                n_head_kv: 2,
                n_ff: 5120,
                n_expert: 512,
                n_expert_used: 10,
                n_ff_exp: 512,
                n_ff_shexp: 512,
                ssm_dt_rank: 32,
                n_vocab: 151_936,
                ..base
            },
            Preset::Qwen3NextTiny => Geometry {
                arch: "qwen3next",
                n_ff: 768,
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 256,
                n_ff_shexp: 256,
                ..tiny
            },
            Preset::Qwen3NextSmall => Geometry {
                arch: "qwen3next",
                size_label: "small",
                n_embd: 1024,
                n_head: 8,
                n_ff: 512,
                n_expert: 64,
                n_expert_used: 8,
                n_ff_exp: 512,
                n_ff_shexp: 512,
                ..tiny
            },
            // Kimi-Linear-48B-A3B's config.json as llama.cpp's kimi-linear.cpp reads it: hidden
            // 2304, 27 layers, 32 heads; KDA heads of 128 with kernel-4 convolutions; MLA with
            // kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, at layers 4, 8, …, 24 and 27
            // (1-based); a dense first layer of 9216; 256 experts of 1024, top-8, one shared,
            // routed scale 2.446; 163,840 tokens; rms eps 1e-5.
            Preset::KimiLinear48bA3b => Geometry {
                arch: "kimi-linear",
                size_label: "48B-A3B",
                n_layer: 27,
                n_embd: 2304,
                n_head: 32,
                n_head_kv: 1,
                head_dim: 576,
                rope_dims: 64,
                rms_eps: 1e-5,
                ctx_train: 1_048_576,
                n_ff: 9216,
                n_expert: 256,
                n_expert_used: 8,
                n_ff_exp: 1024,
                n_ff_shexp: 1024,
                ssm_state: 128,
                ssm_groups: 32,
                ssm_dt_rank: 32,
                n_vocab: 163_840,
                kimi: Some(Kimi { kv_lora: 512, qk_nope: 128, v_head: 128, n_dense_lead: 1, w_scale: 2.446, mla_last: true }),
                ..base
            },
            Preset::KimiLinearTiny => Geometry {
                arch: "kimi-linear",
                n_head: 4,
                n_head_kv: 1,
                head_dim: 288,
                rope_dims: 32,
                rms_eps: 1e-5,
                n_ff: 256,
                n_expert: 4,
                n_expert_used: 2,
                n_ff_exp: 256,
                n_ff_shexp: 256,
                ssm_state: 64,
                ssm_groups: 4,
                ssm_dt_rank: 4,
                kimi: Some(Kimi { kv_lora: 256, qk_nope: 64, v_head: 64, n_dense_lead: 1, w_scale: 2.446, mla_last: false }),
                ..tiny
            },
            Preset::KimiLinearSmall => Geometry {
                arch: "kimi-linear",
                size_label: "small",
                n_embd: 1024,
                n_head: 8,
                n_head_kv: 1,
                head_dim: 288,
                rope_dims: 32,
                rms_eps: 1e-5,
                n_ff: 2048,
                n_expert: 64,
                n_expert_used: 8,
                n_ff_exp: 512,
                n_ff_shexp: 512,
                ssm_state: 128,
                ssm_groups: 8,
                ssm_dt_rank: 8,
                kimi: Some(Kimi { kv_lora: 256, qk_nope: 64, v_head: 64, n_dense_lead: 1, w_scale: 2.446, mla_last: false }),
                ..tiny
            },
            Preset::Qwen4ExpFlashNext | Preset::Qwen4ExpFlashNextScaled | Preset::Qwen4ExpTiny | Preset::Qwen4ExpSmall => {
                qwen4exp::preset_geometry(self, base, tiny)
            }
        }
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Preset::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            let names: Vec<_> = Preset::ALL.iter().map(|p| p.name()).collect();
            format!("unknown preset `{s}` (known: {})", names.join(", "))
        })
    }
}

/// Hyperparameters of a preset, in llama.cpp's terms.
#[derive(Clone, Debug)]
pub struct Geometry {
    /// `general.architecture`: "qwen35" (dense), "qwen35moe" or "qwen3next" (MoE).
    pub arch: &'static str,
    pub size_label: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Attention head width (key_length = value_length).
    pub head_dim: usize,
    pub rope_dims: usize,
    pub rope_sections: [i32; 4],
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    pub ctx_train: u32,
    /// Every this-many-th layer is full attention, the rest Gated DeltaNet.
    pub full_attn_interval: usize,
    /// Dense SwiGLU width; 0 for qwen35moe; for qwen3next the config's intermediate_size
    /// (`feed_forward_length`, the shared expert's width where none is given).
    pub n_ff: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    pub ssm_conv: usize,
    /// DeltaNet head width of K and V (`ssm.state_size`).
    pub ssm_state: usize,
    /// DeltaNet K heads (`ssm.group_count`).
    pub ssm_groups: usize,
    /// DeltaNet V heads (`ssm.time_step_rank`).
    pub ssm_dt_rank: usize,
    pub n_vocab: usize,
    /// kimi-linear's MLA and router (None for the Qwen families). Its KDA layers use ssm_state
    /// as the head width, ssm_groups = ssm_dt_rank = n_head heads, ssm_conv the kernel; n_ff is
    /// the leading dense layers' width; head_dim is MLA's K row (kv_lora + rope).
    pub kimi: Option<Kimi>,
    /// qwen4exp's hyper-connections, QSA indexer and PLE layer (None for the other families);
    /// the rest of the geometry is qwen35moe's.
    pub q4x: Option<Qwen4x>,
    /// Tied embeddings: no `output.weight`, llama.cpp and xwen use `token_embd` as the lm head.
    pub tied: bool,
    /// An MTP (NextN) block after the trunk, as the official "-MTP" GGUFs carry (qwen35 and
    /// qwen35moe): `blk.{n_layer}` is a full-attention block with the trunk's FFN plus
    /// `nextn.eh_proj`, `nextn.enorm`, `nextn.hnorm`, `nextn.shared_head_norm`; block_count
    /// counts it, `nextn_predict_layers` is 1. `n_layer` stays the trunk's depth.
    pub nextn: bool,
}

/// kimi-linear's extra hyperparameters.
#[derive(Clone, Copy, Debug)]
pub struct Kimi {
    pub kv_lora: usize,
    pub qk_nope: usize,
    pub v_head: usize,
    /// Layers before the first MoE layer (dense SwiGLU).
    pub n_dense_lead: usize,
    pub w_scale: f32,
    /// The last layer is MLA too (Kimi-Linear-48B's 27th).
    pub mla_last: bool,
}

impl Geometry {
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// llama.cpp's default when `recurrent_layers` is absent; we also write the array. The
    /// NextN block (il = n_layer) is full attention.
    pub fn is_recurrent(&self, il: usize) -> bool {
        if il >= self.n_layer {
            return false;
        }
        let last_mla = self.kimi.is_some_and(|k| k.mla_last) && il + 1 == self.n_layer;
        !(il + 1).is_multiple_of(self.full_attn_interval) && !last_mla
    }

    /// Blocks in the file: the trunk and the NextN block where there is one.
    pub fn n_blocks(&self) -> usize {
        self.n_layer + usize::from(self.nextn)
    }

    pub fn ssm_inner(&self) -> usize {
        self.ssm_state * self.ssm_dt_rank
    }

    /// qwen3next's layout: β and α fused in `ssm_ba`, no rope sections (plain NeoX rope).
    pub fn is_qwen3next(&self) -> bool {
        self.arch == "qwen3next"
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fill {
    /// Pool blocks of N(0, 0.02²) weights.
    Matrix,
    /// RMSNorm gains: 1 + N(0, 0.05²).
    Norm,
    /// N(0, std²) in F32 (routers, conv taps).
    Normal(f32),
    /// −exp(U(−1, 1)): a pre-baked −exp(A_log), so every head decays.
    SsmA,
    /// U(−1, 1): the softplus offset of the DeltaNet gate.
    Uniform,
}

/// One tensor of a preset's file, in file order.
#[derive(Clone, Debug)]
pub struct TensorPlan {
    pub name: String,
    pub ty: GgmlType,
    /// ne0 first, as GGUF stores them.
    pub dims: Vec<u64>,
    fill: Fill,
}

impl TensorPlan {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    pub fn n_bytes(&self) -> u64 {
        self.ty.row_bytes(self.n_elements()).expect("plans only hold whole blocks")
    }
}

/// Every tensor of a preset's file, in the order llama-quantize writes them (output, output_norm,
/// token_embd, then each block's tensors by name), with the official Q4_K_M mix: attention,
/// DeltaNet and shared-expert matrices Q8_0; routed experts, dense FFN and token_embd Q4_K;
/// output Q6_K; norms, routers, conv1d, ssm_a and ssm_dt F32.
pub fn tensor_plan(g: &Geometry) -> Vec<TensorPlan> {
    if let Some(k) = g.kimi {
        return kimi_tensor_plan(g, &k);
    }
    if let Some(q) = g.q4x {
        return qwen4exp::tensor_plan(g, &q);
    }
    use GgmlType::{F32, Q4_K, Q8_0};
    let t = |name: String, ty, dims: &[usize], fill| TensorPlan {
        name,
        ty,
        dims: dims.iter().map(|&d| d as u64).collect(),
        fill,
    };
    let e = g.n_embd;
    let mut out = head_tensors(g);
    for il in 0..g.n_blocks() {
        let mut layer = Vec::new();
        let mut add = |suffix: &str, ty, dims: &[usize], fill| layer.push(t(format!("blk.{il}.{suffix}"), ty, dims, fill));
        if il == g.n_layer {
            // the NextN block's own tensors (the official converter's, quantized as attention)
            add("nextn.eh_proj.weight", Q8_0, &[2 * e, e], Fill::Matrix);
            add("nextn.enorm.weight", F32, &[e], Fill::Norm);
            add("nextn.hnorm.weight", F32, &[e], Fill::Norm);
            add("nextn.shared_head_norm.weight", F32, &[e], Fill::Norm);
        }
        add("attn_norm.weight", F32, &[e], Fill::Norm);
        add("post_attention_norm.weight", F32, &[e], Fill::Norm);
        mixer_tensors(g, il, &mut add);
        if g.is_moe() {
            moe_tensors(g, &mut add);
        } else {
            add("ffn_gate.weight", Q4_K, &[e, g.n_ff], Fill::Matrix);
            add("ffn_up.weight", Q4_K, &[e, g.n_ff], Fill::Matrix);
            add("ffn_down.weight", Q4_K, &[g.n_ff, e], Fill::Matrix);
        }
        layer.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(layer);
    }
    out
}

/// A layer's mixer tensors (a DeltaNet layer's or a gated-attention layer's), as qwen35,
/// qwen35moe, qwen3next and qwen4exp files carry them; `add` takes the name after `blk.{il}.`.
pub(crate) fn mixer_tensors(g: &Geometry, il: usize, add: &mut dyn FnMut(&str, GgmlType, &[usize], Fill)) {
    use GgmlType::{F32, Q8_0};
    let e = g.n_embd;
    if g.is_recurrent(il) {
        let value_dim = g.ssm_inner();
        let conv_dim = 2 * g.ssm_state * g.ssm_groups + value_dim;
        add("attn_qkv.weight", Q8_0, &[e, conv_dim], Fill::Matrix);
        add("attn_gate.weight", Q8_0, &[e, value_dim], Fill::Matrix);
        add("ssm_conv1d.weight", F32, &[g.ssm_conv, conv_dim], Fill::Normal(0.2));
        add("ssm_dt.bias", F32, &[g.ssm_dt_rank], Fill::Uniform);
        add("ssm_a", F32, &[g.ssm_dt_rank], Fill::SsmA);
        if g.is_qwen3next() {
            add("ssm_ba.weight", Q8_0, &[e, 2 * g.ssm_dt_rank], Fill::Matrix);
        } else {
            add("ssm_beta.weight", Q8_0, &[e, g.ssm_dt_rank], Fill::Matrix);
            add("ssm_alpha.weight", Q8_0, &[e, g.ssm_dt_rank], Fill::Matrix);
        }
        add("ssm_norm.weight", F32, &[g.ssm_state], Fill::Norm);
        add("ssm_out.weight", Q8_0, &[value_dim, e], Fill::Matrix);
    } else {
        let (q_dim, kv_dim) = (g.head_dim * g.n_head, g.head_dim * g.n_head_kv);
        // attn_q is double width: per head [q(head_dim), gate(head_dim)].
        add("attn_q.weight", Q8_0, &[e, 2 * q_dim], Fill::Matrix);
        add("attn_k.weight", Q8_0, &[e, kv_dim], Fill::Matrix);
        add("attn_v.weight", Q8_0, &[e, kv_dim], Fill::Matrix);
        add("attn_output.weight", Q8_0, &[q_dim, e], Fill::Matrix);
        add("attn_q_norm.weight", F32, &[g.head_dim], Fill::Norm);
        add("attn_k_norm.weight", F32, &[g.head_dim], Fill::Norm);
    }
}

/// A MoE layer's router, routed experts and shared expert (qwen35moe, qwen3next, qwen4exp).
pub(crate) fn moe_tensors(g: &Geometry, add: &mut dyn FnMut(&str, GgmlType, &[usize], Fill)) {
    use GgmlType::{F32, Q4_K, Q8_0};
    let (e, n, f, s) = (g.n_embd, g.n_expert, g.n_ff_exp, g.n_ff_shexp);
    add("ffn_gate_inp.weight", F32, &[e, n], Fill::Normal(0.02));
    add("ffn_gate_exps.weight", Q4_K, &[e, f, n], Fill::Matrix);
    add("ffn_up_exps.weight", Q4_K, &[e, f, n], Fill::Matrix);
    add("ffn_down_exps.weight", Q4_K, &[f, e, n], Fill::Matrix);
    add("ffn_gate_inp_shexp.weight", F32, &[e], Fill::Normal(0.02));
    add("ffn_gate_shexp.weight", Q8_0, &[e, s], Fill::Matrix);
    add("ffn_up_shexp.weight", Q8_0, &[e, s], Fill::Matrix);
    add("ffn_down_shexp.weight", Q8_0, &[s, e], Fill::Matrix);
}

/// output (unless tied), output_norm and token_embd: llama-quantize's first three.
fn head_tensors(g: &Geometry) -> Vec<TensorPlan> {
    let t = |name: &str, ty, dims: Vec<u64>, fill| TensorPlan { name: name.into(), ty, dims, fill };
    let (e, v) = (g.n_embd as u64, g.n_vocab as u64);
    let mut out = Vec::new();
    if !g.tied {
        out.push(t("output.weight", GgmlType::Q6_K, vec![e, v], Fill::Matrix));
    }
    out.push(t("output_norm.weight", GgmlType::F32, vec![e], Fill::Norm));
    // a tied token_embd is the lm head too: llama-quantize gives it the output's type
    out.push(t("token_embd.weight", if g.tied { GgmlType::Q6_K } else { GgmlType::Q4_K }, vec![e, v], Fill::Matrix));
    out
}

/// kimi-linear's tensors (llama.cpp `kimi-linear.cpp` `load_arch_tensors`), in the same mix:
/// mixer and shared-expert matrices Q8_0, routed experts, the dense FFN and token_embd Q4_K,
/// output Q6_K, the rest F32.
fn kimi_tensor_plan(g: &Geometry, k: &Kimi) -> Vec<TensorPlan> {
    use GgmlType::{F32, Q4_K, Q8_0};
    let t = |name: String, ty, dims: &[usize], fill| TensorPlan { name, ty, dims: dims.iter().map(|&d| d as u64).collect(), fill };
    let (e, h) = (g.n_embd, g.n_head);
    let (hd, inner) = (g.ssm_state, g.ssm_state * g.n_head);
    let mut out = head_tensors(g);
    for il in 0..g.n_layer {
        let mut layer = Vec::new();
        let mut add = |suffix: &str, ty, dims: &[usize], fill| layer.push(t(format!("blk.{il}.{suffix}"), ty, dims, fill));
        add("attn_norm.weight", F32, &[e], Fill::Norm);
        add("ffn_norm.weight", F32, &[e], Fill::Norm);
        if g.is_recurrent(il) {
            for x in ["q", "k", "v"] {
                add(&format!("attn_{x}.weight"), Q8_0, &[e, inner], Fill::Matrix);
                add(&format!("ssm_conv1d_{x}.weight"), F32, &[g.ssm_conv, 1, inner], Fill::Normal(0.2));
            }
            add("ssm_f_a.weight", Q8_0, &[e, hd], Fill::Matrix);
            add("ssm_f_b.weight", Q8_0, &[hd, inner], Fill::Matrix);
            add("ssm_g_a.weight", Q8_0, &[e, hd], Fill::Matrix);
            add("ssm_g_b.weight", Q8_0, &[hd, inner], Fill::Matrix);
            add("ssm_beta.weight", Q8_0, &[e, h], Fill::Matrix);
            add("ssm_a", F32, &[1, h], Fill::SsmA);
            add("ssm_dt.bias", F32, &[inner], Fill::Uniform);
            add("ssm_norm.weight", F32, &[hd], Fill::Norm);
            add("attn_output.weight", Q8_0, &[inner, e], Fill::Matrix);
        } else {
            add("attn_q.weight", Q8_0, &[e, h * (k.qk_nope + g.rope_dims)], Fill::Matrix);
            add("attn_kv_a_mqa.weight", Q8_0, &[e, k.kv_lora + g.rope_dims], Fill::Matrix);
            add("attn_kv_a_norm.weight", F32, &[k.kv_lora], Fill::Norm);
            add("attn_k_b.weight", Q8_0, &[k.qk_nope, k.kv_lora, h], Fill::Matrix);
            add("attn_v_b.weight", Q8_0, &[k.kv_lora, k.v_head, h], Fill::Matrix);
            add("attn_output.weight", Q8_0, &[h * k.v_head, e], Fill::Matrix);
        }
        if il < k.n_dense_lead {
            add("ffn_gate.weight", Q4_K, &[e, g.n_ff], Fill::Matrix);
            add("ffn_up.weight", Q4_K, &[e, g.n_ff], Fill::Matrix);
            add("ffn_down.weight", Q4_K, &[g.n_ff, e], Fill::Matrix);
        } else {
            let (n, f, sf) = (g.n_expert, g.n_ff_exp, g.n_ff_shexp);
            add("ffn_gate_inp.weight", F32, &[e, n], Fill::Normal(0.02));
            add("exp_probs_b.bias", F32, &[n], Fill::Normal(0.02));
            add("ffn_gate_exps.weight", Q4_K, &[e, f, n], Fill::Matrix);
            add("ffn_up_exps.weight", Q4_K, &[e, f, n], Fill::Matrix);
            add("ffn_down_exps.weight", Q4_K, &[f, e, n], Fill::Matrix);
            add("ffn_gate_shexp.weight", Q8_0, &[e, sf], Fill::Matrix);
            add("ffn_up_shexp.weight", Q8_0, &[e, sf], Fill::Matrix);
            add("ffn_down_shexp.weight", Q8_0, &[sf, e], Fill::Matrix);
        }
        layer.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(layer);
    }
    out
}

/// kimi-linear's metadata keys (conversion/kimi_linear.py's set_gguf_parameters).
fn kimi_metadata(g: &Geometry, k: &Kimi, name: &str) -> Vec<(String, Value)> {
    let a = g.arch;
    let u = |x: usize| Value::U32(x as u32);
    vec![
        ("general.architecture".into(), a.into()),
        ("general.type".into(), "model".into()),
        ("general.name".into(), format!("synthetic {name}").into()),
        ("general.size_label".into(), g.size_label.into()),
        (format!("{a}.block_count"), u(g.n_layer)),
        (format!("{a}.context_length"), Value::U32(g.ctx_train)),
        (format!("{a}.embedding_length"), u(g.n_embd)),
        (format!("{a}.feed_forward_length"), u(g.n_ff)),
        (format!("{a}.attention.head_count"), u(g.n_head)),
        (
            format!("{a}.attention.head_count_kv"),
            Value::Array((0..g.n_layer).map(|il| Value::U32(if g.is_recurrent(il) { 0 } else { 1 })).collect()),
        ),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(g.rms_eps)),
        (format!("{a}.expert_count"), u(g.n_expert)),
        (format!("{a}.expert_used_count"), u(g.n_expert_used)),
        (format!("{a}.expert_gating_func"), Value::U32(2)),
        (format!("{a}.attention.key_length"), u(k.kv_lora + g.rope_dims)),
        (format!("{a}.attention.value_length"), u(k.kv_lora)),
        (format!("{a}.vocab_size"), u(g.n_vocab)),
        (format!("{a}.ssm.conv_kernel"), u(g.ssm_conv)),
        (format!("{a}.kda.head_dim"), u(g.ssm_state)),
        (format!("{a}.attention.kv_lora_rank"), u(k.kv_lora)),
        (format!("{a}.rope.dimension_count"), u(g.rope_dims)),
        (format!("{a}.attention.key_length_mla"), u(k.qk_nope + g.rope_dims)),
        (format!("{a}.attention.value_length_mla"), u(k.v_head)),
        (format!("{a}.expert_feed_forward_length"), u(g.n_ff_exp)),
        (format!("{a}.expert_shared_count"), u(g.n_ff_shexp / g.n_ff_exp.max(1))),
        (format!("{a}.leading_dense_block_count"), u(k.n_dense_lead)),
        (format!("{a}.expert_weights_scale"), Value::F32(k.w_scale)),
    ]
}

/// Metadata keys of the architecture (no tokenizer), as convert_hf_to_gguf writes them; `eos`
/// is the vocabulary's end-of-sequence id.
fn arch_metadata(g: &Geometry, name: &str, eos: u32) -> Vec<(String, Value)> {
    if let Some(k) = g.kimi {
        return kimi_metadata(g, &k, name);
    }
    let a = g.arch;
    let u = |x: usize| Value::U32(x as u32);
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), a.into()),
        ("general.type".into(), "model".into()),
        ("general.name".into(), format!("synthetic {name}").into()),
        ("general.size_label".into(), g.size_label.into()),
        (format!("{a}.block_count"), u(g.n_blocks())),
        (format!("{a}.context_length"), Value::U32(g.ctx_train)),
        (format!("{a}.embedding_length"), u(g.n_embd)),
    ];
    if g.n_ff > 0 {
        kv.push((format!("{a}.feed_forward_length"), u(g.n_ff)));
    }
    kv.extend([
        (format!("{a}.attention.head_count"), u(g.n_head)),
        (format!("{a}.attention.head_count_kv"), u(g.n_head_kv)),
    ]);
    if !g.is_qwen3next() {
        kv.push((format!("{a}.rope.dimension_sections"), Value::Array(g.rope_sections.iter().map(|&s| Value::I32(s)).collect())));
    }
    kv.extend([
        (format!("{a}.rope.freq_base"), Value::F32(g.rope_freq_base)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(g.rms_eps)),
    ]);
    if g.is_moe() {
        kv.extend([
            (format!("{a}.expert_count"), u(g.n_expert)),
            (format!("{a}.expert_used_count"), u(g.n_expert_used)),
        ]);
    }
    kv.extend([
        (format!("{a}.attention.key_length"), u(g.head_dim)),
        (format!("{a}.attention.value_length"), u(g.head_dim)),
    ]);
    if g.is_moe() {
        kv.extend([
            (format!("{a}.expert_feed_forward_length"), u(g.n_ff_exp)),
            (format!("{a}.expert_shared_feed_forward_length"), u(g.n_ff_shexp)),
        ]);
    }
    kv.extend([
        (format!("{a}.ssm.conv_kernel"), u(g.ssm_conv)),
        (format!("{a}.ssm.state_size"), u(g.ssm_state)),
        (format!("{a}.ssm.group_count"), u(g.ssm_groups)),
        (format!("{a}.ssm.time_step_rank"), u(g.ssm_dt_rank)),
        (format!("{a}.ssm.inner_size"), u(g.ssm_inner())),
        (
            format!("{a}.attention.recurrent_layers"),
            Value::Array((0..g.n_blocks()).map(|il| Value::Bool(g.is_recurrent(il))).collect()),
        ),
        (format!("{a}.full_attention_interval"), u(g.full_attn_interval)),
        (format!("{a}.rope.dimension_count"), u(g.rope_dims)),
    ]);
    if g.nextn {
        kv.push((format!("{a}.nextn_predict_layers"), u(1)));
    }
    if let Some(q) = &g.q4x {
        kv.extend(qwen4exp::metadata(g, q, eos));
    }
    kv
}

/// What `write_synthetic` wrote.
#[derive(Clone, Debug)]
pub struct SynthReport {
    pub path: PathBuf,
    pub file_bytes: u64,
    pub tensor_bytes: u64,
    pub n_params: u64,
    pub n_tensors: usize,
}

/// Progress of a write, reported after each tensor.
#[derive(Clone, Debug)]
pub struct SynthProgress<'a> {
    pub tensor: &'a str,
    pub tensors_done: usize,
    pub n_tensors: usize,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// Writes `preset` to `path` (through `path.part`, renamed when complete). Tokenizer metadata is
/// every `tokenizer.*` key of `vocab`, its per-token arrays padded to the preset's vocabulary
/// with `[PAD{id}]` tokens; with no `vocab`, a small byte-level BPE vocabulary is synthesized.
/// The same preset and seed give the same bytes.
pub fn write_synthetic(preset: Preset, path: &Path, vocab: Option<&GgufFile>, seed: u64) -> Result<SynthReport> {
    write_synthetic_with_progress(preset, path, vocab, seed, &mut |_| {})
}

pub fn write_synthetic_with_progress(
    preset: Preset,
    path: &Path,
    vocab: Option<&GgufFile>,
    seed: u64,
    progress: &mut dyn FnMut(&SynthProgress<'_>),
) -> Result<SynthReport> {
    write_geometry(&preset.geometry(), preset.name(), Mix::Q4KM, path, vocab, seed, progress)
}

/// Writes any geometry (a preset's or `random_geometry`'s) with the tensor types of `mix`,
/// named `synthetic {name}`. Matrix types a pool holds (Q8_0, Q4_K, Q6_K) are drawn from it;
/// any other type is quantized from fresh N(0, 0.02²) values with the reference quantizer.
pub fn write_geometry(
    g: &Geometry,
    name: &str,
    mix: Mix,
    path: &Path,
    vocab: Option<&GgufFile>,
    seed: u64,
    progress: &mut dyn FnMut(&SynthProgress<'_>),
) -> Result<SynthReport> {
    if g.nextn && (g.kimi.is_some() || g.is_qwen3next() || g.q4x.is_some()) {
        return Err(SynthError::Invalid(format!("{}: an MTP (nextn) block is written for qwen35 and qwen35moe only", g.arch)));
    }
    if let Some(q) = &g.q4x {
        qwen4exp::validate(g, q).map_err(SynthError::Invalid)?;
    }
    let mut plan = tensor_plan(g);
    mix.apply(&mut plan);
    let tok = match vocab {
        Some(f) => vocab::from_gguf(f, g.n_vocab)?,
        None => vocab::synthetic(g.n_vocab),
    };
    let eos = tok.iter().find(|(k, _)| k == "tokenizer.ggml.eos_token_id").and_then(|(_, v)| v.as_u64()).unwrap_or(0) as u32;
    let mut w = GgufWriter::new();
    for (k, v) in arch_metadata(g, name, eos) {
        w.add_kv(&k, v);
    }
    for (k, v) in tok {
        w.add_kv(&k, v);
    }
    w.add_kv("general.quantization_version", Value::U32(2));
    w.add_kv("general.file_type", Value::U32(mix.file_type()));
    for t in &plan {
        w.add_tensor_info(&t.name, t.ty, &t.dims)?;
    }

    let part = PathBuf::from(format!("{}.part", path.display()));
    let result = stream_tensors(&w, &plan, &part, seed, progress);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, path)?;
    Ok(SynthReport {
        path: path.to_path_buf(),
        file_bytes: std::fs::metadata(path)?.len(),
        tensor_bytes: plan.iter().map(TensorPlan::n_bytes).sum(),
        n_params: plan.iter().map(TensorPlan::n_elements).sum(),
        n_tensors: plan.len(),
    })
}

/// Bytes handed to the writer at a time: large enough for sequential disk writes, small enough
/// that memory use does not depend on the model.
const CHUNK_BYTES: usize = 4 << 20;

fn stream_tensors(
    w: &GgufWriter,
    plan: &[TensorPlan],
    part: &Path,
    seed: u64,
    progress: &mut dyn FnMut(&SynthProgress<'_>),
) -> Result<()> {
    let file = std::fs::File::create(part)?;
    let mut stream = w.stream_to(BufWriter::with_capacity(CHUNK_BYTES, file))?;
    let pools = Pools::new(seed)?;
    let bytes_total: u64 = plan.iter().map(TensorPlan::n_bytes).sum();
    let mut bytes_done = 0;
    let mut buf = Vec::with_capacity(CHUNK_BYTES);
    for (i, t) in plan.iter().enumerate() {
        // Seeded per tensor name so a tensor's bytes do not depend on the ones before it.
        let mut rng = Rng::new(seed ^ fnv1a(t.name.as_bytes()));
        let n = t.n_bytes();
        if t.fill == Fill::Matrix && pools.get(t.ty).is_none() {
            // whole rows at a time (a quantizer's blocks never cross a row), so that a table of
            // billions of values is not held in f32 at once; the same bytes as one call
            let row = t.dims.first().copied().unwrap_or(1).max(1) as usize;
            let rows_per_chunk = (CHUNK_BYTES / 4 / row).max(1);
            let mut left = t.n_elements() as usize / row;
            let mut x = Vec::with_capacity(rows_per_chunk * row);
            while left > 0 {
                let k = left.min(rows_per_chunk);
                x.clear();
                x.extend((0..k * row).map(|_| WEIGHT_STD * rng.normal()));
                let q = xwen_kernels::quantize(t.ty, &x).map_err(|e| SynthError::Invalid(format!("{} as {}: {e}", t.name, t.ty)))?;
                stream.write_data(&q)?;
                left -= k;
            }
        } else if let (Fill::Matrix, Some(pool)) = (t.fill, pools.get(t.ty)) {
            let bs = t.ty.type_size();
            let pool_blocks = pool.len() / bs;
            let mut left = n as usize / bs;
            while left > 0 {
                let k = left.min(CHUNK_BYTES / bs);
                buf.clear();
                for _ in 0..k {
                    let j = rng.below(pool_blocks);
                    buf.extend_from_slice(&pool[j * bs..(j + 1) * bs]);
                }
                stream.write_data(&buf)?;
                left -= k;
            }
        } else {
            let vals: Vec<f32> = (0..t.n_elements()).map(|_| f32_value(t.fill, &mut rng)).collect();
            buf.clear();
            buf.extend(vals.iter().flat_map(|v| v.to_le_bytes()));
            stream.write_data(&buf)?;
        }
        bytes_done += n;
        progress(&SynthProgress { tensor: &t.name, tensors_done: i + 1, n_tensors: plan.len(), bytes_done, bytes_total });
    }
    let bw = stream.finish()?;
    let file = bw.into_inner().map_err(|e| e.into_error())?;
    // Flush to disk now, so a benchmark started right after does not share the machine with
    // 20 GB of write-back.
    file.sync_all()?;
    Ok(())
}

fn f32_value(fill: Fill, rng: &mut Rng) -> f32 {
    match fill {
        Fill::Norm => 1.0 + 0.05 * rng.normal(),
        Fill::Normal(std) => std * rng.normal(),
        Fill::SsmA => -(rng.uniform(-1.0, 1.0).exp()),
        Fill::Uniform => rng.uniform(-1.0, 1.0),
        Fill::Matrix => unreachable!("matrices are drawn from pools"),
    }
}

/// Standard deviation of the synthetic matrix weights (a typical initializer_range).
pub const WEIGHT_STD: f32 = 0.02;
/// Elements quantized per pool: 1024 Q4_K / Q6_K blocks, 8192 Q8_0 blocks.
const POOL_ELEMS: usize = 1 << 18;

struct Pools {
    q8_0: Vec<u8>,
    q4_k: Vec<u8>,
    q6_k: Vec<u8>,
}

impl Pools {
    fn new(seed: u64) -> Result<Pools> {
        let mut rng = Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15);
        let x: Vec<f32> = (0..POOL_ELEMS).map(|_| WEIGHT_STD * rng.normal()).collect();
        let q = |ty| xwen_kernels::quantize(ty, &x).map_err(|e| SynthError::Invalid(format!("synthetic {ty} pool: {e}")));
        Ok(Pools { q8_0: q(GgmlType::Q8_0)?, q4_k: q(GgmlType::Q4_K)?, q6_k: q(GgmlType::Q6_K)? })
    }

    /// The pool of `ty`'s blocks, if it has one.
    fn get(&self, ty: GgmlType) -> Option<&[u8]> {
        match ty {
            GgmlType::Q8_0 => Some(&self.q8_0),
            GgmlType::Q4_K => Some(&self.q4_k),
            GgmlType::Q6_K => Some(&self.q6_k),
            _ => None,
        }
    }
}

/// 64-bit FNV-1a: seeds each tensor's draws by name, and hashes files and logits rows in the
/// random-geometry records (tools/oracle/random_geometry.py computes the same).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// SplitMix64: tiny, seedable, and far better than these draws need.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n < 2^32).
    fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit() as f32
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f32 {
        let u1 = 1.0 - self.unit(); // (0, 1]: ln stays finite
        let u2 = self.unit();
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

#[cfg(test)]
mod tests;
