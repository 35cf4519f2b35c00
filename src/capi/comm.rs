//! C API: communicators (`gkrt_comm`), the ranks of a collective job.

use super::boundary::{c_slice, guard};
use super::handles::{self, Object};
use super::types::*;
use crate::runtime::{CollectiveKind, Comm, DType, Error, ReduceOp};

/// Writes a fresh unique id to `*out` (`ncclGetUniqueId`): one rank makes it and shares the bytes
/// with the others by its own means (MPI, a file, a TCP store); every rank then calls
/// `gkrt_comm_init_rank` with it. On the host backend the ranks are runtimes of this process
/// (threads): the id names a meeting place in it, used up once every rank has joined. On CUDA it
/// is NCCL's, loaded at run time (libnccl 2.28 or newer, as `libnccl.so` or another name
/// cudarc tries on the loader's path — not `libnccl.so.2` alone: link `libnccl.so` to it);
/// without it GKRT_STATUS_UNSUPPORTED, the message naming every name searched. gkrt sets
/// `NCCL_NVLS_ENABLE=0` in the environment before its first NCCL call when it is unset.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_comm_get_unique_id(
    runtime: *mut gkrt_runtime,
    out: *mut gkrt_unique_id,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        if out.is_null() {
            return Err(Error::InvalidArgument(
                "out (gkrt_unique_id *) is NULL".into(),
            ));
        }
        let id = rt.comm_unique_id()?;
        // SAFETY: `out` is non-NULL and valid for a write (the C contract).
        unsafe { (*out).internal = id };
        Ok(())
    })
}

/// Joins the communicator of `id` as `rank` of `nranks` on `runtime`'s device
/// (`ncclCommInitRank`) and writes its handle to `*out`. Blocks until every rank has joined,
/// at most `timeout_ms` (0: 300000 ms); the same bound applies to every later wait for other
/// ranks (a collective some rank never reaches), after which the communicator is aborted and
/// the call that waited fails with GKRT_STATUS_PEER_FAILED. A rank out of range, a rank that
/// joined already, or an `nranks` other than the first rank's is GKRT_STATUS_INVALID_ARGUMENT; a
/// backend without communicators is GKRT_STATUS_UNSUPPORTED. Release with `gkrt_comm_release`;
/// the communicator keeps the runtime alive. On CUDA the communicator is a non-blocking NCCL
/// one: NCCL's refusals (two ranks on one GPU) are GKRT_STATUS_INVALID_ARGUMENT, a failed or
/// timed-out peer GKRT_STATUS_PEER_FAILED; a watchdog thread aborts it on an asynchronous NCCL
/// error or a collective outstanding past `timeout_ms` (counted from when it was queued or the
/// one before it finished, so it includes compute the collective waits for), and the run that
/// waited for it fails with GKRT_STATUS_PEER_FAILED. Every communicator registers the runtime's
/// device memory (`ncclCommRegister`) while both live, deregistering it before it is freed.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_comm_init_rank(
    runtime: *mut gkrt_runtime,
    id: *const gkrt_unique_id,
    rank: u32,
    nranks: u32,
    timeout_ms: u32,
    out: *mut *mut gkrt_comm,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        if id.is_null() {
            return Err(Error::InvalidArgument(
                "id (gkrt_unique_id *) is NULL".into(),
            ));
        }
        if out.is_null() {
            return Err(Error::InvalidArgument("out (gkrt_comm **) is NULL".into()));
        }
        // SAFETY: `id` is non-NULL and valid for a read (the C contract).
        let bytes = unsafe { (*id).internal };
        let comm = Comm::init_rank(rt, &bytes, rank, nranks, timeout_ms)?;
        let handle = handles::register(Object::Comm(comm))? as *mut gkrt_comm;
        // SAFETY: `out` is non-NULL and valid for a write.
        unsafe { *out = handle };
        Ok(())
    })
}

