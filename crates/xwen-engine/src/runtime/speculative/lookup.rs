//! Drafters that need no model: prompt lookup (`NgramDrafter`), and for benchmarks a drafter
//! that knows the continuation (`ReplayDrafter`) and one that is always wrong
//! (`ContraryDrafter`).

use super::Drafter;
use crate::error::Result;

/// Prompt lookup: the tokens that followed the latest earlier occurrence of the context's last
/// n tokens, for n from `max_n` down to `min_n`.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter { min_n: 2, max_n: 4 }
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn propose(&mut self, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        let len = ctx.len();
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if len <= n {
                continue;
            }
            let key = &ctx[len - n..];
            // latest start j < len - n with ctx[j..j+n] == key and something after it
            if let Some(j) = (0..len - n).rev().find(|&j| &ctx[j..j + n] == key) {
                let from = j + n;
                let end = (from + max).min(len);
                if from < end {
                    return Ok(ctx[from..end].to_vec());
                }
            }
        }
        Ok(Vec::new())
    }
}

/// Proposes a known continuation (the target's own greedy output, from an earlier run): every
/// draft is right, so a run with it measures the verify machinery's upper bound at each depth —
/// what a perfect drafter could buy on this model, machine and budget. Stateless: the tokens
/// generated so far are the longest prefix of the continuation the context ends with.
pub struct ReplayDrafter {
    continuation: Vec<u32>,
}

impl ReplayDrafter {
    pub fn new(continuation: Vec<u32>) -> Self {
        ReplayDrafter { continuation }
    }
}

impl Drafter for ReplayDrafter {
    fn name(&self) -> &'static str {
        "replay"
    }

    fn propose(&mut self, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        let c = &self.continuation;
        // the longest g with ctx ending in c[..g] (g ≥ 1: the pending token is c[g − 1])
        let g = (1..=c.len().min(ctx.len())).rev().find(|&g| ctx.ends_with(&c[..g]));
        Ok(match g {
            Some(g) => c[g..(g + max).min(c.len())].to_vec(),
            None => Vec::new(),
        })
    }
}

/// Proposes tokens the target does not take — the last context token's successors in the
/// vocabulary, a different run each step — so nearly every draft is wrong: a run with it
/// measures what drafting costs when it never pays, which the controller's pause must keep
/// small (the bar: at most 3% slower than plain; docs/bench.md "Drafting"). Stateless and free to propose.
pub struct ContraryDrafter {
    n_vocab: u32,
}

impl ContraryDrafter {
    pub fn new(n_vocab: usize) -> Self {
        ContraryDrafter { n_vocab: n_vocab.clamp(1, u32::MAX as usize) as u32 }
    }
}

impl Drafter for ContraryDrafter {
    fn name(&self) -> &'static str {
        "contrary"
    }

    fn propose(&mut self, ctx: &[u32], max: usize) -> Result<Vec<u32>> {
        let last = ctx.last().copied().unwrap_or(0) as u64;
        Ok((0..max as u64).map(|i| ((last + 1 + i) % self.n_vocab as u64) as u32).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_the_latest_continuation() {
        let mut d = NgramDrafter { min_n: 2, max_n: 3 };
        // ... 1 2 3 [4 5] ... 1 2 3 [7 8] ... 2 3 → the latest: 7 8
        let ctx = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 2, 3];
        assert_eq!(d.propose(&ctx, 2).unwrap(), vec![7, 8]);
        assert_eq!(d.propose(&ctx, 10).unwrap(), vec![7, 8, 6, 2, 3]);
        assert_eq!(d.propose(&[1, 2, 3], 4).unwrap(), Vec::<u32>::new());
        assert_eq!(d.propose(&[5, 5, 5, 5], 2).unwrap(), vec![5]);
    }
}
