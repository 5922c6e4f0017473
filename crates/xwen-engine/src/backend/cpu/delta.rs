//! The delta rule on the pool, one task per (sequence, V-head): the token-by-token recurrence
//! llama.cpp's CPU build runs (its fused op, bit for bit), and the chunked (WY) form a prefill may
//! take instead (`--prefill-scan chunked`) — for Gated DeltaNet's scalar gate and KDA's
//! per-channel one.

use crate::backend::{DeltaScan, HeadPairing, ScanState};
use super::SharedMut;
use crate::ops;
use xwen_kernels::Pool;

pub fn scan(pool: &Pool, sc: &DeltaScan, states: &mut [ScanState], o: &mut [f32]) {
    let (hk, hv, sd) = (sc.hk, sc.hv, sc.sd);
    let gw = if sc.channels { sd } else { 1 };
    let rows = sc.rows;
    debug_assert_eq!(states.len(), rows.spans.len(), "one state per span");
    let o_all = SharedMut::new(o);
    let snap_ptrs: Vec<Vec<SharedMut<f32>>> = states.iter_mut().map(|st| st.kept.iter_mut().map(|b| SharedMut::new(b)).collect()).collect();
    let keep_from: Vec<usize> = states.iter().map(|st| st.keep_from).collect();
    let s_ptrs: Vec<SharedMut<f32>> = states.iter_mut().map(|st| SharedMut::new(st.s)).collect();
    pool.run(rows.spans.len() * hv, &|task| {
        let (si, h) = (task / hv, task % hv);
        let span = &rows.spans[si];
        let (a, b) = (span.start, span.start + span.len);
        // SAFETY: task (si, h) touches only head h's state of sequence si and head h's
        // output columns of that sequence's rows.
        let s = unsafe { s_ptrs[si].slice(h * sd * sd, sd * sd) };
        let base = o_all; // the whole Sync wrapper, not its raw field
        let o_span = SharedMut(unsafe { base.0.add(a * hv * sd) });
        let io = HeadIo {
            q: &sc.q[a * hk * sd..b * hk * sd],
            k: &sc.k[a * hk * sd..b * hk * sd],
            v: &sc.v[a * hv * sd..b * hv * sd],
            g: &sc.g[a * hv * gw..b * hv * gw],
            beta: &sc.beta[a * hv..b * hv],
            h,
            hk,
            hv,
            sd,
            pairing: sc.pairing,
            channels: sc.channels,
        };
        let keep = Keep { from: keep_from[si], into: &snap_ptrs[si] };
        // the chunked form only where asked (`--scan chunked`): the recurrence is what
        // llama.cpp's CPU build runs (the fused op), bit for bit
        if sc.chunked && span.len >= CHUNKED_MIN_TOKENS && !span.decode_order && keep.from == span.len {
            head_chunked(&io, span.len, s, o_span);
        } else {
            head_recurrent(&io, span.len, s, o_span, &keep);
        }
    });
}

/// Chunk length of the chunked prefill form (llama.cpp uses 64 for GDN).
pub const CHUNK: usize = 64;

/// Token count from which prefill switches from the recurrence to the chunked form.
pub const CHUNKED_MIN_TOKENS: usize = 8;

struct HeadIo<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    h: usize,
    hk: usize,
    hv: usize,
    sd: usize,
    pairing: HeadPairing,
    /// g holds S_k values per (token, head) (KDA), not one.
    channels: bool,
}

impl HeadIo<'_> {
    fn q(&self, t: usize) -> &[f32] {
        let kh = self.pairing.k_head(self.h, self.hk, self.hv);
        &self.q[(t * self.hk + kh) * self.sd..][..self.sd]
    }
    fn k(&self, t: usize) -> &[f32] {
        let kh = self.pairing.k_head(self.h, self.hk, self.hv);
        &self.k[(t * self.hk + kh) * self.sd..][..self.sd]
    }
    fn v(&self, t: usize) -> &[f32] {
        &self.v[(t * self.hv + self.h) * self.sd..][..self.sd]
    }
    fn g(&self, t: usize) -> f32 {
        self.g[t * self.hv + self.h]
    }
    /// KDA: this head's per-channel gates of token t.
    fn g_channels(&self, t: usize) -> &[f32] {
        &self.g[(t * self.hv + self.h) * self.sd..][..self.sd]
    }
    fn beta(&self, t: usize) -> f32 {
        self.beta[t * self.hv + self.h]
    }
    fn out_offset(&self, t: usize) -> usize {
        (t * self.hv + self.h) * self.sd
    }
}


