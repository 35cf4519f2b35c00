//! The cold blocks of one stream (free blocks of its virtual range with unmapped pages, the
//! range's last block excepted) ordered by `(size, addr, block)`: a sorted vector searched by
//! binary search on `(size, addr)` alone, which no two of a stream's free blocks share. It
//! replaced a `BTreeSet` with the same order, so placement sees the same candidates in the same
//! order. The set holds few entries (holes left by recycling; on the
//! inference traces it is empty at most inserts) and changes on most cold placements there: a
//! binary search and a short `memmove` cost less than the B-tree's generic node handling (host
//! replay, session 11: the virtual-range pool's time per operation 0.74 of the B-tree's on
//! infer_batches and resnet_infer_sizes, 0.87 on vit_infer_batches, with `place_cold`'s shortcuts).

/// One cold block: its size, its address, its index in the block slab.
pub(super) type ColdKey = (u64, u64, u32);

/// `key`'s place in the order as one number: `(size, addr)` decides it, since no two free
/// blocks of a stream share an address (the block index only names the entry). One 128-bit
/// comparison costs a fraction of the tuple's three-field `Ord` (callgrind, bert_ckpt_train:
/// the binary searches were most of the set's cost, session 18).
#[inline(always)]
fn rank(key: &ColdKey) -> u128 {
    (key.0 as u128) << 64 | key.1 as u128
}

/// Where `key` is, or would go.
#[inline(always)]
fn search(keys: &[ColdKey], key: &ColdKey) -> Result<usize, usize> {
    let r = rank(key);
    keys.binary_search_by(|k| rank(k).cmp(&r))
}

/// Where `key` itself is (its block index included).
#[inline(always)]
fn find(keys: &[ColdKey], key: &ColdKey) -> Option<usize> {
    search(keys, key).ok().filter(|&at| keys[at].2 == key.2)
}

/// Entries after an insertion or removal point that are moved one by one; more go by `memmove`
/// (callgrind: with 8, llama_train's removals cost more than the call they saved).
const SHORT: usize = 2;

#[derive(Clone, Debug, Default)]
pub(super) struct ColdSet {
    keys: Vec<ColdKey>,
}

impl ColdSet {
    pub(super) fn new() -> ColdSet {
        ColdSet { keys: Vec::new() }
    }

    /// Adds `key`; false (and nothing changes) if it is there already.
    pub(super) fn insert(&mut self, key: ColdKey) -> bool {
        match search(&self.keys, &key) {
            Ok(_) => false,
            Err(at) if self.keys.len() - at > SHORT => {
                self.keys.insert(at, key);
                true
            }
            Err(at) => {
                // A short tail moves entry by entry: the library's `memmove` call cost more
                // than the few entries it moved (callgrind, session 14).
                self.keys.push(key);
                let mut j = self.keys.len() - 1;
                while j > at {
                    self.keys.swap(j, j - 1);
                    j -= 1;
                }
                true
            }
        }
    }

    /// Takes `key` out; false if it was not there.
    pub(super) fn remove(&mut self, key: &ColdKey) -> bool {
        match find(&self.keys, key) {
            Some(at) if self.keys.len() - at > SHORT => {
                self.keys.remove(at);
                true
            }
            Some(at) => {
                // As in `insert`.
                for j in at + 1..self.keys.len() {
                    self.keys[j - 1] = self.keys[j];
                }
                self.keys.pop();
                true
            }
            None => false,
        }
    }

    /// Puts `new` (not in the set) in the place of `old`; false (and nothing changes) if `old`
    /// is not there. Only the entries between the two places move, where a removal and an
    /// insertion would each move everything after their place (a cold block carved).
    pub(super) fn replace(&mut self, old: &ColdKey, new: ColdKey) -> bool {
        let Some(from) = find(&self.keys, old) else {
            return false;
        };
        debug_assert!(search(&self.keys, &new).is_err(), "{new:?} is in the set");
        let rn = rank(&new);
        if rn > rank(old) {
            // The entries above `old` and below `new` move down one place.
            let to = from + self.keys[from + 1..].partition_point(|k| rank(k) < rn);
            if to - from > SHORT {
                self.keys.copy_within(from + 1..=to, from);
            } else {
                for j in from..to {
                    self.keys[j] = self.keys[j + 1];
                }
            }
            self.keys[to] = new;
        } else {
            // The entries at or above `new` and below `old` move up one place.
            let to = self.keys[..from].partition_point(|k| rank(k) < rn);
            if from - to > SHORT {
                self.keys.copy_within(to..from, to + 1);
            } else {
                for j in (to..from).rev() {
                    self.keys[j + 1] = self.keys[j];
                }
            }
            self.keys[to] = new;
        }
        true
    }

