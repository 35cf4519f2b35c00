//! Segregated size classes with bitmaps (the index of TLSF, "two-level segregated fit").
//!
//! Owns: the mapping from a block size (in allocation units) to a class, and per class one
//! list head plus the two levels of bitmaps that find the first non-empty class at or above a
//! given one in O(1) (two bit scans). The lists themselves are intrusive: their links live in
//! the pool's block slab, so this module only stores heads and bits.
//!
//! Classes: sizes below `SL` units each have their own class; above, every power-of-two range
//! `[2^f, 2^(f+1))` is split into `SL` equal classes, so a class spans at most 1/32 of its
//! sizes and every block in a class above the request's own class fits the request.

/// log2 of the number of second-level classes per power of two.
const SLI: u32 = 5;
/// Second-level classes per power of two.
pub(crate) const SL: usize = 1 << SLI;
/// First-level ranges: enough for any u64 unit count.
const FL: usize = 64 - SLI as usize + 1;
/// Number of classes.
pub(crate) const CLASSES: usize = FL * SL;
/// "No block" in the intrusive lists.
pub(crate) const NIL: u32 = u32::MAX;

/// The class of a block of `units` allocation units (`units` ≥ 1).
#[inline]
pub fn class_of(units: u64) -> usize {
    if units < SL as u64 {
        units as usize
    } else {
        let f = 63 - units.leading_zeros();
        let fl = (f - SLI + 1) as usize;
        let sl = ((units >> (f - SLI)) as usize) & (SL - 1);
        fl * SL + sl
    }
}

/// The smallest unit count of class `c` (the inverse of [`class_of`] at the class's start).
#[cfg(test)]
pub fn class_start(c: usize) -> u64 {
    let (fl, sl) = (c / SL, (c % SL) as u64);
    if fl == 0 {
        sl
    } else {
        (SL as u64 + sl) << (fl - 1)
    }
}

/// Heads kept per index: the classes rounded up to a power of two, so that a class number
/// masked by `HEADS - 1` is always in bounds (no bounds check on the hot path; the classes
/// above `CLASSES` stay empty).
const HEADS: usize = CLASSES.next_power_of_two();
/// First-level bitmaps kept: `FL` rounded up likewise (64, the bits of `fl_map`).
const FL_MAPS: usize = 64;

/// List heads and bitmaps of one free index.
#[derive(Clone, Debug)]
pub struct Classes {
    heads: Box<[u32; HEADS]>,
    /// Bit `fl` set: some class of first level `fl` is non-empty.
    fl_map: u64,
    /// Per first level, bit `sl` set: class `fl * SL + sl` is non-empty.
    sl_map: [u32; FL_MAPS],
}

impl Default for Classes {
    fn default() -> Self {
        Classes {
            heads: Box::new([NIL; HEADS]),
            fl_map: 0,
            sl_map: [0; FL_MAPS],
        }
    }
}

impl Classes {
    #[inline]
    pub fn head(&self, c: usize) -> u32 {
        debug_assert!(c < CLASSES);
        self.heads[c & (HEADS - 1)]
    }

    /// Sets the head of class `c` and keeps the bitmaps in step (`NIL` empties the class).
    #[inline]
    pub fn set_head(&mut self, c: usize, head: u32) {
        debug_assert!(c < CLASSES);
        self.heads[c & (HEADS - 1)] = head;
        let (fl, sl) = ((c / SL) & (FL_MAPS - 1), c % SL);
        if head == NIL {
            self.sl_map[fl] &= !(1 << sl);
            if self.sl_map[fl] == 0 {
                self.fl_map &= !(1 << fl);
            }
        } else {
            self.sl_map[fl] |= 1 << sl;
            self.fl_map |= 1 << fl;
        }
    }

    /// The first non-empty class at or above `c`.
    #[inline]
    pub fn first_at_or_above(&self, c: usize) -> Option<usize> {
        if c >= CLASSES {
            return None;
        }
        let (fl, sl) = ((c / SL) & (FL_MAPS - 1), c % SL);
        let here = self.sl_map[fl] & (u32::MAX << sl);
        if here != 0 {
            return Some(fl * SL + here.trailing_zeros() as usize);
        }
        let above = if fl + 1 >= 64 {
            0
        } else {
            self.fl_map & (u64::MAX << (fl + 1))
        };
        if above == 0 {
            return None;
        }
        let f = above.trailing_zeros() as usize & (FL_MAPS - 1);
        Some(f * SL + self.sl_map[f].trailing_zeros() as usize)
    }

    /// The last non-empty class at or below `c` (for walking from the largest blocks down).
    pub fn last_at_or_below(&self, c: usize) -> Option<usize> {
        let c = c.min(CLASSES - 1);
        let (fl, sl) = (c / SL, c % SL);
        let mask = if sl == SL - 1 {
            u32::MAX
        } else {
            (1u32 << (sl + 1)) - 1
        };
        let here = self.sl_map[fl] & mask;
        if here != 0 {
            return Some(fl * SL + 31 - here.leading_zeros() as usize);
        }
        let below = self.fl_map & ((1u64 << fl) - 1);
        if below == 0 {
            return None;
        }
        let f = 63 - below.leading_zeros() as usize;
        Some(f * SL + 31 - self.sl_map[f].leading_zeros() as usize)
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.fl_map == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotonic_and_tight() {
        let mut last = 0;
        for u in 1u64..100_000 {
            let c = class_of(u);
            assert!(c >= last, "class of {u} went down");
            assert!(class_start(c) <= u, "{u} below its class start");
            // The class spans at most 1/32 of its sizes.
            assert!(
                u - class_start(c) <= class_start(c) / 32 + 1,
                "{u} in a loose class"
            );
            last = c;
        }
        for f in 5..64 {
            let u = 1u64 << f;
            assert_eq!(class_start(class_of(u)), u);
            assert!(class_of(u | (u - 1)) < CLASSES);
        }
        assert_eq!(class_of(u64::MAX), CLASSES - 1);
    }

    #[test]
    fn bitmaps_find_the_nearest_nonempty_class() {
        let mut c = Classes::default();
        assert_eq!(c.first_at_or_above(0), None);
        assert_eq!(c.last_at_or_below(CLASSES), None);
        for k in [3, 40, 41, 700, CLASSES - 1] {
            c.set_head(k, 7);
        }
        assert_eq!(c.first_at_or_above(0), Some(3));
        assert_eq!(c.first_at_or_above(4), Some(40));
        assert_eq!(c.first_at_or_above(41), Some(41));
        assert_eq!(c.first_at_or_above(42), Some(700));
        assert_eq!(c.first_at_or_above(701), Some(CLASSES - 1));
        assert_eq!(c.last_at_or_below(CLASSES - 2), Some(700));
        assert_eq!(c.last_at_or_below(40), Some(40));
        assert_eq!(c.last_at_or_below(39), Some(3));
        assert_eq!(c.last_at_or_below(2), None);
        c.set_head(700, NIL);
        assert_eq!(c.first_at_or_above(42), Some(CLASSES - 1));
        c.set_head(40, NIL);
        c.set_head(41, NIL);
        assert_eq!(c.first_at_or_above(4), Some(CLASSES - 1));
        c.set_head(3, NIL);
        c.set_head(CLASSES - 1, NIL);
        assert!(c.is_empty());
    }
}
