//! Ctrl-C in the chat: while a reply is being written it stops that reply (the chat goes on);
//! at the prompt it leaves, as a terminal program is expected to. The handler only touches
//! atomics and, to leave, `_exit` — both safe inside a signal handler.

use std::sync::atomic::{AtomicBool, Ordering};

static REPLYING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn on_sigint(_: libc::c_int) {
    if REPLYING.load(Ordering::SeqCst) {
        STOP.store(true, Ordering::SeqCst);
    } else {
        const MSG: &[u8] = b"\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(2, MSG.as_ptr().cast(), MSG.len());
            libc::_exit(130);
        }
    }
}

/// Installs the handler (once, before the chat starts).
pub fn install() {
    #[cfg(unix)]
    // SAFETY: a handler that only uses async-signal-safe calls; SA_RESTART keeps reads going.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// Marks the start of a reply: Ctrl-C from now on stops it.
pub fn begin_reply() {
    STOP.store(false, Ordering::SeqCst);
    REPLYING.store(true, Ordering::SeqCst);
}

/// Marks the end of a reply; returns whether Ctrl-C stopped it.
pub fn end_reply() -> bool {
    REPLYING.store(false, Ordering::SeqCst);
    STOP.swap(false, Ordering::SeqCst)
}

/// Whether Ctrl-C asked the reply to stop.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
