//! The progress line of a long prefill on stderr: tokens done, rate and time left. On a
//! terminal it is redrawn in place (at most 4 times a second) for prompts of more than one
//! forward step; in a log it is one line per quarter, and only for prompts long enough
//! (`LOG_MIN_TOKENS`) that minutes may pass without one.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Prompts shorter than this print no progress when stderr is not a terminal.
const LOG_MIN_TOKENS: usize = 8192;

pub struct PrefillProgress {
    tty: bool,
    enabled: bool,
    t0: Instant,
    last_draw: Option<Instant>,
    next_quarter: usize,
    drawn: bool,
}

impl PrefillProgress {
    /// A display for a prefill of steps of `chunk` tokens; `quiet` turns it off.
    pub fn new(quiet: bool) -> Self {
        PrefillProgress { tty: std::io::stderr().is_terminal(), enabled: !quiet, t0: Instant::now(), last_draw: None, next_quarter: 1, drawn: false }
    }

    /// After a step: `done` of `total` prompt tokens computed.
    pub fn update(&mut self, done: usize, total: usize) {
        if !self.enabled || total == 0 {
            return;
        }
        let secs = self.t0.elapsed().as_secs_f64();
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        let eta = if rate > 0.0 { (total - done.min(total)) as f64 / rate } else { 0.0 };
        let line = format!("xwen: prefill {done}/{total} tokens, {rate:.0} tok/s, {eta:.0} s left");
        if self.tty {
            let due = self.last_draw.is_none_or(|t| t.elapsed() >= Duration::from_millis(250));
            if done < total && due {
                eprint!("\r{line}   ");
                let _ = std::io::stderr().flush();
                self.last_draw = Some(Instant::now());
                self.drawn = true;
            }
        } else if total >= LOG_MIN_TOKENS && done < total && done * 4 >= self.next_quarter * total {
            eprintln!("{line}");
            while done * 4 >= self.next_quarter * total {
                self.next_quarter += 1;
            }
        }
    }

    /// Ends the display (clears the in-place line).
    pub fn finish(&mut self) {
        if self.drawn {
            eprint!("\r\x1b[2K");
            let _ = std::io::stderr().flush();
            self.drawn = false;
        }
    }
}
