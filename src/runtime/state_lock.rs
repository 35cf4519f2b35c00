//! The lock around a runtime's state.
//!
//! Every raw pool call (`gkrt_malloc` / `gkrt_free`, the PyTorch entry points) takes it once, so
//! its uncontended cost is part of every allocation. `std::sync::Mutex` spends two atomic
//! read-modify-writes there (the unlock swaps, to learn whether a waiter must be woken); this
//! lock releases with a plain store, which makes an alloc+free pair cheaper and raises the
//! pool's throughput with several threads (BENCHMARKS.md §3, "What each change did"). The
//! price is in the contended case: a waiter spins briefly,
//! then yields, then sleeps in growing steps (20 µs up to 1.3 ms) instead of being woken — fine
//! for a lock held either for a pool operation (nanoseconds) or for a whole graph run
//! (milliseconds).
//!
//! A panic while the lock is held releases it (the guard's drop), like a poisoned
//! `std::sync::Mutex` whose poison the runtime ignores.
//!
//! The flag lives outside the value it guards (`FlagLock`): in the runtime's home
//! (`home.rs`), which the C API's handle names, so that pinning a handle and locking the state
//! are the same compare-and-swap. `StateGuard` is a guard of such a flag, whatever holds it.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A value whose lock flag lives elsewhere, in memory that outlives it: a runtime's state, whose
/// flag is its home's (`home.rs`), so that pinning the runtime's handle and locking its state
/// are one compare-and-swap.
pub struct FlagLock<T> {
    flag: &'static AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard of `flag` (or by a caller that holds `flag`
// through another guard, `FlagLock::locked`), and at most one holder exists at a time (the flag,
// taken with Acquire and released with Release, orders every access).
unsafe impl<T: Send> Send for FlagLock<T> {}
unsafe impl<T: Send> Sync for FlagLock<T> {}

/// Holds a lock flag; gives the value behind it. Dropping it (a panic's unwinding too) releases
/// the flag.
pub struct StateGuard<'a, T> {
    flag: &'a AtomicBool,
    value: *mut T,
    /// Ties the guard to `'a` and to exclusive use of `T` (the raw `value` already makes the
    /// guard neither `Send` nor `Sync`: it is released on the thread that took it).
    _value: PhantomData<&'a mut T>,
}

/// Takes `flag` if it is free now.
#[inline]
fn acquire(flag: &AtomicBool) -> bool {
    flag.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

/// Takes `flag`, waiting: spin on a plain load (so waiters do not bounce its cache line), then
/// yield, then sleep in growing steps.
#[cold]
fn acquire_contended(flag: &AtomicBool) {
    let mut round = 0u32;
    loop {
        while flag.load(Ordering::Relaxed) {
            match round {
                0..=15 => {
                    for _ in 0..(1u32 << round.min(7)) {
                        std::hint::spin_loop();
                    }
                }
                16..=31 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(20u64 << (round - 32).min(6))),
            }
            round = round.saturating_add(1);
        }
        if acquire(flag) {
            return;
        }
    }
}

impl<'a, T> StateGuard<'a, T> {
    /// A guard of `flag`, which the caller has just taken, over `value`, which `flag` guards.
    ///
    /// # Safety
    /// `flag` must be held by the caller (taken by `acquire`) and must be the flag that guards
    /// every access to `*value`, which must stay valid for `'a`.
    #[inline]
    pub unsafe fn from_held(flag: &'a AtomicBool, value: *mut T) -> StateGuard<'a, T> {
        StateGuard {
            flag,
            value,
            _value: PhantomData,
        }
    }
}

/// Takes `flag` if it is free now (for locks built over flags in other structures).
#[inline]
pub fn try_acquire(flag: &AtomicBool) -> bool {
    acquire(flag)
}

/// Takes `flag`, waiting (`acquire_contended`).
#[inline]
pub fn acquire_waiting(flag: &AtomicBool) {
    if !acquire(flag) {
        acquire_contended(flag);
    }
}

impl<T> FlagLock<T> {
    /// `value` guarded by `flag`. The flag may guard more than this value (a home's flag guards
    /// the home's slot and its runtime's state, taken together), but no other lock may use it.
    pub fn new(flag: &'static AtomicBool, value: T) -> FlagLock<T> {
        FlagLock {
            flag,
            value: UnsafeCell::new(value),
        }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    #[inline]
    pub fn try_lock(&self) -> Option<StateGuard<'_, T>> {
        // SAFETY: `flag` guards `value`, which lives as long as `self`.
        acquire(self.flag).then(|| unsafe { StateGuard::from_held(self.flag, self.value.get()) })
    }

    #[inline]
    pub fn lock(&self) -> StateGuard<'_, T> {
        acquire_waiting(self.flag);
        // SAFETY: as in `try_lock`.
        unsafe { StateGuard::from_held(self.flag, self.value.get()) }
    }

    /// The value, for a caller that holds `flag` through a guard of another structure (a
    /// pinned handle of the runtime's home).
    ///
    /// # Safety
    /// The caller holds the flag given to `new` for as long as it uses the pointer.
    #[inline]
    pub unsafe fn locked(&self) -> *mut T {
        self.value.get()
    }
}

impl<T> Deref for StateGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the flag that guards the value.
        unsafe { &*self.value }
    }
}

impl<T> DerefMut for StateGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { &mut *self.value }
    }
}

impl<T> Drop for StateGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.flag.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn flag() -> &'static AtomicBool {
        Box::leak(Box::new(AtomicBool::new(false)))
    }

    #[test]
    fn one_holder_at_a_time_under_contention() {
        let lock = Arc::new(FlagLock::new(flag(), (0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = lock.lock();
                        // Both halves move together only if no one else is inside.
                        g.0 += 1;
                        std::hint::spin_loop();
                        g.1 += 1;
                        assert_eq!(g.0, g.1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), (80_000, 80_000));
    }

    #[test]
    fn try_lock_fails_while_held_and_a_panic_releases() {
        let lock = Arc::new(FlagLock::new(flag(), 1));
        let g = lock.try_lock().expect("free");
        assert!(lock.try_lock().is_none());
        drop(g);
        let l2 = Arc::clone(&lock);
        let r = std::thread::spawn(move || {
            let _g = l2.lock();
            panic!("inside the lock");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*lock.try_lock().expect("released by the panic"), 1);
    }
}
