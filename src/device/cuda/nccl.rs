//! NCCL communicators on the CUDA backend, through cudarc's `nccl::sys` with dynamic loading
//! (the build needs no NCCL; a machine without it gets `Unsupported` naming what was searched).
//!
//! **Loading.** cudarc panics when libnccl or one of its symbols is missing, so [`library`] first
//! asks `is_culib_present` (cudarc's list of names, tried with `dlopen`: LD_LIBRARY_PATH,
//! ld.so.cache, the system directories) and then requires NCCL 2.28 or newer — the config struct
//! passed to `ncclCommInitRankConfig` is 2.28's. cudarc's names include `libnccl.so` but not
//! `libnccl.so.2`, the only name pip's nvidia-nccl wheels ship: such an install needs a
//! `libnccl.so` link on LD_LIBRARY_PATH (`scripts/gpu/run.sh nccl` makes one). Before the first
//! NCCL call `NCCL_NVLS_ENABLE=0` is set in the environment when it is unset (NVLink SHARP is
//! off on the machines we run on, and probing it can hang a multi-GPU job).
//!
//! **Never a hang.** Communicators gkrt makes are non-blocking (`config.blocking = 0`): joining
//! polls `ncclCommGetAsyncError` until it is done, at most the communicator's timeout, then
//! aborts. A group of calls is queued between `ncclGroupStart`/`ncclGroupEnd` on the stream the
//! executor hands over (the runtime's communication stream), followed by an event. A watchdog
//! thread per communicator polls every [`POLL`]: an asynchronous NCCL error (a peer that failed)
//! or a group outstanding longer than the timeout aborts the communicator (`ncclCommAbort`,
//! which makes NCCL's kernels return). The clock of a group starts when it was queued or when
//! the group before it was seen complete, whichever is later — so it includes compute work the
//! communication stream waits for before the group: the timeout must exceed a step's compute.
//! Every stream with an outstanding group is then marked failed in the device's
//! [`StreamFailures`], which `stream_synchronize` reports as `PeerFailed`: a run interrupted by
//! an abort fails instead of returning garbage. Calls after an abort fail with `PeerFailed`.
//!
//! **Capture.** A group queued on a stream being captured (a planned graph's CUDA-graph
//! capture: the communication stream joins the compute stream's capture through the events that
//! order it) is part of the graph and runs in each replay, not now, so it is not watched then.
//! The runtime calls `watch_replay` after launching a replay: one outstanding group per
//! communicator on the compute stream, whose clock starts at the launch and covers the whole
//! replayed step — its collectives cannot be told apart from its kernels — so, as for queued
//! groups, the timeout must exceed a step. Past it (or on an asynchronous error) the
//! communicator is aborted, which makes the replay's NCCL kernels return; the compute stream is
//! marked failed, so the run fails with `PeerFailed`; later replays are refused with
//! `PeerFailed` (their captured calls name the aborted communicator).
//!
//! **Registration.** Every communicator registers the device's live segments and mapped pages
//! with `ncclCommRegister` (through the device's [`Registrations`]: those alive when it is made,
//! and each one allocated later) and deregisters each (`ncclCommDeregister`) before the device
//! frees it, and all of them before it is destroyed. A registration that fails is logged and
//! skipped: it only makes collectives on that memory faster.
//!
//! **Ownership.** A communicator made by `init_rank` is finalized and destroyed when its last
//! reference goes; one wrapped with [`wrap`] belongs to the caller and is never destroyed here —
//! but `abort` still calls `ncclCommAbort` on it, which frees it: after an abort the caller must
//! not use or destroy its handle any more.

use super::handles::{lock, Ctx};
use super::nccl_calls::issue;
use crate::device::comm::{CommOptions, Communicator, UniqueId, UNIQUE_ID_BYTES};
use crate::device::registration::{Registrable, Registrations};
use crate::device::{DevPtr, Device, DeviceError, DeviceKind, DeviceResult, StreamId};
use crate::kernels::collective::Collective;
use cudarc::driver::sys;
use cudarc::nccl::sys as nccl;
use nccl::ncclResult_t as R;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the watchdog looks at a communicator.
const POLL: Duration = Duration::from_millis(10);
/// The oldest NCCL whose `ncclConfig_t` layout we pass (2.28.0).
const MIN_VERSION: c_int = 22800;

