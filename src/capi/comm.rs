//! C API: communicators (`gkrt_comm`), the ranks of a collective job.

use super::boundary::guard;
use super::handles::{self, Object};
use super::types::*;
use crate::runtime::{Comm, Error};

/// Writes a fresh unique id to `*out` (`ncclGetUniqueId`): one rank makes it and shares the bytes
/// with the others by its own means (MPI, a file, a TCP store); every rank then calls
/// `gkrt_comm_init_rank` with it. On the host backend the ranks are runtimes of this process
/// (threads): the id names a meeting place in it, used up once every rank has joined.
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
/// the communicator keeps the runtime alive.
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

/// Releases the communicator: this rank leaves it, and ranks still waiting for this one fail
/// with GKRT_STATUS_PEER_FAILED. NULL is a no-op; releasing twice is
/// GKRT_STATUS_INVALID_ARGUMENT.
#[must_use]
#[no_mangle]
pub extern "C" fn gkrt_comm_release(comm: *mut gkrt_comm) -> gkrt_status {
    if comm.is_null() {
        return gkrt_status::GKRT_STATUS_OK;
    }
    guard(|| handles::release(comm as usize, "communicator"))
}
