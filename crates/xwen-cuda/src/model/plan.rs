//! What a model takes on the device before it is loaded: the weights, KV and state at a
//! context, the scratch of a prefill pass, and the pass's size.

use super::*;

/// The bytes `load` puts on the device for `file`'s trunk and experts, KV at `n_ctx` and state.
pub fn device_bytes_needed(file: &GgufFile, opts: &CudaOptions) -> Result<u64> {
    Ok(device_plan(file, opts)?.total())
}

/// What the CUDA backend holds on the device for a file, by part (`device_plan`), in the
/// device's layout of the weights (`crate::layout`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePlan {
    /// Every weight but the routed experts' and a file's own MTP block (`mtp_plan_bytes`).
    pub trunk_bytes: u64,
    /// The routed experts' weights (0 for a dense model).
    pub expert_bytes: u64,
    /// One expert's gate, up and down, in the layer whose are largest.
    pub one_expert_bytes: u64,
    /// A slot of the VRAM expert cache in every MoE layer: one expert's gate, up and down
    /// summed over the layers.
    pub expert_slot_bytes: u64,
    /// Experts a layer has, and a token routes to a layer.
    pub n_expert: usize,
    pub n_used: usize,
    /// KV caches (f16) and recurrent states at the context, for every sequence held at once
    /// (`CudaOptions::n_seq`).
    pub state_bytes: u64,
    /// A prefill pass's scratch.
    pub scratch_bytes: u64,
}

impl DevicePlan {
    /// Everything resident: what `load` puts on the device without a budget.
    pub fn total(&self) -> u64 {
        self.trunk_bytes + self.expert_bytes + self.state_bytes + self.scratch_bytes
    }

    /// Everything but the routed experts.
    pub fn resident_bytes(&self) -> u64 {
        self.trunk_bytes + self.state_bytes + self.scratch_bytes
    }

    /// The least a VRAM budget can be with the routed experts in a VRAM cache: the resident
    /// parts and one token's experts in every MoE layer.
    pub fn floor(&self) -> u64 {
        self.resident_bytes() + self.n_used as u64 * self.expert_slot_bytes
    }

    /// The slots a MoE layer's pool has under `budget`: every expert (no cache) where the
    /// whole model fits, else what the budget holds past the resident parts.
    pub fn expert_slots(&self, budget: Option<u64>) -> usize {
        match budget {
            Some(b) if b < self.total() && self.expert_slot_bytes > 0 => {
                (b.saturating_sub(self.resident_bytes()) / self.expert_slot_bytes).min(self.n_expert as u64) as usize
            }
            _ => self.n_expert,
        }
    }

    /// What the device holds under `budget`: everything, or the resident parts and the pools.
    pub fn held_bytes(&self, budget: Option<u64>) -> u64 {
        let slots = self.expert_slots(budget);
        if slots >= self.n_expert {
            self.total()
        } else {
            self.resident_bytes() + slots as u64 * self.expert_slot_bytes
        }
    }

    /// Whether `budget` bytes of VRAM run the model: everything resident, or the routed
    /// experts in a VRAM cache of at least one token's experts a layer; a refusal names the
    /// parts.
    pub fn check_budget(&self, budget: u64) -> std::result::Result<(), String> {
        let h = xwen_engine::memory_plan::human_bytes;
        if budget >= self.total() || budget >= self.floor() {
            return Ok(());
        }
        Err(format!(
            "--vram-budget {} is below the floor of {}: trunk {} + KV and state {} + scratch {} + one token's experts in each layer {}",
            h(budget),
            h(self.floor()),
            h(self.trunk_bytes),
            h(self.state_bytes),
            h(self.scratch_bytes),
            h(self.n_used as u64 * self.expert_slot_bytes)
        ))
    }

    /// Device memory that sequences' checkpoints may keep on the card (`DevSeq::snapshot`)
    /// on a device with `free` bytes, past `held` bytes the model holds: half of the rest past
    /// a GiB set aside, at most 8 GiB; none under a VRAM budget, whose ceiling the plan fills.
    pub fn checkpoint_room(free: u64, held: u64, budget: Option<u64>) -> u64 {
        if budget.is_some() {
            return 0;
        }
        (free.saturating_sub(held + (1 << 30)) / 2).min(8 << 30)
    }

