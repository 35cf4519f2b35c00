//! Handles: every object the C API hands out is an entry in one table, and the pointer the
//! caller holds is an opaque key into it, never a Rust address. A released or made-up handle
//! is therefore an error, not a use-after-free: keys are never reused, so releasing twice is
//! detected too. The table is the only process-wide state and holds no runtime state itself.

use crate::kernels::Kernel;
use crate::runtime::{Error, Result, Runtime, RuntimeGraph};
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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

static TABLE: Lazy<Mutex<HashMap<usize, Object>>> = Lazy::new(|| Mutex::new(HashMap::new()));
/// Keys start high and step by 16 so they look like (and are sized like) aligned pointers.
static NEXT_KEY: AtomicUsize = AtomicUsize::new(0x10_0000);

fn table() -> std::sync::MutexGuard<'static, HashMap<usize, Object>> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn register(obj: Object) -> usize {
    let key = NEXT_KEY.fetch_add(16, Ordering::Relaxed);
    table().insert(key, obj);
    key
}

fn lookup(key: usize, want: &'static str) -> Result<Object> {
    if key == 0 {
        return Err(Error::InvalidArgument(format!("{want} handle is NULL")));
    }
    match table().get(&key) {
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
    let obj = table().remove(&key);
    drop(obj);
    Ok(())
}
