//! A prefix cache for conversations: sequence states at message boundaries, keyed by the exact
//! token prefix they hold, kept in RAM within a byte limit and, where a directory is given,
//! written to disk so they survive a restart. A hybrid model's recurrent state cannot be
//! rebuilt from KV rows, so without this every new conversation turn that lands in a slot
//! holding something else — or any turn after a restart — prefills the whole conversation again
//! (llama.cpp issues #20225, #28194).
//!
//! An entry is a whole `SeqState` at the boundary (KV rows up to it and the recurrent states
//! there). A lookup returns the longest entry whose tokens begin the prompt and leave at least
//! one token to feed. Files are `<model>-<hash>-<len>.xwenprefix`: a header (magic, version, the
//! model fingerprint, the tokens), the state (`state::codec`), then a crc32 of everything before
//! it; a file that does not check out is skipped with a note, never loaded. Disk writes run on a
//! thread of their own, so a step of the other sequences never waits for one.

use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::state::SeqState;
use crate::state::codec as state_codec;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex};
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"XWENPFX\0";
const VERSION: u32 = 1;
const EXT: &str = "xwenprefix";

/// One cached prefix.
struct Entry {
    tokens: Vec<u32>,
    /// In RAM (None: on disk only, at `path`).
    state: Option<Arc<SeqState>>,
    path: Option<PathBuf>,
    last_used: u64,
}

/// What a lookup found.
pub struct Hit {
    /// Tokens of the prompt the state holds.
    pub len: usize,
    pub state: SeqState,
    /// Read from disk for this lookup (it was not in RAM).
    pub from_disk: bool,
}

pub struct PrefixCache {
    fingerprint: u64,
    ram_limit: u64,
    ram_bytes: u64,
    entries: Vec<Entry>,
    dir: Option<PathBuf>,
    clock: u64,
    writer: Option<mpsc::Sender<WriterMsg>>,
    /// What went wrong on the way that loses nothing but a cache entry (a file that could not be
    /// written, one dropped as damaged): the library never prints, its host takes these
    /// (`take_notes`; the engine hands them to its observer).
    notes: Arc<Mutex<Vec<String>>>,
}

enum WriterMsg {
    Write(PathBuf, Arc<Vec<u32>>, Arc<SeqState>),
    /// Answered once every write queued before it is done.
    Barrier(mpsc::Sender<()>),
}

/// Keeps `msg` for the host, a bounded number of them (a full disk would otherwise grow the list
/// with every write until someone reads it).
fn note(notes: &Mutex<Vec<String>>, msg: String) {
    let mut n = notes.lock().unwrap_or_else(|p| p.into_inner());
    if n.len() < 64 {
        n.push(msg);
    }
}

