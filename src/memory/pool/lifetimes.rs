//! Lifetimes the pool has seen, by request size (`TailFirst::ShortLived`): a small
//! direct-mapped table, updated when a block is freed, of how many allocations the last blocks
//! of each size lived. A request whose size lived shorter than the blocks live now (Little's
//! law: in a steady program the mean lifetime, counted in allocations, is the number of live
//! blocks) is placed at the mapped start of the range's last block rather than in a warm hole
//! between long-lived blocks, where it would outlive its neighbours and split the hole they
//! leave (`tail_first.rs` has the placement).

/// Entries of the table (a power of two).
const ENTRIES: usize = 256;

/// One size's record: the rounded size it is for (0: empty) and its lifetimes' running mean.
#[derive(Clone, Copy, Default, Debug)]
struct Entry {
    size: u64,
    life: u64,
}

/// The table, allocated at the first note: a pool with the rule off (and its dry runs' clones)
/// holds none.
#[derive(Clone, Default)]
pub(super) struct Lifetimes {
    table: Option<Box<[Entry; ENTRIES]>>,
}

impl std::fmt::Debug for Lifetimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sizes = self
            .table
            .as_ref()
            .map_or(0, |t| t.iter().filter(|e| e.size != 0).count());
        write!(f, "Lifetimes {{ sizes: {sizes} }}")
    }
}

#[inline(always)]
fn slot(size: u64) -> usize {
    ((size >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize & (ENTRIES - 1)
}

impl Lifetimes {
    /// A block of `size` bytes lived `life` allocations.
    #[inline]
    pub(super) fn note(&mut self, size: u64, life: u64) {
        let table = self
            .table
            .get_or_insert_with(|| Box::new([Entry::default(); ENTRIES]));
        let e = &mut table[slot(size)];
        if e.size == size {
            e.life = (e.life + life) / 2;
        } else {
            *e = Entry { size, life };
        }
    }

    /// The lifetime expected of a block of `size` bytes, in allocations (`None`: none seen).
    pub(super) fn expected(&self, size: u64) -> Option<u64> {
        let e = &self.table.as_ref()?[slot(size)];
        (e.size == size).then_some(e.life)
    }
}
