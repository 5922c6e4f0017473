//! What drafting did: verify steps and, per draft position, the tokens drafted and accepted.

/// What drafting did — over one generation (`SpecStats::tally`) or every drafting sequence since
/// a scheduler started: verify steps with drafts, and per draft position (0: the first drafted
/// token of a step) the tokens drafted and accepted there — llama-server's `spec_decode_num_accepted_tokens_per_pos_total`. A draft at
/// position i is only accepted if those before it were, so `accepted_at` never grows with i.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraftTally {
    pub verify_steps: u64,
    pub drafted_at: Vec<u64>,
    pub accepted_at: Vec<u64>,
}

impl DraftTally {
    pub fn drafted(&self) -> u64 {
        self.drafted_at.iter().sum()
    }

    pub fn accepted(&self) -> u64 {
        self.accepted_at.iter().sum()
    }

    /// `other`'s counts added to these (repetitions of a benchmark, say).
    pub fn add(&mut self, other: &DraftTally) {
        self.verify_steps += other.verify_steps;
        for (sum, v) in [(&mut self.drafted_at, &other.drafted_at), (&mut self.accepted_at, &other.accepted_at)] {
            if sum.len() < v.len() {
                sum.resize(v.len(), 0);
            }
            for (a, b) in sum.iter_mut().zip(v) {
                *a += b;
            }
        }
    }

    /// One verify of `drafted` tokens of which the first `accepted` were kept.
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.verify_steps += 1;
        if self.drafted_at.len() < drafted {
            self.drafted_at.resize(drafted, 0);
            self.accepted_at.resize(drafted, 0);
        }
        for c in &mut self.drafted_at[..drafted] {
            *c += 1;
        }
        for c in &mut self.accepted_at[..accepted.min(drafted)] {
            *c += 1;
        }
    }
}

/// Counters of one speculative generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Whether drafting ran (false: `max_draft` 0, plain decoding).
    pub active: bool,
    /// Verify steps (target forward passes after the prefill).
    pub steps: usize,
    /// The drafts per draft position (the steps with drafts only).
    pub tally: DraftTally,
}

impl SpecStats {
    /// Tokens drafted (and verified).
    pub fn drafted(&self) -> usize {
        self.tally.drafted() as usize
    }

    /// Drafted tokens accepted.
    pub fn accepted(&self) -> usize {
        self.tally.accepted() as usize
    }

    pub fn acceptance(&self) -> f64 {
        match self.drafted() {
            0 => 0.0,
            d => self.accepted() as f64 / d as f64,
        }
    }
}