/// Streams on which an aborted communicator left work unfinished, keyed by native stream:
/// `stream_synchronize` reports them once as `PeerFailed`. `any` keeps the check off the hot
/// path while no communicator has failed.
#[derive(Default)]
pub(super) struct StreamFailures {
    any: AtomicBool,
    by_stream: Mutex<HashMap<usize, String>>,
}

impl StreamFailures {
    fn mark(&self, stream: usize, why: &str) {
        lock(&self.by_stream)
            .entry(stream)
            .or_insert_with(|| why.to_string());
        self.any.store(true, Ordering::Release);
    }

    /// The failure recorded for `stream`, if any (cleared).
    pub(super) fn take(&self, stream: usize) -> Option<String> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut map = lock(&self.by_stream);
        let why = map.remove(&stream);
        if map.is_empty() {
            self.any.store(false, Ordering::Release);
        }
        why
    }
}

/// Loads libnccl once (see the module comment); the error is `Unsupported` naming the names
/// searched, or the version found.
fn library() -> DeviceResult<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
                std::env::set_var("NCCL_NVLS_ENABLE", "0");
            }
            // SAFETY: only dlopen-s candidates; never panics.
            if !unsafe { nccl::is_culib_present() } {
                return Err(format!(
                    "the NCCL library was not found: searched the loader's path (LD_LIBRARY_PATH, \
                     ld.so.cache, system directories) for {} — libnccl.so.2 alone (pip's \
                     nvidia-nccl) is not among those names: put a libnccl.so link to it on \
                     LD_LIBRARY_PATH",
                    cudarc::get_lib_name_candidates("nccl").join(", ")
                ));
            }
            let mut v: c_int = 0;
            // SAFETY: the library is present; valid out-pointer.
            let r = unsafe { nccl::ncclGetVersion(&mut v) };
            if r != R::ncclSuccess || v < MIN_VERSION {
                return Err(format!(
                    "NCCL version {v} was found; gkrt needs 2.28 or newer ({MIN_VERSION})"
                ));
            }
            Ok(())
        })
        .clone()
        .map_err(DeviceError::Unsupported)
}

/// An NCCL result as a device error: bad arguments/usage are `Invalid`, remote and system
/// failures (a peer or the network) `PeerFailed`, the rest `Driver` errors.
fn nccl_error(call: &'static str, r: R, comm: nccl::ncclComm_t) -> DeviceError {
    // SAFETY: both return static or comm-owned NUL-terminated strings (NULL comm is allowed).
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let what = text(unsafe { nccl::ncclGetErrorString(r) });
    let last = text(unsafe { nccl::ncclGetLastError(comm) });
    let message = format!("{what}: {last}");
    match r {
        R::ncclInvalidArgument | R::ncclInvalidUsage => {
            DeviceError::Invalid(format!("{call} failed: {r:?} ({message})"))
        }
        R::ncclRemoteError | R::ncclSystemError => {
            DeviceError::PeerFailed(format!("{call} failed: {r:?} ({message})"))
        }
        _ => DeviceError::Driver {
            call,
            name: format!("{r:?}"),
            message,
        },
    }
}

/// The communicator's state as `ncclCommGetAsyncError` reports it: `Ok(true)` done, `Ok(false)`
/// still in progress.
fn async_state(comm: nccl::ncclComm_t, call: &'static str) -> DeviceResult<bool> {
    let mut state = R::ncclSuccess;
    // SAFETY: a live communicator; valid out-pointer.
    let r = unsafe { nccl::ncclCommGetAsyncError(comm, &mut state) };
    if r != R::ncclSuccess {
        return Err(nccl_error("ncclCommGetAsyncError", r, comm));
    }
    match state {
        R::ncclSuccess => Ok(true),
        R::ncclInProgress => Ok(false),
        e => Err(nccl_error(call, e, comm)),
    }
}

