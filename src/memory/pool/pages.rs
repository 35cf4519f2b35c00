//! Which pages of a reserved virtual range have physical memory mapped (one bit per page), and
//! how they were mapped: pages are the device's granularity, and one physical allocation (a
//! "chunk") covers one or more consecutive pages; a second bitmap marks the first page of each
//! chunk. A chunk is unmapped whole (the driver unmaps what one call mapped), so it runs from its
//! start bit to the next start bit or the first unmapped page.
//!
//! Owns nothing on the device: it is the pool's record of what it asked the device to map.
//! Counting and run-finding work a 64-page word at a time, so a query over a range of `n`
//! pages costs O(n / 64).

/// Set bits of `w`; `popcnt`: the CPU has the POPCNT instruction (`has_popcnt`). The crate
/// builds for baseline x86-64, where `count_ones` is a bit trick of about 15 instructions.
#[inline(always)]
fn ones(w: u64, popcnt: bool) -> u64 {
    #[cfg(all(target_arch = "x86_64", not(target_feature = "popcnt")))]
    if popcnt {
        let n: u64;
        // SAFETY: the CPU has POPCNT (`has_popcnt`); it reads one register and writes another.
        unsafe {
            std::arch::asm!("popcnt {n}, {w}", w = in(reg) w, n = lateout(reg) n,
                options(pure, nomem, nostack));
        }
        return n;
    }
    let _ = popcnt;
    w.count_ones() as u64
}

/// Whether `ones` may use POPCNT (every x86-64 CPU since 2008 has it). Asked once per page map:
/// the standard library's check costs more than the instruction saves when asked per count.
fn has_popcnt() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("popcnt");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[derive(Clone, Debug, Default)]
pub struct PageMap {
    bits: Vec<u64>,
    /// Bit `p` set: a chunk starts at page `p` (only ever set on mapped pages).
    starts: Vec<u64>,
    /// Bit `p` set: page `p` was mapped by a slack-rule move (its memory came from a page
    /// recycled elsewhere); such pages are not moved again by that rule (`recycle.rs`).
    moved: Vec<u64>,
    pages: u64,
    mapped: u64,
    popcnt: bool,
    /// No page at or above this one has ever been mapped (bounds scans of a range that is
    /// mostly unreserved tail).
    ceiling: u64,
}