/// Wraps `nccl_comm`, an `ncclComm_t` the host program made on `runtime`'s GPU, as `rank` of
/// `nranks` (checked against `ncclCommUserRank`/`ncclCommCount`, and its device against the
/// runtime's with `ncclCommCuDevice`; a mismatch is
/// GKRT_STATUS_INVALID_ARGUMENT) and writes the handle to `*out`. The communicator stays the
/// caller's: `gkrt_comm_release` never destroys it (the caller destroys it after releasing every
/// handle and graph that uses it). `gkrt_comm_abort` — and a failed run of a graph using it, or
/// its timeout — still calls `ncclCommAbort`, which frees it: after an abort the caller must
/// neither use nor destroy its `ncclComm_t`. Waits for other ranks are bounded by `timeout_ms`
/// (0: 300000 ms) as for `gkrt_comm_init_rank`. gkrt registers the runtime's device memory with
/// it (`ncclCommRegister`, deregistered before that memory is freed and at release), so the
/// caller must not call NCCL on it from another thread while gkrt may (allocations, runs). The
/// host backend has no NCCL: GKRT_STATUS_UNSUPPORTED.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_comm_wrap_nccl(
    runtime: *mut gkrt_runtime,
    nccl_comm: *mut std::ffi::c_void,
    rank: u32,
    nranks: u32,
    timeout_ms: u32,
    out: *mut *mut gkrt_comm,
) -> gkrt_status {
    guard(|| {
        let rt = handles::runtime(runtime as usize)?;
        if out.is_null() {
            return Err(Error::InvalidArgument("out (gkrt_comm **) is NULL".into()));
        }
        if nccl_comm.is_null() {
            return Err(Error::InvalidArgument(
                "nccl_comm (ncclComm_t) is NULL".into(),
            ));
        }
        let comm = Comm::wrap(rt, nccl_comm, rank, nranks, timeout_ms)?;
        let handle = handles::register(Object::Comm(comm))? as *mut gkrt_comm;
        // SAFETY: `out` is non-NULL and valid for a write.
        unsafe { *out = handle };
        Ok(())
    })
}

/// The communicator's rank and number of ranks (either pointer may be NULL).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn gkrt_comm_rank(
    comm: *const gkrt_comm,
    rank: *mut u32,
    nranks: *mut u32,
) -> gkrt_status {
    guard(|| {
        let c = handles::comm(comm as usize)?;
        // SAFETY: non-NULL pointers are valid for a write (the C contract).
        unsafe {
            if !rank.is_null() {
                *rank = c.rank();
            }
            if !nranks.is_null() {
                *nranks = c.nranks();
            }
        }
        Ok(())
    })
}

/// Aborts the communicator for every rank (`ncclCommAbort`): collectives any rank is waiting in
/// or queues later fail with GKRT_STATUS_PEER_FAILED instead of hanging. Call it when this rank
/// cannot go on (its step failed), so the others stop waiting for it. The handle stays valid
/// until released; make a new communicator (new unique id) to go on.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_comm_abort(comm: *mut gkrt_comm) -> gkrt_status {
    guard(|| {
        handles::comm(comm as usize)?.abort("gkrt_comm_abort");
        Ok(())
    })
}

/// Releases the handle. Graphs with collective nodes over the communicator keep it; once none
/// does, this rank leaves it, and ranks still waiting for this one fail with
/// GKRT_STATUS_PEER_FAILED. NULL is a no-op; releasing twice is GKRT_STATUS_INVALID_ARGUMENT.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_comm_release(comm: *mut gkrt_comm) -> gkrt_status {
    if comm.is_null() {
        return gkrt_status::GKRT_STATUS_OK;
    }
    guard(|| handles::release(comm as usize, "communicator"))
}

fn reduce_op(op: gkrt_reduce_op) -> Result<ReduceOp, Error> {
    Ok(match op {
        GKRT_REDUCE_SUM => ReduceOp::Sum,
        GKRT_REDUCE_PROD => ReduceOp::Prod,
        GKRT_REDUCE_MIN => ReduceOp::Min,
        GKRT_REDUCE_MAX => ReduceOp::Max,
        GKRT_REDUCE_AVG => ReduceOp::Avg,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "reduce op {op} is not a gkrt_reduce_op"
            )))
        }
    })
}

