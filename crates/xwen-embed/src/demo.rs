//! The demo model every front end runs when no model is named: tiny-qwen35 (6 M parameters,
//! trained on CPython's standard library), Q4_K_M, 4 MB, in the binary so nothing is downloaded.

pub static DEMO_GGUF: &[u8] = include_bytes!("../../../models/demo/tiny-qwen35-q4_k_m.gguf");

/// What the demo completes when given no prompt (`xwen run` with neither -p nor -f).
pub const DEMO_PROMPT: &str = "def fibonacci(n):\n";
