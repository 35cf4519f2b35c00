//! Handles: every object the C API hands out is an entry in a table, and the pointer the
//! caller holds is an opaque key into it, never a Rust address. A released or made-up handle
//! is therefore an error, not a use-after-free: keys are never reused, so releasing twice is
//! detected too. The tables (and the runtimes' homes) are the only process-wide state and hold
//! no runtime state themselves.
//!
//! Graphs and kernels are entries of one map behind a read-write lock. Runtime keys name a
//! runtime's home (`runtime/home.rs`: records in memory that is never freed) and the home's
//! generation, because `gkrt_malloc` / `gkrt_free` look their runtime up on every call. A call
//! pins the runtime by taking the home's flag, which is also the runtime's state lock: one
//! compare-and-swap and one store pin the handle and lock the pool (the map's read lock and an
//! `Arc` clone and drop would be four read-modify-writes, and a slot lock beside the state lock
//! one more; what each cost: BENCHMARKS.md §3, "runtime homes"). A second handle of the same runtime gets a home of its own, an alias, whose pin is a lock
//! beside the state lock.

use crate::runtime::home::{self, HomeRecord};
use crate::runtime::{
    Comm, DeviceQueue, Error, Kernel, Result, Runtime, RuntimeGraph, State, StateGuard,
};
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

pub struct KernelObject {
    pub runtime: Arc<Runtime>,
    pub kernel: Kernel,
}

#[derive(Clone)]
pub enum Object {
    Runtime(Arc<Runtime>),
    Graph(Arc<Mutex<RuntimeGraph>>),
    Kernel(Arc<KernelObject>),
    Queue(Arc<DeviceQueue>),
    Comm(Arc<Comm>),
}

impl Object {
    fn kind(&self) -> &'static str {
        match self {
            Object::Runtime(_) => "runtime",
            Object::Graph(_) => "graph",
            Object::Kernel(_) => "kernel",
            Object::Queue(_) => "queue",
            Object::Comm(_) => "communicator",
        }
    }
}

/// Keys are distinct integers we made, so a multiplicative hash is enough (SipHash's
/// resistance to chosen keys buys nothing here and costs on every C call).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, key: usize) {
        self.0 = (key as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Table = HashMap<usize, Object, BuildHasherDefault<KeyHasher>>;

/// Read-mostly: every call looks a handle up, only create and release write.
static TABLE: Lazy<RwLock<Table>> = Lazy::new(|| RwLock::new(Table::default()));
/// Keys start high and step by 16 so they look like (and are sized like) aligned pointers.
static NEXT_KEY: AtomicUsize = AtomicUsize::new(0x10_0000);

/// A new handle for `obj`. Fails with `OutOfMemory` when the process has no handle left: 2^42
/// graph and kernel keys over its life, or `home::MAX_HOMES` runtime handles at once.
pub fn register(obj: Object) -> Result<usize> {
    if let Object::Runtime(rt) = obj {
        return register_runtime(rt);
    }
    let key = NEXT_KEY
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |k| {
            (k + 16 < RUNTIME_TAG).then_some(k + 16)
        })
        .map_err(|_| {
            Error::OutOfMemory(format!(
                "the process has made {} graph and kernel handles, all there are; none is reused",
                RUNTIME_TAG / 16
            ))
        })?;
    TABLE
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, obj);
    Ok(key)
}

fn lookup(key: usize, want: &'static str) -> Result<Object> {
    if key == 0 {
        return Err(Error::InvalidArgument(format!("{want} handle is NULL")));
    }
    if key & RUNTIME_TAG != 0 {
        // Told apart without pinning the runtime, which a run may hold.
        let live_runtime = decode(key).is_some_and(|(index, generation)| {
            home::get(index).is_some_and(|h| h.live_generation() == generation)
        });
        return Err(Error::InvalidArgument(if live_runtime {
            format!("handle {key:#x} is a runtime, not a {want}")
        } else {
            format!("{want} handle {key:#x} is not live (already released, or never created)")
        }));
    }
    match TABLE.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
        Some(obj) if obj.kind() == want => Ok(obj.clone()),
        Some(obj) => Err(Error::InvalidArgument(format!(
            "handle {key:#x} is a {}, not a {want}",
            obj.kind()
        ))),
        None => Err(Error::InvalidArgument(format!(
            "{want} handle {key:#x} is not live (already released, or never created)"
        ))),
    }
}

