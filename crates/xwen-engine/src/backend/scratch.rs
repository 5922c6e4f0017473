//! The activation arena a backend owns: the buffers a forward's ops read and write (products'
//! outputs, q / k / v, gates, the residual stream's intermediates) are taken from it and go
//! back to it when dropped, so a decode step or a verify does not allocate, zero-fault and free
//! the same few dozen buffers on every op (malloc, free and the page faults of a fresh
//! allocation were ~5% of a tiny model's verify of 8 rows). A buffer is a [`Buf`]: a slice of
//! f32 to the layer, whose storage the arena hands out again to the next op of the same size
//! or smaller.
//!
//! What is kept between ops is bounded (`KEEP_BYTES`): a decode step's or a verify's buffers
//! (KB to a few MB) all stay, a prefill chunk's largest (tens of MB) mostly go back to the
//! allocator — prefill is arithmetic-bound, its allocations cost nothing beside it.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

/// Most bytes of free buffers the arena keeps for the next ops: the slack the RAM plan adds to
/// a forward's scratch (`memory_plan::SCRATCH_SLACK`), so buffers kept beside the ones in
/// use stay inside what a budget counts.
const KEEP_BYTES: usize = 64 << 20;

/// A backend's pool of activation buffers (see the module docs).
#[derive(Default)]
pub struct Scratch {
    free: Mutex<Free>,
}

#[derive(Default)]
struct Free {
    bufs: Vec<Vec<f32>>,
    bytes: usize,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch::default()
    }

    /// `n` zeros, in a buffer of the arena's.
    pub fn zeros(&self, n: usize) -> Buf<'_> {
        let mut v = self.take(n);
        v.clear();
        v.resize(n, 0.0);
        Buf { v, home: Some(self) }
    }

    /// A copy of `x`, in a buffer of the arena's.
    pub fn copy_of(&self, x: &[f32]) -> Buf<'_> {
        let mut v = self.take(x.len());
        v.clear();
        v.extend_from_slice(x);
        Buf { v, home: Some(self) }
    }

    /// The smallest free buffer that holds `n` values and is not much larger (a small request
    /// does not take the buffer a large one will want), else a new one; an empty request takes
    /// nothing from the pool.
    fn take(&self, n: usize) -> Vec<f32> {
        if n == 0 {
            return Vec::new();
        }
        let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let fits = |cap: usize| cap >= n && cap <= 2 * n + 4096;
        let best = f.bufs.iter().enumerate().filter(|(_, b)| fits(b.capacity())).min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i);
        match best {
            Some(i) => {
                let v = f.bufs.swap_remove(i);
                f.bytes -= v.capacity() * 4;
                v
            }
            None => Vec::with_capacity(n),
        }
    }

    /// Takes a buffer back while the free ones stay within `KEEP_BYTES` (the smallest go first
    /// when it would not: large buffers are the expensive ones to map again).
    fn give(&self, v: Vec<f32>) {
        let bytes = v.capacity() * 4;
        if bytes == 0 || bytes > KEEP_BYTES {
            return;
        }
        let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
        f.bufs.push(v);
        f.bytes += bytes;
        while f.bytes > KEEP_BYTES {
            let Some(i) = f.bufs.iter().enumerate().min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i) else { break };
            let dropped = f.bufs.swap_remove(i);
            f.bytes -= dropped.capacity() * 4;
        }
    }

    /// Bytes of free buffers held (for tests and the memory figures).
    pub fn free_bytes(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }
}

/// An activation buffer: a `[f32]` to its user, back to its arena when dropped. `Buf::owned`
/// wraps a plain vector (results that leave the forward, or ops of a backend without an arena).
pub struct Buf<'s> {
    v: Vec<f32>,
    home: Option<&'s Scratch>,
}

impl Buf<'_> {
    /// A buffer of no arena's: `v` itself, freed as a vector is.
    pub fn owned(v: Vec<f32>) -> Buf<'static> {
        Buf { v, home: None }
    }

    /// The values as a vector of their own (a result that outlives the forward); the storage
    /// leaves the arena.
    pub fn into_vec(mut self) -> Vec<f32> {
        self.home = None;
        std::mem::take(&mut self.v)
    }
}

impl Deref for Buf<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.v
    }
}

impl DerefMut for Buf<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.v
    }
}

impl<'b> IntoIterator for &'b Buf<'_> {
    type Item = &'b f32;
    type IntoIter = std::slice::Iter<'b, f32>;
    fn into_iter(self) -> Self::IntoIter {
        self.v.iter()
    }
}

impl<'b> IntoIterator for &'b mut Buf<'_> {
    type Item = &'b mut f32;
    type IntoIter = std::slice::IterMut<'b, f32>;
    fn into_iter(self) -> Self::IntoIter {
        self.v.iter_mut()
    }
}

impl Drop for Buf<'_> {
    fn drop(&mut self) {
        if let Some(home) = self.home {
            home.give(std::mem::take(&mut self.v));
        }
    }
}

impl std::fmt::Debug for Buf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buf").field("len", &self.v.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_zeroed_and_are_reused() {
        let s = Scratch::new();
        let p = {
            let mut a = s.zeros(1000);
            a[3] = 7.0;
            a.as_ptr()
        };
        assert_eq!(s.free_bytes(), 1000 * 4);
        let b = s.zeros(600);
        assert_eq!(b.as_ptr(), p, "the free buffer that fits is reused");
        assert!(b.iter().all(|&x| x == 0.0), "and zeroed");
        let c = s.zeros(2000);
        assert_ne!(c.as_ptr(), p);
        let v = c.into_vec();
        assert_eq!(v.len(), 2000);
        drop(b);
        assert_eq!(s.free_bytes(), 1000 * 4, "an escaped buffer does not come back");
        let d = s.copy_of(&[1.0, 2.0]);
        assert_eq!(&d[..], &[1.0, 2.0]);
    }

    #[test]
    fn the_free_buffers_stay_within_the_bound() {
        assert!(KEEP_BYTES as u64 <= crate::memory_plan::SCRATCH_SLACK, "what the arena keeps is inside the plan's slack");
        let s = Scratch::new();
        let big = KEEP_BYTES / 4 / 3;
        let bufs: Vec<Buf> = (0..5).map(|_| s.zeros(big)).collect();
        drop(bufs);
        assert!(s.free_bytes() <= KEEP_BYTES);
        assert!(s.free_bytes() >= 2 * big * 4);
        // a small request leaves the large buffers to the large ones
        let held = s.free_bytes();
        let small = s.zeros(10);
        assert_eq!(s.free_bytes(), held);
        drop(small);
        assert!(s.free_bytes() <= KEEP_BYTES);
    }
}
