//! PLE, the per-layer n-gram embedding of qwen4exp (llama.cpp b11434 `qwen4exp.cpp::build_ple`
//! and `llm_graph_input_qwen4exp_ple::set_input`), added to the hc-wide residual before its
//! layer's mixer:
//!   rows   for each order k = 2..n, mixed = (t0·m0) ^ (t1·m1) ^ … ^ (t_{k−1}·m_{k−1}) (u64,
//!          wrapping; t_j the token j back, a missing one or any at or before an EOS reads as
//!          EOS), head h of the order: row = mixed mod V_h + offset_h   (V_h prime)
//!   e      = the heads' rows of `per_layer_token_embd`, concatenated (n wide)
//!   gate_s = sigmoid(sgn(c)·√max(|c|, 1e-6)), c = ⟨norm_k(key(e))_s, norm_q(x_s)⟩/√n
//!   g_s    = value(e)·gate_s
//!   x_s   += g_s + silu(conv(norm_c(g)))_s    conv: depthwise, causal, K taps dilated by n
//! The n−1 last tokens and the conv's (K−1)·n history rows are the sequence's state.

use crate::batch::Rows;
use crate::ctx::Ctx;
use crate::error::{EngineError, Result};
use crate::experts::rows::RowsFailed;
use crate::state::recurrent::PastState;
use crate::state::DeltaState;
use crate::weights::{Loader, Mat};

#[derive(Clone, Debug)]
pub struct PleDims {
    pub ngram: usize,
    pub heads_per_ngram: usize,
    pub head_dim: usize,
    pub kernel: usize,
    pub eos: u32,
    pub multipliers: Vec<u64>,
    pub offsets: Vec<u64>,
    pub vocab: Vec<u64>,
    pub hc: usize,
    pub n: usize,
    pub eps: f32,
}

impl PleDims {
    pub fn n_heads(&self) -> usize {
        (self.ngram - 1) * self.heads_per_ngram
    }
    /// History rows of the conv.
    pub fn hist(&self) -> usize {
        (self.kernel - 1) * self.ngram
    }
    /// The state: the conv history (hist × hc·n), then the n−1 last tokens (as f32, −1 none).
    pub fn state_len(&self) -> usize {
        self.hist() * self.hc * self.n + self.ngram - 1
    }
    pub fn zero_state(&self) -> DeltaState {
        let mut s = DeltaState::zeroed(self.state_len(), 0);
        let h = self.hist() * self.hc * self.n;
        s.conv[h..].fill(-1.0);
        s
    }

    /// The table rows of the token at `ctx[0]` whose predecessors are ctx[1..] (nearest first,
    /// None before the sequence start), one per head.
    #[allow(clippy::needless_range_loop)] // the hash reads like llama.cpp's set_input
    pub fn rows_of(&self, ctx: &[Option<u32>], out: &mut Vec<usize>) {
        let mut c = vec![0u64; self.ngram];
        c[0] = ctx[0].unwrap_or(self.eos) as u64;
        let mut cut = false;
        for s in 1..self.ngram {
            let t = if cut { None } else { ctx.get(s).copied().flatten() };
            cut = cut || t.is_none() || t == Some(self.eos);
            c[s] = if cut { self.eos as u64 } else { t.unwrap() as u64 };
        }
        for k in 2..=self.ngram {
            let mut mixed = c[0].wrapping_mul(self.multipliers[0]);
            for j in 1..k {
                mixed ^= c[j].wrapping_mul(self.multipliers[j]);
            }
            for g in 0..self.heads_per_ngram {
                let h = (k - 2) * self.heads_per_ngram + g;
                out.push((mixed % self.vocab[h] + self.offsets[h]) as usize);
            }
        }
    }
}

pub struct PleWeights {
    pub key: Mat,
    pub value: Mat,
    pub norm_key: Vec<f32>,
    pub norm_query: Vec<f32>,
    pub norm_conv: Vec<f32>,
    /// [channel][kernel]
    pub conv: Vec<f32>,
}