    /// The tiers under `budget`, for `xwen plan` and the load's note: "…".
    pub fn tiers(&self, budget: Option<u64>) -> String {
        let h = xwen_engine::memory_plan::human_bytes;
        let slots = self.expert_slots(budget);
        if self.expert_bytes == 0 || slots >= self.n_expert {
            return format!("every routed expert in VRAM ({})", h(self.expert_bytes));
        }
        format!(
            "VRAM expert cache {} ({slots} of {} experts a layer, {:.0}%); RAM: every routed expert ({}, page-locked); disk: the file",
            h(slots as u64 * self.expert_slot_bytes),
            self.n_expert,
            100.0 * slots as f64 / self.n_expert as f64,
            h(self.expert_bytes)
        )
    }
}

/// What the MTP head `head` adds on the device beside `trunk`'s model under `opts`
/// (`mtp_device_bytes`: its block, what it does not share with the trunk, its KV rows for
/// `opts.n_seq` sequences at `opts.n_ctx`); a head the device does not run counts 0.
pub fn mtp_plan_bytes(head: &xwen_engine::models::mtp::MtpHead, trunk: &GgufFile, opts: &CudaOptions) -> Result<u64> {
    let xwen_engine::models::mtp::MtpHead::Qwen35(h) = head else { return Ok(0) };
    let (net, _) = load_net(trunk)?;
    let kv_values = opts.n_ctx * net.cfg.attn.kv_width();
    let w = h.weights();
    Ok(mtp_device_bytes(&w, h.file(), owns_embed_head(&w, h.file(), trunk), net.layers.len(), kv_values, opts.n_seq))
}

/// `device_bytes_needed` by part.
pub fn device_plan(file: &GgufFile, opts: &CudaOptions) -> Result<DevicePlan> {
    let (net, experts) = load_net(file)?;
    Ok(plan_of(file, &net, &experts, opts))
}

/// The device plan of a network already read from `file` (what `load` checks against the
/// card's free memory, and `device_plan` reports).
pub(super) fn plan_of(file: &GgufFile, net: &Hybrid, experts: &[Option<[Mat; 3]>], opts: &CudaOptions) -> DevicePlan {
    let dev = device_bytes;
    // the trunk's tensors: a file's own MTP (nextn) block past its layers goes up only with the
    // head (`mtp_plan_bytes` counts it then)
    let n_layer = net.layers.len();
    let past_trunk = |name: &str| name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|i| i.parse::<usize>().ok()).is_some_and(|i| i >= n_layer);
    let weights: u64 = file.tensors().iter().filter(|t| !past_trunk(&t.name)).map(|t| dev(t.ty, file.tensor_data(t).len() as u64)).sum();
    let layer_bytes = |m: &[Mat; 3]| m.iter().map(|x| dev(x.ty, x.info.n_bytes)).sum::<u64>();
    let one = |m: &[Mat; 3]| layer_bytes(m) / m[0].n_mats.max(1) as u64;
    // a VRAM cache's slot: the three matrices 256-byte aligned (`upload::slot_layout`)
    let slot = |m: &[Mat; 3]| super::upload::slot_layout(m).1 as u64;
    let expert_bytes: u64 = experts.iter().flatten().map(layer_bytes).sum();
    DevicePlan {
        trunk_bytes: weights - expert_bytes,
        expert_bytes,
        one_expert_bytes: experts.iter().flatten().map(one).max().unwrap_or(0),
        expert_slot_bytes: experts.iter().flatten().map(slot).sum(),
        n_expert: net.cfg.moe.as_ref().map_or(0, |m| m.n_expert),
        n_used: net.cfg.moe.as_ref().map_or(0, |m| m.n_used),
        state_bytes: opts.n_seq.max(1) as u64 * xwen_engine::models::hybrid::state_bytes(&net.cfg, opts.n_ctx, (xwen_engine::KvType::F16, xwen_engine::KvType::F16)),
        scratch_bytes: {
            let ub = ubatch_for(net, opts);
            scratch_bytes(net, opts.n_ctx, ub, decode_rows_for(opts, ub))
        },
    }
}

