//! Alias mappings (`PoolConfig::page_aliases`, `GKRT_POOL_ALIASES`): when recycling moves a
//! chunk (one physical allocation) to a new address, its old address stays mapped to the same
//! memory as a *shadow* (`VirtualMemory::map_alias`), so moving it back later — the period-two
//! back-and-forth of training steps (ARCHITECTURE.md, "The pool's fragmentation") — is
//! bookkeeping: no unmap, no map, no device wait.
//!
//! Invariants (`validate` checks them):
//! - a chunk is usable at exactly one address, its live one: its pages are mapped in that
//!   range's page map. A shadow's pages are unmapped there, so no block is ever placed on memory
//!   reached through a shadow — a placement over a shadow maps those pages first, which switches
//!   the shadow live (when its chunk is free, see below) or unmaps it;
//! - a chunk has at most one shadow, of its own size (two addresses at most: the VA a shadow
//!   takes is the pool's own reserved range, never more);
//! - nothing queued on the device uses a shadow: a chunk leaves an address only as recycling
//!   takes it, which needs its free block idle on the device (or the device waited for) exactly
//!   as unmapping it would, so a shadow can be unmapped at any time without a wait, and the
//!   next user of the memory at its new address is ordered after the last one at the old;
//! - reserved bytes count live pages only: a shadow is address space, not memory, and the device
//!   frees a chunk's memory once, with its last address (`release_cached` and `release_all`
//!   unmap every shadow first).
//!
//! A move during `map_pages` works on *donors*: chunks recycling took off their live address
//! (the page map says unmapped, the device still maps them). The donors whose shadow lies where
//! the new block needs pages are switched there; the others are mapped at the new place as
//! aliases (their old address becomes their shadow, replacing an older shadow); any left over are
//! unmapped, all before new memory is mapped, so the device never holds more than before.

use std::collections::{BTreeMap, HashMap};

use super::{Pool, PoolError};
use crate::device::{DeviceError, VirtualMemory};

#[derive(Clone, Debug, Default)]
pub(super) struct Aliases {
    /// Shadow address → (the live address of its chunk, pages).
    shadows: BTreeMap<u64, (u64, u64)>,
    /// Live chunk address → its shadow's address.
    shadow_of: HashMap<u64, u64>,
    /// Chunks recycling took off their live address during one `map_pages`, still mapped on
    /// the device: (address, pages). Empty outside `map_pages`.
    donors: Vec<(u64, u64)>,
    /// Chunks moved back to their shadow with no device call, cumulative.
    pub(super) switches: u64,
    /// Chunks mapped at a new address as an alias of their old one, cumulative.
    pub(super) alias_maps: u64,
    /// Shadows unmapped because their address was needed while their chunk was live
    /// elsewhere: moves undone at a cost, cumulative.
    pub(super) conflicts: u64,
    /// Unmap calls made here (chunks and shadows), cumulative: `map_pages` tells from it
    /// whether placing a block cost more than mapping new memory would have.
    pub(super) unmaps: u64,
}

/// What a slack-rule move may do with aliases: the live addresses of the chunks whose shadows
/// lie under the pages being placed (switching them costs nothing), and whether that is all it
/// may do (the time budget declined other moves).
#[derive(Debug, Default)]
pub(super) struct AliasMove {
    pub(super) targets: Vec<u64>,
    pub(super) switch_only: bool,
}

impl Pool {
    /// Whether moves keep aliases: configured, and the device can map an allocation twice.
    pub(super) fn aliasing(&self, vm: &dyn VirtualMemory) -> bool {
        self.config.page_aliases && vm.supports_aliases()
    }

    /// Whether pages a slack-rule move placed may move again beyond the lifetime share
    /// (`alias_moves_again`, with `alias_again_until_undone` only before a move was undone).
    pub(super) fn moves_again_allowed(&self) -> bool {
        let c = &self.config;
        c.alias_moves_again && (!c.alias_again_until_undone || self.moves.none_undone())
    }

    /// Shadows held now.
    #[cfg(test)]
    pub(super) fn shadow_count(&self) -> usize {
        self.aliases.shadows.len()
    }

    /// Chunks switched back to a shadow address, and chunks mapped as aliases, so far.
    pub fn alias_counts(&self) -> (u64, u64) {
        (self.aliases.switches, self.aliases.alias_maps)
    }

    /// Shadows unmapped because their address was needed while their chunk lived elsewhere.
    pub fn alias_conflicts(&self) -> u64 {
        self.aliases.conflicts
    }

