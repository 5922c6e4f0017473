//! How deep a streamed decode reads ahead: the next MoE layer's experts are guessed from this
//! layer's input (`moe::Lookahead`), ranked as that layer's router ranks them, and a guess of
//! rank r is read ahead only while guesses of rank r have been right at least `MIN_ACCURACY` of
//! the time. A wrong guess is a whole expert read for nothing, and on a disk-bound decode those
//! bytes are what the step waits for; a right one fills the disk's idle time during compute.
//!
//! The score is kept passively: every guess is compared, rank by rank, with what its layer then
//! chose — whether or not it was read ahead — so a rank that was turned off keeps being judged
//! and comes back when it earns it. Measured on traces (`xwen replay`, docs/bench.md session 18):
//! the trained tiny MoE's ranks are right 92 / 83 / 64 / 48% of the time (top-4 of 16), the
//! synthetic 35B-A3B's 96 / 92 / 88 / 83 / 73 / 65 / 56 / 45% (top-8 of 256).

/// Threads that read a streamed decode's guesses at the next MoE layer ahead of it
/// (`ExpertStore::prefetch`): the disk serves several reads at once faster than one (one
/// direct 1.7 MB read at a time 0.58 GB/s, four 0.90 GB/s here). Each holds one expert outside
/// the cache while its read is in flight; it goes into the cache when it lands.
pub const PREFETCH_READERS: usize = 4;

/// The share of right guesses a rank needs to be read ahead. 0.7 against 0.8 and 0.9 on the
/// tiny MoE's four traces (docs/bench.md, session 18): deeper reads pay because a wrong guess
/// costs its read but not its room (it is evicted like any other expert once its step passed).
pub const MIN_ACCURACY: f64 = 0.7;

/// Guesses of one rank after which its counts halve, so the score follows the text.
const AGE_AFTER: u32 = 512;

/// Per rank, right guesses and guesses; and the guess waiting to be judged.
#[derive(Clone, Debug, Default)]
pub struct GuessScore {
    right: Vec<u32>,
    made: Vec<u32>,
    pending: Option<(usize, Vec<usize>)>,
}

impl GuessScore {
    /// Judges the pending guess, if it was for `layer`, against the experts `layer` chose.
    pub fn routed(&mut self, layer: usize, chosen: &[usize]) {
        let Some((l, guess)) = self.pending.take() else { return };
        if l != layer {
            return;
        }
        if self.made.len() < guess.len() {
            self.made.resize(guess.len(), 0);
            self.right.resize(guess.len(), 0);
        }
        for (r, e) in guess.iter().enumerate() {
            self.made[r] += 1;
            self.right[r] += chosen.contains(e) as u32;
            if self.made[r] >= AGE_AFTER {
                self.made[r] /= 2;
                self.right[r] /= 2;
            }
        }
    }

    /// Records `guess` (ranked, most likely first) for `layer`, to be judged when it routes.
    pub fn guessed(&mut self, layer: usize, guess: &[usize]) {
        self.pending = Some((layer, guess.to_vec()));
    }

    /// How many leading ranks to read ahead: those right at least `MIN_ACCURACY` of the time
    /// (a rank not judged yet counts as right, so a fresh store starts by reading ahead).
    pub fn depth(&self, ranks: usize) -> usize {
        (0..ranks)
            .take_while(|&r| match (self.made.get(r), self.right.get(r)) {
                (Some(&m), Some(&k)) if m > 0 => k as f64 >= MIN_ACCURACY * m as f64,
                _ => true,
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