/// Bytes a tensor of `file_bytes` in the file takes on the device (Q8_0 and Q6_K blocks padded:
/// `crate::layout`).
pub(super) fn device_bytes(ty: GgmlType, file_bytes: u64) -> u64 {
    match ty {
        GgmlType::Q8_0 => file_bytes / 34 * 36,
        GgmlType::Q6_K => file_bytes / 210 * 224,
        _ => file_bytes,
    }
}

/// Decode rows a batched step takes at most (`CudaModel::decode_batch`, `verify_pass`): a row
/// for each sequence the device holds (`CudaOptions::n_seq`) or a verify's `MIN_DECODE_ROWS`,
/// at most `MAX_DECODE_ROWS` and half a prefill pass (the q8 scratch holds a batch's routed and shared hidden rows side by side).
pub(super) fn decode_rows_for(opts: &CudaOptions, ubatch: usize) -> usize {
    opts.n_seq.max(MIN_DECODE_ROWS).min(MAX_DECODE_ROWS).min((ubatch / 2).max(1))
}

/// Rows a decode batch takes at least: a verify's rows (a draft and the token before it) run
/// as one pass of as many rows, whatever the slot count.
pub const MIN_DECODE_ROWS: usize = 16;

/// The most rows of one decode step: a captured graph for each batch size up to it.
pub const MAX_DECODE_ROWS: usize = 64;

/// Bytes of a decode batch's table (`decode_batch`, `verify_pass`): b tokens and positions
/// (i32), then two state pointers a row for each of `layers` layers, then a verify's two kept-
/// state pointers a row for each layer (`forward::rows_table_at`).
pub(super) fn rows_table_bytes(b: usize, layers: usize) -> usize {
    8 * b + 32 * b * layers
}

/// The splits attention cuts a row's keys into (`attn_split`: equal chunks of the positions the
/// row sees): one per 64 positions of the context, at most 64 — enough blocks to fill the card
/// at any depth while the merge stays short.
pub(super) fn attn_splits(n_ctx: usize) -> usize {
    n_ctx.max(1).div_ceil(64).min(64)
}

/// The prefill batch: `opts.ubatch`, fewer where the split attention's partials would pass
/// `SPLIT_PARTIALS_BYTES` at this context.
pub(super) fn ubatch_for(net: &Hybrid, opts: &CudaOptions) -> usize {
    let a = &net.cfg.attn;
    let per_token = a.n_head * attn_splits(opts.n_ctx) * (a.head_dim + 2) * 4;
    opts.ubatch.clamp(1, (SPLIT_PARTIALS_BYTES / per_token.max(1)).max(1))
}

/// What a prompt pass's attention split partials (a row's heads × splits × (head dim + 2)
/// floats) may take: the pass's tokens follow from it. 512 MiB keeps a 512-token pass whole
/// below a 4 032-position context for 16 heads of 256 (at 256 MiB a 2k context cut it to 492).
const SPLIT_PARTIALS_BYTES: usize = 512 << 20;

/// Tokens a prompt pass takes of a span of `n` under a prefill batch of `ubatch`: as many
/// passes as `ubatch` needs, of equal size — not full passes and a short tail, whose pass costs
/// nearly what a full one does (a 512-token prompt under a 492-token ubatch ran 3.6× slower as
/// 492 + 20).
pub(super) fn pass_tokens(n: usize, ubatch: usize) -> usize {
    n.div_ceil(n.div_ceil(ubatch.max(1)).max(1)).max(1)
}