fn fnv(tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        for b in t.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn header(fingerprint: u64, tokens: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(28 + 4 * tokens.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&fingerprint.to_le_bytes());
    out.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out
}

/// Writes one entry: to a temporary name, then renamed, so a crash leaves no half file.
fn write_entry(path: &Path, fingerprint: u64, tokens: &[u32], state: &SeqState) -> std::io::Result<()> {
    let mut body = header(fingerprint, tokens);
    body.extend_from_slice(&state_codec::encode(state, fingerprint).map_err(std::io::Error::other)?);
    let crc = crc32fast::hash(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, &body)?;
    std::fs::rename(&tmp, path)
}

/// The tokens of a file's header, if it is an entry of this model (O(header) read).
fn read_header(path: &Path, fingerprint: u64) -> Option<Vec<u32>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = [0u8; 28];
    f.read_exact(&mut h).ok()?;
    if &h[..8] != MAGIC || u32::from_le_bytes(h[8..12].try_into().ok()?) != VERSION || u64::from_le_bytes(h[12..20].try_into().ok()?) != fingerprint {
        return None;
    }
    let n = u64::from_le_bytes(h[20..28].try_into().ok()?);
    let len = f.metadata().ok()?.len();
    if n.checked_mul(4).is_none_or(|b| b + 32 > len) {
        return None;
    }
    let mut raw = vec![0u8; n as usize * 4];
    f.read_exact(&mut raw).ok()?;
    Some(raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// The state a whole file holds, its checksum and header checked.
fn read_entry(path: &Path, fingerprint: u64, model: &Model) -> Result<(Vec<u32>, SeqState)> {
    let bad = |why: String| EngineError::State(format!("prefix cache file {}: {why}", path.display()));
    let b = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    if b.len() < 32 {
        return Err(bad("truncated".into()));
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err(bad("checksum mismatch".into()));
    }
    let tokens = read_header(path, fingerprint).ok_or_else(|| bad("not an entry of this model".into()))?;
    let state = state_codec::decode(&body[28 + 4 * tokens.len()..], fingerprint, model.new_host_state()).map_err(|e| bad(e.to_string()))?;
    if state.pos != tokens.len() {
        return Err(bad(format!("a state at {} for {} tokens", state.pos, tokens.len())));
    }
    Ok((tokens, state))
}

impl PrefixCache {
    /// A cache of at most `ram_limit` bytes of states in RAM for `model`; with `dir`, entries are
    /// also written there, and the ones already there (of this model and cache configuration)
    /// are indexed now and read when first used.
    pub fn new(model: &Model, ram_limit: u64, dir: Option<&Path>) -> Result<PrefixCache> {
        let fingerprint = model.state_fingerprint();
        let notes = Arc::new(Mutex::new(Vec::new()));
        let mut c = PrefixCache { fingerprint, ram_limit, ram_bytes: 0, entries: Vec::new(), dir: dir.map(Path::to_path_buf), clock: 0, writer: None, notes: notes.clone() };
        if let Some(d) = dir {
            std::fs::create_dir_all(d).map_err(|e| EngineError::State(format!("prefix cache directory {}: {e}", d.display())))?;
            let prefix = format!("{fingerprint:016x}-");
            for e in std::fs::read_dir(d).map_err(|e| EngineError::State(format!("prefix cache directory {}: {e}", d.display())))?.flatten() {
                let p = e.path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if !name.starts_with(&prefix) || p.extension().and_then(|x| x.to_str()) != Some(EXT) {
                    continue;
                }
                if let Some(tokens) = read_header(&p, fingerprint) {
                    c.entries.push(Entry { tokens, state: None, path: Some(p), last_used: 0 });
                }
            }
            let (tx, rx) = mpsc::channel::<WriterMsg>();
            std::thread::Builder::new()
                .name("xwen-prefix-writer".into())
                .spawn(move || {
                    for m in rx {
                        match m {
                            WriterMsg::Write(path, tokens, state) => {
                                if let Err(e) = write_entry(&path, fingerprint, &tokens, &state) {
                                    note(&notes, format!("prefix cache: could not write {}: {e}", path.display()));
                                }
                            }
                            WriterMsg::Barrier(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                })
                .map_err(|e| EngineError::State(format!("prefix cache writer thread: {e}")))?;
            c.writer = Some(tx);
        }
        Ok(c)
    }

    /// The notes gathered since the last call (see `notes`), oldest first.
    pub fn take_notes(&self) -> Vec<String> {
        std::mem::take(&mut *self.notes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Entries known (in RAM or on disk).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of states held in RAM.
    pub fn ram_bytes(&self) -> u64 {
        self.ram_bytes
    }

    /// The longest entry that begins `prompt`, holds more than `at_least` of its tokens and
    /// leaves at least one to feed: a working copy of its state (`Model::working_copy`: on
    /// `model`'s device where it has one, uploaded without a host copy). A file that fails its
    /// checks is dropped from the index with a note.
    pub fn lookup(&mut self, model: &Model, prompt: &[u32], at_least: usize) -> Option<Hit> {
        loop {
            let best = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.tokens.len() > at_least && e.tokens.len() < prompt.len() && prompt.starts_with(&e.tokens))
                .max_by_key(|(_, e)| e.tokens.len())
                .map(|(i, _)| i)?;
            self.clock += 1;
            let clock = self.clock;
            if let Some(st) = self.entries[best].state.clone() {
                let e = &mut self.entries[best];
                e.last_used = clock;
                return Some(Hit { len: e.tokens.len(), state: model.working_copy(&st), from_disk: false });
            }
            let path = self.entries[best].path.clone().expect("an entry not in RAM is on disk");
            match read_entry(&path, self.fingerprint, model) {
                Ok((tokens, state)) if tokens == self.entries[best].tokens => {
                    let len = tokens.len();
                    let bytes = state.bytes() as u64;
                    let out = model.working_copy(&state);
                    self.keep_in_ram(best, Arc::new(state), bytes);
                    self.entries[best].last_used = clock;
                    return Some(Hit { len, state: out, from_disk: true });
                }
                Ok(_) | Err(_) => {
                    note(&self.notes, format!("prefix cache: ignoring {} (damaged or not this model's)", path.display()));
                    self.entries.swap_remove(best);
                }
            }
        }
    }

    /// Keeps `state` (at `tokens.len()`) for later prompts that begin with `tokens`; also on disk
    /// where the cache has a directory. An entry for the same tokens is replaced.
    pub fn insert(&mut self, tokens: &[u32], state: SeqState) {
        if tokens.is_empty() || state.pos != tokens.len() {
            return;
        }
        // entries live in host memory (a state on a device is read back; one that cannot be
        // is not kept)
        let Ok(state) = state.into_host() else { return };
        let bytes = state.bytes() as u64;
        if bytes > self.ram_limit && self.dir.is_none() {
            return;
        }
        self.clock += 1;
        let state = Arc::new(state);
        let path = self.dir.as_ref().map(|d| d.join(format!("{:016x}-{:016x}-{}.{EXT}", self.fingerprint, fnv(tokens), tokens.len())));
        if let (Some(tx), Some(p)) = (&self.writer, &path) {
            let _ = tx.send(WriterMsg::Write(p.clone(), Arc::new(tokens.to_vec()), state.clone()));
        }
        let i = match self.entries.iter().position(|e| e.tokens == tokens) {
            Some(i) => {
                if let Some(old) = self.entries[i].state.take() {
                    self.ram_bytes -= old.bytes() as u64;
                }
                i
            }
            None => {
                self.entries.push(Entry { tokens: tokens.to_vec(), state: None, path: None, last_used: 0 });
                self.entries.len() - 1
            }
        };
        self.entries[i].path = path;
        self.entries[i].last_used = self.clock;
        self.keep_in_ram(i, state, bytes);
    }

    /// Puts entry `i`'s state in RAM, evicting the least recently used others to stay within
    /// the limit (an evicted entry with a file stays known; one without is forgotten).
    fn keep_in_ram(&mut self, i: usize, state: Arc<SeqState>, bytes: u64) {
        if bytes > self.ram_limit {
            // too big for RAM: on disk only (or nowhere)
            if self.entries[i].path.is_none() {
                self.entries.swap_remove(i);
            }
            return;
        }
        while self.ram_bytes + bytes > self.ram_limit {
            let victim = self.entries.iter().enumerate().filter(|(j, e)| *j != i && e.state.is_some()).min_by_key(|(_, e)| e.last_used).map(|(j, _)| j);
            let Some(j) = victim else { break };
            if let Some(old) = self.entries[j].state.take() {
                self.ram_bytes -= old.bytes() as u64;
            }
            if self.entries[j].path.is_none() {
                self.entries.swap_remove(j);
                // swap_remove moved the last entry into j; `i` may have been that one
                return self.keep_in_ram(if i == self.entries.len() { j } else { i }, state, bytes);
            }
        }
        self.entries[i].state = Some(state);
        self.ram_bytes += bytes;
    }

    /// Waits until every disk write queued so far is done (a clean shutdown, tests).
    pub fn flush(&self) {
        if let Some(tx) = &self.writer {
            let (done_tx, done_rx) = mpsc::channel();
            if tx.send(WriterMsg::Barrier(done_tx)).is_ok() {
                let _ = done_rx.recv();
            }
        }
    }
}