    /// The live addresses of the chunks whose shadows lie wholly inside pages `[p0, p1)` of
    /// range `r`.
    pub(super) fn switch_targets(&self, r: u32, p0: u64, p1: u64) -> Vec<u64> {
        if self.aliases.shadows.is_empty() {
            return Vec::new();
        }
        let base = self.segs[r].base;
        let (lo, hi) = (base + p0 * self.page, base + p1 * self.page);
        self.aliases
            .shadows
            .range(lo..hi)
            .filter(|(&sa, &(_, k))| sa + k * self.page <= hi)
            .map(|(_, &(live, _))| live)
            .collect()
    }

    /// Recycling takes the chunk of `k` pages at `addr` off its address: kept mapped as a donor
    /// (`keep`, during a move with aliases), or unmapped with its shadow.
    pub(super) fn retire_chunk(
        &mut self,
        vm: &dyn VirtualMemory,
        addr: u64,
        k: u64,
        keep: bool,
    ) -> Result<(), DeviceError> {
        if keep {
            self.aliases.donors.push((addr, k));
            return Ok(());
        }
        self.drop_shadow_of(vm, addr)?;
        self.aliases.unmaps += 1;
        vm.unmap(addr, k * self.page, 1)
    }

    /// Unmaps the shadow of the chunk live at `live`, if it has one.
    fn drop_shadow_of(&mut self, vm: &dyn VirtualMemory, live: u64) -> Result<(), DeviceError> {
        match self.aliases.shadow_of.get(&live) {
            Some(&sa) => self.drop_shadow(vm, sa),
            None => Ok(()),
        }
    }

    /// Unmaps the shadow at `sa` (no wait: nothing queued uses a shadow). The history says
    /// nothing: it recorded the address's unmapping when the chunk left it.
    fn drop_shadow(&mut self, vm: &dyn VirtualMemory, sa: u64) -> Result<(), DeviceError> {
        let (live, k) = self.aliases.shadows[&sa];
        self.aliases.unmaps += 1;
        vm.unmap(sa, k * self.page, 1)?;
        self.aliases.shadows.remove(&sa);
        self.aliases.shadow_of.remove(&live);
        Ok(())
    }

    /// Unmaps every shadow (`release_cached`, `release_all`): afterwards each chunk is mapped
    /// at its live address alone.
    pub(super) fn drop_all_shadows(&mut self, vm: &dyn VirtualMemory) -> Result<(), DeviceError> {
        let all: Vec<u64> = self.aliases.shadows.keys().copied().collect();
        for sa in all {
            self.drop_shadow(vm, sa)?;
        }
        Ok(())
    }

