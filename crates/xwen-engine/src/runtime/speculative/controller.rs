//! How deep to draft, and the cost model that weighs a depth's expected tokens against what its
//! verify and its proposal cost.

use crate::runtime::cost_table::{read_cost, record, StepCosts, COST_MIN_SEEN};

/// What a drafting sequence's controller learned — step and proposal costs, acceptance by
/// position, pauses — handed back when the sequence ends (`Scheduler::take_ended`) so the next
/// request drafting with the same drafter starts from it, as the drafter itself carries on
/// (`Request::draft_memory`). A server request of a hundred tokens is over before a fresh
/// controller has measured enough to pause a drafter that does not pay.
pub struct DraftMemory(pub(crate) Controller);

/// How deep to draft: the depth follows what the last verify accepted (all accepted: one
/// deeper; else one past what was), and while the recent acceptance stays below
/// `PAUSE_BELOW` drafting pauses for `PAUSE_STEPS` steps — a drafter that never agrees then
/// costs almost nothing over plain decoding. Where steps are timed (`observe_cost`), the depth
/// is also capped at the one that pays most: the expected tokens of a verify of k drafts over
/// its measured cost relative to a plain step (`Costs`) — on a MoE model a verify's rows route
/// to more experts, and under a RAM budget those are reads. Output never depends on it.
pub(crate) struct Controller {
    pub(crate) max: usize,
    costs: Costs,
    /// Plain steps asked for to time one (`depth`).
    probes: u32,
    depth: usize,
    /// Exponential average of the accepted share of drafted tokens.
    rate: f64,
    /// Costly proposals in a row that came back empty (`observe_empty`).
    empty: usize,
    /// The next pause's length: doubled by each pause that ends without an accepted draft.
    pause_len: usize,
    drafted_steps: usize,
    pause: usize,
    /// The next pause for cost (no depth pays for its verify and its proposal): doubled by
    /// each cost verdict in a row, back to `PAUSE_STEPS` when a depth pays again.
    cost_pause_len: usize,
    /// Verifies left after a cost pause in which the depth ignores the cost verdict, so the
    /// acceptance counts see current drafts before the next one.
    probation: usize,
    /// Whether any draft has been accepted since the controller began.
    agreed: bool,
    /// Whether the drafter proposes cheaply enough to be asked what it would draft while it
    /// is paused (`shadow_wanted`, `observe_shadow`).
    shadowed: bool,
    /// Whether the pause is for cost (no depth pays) rather than for low acceptance.
    cost_pause: bool,
    /// Paused steps since the last shadow proposal.
    since_shadow: usize,
}

const PAUSE_BELOW: f64 = 0.25;
/// A cost verdict below this gain pauses drafting (plain decoding is 1).
const PAYS_ABOVE: f64 = 0.98;
const PAUSE_STEPS: usize = 24;
/// The longest pause (pauses in a row double up to it).
const LONGEST_PAUSE: usize = PAUSE_STEPS << 5;
/// Empty costly proposals in a row before a pause.
const EMPTY_RUN: usize = 4;
/// Verifies of a drafter that has never agreed before its first pause: a drafter that is right
/// at all is seldom wrong on both of its first two (P ≈ (1 − p)² for its first draft's
/// acceptance p), and each such verify costs a never-agreeing one about half a decode on a GPU.
const FRESH_REJECTS: usize = 2;
/// Paused steps between two shadow proposals: a proposal scans the context (n-gram lookup),
/// so not every step; an agreement then ends the pause at most this many steps late.
const SHADOW_EVERY: usize = 4;

impl Controller {
    pub(crate) fn new(max: usize) -> Self {
        Controller {
            max,
            costs: Costs::new(max),
            probes: 0,
            depth: max,
            rate: 0.5,
            empty: 0,
            pause_len: PAUSE_STEPS,
            drafted_steps: 0,
            pause: 0,
            cost_pause_len: PAUSE_STEPS,
            probation: 0,
            agreed: false,
            shadowed: false,
            cost_pause: false,
            since_shadow: 0,
        }
    }

    /// The most tokens it drafts per step.
    pub(crate) fn max_depth(&self) -> usize {
        self.max
    }

