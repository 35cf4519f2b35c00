//! Fused collective inputs on the host backend's communicator model (2, 4 and 8 ranks as
//! threads, jitter on): the members of a fused all-reduce sit back to back in the order given
//! (seen by a callback kernel that reads their pointers), the results match a direct
//! computation, the executor's pool calls equal the program's dry run (one block per group,
//! allocated at the first producer of any member), and nothing outlives the run.

mod common;
use common::*;

use gkrt::runtime::{
    Buf, BuiltinKind, CallbackArgs, CollectiveKind, Comm, DType, HostCallback, Kernel, MemoryMode,
    PoolCall, ReduceOp, Runtime, RuntimeGraph, TensorKind,
};
use std::ffi::c_void;
use std::sync::Arc;

/// Elements of the in-place group's members (in the order given) and the out-of-place group's.
const SUM_SIZES: [usize; 3] = [16, 40, 8];
const MAX_SIZES: [usize; 2] = [24, 12];

fn input(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| (rank * 5 + i) as f32 * 0.5 - 7.0).collect()
}

/// Concatenates its inputs into output 0 and writes each input's address into output 1 (u64
/// each): the test reads back where the runtime put them.
unsafe extern "C" fn gather_with_addresses(args: *const CallbackArgs, _: *mut c_void) -> i32 {
    let a = &*args;
    let inputs = std::slice::from_raw_parts(a.inputs, a.num_inputs);
    let outputs = std::slice::from_raw_parts(a.outputs, a.num_outputs);
    let (cat, addrs) = (outputs[0].ptr as *mut u8, outputs[1].ptr as *mut u64);
    let mut at = 0;
    for (i, b) in inputs.iter().enumerate() {
        std::ptr::copy_nonoverlapping(b.ptr as *const u8, cat.add(at), b.size);
        at += b.size;
        *addrs.add(i) = b.ptr as u64;
    }
    0
}

struct RankGraph {
    g: RuntimeGraph,
    /// Per member (sum group, then max inputs): the host-written input it is made from.
    xs: Vec<u64>,
    cat: u64,
    addrs: u64,
}

fn sizes() -> Vec<usize> {
    SUM_SIZES.iter().chain(&MAX_SIZES).copied().collect()
}

/// Rank graph: three gradients (produced out of the fused order: 1, 2, 0), all-reduced (sum)
/// in place as one fused block; two more all-reduced (max) out of place into a fused output
/// block; a callback concatenates the five results and reports their addresses.
fn rank_graph(rt: &Arc<Runtime>, comm: &Comm) -> RankGraph {
    let mut g = RuntimeGraph::new(Arc::clone(rt));
    let sizes = sizes();
    let xs: Vec<u64> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            g.add_tensor((n * 4) as u64, TensorKind::Input, &format!("x{i}"))
                .unwrap()
        })
        .collect();
    let inter = |g: &mut RuntimeGraph, n: usize, name: String| {
        g.add_tensor((n * 4) as u64, TensorKind::Intermediate, &name)
            .unwrap()
    };
    let grads: Vec<u64> = (0..SUM_SIZES.len())
        .map(|i| inter(&mut g, sizes[i], format!("grad{i}")))
        .collect();
    let hs: Vec<u64> = (0..MAX_SIZES.len())
        .map(|i| inter(&mut g, MAX_SIZES[i], format!("h{i}")))
        .collect();
    let ss: Vec<u64> = (0..MAX_SIZES.len())
        .map(|i| inter(&mut g, MAX_SIZES[i], format!("s{i}")))
        .collect();
    let total: usize = sizes.iter().sum();
    let cat = g
        .add_tensor((total * 4) as u64, TensorKind::Output, "cat")
        .unwrap();
    let addrs = g
        .add_tensor((sizes.len() * 8) as u64, TensorKind::Output, "addrs")
        .unwrap();
    let two = 2.0f32.to_ne_bytes();
    let scale = Kernel::Builtin(BuiltinKind::Scale);
    for i in [1, 2, 0] {
        g.graph
            .add_node(scale.clone(), &[xs[i]], &[grads[i]], &[], DIMS, &two)
            .unwrap();
    }
    for (i, &h) in hs.iter().enumerate() {
        g.graph
            .add_node(
                scale.clone(),
                &[xs[SUM_SIZES.len() + i]],
                &[h],
                &[],
                DIMS,
                &two,
            )
            .unwrap();
    }
    g.add_collective(
        comm,
        CollectiveKind::AllReduce(ReduceOp::Sum),
        DType::F32,
        &grads,
        &grads,
    )
    .unwrap();
    g.add_collective(
        comm,
        CollectiveKind::AllReduce(ReduceOp::Max),
        DType::F32,
        &hs,
        &ss,
    )
    .unwrap();
    let callback = Kernel::Callback(HostCallback {
        func: gather_with_addresses,
        user_data: 0,
        owner: None,
    });
    let results: Vec<u64> = grads.iter().chain(&ss).copied().collect();
    g.graph
        .add_node(callback, &results, &[cat, addrs], &[], DIMS, &[])
        .unwrap();
    g.finalize().unwrap();
    RankGraph { g, xs, cat, addrs }
}

