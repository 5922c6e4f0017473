//! A MoE layer's launches: the router and its top-k, the routed experts' products (a decode
//! row's slots a warp each and their weighted sum with the shared expert's; a prompt pass's
//! grouped per expert on tensor cores), and under a VRAM budget the cache's rounds, the
//! misses' copies beside the held experts' products and the CPU's share (`experts/`).

use super::forward::*;
use super::*;

impl CudaModel {
    /// A MoE layer into x; with `norm_after`, the norm after it applied by its last launch where
    /// it can be (a decode batch's `moe_down_combine_norm`): that norm's output, else None.
    pub(super) fn moe(&self, il: usize, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, lay: Layout<'_>, norm_after: Option<NextNorm>) -> Result<Option<In>> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let k = d.n_used;
        let rows = lay.rows();
        // the VRAM cache holds the trunk's layers' experts; an MTP head's are resident
        let cache = self.expert_cache.as_ref().filter(|_| il < self.layers.len());
        // -DFUSE_ROUTE=1: a decode row's top-k in the router product's launch (mv4_route)
        let fuse_route = rows && g.knobs.fuse_route && d.n_expert <= 512 && k <= 32;
        let route = fuse_route.then_some((sc.ids.ptr, sc.weights.ptr));
        match &w.shared_gate {
            // the router and the shared expert's gate read the same input: one launch
            Some(gate) if rows => self.proj_many_routed(&[(&w.router, sc.router.ptr), (gate, sc.sg.ptr)], x, n, None, route)?,
            _ if fuse_route => self.proj_many_routed(&[(&w.router, sc.router.ptr)], x, n, None, route)?,
            _ => self.proj(&w.router, x, sc.router.ptr, None, n, lay)?,
        }
        if !fuse_route {
            self.route(sc.router.ptr, sc.ids.ptr, sc.weights.ptr, n)?;
        }
        if let Some(sh) = &self.shard {
            return self.moe_rank(sh, w, x, kinds, n, lay).map(|_| None);
        }
        // the next MoE layer's guess from this layer's input (read-ahead, decode rows)
        let ahead = match (cache, rows) {
            (Some(cache), true) => cache.read_ahead.as_ref().zip(self.next_moe(il)),
            _ => None,
        };
        if let Some((ra, (_, next))) = ahead {
            self.proj(&next.router, x, ra.logits.ptr, None, n, lay)?;
            self.route(ra.logits.ptr, ra.ids.ptr, ra.weights.ptr, n)?;
        }
        // under a VRAM budget: the picked experts copied into the layer's pool, in rounds
        // where the pass needs more than it holds (`experts/`); decode rows with the CPU path
        // on read their input rows back with the picks (one sync)
        let (rounds, jobs, xh) = match cache {
            Some(cache) => {
                let want_x = (rows && cache.has_cpu()).then_some((x.f, n * d.hidden));
                let (ids, xh) = cache.read_back(g, sc.ids.ptr, n * k, want_x)?;
                cache.wait_read_ahead(g, il)?;
                let (rounds, jobs) = cache.plan(il, &ids, rows)?;
                (rounds, jobs, xh)
            }
            None => (vec![], vec![], vec![]),
        };
        // the guessed experts' copies go after this layer's own work is enqueued: the copy
        // engine takes copies in order, and this layer's are needed first
        let guess = match ahead {
            Some((ra, (jl, next))) => Some((jl, next, g.read_i32(&ra.ids, n * k)?)),
            None => None,
        };
        let read_ahead = || -> Result<()> {
            match (cache, &guess) {
                (Some(cache), Some((jl, next, ids))) => cache.read_ahead(g, *jl, &next.experts, ids),
                _ => Ok(()),
            }
        };
        // a decode step's misses copied beside the held experts' products (`Pipe`), or some
        // of them computed by the CPU
        let overlap = rows && cache.is_some_and(|c| c.pipe.takes(&rounds));
        if !jobs.is_empty() || overlap {
            return self.experts_beside_cpu(il, w, x, kinds, n, (&rounds, &jobs, &xh), &read_ahead).map(|_| None);
        }
        if rounds.len() <= 1 {
            if let Some(r) = rounds.first() {
                self.expert_round(il, w, r)?;
            }
            if rows && self.group_decode_experts(n) {
                self.moe_decode_grouped(w, x, kinds, n)?;
                return read_ahead().map(|_| None);
            }
            // moe_down_combine's block holds a warp a slot and the shared expert's
            if rows && k < 32 {
                let normed = self.moe_decode(w, x, kinds, n, norm_after)?;
                read_ahead()?;
                return Ok(normed);
            }
            self.routed_products(w, x, kinds, n, rows)?;
        } else {
            // each round's slots into ys where the whole pass puts them; one weighted sum below
            for r in &rounds {
                self.expert_round(il, w, r)?;
                self.routed_products(w, x, kinds, n, rows)?;
            }
        }
        self.moe_sum(w, x, kinds, n, lay)?;
        read_ahead().map(|_| None)
    }