impl PleWeights {
    pub fn load(ld: &Loader, il: usize, d: &PleDims) -> Result<Self> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let w = d.hc * d.n;
        Ok(PleWeights {
            key: ld.mat(&p("ple_key.weight"), w, d.n)?,
            value: ld.mat(&p("ple_value.weight"), d.n, d.n)?,
            norm_key: ld.vec(&p("ple_norm_key.weight"), w)?,
            norm_query: ld.vec(&p("ple_norm_query.weight"), w)?,
            norm_conv: ld.vec(&p("ple_norm_conv.weight"), w)?,
            conv: ld.f32_tensor(&p("ple_conv1d.weight"), &[d.kernel as u64, w as u64])?,
        })
    }
}

/// Keeps the PLE state before each of the span's last `st.keep` tokens (`SeqState::rollback`
/// returns to any of them, as it does the DeltaNet layers'): the conv history then (the `hist`
/// rows of `window` — the span's history rows, then its normed rows — before that token) and
/// the n−1 tokens before it. `st` is still the state before the span.
fn keep_states(st: &mut DeltaState, d: &PleDims, window: &[f32], span: &[u32], pos0: usize, wide: usize) {
    let hist = d.hist();
    let before: Vec<f32> = st.conv[hist * wide..].to_vec();
    // states at or past this span's start belong to positions rolled back over
    st.past.retain(|p| p.pos < pos0);
    for j in span.len() - st.keep.min(span.len())..span.len() {
        let mut conv = window[j * wide..(j + hist) * wide].to_vec();
        let toks: Vec<f32> = before.iter().copied().chain(span[..j].iter().map(|&t| t as f32)).collect();
        conv.extend_from_slice(&toks[toks.len() - (d.ngram - 1)..]);
        st.past.push_back(PastState { pos: pos0 + j, conv, s: Vec::new() });
    }
    while st.past.len() > st.keep {
        st.past.pop_front();
    }
}

/// The table rows every token of the batch reads (`tokens` in row order; `states[i]` span i's
/// PLE state before the step): token t's head h at t·n_heads + h. They depend on the tokens
/// alone, so a streamed table's can be read before the layers ahead of the PLE layer run.
pub fn row_ids(d: &PleDims, table_rows: usize, tokens: &[u32], rows: &Rows, states: &[&DeltaState]) -> Result<Vec<usize>> {
    let hstate = d.hist() * d.hc * d.n;
    let mut idx = Vec::with_capacity(rows.n * d.n_heads());
    for (s, st) in rows.spans.iter().zip(states) {
        let prev: Vec<Option<u32>> = st.conv[hstate..].iter().map(|&v| if v < 0.0 { None } else { Some(v as u32) }).collect();
        for i in 0..s.len {
            // the token, then its predecessors nearest first
            let mut c = Vec::with_capacity(d.ngram);
            for j in 0..d.ngram {
                c.push(if j <= i { Some(tokens[s.start + i - j]) } else { prev[prev.len() - (j - i)] });
            }
            d.rows_of(&c, &mut idx);
        }
    }
    if let Some(&r) = idx.iter().find(|&&r| r >= table_rows) {
        return Err(EngineError::BadHparams(format!("PLE row {r} past the table's {table_rows}")));
    }
    Ok(idx)
}

/// e (rows × n) from the rows `row_ids` named, as `Ctx::table_rows` (or a read started early)
/// delivered them: the tokens whose rows were not read take zeros, and their sequences fail
/// when the forward ends (`Ctx::expert_failed`).
pub fn settle_rows(ctx: &Ctx, d: &PleDims, e: &mut [f32], failed: Option<RowsFailed>) -> Result<()> {
    let Some(f) = failed else { return Ok(()) };
    let mut bad: Vec<usize> = f.positions.iter().map(|&p| p / d.n_heads()).collect();
    bad.sort_unstable();
    bad.dedup();
    for &t in &bad {
        e[t * d.n..(t + 1) * d.n].fill(0.0);
    }
    ctx.expert_failed(bad, f.error)
}

