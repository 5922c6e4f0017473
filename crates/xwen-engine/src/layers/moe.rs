//! Sparse MoE feed-forward (llama.cpp `build_moe_ffn`): probs = softmax or sigmoid of
//! router · x over all experts → top-k of probs (+ the selection bias `exp_probs_b` where the
//! model has one: DeepSeek-V3 / Kimi) → renormalize the chosen probs (sum clamped at
//! 6.103515625e-5; Kimi K3 may skip this) → times the routed scale → Σ_e p_e · expert_e(x),
//! plus the shared expert, scaled by sigmoid(gate_inp_shexp · x) where it has a gate (Qwen) or
//! added as is (Kimi).
//!
//! A latent MoE (Kimi K3, `ffn_routed_down/_up/_norm`): the router and the shared expert read x,
//! the routed experts read x_l = W_down · x at the latent width, and their weighted sum comes
//! back as W_up · (rms_norm(Σ)·norm) before the shared expert is added.

use crate::batch::{self, Rows};
use crate::backend::{Buf, ExpertFfn, MvJob, RouteRule};
pub use crate::backend::moe_route::{route, route_with, Gating, Route};
use crate::ctx::{Ctx, RouteRecord};
use crate::error::Result;
use crate::experts::store::{ExpertHandle, ExpertStore};
use crate::memory_plan::PREFILL_READ_AHEAD;
use crate::layers::ffn::{self, Act, FfnWeights};
use crate::profile::Op;
use crate::weights::{Loader, Mat};
use std::ops::Range;

#[derive(Clone, Copy, Debug)]
pub struct MoeDims {
    pub n_expert: usize,
    pub n_used: usize,
    pub expert_ff: usize,
    pub shared_ff: usize,
    pub gating: Gating,
    /// Multiplies the renormalized weights (`expert_weights_scale`; 1 = none).
    pub w_scale: f32,
    /// Whether the chosen weights are renormalized to sum 1 (`expert_weights_norm`).
    pub norm_w: bool,
    /// The experts' (and the shared expert's) gated activation.
    pub act: Act,
    /// The routed experts' input width where it is a latent space (`expert_latent_length`), else 0.
    pub latent: usize,
    /// The latent output norm's epsilon (the model's rms eps).
    pub eps: f32,
}

impl MoeDims {
    /// The width the routed experts read and write.
    pub fn expert_width(&self, hidden: usize) -> usize {
        if self.latent > 0 {
            self.latent
        } else {
            hidden
        }
    }
}

/// A latent MoE's projections around the routed experts.
pub struct LatentProj {
    pub down: Mat,               // [latent × hidden]
    pub up: Mat,                 // [hidden × latent]
    pub norm: Option<Vec<f32>>,  // [latent]
}

pub struct MoeWeights {
    pub router: Mat,              // [n_expert × hidden], F32
    pub shared: Option<FfnWeights>,
    pub shared_gate: Option<Vec<f32>>, // [hidden]
    /// The selection bias added to the probabilities before top-k (`exp_probs_b`), [n_expert].
    pub probs_bias: Option<Vec<f32>>,
    pub latent: Option<LatentProj>,
}

impl MoeWeights {
    pub fn load(ld: &Loader, il: usize, hidden: usize, d: &MoeDims) -> Result<(Self, [Mat; 3])> {
        let p = |s: &str| format!("blk.{il}.{s}");
        let router = ld.mat(&p("ffn_gate_inp.weight"), d.n_expert, hidden)?;
        let shared = if d.shared_ff > 0 && ld.has(&p("ffn_gate_shexp.weight")) {
            Some(FfnWeights::load(ld, il, hidden, d.shared_ff, "_shexp")?.with_act(d.act))
        } else {
            None
        };
        let shared_gate = if shared.is_some() && ld.has(&p("ffn_gate_inp_shexp.weight")) {
            Some(ld.vec(&p("ffn_gate_inp_shexp.weight"), hidden)?)
        } else {
            None
        };
        let ew = d.expert_width(hidden);
        let experts = [
            ld.mats(&p("ffn_gate_exps.weight"), d.n_expert, d.expert_ff, ew)?,
            ld.mats(&p("ffn_up_exps.weight"), d.n_expert, d.expert_ff, ew)?,
            ld.mats(&p("ffn_down_exps.weight"), d.n_expert, ew, d.expert_ff)?,
        ];
        let probs_bias = if ld.has(&p("exp_probs_b.bias")) { Some(ld.vec(&p("exp_probs_b.bias"), d.n_expert)?) } else { None };
        let latent = if d.latent > 0 {
            Some(LatentProj {
                down: ld.mat(&p("ffn_routed_down.weight"), d.latent, hidden)?,
                up: ld.mat(&p("ffn_routed_up.weight"), hidden, d.latent)?,
                norm: if ld.has(&p("ffn_routed_norm.weight")) { Some(ld.vec(&p("ffn_routed_norm.weight"), d.latent)?) } else { None },
            })
        } else {
            None
        };
        Ok((MoeWeights { router, shared, shared_gate, probs_bias, latent }, experts))
    }
}

