//! One collective as the NCCL call that runs it (`nccl.rs` queues them in groups and watches
//! them): gkrt's element types and reduction operators in NCCL's terms.

use crate::kernels::collective::{Collective, CollectiveKind, DType, ReduceOp};
use cudarc::nccl::sys as nccl;
use nccl::ncclResult_t as R;
use std::ffi::{c_int, c_void};

fn nccl_type(d: DType) -> nccl::ncclDataType_t {
    match d {
        DType::F32 => nccl::ncclDataType_t::ncclFloat32,
        DType::F16 => nccl::ncclDataType_t::ncclFloat16,
        DType::BF16 => nccl::ncclDataType_t::ncclBfloat16,
        DType::I32 => nccl::ncclDataType_t::ncclInt32,
    }
}

fn nccl_op(op: ReduceOp) -> nccl::ncclRedOp_t {
    match op {
        ReduceOp::Sum => nccl::ncclRedOp_t::ncclSum,
        ReduceOp::Prod => nccl::ncclRedOp_t::ncclProd,
        ReduceOp::Min => nccl::ncclRedOp_t::ncclMin,
        ReduceOp::Max => nccl::ncclRedOp_t::ncclMax,
        ReduceOp::Avg => nccl::ncclRedOp_t::ncclAvg,
    }
}

/// Issues one call inside a group.
///
/// # Safety
/// `comm` is live, `stream` a stream of its device, the buffers device memory of the sizes the
/// call names (checked by the graph layer).
pub(super) unsafe fn issue(
    c: &Collective,
    comm: nccl::ncclComm_t,
    stream: nccl::cudaStream_t,
) -> (R, &'static str) {
    let (send, recv) = (c.send as *const c_void, c.recv as *mut c_void);
    let (n, t) = (c.count as usize, nccl_type(c.dtype));
    // SAFETY: the caller's contract.
    unsafe {
        match c.kind {
            CollectiveKind::AllReduce(op) => (
                nccl::ncclAllReduce(send, recv, n, t, nccl_op(op), comm, stream),
                "ncclAllReduce",
            ),
            CollectiveKind::Broadcast { root } => (
                nccl::ncclBroadcast(send, recv, n, t, root as c_int, comm, stream),
                "ncclBroadcast",
            ),
            CollectiveKind::Reduce { op, root } => (
                nccl::ncclReduce(send, recv, n, t, nccl_op(op), root as c_int, comm, stream),
                "ncclReduce",
            ),
            CollectiveKind::AllGather => (
                nccl::ncclAllGather(send, recv, n, t, comm, stream),
                "ncclAllGather",
            ),
            CollectiveKind::ReduceScatter(op) => (
                nccl::ncclReduceScatter(send, recv, n, t, nccl_op(op), comm, stream),
                "ncclReduceScatter",
            ),
            CollectiveKind::Send { peer } => (
                nccl::ncclSend(send, n, t, peer as c_int, comm, stream),
                "ncclSend",
            ),
            CollectiveKind::Recv { peer } => (
                nccl::ncclRecv(recv, n, t, peer as c_int, comm, stream),
                "ncclRecv",
            ),
        }
    }
}
