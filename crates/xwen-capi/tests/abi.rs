//! The C functions called as C would: statuses, messages, buffers that are too small, null
//! pointers, the callback and the cancel flag, chat's JSON.

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use xwen_capi::*;

fn last_error() -> String {
    unsafe { CStr::from_ptr(xwen_last_error()) }.to_string_lossy().into_owned()
}

fn demo() -> *mut xwen_model {
    let mut m = null_mut();
    assert_eq!(unsafe { xwen_model_load(null(), null(), &mut m) }, XWEN_OK, "{}", last_error());
    m
}

fn greedy(n: i64) -> xwen_generate_options {
    let mut o = std::mem::MaybeUninit::uninit();
    assert_eq!(unsafe { xwen_generate_options_init(o.as_mut_ptr()) }, XWEN_OK);
    let mut o = unsafe { o.assume_init() };
    o.max_tokens = n;
    o.temperature = 0.0;
    o
}

unsafe extern "C" fn count_then_stop(user: *mut c_void, ev: *const xwen_event) -> bool {
    let n = &mut *(user as *mut usize);
    if (*ev).kind == XWEN_EVENT_TOKEN && (*ev).token >= 0 {
        *n += 1;
    }
    *n < 5
}

#[test]
fn statuses_messages_and_buffers() {
    unsafe {
        let mut m = null_mut();
        let bad = CString::new("/nonexistent/model.gguf").unwrap();
        assert_eq!(xwen_model_load(bad.as_ptr(), null(), &mut m), XWEN_ERR_LOAD);
        assert!(m.is_null() && last_error().contains("nonexistent"), "{}", last_error());
        assert_eq!(xwen_model_load(null(), null(), null_mut()), XWEN_ERR_INVALID_ARGUMENT);
        let m = demo();
        // tokenize: the count needed, then the ids
        let text = "def f(x):\n";
        let mut n = 0usize;
        assert_eq!(xwen_tokenize(m, text.as_ptr().cast(), text.len(), false, null_mut(), 0, &mut n), XWEN_ERR_BUFFER_TOO_SMALL);
        let mut ids = vec![0u32; n];
        assert_eq!(xwen_tokenize(m, text.as_ptr().cast(), text.len(), false, ids.as_mut_ptr(), ids.len(), &mut n), XWEN_OK);
        let mut back: *mut c_char = null_mut();
        assert_eq!(xwen_detokenize(m, ids.as_ptr(), ids.len(), &mut back), XWEN_OK);
        assert_eq!(CStr::from_ptr(back).to_str().unwrap(), text);
        xwen_string_free(back);
        let bad_ids = [u32::MAX];
        assert_eq!(xwen_detokenize(m, bad_ids.as_ptr(), 1, &mut back), XWEN_ERR_INVALID_ARGUMENT);
        // logits: the last row
        let mut vocab = 0usize;
        assert_eq!(xwen_model_n_vocab(m, &mut vocab), XWEN_OK);
        let mut logits = vec![0f32; vocab];
        let mut got = 0usize;
        assert_eq!(xwen_logits(m, ids.as_ptr(), ids.len(), true, logits.as_mut_ptr(), logits.len(), &mut got), XWEN_ERR_BUFFER_TOO_SMALL);
        assert_eq!(got, ids.len() * vocab);
        assert_eq!(xwen_logits(m, ids.as_ptr(), ids.len(), false, logits.as_mut_ptr(), logits.len(), &mut got), XWEN_OK);
        assert!(logits.iter().all(|v| v.is_finite()));
        // info and plan as JSON
        let mut json: *mut c_char = null_mut();
        assert_eq!(xwen_model_info_json(m, &mut json), XWEN_OK);
        let info: serde_json::Value = serde_json::from_str(CStr::from_ptr(json).to_str().unwrap()).unwrap();
        assert_eq!((info["is_demo"].as_bool(), info["n_vocab"].as_u64()), (Some(true), Some(vocab as u64)));
        xwen_string_free(json);
        assert_eq!(xwen_model_plan_json(m, &mut json), XWEN_OK);
        xwen_string_free(json);
        let mut lo = std::mem::MaybeUninit::uninit();
        xwen_load_options_init(lo.as_mut_ptr());
        let mut lo = lo.assume_init();
        lo.ram_budget = 1024;
        assert_eq!(xwen_plan_json(null(), &lo, &mut json), XWEN_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("floor") || !last_error().is_empty(), "{}", last_error());
        // a prompt that is not UTF-8, an empty one
        let not_utf8 = [0xffu8, 0];
        let mut c = null_mut();
        assert_eq!(xwen_generate(m, not_utf8.as_ptr().cast(), null(), None, null_mut(), &mut c), XWEN_ERR_INVALID_ARGUMENT);
        let empty = CString::new("").unwrap();
        assert_eq!(xwen_generate(m, empty.as_ptr(), null(), None, null_mut(), &mut c), XWEN_ERR_INVALID_ARGUMENT);
        xwen_model_free(m);
    }
}

