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
    /// State matrices of kept states let go (rolled past, aged out), for the next verify.
    pub spare: Spare,
}

/// State-sized buffers a sequence's kept states no longer need, reused for the states the next
/// verify keeps: each verify of k tokens keeps k states of H_v·S_v·S_k floats per layer (2 MiB
/// each on the 35B-A3B and the 4B), which fresh would be k zeroed allocations per layer and
/// step, the pages faulted in again each time. At most `keep` of them are held, so the kept and
/// spare states together stay within what a verify of that depth holds at its peak; a clone of
/// the state (a snapshot) starts without any.
#[derive(Debug, Default)]
pub struct Spare(Vec<Vec<f32>>);

impl Clone for Spare {
    fn clone(&self) -> Self {
        Spare::default()
    }
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
        DeltaState::of(touched_zeros(conv_len), touched_zeros(state_len))
    }

    /// A state of these conv and delta values, keeping nothing for a rollback (a checkpoint's
    /// content, a state read back from a device).
    pub fn of(conv: Vec<f32>, s: Vec<f32>) -> Self {
        DeltaState { conv, s, keep: 0, past: Default::default(), spare: Spare::default() }
    }

    /// A buffer for a kept state matrix (`s.len()` floats, contents unspecified: the scan
    /// overwrites all of it): a spare one where there is one.
    pub fn state_buffer(&mut self) -> Vec<f32> {
        match self.spare.0.pop() {
            Some(v) => v,
            None => vec![0.0f32; self.s.len()],
        }
    }

    /// Takes back a state matrix no longer kept, while fewer than `keep` are spare.
    pub fn recycle(&mut self, v: Vec<f32>) {
        if v.len() == self.s.len() && self.spare.0.len() < self.keep {
            self.spare.0.push(v);
        }
    }

    /// Drops every spare buffer beyond `keep` (after the depth is lowered).
    pub fn trim_spare(&mut self) {
        self.spare.0.truncate(self.keep);
    }

    /// Spare buffers held (for tests and the memory figures).
    pub fn spare_count(&self) -> usize {
        self.spare.0.len()
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