fn ranks(n: usize, mode: MemoryMode) {
    let id = runtime(mode).comm_unique_id().unwrap();
    std::thread::scope(|scope| {
        for r in 0..n {
            scope.spawn(move || {
                let rt = runtime(mode);
                let comm =
                    Comm::init_rank(Arc::clone(&rt), &id, r as u32, n as u32, 20_000).unwrap();
                let RankGraph {
                    mut g,
                    xs,
                    cat,
                    addrs,
                } = rank_graph(&rt, &comm);
                let sizes = sizes();
                g.record_pool_calls(true);
                for (i, &x) in xs.iter().enumerate() {
                    let v: Vec<u8> = input(r + i, sizes[i])
                        .iter()
                        .flat_map(|f| f.to_ne_bytes())
                        .collect();
                    g.write(x, &v).unwrap();
                }
                for run in 0..2 {
                    g.run().unwrap();
                    let mut a = vec![0u8; sizes.len() * 8];
                    g.read(addrs, &mut a).unwrap();
                    let a: Vec<u64> = a
                        .chunks_exact(8)
                        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                        .collect();
                    // Adjacent in the order given, within each fused block.
                    for (group, range) in [(0, 0..SUM_SIZES.len()), (1, SUM_SIZES.len()..sizes.len())] {
                        for i in range.clone().skip(1) {
                            assert_eq!(
                                a[i],
                                a[i - 1] + (sizes[i - 1] * 4) as u64,
                                "rank {r}, run {run}: member {i} of group {group} is not right after member {}",
                                i - 1
                            );
                        }
                    }
                    let mut c = vec![0u8; sizes.iter().sum::<usize>() * 4];
                    g.read(cat, &mut c).unwrap();
                    let got = floats(&c);
                    let mut at = 0;
                    for (i, &len) in sizes.iter().enumerate() {
                        for e in 0..len {
                            let per_rank = (0..n).map(|k| input(k + i, len)[e] * 2.0);
                            let want = if i < SUM_SIZES.len() {
                                per_rank.sum::<f32>()
                            } else {
                                per_rank.fold(f32::NEG_INFINITY, f32::max)
                            };
                            assert_eq!(got[at + e], want, "rank {r}: member {i} element {e}");
                        }
                        at += len;
                    }
                    // One block per fused group, and exactly the dry run's calls.
                    let ran = common::transient_calls(&g, g.last_pool_calls().unwrap());
                    assert_eq!(ran, common::transient_calls(&g, &g.planned_pool_calls()), "rank {r}, run {run}");
                    assert_eq!(g.is_planned(), mode == MemoryMode::Planned);
                    if mode == MemoryMode::Planned {
                        // Members sit in the arena at their group's offsets: no pool calls.
                        assert!(ran.is_empty(), "rank {r}: planned mode made pool calls: {ran:?}");
                        continue;
                    }
                    let groups = ran
                        .iter()
                        .filter(|c| matches!(c, PoolCall::Alloc { buf: Buf::Group(_), .. }))
                        .count();
                    assert_eq!(groups, 3, "rank {r}: three fused blocks (in place; out of place in and out): {ran:?}");
                    assert!(
                        !ran.iter().any(|c| matches!(c, PoolCall::Alloc { buf: Buf::Tensor(_), .. })),
                        "rank {r}: a fused member got a block of its own: {ran:?}"
                    );
                    assert_eq!(
                        rt.stats().unwrap().pool.allocated_bytes,
                        g.resident_bytes(),
                        "rank {r}, run {run}: a fused block outlived the run"
                    );
                }
                drop(g);
                assert_eq!(rt.stats().unwrap().pool.allocated_bytes, 0);
            });
        }
    });
}