    /// The depth for this step (0 while paused). A shadowed drafter's pause for low
    /// acceptance ends when a shadow proposal agrees (`observe_shadow`), not after its steps:
    /// a drafter that never agrees then costs no verify after its first pause.
    pub(crate) fn depth(&mut self) -> usize {
        if self.pause > 0 {
            if !self.shadowed || self.cost_pause {
                self.pause -= 1;
            }
            return 0;
        }
        if !self.costs.timed {
            return self.depth;
        }
        // the plain step's cost is the yardstick: measure it directly, twice, once drafting has
        // run a while (a greedy run's output does not depend on it)
        // (at most twice: a step shared with other sequences is not timed)
        if self.drafted_steps >= PROBE_AFTER && self.costs.plain_seen() < COST_MIN_SEEN && self.probes < COST_MIN_SEEN {
            self.probes += 1;
            return 0;
        }
        if self.probation > 0 {
            return self.depth.max(1);
        }
        match self.costs.best_depth(self.max) {
            // no depth pays for its verify and its proposal: plain decoding for a while (pauses
            // in a row double, so a drafter that never pays costs ever less), then drafts again
            // on probation to see whether that still holds
            Some((0, _)) if self.costs.best_drafting_gain(self.max) < PAYS_ABOVE => {
                // a drafter that would not pay even if every draft were accepted cannot start
                // paying with better drafts, only with cheaper steps: the longest pause at once
                if self.costs.best_ceiling(self.max) < PAYS_ABOVE {
                    self.cost_pause_len = LONGEST_PAUSE;
                }
                self.pause = self.cost_pause_len - 1;
                self.cost_pause = true;
                self.cost_pause_len = (self.cost_pause_len * 2).min(LONGEST_PAUSE);
                self.probation = EMPTY_RUN;
                0
            }
            Some((k, _)) => {
                self.cost_pause_len = PAUSE_STEPS;
                self.depth.min(k.max(1))
            }
            None => self.depth,
        }
    }

    /// Choose depths by measured cost (`observe_cost`): only where the output cannot depend on
    /// the depth — greedy decoding. A sampled run draws its random numbers step by step, so a
    /// depth chosen by wall time would make a seed's text vary between runs.
    pub(crate) fn set_timed(&mut self, timed: bool) {
        self.costs.timed = timed;
    }

    /// A step of `rows` rows (1 + its drafts) took `secs`.
    pub(crate) fn observe_cost(&mut self, rows: usize, secs: f64) {
        if self.costs.timed {
            self.costs.observe_step(rows, secs);
        }
    }

    /// A proposal of `drafted` tokens (and what the drafter did for it since the last one)
    /// took `secs`: the drafter's share of a drafted step's cost.
    pub(crate) fn observe_draft_cost(&mut self, drafted: usize, secs: f64) {
        if self.costs.timed {
            self.costs.observe_draft(drafted, secs);
        }
    }

    /// The depth the cost model picks and its expected gain over plain decoding (None before
    /// it has measured enough).
    #[cfg(test)]
    fn cost_choice(&self) -> Option<(usize, f64)> {
        self.costs.best_depth(self.max)
    }

    /// A costly drafter proposed nothing (below p_min from its first token): it paid a
    /// forward for it, so a run of these pauses drafting as low acceptance does.
    pub(crate) fn observe_empty(&mut self) {
        self.empty += 1;
        // a drafter that has already been paused without an accepted draft since is paused
        // again by its first empty proposal (the pauses keep doubling), not after a new run
        let run = if self.pause_len > PAUSE_STEPS { 1 } else { EMPTY_RUN };
        if self.empty >= run {
            self.empty = 0;
            self.start_pause();
        }
    }

    /// Pauses drafting; pauses in a row without an accepted draft grow (24, 48, … 768 steps),
    /// so a drafter that is never right costs ever less.
    fn start_pause(&mut self) {
        self.pause = self.pause_len;
        self.cost_pause = false;
        self.since_shadow = 0;
        self.pause_len = (self.pause_len * 2).min(LONGEST_PAUSE);
    }

    /// Whether this step, paused, should ask the drafter what it would draft (one token, never
    /// verified) and report it with `observe_shadow`: a drafter that proposes cheaply (n-gram
    /// lookup, replay), paused for low acceptance, every `SHADOW_EVERY` paused steps. Call
    /// after `depth` returned 0.
    pub(crate) fn shadow_wanted(&mut self) -> bool {
        if !self.shadowed || self.cost_pause || self.pause == 0 {
            return false;
        }
        self.since_shadow += 1;
        if self.since_shadow < SHADOW_EVERY {
            return false;
        }
        self.since_shadow = 0;
        true
    }