/// The layer's routing rule (`Backend::route` applies it to each row of router logits).
fn rule<'w>(w: &'w MoeWeights, d: &MoeDims) -> RouteRule<'w> {
    RouteRule { n_expert: d.n_expert, n_used: d.n_used, gating: d.gating, bias: w.probs_bias.as_deref(), w_scale: d.w_scale, norm_w: d.norm_w }
}

/// The next MoE layer, whose experts a decode step guesses a layer early: its router applied
/// to this layer's input names ~72% of its top-4 on the trained tiny MoE (docs/bench.md), so a
/// streamed store can read them while this layer and the next one's mixer compute.
#[derive(Clone, Copy)]
pub struct Lookahead<'a> {
    /// The next MoE layer's index in the expert store.
    pub layer: usize,
    pub weights: &'a MoeWeights,
}

/// Per row, the experts `next`'s router picks on this layer's input x (m × hidden).
fn guess_next(ctx: &Ctx, next: Lookahead, d: &MoeDims, x: &[f32], m: usize) -> Vec<Vec<usize>> {
    let mut logits = vec![0.0f32; m * d.n_expert];
    ctx.mv_batch(&mut [MvJob { w: ctx.q(&next.weights.router), x, y: &mut logits }]);
    ctx.backend.route(&logits, &rule(next.weights, d)).into_iter().map(|r| r.experts).collect()
}

/// The rows' guesses as one list, most voted first (ties: the earlier row's, the higher-ranked
/// slot's first).
fn ranked_union(guesses: &[Vec<usize>]) -> Vec<usize> {
    let mut votes: Vec<(usize, usize, usize)> = Vec::new(); // (expert, votes, first seen)
    for (i, e) in guesses.iter().flat_map(|g| g.iter().copied()).enumerate() {
        match votes.iter_mut().find(|v| v.0 == e) {
            Some(v) => v.1 += 1,
            None => votes.push((e, 1, i)),
        }
    }
    votes.sort_by_key(|&(_, n, first)| (std::cmp::Reverse(n), first));
    votes.into_iter().map(|(e, _, _)| e).collect()
}

/// MoE output for the batch `rows` of normalized input x (rows.n × hidden). Batch-invariant:
/// the decode rows of all sequences run together in the one-token order (`forward_decode_rows`),
/// sharing each expert's read among the rows that chose it; each longer span is computed as if
/// it ran alone, though an expert several spans chose is fetched once for all of them
/// (`forward_spans`).
#[allow(clippy::too_many_arguments)] // the layer's weights, geometry, store and batch
pub fn forward_rows<'a>(
    ctx: &Ctx<'a>,
    w: &MoeWeights,
    d: &MoeDims,
    store: &dyn ExpertStore,
    layer: usize,
    x: &[f32],
    rows: &Rows,
    hidden: usize,
    next: Option<Lookahead>,
) -> Result<Buf<'a>> {
    if rows.is_single() && rows.n == 1 {
        return forward_decode_rows(ctx, w, d, store, layer, x, 1, hidden, &[0], next);
    }
    let mut out = ctx.zeros(rows.n * hidden);
    let dec = rows.decode_rows();
    if !dec.is_empty() {
        let xd = batch::gather(x, hidden, &dec);
        let yd = forward_decode_rows(ctx, w, d, store, layer, &xd, dec.len(), hidden, &dec, next)?;
        batch::scatter(&yd, hidden, &dec, &mut out);
    }
    let spans: Vec<Range<usize>> = rows.multi_row_spans().map(|s| s.rows()).collect();
    if !spans.is_empty() {
        forward_spans(ctx, w, d, store, layer, x, &spans, hidden, &mut out)?;
    }
    Ok(out)
}

