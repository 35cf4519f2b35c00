//! Registration of device memory with communicators, on the host backend: every segment alive
//! when a communicator is made, or allocated after, is registered with it, and deregistered
//! before its memory is freed.

use super::comm::{self, HostComm};
use super::*;
use crate::device::comm::{CommOptions, UniqueId};
use std::collections::BTreeMap;
use std::time::Duration;

/// A communicator stand-in that records what is registered, and whether each range was still
/// allocated by the device when it was deregistered.
struct Recorder {
    device: Arc<HostDevice>,
    registered: Mutex<BTreeMap<DevPtr, u64>>,
    /// Deregistrations of memory the device had already freed (must stay empty).
    late: Mutex<Vec<DevPtr>>,
    registrations: Mutex<u32>,
}

impl Registrable for Recorder {
    fn register(&self, addr: DevPtr, bytes: u64) {
        *self.registrations.lock().unwrap() += 1;
        self.registered.lock().unwrap().insert(addr, bytes);
    }

    fn deregister(&self, addr: DevPtr) {
        if !self.device.segments.lock().unwrap().contains_key(&addr) {
            self.late.lock().unwrap().push(addr);
        }
        self.registered.lock().unwrap().remove(&addr);
    }
}

fn recorder(device: &Arc<HostDevice>) -> Arc<Recorder> {
    Arc::new(Recorder {
        device: Arc::clone(device),
        registered: Mutex::new(BTreeMap::new()),
        late: Mutex::new(Vec::new()),
        registrations: Mutex::new(0),
    })
}

fn ranges(r: &Recorder) -> Vec<(DevPtr, u64)> {
    r.registered
        .lock()
        .unwrap()
        .iter()
        .map(|(&a, &b)| (a, b))
        .collect()
}

#[test]
fn ranges_before_and_after_a_communicator_are_registered_and_deregistered_before_free() {
    let device = Arc::new(HostDevice::new(HostOptions::default()));
    let a = device.alloc_segment(4096).unwrap();
    let rec = recorder(&device);
    let as_registrable: Arc<dyn Registrable> = rec.clone();
    device.registrations.attach(&as_registrable);
    drop(as_registrable);
    // Alive before the communicator: registered when it attaches.
    assert_eq!(ranges(&rec), vec![(a, 4096)]);
    // Allocated after: registered too.
    let b = device.alloc_segment(8192).unwrap();
    let mut want = vec![(a, 4096), (b, 8192)];
    want.sort();
    assert_eq!(ranges(&rec), want);
    // Freed: deregistered first, while the device still had it.
    device.free_segment(a, 4096).unwrap();
    assert_eq!(ranges(&rec), vec![(b, 8192)]);
    // A free the device refuses (wrong size) leaves the registration alone.
    assert!(device.free_segment(b, 1).is_err());
    assert_eq!(ranges(&rec), vec![(b, 8192)]);
    device.free_segment(b, 8192).unwrap();
    assert!(ranges(&rec).is_empty());
    assert!(
        rec.late.lock().unwrap().is_empty(),
        "deregistered after free"
    );
    assert_eq!(*rec.registrations.lock().unwrap(), 2);
    // A communicator that is gone is skipped and forgotten.
    assert_eq!(device.registrations.communicators(), 1);
    drop(rec);
    assert_eq!(device.registrations.communicators(), 0);
    let c = device.alloc_segment(512).unwrap();
    device.free_segment(c, 512).unwrap();
}

#[test]
fn host_communicators_register_the_devices_segments() {
    let device = Arc::new(HostDevice::new(HostOptions::default()));
    let a = device.alloc_segment(1024).unwrap();
    let id: UniqueId = comm::unique_id();
    let options = CommOptions {
        timeout: Duration::from_secs(5),
    };
    let joined: Arc<HostComm> = comm::join(&id, 0, 1, options).unwrap();
    let as_registrable: Arc<dyn Registrable> = joined.clone();
    device.registrations.attach(&as_registrable);
    let b = device.alloc_segment(2048).unwrap();
    let mut want = vec![(a, 1024), (b, 2048)];
    want.sort();
    assert_eq!(joined.registered(), want);
    device.free_segment(a, 1024).unwrap();
    assert_eq!(joined.registered(), vec![(b, 2048)]);
    device.free_segment(b, 2048).unwrap();
    assert!(joined.registered().is_empty());

    // The device's own comm_init_rank attaches what it makes.
    let id = device.comm_unique_id().unwrap();
    let made = device.comm_init_rank(&id, 0, 1, options).unwrap();
    assert_eq!(device.registrations.communicators(), 2);
    drop(made);
    drop(as_registrable);
    drop(joined);
    assert_eq!(device.registrations.communicators(), 0);
}