    /// Whether the drafter proposes cheaply enough to be shadowed while paused (set once, from
    /// `Drafter::proposes_cheaply`).
    pub(crate) fn set_shadowed(&mut self, on: bool) {
        self.shadowed = on;
    }

    /// A shadow proposal's first token was (`agreed`) or was not the token the step produced.
    /// An agreement ends the pause: the drafter drafts again at depth 1 on the next step, and
    /// a rejection there pauses it again as a probe's would (the pauses keep doubling).
    pub(crate) fn observe_shadow(&mut self, agreed: bool) {
        if agreed && self.pause > 0 && !self.cost_pause {
            self.pause = 0;
            self.rate = 0.5;
            self.depth = 1;
        }
    }

    pub(crate) fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.costs.observe_accept(drafted, accepted);
        self.probation = self.probation.saturating_sub(1);
        self.empty = 0;
        self.drafted_steps += 1;
        if accepted > 0 {
            self.pause_len = PAUSE_STEPS;
            self.agreed = true;
        }
        self.rate = 0.7 * self.rate + 0.3 * (accepted as f64 / drafted as f64);
        self.depth = if accepted == drafted { (self.depth + 1).min(self.max) } else { (accepted + 1).min(self.max) };
        // a drafter paused before and not accepted since is paused again by its first rejected
        // probe (as `observe_empty` does for empty proposals): a drafter that never agrees then
        // costs one verify a pause, and the pauses keep doubling
        let rejected_again = accepted == 0 && self.pause_len > PAUSE_STEPS;
        // and one that has never agreed pauses after its first FRESH_REJECTS verifies
        let never_agreed = !self.agreed && self.drafted_steps >= FRESH_REJECTS;
        if (self.drafted_steps >= 4 && self.rate < PAUSE_BELOW) || rejected_again || never_agreed {
            self.start_pause();
            // on probation after the pause
            self.rate = 0.5;
            self.depth = 1;
        }
    }
}

/// What verifies cost and how often each draft position is accepted, measured as drafting
/// runs: a step's seconds by its row count (exponential averages), and per draft position the
/// share of the steps that reached it (every earlier draft accepted) that accepted it too.
/// From them, for k drafts: expected tokens E(k) = 1 + Σ_{i<k} Π_{j≤i} p_j against the cost
/// c(k) = t(1 + k) / t(1), a row count not measured yet read off the line through the measured
/// ones.
struct Costs {
    /// Whether depths are chosen by cost at all (`Controller::set_timed`).
    timed: bool,
    /// Steps' seconds by row count (each count's first step left out: `StepCosts`).
    steps: StepCosts,
    /// (average seconds, proposals seen) of a proposal by its drafted tokens (index = tokens).
    draft_secs: Vec<(f64, u32)>,
    /// Per draft position: steps that reached it, and those that accepted it (decayed counts).
    reached: Vec<f64>,
    accepted: Vec<f64>,
}

/// Decay of the acceptance counts per verify: recent behaviour counts more.
const ACCEPT_DECAY: f64 = 0.97;
/// Verifies before choosing by cost (a row count's average needs `COST_MIN_SEEN` steps).
const ACCEPT_MIN_STEPS: f64 = 4.0;
/// Verifies after which a timed controller measures a plain step, if none has run.
const PROBE_AFTER: usize = 8;

impl Costs {
    fn new(max: usize) -> Costs {
        Costs { timed: false, steps: StepCosts::new(max + 1), draft_secs: vec![(0.0, 0); max + 1], reached: vec![0.0; max], accepted: vec![0.0; max] }
    }

    /// Plain (one-row) steps measured.
    fn plain_seen(&self) -> u32 {
        self.steps.seen(1)
    }

    fn observe_step(&mut self, rows: usize, secs: f64) {
        self.steps.observe(rows, secs);
    }

    fn observe_draft(&mut self, drafted: usize, secs: f64) {
        record(&mut self.draft_secs, drafted, secs);
    }

