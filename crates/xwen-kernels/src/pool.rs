//! A persistent worker pool tuned for many small parallel loops (decode issues hundreds of
//! matvecs per token).
//!
//! Workers spin briefly on a control word, then park on a condvar. The caller thread takes
//! tasks too, and a job is *closed* once all its tasks are claimed: a worker that wakes late
//! finds the job closed and never touches it, so the caller waits only for workers that
//! actually entered, never for a sleeping thread to wake up. Nothing is allocated per call.
//!
//! Control word layout: bits 0..16 = workers inside the current job, bit 16 = job open,
//! bits 17.. = job generation.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const COUNT_MASK: u64 = 0xffff;
const OPEN: u64 = 1 << 16;
const GEN_SHIFT: u32 = 17;
/// How long an idle worker spins before parking, by default (`Pool::try_with_spin` sets it).
const SPIN: Duration = Duration::from_micros(1000);
/// Pause instructions between two looks at the control word while spinning: a pause is ~60
/// cycles on Zen cores, so 64 of them let a job wait ~1 µs for its worker — long beside the
/// few-µs products of a small model's decode (4: decode −8%, verify of 8 −3% on tiny-qwen35).
const SPIN_PAUSES: usize = 4;

#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n_tasks: usize,
}

struct Shared {
    ctl: AtomicU64,
    next_task: AtomicUsize,
    /// Written by the caller only while no worker is inside (count 0, job closed).
    job: UnsafeCell<Job>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: Mutex<usize>,
    wake: Condvar,
    /// How long an idle worker spins before parking.
    spin: Duration,
}

// SAFETY: `job` is only written while no worker can read it (see `Pool::run`), and the closure
// it points to is Sync.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
    /// Reused activation buffer for matvec/matmul.
    pub(crate) act_buf: Mutex<Vec<u8>>,
}

fn noop(_: usize) {}

impl Pool {
    /// A pool of `n_threads` threads in total: the caller plus `n_threads - 1` workers.
    /// Panics if the system refuses a thread; `try_new` returns that as an error.
    pub fn new(n_threads: usize) -> Pool {
        Pool::try_new(n_threads).expect("spawn worker thread")
    }

    /// `new`, with the system's refusal to start a worker (a thread limit, `-t 50000`) as an
    /// error; the workers already started are stopped again.
    pub fn try_new(n_threads: usize) -> std::io::Result<Pool> {
        Pool::try_with_spin(n_threads, SPIN)
    }

    /// `try_new` with idle workers spinning `spin` before they park (the default, 1 ms, suits
    /// the back-to-back loops of a decode step; a pool whose jobs come with gaps in which its
    /// caller does other work — the CPU's share of a GPU's layer — may spin less, so that
    /// its workers leave the cores to that work).
    pub fn try_with_spin(n_threads: usize, spin: Duration) -> std::io::Result<Pool> {
        let n_threads = n_threads.clamp(1, COUNT_MASK as usize);
        let noop_ref: &'static (dyn Fn(usize) + Sync) = &noop;
        let shared = Arc::new(Shared {
            ctl: AtomicU64::new(0),
            next_task: AtomicUsize::new(0),
            job: UnsafeCell::new(Job {
                f: noop_ref,
                n_tasks: 0,
            }),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
            spin,
        });
        let mut pool = Pool {
            shared: shared.clone(),
            workers: Vec::with_capacity(n_threads - 1),
            run_lock: Mutex::new(()),
            act_buf: Mutex::new(Vec::new()),
        };
        for i in 1..n_threads {
            let s = shared.clone();
            // on an error `pool` drops here, which stops and joins the workers already started
            let h = std::thread::Builder::new().name(format!("xwen-worker-{i}")).spawn(move || worker(&s))?;
            pool.workers.push(h);
        }
        Ok(pool)
    }

    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run f(i) for i in 0..n_tasks across the workers and the calling thread; returns when all
    /// are done. A panic in any task is re-raised here. Not reentrant: a task must not call
    /// back into the same pool.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: the previous job is closed with no worker inside (we waited for that before
        // returning from the last run), so nobody reads `job` now. The lifetime is erased because
        // this function does not return until no worker can touch `f` any more.
        unsafe {
            let f_static: *const (dyn Fn(usize) + Sync) = std::mem::transmute(f);
            *s.job.get() = Job {
                f: f_static,
                n_tasks,
            };
        }
        s.next_task.store(0, Ordering::Relaxed);
        let gen = (s.ctl.load(Ordering::Relaxed) >> GEN_SHIFT) + 1;
        s.ctl.store((gen << GEN_SHIFT) | OPEN, Ordering::Release);
        {
            let sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            if *sleepers > 0 {
                s.wake.notify_all();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| loop {
            let i = s.next_task.fetch_add(1, Ordering::Relaxed);
            if i >= n_tasks {
                break;
            }
            f(i);
        }));
        // Close the job, then wait for the workers that entered it.
        let mut c = s.ctl.fetch_and(!OPEN, Ordering::AcqRel) & !OPEN;
        let start = Instant::now();
        while c & COUNT_MASK != 0 {
            if start.elapsed() < s.spin {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            c = s.ctl.load(Ordering::Acquire);
        }
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a task panicked on a worker thread");
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then park.
        let start = Instant::now();
        let mut c = s.ctl.load(Ordering::Acquire);
        while c >> GEN_SHIFT == seen && !s.shutdown.load(Ordering::Relaxed) {
            if start.elapsed() < s.spin {
                for _ in 0..SPIN_PAUSES {
                    std::hint::spin_loop();
                }
            } else {
                let mut sleepers = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
                *sleepers += 1;
                while s.ctl.load(Ordering::Acquire) >> GEN_SHIFT == seen
                    && !s.shutdown.load(Ordering::Relaxed)
                {
                    sleepers = s.wake.wait(sleepers).unwrap_or_else(|e| e.into_inner());
                }
                *sleepers -= 1;
            }
            c = s.ctl.load(Ordering::Acquire);
        }
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        seen = c >> GEN_SHIFT;
        // Enter the job if it is still open and still the same generation.
        let entered = loop {
            if c >> GEN_SHIFT != seen || c & OPEN == 0 {
                break false;
            }
            match s
                .ctl
                .compare_exchange_weak(c, c + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break true,
                Err(now) => c = now,
            }
        };
        if !entered {
            continue;
        }
        // SAFETY: we are counted inside an open job of generation `seen`; the caller does not
        // rewrite `job` or return until our count is released.
        let job = unsafe { *s.job.get() };
        let f = unsafe { &*job.f };
        let r = catch_unwind(AssertUnwindSafe(|| loop {
            let i = s.next_task.fetch_add(1, Ordering::Relaxed);
            if i >= job.n_tasks {
                break;
            }
            f(i);
        }));
        if r.is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.ctl.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, Ordering::Relaxed);
        {
            let _g = s.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            // Bump the generation (job closed) so spinners notice.
            let gen = (s.ctl.load(Ordering::Relaxed) >> GEN_SHIFT) + 1;
            s.ctl.store(gen << GEN_SHIFT, Ordering::Release);
            s.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pool_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<super::Pool>();
    }
}
