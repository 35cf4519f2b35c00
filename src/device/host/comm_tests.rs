//! The host model of a communicator: every collective at 2, 4 and 8 ranks (threads, jitter on)
//! against a plain reference written here, and every way a rank can fail the others.

use super::*;
use crate::device::comm::{CommOptions, DType, ReduceOp};
use crate::device::host::{HostDevice, HostOptions};
use crate::kernels::collective::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use std::sync::Barrier;

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::I32];
const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

fn options(ms: u64) -> CommOptions {
    CommOptions {
        timeout: Duration::from_millis(ms),
    }
}

/// One rank's world: its device, a stream, and its communicator.
struct Rank {
    device: HostDevice,
    stream: StreamId,
    comm: Arc<dyn Communicator>,
}

impl Rank {
    fn upload(&self, bytes: &[u8]) -> u64 {
        let p = self
            .device
            .alloc_segment(bytes.len().max(1) as u64)
            .unwrap();
        unsafe {
            self.device
                .copy_h2d_async(p, bytes.as_ptr(), bytes.len() as u64, self.stream)
                .unwrap()
        };
        self.device.stream_synchronize(self.stream).unwrap();
        p
    }

    fn download(&self, p: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        unsafe {
            self.device
                .copy_d2h_async(out.as_mut_ptr(), p, len as u64, self.stream)
                .unwrap()
        };
        self.device.stream_synchronize(self.stream).unwrap();
        out
    }

    fn run(&self, calls: &[Collective]) -> DeviceResult<()> {
        self.comm.enqueue(&self.device, calls, self.stream)?;
        self.device.stream_synchronize(self.stream)
    }
}