    fn observe_accept(&mut self, drafted: usize, accepted: usize) {
        for (r, a) in self.reached.iter_mut().zip(self.accepted.iter_mut()) {
            *r *= ACCEPT_DECAY;
            *a *= ACCEPT_DECAY;
        }
        // positions 0..=accepted were reached (all before them accepted); 0..accepted accepted
        for i in 0..=accepted.min(drafted.saturating_sub(1)) {
            if let Some(r) = self.reached.get_mut(i) {
                *r += 1.0;
            }
        }
        for a in self.accepted.iter_mut().take(accepted) {
            *a += 1.0;
        }
    }

    /// The cost of a step of `rows` rows: its average where measured, else the least-squares
    /// line through the measured row counts (None with fewer than two). A plain step's is
    /// always measured, never read off the line.
    fn cost(&self, rows: usize) -> Option<f64> {
        if rows == 1 && self.plain_seen() < COST_MIN_SEEN {
            return None;
        }
        self.steps.cost(rows)
    }

    /// What proposing `k` tokens costs: its average, the line through the measured counts, the
    /// one measured count's average — 0 where no proposal was timed (a lookup drafter's are
    /// timed too, and next to nothing).
    fn draft_cost(&self, k: usize) -> f64 {
        read_cost(&self.draft_secs, k).or_else(|| self.draft_secs.iter().find(|c| c.1 >= COST_MIN_SEEN).map(|c| c.0)).unwrap_or(0.0)
    }

    /// The best gain over depths 1..=max (what drafting at its best depth would give).
    fn best_drafting_gain(&self, max: usize) -> f64 {
        (1..=max).filter_map(|k| self.gain(k)).fold(0.0, f64::max)
    }

    /// The best gain over depths 1..=max if every draft were accepted: an upper bound no
    /// acceptance can beat (0 until measured).
    fn best_ceiling(&self, max: usize) -> f64 {
        let Some(base) = self.cost(1) else { return 0.0 };
        (1..=max).filter_map(|k| Some((k + 1) as f64 / ((self.cost(1 + k)? + self.draft_cost(k)) / base))).fold(0.0, f64::max)
    }

    /// E(k) / c(k) for depth k: expected tokens per plain-step cost of verifying 1 + k rows and
    /// proposing k (None until measured).
    fn gain(&self, k: usize) -> Option<f64> {
        let base = self.cost(1)?;
        let (mut expected, mut chain, mut last_p) = (1.0f64, 1.0f64, 0.5f64);
        for i in 0..k.min(self.reached.len()) {
            // Laplace-smoothed; a position never reached takes the one before it, at most even
            let p = if self.reached[i] >= 1.0 { (self.accepted[i] + 0.5) / (self.reached[i] + 1.0) } else { last_p.min(0.5) };
            last_p = p;
            chain *= p;
            expected += chain;
        }
        Some(expected / ((self.cost(1 + k)? + self.draft_cost(k)) / base))
    }

