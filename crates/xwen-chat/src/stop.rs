//! Stop strings on streamed text: `StopFilter` cuts the text at the first stop string and
//! holds back a tail that may be the start of one, so streamed text never shows what the
//! final text does not contain. Front ends reach it through `TextStream` (`stream.rs`);
//! `partial_suffix` also serves the reply parser's tags.

/// Cuts the text at the first stop string.
#[derive(Clone, Debug, Default)]
pub(crate) struct StopFilter {
    stops: Vec<String>,
    held: String,
    hit: Option<String>,
}

/// The longest suffix of `s` that is a proper prefix of `tag`, in bytes (on a char boundary).
pub fn partial_suffix(s: &str, tag: &str) -> usize {
    let max = tag.len().saturating_sub(1).min(s.len());
    (1..=max).rev().find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..])).unwrap_or(0)
}

impl StopFilter {
    pub(crate) fn new(stops: Vec<String>) -> Self {
        StopFilter { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new(), hit: None }
    }

    /// Adds text; returns what is certainly before any stop string.
    pub(crate) fn push(&mut self, text: &str) -> String {
        if self.hit.is_some() {
            return String::new();
        }
        self.held.push_str(text);
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|i| (i, s))).min_by_key(|(i, _)| *i);
        if let Some((i, s)) = first {
            self.hit = Some(s.clone());
            let out = self.held[..i].to_string();
            self.held.clear();
            return out;
        }
        let keep = self.stops.iter().map(|s| partial_suffix(&self.held, s)).max().unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        out
    }

    /// The stop string that matched, if one did.
    pub(crate) fn hit(&self) -> Option<&str> {
        self.hit.as_deref()
    }

    /// The text still held (the reply ended without completing a stop string).
    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_hold_back_partial_matches() {
        let mut f = StopFilter::new(vec!["STOP".into(), "\n\n".into()]);
        assert_eq!(f.push("abc ST"), "abc ");
        assert_eq!(f.push("O"), "");
        assert_eq!(f.push("x"), "STOx");
        assert_eq!(f.push("y\n"), "y");
        assert_eq!(f.push("\nz"), "");
        assert_eq!(f.hit(), Some("\n\n"));
        assert_eq!(f.push("more"), "");
        let mut f = StopFilter::new(vec!["é!".into()]);
        assert_eq!(f.push("aé"), "a");
        assert_eq!(f.finish(), "é");
    }
}
