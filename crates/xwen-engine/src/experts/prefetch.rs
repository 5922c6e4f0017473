//! How deep a streamed decode reads ahead: the next MoE layer's experts are guessed from this
//! layer's input (`moe::Lookahead`), ranked as that layer's router ranks them, and a guess of
//! rank r for layer l is read ahead only while rank r's guesses for l have been right at least
//! `MIN_ACCURACY` of the time (l's record weighed with rank r's record over all layers). A wrong guess is a whole expert read for nothing, and on a disk-bound decode those
//! bytes are what the step waits for; a right one fills the disk's idle time during compute.
//!
//! The score is kept passively: every guess is compared, rank by rank, with what its layer then
//! chose — whether or not it was read ahead — so a rank that was turned off keeps being judged
//! and comes back when it earns it. Measured on traces (`xwen replay`, docs/bench.md "reading the next
//! layer's experts ahead"):
//! the trained tiny MoE's ranks are right 92 / 83 / 64 / 48% of the time (top-4 of 16), the
//! synthetic 35B-A3B's 96 / 92 / 88 / 83 / 73 / 65 / 56 / 45% (top-8 of 256).

/// Threads that read a streamed decode's guesses at the next MoE layer ahead of it
/// (`ExpertStore::prefetch`): the disk serves several reads at once faster than one (one
/// direct 1.7 MB read at a time 0.58 GB/s, four 0.90 GB/s here). Each holds one expert outside
/// the cache while its read is in flight; it goes into the cache when it lands.
pub const PREFETCH_READERS: usize = 4;

/// The share of right guesses a rank needs at a layer to be read ahead there. Chosen on
/// traces (`xwen replay`, docs/bench.md "The read-ahead judged per layer") between two bars that pull apart: the
/// trained tiny MoE's four traces within 5 points of Belady at 25 / 50 / 75% cached (worst
/// -3.1 at 0.78, -4.3 at 0.8, -2.9 at 0.75) and a streamed 35B-A3B's reads at most 1.05x what
/// its misses need (replay 1.031 at 0.78, 1.039 at 0.75; the live decode reads ~1.5 points
/// more than the replay's instant reads). 0.7 served while one score covered every layer.
pub const MIN_ACCURACY: f64 = 0.78;

/// A guess this often right at its layer is read as soon as a reader is free; a marginal one
/// (between `MIN_ACCURACY` and this) only while no other read ahead is in flight, so that more
/// of them are still queued when their layer routes, and dropped there when it chose
/// otherwise (`ExpertStore::routed`).
pub const SURE_ACCURACY: f64 = 0.9;

/// Guesses of one rank after which its counts halve, so the score follows the text.
const AGE_AFTER: u32 = 512;

/// The same for one layer's rank, which sees a layer's share of the guesses.
const LAYER_AGE_AFTER: u32 = 128;

/// How many of a layer's own judgments weigh as much as the rank's record over all layers,
/// which stands in for a layer not judged enough yet.
const LAYER_PRIOR: f64 = 16.0;

/// Per rank, right guesses and guesses, over all layers and per layer; and the guess waiting
/// to be judged.
#[derive(Clone, Debug, Default)]
pub struct GuessScore {
    right: Vec<u32>,
    made: Vec<u32>,
    /// [layer][rank]
    layer_right: Vec<Vec<u32>>,
    layer_made: Vec<Vec<u32>>,
    pending: Option<(usize, Vec<usize>)>,
}

fn judge(right: &mut Vec<u32>, made: &mut Vec<u32>, guess: &[usize], chosen: &[usize], age_after: u32) {
    if made.len() < guess.len() {
        made.resize(guess.len(), 0);
        right.resize(guess.len(), 0);
    }
    for (r, e) in guess.iter().enumerate() {
        made[r] += 1;
        right[r] += chosen.contains(e) as u32;
        if made[r] >= age_after {
            made[r] /= 2;
            right[r] /= 2;
        }
    }
}

impl GuessScore {
    /// Judges the pending guess, if it was for `layer`, against the experts `layer` chose.
    pub fn routed(&mut self, layer: usize, chosen: &[usize]) {
        let Some((l, guess)) = self.pending.take() else { return };
        if l != layer {
            return;
        }
        judge(&mut self.right, &mut self.made, &guess, chosen, AGE_AFTER);
        if self.layer_made.len() <= layer {
            self.layer_made.resize(layer + 1, Vec::new());
            self.layer_right.resize(layer + 1, Vec::new());
        }
        judge(&mut self.layer_right[layer], &mut self.layer_made[layer], &guess, chosen, LAYER_AGE_AFTER);
    }