/// The scratch of a pass of `ub` tokens and of a decode batch of `rows` rows.
pub(super) fn scratch_bytes(net: &Hybrid, n_ctx: usize, ub: usize, rows: usize) -> u64 {
    let c = &net.cfg;
    let (a, d) = (&c.attn, &c.delta);
    let (k, eff, sff, ne) = c.moe.as_ref().map_or((1, 0, 0, 0), |m| (m.n_used, m.expert_ff, m.shared_ff, m.n_expert));
    let hq = a.n_head * a.head_dim;
    let split = attn_splits(n_ctx);
    let row = 2 * c.hidden
        + 2 * d.conv_dim()
        + 2 * d.value_dim()
        + 2 * d.n_v_heads
        + 4 * hq
        + 2 * a.kv_width()
        + a.n_head * split * (a.head_dim + 2)
        + c.ff.max(k * eff)
        + c.ff.max(k * eff).max(sff)
        + k * c.hidden
        + sff
        + c.hidden
        + 1
        + ne
        + 2 * k
        + 2 * d.key_dim()
        + 2 * d.n_v_heads
        + d.value_dim();
    let wide = q8_width(net);
    // q8 copies (a byte a value, 8 bytes a 32), f16 inputs, grouped-expert lists
    let q8 = (ub * (c.hidden + wide)) as u64 * 5 / 2;
    let f16 = (2 * ub * (wide + c.hidden) + 2 * max_dense_values(net)) as u64;
    let ex = if ne > 0 { (4 * (2 * ne + ub * k) + 16 * (ub * k).div_ceil(16) + 16 * ne) as u64 } else { 0 };
    // a decode batch: every row's logits, argmax parts, token and table
    // (the table holds a pass of prompt spans' rows too; the spans' last rows, for their head)
    let batch = rows * (c.n_vocab + 2 * forward::ARGMAX_BLOCKS + 2 + forward::MAX_BANS + c.hidden) * 4
        + rows_table_bytes(rows.max(ub), net.layers.len())
        + forward::spans_table_at(rows).2
        + 4 * ub * (1 + max_unaligned_rows(net).max(1));
    (ub * row + 1 + ub) as u64 * 4 + batch as u64 + q8 + f16 + ex
}

/// The widest input of a product other than xn: DeltaNet / attention outputs, FFN and expert
/// hidden rows (a token's k expert rows together).
pub(super) fn q8_width(net: &Hybrid) -> usize {
    let c = &net.cfg;
    let (k, eff, sff) = c.moe.as_ref().map_or((1, 0, 0), |m| (m.n_used, m.expert_ff, m.shared_ff));
    c.hidden.max(c.delta.value_dim()).max(c.attn.n_head * c.attn.head_dim).max(c.ff).max(k * eff).max(sff)
}

/// The most values of one trunk matrix a prompt pass multiplies (the f16 copy cuBLAS reads).
pub(super) fn max_dense_values(net: &Hybrid) -> usize {
    trunk_shapes(net).map(|(rows, cols)| rows * cols).max().unwrap_or(0)
}

/// The most rows of a trunk matrix whose rows are not a multiple of 4 (0: none): its prompt
/// products' outputs of a span past the first may start off a 16-byte boundary
/// (`forward::gemm_aligned` stages them).
pub(super) fn max_unaligned_rows(net: &Hybrid) -> usize {
    trunk_shapes(net).filter(|(rows, _)| rows % 4 != 0).map(|(rows, _)| rows).max().unwrap_or(0)
}

/// (rows, columns) of each trunk matrix a prompt pass multiplies, the shared experts' gate rows
/// included.
fn trunk_shapes(net: &Hybrid) -> impl Iterator<Item = (usize, usize)> + '_ {
    net.layers.iter().flat_map(|l| {
        let mats: Vec<&Mat> = match &l.mixer {
            Mixer::Delta(w) => match &w.proj {
                DeltaProj::Split { qkv, gate, beta, alpha } => vec![qkv, gate, beta, alpha, &w.out],
                _ => vec![&w.out],
            },
            Mixer::Attn(w) => vec![&w.q, &w.k, &w.v, &w.o],
            Mixer::Mla(_) => vec![],
        };
        let mut shapes: Vec<(usize, usize)> = mats.into_iter().map(|m| (m.rows, m.cols)).collect();
        match &l.ffn {
            Ffn::Dense(w) => shapes.extend([&w.gate, &w.up, &w.down].map(|m| (m.rows, m.cols))),
            Ffn::Moe(w) => {
                shapes.push((w.router.rows, w.router.cols));
                if let Some(s) = &w.shared {
                    shapes.extend([&s.gate, &s.up, &s.down].map(|m| (m.rows, m.cols)));
                }
                if let Some(g) = &w.shared_gate {
                    shapes.push((1, g.len()));
                }
            }
        }
        shapes
    })
}

pub(super) fn load_net(file: &GgufFile) -> Result<(Hybrid, Vec<Option<[Mat; 3]>>)> {
    let spec = match file.architecture() {
        Some("qwen35") => &xwen_engine::models::qwen35::DENSE,
        Some("qwen35moe") => &xwen_engine::models::qwen35::MOE,
        Some(a) => return Err(CudaError::Unsupported(format!("the CUDA backend runs qwen35 and qwen35moe; this file is {a} (use -ngl 0 for the CPU)"))),
        None => return Err(CudaError::Unsupported("the file names no architecture".into())),
    };
    Ok(Hybrid::load(file, spec)?)
}