/// The runtime of `key`, owned (see `pin_runtime` for calls that only borrow it briefly).
pub fn runtime(key: usize) -> Result<Arc<Runtime>> {
    Ok(pin_runtime(key)?.into_owned())
}

pub fn graph(key: usize) -> Result<Arc<Mutex<RuntimeGraph>>> {
    match lookup(key, "graph")? {
        Object::Graph(g) => Ok(g),
        _ => unreachable!(),
    }
}

pub fn kernel(key: usize) -> Result<Arc<KernelObject>> {
    match lookup(key, "kernel")? {
        Object::Kernel(k) => Ok(k),
        _ => unreachable!(),
    }
}

pub fn queue(key: usize) -> Result<Arc<DeviceQueue>> {
    match lookup(key, "queue")? {
        Object::Queue(q) => Ok(q),
        _ => unreachable!(),
    }
}

pub fn comm(key: usize) -> Result<Arc<Comm>> {
    match lookup(key, "communicator")? {
        Object::Comm(c) => Ok(c),
        _ => unreachable!(),
    }
}

/// Removes a handle of kind `want`; the object is dropped outside the table's lock (dropping
/// a graph waits for its device work).
pub fn release(key: usize, want: &'static str) -> Result<()> {
    if want == "runtime" {
        return release_runtime(key);
    }
    lookup(key, want)?;
    let obj = TABLE
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key);
    // Another thread may have released it between the check and the removal.
    match obj {
        Some(obj) => {
            drop(obj);
            Ok(())
        }
        None => Err(Error::InvalidArgument(format!(
            "{want} handle {key:#x} was released by another call"
        ))),
    }
}

// --- runtime handles: homes ---

/// Set in every runtime key, and in no other key (the map's keys stay far below it).
const RUNTIME_TAG: usize = 1 << 46;
/// Key layout under the tag: generation (22 bits) | home index (20 bits) | 4 zero bits.
const INDEX_BITS: u32 = 20;
const GENERATION_BITS: u32 = 22;
const _: () = assert!(home::MAX_HOMES == 1 << INDEX_BITS);
const _: () = assert!(home::GENERATION_LIMIT == 1 << GENERATION_BITS);

fn key_of(index: usize, generation: u32) -> usize {
    RUNTIME_TAG | (generation as usize) << (INDEX_BITS + 4) | index << 4
}

/// (home index, generation) of a runtime key, or None when `key` cannot be one.
fn decode(key: usize) -> Option<(usize, u32)> {
    let payload = key ^ RUNTIME_TAG;
    if key & RUNTIME_TAG == 0
        || payload & 0xF != 0
        || payload >> (INDEX_BITS + GENERATION_BITS + 4) != 0
    {
        return None;
    }
    Some((
        (payload >> 4) & ((1 << INDEX_BITS) - 1),
        (payload >> (INDEX_BITS + 4)) as u32,
    ))
}

/// A handle for `rt`: its own home when no handle names it yet, else a home of its own (an
/// alias, whose pin is a second lock besides the runtime's state lock). A busy own home (the
/// runtime's state is locked: a run, perhaps the one whose host callback asks) gets an alias
/// too, rather than a wait.
fn register_runtime(rt: Arc<Runtime>) -> Result<usize> {
    let own = rt.home();
    let home = home::get(own).expect("a runtime's home exists");
    if let Some(mut s) = home.try_lock() {
        if s.runtime.is_none() && s.generation + 1 < home::GENERATION_LIMIT {
            s.generation += 1;
            s.runtime = Some(rt);
            home.set_live_generation(s.generation);
            return Ok(key_of(own, s.generation));
        }
    }
    let (index, alias) =
        home::acquire().ok_or_else(|| Error::OutOfMemory(home::exhausted_message()))?;
    let mut s = alias.lock();
    s.generation += 1;
    s.runtime = Some(rt);
    alias.set_live_generation(s.generation);
    Ok(key_of(index, s.generation))
}