    pub(super) fn contains(&self, key: &ColdKey) -> bool {
        find(&self.keys, key).is_some()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Every entry, in order.
    pub(super) fn iter(&self) -> std::slice::Iter<'_, ColdKey> {
        self.keys.iter()
    }

    /// The entries of size `size` or more, in order (as a `BTreeSet`'s `range((size, 0, 0)..)`).
    pub(super) fn at_least(&self, size: u64) -> std::slice::Iter<'_, ColdKey> {
        let at = self.keys.partition_point(|&(s, _, _)| s < size);
        self.keys[at..].iter()
    }
}

impl<'a> IntoIterator for &'a ColdSet {
    type Item = &'a ColdKey;
    type IntoIter = std::slice::Iter<'a, ColdKey>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// A random sequence of inserts and removes (repeats and misses included) gives the same
    /// answers and the same ordered contents as the `BTreeSet` it replaced, at every step.
    #[test]
    fn cold_set_matches_btreeset() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut set, mut model) = (ColdSet::new(), BTreeSet::new());
        for step in 0..20_000 {
            // Few distinct keys, so inserts of present keys and removes of present ones happen;
            // one block index per address and size, as in the pool (no two free blocks of a
            // stream share an address).
            let key_at =
                |size: u64, addr: u64| (size, addr, (size / 4096 * 8 + addr / 65536) as u32);
            let key = key_at(next() % 16 * 4096, next() % 8 * 65536);
            let op = next() % 4;
            if op == 0 {
                assert_eq!(set.remove(&key), model.remove(&key), "step {step}");
            } else if op == 1 {
                // Replace an entry (most often a present one) by a key not present.
                let old = match next() % 4 {
                    0 => key,
                    _ => {
                        let n = model.len().max(1);
                        model
                            .iter()
                            .nth(next() as usize % n)
                            .copied()
                            .unwrap_or(key)
                    }
                };
                let new = key_at(next() % 16 * 4096, next() % 8 * 65536);
                if model.contains(&new) {
                    continue;
                }
                let had = model.remove(&old);
                if had {
                    model.insert(new);
                }
                assert_eq!(set.replace(&old, new), had, "step {step}: replace");
            } else {
                assert_eq!(set.insert(key), model.insert(key), "step {step}");
            }
            let probe = next() % 20 * 4096;
            assert!(
                set.at_least(probe)
                    .copied()
                    .eq(model.range((probe, 0, 0)..).copied()),
                "step {step}: at_least({probe})"
            );
            assert_eq!(set.contains(&key), model.contains(&key));
            assert_eq!(set.len(), model.len());
            assert_eq!(set.is_empty(), model.is_empty());
        }
        assert!(set.iter().copied().eq(model.iter().copied()));
    }

    #[test]
    fn cold_set_at_least_bounds() {
        let mut set = ColdSet::new();
        assert_eq!(set.at_least(0).count(), 0);
        for k in [(8, 0, 1), (4, 64, 2), (8, 32, 3), (16, 0, 4)] {
            assert!(set.insert(k));
        }
        assert!(!set.insert((8, 0, 1)));
        let sizes: Vec<u64> = set.at_least(5).map(|k| k.0).collect();
        assert_eq!(sizes, [8, 8, 16]);
        assert_eq!(set.at_least(8).next(), Some(&(8, 0, 1)));
        assert_eq!(set.at_least(17).count(), 0);
        assert_eq!(set.at_least(0).count(), 4);
        assert!(set.remove(&(8, 0, 1)));
        assert!(!set.remove(&(8, 0, 1)));
        assert_eq!(set.at_least(8).next(), Some(&(8, 32, 3)));
    }
}