/// One expert's product over one span's rows that chose it (batch rows, ascending).
struct SpanJob {
    /// Index into the active experts.
    active: usize,
    rows: Vec<usize>,
}

/// Prefill: the MoE output of `spans` — runs of two or more batch rows of x (batch rows ×
/// hidden), each a prompt chunk of one sequence — into those rows of `out`. Every span is
/// routed, its experts' products taken over its own rows and its rows' weighted sums formed
/// exactly as if it ran alone, so its bits never depend on the other spans; but an expert
/// several spans chose is fetched once for all of them. A streamed store so reads each expert
/// at most once per batch: several sequences' prompt chunks in one step, or the chunks of one
/// long prompt passing a layer together (a prefill wave, `hybrid::forward_wave`).
#[allow(clippy::too_many_arguments)] // the layer's weights, geometry, store and batch
fn forward_spans(
    ctx: &Ctx,
    w: &MoeWeights,
    d: &MoeDims,
    store: &dyn ExpertStore,
    layer: usize,
    x: &[f32],
    spans: &[Range<usize>],
    hidden: usize,
    out: &mut [f32],
) -> Result<()> {
    let n_rows = x.len() / hidden;
    let k = d.n_used;
    let sp = ctx.span(Op::MoeRouter);
    // per span: router · x over its rows alone [n × n_expert], each row's route
    let mut routes: Vec<Option<Route>> = vec![None; n_rows];
    // the experts' input by batch row: x, or x_l = W_down · x [n × latent]
    let mut x_latent = w.latent.as_ref().map(|_| vec![0.0f32; n_rows * d.latent]);
    for s in spans {
        let (xs, n) = (&x[s.start * hidden..s.end * hidden], s.len());
        let logits = ctx.mm(&w.router, xs, n);
        let rs: Vec<Route> = ctx.backend.route(&logits[..n * d.n_expert], &rule(w, d));
        record(ctx, layer, &s.clone().collect::<Vec<_>>(), &rs, None);
        for (t, r) in s.clone().zip(rs) {
            routes[t] = Some(r);
        }
        if let (Some(l), Some(xl)) = (&w.latent, x_latent.as_mut()) {
            xl[s.start * d.latent..s.end * d.latent].copy_from_slice(&ctx.mm(&l.down, xs, n));
        }
    }
    let (xe, ew) = match &x_latent {
        Some(xl) => (&xl[..], d.latent),
        None => (x, hidden),
    };

    drop(sp);
    let sp = ctx.span(Op::MoeExperts);
    // Per expert, per span, the rows that chose it: one job each, so a span's product with an
    // expert has the rows (and bits) it has alone. Each (row, slot)'s job and place in it is
    // kept so the weighted outputs are summed in llama.cpp's order (slot 0, then 1, …), not in
    // expert-id order.
    let mut picks: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); d.n_expert]; // (span, row, slot)
    for (si, s) in spans.iter().enumerate() {
        for t in s.clone() {
            for (slot, &e) in routes[t].as_ref().expect("routed above").experts.iter().enumerate() {
                picks[e].push((si, t, slot));
            }
        }
    }
    // Busiest experts first, so the threads' last tasks are the short ones.
    // (a rank of a sharded model: its own block's; the reduction below brings the rest)
    let mut active: Vec<usize> = (0..d.n_expert).filter(|&e| !picks[e].is_empty() && ctx.shard.is_none_or(|sh| sh.owns(e))).collect();
    active.sort_by_key(|&e| std::cmp::Reverse(picks[e].len()));
    let mut jobs: Vec<SpanJob> = Vec::new();
    // the jobs of active expert i: jobs_of[i]
    let mut jobs_of: Vec<Range<usize>> = Vec::with_capacity(active.len());
    // each (row, slot)'s output: (job, row in the job)
    let mut place: Vec<(usize, usize)> = vec![(0, 0); n_rows * k];
    for (i, &e) in active.iter().enumerate() {
        let first = jobs.len();
        for &(si, t, slot) in &picks[e] {
            let mine = jobs.len() > first;
            match jobs.last_mut() {
                Some(j) if mine && j.rows.last().is_some_and(|&r| spans[si].contains(&r)) => j.rows.push(t),
                _ => jobs.push(SpanJob { active: i, rows: vec![t] }),
            }
            place[t * k + slot] = (jobs.len() - 1, jobs[jobs.len() - 1].rows.len() - 1);
        }
        jobs_of.push(first..jobs.len());
    }
    // Each job's outputs (its rows × width), unweighted; summed per row below.
    let mut ys: Vec<Buf> = (0..jobs.len()).map(|_| Buf::owned(Vec::new())).collect();
    if !store.streams() {
        let handles = active.iter().map(|&e| store.expert(layer, e)).collect::<Result<Vec<_>>>()?;
        let ffns: Vec<ExpertFfn> = jobs.iter().map(|j| expert_job(&handles[j.active], xe, ew, &j.rows)).collect();
        ctx.backend.expert_ffns(&ffns, d.act, d.expert_ff, &mut ys);
    } else {
        // From disk a batch touches nearly every expert: the store reads the next
        // PREFILL_READ_AHEAD experts while the backend computes the current ones, so the disk
        // and the cores overlap. Same per-expert arithmetic.
        crate::experts::store::read_in_batches(store, layer, &active, PREFILL_READ_AHEAD, &mut |r, handles| {
            let mut read = Vec::with_capacity(handles.len());
            for (h, i) in handles.into_iter().zip(r.clone()) {
                match h {
                    Ok(h) => read.push((i, h)),
                    Err(e) => {
                        // its rows' sequences fail; the others never read this expert's zeros
                        let mut failed = Vec::new();
                        for j in jobs_of[i].clone() {
                            ys[j] = ctx.zeros(jobs[j].rows.len() * ew);
                            failed.extend_from_slice(&jobs[j].rows);
                        }
                        ctx.expert_failed(failed, e)?;
                    }
                }
            }
            let jobs = &jobs;
            let (mine, ffns): (Vec<usize>, Vec<ExpertFfn>) =
                read.iter().flat_map(|(i, h)| jobs_of[*i].clone().map(move |j| (j, expert_job(h, xe, ew, &jobs[j].rows)))).unzip();
            let mut got: Vec<Buf> = (0..ffns.len()).map(|_| Buf::owned(Vec::new())).collect();
            ctx.backend.expert_ffns(&ffns, d.act, d.expert_ff, &mut got);
            for (j, y) in mine.into_iter().zip(got) {
                ys[j] = y;
            }
            Ok(())
        })?;
    }
    // A rank of a sharded model: every (row, slot)'s output side by side (row × k), its own
    // picks' from `ys` and the others' zeros until the reduction fills them with their owners'
    // bits, so the sums below are the one-rank model's.
    let reduced = match ctx.shard {
        Some(sh) => {
            let mut all = vec![0.0f32; n_rows * k * ew];
            for t in spans.iter().flat_map(|s| s.clone()) {
                for (slot, &e) in routes[t].as_ref().expect("routed").experts.iter().enumerate() {
                    if sh.owns(e) {
                        let (j, i) = place[t * k + slot];
                        all[(t * k + slot) * ew..][..ew].copy_from_slice(&ys[j][i * ew..(i + 1) * ew]);
                    }
                }
            }
            sh.comm.all_reduce_sum(&mut all)?;
            Some(all)
        }
        None => None,
    };
    // Σ over a row's selection slots in llama.cpp's order (slot 0, then 1, …) of p · y, the
    // product rounded before the add as ggml_mul then ggml_add do.
    for s in spans {
        let n = s.len();
        let parts: Vec<&[f32]> = match &reduced {
            Some(all) => all[s.start * k * ew..s.end * k * ew].chunks_exact(ew).collect(),
            None => place[s.start * k..s.end * k].iter().map(|&(j, i)| &ys[j][i * ew..(i + 1) * ew]).collect(),
        };
        let weights: Vec<f32> = s.clone().flat_map(|t| routes[t].as_ref().expect("routed").weights.iter().copied()).collect();
        let mut sum = vec![0.0f32; n * ew];
        ctx.backend.weighted_sum(&parts, &weights, k, &mut sum);
        // a latent sum back to the model's width: W_up · (rms_norm(Σ)·norm)
        let y = match &w.latent {
            Some(l) => {
                latent_norm(ctx, l, d, &mut sum);
                ctx.mm(&l.up, &sum, n)
            }
            None => sum,
        };
        out[s.start * hidden..s.end * hidden].copy_from_slice(&y);
    }

    drop(sp);
    let _sp = ctx.span(Op::MoeShared);
    if let Some(sh) = &w.shared {
        for s in spans {
            let (xs, n) = (&x[s.start * hidden..s.end * hidden], s.len());
            let y = ffn::forward(ctx, sh, xs, &Rows::single(n, 0));
            // out += sigmoid(gate_inp_shexp · x) · y per row (×1 where the model has no gate)
            ctx.backend.add_gated(&mut out[s.start * hidden..s.end * hidden], &y, xs, w.shared_gate.as_deref());
        }
    }
    Ok(())
}

