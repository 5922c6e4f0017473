//! Byte-level BPE over one pre-tokenized word, with llama.cpp's merge order
//! (`llm_tokenizer_bpe_session::tokenize`): repeatedly merge the adjacent pair with the lowest
//! merge rank, leftmost first on ties.
//!
//! Every string the algorithm can meet (token texts, both halves of each merge, each merge's
//! result, the 256 byte characters) is interned once, so a merge step is an integer map lookup
//! instead of string concatenation and hashing.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use crate::unicode::byte_to_char;

/// FxHash (rustc's hasher): far cheaper than SipHash for the short keys hashed per merge step.
/// The keys come from the model file, not from request text, so flooding is not a concern.
#[derive(Default)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn finish(&self) -> u64 {
        // The multiply only carries entropy upwards; hashbrown picks buckets from the low
        // bits, so bring the well-mixed high bits down (as rustc-hash 2 does).
        self.0.rotate_left(26)
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Raw word bytes → its token ids.
type WordCache = FxMap<Box<[u8]>, Box<[u32]>>;
/// A candidate merge: `(rank, left index, right index, left symbol, right symbol)`, popped
/// lowest rank first, then leftmost.
type Candidate = Reverse<(u32, usize, usize, u32, u32)>;

const NO_TOKEN: u32 = u32::MAX;
/// Words cached before the cache is emptied and refilled (bounds memory on long inputs).
const CACHE_WORDS: usize = 1 << 16;

pub(crate) struct Bpe {
    /// Interned strings, in GPT-2 byte-level text.
    sym_text: Vec<Box<str>>,
    /// Token id of each interned string, or `NO_TOKEN`.
    sym_token: Vec<u32>,
    /// `(left, right)` symbol pair → `(rank, merged symbol)`; the first rank listed wins.
    merges: FxMap<u64, (u32, u32)>,
    /// The symbol of each raw byte's GPT-2 character.
    byte_sym: [u32; 256],
    /// Token id of each single-byte token text (ASCII), for llama.cpp's fallback when a final
    /// symbol is not a token.
    single_byte_token: [u32; 128],
    /// llama.cpp's `ignore_merges`: a word that is a token as a whole is emitted as is.
    ignore_merges: bool,
    cache: Mutex<WordCache>,
}

#[derive(Default)]
struct Interner {
    index: FxMap<Box<str>, u32>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.index.len() as u32;
        self.index.insert(s.into(), i);
        i
    }

    /// The interned strings by id (moved out, not copied).
    fn into_texts(self) -> Vec<Box<str>> {
        let mut text = vec![Box::<str>::default(); self.index.len()];
        for (s, i) in self.index {
            text[i as usize] = s;
        }
        text
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    sym: u32,
    prev: usize,
    next: usize,
    alive: bool,
}

const NONE: usize = usize::MAX;