/// Tiles of up to `tile` slots of one expert (moe_sort) a pass of `slots` routed slots can need:
/// a tile per `tile` slots, plus a part-full one per expert.
pub(super) fn max_tiles(slots: usize, n_expert: usize, tile: usize) -> usize {
    slots.div_ceil(tile) + n_expert.min(slots)
}

/// Which of a step's prompt spans share passes (`CudaModel::feed_spans`): `spans` as (index,
/// length), each pass at most `ubatch` rows and `max_spans` spans, longest first, each span into
/// the first pass with room (first fit decreasing). A pass's members come longest first, as
/// `forward::Layout::Spans` takes them.
pub(super) fn pack_spans(spans: &[(usize, usize)], ubatch: usize, max_spans: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<(usize, usize)> = spans.iter().copied().filter(|&(_, n)| n <= ubatch).collect();
    order.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    let mut passes: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, n) in order {
        match passes.iter_mut().find(|(rows, members)| rows + n <= ubatch && members.len() < max_spans) {
            Some((rows, members)) => {
                *rows += n;
                members.push(i);
            }
            None => passes.push((n, vec![i])),
        }
    }
    passes.into_iter().map(|(_, m)| m).collect()
}

/// The spans table of a pass of spans of `lens` (`forward::spans_table_at(max_spans)`'s layout,
/// as i32): each span's (first row, length), each span's last row, each row's place in its span.
pub(super) fn spans_table(lens: &[usize], max_spans: usize) -> Vec<i32> {
    let (at_seg, at_last, at_off) = forward::spans_table_at(max_spans);
    let rows: usize = lens.iter().sum();
    let mut table = vec![0i32; at_off / 4 + rows];
    let mut first = 0;
    for (s, &len) in lens.iter().enumerate() {
        table[at_seg / 4 + 2 * s] = first as i32;
        table[at_seg / 4 + 2 * s + 1] = len as i32;
        table[at_last / 4 + s] = (first + len - 1) as i32;
        for t in 0..len {
            table[at_off / 4 + first + t] = t as i32;
        }
        first += len;
    }
    table
}

/// Whether the head's token embedding and its output product are its own (true) or the
/// trunk's (false): the trunk's output is its output.weight, or its token embedding where tied.
pub(super) fn owns_embed_head(w: &xwen_engine::models::mtp::MtpWeights<'_>, file: &GgufFile, trunk: &GgufFile) -> (bool, bool) {
    let trunk_out: &[&str] = if trunk.tensor("output.weight").is_some() { &["output.weight"] } else { &["token_embd.weight"] };
    (!trunks_tensor(w.embed, file, trunk, &["token_embd.weight"]), !trunks_tensor(w.head, file, trunk, trunk_out))
}

/// What an MTP head (`w`, from `file`; `owns`: `owns_embed_head`'s answer against the trunk of
/// `n_layer` layers) holds on the device beside the model: its block's tensors, the token
/// embedding and output product it does not share with the trunk, and its KV rows (`kv_values`
/// a sequence, f16 K and V) for `n_seq` sequences — what `CudaModel::load_mtp` checks against
/// the card and `xwen plan -ngl 99` shows.
pub(super) fn mtp_device_bytes(w: &xwen_engine::models::mtp::MtpWeights<'_>, file: &GgufFile, owns: (bool, bool), n_layer: usize, kv_values: usize, n_seq: usize) -> u64 {
    let (own_embed, own_head) = owns;
    let prefix = format!("blk.{n_layer}.");
    let bytes = |m: &xwen_engine::weights::Mat| device_bytes(m.ty, m.info.n_bytes);
    let mut need: u64 = file.tensors().iter().filter(|t| t.name.starts_with(&prefix)).map(|t| device_bytes(t.ty, t.n_bytes)).sum();
    for (m, own) in [(w.embed, own_embed), (w.head, own_head)] {
        match (own, m.info.name.starts_with(&prefix)) {
            (true, false) => need += bytes(m),
            (false, true) => need = need.saturating_sub(bytes(m)),
            _ => {}
        }
    }
    need + (kv_values * 4) as u64 * n_seq.max(1) as u64
}