    /// A rank of a sharded model after routing: its block's picks computed into their ys slots,
    /// the other slots zero; the reduction fills those with their owners' outputs; then the
    /// shared expert, the weighted sum and the residual as one GPU computes them — the bits of
    /// the whole model on one GPU (`moe_decode` is the bits of these launches).
    fn moe_rank(&self, sh: &super::DeviceShard, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, lay: Layout<'_>) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let slots = n * d.n_used;
        let ys_len = slots * d.hidden;
        let args = [Arg::Ptr(sc.ids.ptr), Arg::I32(slots as i32), Arg::I32(sh.experts.start as i32), Arg::I32(sh.experts.end as i32), Arg::Ptr(sc.ys.ptr), Arg::I64(ys_len as i64)];
        g.launch("moe_local_ids", (ys_len.div_ceil(256).clamp(1, 1024) as u32, 1), 256, 0, &args)?;
        self.routed_products(w, x, kinds, n, lay.rows())?;
        sh.comm.all_reduce_sum(g, sc.ys.ptr, ys_len)?;
        self.moe_sum(w, x, kinds, n, lay)
    }

    /// The top-k experts and their weights of `n` tokens' router logits (n_expert a token).
    fn route(&self, logits: u64, ids: u64, weights: u64, n: usize) -> Result<()> {
        let (g, d) = (&self.gpu, &self.d);
        let k = d.n_used;
        let args = [Arg::Ptr(logits), Arg::I32(d.n_expert as i32), Arg::I32(k as i32), Arg::I32(d.norm_w as i32), Arg::F32(d.w_scale), Arg::Ptr(ids), Arg::Ptr(weights)];
        if d.n_expert <= 512 && k <= 32 {
            // a warp a token, the experts' probabilities in registers
            g.launch("moe_route_warp", (n as u32, 1), 32, 0, &args)
        } else {
            g.launch("moe_route", (n as u32, 1), 256, (d.n_expert * 4) as u32, &args)
        }
    }

    /// The MoE layer after layer `il`, if any: (its index, its weights).
    fn next_moe(&self, il: usize) -> Option<(usize, &MoeLayer)> {
        self.layers.iter().enumerate().skip(il + 1).find_map(|(j, l)| match &l.ffn {
            DevFfn::Moe(w) => Some((j, w)),
            DevFfn::Dense(_) => None,
        })
    }

