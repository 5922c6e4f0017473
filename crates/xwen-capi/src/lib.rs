//! xwen's C ABI over `xwen-embed`. The header `include/xwen.h` is generated from this crate by
//! cbindgen and checked in (tests/header.rs holds it current).
//!
//! Conventions, for every function:
//! - it returns a status (`XWEN_OK` or an `XWEN_ERR_*` code); on an error the calling
//!   thread's `xwen_last_error()` says why, until that thread's next failing call;
//! - a panic inside is caught at the boundary and returned as `XWEN_ERR_INTERNAL` (its message
//!   goes to `xwen_last_error`, not to stderr); nothing prints, nothing exits;
//! - handles (`xwen_model`, `xwen_completion`, `xwen_cancel`) are opaque, made and freed here;
//!   strings are UTF-8 and NUL-terminated unless a length comes with them;
//! - outputs go to caller pointers only on `XWEN_OK` (a too-small buffer: the size it needs).
//!
//! Thread-safety is stated per function: a model may be shared between threads (generation,
//! chat and logits on one model take turns; tokenizing runs concurrently).

#![allow(non_camel_case_types)]
// every pointer is checked for null; the functions are `unsafe` to C callers by nature
#![allow(clippy::missing_safety_doc)]

mod generate;
mod model;

pub use generate::*;
pub use model::*;

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A status: `XWEN_OK` or one of the `XWEN_ERR_*` codes.
pub type xwen_status = i32;
pub const XWEN_OK: xwen_status = 0;
/// An argument cannot be used: a null pointer, text that is not UTF-8, an empty prompt, a token
/// outside the vocabulary, a prompt longer than the context, malformed JSON.
pub const XWEN_ERR_INVALID_ARGUMENT: xwen_status = 1;
/// The model could not be opened (no such file or name, not a GGUF, an architecture xwen does
/// not run, a RAM budget under the plan's floor).
pub const XWEN_ERR_LOAD: xwen_status = 2;
/// The chat template is missing or failed on these messages.
pub const XWEN_ERR_TEMPLATE: xwen_status = 3;
/// The engine failed while running.
pub const XWEN_ERR_ENGINE: xwen_status = 4;
/// The caller's buffer is too small; the size it needs was written.
pub const XWEN_ERR_BUFFER_TOO_SMALL: xwen_status = 5;
/// A bug in xwen (a caught panic); the message says where.
pub const XWEN_ERR_INTERNAL: xwen_status = 6;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Whether this thread is inside an xwen call (the panic hook then keeps quiet).
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The message of the calling thread's last failed call ("" if none). Valid until that
/// thread's next xwen call. Thread-safe: each thread has its own.
#[no_mangle]
pub extern "C" fn xwen_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// xwen's version ("0.1.0"), a static string. Thread-safe.
#[no_mangle]
pub extern "C" fn xwen_version() -> *const c_char {
    static V: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    V.as_ptr().cast()
}

/// Frees a string xwen returned (`char **` outputs). Null is ignored. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn xwen_string_free(s: *mut c_char) {
    if !s.is_null() {
        drop(CString::from_raw(s));
    }
}

pub(crate) struct Failure(pub xwen_status, pub String);

impl From<xwen_embed::Error> for Failure {
    fn from(e: xwen_embed::Error) -> Self {
        let code = match &e {
            xwen_embed::Error::InvalidArgument(_) => XWEN_ERR_INVALID_ARGUMENT,
            xwen_embed::Error::Load(_) => XWEN_ERR_LOAD,
            xwen_embed::Error::Template(_) => XWEN_ERR_TEMPLATE,
            xwen_embed::Error::Engine(_) => XWEN_ERR_ENGINE,
        };
        Failure(code, e.to_string())
    }
}

pub(crate) fn invalid(msg: impl Into<String>) -> Failure {
    Failure(XWEN_ERR_INVALID_ARGUMENT, msg.into())
}

/// Runs `f` at the boundary: its error or panic becomes a status and the thread's message.
pub(crate) fn boundary(f: impl FnOnce() -> Result<(), Failure>) -> xwen_status {
    install_quiet_panics();
    let was_inside = INSIDE.with(|i| i.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    INSIDE.with(|i| i.set(was_inside));
    let (code, msg) = match r {
        Ok(Ok(())) => return XWEN_OK,
        Ok(Err(Failure(code, msg))) => (code, msg),
        Err(payload) => {
            let what = payload.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| payload.downcast_ref::<String>().cloned()).unwrap_or_else(|| "a panic".into());
            (XWEN_ERR_INTERNAL, format!("internal error (please report): {what}"))
        }
    };
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(msg.replace('\0', " ")).unwrap_or_default());
    code
}

/// The default panic hook prints to stderr; inside an xwen call the panic becomes a status
/// instead, so the hook says nothing there (elsewhere in the host program it is unchanged).
fn install_quiet_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !INSIDE.with(|i| i.get()) {
                previous(info);
            }
        }));
    });
}

/// `s` as UTF-8 text; `what` names the argument in the error.
pub(crate) unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    CStr::from_ptr(s).to_str().map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// `n` elements at `p` (null is allowed when `n` is 0).
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T], Failure> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    Ok(std::slice::from_raw_parts(p, n))
}

/// Writes through an output pointer after checking it.
pub(crate) unsafe fn put<T>(out: *mut T, v: T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    out.write(v);
    Ok(())
}

/// A string for the caller to free with `xwen_string_free`.
pub(crate) fn owned_string(s: String) -> *mut c_char {
    CString::new(s.replace('\0', "\u{FFFD}")).unwrap_or_default().into_raw()
}