/// The token-by-token recurrence with ggml's element-wise arithmetic (scale the state, S·k,
/// rank-1 update, S·q), each state row finished in one visit instead of ggml's four sweeps
/// (`f32ops::delta_rule_step`): decode is memory-bound with a 2 MB state per layer on the 35B,
/// and prefill keeps a head's 64 KB state in L2 across its tokens.
/// Tokens `from..` of a span whose state before them is kept: `into[t - from]` receives head
/// h's slice (h·S_v·S_k..) of the state before token t.
struct Keep<'a> {
    from: usize,
    into: &'a [SharedMut<f32>],
}

fn head_recurrent(io: &HeadIo, n: usize, s: &mut [f32], o: SharedMut<f32>, keep: &Keep) {
    let sd = io.sd;
    let scale = 1.0 / (sd as f32).sqrt();
    // KDA's per-channel decays of the current token (one buffer for the span)
    let mut decay = vec![0.0f32; if io.channels { sd } else { 0 }];
    for t in 0..n {
        if t >= keep.from {
            // SAFETY: head h's slice of the buffer of token t belongs to this task alone.
            unsafe { keep.into[t - keep.from].slice(io.h * sd * sd, sd * sd) }.copy_from_slice(s);
        }
        let (q, k, v) = (io.q(t), io.k(t), io.v(t));
        // SAFETY: this head's output slot for token t.
        let out = unsafe { o.slice(io.out_offset(t), sd) };
        if io.channels {
            // ggml's kda branch: expf of each channel's gate, then the row-wise product
            for (d, g) in decay.iter_mut().zip(io.g_channels(t)) {
                *d = g.exp();
            }
            xwen_kernels::f32ops::delta_rule_step_channels(s, k, q, v, &decay, io.beta(t), scale, out);
        } else {
            xwen_kernels::f32ops::delta_rule_step(s, k, q, v, io.g(t).exp(), io.beta(t), scale, out);
        }
    }
}