/// A runtime pinned by its handle for a call: the home's flag is held until drop. When the
/// handle names the runtime's own home, that flag is also the runtime's state lock
/// (`with_state`).
pub struct PinnedRuntime {
    slot: StateGuard<'static, HomeRecord>,
    own_home: bool,
}

impl PinnedRuntime {
    /// An owned reference, and the handle unpinned: for calls that may wait.
    pub fn into_owned(self) -> Arc<Runtime> {
        Arc::clone(self.arc())
    }

    fn arc(&self) -> &Arc<Runtime> {
        self.slot
            .runtime
            .as_ref()
            .expect("a pinned home holds its runtime")
    }

    /// The runtime and its state, locked by the pin itself, when the handle names the runtime's
    /// own home; `None` for an alias (lock the state with `try_lock_for_call` then).
    #[inline]
    pub fn with_state(&mut self) -> Option<(&Runtime, &mut State)> {
        if !self.own_home {
            return None;
        }
        let rt: &Runtime = self.arc();
        // SAFETY: the pin holds the flag of the runtime's own home, which is the state's lock,
        // for as long as the returned borrow of `self` lives.
        let st = unsafe { &mut *rt.state_locked() };
        Some((rt, st))
    }
}

impl std::ops::Deref for PinnedRuntime {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        self.arc()
    }
}

/// The fast path of a raw call (`gkrt_malloc` / `gkrt_free`): `key` names a live runtime's own
/// home and its flag was free, so it is now held, and with it the runtime's state lock
/// (released on drop). `None` in every other case: the caller then takes `pin_runtime`'s way,
/// which waits where needed and names each error. The same checks as `pin_runtime`, without
/// its `Result` (a guard beside an error that owns a message: callgrind counted 58 instructions
/// for the pin alone); an `Option` of this is one register.
#[inline(always)]
pub fn pin_own_home(key: usize) -> Option<OwnHome> {
    let (index, generation) = decode(key)?;
    let slot = home::get(index)?.try_lock()?;
    if slot.generation != generation {
        return None;
    }
    if slot.runtime.as_ref()?.home() != index {
        return None;
    }
    Some(OwnHome(slot))
}

/// A runtime pinned by its handle's own home, whose flag is the runtime's state lock
/// (`pin_own_home`).
pub struct OwnHome(StateGuard<'static, HomeRecord>);

impl OwnHome {
    /// The runtime and its state, locked by the pin.
    #[inline(always)]
    pub fn parts(&mut self) -> (&Runtime, &mut State) {
        let rt: &Runtime = self.0.runtime.as_ref().expect("checked when pinned");
        // SAFETY: the pin holds the flag of the runtime's own home, which is the state's lock,
        // for as long as the returned borrow of `self` lives.
        let st = unsafe { &mut *rt.state_locked() };
        (rt, st)
    }
}

/// The live runtime of `key`, pinned by its handle: hold it only for work that does not wait
/// (`into_owned` first otherwise), since a release of the handle, and, through the runtime's own
/// home, any use of the runtime's state, waits for it.
pub fn pin_runtime(key: usize) -> Result<PinnedRuntime> {
    let not_live = || {
        Error::InvalidArgument(format!(
            "runtime handle {key:#x} is not live (already released, or never created)"
        ))
    };
    if key == 0 {
        return Err(Error::InvalidArgument("runtime handle is NULL".into()));
    }
    let Some((index, generation)) = decode(key) else {
        // Maybe a graph or a kernel: say so.
        return match TABLE.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
            Some(obj) => Err(Error::InvalidArgument(format!(
                "handle {key:#x} is a {}, not a runtime",
                obj.kind()
            ))),
            None => Err(not_live()),
        };
    };
    let home = home::get(index).ok_or_else(not_live)?;
    let slot = match home.try_lock() {
        Some(g) => g,
        // A busy home may be another runtime's now: a stale key is refused without waiting.
        None if home.live_generation() != generation => return Err(not_live()),
        // Inside a host callback a busy home is an error, never a wait: its holder may be
        // running the graph of the callback, or be in a pool operation that waits for the
        // device, which (on the host backend) waits for the callback.
        None if crate::runtime::inside_callback() => {
            return Err(crate::runtime::busy_inside_callback("runtime"))
        }
        None => home.lock(),
    };
    if slot.generation != generation {
        return Err(not_live());
    }
    let own_home = match &slot.runtime {
        Some(rt) => rt.home() == index,
        None => return Err(not_live()),
    };
    Ok(PinnedRuntime { slot, own_home })
}

