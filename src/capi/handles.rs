//! Handles: every object the C API hands out is an entry in a table, and the pointer the
//! caller holds is an opaque key into it, never a Rust address. A released or made-up handle
//! is therefore an error, not a use-after-free: keys are never reused, so releasing twice is
//! detected too. The tables are the only process-wide state and hold no runtime state themselves.
//!
//! Graphs and kernels are entries of one map behind a read-write lock. Runtimes have slots of
//! their own (`RuntimeSlot`), because `gkrt_malloc` / `gkrt_free` look their runtime up on every
//! call: the slots lie in chunks that are never freed, a runtime key names its slot and the
//! slot's generation, and a call pins the runtime with the slot's lock (one compare-and-swap and
//! one store) instead of the map's read lock and an `Arc` clone and drop (four read-modify-writes
//! on shared cache lines: measured on the GPU machine, gkrt_malloc cost 1.3–1.6 times the PyTorch
//! entry points, which look nothing up).

use crate::kernels::Kernel;
use crate::runtime::{
    state_lock_for_call, Error, Result, Runtime, RuntimeGraph, StateGuard, StateLock,
};
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
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
}

impl Object {
    fn kind(&self) -> &'static str {
        match self {
            Object::Runtime(_) => "runtime",
            Object::Graph(_) => "graph",
            Object::Kernel(_) => "kernel",
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

pub fn register(obj: Object) -> usize {
    if let Object::Runtime(rt) = obj {
        return register_runtime(rt);
    }
    let key = NEXT_KEY.fetch_add(16, Ordering::Relaxed);
    assert!(key < RUNTIME_TAG, "handle keys exhausted");
    TABLE
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, obj);
    key
}

fn lookup(key: usize, want: &'static str) -> Result<Object> {
    if key == 0 {
        return Err(Error::InvalidArgument(format!("{want} handle is NULL")));
    }
    if key & RUNTIME_TAG != 0 {
        return Err(Error::InvalidArgument(match pin_runtime(key) {
            Ok(_) => format!("handle {key:#x} is a runtime, not a {want}"),
            Err(_) => {
                format!("{want} handle {key:#x} is not live (already released, or never created)")
            }
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

// --- runtime slots ---

/// Set in every runtime key, and in no other key (the map's keys stay far below it).
const RUNTIME_TAG: usize = 1 << 46;
/// Key layout under the tag: generation (22 bits) | slot index (20 bits) | 4 zero bits.
const INDEX_BITS: u32 = 20;
const GENERATION_BITS: u32 = 22;
const CHUNK: usize = 1024;
const CHUNKS: usize = (1 << INDEX_BITS) / CHUNK;

/// What a runtime slot holds, behind the slot's lock (the runtime state's lock type: it is
/// held for nanoseconds — a raw call's pool operation, an `Arc` clone, a release's take — and
/// waiters spin on a plain load before they yield, so threads do not bounce its line).
struct SlotState {
    /// Generation of the handle that names the slot now.
    generation: u32,
    /// The runtime, while a handle names it.
    runtime: Option<Arc<Runtime>>,
}

type RuntimeSlot = StateLock<SlotState>;

/// Chunks of slots, allocated on first use and never freed: a key read after its runtime was
/// released still names memory that is a slot.
static CHUNK_PTRS: [AtomicPtr<RuntimeSlot>; CHUNKS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];

/// Slot indices: never used yet from `next` on, and released ones whose generation can grow.
struct SlotAlloc {
    next: usize,
    free: Vec<usize>,
}

static SLOT_ALLOC: Mutex<SlotAlloc> = Mutex::new(SlotAlloc {
    next: 0,
    free: Vec::new(),
});

fn slot(index: usize) -> Option<&'static RuntimeSlot> {
    let chunk = CHUNK_PTRS.get(index / CHUNK)?.load(Ordering::Acquire);
    // SAFETY: a non-null chunk pointer is a leaked `[RuntimeSlot; CHUNK]`, never freed.
    (!chunk.is_null()).then(|| unsafe { &*chunk.add(index % CHUNK) })
}

fn key_of(index: usize, generation: u32) -> usize {
    RUNTIME_TAG | (generation as usize) << (INDEX_BITS + 4) | index << 4
}

/// (slot index, generation) of a runtime key, or None when `key` cannot be one.
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

fn register_runtime(rt: Arc<Runtime>) -> usize {
    let index = {
        let mut a = SLOT_ALLOC.lock().unwrap_or_else(|p| p.into_inner());
        match a.free.pop() {
            Some(i) => i,
            None => {
                let i = a.next;
                assert!(
                    i < CHUNKS * CHUNK,
                    "more than {} runtimes alive at once",
                    CHUNKS * CHUNK
                );
                a.next += 1;
                let cell = &CHUNK_PTRS[i / CHUNK];
                if cell.load(Ordering::Relaxed).is_null() {
                    let chunk: Box<[RuntimeSlot]> = (0..CHUNK)
                        .map(|_| {
                            StateLock::new(SlotState {
                                generation: 0,
                                runtime: None,
                            })
                        })
                        .collect();
                    cell.store(Box::leak(chunk).as_mut_ptr(), Ordering::Release);
                }
                i
            }
        }
    };
    let mut s = slot(index).expect("the slot's chunk was made above").lock();
    s.generation += 1;
    s.runtime = Some(rt);
    key_of(index, s.generation)
}

/// A runtime pinned in its slot for a call: the slot's lock is held until drop.
pub struct PinnedRuntime(StateGuard<'static, SlotState>);

impl PinnedRuntime {
    /// An owned reference, and the slot unpinned: for calls that may wait.
    pub fn into_owned(self) -> Arc<Runtime> {
        Arc::clone(self.arc())
    }

    fn arc(&self) -> &Arc<Runtime> {
        self.0
            .runtime
            .as_ref()
            .expect("a pinned slot holds its runtime")
    }
}

impl std::ops::Deref for PinnedRuntime {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        self.arc()
    }
}

/// The live runtime of `key`, pinned in its slot: hold it only for work that does not wait
/// (`into_owned` first otherwise), since a release of the handle waits for it.
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
    // Inside a host callback a busy slot is an error, never a wait: its holder may be in a pool
    // operation that waits for the device, which (on the host backend) waits for the callback.
    let s = state_lock_for_call(slot(index).ok_or_else(not_live)?, "runtime")?;
    if s.generation != generation || s.runtime.is_none() {
        return Err(not_live());
    }
    Ok(PinnedRuntime(s))
}

fn release_runtime(key: usize) -> Result<()> {
    let mut pinned = pin_runtime(key)?;
    let rt = pinned.0.runtime.take();
    drop(pinned);
    let (index, generation) = decode(key).expect("pinned above");
    // A slot whose generations are used up is never named again, so no key is ever reused.
    if generation + 1 < (1 << GENERATION_BITS) {
        SLOT_ALLOC
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free
            .push(index);
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
        let a = register(Object::Runtime(host_runtime()));
        release(a, "runtime").unwrap();
        let b = register(Object::Runtime(host_runtime()));
        assert_ne!(a, b, "a key is never handed out twice");
        assert!(message(runtime(a)).contains("not live"));
        assert!(message(release(a, "runtime")).contains("not live"));
        assert!(runtime(b).is_ok());
        // Keys that cannot name a runtime, or name a slot no runtime ever used.
        for bogus in [
            RUNTIME_TAG | 0x10,
            RUNTIME_TAG | 0x18,
            RUNTIME_TAG | 1 << 60,
            RUNTIME_TAG | ((CHUNKS * CHUNK - 1) << 4) | 1 << 24,
            0x1234_5670,
        ] {
            let e = message(pin_runtime(bogus));
            assert!(e.contains("not live"), "{bogus:#x}: {e}");
        }
        // A runtime where a graph is wanted, a graph where a runtime is.
        assert!(message(graph(b)).contains("is a runtime, not a graph"));
        let g = register(Object::Graph(Arc::new(Mutex::new(RuntimeGraph::new(
            runtime(b).unwrap(),
        )))));
        assert!(message(runtime(g)).contains("is a graph, not a runtime"));
        assert!(message(release(g, "runtime")).contains("is a graph, not a runtime"));
        release(g, "graph").unwrap();
        release(b, "runtime").unwrap();
    }

    /// A host callback that meets its runtime's slot busy gets an error at once: the holder may
    /// be waiting for the device, which on the host backend waits for the callback.
    #[test]
    fn a_callback_never_waits_for_a_pinned_runtime() {
        use crate::kernels::{call_callback, CallbackArgs, HostCallback};
        let key = register(Object::Runtime(host_runtime()));
        unsafe extern "C" fn stats_of(_: *const CallbackArgs, key: *mut std::ffi::c_void) -> i32 {
            let mut s = crate::capi::types::gkrt_stats::default();
            // SAFETY: s is a valid out-pointer; the handle is only a key.
            unsafe { crate::capi::gkrt_runtime_stats(key.cast(), &mut s) as i32 }
        }
        let cb = HostCallback {
            func: stats_of,
            user_data: key,
        };
        // SAFETY: every field is a pointer or an integer, for which zero is valid; `stats_of`
        // reads none of them.
        let args: CallbackArgs = unsafe { std::mem::zeroed() };
        let pinned = pin_runtime(key).unwrap();
        let status = unsafe { call_callback(cb, &args) };
        assert_eq!(status, gkrt_status::GKRT_STATUS_INVALID_STATE as i32);
        let mut msg = [0u8; 256];
        let n = unsafe { crate::capi::gkrt_last_error_message(msg.as_mut_ptr().cast(), 256) };
        assert!(String::from_utf8_lossy(&msg[..n.min(255)]).contains("busy"));
        drop(pinned);
        // Free again, the same call from a callback works.
        assert_eq!(unsafe { call_callback(cb, &args) }, 0);
        release(key, "runtime").unwrap();
    }

    /// Raw calls racing with the release of their runtime's handle: each call either works or
    /// says the handle is not live; none crashes, and after the release every call fails.
    #[test]
    fn raw_calls_racing_a_release_fail_cleanly() {
        let mut worked = 0;
        for round in 0..20 {
            let key = register(Object::Runtime(host_runtime()));
            let handle = key as *mut crate::capi::types::gkrt_runtime;
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
            std::thread::sleep(std::time::Duration::from_micros(50 * (round % 5)));
            release(key, "runtime").unwrap();
            let (ok, refused) = worker.join().unwrap();
            assert!(refused > 100);
            worked += ok;
            let mut p = std::ptr::null_mut();
            let st = unsafe { gkrt_malloc(handle, 64, std::ptr::null_mut(), &mut p) };
            assert_eq!(st, gkrt_status::GKRT_STATUS_INVALID_ARGUMENT);
            assert!(p.is_null(), "out is written only on success");
        }
        assert!(worked > 0, "some calls ran before their release");
    }
}
