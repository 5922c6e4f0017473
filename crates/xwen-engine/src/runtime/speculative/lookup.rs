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
        Ok(match latest_match(ctx, self.min_n.max(1), self.max_n) {
            Some(from) => ctx[from..(from + max).min(ctx.len())].to_vec(),
            None => Vec::new(),
        })
    }
}

/// Where the continuation of the context's last n tokens starts at their latest earlier
/// occurrence, for the largest n in `min_n..=max_n` that occurs (None: none does). One
/// backward pass over the context: each earlier position holding the last token is a
/// candidate end of an occurrence, and how far its match reaches back (at most `max_n`) says
/// which n it serves. Scanning back, the first candidate to reach further than every later one
/// is the latest occurrence of that longer n-gram, so the best so far is one (reach, end) pair;
/// a reach of `max_n` ends the search. One comparison a position where the last token does not
/// recur — the lookup runs every drafted step, and on a paused drafter's shadow steps, over
/// contexts of thousands of tokens.
fn latest_match(ctx: &[u32], min_n: usize, max_n: usize) -> Option<usize> {
    let len = ctx.len();
    if min_n > max_n || len < 2 {
        return None;
    }
    let last = ctx[len - 1];
    let mut best: Option<(usize, usize)> = None; // (reach, end)
    for e in (0..len - 1).rev() {
        if ctx[e] != last {
            continue;
        }
        let reach = (1..max_n.min(e + 1)).take_while(|&k| ctx[e - k] == ctx[len - 1 - k]).count() + 1;
        if reach >= min_n && best.is_none_or(|(r, _)| reach > r) {
            best = Some((reach, e));
        }
        if reach >= max_n {
            break;
        }
    }
    best.map(|(_, e)| e + 1)
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

    /// The lookup the one-pass search replaced: each n from the longest down, scanning back.
    fn scan_each_n(ctx: &[u32], min_n: usize, max_n: usize, max: usize) -> Vec<u32> {
        let len = ctx.len();
        for n in (min_n.max(1)..=max_n).rev() {
            if len <= n {
                continue;
            }
            let key = &ctx[len - n..];
            if let Some(j) = (0..len - n).rev().find(|&j| &ctx[j..j + n] == key) {
                let from = j + n;
                let end = (from + max).min(len);
                if from < end {
                    return ctx[from..end].to_vec();
                }
            }
        }
        Vec::new()
    }

    #[test]
    fn ngram_lookup_in_one_pass_proposes_what_scanning_each_n_does() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for case in 0..4000 {
            // small alphabets, so n-grams recur at every length
            let alphabet = 2 + next(6);
            let len = next(60) as usize;
            let ctx: Vec<u32> = (0..len).map(|_| next(alphabet) as u32).collect();
            let (min_n, max_n) = match case % 4 {
                0 => (2, 4),
                1 => (1, 3),
                2 => (3, 3),
                _ => (1 + next(3) as usize, 2 + next(5) as usize),
            };
            let max = 1 + next(8) as usize;
            let mut d = NgramDrafter { min_n, max_n };
            assert_eq!(d.propose(&ctx, max).unwrap(), scan_each_n(&ctx, min_n, max_n, max), "{ctx:?} n {min_n}..={max_n} max {max}");
        }
    }
}
