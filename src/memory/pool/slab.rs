//! A slab: records in a `Vec`, named by their `u32` index, with a list of vacant indexes reused
//! before the `Vec` grows. The pool keeps its blocks and its segments in one each; a record's
//! index stays valid until it is removed, so records link to each other by index.

#[derive(Clone, Debug)]
pub(super) struct Slab<T> {
    items: Vec<T>,
    vacant: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            vacant: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `item` in a vacant record (or a new one) and returns its index.
    #[inline(always)]
    pub(super) fn insert(&mut self, item: T) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self[i] = item;
                i
            }
            None => {
                self.items.push(item);
                (self.items.len() - 1) as u32
            }
        }
    }

    /// Marks record `i` vacant; its contents stay until the index is reused (the caller marks
    /// them unused first).
    #[inline]
    pub(super) fn remove(&mut self, i: u32) {
        self.vacant.push(i);
    }

    /// Records in use or vacant.
    pub(super) fn len(&self) -> usize {
        self.items.len()
    }

    /// Vacant records.
    pub(super) fn vacant_len(&self) -> usize {
        self.vacant.len()
    }

    /// Every record, vacant ones included, in index order.
    pub(super) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }
}

// Lookups by index are not bounds-checked in release builds. Every index the pool holds comes
// from `insert` and stays below `items.len()` (records are never taken out of `items`, only
// marked vacant), and no code looks up `NIL` (each link is compared with it first); debug builds
// check both. A block operation makes 10–30 lookups, and their checks were a fifth of the
// pool's instructions on an alloc/free pair (callgrind, session 14).
impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    #[inline(always)]
    fn index(&self, i: u32) -> &T {
        debug_assert!(
            (i as usize) < self.items.len(),
            "slab index {i} out of range"
        );
        // SAFETY: `i` came from `insert` (above), so it is below `items.len()`.
        unsafe { self.items.get_unchecked(i as usize) }
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    #[inline(always)]
    fn index_mut(&mut self, i: u32) -> &mut T {
        debug_assert!(
            (i as usize) < self.items.len(),
            "slab index {i} out of range"
        );
        // SAFETY: as in `index`.
        unsafe { self.items.get_unchecked_mut(i as usize) }
    }
}
