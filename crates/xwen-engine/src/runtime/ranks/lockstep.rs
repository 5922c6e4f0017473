//! Running one call on every rank of a group at once, each on its own thread, and taking one
//! answer from them: what `ShardGroup` (ranks on this process's CPUs) and `DeviceGroup` (ranks
//! on devices) share.

use crate::error::{EngineError, Result};
use std::panic::AssertUnwindSafe;

/// `f` on every rank at once, rank r with `args[r]`; every rank's result, or the error that
/// started a failure. A rank whose call fails (or panics) calls `abort(r, why)` — the group's
/// collective then fails the ranks waiting in a reduction for it instead of leaving them
/// waiting forever — and the error returned is that cause, not the aborts it set off.
pub(crate) fn on_ranks<R: Sync, A: Send, T: Send>(ranks: &[R], args: Vec<A>, abort: &(dyn Fn(usize, &str) + Sync), f: impl Fn(&R, A) -> Result<T> + Sync) -> Result<Vec<T>> {
    let f = &f;
    let results: Vec<Result<T>> = std::thread::scope(|sc| {
        let hs: Vec<_> = ranks
            .iter()
            .zip(args)
            .enumerate()
            .map(|(r, (rank, a))| {
                sc.spawn(move || {
                    let out = std::panic::catch_unwind(AssertUnwindSafe(|| f(rank, a)))
                        .unwrap_or_else(|p| Err(EngineError::State(format!("rank {r}'s pass panicked: {}", panic_text(&p)))));
                    if let Err(e) = &out {
                        abort(r, &e.to_string());
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(EngineError::State("a rank's thread died".into())))).collect()
    });
    if results.iter().any(|r| r.is_err()) {
        let mut errs: Vec<EngineError> = results.into_iter().filter_map(|r| r.err()).collect();
        let i = errs.iter().position(|e| !matches!(e, EngineError::Collective(_))).unwrap_or(0);
        return Err(errs.swap_remove(i));
    }
    Ok(results.into_iter().map(|r| r.expect("no errors")).collect())
}

/// Rank 0's output, checked equal (`same`) to every other rank's: the ranks run the same trunk
/// on the same reduced expert outputs, so a difference is a fault of the group, not rounding.
pub(crate) fn agree<T>(mut outs: Vec<T>, same: impl Fn(&T, &T) -> bool) -> Result<T> {
    if let Some(r) = outs.iter().skip(1).position(|o| !same(&outs[0], o)) {
        return Err(EngineError::Collective(format!("rank {} computed different logits from rank 0", r + 1)));
    }
    if outs.is_empty() {
        return Err(EngineError::Collective("a group of no ranks".into()));
    }
    Ok(outs.swap_remove(0))
}

pub(crate) fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}
