//! Handles: every object the C API hands out is an entry in one table, and the pointer the
//! caller holds is an opaque key into it, never a Rust address. A released or made-up handle
//! is therefore an error, not a use-after-free: keys are never reused, so releasing twice is
//! detected too. The table is the only process-wide state and holds no runtime state itself.

use crate::kernels::Kernel;
use crate::runtime::{Error, Result, Runtime, RuntimeGraph};
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
    let key = NEXT_KEY.fetch_add(16, Ordering::Relaxed);
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

pub fn runtime(key: usize) -> Result<Arc<Runtime>> {
    match lookup(key, "runtime")? {
        Object::Runtime(r) => Ok(r),
        _ => unreachable!(),
    }
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
