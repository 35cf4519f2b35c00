//! NCCL on the CUDA backend. `library_missing_or_present` runs anywhere; the `gpu_nccl_*` tests
//! need a GPU and libnccl 2.28+ reachable as `libnccl.so` (`scripts/gpu/run.sh nccl` runs them
//! with a link to python's libnccl.so.2; the plain `tests` mode skips them).

use super::super::nccl as cuda_nccl;
use super::*;
use crate::device::comm::{Collective, CollectiveKind, CommOptions, DType, ReduceOp};
use std::time::{Duration, Instant};

fn options(ms: u64) -> CommOptions {
    CommOptions {
        timeout: Duration::from_millis(ms),
    }
}

fn all_reduce(op: ReduceOp, send: DevPtr, recv: DevPtr, count: u64) -> Collective {
    Collective {
        kind: CollectiveKind::AllReduce(op),
        dtype: DType::F32,
        count,
        send,
        recv,
        node: u32::MAX,
    }
}

#[test]
fn library_missing_or_present() {
    // SAFETY: only dlopen-s candidates.
    let present = unsafe { cudarc::nccl::sys::is_culib_present() };
    match cuda_nccl::unique_id() {
        Ok(_) => assert!(present),
        Err(DeviceError::Unsupported(m)) if !present => {
            // The message names every name the loader was asked for.
            for name in cudarc::get_lib_name_candidates("nccl") {
                assert!(m.contains(&name), "{m} does not name {name}");
            }
        }
        Err(e) => {
            // Present but too old is Unsupported too, naming the version.
            assert!(present, "{e}");
            assert!(e.to_string().contains("2.28"), "{e}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl"]
fn gpu_nccl_one_rank_all_reduce_and_registration() {
    let d = gpu();
    let s = d.create_stream().unwrap();
    let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 3.0).collect();
    let before = upload(&d, s, &x);
    let id = d.comm_unique_id().unwrap();
    let comm = d.comm_init_rank(&id, 0, 1, options(20_000)).unwrap();
    assert_eq!((comm.rank(), comm.nranks()), (0, 1));
    assert_eq!(d.registrations.communicators(), 1);
    let out = alloc_f32(&d, x.len());
    for op in [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ] {
        comm.enqueue(&d, &[all_reduce(op, before, out, x.len() as u64)], s)
            .unwrap();
        d.stream_synchronize(s).unwrap();
        // One rank: every reduction is the input.
        assert_bits_eq(&download(&d, s, out, x.len()), &x, op.name());
    }
    // In place, two calls in one group.
    let other = upload(&d, s, &x);
    comm.enqueue(
        &d,
        &[
            all_reduce(ReduceOp::Sum, other, other, x.len() as u64),
            all_reduce(ReduceOp::Max, before, before, x.len() as u64),
        ],
        s,
    )
    .unwrap();
    d.stream_synchronize(s).unwrap();
    assert_bits_eq(&download(&d, s, other, x.len()), &x, "in place");
    for p in [before, out, other] {
        d.free_segment(p, (x.len() * 4) as u64).unwrap();
    }
    assert!(comm.aborted().is_none());
    drop(comm);
    assert_eq!(d.registrations.communicators(), 0);
    d.destroy_stream(s).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl"]
fn gpu_nccl_join_alone_times_out() {
    let d = gpu();
    let id = d.comm_unique_id().unwrap();
    let t0 = Instant::now();
    let r = d.comm_init_rank(&id, 0, 2, options(2_000));
    let took = t0.elapsed();
    match r {
        Err(DeviceError::PeerFailed(m)) => assert!(m.contains("timed out"), "{m}"),
        Err(e) => panic!("want PeerFailed, got {e}"),
        Ok(_) => panic!("a rank alone joined a communicator of two"),
    }
    assert!(took < Duration::from_secs(15), "took {took:?}");
    // The device still works.
    let s = d.create_stream().unwrap();
    let p = upload(&d, s, &[1.0, 2.0]);
    assert_eq!(download(&d, s, p, 2), vec![1.0, 2.0]);
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl"]
fn gpu_nccl_abort_fails_later_calls() {
    let d = gpu();
    let s = d.create_stream().unwrap();
    let id = d.comm_unique_id().unwrap();
    let comm = d.comm_init_rank(&id, 0, 1, options(20_000)).unwrap();
    comm.abort("test");
    assert!(comm.aborted().unwrap().contains("test"));
    let p = upload(&d, s, &[1.0; 16]);
    match comm.enqueue(&d, &[all_reduce(ReduceOp::Sum, p, p, 16)], s) {
        Err(DeviceError::PeerFailed(m)) => assert!(m.contains("aborted"), "{m}"),
        other => panic!("want PeerFailed, got {other:?}"),
    }
    drop(comm);
    d.free_segment(p, 64).unwrap();
}

extern "C" fn block_stream(_: *mut std::ffi::c_void) {
    std::thread::sleep(Duration::from_millis(2_000));
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl"]
fn gpu_nccl_outstanding_collective_times_out_and_sync_fails() {
    let d = gpu();
    let s = d.create_stream().unwrap();
    let id = d.comm_unique_id().unwrap();
    let comm = d.comm_init_rank(&id, 0, 1, options(300)).unwrap();
    let p = upload(&d, s, &[1.0; 256]);
    // The stream is held 2 s by a host function, so the collective queued after it stays
    // outstanding past the 300 ms timeout: the watchdog aborts, and the sync says why.
    let native = d.native_stream(s).unwrap() as sys::CUstream;
    d.bind().unwrap();
    // SAFETY: live stream; the callback touches nothing.
    check("cuLaunchHostFunc", unsafe {
        sys::cuLaunchHostFunc(native, Some(block_stream), std::ptr::null_mut())
    })
    .unwrap();
    comm.enqueue(&d, &[all_reduce(ReduceOp::Sum, p, p, 256)], s)
        .unwrap();
    match d.stream_synchronize(s) {
        Err(DeviceError::PeerFailed(m)) => assert!(m.contains("timed out"), "{m}"),
        other => panic!("want PeerFailed, got {other:?}"),
    }
    assert!(comm.aborted().is_some());
    // Reported once; the stream works again.
    d.stream_synchronize(s).unwrap();
    drop(comm);
    d.free_segment(p, 1024).unwrap();
}
