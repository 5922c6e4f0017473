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
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Whether drafting ran (false: `max_draft` 0, plain decoding).
    pub active: bool,
    /// Verify steps (target forward passes after the prefill).
    pub steps: usize,
    /// The drafts per draft position (the steps with drafts only).
    pub tally: DraftTally,
    /// Where the time went: the steps that verified drafts and their forward passes' seconds
    /// (this sequence's share of a step shared with others), the steps without drafts (a
    /// paused drafter's) and theirs, and the seconds its drafter spent proposing (an MTP
    /// head's catch-up on the kept rows included). Steps whose share is not known yet (the
    /// first of a shared batch) are not counted.
    pub verify_steps: usize,
    pub verify_secs: f64,
    pub plain_steps: usize,
    pub plain_secs: f64,
    pub draft_secs: f64,
}

impl SpecStats {
    /// A forward step of this sequence of `rows` rows (1 + its drafts) that took `secs`.
    pub(crate) fn time_step(&mut self, rows: usize, secs: f64) {
        if rows > 1 {
            self.verify_steps += 1;
            self.verify_secs += secs;
        } else {
            self.plain_steps += 1;
            self.plain_secs += secs;
        }
    }

    /// Another generation's counters and times added to these.
    pub fn add(&mut self, o: &SpecStats) {
        self.active |= o.active;
        self.steps += o.steps;
        self.tally.add(&o.tally);
        self.verify_steps += o.verify_steps;
        self.verify_secs += o.verify_secs;
        self.plain_steps += o.plain_steps;
        self.plain_secs += o.plain_secs;
        self.draft_secs += o.draft_secs;
    }

    /// A drafted step's verify and its drafter's proposal, and a step without drafts, each on
    /// average in µs (None: no step of that kind timed). The drafter's time is spread over the
    /// drafted steps (a proposal that came back empty is paid there too).
    pub fn step_micros(&self) -> (Option<(f64, f64)>, Option<f64>) {
        let per = |secs: f64, n: usize| 1e6 * secs / n as f64;
        let drafted = (self.verify_steps > 0).then(|| (per(self.verify_secs, self.verify_steps), per(self.draft_secs, self.verify_steps)));
        let plain = (self.plain_steps > 0).then(|| per(self.plain_secs, self.plain_steps));
        (drafted, plain)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_times_split_drafted_and_plain_steps_and_add_up() {
        let mut s = SpecStats { active: true, ..Default::default() };
        assert_eq!(s.step_micros(), (None, None));
        s.time_step(5, 400e-6);
        s.time_step(3, 200e-6);
        s.time_step(1, 100e-6);
        s.draft_secs = 120e-6;
        let (drafted, plain) = s.step_micros();
        let (v, d) = drafted.expect("two drafted steps");
        assert!((v - 300.0).abs() < 1e-6 && (d - 60.0).abs() < 1e-6, "{v} {d}");
        assert!((plain.expect("one plain step") - 100.0).abs() < 1e-6);
        let mut t = s.clone();
        t.add(&s);
        assert_eq!((t.verify_steps, t.plain_steps), (4, 2));
        assert_eq!(t.step_micros().0, s.step_micros().0);
    }
}
