//! A verify's rows sampled against the drafts: what is accepted, and where generation stops.

use crate::runtime::generate::StopReason;
use crate::runtime::sampler::Sampler;

/// Samples a verify's rows (`rows`: n_vocab logits each, the pending token's row first) in
/// order against `drafts`: a drafted row keeps its draft with its probability (greedy: when it
/// is the argmax). `emit` sees each sampled token and says whether generation ends with it.
/// Stops at the first row whose token is not its draft (the last row has none) or that ends
/// generation; returns that row's index i — drafts[..i] were accepted — its token and the stop.
pub(crate) fn sample_verify_rows(
    rows: &mut [f32],
    n_vocab: usize,
    drafts: &[u32],
    sampler: &mut Sampler,
    emit: &mut dyn FnMut(u32) -> Option<StopReason>,
) -> (usize, u32, Option<StopReason>) {
    let n = rows.len() / n_vocab;
    for i in 0..n {
        let row = &mut rows[i * n_vocab..(i + 1) * n_vocab];
        let (y, agrees) = match drafts.get(i) {
            Some(&d) => sampler.sample_against(row, d),
            None => (sampler.sample(row), false),
        };
        sampler.accept(y);
        let stop = emit(y);
        if stop.is_some() || !agrees || i + 1 == n {
            return (i, y, stop);
        }
    }
    unreachable!("a verify has at least one row")
}

/// `sample_verify_rows` for a greedy sampler whose rows were picked on a device
/// (`LogitsMode::AllArgmax`: each row's argmax skipping the sampler's bans, what its `sample`
/// would pick from the row's logits): the rows' tokens up to the first that parts from its
/// draft, each accepted by the sampler and emitted as there.
pub(crate) fn greedy_verify_rows(picks: &[u32], drafts: &[u32], sampler: &mut Sampler, emit: &mut dyn FnMut(u32) -> Option<StopReason>) -> (usize, u32, Option<StopReason>) {
    for (i, &y) in picks.iter().enumerate() {
        sampler.accept(y);
        let stop = emit(y);
        if stop.is_some() || drafts.get(i) != Some(&y) || i + 1 == picks.len() {
            return (i, y, stop);
        }
    }
    unreachable!("a verify has at least one row")
}
