//! Timing tables for the drafting controller: averages of measured seconds by a count (rows of
//! a step, tokens of a proposal), read back where measured or along the least-squares line
//! through what was measured — and what a step that several sequences share costs each of them.

/// Weight of a new observation in a count's average.
pub(crate) const COST_EMA: f64 = 0.2;
/// Observations a count needs before its average is believed.
pub(crate) const COST_MIN_SEEN: u32 = 2;

/// `secs` into the (exponential average, count) cell `at` of a table (counts past its end are
/// not recorded).
pub(crate) fn record(table: &mut [(f64, u32)], at: usize, secs: f64) {
    if let Some(c) = table.get_mut(at) {
        c.0 = if c.1 == 0 { secs } else { (1.0 - COST_EMA) * c.0 + COST_EMA * secs };
        c.1 = c.1.saturating_add(1);
    }
}

/// The measured entries (index, average) of a table.
fn measured(table: &[(f64, u32)]) -> Vec<(f64, f64)> {
    table.iter().enumerate().filter(|(_, c)| c.1 >= COST_MIN_SEEN).map(|(r, c)| (r as f64, c.0)).collect()
}

/// (intercept, slope) of the least-squares line through the measured entries (None with fewer
/// than two).
fn line(table: &[(f64, u32)]) -> Option<(f64, f64)> {
    let pts = measured(table);
    if pts.len() < 2 {
        return None;
    }
    let n = pts.len() as f64;
    let (mx, my) = (pts.iter().map(|p| p.0).sum::<f64>() / n, pts.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let slope = if sxx > 0.0 { pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / sxx } else { 0.0 };
    Some((my - slope * mx, slope))
}

/// A cost table's figure for `at`: its average where measured often enough, else the
/// least-squares line through the measured entries (None with fewer than two).
pub(crate) fn read_cost(table: &[(f64, u32)], at: usize) -> Option<f64> {
    if let Some(&(t, n)) = table.get(at) {
        if n >= COST_MIN_SEEN {
            return Some(t);
        }
    }
    let (a, b) = line(table)?;
    Some((a + b * at as f64).max(f64::MIN_POSITIVE))
}

/// Steps' times by their row count: the scheduler's table of whole steps, from which a shared
/// step's time is divided among its sequences (`shares`), and a drafting controller's verify
/// costs. A row count's first step is not recorded: it pays for a first use (a GPU captures
/// the pass's graph then, tens of ms against a few), and counted, it priced a GPU's verify so
/// high that drafting stopped after a few steps with every draft right.
pub(crate) struct StepCosts {
    secs: Vec<(f64, u32)>,
    /// Row counts whose first step has run.
    warmed: Vec<bool>,
}

impl StepCosts {
    /// Steps of up to `max_rows` rows are recorded.
    pub(crate) fn new(max_rows: usize) -> StepCosts {
        StepCosts { secs: vec![(0.0, 0); max_rows + 1], warmed: vec![false; max_rows + 1] }
    }

    pub(crate) fn observe(&mut self, rows: usize, secs: f64) {
        let first = self.warmed.get_mut(rows).is_some_and(|w| !std::mem::replace(w, true));
        if !first {
            record(&mut self.secs, rows, secs);
        }
    }

    /// Steps of `rows` rows recorded.
    pub(crate) fn seen(&self, rows: usize) -> u32 {
        self.secs.get(rows).map_or(0, |c| c.1)
    }

    /// A step of `rows` rows: its average where measured, else off the line (`read_cost`).
    pub(crate) fn cost(&self, rows: usize) -> Option<f64> {
        read_cost(&self.secs, rows)
    }

    /// Seconds one more row adds to a step (None before two row counts are measured).
    pub(crate) fn row_secs(&self) -> Option<f64> {
        line(&self.secs).map(|(_, b)| b.max(0.0))
    }
}

/// What a step of `secs` costs each of its decoding sequences, given what one more row adds
/// (`row_secs`): sequence i's rows are its pending token and `extra[i]` drafts; `other_rows`
/// are rows of no decoding sequence (prefill chunks). The step's time less every extra row's
/// (drafts and prefill) is what the plain rows cost together, shared evenly — each sequence's
/// plain step, c(1) — and a sequence's drafts add their rows' time to its share: c(1 + k) =
/// c(1) + k·row_secs. With these a controller weighs drafting by what it adds to the shared
/// step, where timing a step alone would charge it the others' rows.
pub(crate) fn shares(secs: f64, row_secs: f64, extra: &[usize], other_rows: usize) -> Vec<f64> {
    if extra.is_empty() {
        return Vec::new();
    }
    let extra_rows: usize = extra.iter().sum::<usize>() + other_rows;
    let plain = ((secs - row_secs * extra_rows as f64) / extra.len() as f64).max(secs * 1e-3 / extra.len() as f64);
    extra.iter().map(|&k| plain + row_secs * k as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linear_step_cost_is_read_back_and_divided_by_what_each_sequence_adds() {
        let mut s = StepCosts::new(16);
        assert_eq!(s.row_secs(), None);
        for _ in 0..3 {
            for rows in [2, 4, 8] {
                s.observe(rows, 10.0 + 0.5 * rows as f64);
            }
        }
        let b = s.row_secs().unwrap();
        assert!((b - 0.5).abs() < 1e-9, "slope {b}");
        // four decoding sequences, one drafting 3, a prefill chunk of 2: 4 + 3 + 2 rows
        let secs = 10.0 + 0.5 * 9.0;
        let sh = shares(secs, b, &[0, 3, 0, 0], 2);
        let plain = (secs - 0.5 * 5.0) / 4.0;
        assert!((sh[0] - plain).abs() < 1e-9 && (sh[2] - plain).abs() < 1e-9);
        assert!((sh[1] - (plain + 1.5)).abs() < 1e-9, "the drafter pays its 3 rows: {sh:?}");
        // the ratio the drafter sees, c(4) / c(1), is far below 4: the fixed cost is shared
        assert!(sh[1] / plain < 1.6);
        // a compute-bound step (no fixed cost): drafting k rows costs k plain steps
        let sh = shares(0.5 * 6.0, 0.5, &[3, 0, 0], 0);
        assert!((sh[0] / sh[1] - 4.0).abs() < 1e-9, "{sh:?}");
        assert!(shares(1.0, 0.1, &[], 3).is_empty());
    }

    #[test]
    fn a_table_is_read_where_measured_else_along_its_line() {
        let mut t = vec![(0.0, 0); 6];
        assert_eq!(read_cost(&t, 1), None);
        for _ in 0..2 {
            record(&mut t, 1, 1.0);
            record(&mut t, 3, 3.0);
        }
        record(&mut t, 6, 9.0); // past the end: not recorded
        assert_eq!(read_cost(&t, 1), Some(1.0));
        assert!((read_cost(&t, 5).unwrap() - 5.0).abs() < 1e-9);
    }
}
