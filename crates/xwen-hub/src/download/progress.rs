//! The download progress display on stderr: a bar redrawn in place (bytes, %, MB/s, ETA) at most
//! 8 times a second when stderr is a terminal; otherwise a start line, one plain line every 30 s
//! and an end line, so CI logs neither flood nor go silent for the minutes a 20 GB file takes.

use std::collections::VecDeque;
use std::io::{self, IsTerminal};
use std::time::{Duration, Instant};

pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} kB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

fn human_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

pub struct Progress {
    name: String,
    total: Option<u64>,
    tty: bool,
    t0: Instant,
    start: u64,
    last_draw: Option<Instant>,
    /// (time, bytes) over the last few seconds, for a rate that follows the network.
    window: VecDeque<(Instant, u64)>,
    drawn: bool,
}

impl Progress {
    pub fn new(name: &str, total: Option<u64>, start: u64) -> Progress {
        let tty = io::stderr().is_terminal();
        let p = Progress {
            name: name.to_string(),
            total,
            tty,
            t0: Instant::now(),
            start,
            last_draw: None,
            window: VecDeque::new(),
            drawn: false,
        };
        if !tty {
            let size = total.map(|t| format!(" ({})", human_bytes(t))).unwrap_or_default();
            eprintln!("xwen: downloading {name}{size}");
        }
        p
    }

    pub fn set_total(&mut self, t: Option<u64>) {
        if t.is_some() {
            self.total = t;
        }
    }

    pub fn note(&mut self, msg: &str) {
        self.clear();
        eprintln!("xwen: {msg}");
    }

    pub fn update(&mut self, done: u64) {
        let now = Instant::now();
        self.window.push_back((now, done));
        while self.window.len() > 2 && now.duration_since(self.window[0].0) > Duration::from_secs(5) {
            self.window.pop_front();
        }
        let every = if self.tty {
            Duration::from_millis(125)
        } else {
            Duration::from_secs(30)
        };
        if self.last_draw.is_some_and(|t| now.duration_since(t) < every) {
            return;
        }
        if self.last_draw.is_none() && !self.tty {
            self.last_draw = Some(now); // the start line was printed already
            return;
        }
        self.last_draw = Some(now);
        let line = self.line(done);
        if self.tty {
            eprint!("\r{line}\x1b[K");
            self.drawn = true;
        } else {
            eprintln!("xwen: {line}");
        }
    }

    fn line(&self, done: u64) -> String {
        let rate = match (self.window.front(), self.window.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) as f64 / b.0.duration_since(a.0).as_secs_f64(),
            _ => 0.0,
        };
        let speed = format!("{:.1} MB/s", rate / 1e6);
        match self.total {
            Some(t) if t > 0 => {
                let frac = (done as f64 / t as f64).min(1.0);
                let width = 24;
                let fill = (frac * width as f64) as usize;
                let bar: String = (0..width).map(|i| if i < fill { '#' } else { '-' }).collect();
                let eta = if rate > 0.0 {
                    human_secs((t - done.min(t)) as f64 / rate)
                } else {
                    "?".into()
                };
                format!(
                    "{} [{bar}] {:5.1}% {}/{} {speed} ETA {eta}",
                    self.name,
                    frac * 100.0,
                    human_bytes(done),
                    human_bytes(t)
                )
            }
            _ => format!("{} {} {speed}", self.name, human_bytes(done)),
        }
    }

    pub fn clear(&mut self) {
        if self.tty && self.drawn {
            eprint!("\r\x1b[K");
            self.drawn = false;
        }
    }

    pub fn finish(&mut self, done: u64) {
        self.clear();
        let secs = self.t0.elapsed().as_secs_f64();
        let moved = done.saturating_sub(self.start);
        eprintln!(
            "xwen: downloaded {} ({}) in {} ({:.1} MB/s)",
            self.name,
            human_bytes(done),
            human_secs(secs),
            moved as f64 / secs.max(1e-3) / 1e6
        );
    }
}
