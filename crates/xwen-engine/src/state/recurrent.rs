//! The recurrent state of one linear-attention layer (Gated DeltaNet, KDA) for one sequence:
//! the causal convolution's last inputs and the delta rule's state matrix per head, and — for a
//! speculative verify — the states before each of the last few tokens, so a rollback to any of
//! them copies a kept state back instead of running anything again.

/// Recurrent state of one DeltaNet layer for one sequence.
#[derive(Clone, Debug)]
pub struct DeltaState {
    /// The last (kernel − 1) inputs of the convolution, oldest first: [(K−1)][conv_dim].
    pub conv: Vec<f32>,
    /// [H_v][S_v][S_k] fp32.
    pub s: Vec<f32>,
    /// How many earlier positions' states to keep (`SeqState::keep_history`): a speculative
    /// verify rolls back to any of them without running anything again.
    pub keep: usize,
    /// The states before each of the last `keep` tokens fed, oldest first.
    pub past: std::collections::VecDeque<PastState>,
}

/// A DeltaNet layer's state at an earlier position (before the token at `pos`).
#[derive(Clone, Debug)]
pub struct PastState {
    pub pos: usize,
    pub conv: Vec<f32>,
    pub s: Vec<f32>,
}

impl DeltaState {
    /// A zero state of `conv_len` conv and `state_len` delta values, its pages written now: a
    /// zeroed allocation maps its pages lazily, so a new sequence's first decode steps would
    /// fault in its whole recurrent state (66 MB on the 35B-A3B) inside the step (llama.cpp
    /// allocates its recurrent cells with the context).
    pub fn zeroed(conv_len: usize, state_len: usize) -> Self {
        DeltaState { conv: touched_zeros(conv_len), s: touched_zeros(state_len), keep: 0, past: Default::default() }
    }
}

fn touched_zeros(n: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n);
    v.resize(n, 0.0f32);
    // the resize of a fresh allocation may compile to a calloc that maps nothing: store into
    // each 4 KiB page through a black box, which the optimizer keeps
    for i in (0..n).step_by(1024) {
        v[i] = std::hint::black_box(0.0);
    }
    v
}