    /// A decode step's routed experts under the VRAM cache, some of the missed ones perhaps on
    /// the CPU (`jobs`: routed slot, expert; `xh`: the rows' input, read back). With the pipe
    /// on and one round to run: the misses copied up on their own stream while the model's
    /// stream computes the held experts' slots and the shared expert, then the copied slots'
    /// products once the copies are in. Off, or over several rounds: each round's copies and
    /// products in turn, then the shared expert. The CPU's products meanwhile from the host
    /// copy, their rows copied into ys before the weighted sum; the parts' times teach the
    /// split (`CpuSplit`), read at the next read-back rather than waited for.
    /// `read_ahead` issues the next layer's guessed copies once this layer's GPU part is queued.
    #[allow(clippy::too_many_arguments)]
    fn experts_beside_cpu(
        &self,
        il: usize,
        w: &MoeLayer,
        x: In,
        kinds: &LayerKinds,
        n: usize,
        (rounds, jobs, xh): (&[experts::Round], &[(usize, usize)], &[f32]),
        read_ahead: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let (g, sc) = (&self.gpu, &self.sc);
        let Some(cache) = &self.expert_cache else { return Ok(()) };
        let pipe = &cache.pipe;
        pipe.t0.record(&g.stream)?;
        // the GPU's part: the shared expert and the routed slots but the CPU's; the copies'
        // count teaches the split
        let (shared, copies) = if pipe.takes(rounds) {
            // the held experts' products and the shared expert while the misses' copies run
            // on their own stream; both id tables written first, while the stream is drained
            // (pageable copies wait for it)
            let (held, fresh) = experts::Pipe::split(&rounds[0]);
            g.write_at(sc.ids.ptr, i32_bytes(&held.slot_ids))?;
            g.write_at(pipe.ids.ptr, i32_bytes(&fresh.slot_ids))?;
            cache.copy_up_beside(g, il, &w.experts, &fresh.loads)?;
            self.routed_products_at(w, x, kinds, n, sc.ids.ptr)?;
            let shared = self.shared_expert(w, x, kinds, n, Layout::Rows)?;
            cache.wait_copies(g)?;
            self.routed_products_at(w, x, kinds, n, pipe.ids.ptr)?;
            pipe.t1.record(&g.stream)?;
            (shared, fresh.loads.len())
        } else {
            let mut copies = 0;
            for r in rounds {
                self.expert_round(il, w, r)?;
                self.routed_products(w, x, kinds, n, true)?;
                copies += r.loads.len();
            }
            pipe.t1.record(&g.stream)?;
            // the shared expert needs no routed output: the GPU computes it while the CPU works
            (self.shared_expert(w, x, kinds, n, Layout::Rows)?, copies)
        };
        read_ahead()?;
        let t_cpu = self.cpu_experts(cache, il, jobs, xh)?;
        if pipe.on {
            cache.learn_later(jobs.len(), copies, t_cpu);
        } else {
            pipe.t1.synchronize()?;
            cache.learn(jobs.len(), copies, t_cpu, pipe.t0.elapsed_ms(&pipe.t1)? as f64 / 1e3);
        }
        self.combine(shared, n)
    }

    /// The CPU's `jobs` of layer `il` computed from the read-back rows `xh` and their outputs
    /// queued up into ys (none: nothing); the seconds the CPU took.
    fn cpu_experts(&self, cache: &ExpertCache, il: usize, jobs: &[(usize, usize)], xh: &[f32]) -> Result<f64> {
        if jobs.is_empty() {
            return Ok(0.0);
        }
        let start = std::time::Instant::now();
        let ys = cache.cpu_products(il, jobs, xh, self.d.n_used)?;
        let t_cpu = start.elapsed().as_secs_f64();
        cache.put_cpu_outputs(&self.gpu, jobs, &ys, self.d.hidden, self.sc.ys.ptr)?;
        Ok(t_cpu)
    }

    /// The shared expert, the routed slots' weighted sum (ys) and the residual.
    fn moe_sum(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, lay: Layout<'_>) -> Result<()> {
        let shared = self.shared_expert(w, x, kinds, n, lay)?;
        self.combine(shared, n)
    }

    /// The shared expert's output and its gate (addresses; 0: none), for `combine`.
    fn shared_expert(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, lay: Layout<'_>) -> Result<(u64, u64)> {
        let sc = &self.sc;
        let rows = lay.rows();
        let mut shared = 0u64;
        let mut sg = 0u64;
        if let Some(s) = &w.shared {
            self.glu(s, x, sc.sh_h.ptr, n, lay)?;
            let hin = self.input(sc.sh_h.ptr, s.down.cols, n, rows, kinds.shared_mid)?;
            self.proj(&s.down, hin, sc.sh_y.ptr, None, n, lay)?;
            shared = sc.sh_y.ptr;
            if let Some(gate) = &w.shared_gate {
                // a decode row's gate came with the router's product (proj_many above)
                if !rows {
                    self.proj(gate, x, sc.sg.ptr, None, n, lay)?;
                }
                sg = sc.sg.ptr;
            }
        }
        Ok((shared, sg))
    }

