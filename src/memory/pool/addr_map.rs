//! The pool's map from a live block's address to its slab index: an open-addressing table with
//! linear probing and backward-shift deletion (no tombstones), keys and values side by side.
//!
//! An insert and a remove come with every alloc/free pair, so it is built for that: one
//! multiplication to hash (addresses are 256-byte aligned, so the high bits of the product are
//! used), at most a quarter full (short probes, and few entries to shift on removal; the
//! measured difference from half full is in BENCHMARKS.md §3, session 6), and a lookup that
//! usually reads one cache line. The key `u64::MAX` is reserved for empty slots (no
//! block starts there).

const EMPTY: u64 = u64::MAX;
const MIN_CAPACITY: usize = 256;

#[derive(Clone, Debug)]
pub struct AddrMap {
    slots: Vec<(u64, u32)>,
    len: usize,
    /// 64 − log2(capacity): the hash is the top bits of the product.
    shift: u32,
}

impl Default for AddrMap {
    fn default() -> Self {
        AddrMap::with_capacity(MIN_CAPACITY)
    }
}

impl AddrMap {
    fn with_capacity(capacity: usize) -> AddrMap {
        let capacity = capacity.next_power_of_two().max(MIN_CAPACITY);
        AddrMap {
            slots: vec![(EMPTY, 0); capacity],
            len: 0,
            shift: 64 - capacity.trailing_zeros(),
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Slot `i` (taken modulo the capacity, a power of two): one `and` instead of a bounds
    /// check, which was most of a probe's instructions (callgrind, session 14).
    #[inline(always)]
    fn at(&self, i: usize) -> &(u64, u32) {
        debug_assert!(i < self.slots.len());
        // SAFETY: `slots.len()` is a power of two, so `i & mask` is below it.
        unsafe { self.slots.get_unchecked(i & self.mask()) }
    }

    #[inline(always)]
    fn at_mut(&mut self, i: usize) -> &mut (u64, u32) {
        debug_assert!(i < self.slots.len());
        let mask = self.mask();
        // SAFETY: as in `at`.
        unsafe { self.slots.get_unchecked_mut(i & mask) }
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The slot holding `key`, if present (for `value_at` / `remove_at`).
    #[inline]
    pub fn find(&self, key: u64) -> Option<usize> {
        debug_assert_ne!(key, EMPTY);
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.at(i).0;
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    pub fn value_at(&self, slot: usize) -> u32 {
        self.at(slot).1
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        self.find(key).map(|i| self.at(i).1)
    }

    /// Inserts or replaces. Forced inline, as `remove`: one of each comes with every alloc/free
    /// pair, and as calls their frames cost about a third of their work (callgrind, session 14);
    /// growing, rare, stays out of line.
    #[inline(always)]
    pub fn insert(&mut self, key: u64, value: u32) {
        debug_assert_ne!(key, EMPTY, "u64::MAX is the empty key");
        if (self.len + 1) * 4 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.at(i).0;
            if k == key {
                self.at_mut(i).1 = value;
                return;
            }
            if k == EMPTY {
                *self.at_mut(i) = (key, value);
                self.len += 1;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline(always)]
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let i = self.find(key)?;
        let v = self.at(i).1;
        self.remove_at(i);
        Some(v)
    }

    /// Empties `slot` and shifts back the entries after it that probed past it, so every key
    /// stays reachable from its home slot without tombstones.
    #[inline]
    pub fn remove_at(&mut self, slot: usize) {
        let mask = self.mask();
        let mut hole = slot;
        let mut j = slot;
        loop {
            j = (j + 1) & mask;
            let k = self.at(j).0;
            if k == EMPTY {
                break;
            }
            let home = self.home(k);
            // Entry j may move into the hole when its home is not cyclically in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                *self.at_mut(hole) = *self.at(j);
                hole = j;
            }
        }
        *self.at_mut(hole) = (EMPTY, 0);
        self.len -= 1;
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        *self = AddrMap::with_capacity(old.len() * 2);
        for (k, v) in old {
            if k != EMPTY {
                self.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random inserts, replacements, lookups and removals (clustered, 256-byte-aligned keys, as
    /// the pool's addresses are) agree with a `HashMap` at every step, across growth.
    #[test]
    fn agrees_with_a_hash_map() {
        let mut ours = AddrMap::default();
        let mut theirs: HashMap<u64, u32> = HashMap::new();
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for step in 0..200_000u32 {
            let r = next();
            // A few thousand distinct addresses, so removals hit and tables fill and drain.
            let key = 0x7f00_0000_0000 + (r % 3000) * 256;
            match (r >> 32) % 4 {
                0 | 1 => {
                    ours.insert(key, step);
                    theirs.insert(key, step);
                }
                2 => assert_eq!(ours.remove(key), theirs.remove(&key)),
                _ => assert_eq!(ours.get(key), theirs.get(&key).copied()),
            }
            assert_eq!(ours.len(), theirs.len());
        }
        for (&k, &v) in &theirs {
            assert_eq!(ours.get(k), Some(v));
        }
        assert!(ours.slots.len() > MIN_CAPACITY, "the table grew");
    }

    /// Keys that all hash to neighbouring slots (a long probe run wrapping the table's end)
    /// stay findable as entries in the middle of the run are removed.
    #[test]
    fn removal_inside_a_wrapping_run_keeps_every_key_reachable() {
        let mut m = AddrMap::default();
        let cap = m.slots.len();
        // Keys whose home is one of the last slots: their run wraps to the start.
        let mut keys = Vec::new();
        let mut k = 256u64;
        while keys.len() < 40 {
            if m.home(k) >= cap - 4 {
                keys.push(k);
            }
            k += 256;
        }
        for (i, &k) in keys.iter().enumerate() {
            m.insert(k, i as u32);
        }
        for (i, &k) in keys.iter().enumerate().step_by(3) {
            assert_eq!(m.remove(k), Some(i as u32));
        }
        for (i, &k) in keys.iter().enumerate() {
            let want = (i % 3 != 0).then_some(i as u32);
            assert_eq!(m.get(k), want, "key {i}");
        }
    }
}