    /// Records `guess` (ranked, most likely first) for `layer`, to be judged when it routes.
    pub fn guessed(&mut self, layer: usize, guess: &[usize]) {
        self.pending = Some((layer, guess.to_vec()));
    }

    /// How many leading ranks of the pending guess to read ahead: those right at least
    /// `MIN_ACCURACY` of the time at its layer. A layer's record of a rank is weighed with the
    /// rank's record over all layers (`LAYER_PRIOR` judgments' worth), so a layer starts from
    /// the others' accuracy and moves to its own as it is judged: the layers of a model guess
    /// unequally well, and a rank read everywhere it is right on average reads its poor
    /// layers' wrong guesses too. A rank judged nowhere yet counts as right, so a fresh store
    /// starts by reading ahead.
    pub fn depth(&self, ranks: usize) -> usize {
        (0..ranks).take_while(|&r| self.accuracy(r) >= MIN_ACCURACY).count()
    }

    /// How many leading ranks of the pending guess are right at least `SURE_ACCURACY` of the
    /// time at its layer (at most `depth`): read at once; the rest of `depth` are marginal.
    pub fn sure(&self, ranks: usize) -> usize {
        (0..ranks).take_while(|&r| self.accuracy(r) >= SURE_ACCURACY).count()
    }

    /// Rank r's estimated share of right guesses at the pending guess's layer (1 where no
    /// guess of that rank has been judged yet).
    fn accuracy(&self, r: usize) -> f64 {
        let layer = self.pending.as_ref().map(|p| p.0);
        let (m, k) = (self.made.get(r).copied().unwrap_or(0), self.right.get(r).copied().unwrap_or(0));
        if m == 0 {
            return 1.0;
        }
        let all = k as f64 / m as f64;
        let at = |v: &Vec<Vec<u32>>| layer.and_then(|l| v.get(l)).and_then(|v| v.get(r)).copied().unwrap_or(0) as f64;
        let (lm, lk) = (at(&self.layer_made), at(&self.layer_right));
        (lk + LAYER_PRIOR * all) / (lm + LAYER_PRIOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_that_guesses_badly_stops_reading_ahead_alone() {
        let mut s = GuessScore::default();
        // layer 1's top guess is always right, layer 2's never
        for _ in 0..200 {
            s.guessed(1, &[1, 9]);
            s.routed(1, &[1, 2]);
            s.guessed(2, &[5, 9]);
            s.routed(2, &[1, 2]);
        }
        s.guessed(1, &[1, 9]);
        assert_eq!(s.depth(2), 1, "layer 1 reads its top guess ahead");
        s.guessed(2, &[5, 9]);
        assert_eq!(s.depth(2), 0, "layer 2 reads nothing ahead");
        // a layer not judged yet starts from the rank's record over all layers (right half
        // the time: below the bar) and earns its own
        s.guessed(3, &[7, 9]);
        assert_eq!(s.depth(2), 0);
        for _ in 0..100 {
            s.guessed(3, &[7, 9]);
            s.routed(3, &[7, 8]);
        }
        s.guessed(3, &[7, 9]);
        assert_eq!(s.depth(2), 1);
    }

    #[test]
    fn ranks_that_guess_badly_stop_being_read_ahead_and_come_back() {
        let mut s = GuessScore::default();
        assert_eq!(s.depth(4), 4, "a fresh score reads every rank ahead");
        // ranks 0 and 1 always right, rank 2 right half the time, rank 3 never
        for t in 0..40 {
            s.guessed(3, &[1, 2, if t % 2 == 0 { 3 } else { 9 }, 8]);
            s.routed(3, &[1, 2, 3, 4]);
        }
        assert_eq!(s.depth(4), 2);
        // a guess for another layer is not judged against this one
        s.guessed(5, &[7, 7, 7, 7]);
        s.routed(4, &[1, 2, 3, 4]);
        assert_eq!(s.depth(4), 2);
        // rank 2 turns right every time: it earns its read-ahead back
        for _ in 0..200 {
            s.guessed(3, &[1, 2, 3, 8]);
            s.routed(3, &[1, 2, 3, 4]);
        }
        assert_eq!(s.depth(4), 3);
    }
}