/// Runs `body` on `n` ranks (threads) of one fresh communicator, with jitter on every stream.
fn with_ranks<T: Send>(n: u32, body: impl Fn(&Rank) -> T + Sync) -> Vec<T> {
    let id = unique_id();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let body = &body;
                s.spawn(move || {
                    let device = HostDevice::new(HostOptions {
                        jitter_us: 30,
                        seed: 7 + r as u64,
                        total_memory: 0,
                    });
                    let stream = device.create_stream().unwrap();
                    let comm = init_rank(&id, r, n, options(20_000)).unwrap();
                    body(&Rank {
                        device,
                        stream,
                        comm,
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `r`'s element `i`, as a float: small values with fractions, so that sums round and
/// products stay finite; a few negative.
fn value(r: u32, i: u64) -> f32 {
    ((r as u64 * 31 + i * 7) % 13) as f32 * 0.37 - 1.5
}

fn encode(dtype: DType, v: f32) -> Vec<u8> {
    match dtype {
        DType::F32 => v.to_ne_bytes().to_vec(),
        DType::F16 => f32_to_f16(v).to_ne_bytes().to_vec(),
        DType::BF16 => f32_to_bf16(v).to_ne_bytes().to_vec(),
        DType::I32 => ((v * 4.0) as i32).to_ne_bytes().to_vec(),
    }
}

fn data(dtype: DType, r: u32, elems: u64) -> Vec<u8> {
    (0..elems)
        .flat_map(|i| encode(dtype, value(r, i)))
        .collect()
}

/// The plain reference: element by element, ranks folded in order, one operation at a time in
/// the type (halves through f32), the average divided once at the end.
fn reference_reduce(op: ReduceOp, dtype: DType, parts: &[Vec<u8>]) -> Vec<u8> {
    let size = dtype.size() as usize;
    let n = parts.len();
    let elems = parts[0].len() / size;
    let mut out = Vec::new();
    for i in 0..elems {
        let at = |k: usize| &parts[k][i * size..(i + 1) * size];
        if dtype == DType::I32 {
            let get = |k: usize| i32::from_ne_bytes(at(k).try_into().unwrap());
            let mut acc = get(0);
            for k in 1..n {
                let b = get(k);
                acc = match op {
                    ReduceOp::Sum | ReduceOp::Avg => acc.wrapping_add(b),
                    ReduceOp::Prod => acc.wrapping_mul(b),
                    ReduceOp::Min => acc.min(b),
                    ReduceOp::Max => acc.max(b),
                };
            }
            if op == ReduceOp::Avg {
                acc /= n as i32;
            }
            out.extend_from_slice(&acc.to_ne_bytes());
            continue;
        }
        let get = |k: usize| -> f32 {
            match dtype {
                DType::F32 => f32::from_ne_bytes(at(k).try_into().unwrap()),
                DType::F16 => f16_to_f32(u16::from_ne_bytes(at(k).try_into().unwrap())),
                _ => bf16_to_f32(u16::from_ne_bytes(at(k).try_into().unwrap())),
            }
        };
        let round = |v: f32| -> f32 {
            match dtype {
                DType::F32 => v,
                DType::F16 => f16_to_f32(f32_to_f16(v)),
                _ => bf16_to_f32(f32_to_bf16(v)),
            }
        };
        let mut acc = get(0);
        for k in 1..n {
            let b = get(k);
            acc = round(match op {
                ReduceOp::Sum | ReduceOp::Avg => acc + b,
                ReduceOp::Prod => acc * b,
                ReduceOp::Min => acc.min(b),
                ReduceOp::Max => acc.max(b),
            });
        }
        if op == ReduceOp::Avg {
            acc = round(acc / n as f32);
        }
        out.extend(encode_exact(dtype, acc));
    }
    out
}

fn encode_exact(dtype: DType, v: f32) -> Vec<u8> {
    match dtype {
        DType::F32 => v.to_ne_bytes().to_vec(),
        DType::F16 => f32_to_f16(v).to_ne_bytes().to_vec(),
        _ => f32_to_bf16(v).to_ne_bytes().to_vec(),
    }
}

fn call(kind: CollectiveKind, dtype: DType, count: u64, send: u64, recv: u64) -> Collective {
    Collective {
        kind,
        dtype,
        count,
        send,
        recv,
        node: crate::kernels::collective::NO_NODE,
    }
}

/// Every collective, type and operator on `n` ranks against the reference.
fn every_collective(n: u32) {
    const COUNT: u64 = 37;
    let all: Vec<Vec<u8>> = with_ranks(n, |rk| {
        let r = rk.comm.rank();
        assert_eq!(rk.comm.nranks(), n);
        let mut failures = Vec::new();
        let mut check = |what: String, got: Vec<u8>, want: Vec<u8>| {
            if got != want {
                failures.push(what);
            }
        };
        for dtype in DTYPES {
            let size = dtype.size() as usize;
            let parts: Vec<Vec<u8>> = (0..n).map(|k| data(dtype, k, COUNT)).collect();
            let bytes = COUNT as usize * size;
            for op in OPS {
                let want = reference_reduce(op, dtype, &parts);
                // Out of place.
                let send = rk.upload(&parts[r as usize]);
                let recv = rk.upload(&vec![0xAB; bytes]);
                rk.run(&[call(
                    CollectiveKind::AllReduce(op),
                    dtype,
                    COUNT,
                    send,
                    recv,
                )])
                .unwrap();
                check(
                    format!("all-reduce {op:?} {dtype:?}"),
                    rk.download(recv, bytes),
                    want.clone(),
                );
                check(
                    format!("all-reduce {op:?} {dtype:?} left its input alone"),
                    rk.download(send, bytes),
                    parts[r as usize].clone(),
                );
                // In place.
                rk.run(&[call(
                    CollectiveKind::AllReduce(op),
                    dtype,
                    COUNT,
                    send,
                    send,
                )])
                .unwrap();
                check(
                    format!("in-place all-reduce {op:?} {dtype:?}"),
                    rk.download(send, bytes),
                    want.clone(),
                );
                // Reduce to the last rank: the others' receive buffers stay as they were.
                let send = rk.upload(&parts[r as usize]);
                let recv = rk.upload(&vec![0xCD; bytes]);
                let root = n - 1;
                rk.run(&[call(
                    CollectiveKind::Reduce { op, root },
                    dtype,
                    COUNT,
                    send,
                    recv,
                )])
                .unwrap();
                check(
                    format!("reduce {op:?} {dtype:?} to {root}"),
                    rk.download(recv, bytes),
                    if r == root {
                        want.clone()
                    } else {
                        vec![0xCD; bytes]
                    },
                );
                // Reduce-scatter: every rank sends COUNT × n, gets its slice of the reduction.
                let big: Vec<Vec<u8>> = (0..n)
                    .map(|k| data(dtype, k + 100, COUNT * n as u64))
                    .collect();
                let whole = reference_reduce(op, dtype, &big);
                let send = rk.upload(&big[r as usize]);
                let recv = rk.upload(&vec![0; bytes]);
                rk.run(&[call(
                    CollectiveKind::ReduceScatter(op),
                    dtype,
                    COUNT,
                    send,
                    recv,
                )])
                .unwrap();
                check(
                    format!("reduce-scatter {op:?} {dtype:?}"),
                    rk.download(recv, bytes),
                    whole[r as usize * bytes..(r as usize + 1) * bytes].to_vec(),
                );
            }
            // All-gather: rank order.
            let send = rk.upload(&parts[r as usize]);
            let recv = rk.upload(&vec![0; bytes * n as usize]);
            rk.run(&[call(CollectiveKind::AllGather, dtype, COUNT, send, recv)])
                .unwrap();
            check(
                format!("all-gather {dtype:?}"),
                rk.download(recv, bytes * n as usize),
                parts.concat(),
            );
            // Broadcast from rank 1, in place.
            let buf = rk.upload(&parts[r as usize]);
            rk.run(&[call(
                CollectiveKind::Broadcast { root: 1 },
                dtype,
                COUNT,
                buf,
                buf,
            )])
            .unwrap();
            check(
                format!("broadcast {dtype:?}"),
                rk.download(buf, bytes),
                parts[1].clone(),
            );
            // A ring exchange in one group: send to the next rank, receive from the previous.
            let send = rk.upload(&parts[r as usize]);
            let recv = rk.upload(&vec![0; bytes]);
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            rk.run(&[
                call(CollectiveKind::Recv { peer: prev }, dtype, COUNT, 0, recv),
                call(CollectiveKind::Send { peer: next }, dtype, COUNT, send, 0),
            ])
            .unwrap();
            check(
                format!("send/recv {dtype:?}"),
                rk.download(recv, bytes),
                parts[prev as usize].clone(),
            );
        }
        assert!(failures.is_empty(), "rank {r}: wrong results: {failures:?}");
        // What every rank ends with, to compare across ranks.
        rk.download(rk.upload(&[1, 2, 3]), 3)
    });
    assert_eq!(all.len(), n as usize);
}

#[test]
fn every_collective_on_2_ranks() {
    every_collective(2);
}

#[test]
fn every_collective_on_4_ranks() {
    every_collective(4);
}

#[test]
fn every_collective_on_8_ranks() {
    every_collective(8);
}

#[test]
fn one_rank_is_a_copy() {
    with_ranks(1, |rk| {
        let a = rk.upload(&data(DType::F32, 0, 8));
        let b = rk.upload(&[0; 32]);
        rk.run(&[call(
            CollectiveKind::AllReduce(ReduceOp::Avg),
            DType::F32,
            8,
            a,
            b,
        )])
        .unwrap();
        assert_eq!(rk.download(b, 32), data(DType::F32, 0, 8));
    });
}

#[test]
fn a_group_of_all_reduces_runs_as_consecutive_rounds() {
    with_ranks(4, |rk| {
        let r = rk.comm.rank();
        let a = rk.upload(&data(DType::I32, r, 5));
        let b = rk.upload(&data(DType::F32, r, 3));
        rk.run(&[
            call(
                CollectiveKind::AllReduce(ReduceOp::Sum),
                DType::I32,
                5,
                a,
                a,
            ),
            call(
                CollectiveKind::AllReduce(ReduceOp::Max),
                DType::F32,
                3,
                b,
                b,
            ),
        ])
        .unwrap();
        let pa: Vec<Vec<u8>> = (0..4).map(|k| data(DType::I32, k, 5)).collect();
        let pb: Vec<Vec<u8>> = (0..4).map(|k| data(DType::F32, k, 3)).collect();
        assert_eq!(
            rk.download(a, 20),
            reference_reduce(ReduceOp::Sum, DType::I32, &pa)
        );
        assert_eq!(
            rk.download(b, 12),
            reference_reduce(ReduceOp::Max, DType::F32, &pb)
        );
    });
}

#[test]
fn different_collectives_are_an_error_on_every_rank_not_a_hang() {
    let errors = with_ranks(2, |rk| {
        let r = rk.comm.rank();
        let count = if r == 0 { 4 } else { 8 };
        let a = rk.upload(&[0; 32]);
        let e = rk
            .run(&[call(
                CollectiveKind::AllReduce(ReduceOp::Sum),
                DType::F32,
                count,
                a,
                a,
            )])
            .unwrap_err();
        // The communicator is aborted: later calls fail at once.
        assert!(rk.comm.aborted().is_some());
        assert!(matches!(
            rk.comm.enqueue(&rk.device, &[], rk.stream),
            Err(DeviceError::PeerFailed(_))
        ));
        e.to_string()
    });
    for e in errors {
        assert!(e.contains("collective #0 differs between ranks"), "{e}");
        assert!(e.contains("4 f32") && e.contains("8 f32"), "{e}");
    }
}

#[test]
fn an_abort_wakes_a_rank_waiting_in_a_collective() {
    let id = unique_id();
    let ready = Barrier::new(2);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let d = HostDevice::new(HostOptions::default());
            let st = d.create_stream().unwrap();
            let c = init_rank(&id, 1, 2, options(60_000)).unwrap();
            let p = d.alloc_segment(64).unwrap();
            let call = call(
                CollectiveKind::AllReduce(ReduceOp::Sum),
                DType::F32,
                4,
                p,
                p,
            );
            c.enqueue(&d, &[call], st).unwrap();
            ready.wait();
            let t = Instant::now();
            let e = d.stream_synchronize(st).unwrap_err();
            (e.to_string(), t.elapsed())
        });
        let c = init_rank(&id, 0, 2, options(60_000)).unwrap();
        ready.wait();
        std::thread::sleep(Duration::from_millis(20));
        c.abort("a callback failed");
        let (e, waited) = waiter.join().unwrap();
        assert!(e.contains("rank 0 aborted: a callback failed"), "{e}");
        assert!(waited < Duration::from_secs(10), "waited {waited:?}");
    });
}

#[test]
fn a_rank_that_leaves_fails_the_others_and_a_new_communicator_works() {
    let id = unique_id();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let d = HostDevice::new(HostOptions::default());
            let st = d.create_stream().unwrap();
            let c = init_rank(&id, 1, 2, options(60_000)).unwrap();
            let p = d.alloc_segment(64).unwrap();
            let calls = [call(CollectiveKind::Recv { peer: 0 }, DType::F32, 4, 0, p)];
            c.enqueue(&d, &calls, st).unwrap();
            d.stream_synchronize(st).unwrap_err().to_string()
        });
        let c = init_rank(&id, 0, 2, options(60_000)).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        drop(c);
        let e = waiter.join().unwrap();
        assert!(e.contains("rank 0, which has left"), "{e}");
    });
    // The id is used up; a new one makes a working communicator.
    assert!(init_rank(&id, 0, 2, options(50)).is_err());
    with_ranks(2, |rk| {
        let p = rk.upload(&data(DType::F32, rk.comm.rank(), 4));
        rk.run(&[call(
            CollectiveKind::Broadcast { root: 0 },
            DType::F32,
            4,
            p,
            p,
        )])
        .unwrap();
        assert_eq!(rk.download(p, 16), data(DType::F32, 0, 4));
    });
}

