//! A tiny argument parser: `--flag value`, `--flag=value`, `-f value`, boolean switches and
//! positionals. Hand-rolled to keep the CLI's build light (no clap on a 2-core machine).

use anyhow::{anyhow, bail, Result};

pub struct Args {
    items: Vec<String>,
    used: Vec<bool>,
}

impl Args {
    pub fn new(items: &[String]) -> Self {
        // Split `--k=v` into two items so lookups are uniform.
        let mut out = Vec::new();
        for it in items {
            if let (true, Some((k, v))) = (it.starts_with("--"), it.split_once('=')) {
                out.push(k.to_string());
                out.push(v.to_string());
            } else {
                out.push(it.clone());
            }
        }
        let used = vec![false; out.len()];
        Args { items: out, used }
    }

    /// The value after the first of `names` present, if any.
    pub fn value(&mut self, names: &[&str]) -> Result<Option<String>> {
        for i in 0..self.items.len() {
            if !self.used[i] && names.contains(&self.items[i].as_str()) {
                let Some(v) = self.items.get(i + 1) else {
                    bail!("{} needs a value", self.items[i]);
                };
                self.used[i] = true;
                self.used[i + 1] = true;
                return Ok(Some(v.clone()));
            }
        }
        Ok(None)
    }

    pub fn parsed<T: std::str::FromStr>(&mut self, names: &[&str]) -> Result<Option<T>>
    where
        T::Err: std::fmt::Display,
    {
        match self.value(names)? {
            None => Ok(None),
            Some(v) => v
                .parse::<T>()
                .map(Some)
                .map_err(|e| anyhow!("{}: bad value `{v}`: {e}", names[0])),
        }
    }

    pub fn flag(&mut self, names: &[&str]) -> bool {
        for i in 0..self.items.len() {
            if !self.used[i] && names.contains(&self.items[i].as_str()) {
                self.used[i] = true;
                return true;
            }
        }
        false
    }

    /// Remaining positionals; an unknown `-x` option is an error, not a positional.
    pub fn finish(self) -> Result<Vec<String>> {
        let mut pos = Vec::new();
        for (i, it) in self.items.into_iter().enumerate() {
            if self.used[i] {
                continue;
            }
            if it.starts_with('-') && it.len() > 1 && it.parse::<f64>().is_err() {
                bail!("unknown option `{it}`");
            }
            pos.push(it);
        }
        Ok(pos)
    }
}
