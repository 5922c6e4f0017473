//! Ctrl-C in the chat: while a reply is being written it stops that reply (the chat goes on);
//! at the prompt it drops the half-typed message and prompts again, as Python's REPL and Ollama
//! do (Ctrl-D or /exit leaves). The terminal's line discipline has already thrown the unfinished
//! line away; lines that a `\` continued are dropped by `read_message` when it sees the flag.
//! The handler only touches atomics and write(2), both safe inside a signal handler.

use std::sync::atomic::{AtomicBool, Ordering};

static REPLYING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);
static CLEARED: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn on_sigint(_: libc::c_int) {
    if REPLYING.load(Ordering::SeqCst) {
        STOP.store(true, Ordering::SeqCst);
    } else {
        CLEARED.store(true, Ordering::SeqCst);
        const MSG: &[u8] = b"\n> ";
        // SAFETY: write(2) is async-signal-safe; the prompt goes where read_message writes it.
        unsafe {
            libc::write(1, MSG.as_ptr().cast(), MSG.len());
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

/// Whether Ctrl-C cleared the message being typed since the last call.
pub fn take_cleared() -> bool {
    CLEARED.swap(false, Ordering::SeqCst)
}

/// Whether Ctrl-C asked the reply to stop.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
