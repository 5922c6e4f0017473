//! The DFlash block drafter (`models::dflash`), driven as llama.cpp's draft-dflash drives it.

use crate::ops::top;
use super::Drafter;
use crate::error::Result;
use crate::model::Model;
use crate::models::dflash::DflashCache;

/// A DFlash sidecar attached to the target (`Model::attach_dflash`), as `common/speculative.cpp`'s
/// `common_speculative_impl_draft_dflash` drives it: every row the target keeps is injected into
/// the drafter's cache at its own position — its features are the tapped layers' inputs of that
/// same row, no shift — and a draft is one forward of the block [pending token, mask, …] at the
/// pending token's position, non-causal, rows 1.. read greedily. Rejected rows never reach
/// `observe`, so a rollback is a truncation to the next observed position; positions the drafter
/// missed (a state restored from a prefix cache) are injected as zero features: drafts there are
/// poorer, output is unchanged.
pub struct DflashDrafter {
    cache: Option<DflashCache>,
    /// Stop drafting at the first row whose top probability falls below this (llama.cpp's p_min).
    pub p_min: f32,
}

impl Default for DflashDrafter {
    fn default() -> Self {
        DflashDrafter { cache: None, p_min: 0.0 }
    }
}

impl DflashDrafter {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Drafter for DflashDrafter {
    fn name(&self) -> &'static str {
        "dflash"
    }

    fn propose(&mut self, _context: &[u32], _max: usize) -> Result<Vec<u32>> {
        // the drafter reads the target's features: see propose_with
        Ok(Vec::new())
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn proposes_cheaply(&self) -> bool {
        false
    }

    fn observe(&mut self, target: &Model, pos: usize, tokens: &[u32], feats: &[f32]) -> Result<()> {
        let w = target.dflash_feature_width();
        let m = tokens.len();
        if m == 0 || w == 0 || feats.len() != m * w {
            return Ok(());
        }
        if self.cache.is_none() {
            self.cache = Some(target.new_dflash_cache()?);
        }
        let cache = self.cache.as_mut().expect("set above");
        let kvw = target.dflash_config().map_or(0, |c| c.n_head_kv * c.head_dim);
        cache.truncate(pos, kvw);
        if cache.len < pos {
            let gap = pos - cache.len;
            target.dflash_inject(cache, &vec![0.0; gap * w], gap)?;
        }
        target.dflash_inject(cache, feats, m)
    }

    fn propose_with(&mut self, target: &Model, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        let (Some(cache), Some(cfg), Some(&pending)) = (self.cache.as_ref(), target.dflash_config(), ctx.last()) else {
            return Ok(Vec::new());
        };
        // llama.cpp's block: the pending token and n_max masks, n_max at most block_size − 1
        let room = target.max_context().saturating_sub(cache.len);
        let n = (max + 1).min(cfg.block_size).min(room);
        if n < 2 {
            return Ok(Vec::new());
        }
        let mut block = vec![cfg.mask_token; n];
        block[0] = pending;
        let logits = target.dflash_block(cache, &block)?;
        let v = target.n_vocab();
        let mut out = Vec::with_capacity(n - 1);
        for row in logits.chunks_exact(v).skip(1) {
            let (t, p) = top(row);
            if p < self.p_min {
                break;
            }
            out.push(t);
        }
        Ok(out)
    }
}