    /// x += Σ_s w_s·ys[s] (+ the gated shared expert's output), each decode row as alone.
    fn combine(&self, (shared, sg): (u64, u64), n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h) = (d.n_used, d.hidden);
        g.launch(
            "moe_combine",
            (h.div_ceil(256) as u32, n as u32),
            256,
            0,
            &[Arg::Ptr(sc.x.ptr), Arg::Ptr(sc.ys.ptr), Arg::Ptr(sc.weights.ptr), Arg::I32(k as i32), Arg::I32(h as i32), Arg::Ptr(shared), Arg::Ptr(sg)],
        )
    }

    /// Every routed (token, slot)'s expert products into ys (slots whose id is -1 skipped):
    /// grouped per expert on tensor cores for a prompt pass, else row by row — the bits
    /// moe_decode's fused launches give a decode row.
    fn routed_products(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, rows: bool) -> Result<()> {
        if self.grouped_experts(n, rows) {
            return self.experts_grouped(&w.experts, n);
        }
        self.routed_products_at(w, x, kinds, n, self.sc.ids.ptr)
    }

    /// The routed slots' products row by row, each slot's pool or expert number from `ids`
    /// (k a token; -1 skipped).
    fn routed_products_at(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, ids: u64) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h, eff) = (d.n_used, d.hidden, d.expert_ff);
        // a token's k slots read its row of xn
        mv_glu(g, &w.experts, Some(ids), x, h, k, sc.ffn_h.ptr, eff, n * k)?;
        let hin = self.input(sc.ffn_h.ptr, eff, n * k, true, kinds.ffn_mid)?;
        mv(g, &w.experts.down, Some(ids), hin, eff, 1, sc.ys.ptr, h, None, n * k)
    }

    /// A round of layer `il`'s cached experts: its missing experts copied into their pool
    /// slots, and the routed slots' pool numbers (-1: another round's) over the router's ids.
    fn expert_round(&self, il: usize, w: &MoeLayer, r: &experts::Round) -> Result<()> {
        let Some(cache) = &self.expert_cache else { return Ok(()) };
        // the ids first: a copy from pageable memory waits for the stream to drain, which it
        // has here (the router's picks were just read back) but would not after the copies
        self.gpu.write_at(self.sc.ids.ptr, i32_bytes(&r.slot_ids))?;
        cache.copy_up(&self.gpu, il, &w.experts, &r.loads).map(|_| ())
    }

    /// A decode batch's experts after routing (`n` rows): gate, up and SwiGLU of the k slots and
    /// of the shared expert, then every down product, the weighted sum and the residual in one
    /// launch (moe_down_combine: the bits of mv + mv + moe_combine).
    /// With `norm_after`, the norm after the layer applied to each row by the down launch's last
    /// block a row (`moe_down_combine_norm`): that norm's output.
    fn moe_decode(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize, norm_after: Option<NextNorm>) -> Result<Option<In>> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h, eff) = (d.n_used, d.hidden, d.expert_ff);
        let ex = &w.experts;
        let (mut s_ptr, mut s_ty, mut s_cols, mut s_rb) = (0u64, 0i32, 0usize, 0usize);
        // with -DFUSE_MIDS=1 the gate/up launch quantizes its hidden rows itself
        let mut fused = None;
        match &w.shared {
            Some(s) => {
                (s_ptr, s_ty, s_cols, s_rb) = (s.down.ptr, s.down.ty, s.down.cols, s.down.row_bytes);
                fused = if g.knobs.fuse_mids { self.mids(kinds, s.down.cols, n) } else { None };
                self.moe_glu(ex, s, x, n, fused)?;
            }
            None => mv_glu(g, ex, Some(sc.ids.ptr), x, h, k, sc.ffn_h.ptr, eff, n * k)?,
        }
        let (hin, sin) = match fused {
            Some(m) => {
                let (hin, sin) = m.inputs(sc);
                (hin, Some(sin))
            }
            None => self.quant_hidden(w, kinds, n)?,
        };
        let sin = sin.unwrap_or(In { f: 0, q: Q8::default(), f16: 0 });
        let sg = if w.shared.is_some() && w.shared_gate.is_some() { sc.sg.ptr } else { 0 };
        let dm = &w.experts.down;
        // a block a row, a warp a slot's product (k routed, then the shared expert's)
        let warps = k + usize::from(s_ptr != 0);
        let mut args = vec![
            Arg::Ptr(dm.ptr),
            Arg::I32(dm.ty),
            Arg::I32(dm.rows as i32),
            Arg::I32(dm.cols as i32),
            Arg::I64(dm.row_bytes as i64),
            Arg::I64(dm.mat_bytes() as i64),
            Arg::Ptr(sc.ids.ptr),
            Arg::Ptr(sc.weights.ptr),
            Arg::I32(k as i32),
            Arg::Ptr(hin.f),
            Arg::Ptr(hin.q.qk),
            Arg::Ptr(hin.q.dk),
            Arg::Ptr(hin.q.qz),
            Arg::Ptr(hin.q.dz),
            Arg::Ptr(s_ptr),
            Arg::I32(s_ty),
            Arg::I32(s_cols as i32),
            Arg::I64(s_rb as i64),
            Arg::Ptr(sin.f),
            Arg::Ptr(sin.q.qk),
            Arg::Ptr(sin.q.dk),
            Arg::Ptr(sin.q.qz),
            Arg::Ptr(sin.q.dz),
            Arg::Ptr(sg),
            Arg::Ptr(sc.x.ptr),
        ];
        let (kernel, normed) = match norm_after {
            Some(next) => {
                // a row's counter a decode row (COUNT_NORM..)
                let (extra, xn) = self.norm_args(next, sc.counts.at(4 * COUNT_NORM));
                args.extend(extra);
                ("moe_down_combine_norm", Some(xn))
            }
            None => ("moe_down_combine", None),
        };
        g.launch(kernel, (dm.rows.div_ceil(g.knobs.moe_down_rows) as u32, n as u32), (32 * warps) as u32, 0, &args)?;
        Ok(normed)
    }

    /// Whether a decode batch of `n` rows takes its routed experts grouped per expert
    /// (`moe_decode_grouped`): from the knob's row count on, on one GPU's whole stacks (a VRAM
    /// cache's pool or a rank's block runs a slot at a time), where moe_sort's counts fit.
    fn group_decode_experts(&self, n: usize) -> bool {
        let rows = self.gpu.knobs.moe_group_rows;
        rows > 0 && n >= rows && self.expert_cache.is_none() && self.shard.is_none() && self.d.n_expert * 8 <= 48 << 10
    }

    /// A decode batch's experts after routing, grouped per expert: the slots sorted into tiles
    /// of one expert (`moe_sort`), each tile's gate, up and SwiGLU (`moe_glu_tiles`) and down
    /// products (`mv_tiles`) with the expert's weights loaded once for the tile, the shared
    /// expert's as a dense FFN of the batch (`glu`, then its down product), then the weighted
    /// sum and the residual (`combine`). Each slot's and row's bits are those `moe_decode`
    /// gives the row alone (its fused launches are the bits of mv + mv + moe_combine), so a
    /// decode batch's rows stay their own; the batch reads each expert once.
    fn moe_decode_grouped(&self, w: &MoeLayer, x: In, kinds: &LayerKinds, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h) = (d.n_used, d.hidden);
        let ex = &w.experts;
        let tiles = self.moe_sort(n * k, g.knobs.moe_tile)?;
        let (eg, eu) = (&ex.gate, &ex.up);
        g.launch(
            "moe_glu_tiles",
            (eg.rows.div_ceil(2 * g.knobs.moe_glu_rows) as u32, tiles as u32),
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(eg.ptr),
                Arg::Ptr(eu.ptr),
                Arg::I32(eg.ty),
                Arg::I32(eu.ty),
                Arg::I32(eg.rows as i32),
                Arg::I64(eg.row_bytes as i64),
                Arg::I64(eu.row_bytes as i64),
                Arg::I64(eg.mat_bytes() as i64),
                Arg::I64(eu.mat_bytes() as i64),
                Arg::Ptr(sc.ex_tiles.ptr),
                Arg::Ptr(sc.ex_order.ptr),
                Arg::I32(k as i32),
                Arg::I32(h as i32),
                Arg::Ptr(x.f),
                Arg::Ptr(x.q.qk),
                Arg::Ptr(x.q.dk),
                Arg::Ptr(x.q.qz),
                Arg::Ptr(x.q.dz),
                Arg::Ptr(sc.ffn_h.ptr),
            ],
        )?;
        if let Some(s) = &w.shared {
            self.glu(s, x, sc.sh_h.ptr, n, Layout::Rows)?;
        }
        let (hin, sin) = self.quant_hidden(w, kinds, n)?;
        let dm = &ex.down;
        g.launch(
            "mv_tiles",
            (dm.rows.div_ceil(MV_WARPS) as u32, tiles as u32),
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(dm.ptr),
                Arg::I32(dm.ty),
                Arg::I32(dm.rows as i32),
                Arg::I32(dm.cols as i32),
                Arg::I64(dm.row_bytes as i64),
                Arg::I64(dm.mat_bytes() as i64),
                Arg::Ptr(sc.ex_tiles.ptr),
                Arg::Ptr(sc.ex_order.ptr),
                Arg::Ptr(hin.f),
                Arg::Ptr(hin.q.qk),
                Arg::Ptr(hin.q.dk),
                Arg::Ptr(hin.q.qz),
                Arg::Ptr(hin.q.dz),
                Arg::Ptr(sc.ys.ptr),
                Arg::I64(h as i64),
            ],
        )?;
        let mut shared = (0u64, 0u64);
        if let (Some(s), Some(sin)) = (&w.shared, sin) {
            self.proj(&s.down, sin, sc.sh_y.ptr, None, n, Layout::Rows)?;
            // the shared expert's gate came with the router's product (proj_many)
            shared = (sc.sh_y.ptr, if w.shared_gate.is_some() { sc.sg.ptr } else { 0 });
        }
        self.combine(shared, n)
    }

    /// A decode batch's expert hidden rows quantized for their down products: the routed slots'
    /// (ffn_h), and the shared expert's (sh_h, None without one) past them in their kind's
    /// scratch — one launch for both where each takes one q8 kind (`quant_mids`), else one each.
    fn quant_hidden(&self, w: &MoeLayer, kinds: &LayerKinds, n: usize) -> Result<(In, Option<In>)> {
        let (d, sc) = (&self.d, &self.sc);
        let (k, eff) = (d.n_used, d.expert_ff);
        let Some(s) = &w.shared else {
            return Ok((self.input(sc.ffn_h.ptr, eff, n * k, true, kinds.ffn_mid)?, None));
        };
        if let Some((hin, sin)) = self.quant_mids(kinds, s.down.cols, n)? {
            return Ok((hin, Some(sin)));
        }
        let hin = self.input(sc.ffn_h.ptr, eff, n * k, true, kinds.ffn_mid)?;
        // the shared expert's hidden rows go past the routed ones in the q8 scratch
        Ok((hin, Some(self.input_at(sc.sh_h.ptr, s.down.cols, kinds.shared_mid, n * k * eff, n)?)))
    }

    /// The routed experts' gate, up and SwiGLU (k slots a row into ffn_h) and the shared
    /// expert's (into sh_h) of a decode batch of `n` rows in one launch.
    /// With `mids`, the launch also quantizes those rows for the down products (the last block
    /// of each slot's row: quant_q8_2's bits), into where `mids` says.
    fn moe_glu(&self, ex: &Glu, s: &Glu, x: In, n: usize, mids: Option<Mids>) -> Result<()> {
        let (d, sc) = (&self.d, &self.sc);
        let m = mids.unwrap_or_default();
        let count = if mids.is_some() { sc.counts.at(4 * (COUNT_MIDS + self.decode_max)) } else { 0 };
        let (eg, eu, sg, su) = (&ex.gate, &ex.up, &s.gate, &s.up);
        self.gpu.launch_3d(
            "moe_glu",
            // two row groups a block of four warps: a warp a group's gate or up products
            (eg.rows.max(sg.rows).div_ceil(2 * self.gpu.knobs.moe_glu_rows) as u32, d.n_used as u32 + 1, n as u32),
            (32 * MV_WARPS) as u32,
            0,
            &[
                Arg::Ptr(eg.ptr),
                Arg::Ptr(eu.ptr),
                Arg::I32(eg.ty),
                Arg::I32(eu.ty),
                Arg::I32(eg.rows as i32),
                Arg::I64(eg.row_bytes as i64),
                Arg::I64(eu.row_bytes as i64),
                Arg::I64(eg.mat_bytes() as i64),
                Arg::I64(eu.mat_bytes() as i64),
                Arg::Ptr(sc.ids.ptr),
                Arg::I32(d.n_used as i32),
                Arg::Ptr(sg.ptr),
                Arg::Ptr(su.ptr),
                Arg::I32(sg.ty),
                Arg::I32(su.ty),
                Arg::I32(sg.rows as i32),
                Arg::I64(sg.row_bytes as i64),
                Arg::I64(su.row_bytes as i64),
                Arg::I32(eg.cols as i32),
                Arg::Ptr(x.f),
                Arg::Ptr(x.q.qk),
                Arg::Ptr(x.q.dk),
                Arg::Ptr(x.q.qz),
                Arg::Ptr(x.q.dz),
                Arg::Ptr(sc.ffn_h.ptr),
                Arg::Ptr(sc.sh_h.ptr),
                Arg::Ptr(count),
                Arg::I32(m.kind),
                Arg::Ptr(m.q),
                Arg::Ptr(m.d),
                Arg::I32(m.kind_s),
                Arg::Ptr(m.q_s),
                Arg::Ptr(m.d_s),
            ],
        )
    }

    /// A decode batch's experts' hidden rows and the shared expert's quantized for their down
    /// products in one launch (quant_q8_2), where each takes one q8 kind: the shared rows go
    /// after the n · k slots' rows in their kind's scratch. None where that does not hold.
    fn quant_mids(&self, kinds: &LayerKinds, s_cols: usize, n: usize) -> Result<Option<(In, In)>> {
        let (d, sc) = (&self.d, &self.sc);
        let (k, eff) = (d.n_used, d.expert_ff);
        let Some(m) = self.mids(kinds, s_cols, n) else { return Ok(None) };
        let per_block = 8; // warps of 256 threads, a q8 block each
        let blocks = (eff / m.width).max(s_cols / m.width_s).div_ceil(per_block);
        self.gpu.launch_3d(
            "quant_q8_2",
            (blocks as u32, k as u32 + 1, n as u32),
            256,
            0,
            &[
                Arg::Ptr(sc.ffn_h.ptr),
                Arg::I32(eff as i32),
                Arg::Ptr(m.q),
                Arg::Ptr(m.d),
                Arg::I32(m.kind),
                Arg::Ptr(sc.sh_h.ptr),
                Arg::I32(s_cols as i32),
                Arg::Ptr(m.q_s),
                Arg::Ptr(m.d_s),
                Arg::I32(m.kind_s),
            ],
        )?;
        Ok(Some(m.inputs(sc)))
    }

    /// Where a decode batch's experts' hidden rows and the shared expert's go quantized when
    /// each takes one q8 kind (`quant_mids`, or `moe_glu`'s fused quantization): the shared
    /// rows after the n · k slots' rows in their kind's scratch. None where that does not hold.
    fn mids(&self, kinds: &LayerKinds, s_cols: usize, n: usize) -> Option<Mids> {
        let (d, sc) = (&self.d, &self.sc);
        let (k, eff) = (d.n_used, d.expert_ff);
        // (kind, block width, scratch values, scratch scales)
        let one = |kd: Kinds| match (kd.k, kd.z) {
            (true, false) => Some((0, 256, sc.xq_b.ptr, sc.xd_b.ptr)),
            (false, true) => Some((1, 32, sc.xq_bz.ptr, sc.xd_bz.ptr)),
            _ => None,
        };
        let (Some((kind, width, q, dq)), Some((kind_s, width_s, q_s, d_s))) = (one(kinds.ffn_mid), one(kinds.shared_mid)) else {
            return None;
        };
        let off = n * k * eff;
        if eff % width != 0 || s_cols % width_s != 0 || off % width_s != 0 {
            return None;
        }
        Some(Mids { kind, width, q, d: dq, kind_s, width_s, q_s: q_s + off as u64, d_s: d_s + (off / 32 * 8) as u64 })
    }

    /// `n` rows of `cols` values at x quantized into the q8 scratch `offset` values in (past
    /// rows another input of the same product still holds there).
    fn input_at(&self, x: u64, cols: usize, kinds: Kinds, offset: usize, n: usize) -> Result<In> {
        let sc = &self.sc;
        let mut q = Q8::default();
        if kinds.k && cols % 256 == 0 && offset % 256 == 0 {
            let (xq, xd) = (sc.xq_b.ptr + offset as u64, sc.xd_b.ptr + (offset / 32 * 8) as u64);
            self.quant(x, cols, n, 0, xq, xd)?;
            (q.qk, q.dk) = (xq, xd);
        }
        if kinds.z && cols % 32 == 0 && offset % 32 == 0 {
            let (xq, xd) = (sc.xq_bz.ptr + offset as u64, sc.xd_bz.ptr + (offset / 32 * 8) as u64);
            self.quant(x, cols, n, 1, xq, xd)?;
            (q.qz, q.dz) = (xq, xd);
        }
        Ok(In { f: x, q, f16: 0 })
    }

    /// The routed slots (`slots` ids) sorted by expert into tiles of up to `tile` slots of one
    /// expert (ex_tiles: (expert, first, count); ex_order: the slots), on the device. Returns the
    /// tiles' count (the empty ones last).
    fn moe_sort(&self, slots: usize, tile: usize) -> Result<usize> {
        let (d, sc) = (&self.d, &self.sc);
        // a rank's stacks hold its block: ids index them (-1: another rank's, skipped)
        let n_expert = self.shard.as_ref().map_or(d.n_expert, |sh| sh.experts.len());
        let tiles = max_tiles(slots, n_expert, tile);
        self.gpu.launch(
            "moe_sort",
            (1, 1),
            1024,
            (n_expert * 8) as u32,
            &[
                Arg::Ptr(sc.ids.ptr),
                Arg::I32(slots as i32),
                Arg::I32(n_expert as i32),
                Arg::Ptr(sc.ex_counts.ptr),
                Arg::Ptr(sc.ex_offsets.ptr),
                Arg::Ptr(sc.ex_order.ptr),
                Arg::Ptr(sc.ex_tiles.ptr),
                Arg::I32(tiles as i32),
                Arg::I32(tile as i32),
            ],
        )?;
        Ok(tiles)
    }

    /// A prompt pass's routed experts grouped per expert: the slots sorted by expert into tiles
    /// of up to 16 (on the device, no host round trip), then gate, up and down products on
    /// tensor cores, each expert's weights read once a tile.
    fn experts_grouped(&self, ex: &Glu, n: usize) -> Result<()> {
        let (g, d, sc) = (&self.gpu, &self.d, &self.sc);
        let (k, h, eff) = (d.n_used, d.hidden, d.expert_ff);
        let slots = n * k;
        let tiles = self.moe_sort(slots, EX_TILE)?;
        let product = |m: &DevMat, x: u64, x_stride: usize, x_div: usize, y: u64, y_stride: usize| {
            g.launch(
                "mm_ex",
                (m.rows.div_ceil(EX_ROWS) as u32, tiles as u32),
                128,
                0,
                &[
                    Arg::Ptr(m.ptr),
                    Arg::I32(m.ty),
                    Arg::I32(m.rows as i32),
                    Arg::I32(m.cols as i32),
                    Arg::I64(m.row_bytes as i64),
                    Arg::I64(m.mat_bytes() as i64),
                    Arg::Ptr(sc.ex_tiles.ptr),
                    Arg::Ptr(sc.ex_order.ptr),
                    Arg::Ptr(x),
                    Arg::I64(x_stride as i64),
                    Arg::I32(x_div as i32),
                    Arg::Ptr(y),
                    Arg::I64(y_stride as i64),
                ],
            )
        };
        product(&ex.gate, sc.xn.ptr, h, k, sc.ffn_h.ptr, eff)?;
        product(&ex.up, sc.xn.ptr, h, k, sc.ffn_u.ptr, eff)?;
        let len = slots * eff;
        g.launch("silu_mul", (len.div_ceil(256) as u32, 1), 256, 0, &[Arg::Ptr(sc.ffn_h.ptr), Arg::Ptr(sc.ffn_u.ptr), Arg::I64(len as i64)])?;
        product(&ex.down, sc.ffn_h.ptr, eff, 1, sc.ys.ptr, h)
    }
}

/// Where a decode batch's experts' hidden rows go quantized (`CudaModel::mids`): the routed
/// slots' kind (0 q8_K, 1 q8_0), its block width and scratch, the shared expert's likewise.
#[derive(Clone, Copy, Default)]
struct Mids {
    kind: i32,
    width: usize,
    q: u64,
    d: u64,
    kind_s: i32,
    width_s: usize,
    q_s: u64,
    d_s: u64,
}

impl Mids {
    /// The down products' inputs: the routed slots' rows (ffn_h) and the shared expert's (sh_h).
    fn inputs(&self, sc: &Scratch) -> (In, In) {
        let q = |kind: i32, q: u64, dq: u64| if kind == 0 { Q8 { qk: q, dk: dq, qz: 0, dz: 0 } } else { Q8 { qk: 0, dk: 0, qz: q, dz: dq } };
        (In { f: sc.ffn_h.ptr, q: q(self.kind, self.q, self.d), f16: 0 }, In { f: sc.sh_h.ptr, q: q(self.kind_s, self.q_s, self.d_s), f16: 0 })
    }
}

