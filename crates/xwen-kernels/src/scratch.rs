//! Per-thread scratch for the kernels' short-lived buffers: an output tile per task of a
//! product is a few KB to a few hundred KB, taken and let go hundreds of times per decoded
//! token — past the allocator's fast per-thread cache (about 1 KB), so each was a trip through
//! its bins. One buffer per thread is kept instead; a nested take gets a fresh one.

use std::cell::Cell;

/// The most floats a thread keeps between uses (4 MiB); a larger buffer is freed.
const KEEP_MAX: usize = 1 << 20;

thread_local! {
    static F32: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `n` zeroed floats, in this thread's kept buffer when it is free.
pub fn take_f32(n: usize) -> Vec<f32> {
    let mut v = F32.with(Cell::take);
    v.clear();
    v.resize(n, 0.0);
    v
}

/// Gives a buffer from [`take_f32`] back to this thread (the larger of it and the one kept).
pub fn give_f32(v: Vec<f32>) {
    if v.capacity() > KEEP_MAX {
        return;
    }
    F32.with(|c| {
        let kept = c.take();
        c.set(if kept.capacity() >= v.capacity() { kept } else { v });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_zeroed_and_nested_takes_get_their_own() {
        let mut a = take_f32(100);
        a.iter_mut().for_each(|x| *x = 7.0);
        let p = a.as_ptr();
        give_f32(a);
        let b = take_f32(50);
        assert_eq!(b.as_ptr(), p, "the kept buffer is reused");
        assert!(b.iter().all(|&x| x == 0.0));
        let c = take_f32(10);
        assert_ne!(c.as_ptr(), b.as_ptr(), "a nested take is another buffer");
        give_f32(c);
        give_f32(b);
        let d = take_f32(100);
        assert_eq!(d.as_ptr(), p, "the larger buffer is the one kept");
    }
}
