//! `PoolConfig::tail_first` (`TailFirst`): a request of at most a page whose best fit
//! is a warm free block at least twice its size takes the mapped start of the range's last
//! block instead, when that mapped start is short (at most `vmm_page_bytes`). Best fit would cut
//! the warm hole, and the hole — coalesced from a large tensor freed a moment ago — no longer
//! holds that tensor when it comes back; the short mapped start of the tail is otherwise left to
//! small requests only. Host replay (`replay_traces`, MOVE_US=40) of bert, gnn and mlp_small
//! training: peak reserved over peak live 1.087 → 1.074, 1.168 → 1.146, 1.067 → 1.044; moe
//! training 1.053 → 1.062, resnet50_run and unet training +0.005 and +0.003, the rest the same
//! (`GKRT_REPLAY_TAIL_FIRST=1`). Requests over a page, or a longer mapped tail, made moe worse
//! still (1.083) for no other gain; `TailFirst::Always` stays an experiment knob.
//! `TailFirst::ShortLived`, the default since session 31 (off under a memory limit:
//! `PoolConfig::for_swapping`), applies the same placement only to requests of sizes the pool
//! has seen live shorter than the mean (`lifetimes.rs`): placement by lifetime, where a
//! short-lived block cut from a hole would outlive the neighbours that free the hole's other
//! parts (mlp_small_train 1.0670 → 1.0443 on the H200, no trace over its goal with it).
//! In an epoch over a floor whose last epoch was learnt (`epochs/step_lived.rs`), a request
//! whose position then lived at least as many allocations as there are live blocks now is not
//! short-lived, whatever its size: a prefill makes its layers' keys and values, kept for the
//! whole request, among temporaries of their shape, and by size alone they went to the tail
//! with them, to be left there between freed temporaries (host replay,
//! decoder_requests_6x512_b1: 1.0903 → 1.0552 of its peak live, over its goal at 12 → 4 of 24
//! seeds; session 51). The position only vetoes: sending a request to the tail because its
//! position lived short, whatever its size, put a growing cache's blocks there when a
//! generation was longer than the one learnt (kv_growth_small_8x128_b16 1.0925 → 1.1919,
//! treelstm_train 1.1980 → 1.3178).

use super::block::State;
use super::tlsf::NIL;
use super::{Pool, TailFirst};

/// The rule takes the tail instead of a warm best fit at least this many times the request.
const WARM_FIT_RATIO: u64 = 2;

impl Pool {
    /// With `tail_first` on, for a `size`-byte request on stream `si` whose best fit is the
    /// warm block `fit` (taken out of its index, not yet split): the block carved from the
    /// mapped start of the range's last block, `fit` going back to its index. `None`: the rule
    /// is off or does not apply, and `fit` is left as it was.
    pub(super) fn take_tail_before_warm_split(
        &mut self,
        si: u32,
        fit: u32,
        size: u64,
    ) -> Option<u32> {
        let rule = self.config.tail_first;
        if rule == TailFirst::Off
            || size > self.page
            || self.blocks[fit].size < size.saturating_mul(WARM_FIT_RATIO)
            || (rule == TailFirst::ShortLived && !self.short_lived(si, size))
        {
            return None;
        }
        let r = self.streams[si as usize].range;
        // As the rule was measured: only with no other cold block (`take_tail_prefix` alone
        // also takes the tail when other cold blocks cannot hold the request).
        if r == NIL
            || !self.streams[si as usize].cold.is_empty()
            || !self.tail_mapped_start_within(r, size, self.config.vmm_page_bytes)
        {
            return None;
        }
        let j = self.take_tail_prefix::<true>(si, r, size)?;
        self.link(fit);
        Some(j)
    }

    /// Whether a request of `size` bytes on stream `si` is expected to live fewer allocations
    /// than there are live blocks now: shorter than the mean lifetime, which in a steady program
    /// is the live count (Little's law, with one allocation per unit of time). Blocks of its
    /// size must have (a size never freed yet is not), and, in an epoch over a floor whose last
    /// epoch was learnt, so must the allocation at its position then: one size may hold blocks
    /// of both kinds, which only the position tells apart (a prefill's key/value caches among
    /// its temporaries of the same shape).
    fn short_lived(&self, si: u32, size: u64) -> bool {
        let live = self.live.len() as u64;
        self.lifetimes
            .expected(size)
            .is_some_and(|life| life < live)
            && self.streams[si as usize]
                .epochs
                .life_at_position()
                .is_none_or(|life| u64::from(life) < live)
    }

    /// Whether the range `r`'s last block is free and cold and its mapped start (the run of
    /// mapped pages from its first page) holds `size` bytes and spans at most `most` bytes.
    fn tail_mapped_start_within(&self, r: u32, size: u64, most: u64) -> bool {
        let t = self.segs[r].tail;
        let b = &self.blocks[t];
        if b.state != State::Free || !b.cold || b.size <= size {
            return false;
        }
        // Look one byte past `most`: a run that long is too long.
        let (p0, _) = self.touched(r, b.addr, size);
        let (_, p1) = self.touched(r, b.addr, most.saturating_add(1).min(b.size));
        let mut run = 0;
        self.pages_of(r).each_run(p0, p1, true, |(p, len)| {
            if p == p0 {
                run = len;
            }
            false
        });
        let end = self.segs[r].base + (p0 + run) * self.page;
        end >= b.addr + size && end - b.addr <= most
    }
}