impl PageMap {
    pub fn new(pages: u64) -> PageMap {
        PageMap {
            bits: vec![0; pages.div_ceil(64) as usize],
            starts: vec![0; pages.div_ceil(64) as usize],
            moved: vec![0; pages.div_ceil(64) as usize],
            pages,
            mapped: 0,
            popcnt: has_popcnt(),
            ceiling: 0,
        }
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Pages mapped in the whole range.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    #[cfg(test)]
    pub fn is_mapped(&self, p: u64) -> bool {
        self.bits[(p / 64) as usize] >> (p % 64) & 1 == 1
    }

    /// `(word index, mask)` for the words covering pages `[p0, p1)`.
    fn word_masks(p0: u64, p1: u64) -> impl Iterator<Item = (usize, u64)> {
        let first = p0 / 64;
        let last = if p1 > p0 { p1.div_ceil(64) } else { first };
        (first..last).map(move |w| {
            let lo = p0.max(w * 64) - w * 64;
            let hi = (p1 - w * 64).min(64);
            let mask = if hi - lo == 64 {
                u64::MAX
            } else {
                ((1u64 << (hi - lo)) - 1) << lo
            };
            (w as usize, mask)
        })
    }

    /// Mapped pages among `[p0, p1)`. A plain loop with the one-word case first: blocks rarely
    /// span more than 64 pages, and placement asks this on most allocations at the top of a
    /// range (an iterator form costs far more instructions there: BENCHMARKS.md §3, session 6).
    #[inline]
    pub fn count_mapped(&self, p0: u64, p1: u64) -> u64 {
        if p1 <= p0 {
            return 0;
        }
        let (w0, w1) = ((p0 / 64) as usize, ((p1 - 1) / 64) as usize);
        // Bits [lo, 64) of the first word and [0, hi] of the last.
        let low = u64::MAX << (p0 % 64);
        let high = u64::MAX >> (63 - (p1 - 1) % 64);
        if w0 == w1 {
            // All or none mapped (most placements) without counting bits: `count_ones` is a
            // software loop on baseline x86-64 (callgrind, infer_batches: session 12).
            let m = low & high;
            let w = self.bits[w0] & m;
            if w == m {
                return p1 - p0;
            }
            if w == 0 {
                return 0;
            }
            return ones(w, self.popcnt);
        }
        let mut n =
            ones(self.bits[w0] & low, self.popcnt) + ones(self.bits[w1] & high, self.popcnt);
        for &w in &self.bits[w0 + 1..w1] {
            n += ones(w, self.popcnt);
        }
        n
    }

    /// Whether every page among `[p0, p1)` is mapped (no bit counting: the check placement
    /// makes on most allocations at the top of a range).
    #[inline]
    pub fn all_mapped(&self, p0: u64, p1: u64) -> bool {
        if p1 <= p0 {
            return true;
        }
        let (w0, w1) = ((p0 / 64) as usize, ((p1 - 1) / 64) as usize);
        let low = u64::MAX << (p0 % 64);
        let high = u64::MAX >> (63 - (p1 - 1) % 64);
        if w0 == w1 {
            let m = low & high;
            return self.bits[w0] & m == m;
        }
        self.bits[w0] & low == low
            && self.bits[w1] & high == high
            && self.bits[w0 + 1..w1].iter().all(|&w| w == u64::MAX)
    }

    /// Unmapped pages among `[p0, p1)`.
    pub fn count_unmapped(&self, p0: u64, p1: u64) -> u64 {
        p1.saturating_sub(p0) - self.count_mapped(p0, p1)
    }

    /// Records `[p0, p1)` (unmapped pages) as mapped by one chunk; returns the pages.
    pub fn map_chunk(&mut self, p0: u64, p1: u64) -> u64 {
        debug_assert_eq!(
            self.count_mapped(p0, p1),
            0,
            "chunk [{p0}, {p1}) over mapped pages"
        );
        if p1 > p0 {
            self.starts[(p0 / 64) as usize] |= 1 << (p0 % 64);
        }
        self.set(p0, p1, true)
    }

    /// Records the whole chunks `[p0, p1)` as unmapped; returns the pages that were mapped.
    pub fn unmap_chunks(&mut self, p0: u64, p1: u64) -> u64 {
        debug_assert!(
            self.is_chunk_edge(p0) && self.is_chunk_edge(p1),
            "[{p0}, {p1}) cuts a chunk"
        );
        for (w, mask) in Self::word_masks(p0, p1) {
            self.starts[w] &= !mask;
            self.moved[w] &= !mask;
        }
        self.set(p0, p1, false)
    }

    /// Marks the mapped pages `[p0, p1)` as placed by a slack-rule move.
    pub fn mark_moved(&mut self, p0: u64, p1: u64) {
        for (w, mask) in Self::word_masks(p0, p1) {
            self.moved[w] |= mask & self.bits[w];
        }
    }

    /// Whether any page among `[p0, p1)` was placed by a slack-rule move.
    pub fn any_moved(&self, p0: u64, p1: u64) -> bool {
        Self::word_masks(p0, p1).any(|(w, mask)| self.moved[w] & mask != 0)
    }

    /// Whether no chunk spans the edge between pages `p - 1` and `p`.
    pub fn is_chunk_edge(&self, p: u64) -> bool {
        p == 0 || p >= self.pages || !self.bit(&self.bits, p) || self.bit(&self.starts, p)
    }

    /// Whether a chunk starts at page `p`.
    pub fn is_chunk_start(&self, p: u64) -> bool {
        p < self.pages && self.bit(&self.starts, p)
    }

    fn bit(&self, v: &[u64], p: u64) -> bool {
        v[(p / 64) as usize] >> (p % 64) & 1 == 1
    }

    /// The first chunk start in `[p0, p1)`.
    fn next_start(&self, p0: u64, p1: u64) -> Option<u64> {
        let mut p = p0;
        while p < p1 {
            let word = self.starts[(p / 64) as usize] >> (p % 64);
            if word != 0 {
                let at = p + word.trailing_zeros() as u64;
                return (at < p1).then_some(at);
            }
            p = (p / 64 + 1) * 64;
        }
        None
    }

    /// The last chunk start in `[p0, p1)`.
    fn prev_start(&self, p0: u64, p1: u64) -> Option<u64> {
        let mut end = p1;
        while end > p0 {
            let w = (end - 1) / 64;
            // Bits [0, (end - 1) % 64] of word w.
            let word = self.starts[w as usize] & (u64::MAX >> (63 - (end - 1) % 64));
            if word != 0 {
                let at = w * 64 + 63 - word.leading_zeros() as u64;
                return (at >= p0).then_some(at);
            }
            end = w * 64;
        }
        None
    }

    /// The chunks `(start, pages)` lying wholly inside `[p0, p1)` (all of whose pages are
    /// mapped), from the highest down, until `f` returns false.
    pub fn each_chunk_down(&self, p0: u64, p1: u64, mut f: impl FnMut((u64, u64)) -> bool) {
        let mut runs = Vec::new();
        self.each_run(p0, p1, true, |run| {
            runs.push(run);
            true
        });
        for (p, n) in runs.into_iter().rev() {
            let Some(lo) = self.next_start(p, p + n) else {
                continue;
            };
            let mut hi = p + n;
            if !self.is_chunk_edge(hi) {
                // The chunk over the run's end reaches past `p1`.
                match self.prev_start(lo + 1, hi) {
                    Some(s) => hi = s,
                    None => continue,
                }
            }
            while hi > lo {
                let s = self.prev_start(lo, hi).expect("a chunk starts at lo");
                if !f((s, hi - s)) {
                    return;
                }
                hi = s;
            }
        }
    }

    /// Marks `[p0, p1)` mapped (`true`) or unmapped; returns how many pages changed.
    fn set(&mut self, p0: u64, p1: u64, mapped: bool) -> u64 {
        let mut changed = 0;
        for (w, mask) in Self::word_masks(p0, p1) {
            let word = &mut self.bits[w];
            if mapped {
                changed += (!*word & mask).count_ones() as u64;
                *word |= mask;
            } else {
                changed += (*word & mask).count_ones() as u64;
                *word &= !mask;
            }
        }
        if mapped {
            self.mapped += changed;
            self.ceiling = self.ceiling.max(p1);
        } else {
            self.mapped -= changed;
        }
        changed
    }

    /// The maximal runs `(start, len)` of pages in `[p0, p1)` whose state is `mapped`, in
    /// address order.
    pub fn runs(&self, p0: u64, p1: u64, mapped: bool) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        self.each_run(p0, p1, mapped, |run| {
            out.push(run);
            true
        });
        out
    }