/// Expert `h`'s FFN over rows `tokens` of `x` (rows `width` wide).
fn expert_job<'a>(h: &'a ExpertHandle<'_>, x: &'a [f32], width: usize, tokens: &'a [usize]) -> ExpertFfn<'a> {
    ExpertFfn { gate: h.gate(), up: h.up(), down: h.down(), x, width, tokens }
}

/// A latent MoE's weighted sum, each row rms-normed by the latent norm (where the model has one).
fn latent_norm(ctx: &Ctx, l: &LatentProj, d: &MoeDims, sum: &mut [f32]) {
    if let Some(nw) = &l.norm {
        ctx.backend.rms_norm_inplace(sum, d.latent, nw, d.eps);
    }
}


/// Records `routes` of batch rows `rows_at` at `layer` when the forward records routes, with
/// each row's guess at the next MoE layer's experts where one was made.
fn record(ctx: &Ctx, layer: usize, rows_at: &[usize], routes: &[Route], guesses: Option<&(usize, Vec<Vec<usize>>)>) {
    if ctx.records_routes() {
        ctx.push_routes(
            rows_at
                .iter()
                .zip(routes)
                .enumerate()
                .map(|(i, (&row, r))| RouteRecord {
                    row,
                    layer,
                    experts: r.experts.clone(),
                    weights: r.weights.clone(),
                    margin: r.margin,
                    next_guess: guesses.map(|(l, g)| (*l, g[i].clone())),
                })
                .collect(),
        );
    }
}

