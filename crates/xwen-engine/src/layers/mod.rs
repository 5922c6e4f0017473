//! The blocks every architecture is built from, math only: gated attention, Gated DeltaNet
//! (the delta rule), the dense SwiGLU FFN and the MoE FFN. Each takes a batch (`batch::Rows`)
//! and the states of its sequences; none knows which architecture calls it.

pub mod attention;
pub mod attn_res;
pub mod deltanet;
pub mod ffn;
pub mod hyper_conn;
pub mod mla;
pub mod moe;
pub mod ple;
pub mod qsa;
