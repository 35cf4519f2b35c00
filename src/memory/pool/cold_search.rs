//! The best position found so far by one cold placement (`Pool::place_cold`): the key it is
//! chosen by — unmapped pages the request would touch there, then the block's size, then the
//! address — and the block. Its steps are forced inline: as closures they were calls, one per
//! end of every candidate, costing about as much as the page counting they wrap (callgrind,
//! infer_batches: session 12).

use super::block::Block;
use super::pages::PageMap;

/// A position's key (unmapped pages touched, block size, address) and its block.
pub(super) type ColdKey = ((u64, u64, u64), u32);

pub(super) struct ColdSearch<'a> {
    pages: &'a PageMap,
    /// The range's base address and `log2(page)`.
    base: u64,
    shift: u32,
    /// The request, rounded.
    size: u64,
    best: Option<ColdKey>,
}

impl<'a> ColdSearch<'a> {
    #[inline(always)]
    pub(super) fn new(pages: &'a PageMap, base: u64, page: u64, size: u64) -> ColdSearch<'a> {
        ColdSearch {
            pages,
            base,
            shift: page.trailing_zeros(),
            size,
            best: None,
        }
    }

    /// Offers the request at `pos` in block `i` of `bsize` bytes: kept if its key is smaller.
    #[inline(always)]
    pub(super) fn offer(&mut self, i: u32, pos: u64, bsize: u64) {
        // Against a best needing no new page only a smaller (size, pos) can win: no count.
        if self
            .best
            .is_some_and(|((u, s, p), _)| u == 0 && (bsize, pos) > (s, p))
        {
            return;
        }
        let key = (self.unmapped_at(pos), bsize, pos);
        if self.best.is_none_or(|(k, _)| key < k) {
            self.best = Some((key, i));
        }
    }

    /// `offer` of a position whose pages are all mapped (known to the caller: it lies inside a
    /// run of mapped pages), without counting them.
    #[inline(always)]
    pub(super) fn offer_mapped(&mut self, i: u32, pos: u64, bsize: u64) {
        debug_assert_eq!(self.unmapped_at(pos), 0, "{pos:#x} touches unmapped pages");
        let key = (0, bsize, pos);
        if self.best.is_none_or(|(k, _)| key < k) {
            self.best = Some((key, i));
        }
    }

    /// Unmapped pages the request touches at `pos`.
    #[inline(always)]
    fn unmapped_at(&self, pos: u64) -> u64 {
        // The pages `[p0, p1)` the request touches there (`Pool::touched`).
        let page_mask = (1u64 << self.shift) - 1;
        let p0 = (pos - self.base) >> self.shift;
        let p1 = (pos + self.size - self.base + page_mask) >> self.shift;
        self.pages.count_unmapped(p0, p1)
    }

    /// Offers both ends of block `i`.
    #[inline(always)]
    pub(super) fn offer_ends(&mut self, i: u32, b: &Block) {
        self.offer(i, b.addr, b.size);
        self.offer(i, b.addr + b.size - self.size, b.size);
    }

    /// Whether the best so far needs no new page.
    #[inline(always)]
    pub(super) fn needs_no_page(&self) -> bool {
        self.best.is_some_and(|((u, _, _), _)| u == 0)
    }

    /// Whether the best so far needs no new page in a block smaller than `bsize` bytes: then
    /// no position in a block of that size can win (an equal size loses on address only when
    /// the block lies above, so it is not counted here).
    #[inline(always)]
    pub(super) fn beats_block(&self, bsize: u64) -> bool {
        self.best.is_some_and(|((u, s, _), _)| u == 0 && s < bsize)
    }

    /// Whether the best so far needs new pages.
    #[inline(always)]
    pub(super) fn needs_pages(&self) -> bool {
        self.best.is_some_and(|((u, _, _), _)| u > 0)
    }

    /// The best key so far and its block.
    #[inline(always)]
    pub(super) fn best(&self) -> Option<ColdKey> {
        self.best
    }

    /// Continues a search begun earlier with the same request and pages: `best` is what it had.
    #[inline(always)]
    pub(super) fn resume(mut self, best: Option<ColdKey>) -> ColdSearch<'a> {
        self.best = best;
        self
    }

    /// The chosen block and position, and the unmapped pages the request touches there.
    pub(super) fn chosen(&self) -> Option<(u32, u64, u64)> {
        self.best.map(|((unmapped, _, pos), i)| (i, pos, unmapped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offers in any order end at the smallest key over every offer, each key counted from the
    /// page map the way `Pool::touched` and `PageMap::count_unmapped` count it (the early
    /// returns skip only offers that cannot win).
    #[test]
    fn cold_search_keeps_the_smallest_key_of_all_offers() {
        let page = 1u64 << 21;
        let base = 1u64 << 40;
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..200 {
            let mut pages = PageMap::new(256);
            let mut p = next() % 4;
            while p < 250 {
                let n = 1 + next() % 6;
                if next() % 2 == 0 {
                    pages.map_chunk(p, (p + n).min(256));
                }
                p += n + next() % 5;
            }
            let size = 256 * (1 + next() % (3 * page / 256));
            let mut search = ColdSearch::new(&pages, base, page, size);
            let mut naive: Option<((u64, u64, u64), u32)> = None;
            for i in 0..1 + next() % 12 {
                let bsize = size + 256 * (next() % (4 * page / 256));
                let pos = base + 256 * (next() % (200 * page / 256));
                search.offer(i as u32, pos, bsize);
                let p0 = (pos - base) / page;
                let p1 = (pos + size - base).div_ceil(page);
                let key = (pages.count_unmapped(p0, p1), bsize, pos);
                if naive.is_none_or(|(k, _)| key < k) {
                    naive = Some((key, i as u32));
                }
            }
            assert_eq!(search.best(), naive, "round {round}");
            let zero = naive.is_some_and(|((u, _, _), _)| u == 0);
            assert_eq!(search.needs_no_page(), zero);
            assert_eq!(search.needs_pages(), !zero);
            assert_eq!(
                search.chosen(),
                naive.map(|((unmapped, _, pos), i)| (i, pos, unmapped))
            );
        }
    }
}