#[test]
fn two_ranks_fused() {
    ranks(2, MemoryMode::Dynamic);
}

#[test]
fn four_ranks_fused() {
    ranks(4, MemoryMode::Dynamic);
}

#[test]
fn eight_ranks_fused() {
    ranks(8, MemoryMode::Dynamic);
}

#[test]
fn two_ranks_fused_planned() {
    ranks(2, MemoryMode::Planned);
}

#[test]
fn four_ranks_fused_planned() {
    ranks(4, MemoryMode::Planned);
}

#[test]
fn eight_ranks_fused_planned() {
    ranks(8, MemoryMode::Planned);
}

#[test]
fn fusion_is_refused_where_it_cannot_hold() {
    let rt = runtime(MemoryMode::Dynamic);
    let id = rt.comm_unique_id().unwrap();
    let comm = Comm::init_rank(Arc::clone(&rt), &id, 0, 1, 1_000).unwrap();
    let mut g = RuntimeGraph::new(Arc::clone(&rt));
    let t = |g: &mut RuntimeGraph, kind, n: u64| g.add_tensor(n, kind, "").unwrap();
    let (a, b) = (
        t(&mut g, TensorKind::Intermediate, 64),
        t(&mut g, TensorKind::Intermediate, 32),
    );
    let p = t(&mut g, TensorKind::Parameter, 64);
    let (o1, o2) = (
        t(&mut g, TensorKind::Intermediate, 64),
        t(&mut g, TensorKind::Intermediate, 64),
    );
    for x in [a, b, o1, o2] {
        g.graph
            .add_node(
                Kernel::Builtin(BuiltinKind::Fill),
                &[],
                &[x],
                &[],
                DIMS,
                &1.0f32.to_ne_bytes(),
            )
            .unwrap();
    }
    let sum = CollectiveKind::AllReduce(ReduceOp::Sum);
    let msg = |r: gkrt::runtime::Result<u32>| r.unwrap_err().to_string();
    let e = msg(g.add_collective(
        &comm,
        CollectiveKind::AllGather,
        DType::F32,
        &[a, b],
        &[o1, o2],
    ));
    assert!(
        e.contains("only all-reduce, broadcast and reduce fuse"),
        "{e}"
    );
    let e = msg(g.add_collective(&comm, sum, DType::F32, &[a, p], &[a, p]));
    assert!(e.contains("not an intermediate"), "{e}");
    let e = msg(g.add_collective(&comm, sum, DType::F32, &[a, a], &[a, a]));
    assert!(e.contains("given twice"), "{e}");
    let e = msg(g.add_collective(&comm, sum, DType::F32, &[a, b], &[o1, o2]));
    assert!(e.contains("fused pair 1"), "{e}");
    let e = msg(g.add_collective(&comm, sum, DType::F32, &[a, o1], &[o1, a]));
    assert!(e.contains("not the inputs in the same order"), "{e}");
    // A refused node leaves nothing behind: the same tensors fuse afterwards, once.
    g.add_collective(&comm, sum, DType::F32, &[a, o1], &[a, o1])
        .unwrap();
    let e = msg(g.add_collective(&comm, sum, DType::F32, &[o1, o2], &[o1, o2]));
    assert!(e.contains("already fused"), "{e}");
    assert_eq!(g.graph.fused_groups().len(), 1);
    assert_eq!(g.graph.fused_groups()[0].offsets, vec![0, 64]);
}