/// Whether `m` (a tensor of `file`) is one of the trunk's tensors `names`: the same tensor of
/// the same file, or a copy of its very bytes in another (a sidecar's).
fn trunks_tensor(m: &xwen_engine::weights::Mat, file: &GgufFile, trunk: &GgufFile, names: &[&str]) -> bool {
    names.iter().filter_map(|n| trunk.tensor(n)).any(|t| {
        if std::ptr::eq(file, trunk) {
            return t.name == m.info.name;
        }
        t.ty == m.ty && t.n_bytes == m.info.n_bytes && trunk.tensor_data(t) == file.tensor_data(&m.info)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_runs_in_the_fewest_passes_of_equal_size() {
        for (n, ub, want) in [(512, 492, 256), (512, 512, 512), (2048, 492, 410), (20, 492, 20), (1, 64, 1), (0, 64, 1), (1000, 1, 1), (7, 0, 1)] {
            assert_eq!(pass_tokens(n, ub), want, "{n} tokens under a ubatch of {ub}");
        }
        // no pass over the batch, and no more passes than the batch needs
        for n in 1..700 {
            for ub in [1, 7, 64, 127, 492, 512] {
                let per = pass_tokens(n, ub);
                assert!(per <= ub && n.div_ceil(per) == n.div_ceil(ub), "{n} tokens under {ub}: {per} a pass");
            }
        }
    }

    #[test]
    fn checkpoints_take_half_the_room_left_within_a_ceiling_and_none_under_a_budget() {
        let g = 1u64 << 30;
        assert_eq!(DevicePlan::checkpoint_room(80 * g, 21 * g, None), 8 * g, "at most 8 GiB");
        assert_eq!(DevicePlan::checkpoint_room(24 * g, 17 * g, None), 3 * g, "half of what is left past a GiB");
        assert_eq!(DevicePlan::checkpoint_room(18 * g, 17 * g, None), 0, "nothing left past the GiB aside");
        assert_eq!(DevicePlan::checkpoint_room(10 * g, 20 * g, None), 0, "a plan over the free memory");
        assert_eq!(DevicePlan::checkpoint_room(80 * g, 12 * g, Some(12 * g)), 0, "a VRAM budget is the model's alone");
    }

    #[test]
    fn spans_pack_longest_first_within_a_pass_and_its_span_count() {
        let lens = [2usize, 15, 16, 31, 32, 45, 33, 100, 96, 1];
        let spans: Vec<(usize, usize)> = lens.iter().copied().enumerate().collect();
        let passes = pack_spans(&spans, 96, 3);
        let mut seen: Vec<usize> = passes.iter().flatten().copied().collect();
        seen.sort_unstable();
        // every span once, but the one longer than a pass
        assert_eq!(seen, (0..lens.len()).filter(|&i| lens[i] <= 96).collect::<Vec<_>>());
        for p in &passes {
            assert!(p.iter().map(|&i| lens[i]).sum::<usize>() <= 96, "a pass within ubatch: {p:?}");
            assert!(p.len() <= 3, "a pass within its span count: {p:?}");
            assert!(p.windows(2).all(|w| lens[w[0]] >= lens[w[1]]), "longest first: {p:?}");
        }
        // first fit decreasing: 96 | 45 33 16 | 32 31 15 (the second pass holds its 3 spans) | 2 1
        let got: Vec<Vec<usize>> = passes.iter().map(|p| p.iter().map(|&i| lens[i]).collect()).collect();
        assert_eq!(got, vec![vec![96], vec![45, 33, 16], vec![32, 31, 15], vec![2, 1]]);
    }

    #[test]
    fn a_spans_table_holds_each_spans_rows_and_each_rows_place() {
        let lens = [5usize, 3, 2];
        let t = spans_table(&lens, 4);
        let (seg, last, off) = forward::spans_table_at(4);
        assert_eq!(&t[seg / 4..seg / 4 + 6], &[0, 5, 5, 3, 8, 2]);
        assert_eq!(&t[last / 4..last / 4 + 3], &[4, 7, 9]);
        assert_eq!(&t[off / 4..], &[0, 1, 2, 3, 4, 0, 1, 2, 0, 1]);
    }
}