#[test]
fn callbacks_cancel_batches_and_chat() {
    unsafe {
        let m = demo();
        let prompt = CString::new("def fibonacci(n):\n").unwrap();
        let o = greedy(20);
        let mut full = null_mut();
        assert_eq!(xwen_generate(m, prompt.as_ptr(), &o, None, null_mut(), &mut full), XWEN_OK);
        let mut n = 0usize;
        let toks = std::slice::from_raw_parts(xwen_completion_tokens(full, &mut n), n).to_vec();
        assert_eq!(n, 20);
        assert_eq!(CStr::from_ptr(xwen_completion_finish_reason(full)).to_str().unwrap(), "length");
        // the callback stops at five tokens
        let mut seen = 0usize;
        let mut c = null_mut();
        assert_eq!(xwen_generate(m, prompt.as_ptr(), &o, Some(count_then_stop), (&mut seen as *mut usize).cast(), &mut c), XWEN_OK);
        let mut k = 0usize;
        let five = std::slice::from_raw_parts(xwen_completion_tokens(c, &mut k), k);
        assert_eq!((five, CStr::from_ptr(xwen_completion_finish_reason(c)).to_str().unwrap()), (&toks[..5], "cancelled"));
        xwen_completion_free(c);
        // a cancel flag set before the call
        let flag = xwen_cancel_new();
        xwen_cancel_set(flag, true);
        let oc = xwen_generate_options { cancel: flag, ..greedy(20) };
        assert_eq!(xwen_generate(m, prompt.as_ptr(), &oc, None, null_mut(), &mut c), XWEN_OK);
        assert_eq!(CStr::from_ptr(xwen_completion_finish_reason(c)).to_str().unwrap(), "cancelled");
        xwen_completion_free(c);
        xwen_cancel_free(flag);
        // two prompts at once: the first gets its single run's tokens
        let other = CString::new("import os\n").unwrap();
        let prompts = [prompt.as_ptr(), other.as_ptr()];
        let mut outs = [null_mut(); 2];
        assert_eq!(xwen_generate_batch(m, prompts.as_ptr(), 2, &o, None, null_mut(), outs.as_mut_ptr()), XWEN_OK);
        let first = std::slice::from_raw_parts(xwen_completion_tokens(outs[0], &mut k), k);
        assert_eq!(first, toks.as_slice());
        outs.iter().for_each(|&c| xwen_completion_free(c));
        xwen_completion_free(full);
        // chat: messages as JSON; the split reply in the completion's JSON
        let msgs = CString::new(r#"[{"role": "user", "content": "def add(a, b):"}]"#).unwrap();
        assert_eq!(xwen_chat(m, msgs.as_ptr(), null(), &greedy(12), None, null_mut(), &mut c), XWEN_OK, "{}", last_error());
        let j: serde_json::Value = serde_json::from_str(CStr::from_ptr(xwen_completion_json(c)).to_str().unwrap()).unwrap();
        assert_eq!(j["tokens"].as_array().unwrap().len(), 12);
        assert!(j["content"].is_string() && j["tool_calls"].as_array().unwrap().is_empty(), "{j}");
        xwen_completion_free(c);
        let bad = CString::new(r#"{"role": "user"}"#).unwrap();
        assert_eq!(xwen_chat(m, bad.as_ptr(), null(), null(), None, null_mut(), &mut c), XWEN_ERR_INVALID_ARGUMENT);
        xwen_model_free(m);
    }
}
