//! How much memory one physical allocation ("chunk") of a virtual range covers: pages mapped
//! together in one driver call are unmapped together, so the chunk size trades driver calls
//! against the memory a hole can give back (`PoolConfig::vmm_page_bytes`).

use super::Pool;

/// A physical allocation is at least a 64th of the mapped memory it makes (`chunk_pages`)...
const CHUNKS_PER_HEAP: u64 = 64;
/// ...and at least a 16th of the request that maps it.
const CHUNKS_PER_RUN: u64 = 16;

impl Pool {
    /// Pages per physical allocation when `run` more pages are to be mapped: a 64th of what
    /// will then be mapped (`CHUNKS_PER_HEAP`), or a 16th of the run when that is more
    /// (`CHUNKS_PER_RUN`), as a power of two, between one page (the device's granularity) and
    /// `vmm_page_bytes` — and, under a memory limit, at most a 32nd of it. So a small heap pays
    /// one granule of rounding at the top of its used memory instead of a large page, a large
    /// one grows by few driver calls (their number is logarithmic in the heap up to the
    /// largest chunk size), and a chunk, which is unmapped whole, is never more than a small
    /// part of the memory recycling may want back.
    /// Why a 64th: a chunk under both a hole and a live block stays mapped, so each hole keeps
    /// up to a chunk at either end. At a 32nd, gan_train's 8 MiB activations, on 4 MiB chunks,
    /// left 15 MiB at its peak in holes no move could take (1.0713 of its peak live; at a 64th
    /// 1.0327, and 12 more traces lower; one higher, only with its opening blocks kept:
    /// BENCHMARKS.md, session 40).
    /// Why the run's 16th: moving a request's pages costs a driver call per chunk, so a large
    /// request keeps chunks of a 16th of it: at a 64th alone, diffusion_unet_infer's 216 MiB
    /// requests, moved in twice as many chunks, had moves declined (1.0965 → 1.2505).
    pub(super) fn chunk_pages(&self, run: u64) -> u64 {
        let will = (self.mapped_pages + run) * self.page;
        let mut cap = self.config.vmm_page_bytes;
        if self.config.memory_limit != u64::MAX {
            cap = cap.min(self.config.memory_limit / 32);
        }
        let share = (will / CHUNKS_PER_HEAP).max(run * self.page / CHUNKS_PER_RUN);
        let bytes = share.min(cap);
        let pow2 = if bytes == 0 {
            0
        } else {
            1u64 << (63 - bytes.leading_zeros())
        };
        (pow2 / self.page).max(1)
    }
}