/// Appends a collective node over `comm` (a communicator of the graph's runtime): `collective`
/// is a GKRT_COLLECTIVE_*, `op` a GKRT_REDUCE_* (read by all-reduce, reduce and
/// reduce-scatter), `root_or_peer` the root of a broadcast or reduce and the peer of a send or
/// receive, `dtype` a GKRT_DTYPE_*. It takes one input and one output tensor (send: only an
/// input; receive: only an output); the same tensor as both is in place (all-reduce, broadcast,
/// reduce). The element count follows from the input's size (its slice's, for reduce-scatter);
/// the output's size must be what NCCL writes (all-gather: nranks times the input). Every rank
/// must add the same collectives in the same order.
///
/// Fused inputs: an all-reduce, broadcast or reduce may take several inputs and as many outputs
/// (pair i of equal size, whole elements of `dtype`). The inputs share one contiguous block in
/// the order given (as do the outputs, unless they are the inputs in the same order: in place),
/// so one collective call covers them all; each producer writes straight into its slot. Fused
/// tensors must be distinct intermediates, each in one block only (the host places persistent
/// tensors itself). The block is taken when the first member is produced and returned after the
/// last member's last use. All-gather and reduce-scatter take one input (over a fused block
/// their results would interleave the ranks' tensors).
///
/// The node runs on the runtime's communication stream after the nodes before it; later nodes
/// that touch neither its input nor its output run meanwhile. A graph with collective nodes that
/// exceeds its memory limit swaps like any other, but never a tensor a collective may still
/// touch: its inputs and outputs (a fused block whole) stay on the device from their last use
/// before the collective (their producer) until the compute stream has waited for it, and a
/// copy of them to the host follows the collective. In planned mode the arena holds a collective's tensors until the
/// compute stream has waited for it, and on CUDA the graph is captured for replay like any
/// planned graph (at its second run), the collectives included: the communication stream joins
/// the capture through the events that order it. Each replay is watched by the communicator as
/// one call: its timeout counts from the replay's launch and covers the whole replayed step
/// (its collectives cannot be told apart from its kernels), so it must exceed a step; past it the
/// communicator is aborted and the run fails with GKRT_STATUS_PEER_FAILED, and later runs of
/// the graph fail with GKRT_STATUS_PEER_FAILED at once. A run that fails aborts the graph's
/// communicators (the other ranks' runs fail with GKRT_STATUS_PEER_FAILED instead of waiting);
/// a run that fails because another rank did returns GKRT_STATUS_PEER_FAILED. The graph keeps
/// `comm` alive. On success `*node_out` (may be NULL) receives the node's index.
#[must_use]
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gkrt_graph_add_collective(
    graph: *mut gkrt_graph,
    comm: *const gkrt_comm,
    collective: gkrt_collective,
    op: gkrt_reduce_op,
    root_or_peer: u32,
    dtype: gkrt_dtype,
    inputs: *const gkrt_tensor,
    num_inputs: usize,
    outputs: *const gkrt_tensor,
    num_outputs: usize,
    node_out: *mut u32,
) -> gkrt_status {
    guard(|| {
        let g = handles::graph(graph as usize)?;
        let c = handles::comm(comm as usize)?;
        let kind = match collective {
            GKRT_COLLECTIVE_ALL_REDUCE => CollectiveKind::AllReduce(reduce_op(op)?),
            GKRT_COLLECTIVE_BROADCAST => CollectiveKind::Broadcast { root: root_or_peer },
            GKRT_COLLECTIVE_REDUCE => CollectiveKind::Reduce {
                op: reduce_op(op)?,
                root: root_or_peer,
            },
            GKRT_COLLECTIVE_ALL_GATHER => CollectiveKind::AllGather,
            GKRT_COLLECTIVE_REDUCE_SCATTER => CollectiveKind::ReduceScatter(reduce_op(op)?),
            GKRT_COLLECTIVE_SEND => CollectiveKind::Send { peer: root_or_peer },
            GKRT_COLLECTIVE_RECV => CollectiveKind::Recv { peer: root_or_peer },
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "collective {collective} is not a gkrt_collective"
                )))
            }
        };
        let dtype = match dtype {
            GKRT_DTYPE_F32 => DType::F32,
            GKRT_DTYPE_F16 => DType::F16,
            GKRT_DTYPE_BF16 => DType::BF16,
            GKRT_DTYPE_I32 => DType::I32,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "dtype {dtype} is not a gkrt_dtype"
                )))
            }
        };
        // SAFETY: the C contract: each array is NULL (when its count is 0) or holds its count.
        let (inputs, outputs) = unsafe {
            (
                c_slice(inputs, num_inputs, "inputs")?,
                c_slice(outputs, num_outputs, "outputs")?,
            )
        };
        let mut g = crate::runtime::lock_for_call(&g, "graph")?;
        let node = g.add_collective(&c, kind, dtype, inputs, outputs)?;
        // SAFETY: the C contract: `node_out` is NULL or valid for a write.
        if let Some(out) = unsafe { node_out.as_mut() } {
            *out = node;
        }
        Ok(())
    })
}

/// Sets how `gkrt_graph_finalize` fuses consecutive all-reduces into buckets (the defaults are
/// PyTorch DDP's: the first bucket at most 1 MiB, later ones at most 25 MiB): all-reduces of
/// one intermediate each (all in place or all out of place), on one communicator with one type
/// and operator, consecutive among the graph's collectives, become one collective call over one
/// contiguous block of at most `bucket_bytes` (the first bucket `first_bucket_bytes`), issued
/// at the bucket's last node; the earlier nodes are absorbed (they keep their index and issue
/// nothing). A bucket closes at any kernel node that reads or writes one of its tensors, so no
/// node ever sees an unreduced result. `bucket_bytes` 0 turns fusion off. Every rank must use
/// the same sizes (the first run's digest catches a difference). Before `gkrt_graph_finalize`
/// only: GKRT_STATUS_INVALID_STATE after it.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_graph_set_collective_buckets(
    graph: *mut gkrt_graph,
    first_bucket_bytes: u64,
    bucket_bytes: u64,
) -> gkrt_status {
    guard(|| {
        let g = handles::graph(graph as usize)?;
        let mut g = crate::runtime::lock_for_call(&g, "graph")?;
        g.set_collective_buckets(first_bucket_bytes, bucket_bytes)
    })
}