/// The chunked (WY) form. Within a chunk of C tokens with cumulative log-decay γ_t (one per
/// head for Gated DeltaNet; one per key channel for KDA, where every Γ below is taken channel
/// by channel inside the key products):
///   A = strict_lower(diag(β) K Kᵀ ⊙ Γ),  Γ_ts = exp(γ_t − γ_s)
///   T = (I + A)⁻¹                                   (forward substitution)
///   U = T (diag(β) V),  W = T (diag(β) K ⊙ e^γ)     (the "WY" pseudo-values and keys)
///   V' = U − W S₀ᵀ                                   (values corrected by the incoming state)
///   O  = (Q ⊙ e^γ) S₀ᵀ + (lower(Q Kᵀ ⊙ Γ)) V'
///   S  = S₀ ⊙ e^{γ_C} + V'ᵀ (K ⊙ e^{γ_C − γ})
/// which is the recurrence unrolled over the chunk (delta-net-base.cpp builds the same graph
/// for both; a per-channel Γ is exp(γ_t − γ_s) per channel, never e^γ_t · e^−γ_s, which would
/// overflow where the decay is strong).
fn head_chunked(io: &HeadIo, n: usize, s: &mut [f32], o: SharedMut<f32>) {
    let sd = io.sd;
    let scale = 1.0 / (sd as f32).sqrt();
    // decay lanes per token: one (GDN) or one per key channel (KDA)
    let gw = if io.channels { sd } else { 1 };
    let mut gam = vec![0.0f32; CHUNK * gw];
    let mut a = vec![0.0f32; CHUNK * CHUNK];
    let mut u = vec![0.0f32; CHUNK * sd];
    let mut wk = vec![0.0f32; CHUNK * sd];
    let mut vp = vec![0.0f32; CHUNK * sd];
    let mut qk = vec![0.0f32; CHUNK * CHUNK];
    let mut kw = vec![0.0f32; sd];
    // Σ_x a_x b_x exp(γ_ix − γ_jx) for KDA, (a·b) exp(γ_i − γ_j) for GDN
    let gdot = |x: &[f32], y: &[f32], gi: &[f32], gj: &[f32], kw: &mut [f32]| -> f32 {
        if gw == 1 {
            ops::dot(x, y) * (gi[0] - gj[0]).exp()
        } else {
            for ((w, (&b, &c)), &yv) in kw.iter_mut().zip(gi.iter().zip(gj)).zip(y) {
                *w = yv * (b - c).exp();
            }
            ops::dot(x, kw)
        }
    };
    let mut t0 = 0;
    while t0 < n {
        let c = CHUNK.min(n - t0);
        // Cumulative log decay within the chunk.
        for i in 0..c {
            for l in 0..gw {
                let g = if io.channels { io.g_channels(t0 + i)[l] } else { io.g(t0 + i) };
                gam[i * gw + l] = if i == 0 { g } else { gam[(i - 1) * gw + l] + g };
            }
        }
        let gm = |i: usize| &gam[i * gw..(i + 1) * gw];
        // A (strictly lower) and the masked Q·Kᵀ (lower incl. diagonal).
        for i in 0..c {
            let (ki, qi, bi) = (io.k(t0 + i), io.q(t0 + i), io.beta(t0 + i));
            for j in 0..c {
                if j < i {
                    let kj = io.k(t0 + j);
                    a[i * CHUNK + j] = bi * gdot(ki, kj, gm(i), gm(j), &mut kw);
                    qk[i * CHUNK + j] = gdot(qi, kj, gm(i), gm(j), &mut kw) * scale;
                } else if j == i {
                    a[i * CHUNK + j] = 0.0;
                    qk[i * CHUNK + j] = ops::dot(qi, ki) * scale;
                } else {
                    a[i * CHUNK + j] = 0.0;
                    qk[i * CHUNK + j] = 0.0;
                }
            }
        }
        // U = T·(βV) and W = T·(β K ⊙ e^γ) by forward substitution: row i = rhs_i − Σ_{j<i} A_ij row_j.
        for i in 0..c {
            let bi = io.beta(t0 + i);
            let (vi, ki) = (io.v(t0 + i), io.k(t0 + i));
            for x in 0..sd {
                u[i * sd + x] = bi * vi[x];
                wk[i * sd + x] = bi * gm(i)[x % gw].exp() * ki[x];
            }
            for j in 0..i {
                let aij = a[i * CHUNK + j];
                if aij != 0.0 {
                    let (ur, wr) = (u.split_at_mut(i * sd), wk.split_at_mut(i * sd));
                    let (uj, ui) = (&ur.0[j * sd..(j + 1) * sd], &mut ur.1[..sd]);
                    let (wj, wi) = (&wr.0[j * sd..(j + 1) * sd], &mut wr.1[..sd]);
                    ops::axpy(-aij, uj, ui);
                    ops::axpy(-aij, wj, wi);
                }
            }
        }
        // V' = U − W·S₀ᵀ   (S rows are value index, columns key index: (W S₀ᵀ)_ij = Σ_x W_ix S_jx)
        for i in 0..c {
            let wi = &wk[i * sd..(i + 1) * sd];
            for j in 0..sd {
                vp[i * sd + j] = u[i * sd + j] - ops::dot(&s[j * sd..(j + 1) * sd], wi);
            }
        }
        // O = (Q ⊙ e^γ)·S₀ᵀ·scale + QK·V'
        for i in 0..c {
            let qi = io.q(t0 + i);
            for (x, w) in kw.iter_mut().enumerate() {
                *w = qi[x] * gm(i)[x % gw].exp() * scale;
            }
            // SAFETY: this head's output slot for token t0+i.
            let out = unsafe { o.slice(io.out_offset(t0 + i), sd) };
            for j in 0..sd {
                out[j] = ops::dot(&s[j * sd..(j + 1) * sd], &kw);
            }
            for jt in 0..=i {
                let w = qk[i * CHUNK + jt];
                if w != 0.0 {
                    ops::axpy(w, &vp[jt * sd..(jt + 1) * sd], out);
                }
            }
        }
        // S = S₀ ⊙ e^{γ_C} + V'ᵀ (K ⊙ e^{γ_C − γ})   (the decay scales key columns)
        let glast = gm(c - 1).to_vec();
        let dl: Vec<f32> = glast.iter().map(|g| g.exp()).collect();
        for row in s.chunks_exact_mut(sd) {
            for (x, v) in row.iter_mut().enumerate() {
                *v *= dl[x % gw];
            }
        }
        for i in 0..c {
            let ki = io.k(t0 + i);
            for (x, w) in kw.iter_mut().enumerate() {
                *w = ki[x] * (glast[x % gw] - gm(i)[x % gw]).exp();
            }
            let vr = &vp[i * sd..(i + 1) * sd];
            for (j, row) in s.chunks_exact_mut(sd).enumerate() {
                ops::axpy(vr[j], &kw, row);
            }
        }
        t0 += c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: &mut u64) -> f32 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The chunked form equals the recurrence (up to float reassociation) across chunk borders,
    /// with a non-zero incoming state, for both K-head pairings.
    #[test]
    fn chunked_equals_recurrent() {
        for pairing in [HeadPairing::Tiled, HeadPairing::Grouped] {
            for channels in [false, true] {
                chunked_equals_recurrent_with(pairing, channels);
            }
        }
    }

    /// `channels`: KDA's per-key-channel decay (g holds S_k gates per token and head), with
    /// strong and weak channels side by side.
    fn chunked_equals_recurrent_with(pairing: HeadPairing, channels: bool) {
        let (hk, hv, sd, n) = (2, 4, 16, 150);
        let mut seed = 0x1234_5678_9abc_def0u64;
        let gen = |len: usize, s: &mut u64| (0..len).map(|_| rng(s)).collect::<Vec<f32>>();
        let mut q = gen(n * hk * sd, &mut seed);
        let mut k = gen(n * hk * sd, &mut seed);
        for h in q.chunks_exact_mut(sd).chain(k.chunks_exact_mut(sd)) {
            ops::gdn_l2_norm_inplace(h, 1e-6);
        }
        let v = gen(n * hv * sd, &mut seed);
        let gates = if channels { n * hv * sd } else { n * hv };
        let g: Vec<f32> = gen(gates, &mut seed)
            .iter()
            .enumerate()
            .map(|(i, x)| {
                // KDA: every 5th channel decays hard (its e^γ over a chunk underflows f32)
                let strong = channels && i % 5 == 0;
                if strong { -4.0 * (x + 1.0) - 1.0 } else { -0.5 * (x + 1.0) - 0.01 }
            })
            .collect();
        let beta: Vec<f32> = gen(n * hv, &mut seed).iter().map(|x| ops::sigmoid(2.0 * x)).collect();
        let s0 = gen(hv * sd * sd, &mut seed);
        for h in 0..hv {
            let io = HeadIo { q: &q, k: &k, v: &v, g: &g, beta: &beta, h, hk, hv, sd, pairing, channels };
            let mut o1 = vec![0.0f32; n * hv * sd];
            let mut o2 = vec![0.0f32; n * hv * sd];
            let mut s1 = s0[h * sd * sd..(h + 1) * sd * sd].to_vec();
            let mut s2 = s1.clone();
            head_recurrent(&io, n, &mut s1, SharedMut::new(&mut o1), &Keep { from: n, into: &[] });
            head_chunked(&io, n, &mut s2, SharedMut::new(&mut o2));
            let err = |a: &[f32], b: &[f32]| {
                let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
                let den: f32 = a.iter().map(|x| x * x).sum();
                (num / den).sqrt()
            };
            assert!(err(&o1, &o2) < 1e-5, "head {h} (channels {channels}): output rel err {}", err(&o1, &o2));
            assert!(err(&s1, &s2) < 1e-5, "head {h} (channels {channels}): state rel err {}", err(&s1, &s2));
            assert!(o2.iter().chain(&s2).all(|x| x.is_finite()));
        }
    }
}