impl Bpe {
    /// `token_to_id` maps each token text to its id (the last id wins on duplicates, as in
    /// llama.cpp); `merges` are "left right" strings in rank order.
    pub fn new<'a>(
        token_to_id: &FxMap<Box<str>, u32>,
        merges: impl Iterator<Item = &'a str>,
        ignore_merges: bool,
    ) -> Bpe {
        let mut interner = Interner::default();
        let mut byte_sym = [0u32; 256];
        for b in 0..=255u8 {
            byte_sym[b as usize] = interner.intern(byte_to_char(b).encode_utf8(&mut [0; 4]));
        }
        let mut merge_map = FxMap::default();
        let mut joined = String::new();
        for (rank, m) in merges.enumerate() {
            // llama.cpp splits at the first space after position 0; no space → both halves empty.
            let (left, right) = match m.bytes().skip(1).position(|b| b == b' ') {
                Some(p) => (&m[..p + 1], &m[p + 2..]),
                None => ("", ""),
            };
            let (l, r) = (interner.intern(left), interner.intern(right));
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let j = interner.intern(&joined);
            merge_map.entry(pair(l, r)).or_insert((rank as u32, j));
        }
        for text in token_to_id.keys() {
            interner.intern(text);
        }
        let sym_text = interner.into_texts();
        let sym_token = sym_text.iter().map(|t| token_to_id.get(t).copied().unwrap_or(NO_TOKEN)).collect();
        let mut single_byte_token = [NO_TOKEN; 128];
        for (b, slot) in single_byte_token.iter_mut().enumerate() {
            if let Some(&id) = token_to_id.get(char::from(b as u8).encode_utf8(&mut [0; 4]) as &str) {
                *slot = id;
            }
        }
        Bpe {
            sym_text,
            sym_token,
            merges: merge_map,
            byte_sym,
            single_byte_token,
            ignore_merges,
            cache: Mutex::new(FxMap::default()),
        }
    }

    /// Appends the tokens of one pre-tokenized word (raw bytes).
    pub fn encode_word(&self, word: &[u8], token_to_id: &FxMap<Box<str>, u32>, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if let Ok(cache) = self.cache.try_lock() {
            if let Some(ids) = cache.get(word) {
                out.extend_from_slice(ids);
                return;
            }
        }
        let start = out.len();
        self.encode_uncached(word, token_to_id, out);
        if let Ok(mut cache) = self.cache.try_lock() {
            if cache.len() >= CACHE_WORDS {
                cache.clear();
            }
            cache.insert(word.into(), out[start..].into());
        }
    }

    fn encode_uncached(&self, word: &[u8], token_to_id: &FxMap<Box<str>, u32>, out: &mut Vec<u32>) {
        if self.ignore_merges {
            let text: String = word.iter().map(|&b| byte_to_char(b)).collect();
            if let Some(&id) = token_to_id.get(text.as_str()) {
                out.push(id);
                return;
            }
        }
        let n = word.len();
        let mut syms: Vec<Symbol> = (0..n)
            .map(|i| Symbol {
                sym: self.byte_sym[word[i] as usize],
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
                alive: true,
            })
            .collect();
        // The symbols recorded in each candidate detect entries gone stale.
        let mut queue: BinaryHeap<Candidate> = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<Candidate>, syms: &[Symbol], l: usize, r: usize| {
            if l == NONE || r == NONE {
                return;
            }
            if let Some(&(rank, _)) = self.merges.get(&pair(syms[l].sym, syms[r].sym)) {
                queue.push(Reverse((rank, l, r, syms[l].sym, syms[r].sym)));
            }
        };
        for i in 1..n {
            push(&mut queue, &syms, i - 1, i);
        }
        while let Some(Reverse((_, l, r, lsym, rsym))) = queue.pop() {
            // A symbol only ever grows, so unchanged symbol ids mean the pair is still adjacent.
            if !syms[l].alive || !syms[r].alive || syms[l].sym != lsym || syms[r].sym != rsym {
                continue;
            }
            let (_, merged) = self.merges[&pair(lsym, rsym)];
            syms[l].sym = merged;
            syms[r].alive = false;
            syms[l].next = syms[r].next;
            if syms[r].next != NONE {
                let nx = syms[r].next;
                syms[nx].prev = l;
            }
            let (prev, next) = (syms[l].prev, syms[l].next);
            push(&mut queue, &syms, prev, l);
            push(&mut queue, &syms, l, next);
        }
        let mut i = 0;
        while i != NONE {
            let s = syms[i];
            let id = self.sym_token[s.sym as usize];
            if id != NO_TOKEN {
                out.push(id);
            } else {
                // llama.cpp looks up each byte of the symbol's text as a one-byte token; only
                // ASCII can match (token texts are UTF-8), the rest is dropped.
                for &b in self.sym_text[s.sym as usize].as_bytes() {
                    if b < 128 && self.single_byte_token[b as usize] != NO_TOKEN {
                        out.push(self.single_byte_token[b as usize]);
                    }
                }
            }
            i = s.next;
        }
    }
}

fn pair(l: u32, r: u32) -> u64 {
    ((l as u64) << 32) | r as u64
}