    /// Unmaps the donors a move took but did not place (each with its shadow).
    pub(super) fn release_donors(&mut self, vm: &dyn VirtualMemory) -> Result<(), DeviceError> {
        let mut first = Ok(());
        for (d, k) in std::mem::take(&mut self.aliases.donors) {
            let r = self.retire_chunk(vm, d, k, false);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// `map_pages`' alias step over the pages `[p0, p1)` of range `r` about to be mapped: the
    /// shadows there whose chunk is a donor switch live, the other shadows overlapping them are
    /// unmapped, the remaining donors are mapped as aliases into what is still unmapped there,
    /// largest first, and any left over are unmapped. Returns the pages made live (the rest is
    /// for `map_runs`).
    pub(super) fn place_donors(
        &mut self,
        vm: &dyn VirtualMemory,
        r: u32,
        (p0, p1): (u64, u64),
    ) -> Result<u64, PoolError> {
        if self.aliases.shadows.is_empty() && self.aliases.donors.is_empty() {
            return Ok(0);
        }
        let result = self.place_donors_inner(vm, r, (p0, p1));
        // Whatever happened, no donor outlives the call.
        let released = self.release_donors(vm);
        let live = result?;
        released?;
        Ok(live)
    }

    fn place_donors_inner(
        &mut self,
        vm: &dyn VirtualMemory,
        r: u32,
        (p0, p1): (u64, u64),
    ) -> Result<u64, PoolError> {
        let page = self.page;
        let base = self.segs[r].base;
        let (lo, hi) = (base + p0 * page, base + p1 * page);
        let mut made = 0;
        // Shadows overlapping [lo, hi): a chunk is at most `vmm_page_bytes` (or one page).
        let reach = self.config.vmm_page_bytes.max(page);
        let over: Vec<(u64, u64, u64)> = self
            .aliases
            .shadows
            .range(lo.saturating_sub(reach)..hi)
            .filter(|(&sa, &(_, k))| sa + k * page > lo)
            .map(|(&sa, &(live, k))| (sa, live, k))
            .collect();
        for (sa, live, k) in over {
            let inside = sa >= lo && sa + k * page <= hi;
            let donor = self.aliases.donors.iter().position(|&(d, _)| d == live);
            match donor {
                Some(at) if inside => {
                    // The chunk goes back to its shadow; its last address becomes the shadow.
                    self.aliases.donors.swap_remove(at);
                    let a = &mut self.aliases;
                    a.shadows.remove(&sa);
                    a.shadow_of.remove(&live);
                    a.shadows.insert(live, (sa, k));
                    a.shadow_of.insert(sa, live);
                    a.switches += 1;
                    self.note_chunk_live(r, sa, k);
                    made += k;
                }
                // Pages that will be mapped here: the shadow goes.
                _ => {
                    self.drop_shadow(vm, sa).map_err(PoolError::Device)?;
                    self.aliases.conflicts += 1;
                }
            }
        }
        if self.aliases.donors.is_empty() {
            return Ok(made);
        }
        let mut runs = self.pages_of(r).runs(p0, p1, false);
        let mut donors = std::mem::take(&mut self.aliases.donors);
        donors.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut left = Vec::new();
        for (d, k) in donors {
            let Some(run) = runs.iter_mut().find(|run| run.1 >= k) else {
                left.push((d, k));
                continue;
            };
            let at = base + run.0 * page;
            // One shadow per chunk: an older one goes (on failure `d` stays a donor, unmapped
            // with the rest); the address just left becomes the shadow.
            if let Err(e) = self.drop_shadow_of(vm, d) {
                left.push((d, k));
                self.aliases.donors = left;
                return Err(PoolError::Device(e));
            }
            if let Err(e) = vm.map_alias(at, d, k * page) {
                log::debug!("gkrt pool: alias of {d:#x} at {at:#x} failed ({e}); unmapping it");
                left.push((d, k));
                continue;
            }
            *run = (run.0 + k, run.1 - k);
            self.aliases.shadows.insert(d, (at, k));
            self.aliases.shadow_of.insert(at, d);
            self.aliases.alias_maps += 1;
            self.note_chunk_live(r, at, k);
            made += k;
        }
        self.aliases.donors = left;
        Ok(made)
    }

    /// The chunk of `k` pages at `addr` in range `r` is usable there now (switched or aliased):
    /// the page map and the statistics, as `map_runs` keeps them for new memory.
    fn note_chunk_live(&mut self, r: u32, addr: u64, k: u64) {
        let p = (addr - self.segs[r].base) / self.page;
        self.segs[r]
            .pages
            .as_mut()
            .expect("range")
            .map_chunk(p, p + k);
        self.count_mapped(r, addr, k);
    }

    /// Checks the aliases against the page maps (for `validate`).
    pub(super) fn check_aliases(&self) -> Result<(), String> {
        let a = &self.aliases;
        if !a.donors.is_empty() {
            return Err(format!("{} donors outside a move", a.donors.len()));
        }
        if a.shadows.len() != a.shadow_of.len() {
            return Err("shadow maps disagree".into());
        }
        for (&sa, &(live, k)) in &a.shadows {
            if a.shadow_of.get(&live) != Some(&sa) {
                return Err(format!(
                    "shadow {sa:#x} not recorded for its chunk {live:#x}"
                ));
            }
            let (rs, ps) = self.page_in_range(sa).ok_or("shadow outside every range")?;
            if self.pages_of(rs).count_mapped(ps, ps + k) != 0 {
                return Err(format!("shadow {sa:#x} lies over usable pages"));
            }
            let (rl, pl) = self
                .page_in_range(live)
                .ok_or("live chunk outside every range")?;
            let pages = self.pages_of(rl);
            if !pages.is_chunk_start(pl)
                || !pages.all_mapped(pl, pl + k)
                || !pages.is_chunk_edge(pl + k)
            {
                return Err(format!(
                    "shadow {sa:#x}: no chunk of {k} pages live at {live:#x}"
                ));
            }
        }
        Ok(())
    }

    /// The range holding `addr`, and the page of it there.
    fn page_in_range(&self, addr: u64) -> Option<(u32, u64)> {
        self.streams
            .iter()
            .map(|s| s.range)
            .filter(|&r| r != super::tlsf::NIL)
            .find(|&r| {
                let s = &self.segs[r];
                addr >= s.base && addr < s.base + s.size
            })
            .map(|r| (r, (addr - self.segs[r].base) / self.page))
    }
}
