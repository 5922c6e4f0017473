//! The bounded cache of streamed table rows (`experts::rows`): fixed-size slots in one arena,
//! a map from row to slot, and CLOCK (second chance) eviction.
//!
//! Not the expert cache's policy (`experts::cache`): that one scans every entry for its victim
//! and estimates reuse from the layer a lookup sits in — right for a few thousand experts
//! visited layer by layer, wrong for millions of rows of one table that a token picks by
//! hashing its n-grams. Here a lookup, an insert and an eviction are O(1) (amortized for the
//! hand), and an entry costs its row's bytes plus `SLOT_OVERHEAD`, which the memory plan
//! counts with the row.

use std::collections::HashMap;

/// RAM a slot takes beside its row's bytes: its map entry (key and slot, 16 bytes, in a table
/// of up to 2.3 buckets an entry at hashbrown's load factor, a control byte each), its key in
/// the slot list and its reference bit.
pub const SLOT_OVERHEAD: u64 = 48;

pub struct RowCache {
    slot_bytes: usize,
    capacity: usize,
    /// Slot i's row at `data[i * slot_bytes..]`: grown as slots fill, never beyond capacity.
    data: Vec<u8>,
    keys: Vec<u64>,
    referenced: Vec<bool>,
    map: HashMap<u64, u32>,
    hand: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl RowCache {
    /// A cache of at most `budget` bytes (rows and overhead) for rows of up to `slot_bytes`.
    pub fn new(slot_bytes: usize, budget: u64) -> RowCache {
        let per = slot_bytes as u64 + SLOT_OVERHEAD;
        let capacity = if slot_bytes == 0 { 0 } else { (budget / per).min(u32::MAX as u64) as usize };
        // reserved, not touched: the pages of the arena and the map's buckets are mapped as
        // rows arrive, and a full-size map never rehashes (a rehash would hold two maps)
        RowCache {
            slot_bytes,
            capacity,
            data: Vec::with_capacity(capacity * slot_bytes),
            keys: Vec::with_capacity(capacity),
            referenced: Vec::with_capacity(capacity),
            map: HashMap::with_capacity(capacity),
            hand: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    /// Rows the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes the cached rows take, with their overhead.
    pub fn bytes(&self) -> u64 {
        self.keys.len() as u64 * (self.slot_bytes as u64 + SLOT_OVERHEAD)
    }

    /// Counts a use of `key`; its cached bytes (the first `len`), if any.
    pub fn lookup(&mut self, key: u64, len: usize) -> Option<&[u8]> {
        match self.map.get(&key) {
            Some(&s) => {
                self.hits += 1;
                let s = s as usize;
                self.referenced[s] = true;
                Some(&self.data[s * self.slot_bytes..s * self.slot_bytes + len])
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Whether `key` is cached (no use counted).
    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    /// Caches `row` (at most `slot_bytes` long) as `key`, evicting the first unreferenced row
    /// the hand meets (clearing the reference bits it passes) once the cache is full.
    pub fn insert(&mut self, key: u64, row: &[u8]) {
        debug_assert!(row.len() <= self.slot_bytes);
        if self.capacity == 0 || self.map.contains_key(&key) {
            return;
        }
        let slot = if self.keys.len() < self.capacity {
            self.keys.push(key);
            self.referenced.push(false);
            self.data.resize(self.keys.len() * self.slot_bytes, 0);
            self.keys.len() - 1
        } else {
            while std::mem::take(&mut self.referenced[self.hand]) {
                self.hand = (self.hand + 1) % self.capacity;
            }
            let s = self.hand;
            self.hand = (self.hand + 1) % self.capacity;
            self.map.remove(&self.keys[s]);
            self.evictions += 1;
            self.keys[s] = key;
            s
        };
        self.map.insert(key, slot as u32);
        self.data[slot * self.slot_bytes..][..row.len()].copy_from_slice(row);
    }

    /// (hits, misses, evictions) since creation or the last `reset_counters`.
    pub fn counters(&self) -> (u64, u64, u64) {
        (self.hits, self.misses, self.evictions)
    }

    pub fn reset_counters(&mut self) {
        (self.hits, self.misses, self.evictions) = (0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_its_budget_buys_and_gives_a_second_chance_to_used_rows() {
        let per = 8 + SLOT_OVERHEAD;
        let mut c = RowCache::new(8, 3 * per + per / 2);
        assert_eq!(c.capacity(), 3);
        for k in 0..3u64 {
            assert!(c.lookup(k, 8).is_none());
            c.insert(k, &[k as u8; 8]);
        }
        assert_eq!(c.bytes(), 3 * per);
        // row 0 used again: the hand passes it and evicts row 1
        assert_eq!(c.lookup(0, 8), Some(&[0u8; 8][..]));
        c.insert(3, &[3; 8]);
        assert!(c.contains(0) && !c.contains(1) && c.contains(2) && c.contains(3));
        assert_eq!(c.lookup(3, 5), Some(&[3u8; 5][..]));
        assert_eq!(c.counters(), (2, 3, 1));
        assert_eq!(c.bytes(), 3 * per, "a full cache stays at its capacity");
        // a cache too small for one row keeps nothing
        let mut none = RowCache::new(8, per - 1);
        none.insert(1, &[1; 8]);
        assert!(!none.contains(1) && none.bytes() == 0);
    }
}
