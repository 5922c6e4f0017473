//! Checkpoint identity. Two releases ship the dense qwen35 graph with byte-identical configs,
//! so the architecture cannot say which checkpoint a file is: `general.name` decides, then the
//! file name, each matched as an exact full name or a whole full name inside it — never a bare
//! "3.6" — and a name that matches two checkpoints identifies as neither.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    Qwen36_27B,
    Qwen36_35BA3B,
    Qwen38_27B,
}

pub const CHECKPOINTS: [Checkpoint; 3] = [Checkpoint::Qwen36_27B, Checkpoint::Qwen36_35BA3B, Checkpoint::Qwen38_27B];

impl Checkpoint {
    pub fn full_name(self) -> &'static str {
        match self {
            Checkpoint::Qwen36_27B => "Qwen3.6-27B",
            Checkpoint::Qwen36_35BA3B => "Qwen3.6-35B-A3B",
            Checkpoint::Qwen38_27B => "Qwen3.8-27B",
        }
    }

    pub fn architecture(self) -> &'static str {
        match self {
            Checkpoint::Qwen36_35BA3B => "qwen35moe",
            _ => "qwen35",
        }
    }
}

/// Whether `full` occurs in `text` as a whole name: not followed by more name characters
/// ("Qwen3.6-27B" is not in "Qwen3.6-27B-Instruct-Abliterated"? it is, as a whole prefix —
/// but "Qwen3.6-2" must not match "Qwen3.6-27B").
fn contains_whole(text: &str, full: &str) -> bool {
    let t = text.to_ascii_lowercase();
    let f = full.to_ascii_lowercase();
    let mut start = 0;
    while let Some(i) = t[start..].find(&f) {
        let at = start + i;
        let before = t[..at].chars().next_back();
        let after = t[at + f.len()..].chars().next();
        let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '.');
        if boundary(before) && boundary(after) {
            return true;
        }
        start = at + 1;
    }
    false
}

fn match_one(text: &str) -> Option<Checkpoint> {
    let hits: Vec<Checkpoint> = CHECKPOINTS.iter().copied().filter(|c| contains_whole(text, c.full_name())).collect();
    // "Qwen3.6-35B-A3B" contains no other full name, but guard anyway: two hits = neither.
    (hits.len() == 1).then(|| hits[0])
}

/// Identify a file from its `general.name` and file name.
pub fn identify(general_name: Option<&str>, file_name: Option<&str>) -> Option<Checkpoint> {
    general_name.and_then(match_one).or_else(|| file_name.and_then(match_one))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_whole_names_identify() {
        assert_eq!(identify(Some("Qwen3.6-27B"), None), Some(Checkpoint::Qwen36_27B));
        assert_eq!(identify(Some("Qwen3.6-35B-A3B"), None), Some(Checkpoint::Qwen36_35BA3B));
        assert_eq!(identify(None, Some("Qwen3.8-27B-Q4_K_M.gguf")), Some(Checkpoint::Qwen38_27B));
        assert_eq!(identify(Some("Tiny Qwen35"), Some("Qwen3.6-27B-Q8_0.gguf")), Some(Checkpoint::Qwen36_27B));
    }

    #[test]
    fn partial_or_ambiguous_names_do_not() {
        assert_eq!(identify(Some("Qwen3.6"), None), None);
        assert_eq!(identify(Some("qwen3.6-14B-finetune"), None), None);
        assert_eq!(identify(Some("Qwen3.6-27B2"), None), None);
        assert_eq!(identify(Some("Qwen3.6-27B vs Qwen3.8-27B merge"), None), None);
        assert_eq!(identify(None, None), None);
    }
}