    /// The depth k in 0..=max with the most expected tokens per unit of cost, and that gain
    /// (E(k) / c(k); 1 for plain decoding); None until enough is measured. (The controller
    /// drafts at least one token while drafting: pausing is the acceptance rule's call.)
    fn best_depth(&self, max: usize) -> Option<(usize, f64)> {
        if self.reached.first().copied().unwrap_or(0.0) < ACCEPT_MIN_STEPS {
            return None;
        }
        self.cost(1)?;
        let mut best = (0, 1.0);
        for k in 1..=max.min(self.reached.len()) {
            let gain = self.gain(k)?;
            if gain > best.1 {
                best = (k, gain);
            }
        }
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_costly_drafter_that_proposes_nothing_is_paused() {
        let mut c = Controller::new(4);
        for _ in 0..EMPTY_RUN - 1 {
            assert_eq!(c.depth(), 4);
            c.observe_empty();
        }
        assert_eq!(c.depth(), 4, "not paused before the run is long enough");
        c.observe_empty();
        assert!((0..PAUSE_STEPS).all(|_| c.depth() == 0), "paused for PAUSE_STEPS steps");
        assert_eq!(c.depth(), 4);
        // still never agreeing after the pause: its first empty pauses it again, twice as long
        c.observe_empty();
        assert!((0..2 * PAUSE_STEPS).all(|_| c.depth() == 0), "paused again at once, for 2 × PAUSE_STEPS");
        assert!(c.depth() > 0);
        // an accepted draft restores the run rule: EMPTY_RUN − 1 empties leave it drafting
        c.observe(2, 1);
        for _ in 0..EMPTY_RUN - 1 {
            c.observe_empty();
        }
        assert!(c.depth() > 0);
        c.observe_empty();
        assert!((0..PAUSE_STEPS).all(|_| c.depth() == 0), "the pause is back to PAUSE_STEPS");
        assert!(c.depth() > 0);
    }

    #[test]
    fn a_drafter_that_never_agrees_costs_one_verify_a_pause() {
        let mut c = Controller::new(4);
        let mut drafted_steps = Vec::new();
        for step in 0..1000 {
            let k = c.depth();
            if k > 0 {
                drafted_steps.push(step);
                c.observe(k, 0);
            }
        }
        // two steps before the first pause, then one probe after each pause (24, 48, … 768)
        assert_eq!(&drafted_steps[..3], &[0, 1, 2 + PAUSE_STEPS], "{drafted_steps:?}");
        let probes = &drafted_steps[2..];
        assert_eq!(probes.len(), 5, "{drafted_steps:?}");
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0] - 1).collect();
        assert_eq!(gaps, vec![48, 96, 192, 384], "{drafted_steps:?}");
        // a drafter that has agreed once is paused by low acceptance over four verifies, not
        // by its first two
        let mut c = Controller::new(4);
        c.observe(4, 2);
        c.observe(3, 0);
        assert!(c.depth() > 0, "an agreeing drafter's first rejection does not pause it");
        // an accepted draft ends the run rule: a later rejection alone does not pause
        let mut c = Controller::new(4);
        for _ in 0..4 {
            let k = c.depth();
            c.observe(k.max(1), 0);
        }
        while c.depth() == 0 {}
        c.observe(1, 1);
        c.observe(2, 0);
        assert!(c.depth() > 0, "an accepting drafter is not paused by one rejection");
    }

    #[test]
    fn a_shadowed_drafter_resumes_when_its_shadow_agrees_and_never_probes_otherwise() {
        // a cheap drafter that never agrees: its first two verifies, then no verify at all
        let mut c = Controller::new(4);
        c.set_shadowed(true);
        let (mut drafted_steps, mut shadows) = (Vec::new(), 0);
        for step in 0..1000 {
            let k = c.depth();
            if k > 0 {
                drafted_steps.push(step);
                c.observe(k, 0);
            } else if c.shadow_wanted() {
                shadows += 1;
                c.observe_shadow(false);
            }
        }
        assert_eq!(drafted_steps, vec![0, 1]);
        assert!((240..=250).contains(&shadows), "a shadow every {SHADOW_EVERY} paused steps: {shadows}");
        // its shadow agrees at step 100: it drafts again (depth 1) at the next step
        let mut c = Controller::new(4);
        c.set_shadowed(true);
        let mut resumed = None;
        for step in 0..200 {
            let k = c.depth();
            if k > 0 {
                if step > 1 {
                    resumed.get_or_insert((step, k));
                }
                c.observe(k, if step > 1 { k } else { 0 });
            } else if c.shadow_wanted() {
                c.observe_shadow(step >= 100);
            }
        }
        let (at, k) = resumed.expect("resumed");
        assert!((101..=100 + SHADOW_EVERY).contains(&at) && k == 1, "{at} {k}");
        // an unshadowed drafter's pause ends after its steps, as before
        let mut c = Controller::new(4);
        for _ in 0..2 {
            let k = c.depth();
            c.observe(k, 0);
        }
        assert!(!c.shadow_wanted());
        assert!((0..PAUSE_STEPS).all(|_| c.depth() == 0) && c.depth() > 0);
    }

    /// The depth that pays: deep where a verify's rows are cheap and drafts are right, shallow
    /// where each row costs nearly a step, none where no depth pays for itself.
    #[test]
    fn the_cost_model_picks_the_depth_that_pays() {
        // cost of a step of r rows: 1 + slope·(r − 1); each draft accepted with probability p
        let run = |slope: f64, p: f64| {
            let mut c = Controller::new(8);
            c.set_timed(true);
            // deterministic acceptance runs with the right frequencies
            let mut acc = 0.0f64;
            for step in 0..200 {
                let k = (step % 8) + 1;
                let mut a = 0;
                while a < k {
                    acc += p;
                    if acc >= 1.0 {
                        acc -= 1.0;
                        a += 1;
                    } else {
                        break;
                    }
                }
                c.costs.observe_accept(k, a);
                c.costs.observe_step(1 + k, 1.0 + slope * k as f64);
                c.costs.observe_step(1, 1.0);
            }
            c.cost_choice().expect("measured")
        };
        let (k, g) = run(0.05, 0.9);
        assert!(k >= 6 && g > 3.0, "cheap rows, right drafts: deep ({k}, {g})");
        let (k, g) = run(0.6, 0.7);
        assert!((1..=3).contains(&k) && g > 1.0, "costly rows: shallow ({k}, {g})");
        let (k, g) = run(1.0, 0.4);
        assert_eq!((k, g), (0, 1.0), "a verify row costs a step and drafts are poor: none pays");
        // where no depth pays the controller pauses drafting — for PAUSE_STEPS, then drafts on
        // probation (the cost verdict set aside for EMPTY_RUN verifies), then pauses twice as
        // long; an untimed one (sampling) ignores costs altogether
        let mut c = Controller::new(8);
        c.set_timed(true);
        for _ in 0..20 {
            c.costs.observe_accept(4, 1);
            c.costs.observe_step(5, 5.0);
            c.costs.observe_step(1, 1.0);
            c.costs.observe_step(2, 2.2);
        }
        c.depth = 4;
        assert!((0..PAUSE_STEPS).all(|_| c.depth() == 0), "no depth pays: paused");
        for _ in 0..EMPTY_RUN {
            assert!(c.depth() >= 1, "on probation after the pause");
            c.observe(1, 1);
            c.costs.observe_accept(4, 1);
        }
        assert!((0..2 * PAUSE_STEPS).all(|_| c.depth() == 0), "still not paying: paused twice as long");
        c.set_timed(false);
        c.pause = 0;
        assert_eq!(c.depth(), c.depth, "untimed: no cost verdicts");
    }

    #[test]
    fn a_row_counts_first_step_does_not_price_it() {
        // a verify of 5 rows whose first run paid 40 plain steps (a graph captured), then 2.5
        let mut c = Controller::new(4);
        c.set_timed(true);
        for i in 0..8 {
            c.costs.observe_accept(4, 4);
            c.costs.observe_step(5, if i == 0 { 40.0 } else { 2.5 });
            c.costs.observe_step(1, if i == 0 { 30.0 } else { 1.0 });
        }
        let (k, gain) = c.cost_choice().expect("measured");
        assert_eq!(k, 4, "every draft right at 2.5 plain steps for 5 tokens: the deepest pays");
        // (counted, the first step would still weigh 40 × 0.8^7 in the average: a gain below 1)
        assert!(gain > 1.5, "gain {gain}");
    }

    /// The drafter's own time counts: a draft model as costly as the target is paused even
    /// when every draft is right and verify rows are cheap; the same acceptance with a free
    /// proposal drafts deep.
    #[test]
    fn a_proposal_that_costs_more_than_it_saves_pauses_drafting() {
        let run = |draft_secs_per_token: f64| {
            let mut c = Controller::new(4);
            c.set_timed(true);
            for _ in 0..30 {
                c.costs.observe_accept(4, 4);
                for k in 0..=4 {
                    c.costs.observe_step(1 + k, 1.0 + 0.1 * k as f64);
                    c.costs.observe_draft(k, draft_secs_per_token * k as f64);
                }
            }
            c.depth = 4;
            c
        };
        let mut cheap = run(0.0);
        assert_eq!(cheap.depth(), 4, "free proposals, every draft right: deep");
        let mut costly = run(1.0);
        assert_eq!(costly.depth(), 0, "each drafted token costs a whole step: paused");
        assert!(costly.costs.best_drafting_gain(4) < 1.0);
        // it would not pay with every draft accepted either: the longest pause at once, then
        // probation
        assert!(costly.costs.best_ceiling(4) < PAYS_ABOVE);
        assert!((0..LONGEST_PAUSE - 1).all(|_| costly.depth() == 0), "the longest pause");
        assert!(costly.depth() >= 1, "then drafts on probation");
    }
}