fn release_runtime(key: usize) -> Result<()> {
    let mut pinned = pin_runtime(key)?;
    let rt = pinned.slot.runtime.take();
    let own_home = pinned.own_home;
    let (index, _) = decode(key).expect("pinned above");
    home::get(index)
        .expect("pinned above")
        .set_live_generation(0);
    drop(pinned);
    if !own_home {
        // An alias is free now; a runtime's own home is given back when the runtime drops.
        home::vacate(index);
    }
    // Dropping the last reference waits for the runtime's device work: outside every lock.
    drop(rt);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::types::gkrt_status;
    use crate::capi::{gkrt_free, gkrt_malloc};
    use crate::runtime::{Config, DeviceChoice};

    fn host_runtime() -> Arc<Runtime> {
        Runtime::new(Config {
            device: DeviceChoice::Host,
            memory_limit: 64 << 20,
            ..Config::default()
        })
        .unwrap()
    }

    fn message<T>(r: Result<T>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.message().to_string(),
        }
    }

    #[test]
    fn runtime_keys_are_never_reused_and_stale_or_made_up_ones_are_errors() {
        let a = register(Object::Runtime(host_runtime())).unwrap();
        release(a, "runtime").unwrap();
        let b = register(Object::Runtime(host_runtime())).unwrap();
        assert_ne!(a, b, "a key is never handed out twice");
        assert!(message(runtime(a)).contains("not live"));
        assert!(message(release(a, "runtime")).contains("not live"));
        assert!(runtime(b).is_ok());
        // Keys that cannot name a runtime, or name a slot no runtime ever used.
        for bogus in [
            RUNTIME_TAG | 0x10,
            RUNTIME_TAG | 0x18,
            RUNTIME_TAG | 1 << 60,
            RUNTIME_TAG | ((home::MAX_HOMES - 1) << 4) | 1 << 24,
            0x1234_5670,
        ] {
            let e = message(pin_runtime(bogus));
            assert!(e.contains("not live"), "{bogus:#x}: {e}");
        }
        // A runtime where a graph is wanted, a graph where a runtime is.
        assert!(message(graph(b)).contains("is a runtime, not a graph"));
        let g = register(Object::Graph(Arc::new(Mutex::new(RuntimeGraph::new(
            runtime(b).unwrap(),
        )))))
        .unwrap();
        assert!(message(runtime(g)).contains("is a graph, not a runtime"));
        assert!(message(release(g, "runtime")).contains("is a graph, not a runtime"));
        release(g, "graph").unwrap();
        release(b, "runtime").unwrap();
    }

    /// The first handle of a runtime names its home, whose pin locks the state too; a second
    /// handle of the same runtime is an alias with its own home. Both serve raw calls, and each
    /// release ends its own handle only.
    #[test]
    fn a_second_handle_of_a_runtime_is_an_alias_and_both_work() {
        let rt = host_runtime();
        let own = register(Object::Runtime(Arc::clone(&rt))).unwrap();
        let alias = register(Object::Runtime(Arc::clone(&rt))).unwrap();
        assert_ne!(own, alias);
        assert!(pin_runtime(own).unwrap().own_home);
        assert!(!pin_runtime(alias).unwrap().own_home);
        // The own home's pin holds the state lock; the alias's does not.
        assert!(pin_runtime(own).unwrap().try_lock_for_call().is_none());
        assert!(pin_runtime(alias).unwrap().try_lock_for_call().is_some());
        let alloc = |key: usize| {
            let mut p = std::ptr::null_mut();
            // SAFETY: p is a valid out-pointer; the handle is only a key.
            let st = unsafe { gkrt_malloc(key as *mut _, 4096, std::ptr::null_mut(), &mut p) };
            (st, p)
        };
        let (st, a) = alloc(own);
        assert_eq!(st, gkrt_status::GKRT_STATUS_OK);
        let (st, b) = alloc(alias);
        assert_eq!(st, gkrt_status::GKRT_STATUS_OK);
        // One pool: memory from one handle is freed through the other.
        assert_eq!(rt.stats().unwrap().pool.allocated_bytes, 8192);
        let free = |key: usize, p| unsafe { gkrt_free(key as *mut _, p, std::ptr::null_mut()) };
        assert_eq!(free(alias, a), gkrt_status::GKRT_STATUS_OK);
        release(alias, "runtime").unwrap();
        assert!(message(pin_runtime(alias)).contains("not live"));
        assert_eq!(free(own, b), gkrt_status::GKRT_STATUS_OK);
        assert_eq!(rt.stats().unwrap().pool.allocated_bytes, 0);
        release(own, "runtime").unwrap();
        assert_eq!(alloc(own).0, gkrt_status::GKRT_STATUS_INVALID_ARGUMENT);
        // Registered again, the runtime gets its own home back under a new key.
        let again = register(Object::Runtime(Arc::clone(&rt))).unwrap();
        assert_ne!(again, own);
        assert!(pin_runtime(again).unwrap().own_home);
        release(again, "runtime").unwrap();
    }

    /// A host callback that meets its runtime's slot busy gets an error at once: the holder may
    /// be waiting for the device, which on the host backend waits for the callback.
    #[test]
    fn a_callback_never_waits_for_a_pinned_runtime() {
        use crate::runtime::{call_callback, CallbackArgs, HostCallback};
        let key = register(Object::Runtime(host_runtime())).unwrap();
        unsafe extern "C" fn stats_of(_: *const CallbackArgs, key: *mut std::ffi::c_void) -> i32 {
            let mut s = crate::capi::types::gkrt_stats::default();
            // SAFETY: s is a valid out-pointer; the handle is only a key.
            unsafe { crate::capi::gkrt_runtime_stats(key.cast(), &mut s) as i32 }
        }
        let cb = HostCallback {
            func: stats_of,
            user_data: key,
            owner: None,
        };
        // SAFETY: every field is a pointer or an integer, for which zero is valid; `stats_of`
        // reads none of them.
        let args: CallbackArgs = unsafe { std::mem::zeroed() };
        let pinned = pin_runtime(key).unwrap();
        let status = unsafe { call_callback(&cb, &args) };
        assert_eq!(status, gkrt_status::GKRT_STATUS_INVALID_STATE as i32);
        let mut msg = [0u8; 256];
        let n = unsafe { crate::capi::gkrt_last_error_message(msg.as_mut_ptr().cast(), 256) };
        assert!(String::from_utf8_lossy(&msg[..n.min(255)]).contains("busy"));
        // A release too (the handle's home is the runtime's state lock, held by the pin here as
        // by a run).
        unsafe extern "C" fn release_it(_: *const CallbackArgs, key: *mut std::ffi::c_void) -> i32 {
            crate::capi::gkrt_runtime_release(key.cast()) as i32
        }
        let release_cb = HostCallback {
            func: release_it,
            user_data: key,
            owner: None,
        };
        assert_eq!(
            unsafe { call_callback(&release_cb, &args) },
            gkrt_status::GKRT_STATUS_INVALID_STATE as i32
        );
        drop(pinned);
        // Free again, the same call from a callback works.
        assert_eq!(unsafe { call_callback(&cb, &args) }, 0);
        release(key, "runtime").unwrap();
    }

    /// A released key whose home now serves a busy runtime is refused at once, with the status
    /// for a released handle, also from inside a host callback: nothing waits for the runtime
    /// that lives there now.
    #[test]
    fn a_stale_key_is_refused_at_once_while_its_home_is_busy() {
        use crate::runtime::{call_callback, CallbackArgs, HostCallback};
        let rt = host_runtime();
        let stale = register(Object::Runtime(Arc::clone(&rt))).unwrap();
        release(stale, "runtime").unwrap();
        // The runtime's own home again, under a new generation: the old key names the same home.
        let live = register(Object::Runtime(Arc::clone(&rt))).unwrap();
        assert_eq!(decode(live).unwrap().0, decode(stale).unwrap().0);
        let busy = pin_runtime(live).unwrap(); // as a run holds it
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = pin_runtime(stale).map(|_| ());
            tx.send(r.map_err(|e| e.message().to_string())).unwrap();
        });
        // The home stays busy until after this wait, so an answer at all shows no wait for it;
        // a bound on the wall time would only measure how loaded the machine is.
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("a stale key must not wait for the busy home");
        assert!(r.unwrap_err().contains("not live"));
        unsafe extern "C" fn stats_of(_: *const CallbackArgs, key: *mut std::ffi::c_void) -> i32 {
            let mut s = crate::capi::types::gkrt_stats::default();
            // SAFETY: s is a valid out-pointer; the handle is only a key.
            unsafe { crate::capi::gkrt_runtime_stats(key.cast(), &mut s) as i32 }
        }
        // SAFETY: every field is a pointer or an integer, for which zero is valid.
        let args: CallbackArgs = unsafe { std::mem::zeroed() };
        let cb = HostCallback {
            func: stats_of,
            user_data: stale,
            owner: None,
        };
        assert_eq!(
            unsafe { call_callback(&cb, &args) },
            gkrt_status::GKRT_STATUS_INVALID_ARGUMENT as i32
        );
        // A stale runtime key where a graph is wanted is told apart without the lock too.
        assert!(message(graph(stale)).contains("not live"));
        assert!(message(graph(live)).contains("is a runtime, not a graph"));
        drop(busy);
        release(live, "runtime").unwrap();
    }

    /// Raw calls racing with the release of their runtime's handle: each call either works or
    /// says the handle is not live; none crashes, and after the release every call fails.
    #[test]
    fn raw_calls_racing_a_release_fail_cleanly() {
        for round in 0..20 {
            let key = register(Object::Runtime(host_runtime())).unwrap();
            let handle = key as *mut crate::capi::types::gkrt_runtime;
            // The worker says when its first call has worked, so that the release always races
            // calls in flight: on a loaded machine a new thread may not run before the release.
            let (started_tx, started) = std::sync::mpsc::channel();
            let worker = std::thread::spawn(move || {
                let handle = key as *mut crate::capi::types::gkrt_runtime;
                let (mut ok, mut refused) = (0u64, 0u64);
                loop {
                    let mut p = std::ptr::null_mut();
                    // SAFETY: p is a valid out-pointer; the handle is only a key.
                    match unsafe { gkrt_malloc(handle, 4096, std::ptr::null_mut(), &mut p) } {
                        gkrt_status::GKRT_STATUS_OK => {
                            ok += 1;
                            let st = unsafe { gkrt_free(handle, p, std::ptr::null_mut()) };
                            // The release may come between the two calls.
                            assert!(matches!(
                                st,
                                gkrt_status::GKRT_STATUS_OK
                                    | gkrt_status::GKRT_STATUS_INVALID_ARGUMENT
                            ));
                            if ok == 1 {
                                started_tx.send(()).unwrap();
                            }
                        }
                        gkrt_status::GKRT_STATUS_INVALID_ARGUMENT => {
                            refused += 1;
                            if refused > 100 {
                                return (ok, refused);
                            }
                        }
                        other => panic!("gkrt_malloc -> {other:?}"),
                    }
                }
            });
            started
                .recv_timeout(std::time::Duration::from_secs(30))
                .expect("the worker's first call works before the release");
            std::thread::sleep(std::time::Duration::from_micros(50 * (round % 5)));
            release(key, "runtime").unwrap();
            let (ok, refused) = worker.join().unwrap();
            assert!(refused > 100);
            assert!(ok >= 1);
            let mut p = std::ptr::null_mut();
            let st = unsafe { gkrt_malloc(handle, 64, std::ptr::null_mut(), &mut p) };
            assert_eq!(st, gkrt_status::GKRT_STATUS_INVALID_ARGUMENT);
            assert!(p.is_null(), "out is written only on success");
        }
    }
}
