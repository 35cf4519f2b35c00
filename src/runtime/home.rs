//! Runtime homes: records in memory that is never freed, one per live runtime, each holding the
//! runtime's state lock (its flag) and the slot by which the C API names the runtime.
//!
//! A C handle to a runtime names a home and the home's generation (`capi/handles.rs`). A raw
//! call (`gkrt_malloc` / `gkrt_free`) takes the home's flag to pin the runtime against a
//! concurrent release; because that flag is also the runtime's state lock, the same
//! compare-and-swap locks the pool, where a separate slot lock would add a second one to every
//! raw call (BENCHMARKS.md §3, "runtime homes"). A key read after its runtime is gone still
//! names memory that is a home: its generation tells it is stale.
//!
//! A runtime's home is taken when the runtime is made and given back when it is dropped. A
//! second handle to a runtime that already has one (`gkrt_torch_runtime` hands out several)
//! gets a home of its own as an alias: pinning it takes the alias's flag, and the runtime's state
//! lock is then a second lock. Homes whose generations are used up are never given out again,
//! so no key is ever reused.

use super::Runtime;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::state_lock::{acquire_waiting, try_acquire, StateGuard};

/// Homes per chunk, and most homes at once.
const CHUNK: usize = 1024;
pub(crate) const MAX_HOMES: usize = 1 << 20;
const CHUNKS: usize = MAX_HOMES / CHUNK;
/// Generations a home can go through (a key holds 22 bits of it).
pub(crate) const GENERATION_LIMIT: u32 = 1 << 22;

/// What a home's flag guards besides the state of the runtime whose home it is.
pub struct HomeRecord {
    /// Generation of the handle that names the home now, or named it last (0: none ever did).
    pub generation: u32,
    /// The runtime, while a handle names the home.
    pub runtime: Option<Arc<Runtime>>,
}

pub struct Home {
    flag: AtomicBool,
    slot: UnsafeCell<HomeRecord>,
    /// The generation of the handle that names the home now, 0 when none does: written under
    /// the flag, read without it, so that a stale key is refused without waiting for the flag,
    /// which a run of whatever runtime lives here now may hold for seconds.
    live: AtomicU32,
}

// SAFETY: `slot` is reached only while `flag` is held (through `lock` / `try_lock`).
unsafe impl Sync for Home {}

static CHUNK_PTRS: [AtomicPtr<Home>; CHUNKS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];

struct HomeAlloc {
    /// Homes from `next` on were never given out.
    next: usize,
    /// Given back, generations left.
    free: Vec<usize>,
}

static ALLOC: Mutex<HomeAlloc> = Mutex::new(HomeAlloc {
    next: 0,
    free: Vec::new(),
});

/// The home at `index`, if its chunk exists.
#[inline]
pub fn get(index: usize) -> Option<&'static Home> {
    let chunk = CHUNK_PTRS.get(index / CHUNK)?.load(Ordering::Acquire);
    // SAFETY: a non-null chunk pointer is a leaked `[Home; CHUNK]`, never freed.
    (!chunk.is_null()).then(|| unsafe { &*chunk.add(index % CHUNK) })
}

/// A home no runtime or handle uses: (index, home); None when `MAX_HOMES` are in use.
pub fn acquire() -> Option<(usize, &'static Home)> {
    let index = {
        let mut a = ALLOC.lock().unwrap_or_else(|p| p.into_inner());
        match a.free.pop() {
            Some(i) => i,
            None => {
                let i = a.next;
                if i >= MAX_HOMES {
                    return None;
                }
                a.next += 1;
                let cell = &CHUNK_PTRS[i / CHUNK];
                if cell.load(Ordering::Relaxed).is_null() {
                    let chunk: Box<[Home]> = (0..CHUNK)
                        .map(|_| Home {
                            flag: AtomicBool::new(false),
                            slot: UnsafeCell::new(HomeRecord {
                                generation: 0,
                                runtime: None,
                            }),
                            live: AtomicU32::new(0),
                        })
                        .collect();
                    cell.store(Box::leak(chunk).as_mut_ptr(), Ordering::Release);
                }
                i
            }
        }
    };
    Some((index, get(index).expect("the home's chunk was made above")))
}

/// The message for a process out of homes.
pub fn exhausted_message() -> String {
    format!(
        "more than {MAX_HOMES} runtimes and runtime handles are live at once; release some first"
    )
}

/// Gives home `index` back once nothing uses it (its runtime dropped, or its alias handle
/// released); one whose generations are used up is kept out for good.
pub fn vacate(index: usize) {
    let Some(home) = get(index) else {
        return;
    };
    let generation = home.lock().generation;
    if generation + 1 < GENERATION_LIMIT {
        ALLOC
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free
            .push(index);
    }
}

impl Home {
    /// The generation of the handle naming the home now (0: none), read without the flag: a
    /// key whose generation differs is stale, whoever holds the flag.
    #[inline]
    pub fn live_generation(&self) -> u32 {
        self.live.load(Ordering::Acquire)
    }

    /// Records that the handle of `generation` names the home now (0: none does). Called with
    /// the flag held, together with the slot's change.
    pub fn set_live_generation(&self, generation: u32) {
        self.live.store(generation, Ordering::Release);
    }

    /// The flag: the state lock of the runtime whose home this is.
    pub fn flag(&'static self) -> &'static AtomicBool {
        &self.flag
    }

    #[inline]
    pub fn try_lock(&'static self) -> Option<StateGuard<'static, HomeRecord>> {
        // SAFETY: `flag` guards `slot`, which is never freed.
        try_acquire(&self.flag)
            .then(|| unsafe { StateGuard::from_held(&self.flag, self.slot.get()) })
    }

    pub fn lock(&'static self) -> StateGuard<'static, HomeRecord> {
        acquire_waiting(&self.flag);
        // SAFETY: as in `try_lock`.
        unsafe { StateGuard::from_held(&self.flag, self.slot.get()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_flag_locks_its_slot_and_indices_name_homes() {
        let (i, h) = acquire().expect("homes left");
        let mut g = h.try_lock().expect("a home given out is free");
        assert!(g.runtime.is_none(), "a home given out names no runtime");
        let generation = g.generation;
        g.generation += 1;
        assert!(h.try_lock().is_none(), "the flag is held");
        assert!(h.flag().load(Ordering::Relaxed));
        drop(g);
        assert!(!h.flag().load(Ordering::Relaxed));
        assert_eq!(h.lock().generation, generation + 1);
        assert!(std::ptr::eq(get(i).unwrap(), h));
        assert!(get(MAX_HOMES).is_none());
        vacate(i);
    }
}