/// Polls until the communicator's pending operation is done, an error, or `deadline` (which is
/// `Err(None)`).
fn wait_done(
    comm: nccl::ncclComm_t,
    call: &'static str,
    deadline: Instant,
) -> Result<(), Option<DeviceError>> {
    let mut spins = 0u32;
    loop {
        if async_state(comm, call).map_err(Some)? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(None);
        }
        spins += 1;
        if spins < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A fresh unique id (`ncclGetUniqueId`).
pub(super) fn unique_id() -> DeviceResult<UniqueId> {
    library()?;
    let mut id = nccl::ncclUniqueId { internal: [0; 128] };
    // SAFETY: the library is present; valid out-pointer.
    let r = unsafe { nccl::ncclGetUniqueId(&mut id) };
    if r != R::ncclSuccess {
        return Err(nccl_error("ncclGetUniqueId", r, std::ptr::null_mut()));
    }
    let mut bytes = [0u8; UNIQUE_ID_BYTES];
    for (b, c) in bytes.iter_mut().zip(id.internal) {
        *b = c as u8;
    }
    Ok(UniqueId(bytes))
}

fn check_rank(rank: u32, nranks: u32) -> DeviceResult<()> {
    if nranks == 0 || rank >= nranks || nranks > c_int::MAX as u32 {
        return Err(DeviceError::Invalid(format!(
            "rank {rank} of {nranks}: the rank must be below the number of ranks, which must be at least 1"
        )));
    }
    Ok(())
}

/// Joins the communicator of `id` as `rank` of `nranks` (`ncclCommInitRankConfig`,
/// non-blocking), with `ctx` — the device's primary context — current on this thread.
pub(super) fn init_rank(
    ctx: &Ctx,
    failures: &Arc<StreamFailures>,
    registrations: &Registrations,
    id: &UniqueId,
    rank: u32,
    nranks: u32,
    options: CommOptions,
) -> DeviceResult<Arc<dyn Communicator>> {
    check_rank(rank, nranks)?;
    library()?;
    // NCCL_CONFIG_INITIALIZER: every field "undefined" but blocking.
    const UNDEF: c_int = c_int::MIN;
    let mut config = nccl::ncclConfig_t {
        size: std::mem::size_of::<nccl::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: MIN_VERSION as u32,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
    };
    let mut uid = nccl::ncclUniqueId { internal: [0; 128] };
    for (c, b) in uid.internal.iter_mut().zip(id.0) {
        *c = b as c_char;
    }
    let mut comm: nccl::ncclComm_t = std::ptr::null_mut();
    let deadline = Instant::now() + options.timeout;
    // SAFETY: valid out-pointer and config; the caller made `ctx` current.
    let r = unsafe {
        nccl::ncclCommInitRankConfig(&mut comm, nranks as c_int, uid, rank as c_int, &mut config)
    };
    let joined = match r {
        R::ncclSuccess | R::ncclInProgress if !comm.is_null() => {
            wait_done(comm, "ncclCommInitRankConfig", deadline)
        }
        _ => Err(Some(nccl_error("ncclCommInitRankConfig", r, comm))),
    };
    if let Err(e) = joined {
        if !comm.is_null() {
            // SAFETY: the half-made communicator is ours and used nowhere else.
            unsafe { nccl::ncclCommAbort(comm) };
        }
        return Err(e.unwrap_or_else(|| {
            DeviceError::PeerFailed(format!(
                "timed out after {} ms waiting for the other ranks to join (ncclCommInitRank, rank {rank} of {nranks})",
                options.timeout.as_millis()
            ))
        }));
    }
    Ok(NcclComm::start(
        ctx,
        failures,
        registrations,
        comm,
        rank,
        nranks,
        options,
        true,
    ))
}

/// Wraps `native`, an `ncclComm_t` the caller made on this device, as `rank` of `nranks` (checked
/// against what NCCL says, as is its device: `ordinal`). gkrt never destroys it.
#[allow(clippy::too_many_arguments)]
pub(super) fn wrap(
    ordinal: u32,
    ctx: &Ctx,
    failures: &Arc<StreamFailures>,
    registrations: &Registrations,
    native: *mut c_void,
    rank: u32,
    nranks: u32,
    options: CommOptions,
) -> DeviceResult<Arc<dyn Communicator>> {
    check_rank(rank, nranks)?;
    library()?;
    if native.is_null() {
        return Err(DeviceError::Invalid("the ncclComm_t is NULL".into()));
    }
    let comm = native as nccl::ncclComm_t;
    let (mut r_rank, mut r_count) = (0 as c_int, 0 as c_int);
    // SAFETY: the caller hands a live communicator (the C contract); valid out-pointers.
    let r = unsafe { nccl::ncclCommUserRank(comm, &mut r_rank) };
    if r != R::ncclSuccess {
        return Err(nccl_error("ncclCommUserRank", r, comm));
    }
    let r = unsafe { nccl::ncclCommCount(comm, &mut r_count) };
    if r != R::ncclSuccess {
        return Err(nccl_error("ncclCommCount", r, comm));
    }
    let mut r_device: c_int = -1;
    // SAFETY: as above.
    let r = unsafe { nccl::ncclCommCuDevice(comm, &mut r_device) };
    if r != R::ncclSuccess {
        return Err(nccl_error("ncclCommCuDevice", r, comm));
    }
    if r_device as u32 != ordinal {
        return Err(DeviceError::Invalid(format!(
            "the ncclComm_t is on CUDA device {r_device}, the runtime on device {ordinal}"
        )));
    }
    if (r_rank as u32, r_count as u32) != (rank, nranks) {
        return Err(DeviceError::Invalid(format!(
            "the ncclComm_t is rank {r_rank} of {r_count}, not rank {rank} of {nranks} as given"
        )));
    }
    Ok(NcclComm::start(
        ctx,
        failures,
        registrations,
        comm,
        rank,
        nranks,
        options,
        false,
    ))
}

/// A group queued and not yet seen complete.
struct Pending {
    event: sys::CUevent,
    stream: usize,
    /// When its timeout clock started.
    since: Instant,
}

struct State {
    /// NULL once aborted (or destroyed).
    comm: nccl::ncclComm_t,
    aborted: Option<String>,
    pending: VecDeque<Pending>,
    /// Completed groups' events, reused.
    spare: Vec<sys::CUevent>,
    /// Set by `Drop`: the watchdog ends.
    stop: bool,
    /// `ncclCommRegister` handles by range address.
    registered: HashMap<DevPtr, usize>,
}

struct Shared {
    ctx: sys::CUcontext,
    failures: Arc<StreamFailures>,
    rank: u32,
    nranks: u32,
    timeout: Duration,
    owned: bool,
    state: Mutex<State>,
    wake: Condvar,
}

// SAFETY: the raw NCCL and driver handles are only used under `state`'s lock, with our context
// pushed; NCCL allows a communicator to be used from any thread, one call at a time.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// One rank's NCCL communicator.
pub struct NcclComm {
    shared: Arc<Shared>,
    watchdog: Option<JoinHandle<()>>,
}

/// Makes `ctx` current on this thread for the guard's life (push/pop, so the caller's context
/// comes back).
struct Current;
impl Current {
    fn push(ctx: sys::CUcontext) -> DeviceResult<Current> {
        // SAFETY: the device retains its primary context while any communicator of it lives.
        super::handles::check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
        Ok(Current)
    }
}
impl Drop for Current {
    fn drop(&mut self) {
        let mut old: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops what `push` pushed.
        unsafe { sys::cuCtxPopCurrent_v2(&mut old) };
    }
}

impl NcclComm {
    #[allow(clippy::too_many_arguments)]
    fn start(
        ctx: &Ctx,
        failures: &Arc<StreamFailures>,
        registrations: &Registrations,
        comm: nccl::ncclComm_t,
        rank: u32,
        nranks: u32,
        options: CommOptions,
        owned: bool,
    ) -> Arc<dyn Communicator> {
        let shared = Arc::new(Shared {
            ctx: ctx.0,
            failures: Arc::clone(failures),
            rank,
            nranks,
            timeout: options.timeout,
            owned,
            state: Mutex::new(State {
                comm,
                aborted: None,
                pending: VecDeque::new(),
                spare: Vec::new(),
                stop: false,
                registered: HashMap::new(),
            }),
            wake: Condvar::new(),
        });
        let watched = Arc::clone(&shared);
        let watchdog = std::thread::Builder::new()
            .name(format!("gkrt-nccl-watchdog-{rank}"))
            .spawn(move || watched.watch())
            .map_err(|e| log::warn!("no NCCL watchdog thread ({e}): timeouts are not enforced"))
            .ok();
        let made = Arc::new(NcclComm { shared, watchdog });
        let registrable: Arc<dyn Registrable> = made.clone();
        registrations.attach(&registrable);
        made
    }
}

impl Shared {
    /// Aborts under the lock: every stream with a group not done yet is marked failed, then
    /// `ncclCommAbort`.
    fn abort_locked(&self, st: &mut State, why: &str) {
        if st.aborted.is_none() {
            st.aborted = Some(format!("rank {} aborted: {why}", self.rank));
        }
        // The streams are marked before the abort: `ncclCommAbort` can take as long as the
        // stream's earlier work, and a `stream_synchronize` that returns meanwhile must already
        // see the failure (it read none when marked after).
        let message = format!(
            "communicator aborted while a collective was queued: {}",
            st.aborted.as_deref().unwrap_or(why)
        );
        for p in st.pending.drain(..) {
            // A group already done (the watchdog had not retired it yet) left nothing
            // unfinished: its stream — the compute stream, for a replay's — is not failed.
            // SAFETY: a live event of our context (current in every caller).
            let done = unsafe { sys::cuEventQuery(p.event) } == sys::CUresult::CUDA_SUCCESS;
            if !done {
                self.failures.mark(p.stream, &message);
            }
            st.spare.push(p.event);
        }
        if !st.comm.is_null() {
            // SAFETY: live communicator; nobody else uses it (we hold the lock).
            unsafe { nccl::ncclCommAbort(st.comm) };
            st.comm = std::ptr::null_mut();
            // Registrations went with the communicator.
            st.registered.clear();
        }
        self.wake.notify_all();
    }

    /// Queues `calls` as one group on `stream` and an event after it.
    fn queue(&self, calls: &[Collective], stream: sys::CUstream) -> DeviceResult<()> {
        let _current = Current::push(self.ctx)?;
        let mut st = lock(&self.state);
        if let Some(why) = &st.aborted {
            return Err(DeviceError::PeerFailed(format!(
                "communicator aborted: {why}"
            )));
        }
        let comm = st.comm;
        let native = stream as nccl::cudaStream_t;
        let mut failed = None;
        // SAFETY: live communicator under the lock; `stream` is a live stream of this device.
        unsafe {
            let r = nccl::ncclGroupStart();
            if r != R::ncclSuccess {
                failed = Some(nccl_error("ncclGroupStart", r, comm));
            } else {
                for c in calls {
                    let (r, call) = issue(c, comm, native);
                    if r != R::ncclSuccess && r != R::ncclInProgress {
                        failed = Some(nccl_error(call, r, comm));
                        break;
                    }
                }
                // A group once started must end, whatever failed inside it.
                let r = nccl::ncclGroupEnd();
                if failed.is_none() {
                    match r {
                        R::ncclSuccess => {}
                        R::ncclInProgress => {
                            let deadline = Instant::now() + self.timeout;
                            if let Err(e) = wait_done(comm, "ncclGroupEnd", deadline) {
                                failed = Some(e.unwrap_or_else(|| {
                                    DeviceError::PeerFailed(format!(
                                        "timed out after {} ms queueing a collective group",
                                        self.timeout.as_millis()
                                    ))
                                }));
                            }
                        }
                        r => failed = Some(nccl_error("ncclGroupEnd", r, comm)),
                    }
                }
            }
        }
        if let Some(e) = failed {
            // The communicator's state is unknown after a failed group: nobody may use it.
            self.abort_locked(&mut st, &e.to_string());
            return Err(e);
        }
        // Queued inside a stream capture, the group does not run now: it runs in each replay,
        // which the runtime hands to `watch_replay`. (An event recorded here would be part of
        // the capture, never complete on its own, and time out.)
        let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a live stream of this context; querying is allowed while it captures.
        super::handles::check("cuStreamIsCapturing", unsafe {
            sys::cuStreamIsCapturing(stream, &mut capture)
        })?;
        if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(());
        }
        self.watch_locked(&mut st, stream)
    }

    /// Records an event on `stream` after the work queued so far and watches it as an
    /// outstanding group (under the state lock, our context current).
    fn watch_locked(&self, st: &mut State, stream: sys::CUstream) -> DeviceResult<()> {
        let event = match st.spare.pop() {
            Some(e) => e,
            None => {
                let mut e: sys::CUevent = std::ptr::null_mut();
                let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                // SAFETY: valid out-pointer; our context is current.
                super::handles::check("cuEventCreate", unsafe {
                    sys::cuEventCreate(&mut e, flags)
                })?;
                e
            }
        };
        // SAFETY: live event and stream of this context.
        let recorded = super::handles::check("cuEventRecord", unsafe {
            sys::cuEventRecord(event, stream)
        });
        if let Err(e) = recorded {
            st.spare.push(event);
            return Err(e);
        }
        st.pending.push_back(Pending {
            event,
            stream: stream as usize,
            since: Instant::now(),
        });
        Ok(())
    }

    /// The watchdog: every `POLL`, retires completed groups, and aborts on an asynchronous NCCL
    /// error or a group outstanding past the timeout. Ends when `Drop` sets `stop`.
    fn watch(&self) {
        let Ok(_current) = Current::push(self.ctx) else {
            log::warn!("NCCL watchdog: cannot make the device's context current; timeouts are not enforced");
            return;
        };
        let mut st = lock(&self.state);
        while !st.stop {
            if !st.comm.is_null() {
                self.check_locked(&mut st);
            }
            st = self
                .wake
                .wait_timeout(st, POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn check_locked(&self, st: &mut State) {
        if let Err(e) = async_state(st.comm, "a queued collective") {
            // InProgress is normal for a non-blocking communicator; only errors abort.
            self.abort_locked(st, &format!("asynchronous NCCL error: {e}"));
            return;
        }
        let now = Instant::now();
        while let Some(head) = st.pending.front() {
            // SAFETY: a live event of our context (current on this thread).
            let r = unsafe { sys::cuEventQuery(head.event) };
            if r == sys::CUresult::CUDA_ERROR_NOT_READY {
                if now.duration_since(head.since) > self.timeout {
                    let why = format!(
                        "timed out after {} ms waiting in a collective (a rank that never \
                         reached it, or failed)",
                        self.timeout.as_millis()
                    );
                    self.abort_locked(st, &why);
                }
                return;
            }
            // Complete (or failed: the stream's own error reports that).
            let done = st.pending.pop_front().unwrap();
            st.spare.push(done.event);
            if let Some(next) = st.pending.front_mut() {
                next.since = next.since.max(now);
            }
        }
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> u32 {
        self.shared.rank
    }

    fn nranks(&self) -> u32 {
        self.shared.nranks
    }

    fn watch_replay(&self, device: &dyn Device, stream: StreamId) -> DeviceResult<()> {
        let native = device.native_stream(stream)? as sys::CUstream;
        let shared = &self.shared;
        let _current = Current::push(shared.ctx)?;
        let mut st = lock(&shared.state);
        if let Some(why) = &st.aborted {
            return Err(DeviceError::PeerFailed(format!(
                "communicator aborted: {why}"
            )));
        }
        shared.watch_locked(&mut st, native)
    }

    fn enqueue(
        &self,
        device: &dyn Device,
        calls: &[Collective],
        stream: StreamId,
    ) -> DeviceResult<()> {
        if device.kind() != DeviceKind::Cuda {
            return Err(DeviceError::Invalid(
                "an NCCL communicator queued on a device of another backend".into(),
            ));
        }
        for c in calls {
            c.check_ranks(self.shared.rank, self.shared.nranks)
                .map_err(DeviceError::Invalid)?;
        }
        let native = device.native_stream(stream)? as sys::CUstream;
        self.shared.queue(calls, native)
    }

    fn abort(&self, why: &str) {
        let Ok(_current) = Current::push(self.shared.ctx) else {
            log::warn!("ncclCommAbort: cannot make the device's context current");
            return;
        };
        let mut st = lock(&self.shared.state);
        self.shared.abort_locked(&mut st, why);
    }

    fn aborted(&self) -> Option<String> {
        lock(&self.shared.state).aborted.clone()
    }
}

impl Registrable for NcclComm {
    fn register(&self, addr: DevPtr, bytes: u64) {
        let Ok(_current) = Current::push(self.shared.ctx) else {
            return;
        };
        let mut st = lock(&self.shared.state);
        if st.comm.is_null() || st.registered.contains_key(&addr) {
            return;
        }
        let comm = st.comm;
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: live communicator under the lock; `addr` is live device memory of `bytes`.
        let r = unsafe {
            nccl::ncclCommRegister(comm, addr as *mut c_void, bytes as usize, &mut handle)
        };
        let done = match r {
            R::ncclSuccess => Ok(()),
            R::ncclInProgress => wait_done(
                comm,
                "ncclCommRegister",
                Instant::now() + self.shared.timeout,
            )
            .map_err(|e| {
                e.map(|e| e.to_string())
                    .unwrap_or_else(|| "timed out".into())
            }),
            r => Err(nccl_error("ncclCommRegister", r, comm).to_string()),
        };
        match done {
            Ok(()) if !handle.is_null() => {
                st.registered.insert(addr, handle as usize);
            }
            Ok(()) => {}
            Err(why) => log::warn!(
                "ncclCommRegister of {bytes} bytes at {addr:#x} failed ({why}): collectives on it run unregistered"
            ),
        }
    }

    fn deregister(&self, addr: DevPtr) {
        let Ok(_current) = Current::push(self.shared.ctx) else {
            return;
        };
        let mut st = lock(&self.shared.state);
        let Some(handle) = st.registered.remove(&addr) else {
            return;
        };
        if !st.comm.is_null() {
            // SAFETY: the handle ncclCommRegister gave for this live communicator.
            let r = unsafe { nccl::ncclCommDeregister(st.comm, handle as *mut c_void) };
            if r != R::ncclSuccess {
                log::warn!("ncclCommDeregister at {addr:#x} failed: {r:?}");
            }
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.wake.notify_all();
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
        let Ok(_current) = Current::push(self.shared.ctx) else {
            log::warn!("releasing an NCCL communicator: cannot make the device's context current; it is leaked");
            return;
        };
        let mut st = lock(&self.shared.state);
        let comm = st.comm;
        if !comm.is_null() {
            for (_, handle) in st.registered.drain() {
                // SAFETY: a handle ncclCommRegister gave for this live communicator.
                unsafe { nccl::ncclCommDeregister(comm, handle as *mut c_void) };
            }
        }
        if !comm.is_null() && self.shared.owned {
            // Finalize waits for queued work (bounded by the timeout), then destroy frees it;
            // a finalize that fails or times out aborts instead.
            // SAFETY: live, owned communicator; its last user is gone.
            let r = unsafe { nccl::ncclCommFinalize(comm) };
            let deadline = Instant::now() + self.shared.timeout;
            let finalized = matches!(r, R::ncclSuccess | R::ncclInProgress)
                && wait_done(comm, "ncclCommFinalize", deadline).is_ok();
            unsafe {
                if finalized {
                    nccl::ncclCommDestroy(comm);
                } else {
                    log::warn!("ncclCommFinalize did not complete: aborting the communicator");
                    nccl::ncclCommAbort(comm);
                }
            }
            st.comm = std::ptr::null_mut();
        }
        let mut events: Vec<sys::CUevent> = st.pending.drain(..).map(|p| p.event).collect();
        events.append(&mut st.spare);
        for e in events {
            // SAFETY: our events; destroying one still pending is allowed (its resources go
            // when it completes).
            unsafe { sys::cuEventDestroy_v2(e) };
        }
    }
}