#[test]
fn a_rank_that_never_joins_times_out() {
    let id = unique_id();
    let t = Instant::now();
    let e = init_rank(&id, 0, 3, options(100)).err().unwrap();
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert!(matches!(e, DeviceError::PeerFailed(_)), "{e}");
    assert!(e.to_string().contains("rank(s) 1, 2 to join"), "{e}");
}

#[test]
fn a_collective_another_rank_never_reaches_times_out() {
    let id = unique_id();
    let ready = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let _c = init_rank(&id, 1, 2, options(200)).unwrap();
            // Joins, then issues nothing until rank 0 has failed.
            ready.wait();
        });
        let d = HostDevice::new(HostOptions::default());
        let st = d.create_stream().unwrap();
        let c = init_rank(&id, 0, 2, options(200)).unwrap();
        let p = d.alloc_segment(64).unwrap();
        let calls = [call(CollectiveKind::AllGather, DType::I32, 2, p, p)];
        c.enqueue(&d, &calls, st).unwrap();
        let e = d.stream_synchronize(st).unwrap_err().to_string();
        ready.wait();
        assert!(
            e.contains("timed out after 200 ms waiting for rank(s) 1 to reach collective #0"),
            "{e}"
        );
    });
}

#[test]
fn bad_joins_are_refused() {
    let id = unique_id();
    let bad = |r, n| init_rank(&id, r, n, options(50)).err().unwrap().to_string();
    assert!(bad(2, 2).contains("rank 2 of 2"));
    assert!(bad(0, 0).contains("at least 1"));
    let not_ours = UniqueId([7; UNIQUE_ID_BYTES]);
    assert!(init_rank(&not_ours, 0, 1, options(50))
        .err()
        .unwrap()
        .to_string()
        .contains("not made by gkrt_comm_get_unique_id"));
    std::thread::scope(|s| {
        let first = s.spawn(|| init_rank(&id, 0, 2, options(300)).err().unwrap());
        std::thread::sleep(Duration::from_millis(50));
        let other_size = init_rank(&id, 1, 3, options(50)).err().unwrap().to_string();
        assert!(other_size.contains("started with 2"), "{other_size}");
        let twice = init_rank(&id, 0, 2, options(50)).err().unwrap().to_string();
        assert!(twice.contains("rank 0 has already joined"), "{twice}");
        first.join().unwrap();
    });
    // A root or peer outside the communicator is refused when queued.
    with_ranks(2, |rk| {
        let p = rk.upload(&[0; 16]);
        for kind in [
            CollectiveKind::Broadcast { root: 2 },
            CollectiveKind::Send { peer: 5 },
            CollectiveKind::Recv {
                peer: rk.comm.rank(),
            },
        ] {
            let e = rk
                .comm
                .enqueue(&rk.device, &[call(kind, DType::F32, 4, p, p)], rk.stream)
                .unwrap_err();
            assert!(matches!(e, DeviceError::Invalid(_)), "{e}");
        }
        rk.device.stream_synchronize(rk.stream).unwrap();
    });
}