    /// Calls `f` with each maximal run of `runs(p0, p1, mapped)` in address order, without
    /// allocating, until `f` returns false.
    pub fn each_run(&self, p0: u64, p1: u64, mapped: bool, mut f: impl FnMut((u64, u64)) -> bool) {
        let mut pending: Option<(u64, u64)> = None;
        let mut p = p0;
        // Past the ceiling every page is unmapped.
        let p1 = if mapped { p1.min(self.ceiling) } else { p1 };
        while p < p1 {
            let w = (p / 64) as usize;
            let word = if mapped { self.bits[w] } else { !self.bits[w] } >> (p % 64);
            if word == 0 {
                p = (p / 64 + 1) * 64;
                continue;
            }
            let skip = word.trailing_zeros() as u64;
            let start = p + skip;
            if start >= p1 {
                break;
            }
            let len = ((word >> skip).trailing_ones() as u64).min(p1 - start);
            match pending.as_mut() {
                Some((s, l)) if *s + *l == start => *l += len,
                _ => {
                    if let Some(run) = pending.take() {
                        if !f(run) {
                            return;
                        }
                    }
                    pending = Some((start, len));
                }
            }
            p = start + len;
        }
        if let Some(run) = pending {
            f(run);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_runs(m: &PageMap, p0: u64, p1: u64, want: bool) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for p in p0..p1 {
            if m.is_mapped(p) == want {
                match out.last_mut() {
                    Some((s, l)) if *s + *l == p => *l += 1,
                    _ => out.push((p, 1)),
                }
            }
        }
        out
    }

    #[test]
    fn ones_counts_bits_with_and_without_popcnt() {
        let mut w = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..1000 {
            w ^= w << 13;
            w ^= w >> 7;
            w ^= w << 17;
            for x in [w, w & (w >> 3), 0, u64::MAX] {
                assert_eq!(ones(x, false), x.count_ones() as u64);
                if has_popcnt() {
                    assert_eq!(ones(x, true), x.count_ones() as u64, "{x:#x}");
                }
            }
        }
    }

    #[test]
    fn set_count_and_runs_agree_with_a_naive_scan() {
        let mut m = PageMap::new(300);
        assert_eq!(m.set(3, 70, true), 67);
        assert_eq!(m.set(70, 130, true), 60);
        assert_eq!(m.set(100, 101, false), 1);
        assert_eq!(m.set(250, 300, true), 50);
        assert_eq!(m.mapped(), 176);
        for (p0, p1) in [(0, 300), (3, 4), (64, 128), (99, 102), (129, 251), (5, 5)] {
            let naive = (p0..p1).filter(|&p| m.is_mapped(p)).count() as u64;
            assert_eq!(m.count_mapped(p0, p1), naive, "[{p0}, {p1})");
            assert_eq!(m.count_unmapped(p0, p1), p1 - p0 - naive);
            for want in [true, false] {
                assert_eq!(
                    m.runs(p0, p1, want),
                    naive_runs(&m, p0, p1, want),
                    "[{p0},{p1}) {want}"
                );
            }
        }
        // Every range over word edges (the count has a one-word path and a many-word one).
        for p0 in 0..200 {
            for p1 in p0..200 {
                let naive = (p0..p1).filter(|&p| m.is_mapped(p)).count() as u64;
                assert_eq!(m.count_mapped(p0, p1), naive, "[{p0}, {p1})");
                assert_eq!(m.all_mapped(p0, p1), naive == p1 - p0, "[{p0}, {p1})");
            }
        }
        assert_eq!(m.count_mapped(7, 3), 0);
        assert_eq!(m.runs(0, 300, true), vec![(3, 97), (101, 29), (250, 50)]);
        assert_eq!(m.set(0, 300, false), 176);
        assert_eq!(m.mapped(), 0);
    }

    fn chunks_down(m: &PageMap, p0: u64, p1: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        m.each_chunk_down(p0, p1, |c| {
            out.push(c);
            true
        });
        out
    }

    #[test]
    fn only_whole_chunks_are_offered_for_unmapping() {
        let mut m = PageMap::new(200);
        // Chunks [2, 6) [6, 7) [7, 70) [70, 72), a gap, [100, 164) [164, 165).
        for (a, b) in [(2, 6), (6, 7), (7, 70), (70, 72), (100, 164), (164, 165)] {
            assert_eq!(m.map_chunk(a, b), b - a);
        }
        assert_eq!(
            chunks_down(&m, 0, 200),
            vec![(164, 1), (100, 64), (70, 2), (7, 63), (6, 1), (2, 4)]
        );
        // Cut at both ends: [3, 71) holds only [6, 7) and [7, 70) whole.
        assert_eq!(chunks_down(&m, 3, 71), vec![(7, 63), (6, 1)]);
        // Inside one chunk: nothing.
        assert_eq!(chunks_down(&m, 101, 163), vec![]);
        assert_eq!(chunks_down(&m, 100, 165), vec![(164, 1), (100, 64)]);
        assert!(m.is_chunk_edge(7) && !m.is_chunk_edge(8) && m.is_chunk_edge(72));
        assert_eq!(m.unmap_chunks(6, 70), 64);
        assert_eq!(
            chunks_down(&m, 0, 200),
            vec![(164, 1), (100, 64), (70, 2), (2, 4)]
        );
        // A chunk mapped again where one was: its own start, not the old ones.
        assert_eq!(m.map_chunk(6, 40), 34);
        assert_eq!(chunks_down(&m, 0, 72), vec![(70, 2), (6, 34), (2, 4)]);
        assert_eq!(m.mapped(), 4 + 34 + 2 + 65);
        // Moved marks stay on mapped pages only, and go with the chunk unmapped.
        m.mark_moved(30, 45);
        assert!(m.any_moved(39, 40) && !m.any_moved(40, 45) && !m.any_moved(0, 30));
        m.unmap_chunks(6, 40);
        assert!(!m.any_moved(0, 200));
        m.map_chunk(6, 40);
        assert!(!m.any_moved(0, 200));
    }
}