/// The rows of `idx` read now (the mapping, or the streamed table), as `settle_rows` leaves
/// them.
pub fn read_rows(ctx: &Ctx, table: &Mat, d: &PleDims, idx: &[usize]) -> Result<Vec<f32>> {
    let mut e = vec![0.0f32; idx.len() * d.head_dim];
    let failed = ctx.table_rows(table, idx, &mut e)?;
    settle_rows(ctx, d, &mut e, failed)?;
    Ok(e)
}

/// Adds the n-gram embedding to the streams x (rows.n × hc × n) of the batch whose tokens are
/// `tokens` (row order), its table rows `e` (rows.n × n, `read_rows`); `states[i]` is span i's
/// PLE state, advanced past its rows.
#[allow(clippy::too_many_arguments)] // the batch, its tokens and rows and the sequences' states
pub fn forward(ctx: &Ctx, w: &PleWeights, d: &PleDims, e: &[f32], x: &mut [f32], tokens: &[u32], rows: &Rows, states: &mut [&mut DeltaState]) -> Result<()> {
    let (hc, n) = (d.hc, d.n);
    let wide = hc * n;
    let be = ctx.backend;
    let hist = d.hist();
    let hstate = hist * wide;
    if e.len() != rows.n * n {
        return Err(EngineError::State(format!("PLE: {} embedding values for {} rows of {n}", e.len(), rows.n)));
    }
    ctx.tap("ple_embd", None, e, n);
    let mut p = ctx.mm_rows(&[&w.key, &w.value], e, rows).into_iter();
    let (key, value) = (p.next().unwrap(), p.next().unwrap());
    let mut kn = ctx.zeros(rows.n * wide);
    be.rms_norm_streams(&key, &w.norm_key, n, d.eps, &mut kn);
    let mut qn = ctx.zeros(rows.n * wide);
    be.rms_norm_streams(x, &w.norm_query, n, d.eps, &mut qn);
    let mut gate = ctx.zeros(rows.n * hc);
    be.ple_gate(&kn, &qn, n, &mut gate);
    // g_s = value·gate_s (a product onto zeros: the combine's op with nothing to add)
    let mut gated = ctx.zeros(rows.n * wide);
    be.hc_post(&mut gated, &value, &gate, hc);
    let mut normed = ctx.zeros(rows.n * wide);
    be.rms_norm_streams(&gated, &w.norm_conv, n, d.eps, &mut normed);
    let mut conv = ctx.zeros(rows.n * wide);
    for (s, st) in rows.spans.iter().zip(states.iter_mut()) {
        let mut window = Vec::with_capacity((hist + s.len) * wide);
        window.extend_from_slice(&st.conv[..hstate]);
        window.extend_from_slice(&normed[s.start * wide..(s.start + s.len) * wide]);
        be.dilated_conv(&window, &w.conv, d.kernel, d.ngram, wide, &mut conv[s.start * wide..(s.start + s.len) * wide]);
        if st.keep > 0 {
            keep_states(st, d, &window, &tokens[s.start..s.start + s.len], s.pos0, wide);
        }
        let total = hist + s.len;
        st.conv[..hstate].copy_from_slice(&window[(total - hist) * wide..]);
        // the last n−1 tokens, oldest first
        let mut last: Vec<f32> = st.conv[hstate..].to_vec();
        for &t in &tokens[s.start..s.start + s.len] {
            last.remove(0);
            last.push(t as f32);
        }
        st.conv[hstate..].copy_from_slice(&last);
    }
    be.silu_rows(&mut conv, wide);
    be.add(&mut gated, &conv);
    be.add(x, &gated);
    Ok(())
}