/// Decode: `m` rows (one token each, of one or several sequences; x: m × hidden), every
/// row's products in the one-token order and its experts summed in its own selection order (as
/// llama.cpp does), so a row's result never depends on the others, while an expert chosen by
/// several rows is read once for all of them. Three parallel jobs per group of experts —
/// router with the shared expert's gate/up, the routed gate/up, the downs — instead of one
/// per matrix. The union of the rows' experts is fetched in groups no larger than the memory
/// plan's experts in flight, so a streamed store stays inside its budget. With `next`, a
/// streamed store is asked to read the next MoE layer's likely experts once this layer's own
/// are in: they land while this layer computes.
#[allow(clippy::too_many_arguments)] // the layer's weights, geometry, store and rows
fn forward_decode_rows<'a>(
    ctx: &Ctx<'a>,
    w: &MoeWeights,
    d: &MoeDims,
    store: &dyn ExpertStore,
    layer: usize,
    x: &[f32],
    m: usize,
    hidden: usize,
    rows_at: &[usize],
    next: Option<Lookahead>,
) -> Result<Buf<'a>> {
    let sp = ctx.span(Op::MoeRouter);
    let mut logits = ctx.zeros(m * d.n_expert);
    let sff = w.shared.as_ref().map_or(0, |s| s.gate.rows);
    let (mut sg, mut su) = (ctx.zeros(m * sff), ctx.zeros(m * sff));
    let ew = d.expert_width(hidden);
    let mut x_latent = ctx.zeros(if w.latent.is_some() { m * ew } else { 0 });
    {
        let mut jobs = vec![MvJob { w: ctx.q(&w.router), x, y: &mut logits }];
        if let Some(sh) = &w.shared {
            jobs.push(MvJob { w: ctx.q(&sh.gate), x, y: &mut sg });
            jobs.push(MvJob { w: ctx.q(&sh.up), x, y: &mut su });
        }
        if let Some(l) = &w.latent {
            jobs.push(MvJob { w: ctx.q(&l.down), x, y: &mut x_latent });
        }
        ctx.mv_batch(&mut jobs);
    }
    // the experts' input rows: x, or the latent x_l [m × latent]
    let xe: &[f32] = if w.latent.is_some() { &x_latent } else { x };
    let routes: Vec<Route> = ctx.backend.route(&logits, &rule(w, d));
    // the next layer's guessed experts, to prefetch (and to record beside the routes)
    let guesses = match next {
        Some(nx) if store.streams() || ctx.records_routes() => Some((nx.layer, guess_next(ctx, nx, d, x, m))),
        _ => None,
    };
    record(ctx, layer, rows_at, &routes, guesses.as_ref());
    // (a rank of a sharded model reads ahead its own block's guesses only)
    let mut prefetch = store.streams().then(|| guesses.map(|(l, g)| (l, ranked_union(&g).into_iter().filter(|&e| ctx.shard.is_none_or(|sh| sh.owns(e))).collect::<Vec<_>>())));
    drop(sp);

    let sp = ctx.span(Op::MoeExperts);
    // the distinct experts of all rows, in order of first choice, each with its (row, slot)s
    let mut union: Vec<usize> = Vec::new();
    let mut users: Vec<Vec<(usize, usize)>> = Vec::new();
    for (row, r) in routes.iter().enumerate() {
        for (slot, &e) in r.experts.iter().enumerate() {
            let i = match union.iter().position(|&u| u == e) {
                Some(i) => i,
                None => {
                    union.push(e);
                    users.push(Vec::new());
                    union.len() - 1
                }
            };
            users[i].push((row, slot));
        }
    }
    if let Some(sh) = ctx.shard {
        // this rank's block of the picks; the reduction after the products brings the others'
        (union, users) = union.into_iter().zip(users).filter(|(e, _)| sh.owns(*e)).unzip();
    }
    if prefetch.is_some() {
        store.routed(layer, &union);
    }
    let ff = d.expert_ff;
    let k = d.n_used;
    // ys[row * k + slot]: that row's unweighted output of its slot's expert
    let mut ys = ctx.zeros(m * k * ew);
    let group = if store.streams() { d.n_used.max(2 * PREFILL_READ_AHEAD) } else { union.len().max(1) };
    // one group's experts `at` (indices into the group) with their handles: gate and up, the
    // activation, down, each row's output into its slot of `ys`
    let mut compute = |who: &[&Vec<(usize, usize)>], handles: &[ExpertHandle<'_>]| {
        // an expert of one row multiplies that row in place (one quantization of it serves
        // all its experts, as `mv_batch` shares activations by address); several rows gathered
        let gathered: Vec<Option<Vec<f32>>> =
            who.iter().map(|u| (u.len() > 1).then(|| batch::gather(xe, ew, &u.iter().map(|&(r, _)| r).collect::<Vec<_>>()))).collect();
        let xin: Vec<&[f32]> = who
            .iter()
            .zip(&gathered)
            .map(|(u, g)| match g {
                Some(g) => &g[..],
                None => &xe[u[0].0 * ew..(u[0].0 + 1) * ew],
            })
            .collect();
        let mut gu: Vec<(Buf, Buf)> = who.iter().map(|u| (ctx.zeros(u.len() * ff), ctx.zeros(u.len() * ff))).collect();
        {
            let mut jobs = Vec::with_capacity(2 * handles.len());
            for ((h, &xr), (g, u)) in handles.iter().zip(&xin).zip(gu.iter_mut()) {
                jobs.push(MvJob { w: h.gate(), x: xr, y: g });
                jobs.push(MvJob { w: h.up(), x: xr, y: u });
            }
            ctx.mv_batch(&mut jobs);
        }
        // the activation per row, each row alone (as the one-token path's single row)
        let act: Vec<Buf> = gu.iter().map(|(g, u)| ffn::act_rows_buf(ctx, d.act, g, u, ff)).collect();
        let mut down: Vec<Buf> = who.iter().map(|u| ctx.zeros(u.len() * ew)).collect();
        {
            let mut jobs: Vec<MvJob> =
                handles.iter().zip(&act).zip(down.iter_mut()).map(|((h, a), y)| MvJob { w: h.down(), x: a, y }).collect();
            ctx.mv_batch(&mut jobs);
        }
        for (u, y) in who.iter().zip(&down) {
            for (j, &(row, slot)) in u.iter().enumerate() {
                ys[(row * k + slot) * ew..][..ew].copy_from_slice(&y[j * ew..(j + 1) * ew]);
            }
        }
    };
    for (ids, who) in union.chunks(group).zip(users.chunks(group)) {
        // the cached experts compute while the missed ones are read, each missed one as it
        // lands: every expert's rows are the same products whichever experts share a batch
        let mut landed = 0;
        store.experts_as_landed(layer, ids, &mut |got| {
            landed += got.len();
            if landed == ids.len() {
                // this layer's reads are all in: the next layer's guesses may use the disk now
                if let Some(next) = prefetch.take() {
                    store.prefetch(layer, &union, next.as_ref().map(|(l, g)| (*l, &g[..])));
                }
            }
            let (mut users, mut handles) = (Vec::with_capacity(got.len()), Vec::with_capacity(got.len()));
            for (i, h) in got {
                match h {
                    Ok(h) => {
                        users.push(&who[i]);
                        handles.push(h);
                    }
                    // the rows that chose it fail (their slot stays zero); the others go on
                    Err(e) => ctx.expert_failed(who[i].iter().map(|&(row, _)| row).collect(), e)?,
                }
            }
            if !handles.is_empty() {
                compute(&users, &handles);
            }
            Ok(())
        })?;
    }
    if let Some(sh) = ctx.shard {
        // every slot's output: its owner's bits, zeros from the other ranks
        sh.comm.all_reduce_sum(&mut ys)?;
    }
    let mut ysh = ctx.zeros(m * hidden);
    let mut out = ctx.zeros(m * ew);
    {
        let parts: Vec<&[f32]> = ys.chunks_exact(ew).collect();
        let weights: Vec<f32> = routes.iter().flat_map(|r| r.weights.iter().copied()).collect();
        ctx.backend.weighted_sum(&parts, &weights, k, &mut out);
    }
    // the shared expert's down with the latent sum's way back (W_up), one job
    let latent_sum = match &w.latent {
        Some(l) => {
            latent_norm(ctx, l, d, &mut out);
            Some(std::mem::replace(&mut out, ctx.zeros(m * hidden)))
        }
        None => None,
    };
    {
        let act = match &w.shared {
            Some(sh) => ffn::act_rows_buf(ctx, sh.act, &sg, &su, sff),
            None => Buf::owned(Vec::new()),
        };
        let mut jobs = Vec::new();
        if let Some(sh) = &w.shared {
            jobs.push(MvJob { w: ctx.q(&sh.down), x: &act, y: &mut ysh });
        }
        if let (Some(l), Some(sum)) = (&w.latent, &latent_sum) {
            jobs.push(MvJob { w: ctx.q(&l.up), x: sum, y: &mut out });
        }
        if !jobs.is_empty() {
            ctx.mv_batch(&mut jobs);
        }
    }
    drop(sp);
    let _sp = ctx.span(Op::MoeShared);
    if w.shared.is_some() {
        // out += sigmoid(gate_inp_shexp · x) · y per row (×1 where the model has no gate)
        ctx.backend.add_gated(&mut out, &ysh, x, w.shared_gate.as_deref());
    }
    Ok(out)
}
