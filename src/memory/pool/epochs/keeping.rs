//! Which epochs a stream keeps (`epochs.rs`): an epoch found is kept beside the others over
//! its floor, at most `VARIANTS` of one first size and floor and `PLANS` in all; and a stream
//! following one variant's plan goes on with another's where their requests part
//! (`Epochs::variant_at`).

use std::sync::Arc;

use super::super::epoch_plan::{Plan, Terms};
use super::super::tlsf::NIL;
use super::{Epochs, Kept, LOG_MAX};

/// Plans a stream keeps (their allocations at most `LOG_MAX` in all): a program whose epochs
/// take turns — requests of a few batch sizes, each emptying the range — follows each one's
/// own. The first allocation looks through them.
const PLANS: usize = 16;
/// Kept epochs a stream keeps per first size and floor, told apart by their sizes: epochs that
/// start alike and differ later — a batch of 192 × 256 images and one of 256 × 192, the same
/// bytes until a layer rounds their sides — each keep their plan, made once. The newest is
/// followed, and an epoch that parts from it goes on with another's (`Epochs::variant_at`).
/// With one, each would replace the other and be planned again every time they alternate
/// (deeplab_train_sizes on a GPU: a plan of 3.7 ms in 10 of 33 steps, BENCHMARKS.md, session
/// 46), and an epoch that parted from the plan would be placed as usual from there.
const VARIANTS: usize = 4;

impl Epochs {
    /// Keeps the epoch found at the last free (`ended`), over the range's live blocks now.
    pub(in crate::memory::pool) fn keep_ended(&mut self, floor: Vec<(u64, u64)>) {
        let Some(log) = self.ended.take() else { return };
        let (first, hash) = (log[0].size, self.hash);
        // At most `VARIANTS` per first size and floor: the oldest of them goes, and the oldest
        // of all beyond the bounds.
        let alike = |k: &Arc<Kept>| k.first_size() == first && k.hash == hash;
        if self.kept.iter().filter(|k| alike(k)).count() >= VARIANTS {
            let oldest = self.kept.iter().position(alike).expect("a variant");
            self.kept.remove(oldest);
        }
        self.kept.push(Arc::new(Kept::new(
            log,
            floor,
            hash,
            Vec::new(),
            Vec::new(),
        )));
        self.bound_kept();
    }

    /// Per kept epoch: its allocations, those its log still holds, and whether it is planned.
    #[cfg(test)]
    pub(in crate::memory::pool) fn kept_logs(&self) -> Vec<(usize, usize, bool)> {
        self.kept
            .iter()
            .map(|k| {
                let log = k.log.lock().map_or(0, |l| l.len());
                (k.len, log, k.plan.get().is_some())
            })
            .collect()
    }

    /// The oldest kept epochs go beyond `PLANS` or `LOG_MAX` allocations in all.
    pub(super) fn bound_kept(&mut self) {
        let mut total: usize = self.kept.iter().map(|k| k.len).sum();
        while self.kept.len() > PLANS || total > LOG_MAX {
            total -= self.kept.remove(0).len;
        }
    }

    /// Following, the plan's next allocation is not `size` bytes: the plan of a kept variant
    /// (the same first size and floor) that has `size` there and placed every allocation before
    /// it where this plan did becomes the one followed; the blocks placed so far and the
    /// floor's keep their places in `placed`. A variant not planned yet whose log starts so is
    /// planned now, around this plan's places for what they share (`Kept::plan`'s `base`).
    /// Returns the plan, for its floor's blocks and pages (`Pool::switch_variant`).
    pub(in crate::memory::pool) fn variant_at(
        &mut self,
        size: u64,
        terms: Terms,
    ) -> Option<Arc<Plan>> {
        let (now, from) = (self.plan.clone()?, self.following.clone()?);
        if now.periodic || !from.is_epoch() {
            // A period's turn has no variants: its plan goes when left (`leave_period`).
            return None;
        }
        let d = self.next as usize;
        if d < now.young && now.sizes[d] == size {
            // The same size, its place not free: not a variant's turn.
            return None;
        }
        let floor = now.sizes.len() - now.young;
        let goes_on = |p: &Plan| {
            p.young > d
                && p.sizes.len() - p.young == floor
                && p.sizes[d] == size
                && p.sizes[..d] == now.sizes[..d]
                && p.offsets[..d] == now.offsets[..d]
        };
        let mut found = None;
        for i in (0..self.kept.len()).rev() {
            let x = &self.kept[i];
            if x.first_size() != from.first_size()
                || x.hash != from.hash
                || !x.is_epoch()
                || Arc::ptr_eq(x, &from)
            {
                continue;
            }
            let fresh = x.plan.get().is_none();
            if fresh && !x.starts_as(&now.sizes[..d], size) {
                continue;
            }
            let p = x.plan(terms, Some(&now));
            self.planned += u64::from(fresh);
            if let Some(p) = p.filter(|p| goes_on(p)) {
                found = Some((i, p));
                break;
            }
        }
        let (i, next) = found?;
        let mut placed = vec![NIL; next.sizes.len()];
        placed[..d].copy_from_slice(&self.placed[..d]);
        placed[next.young..].copy_from_slice(&self.placed[now.young..]);
        self.placed = placed;
        self.plan = Some(next.clone());
        self.following = Some(self.kept[i].clone());
        Some(next)
    }

    /// Where `kept` lists the kept epoch `k`.
    pub(super) fn listed(&self, k: Option<Arc<Kept>>) -> Option<usize> {
        let k = k?;
        self.kept.iter().position(|x| Arc::ptr_eq(x, &k))
    }
}
