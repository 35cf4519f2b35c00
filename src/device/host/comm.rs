//! The host backend's model of a communicator: several runtimes of one process (threads) that
//! join the same unique id run every collective with NCCL's semantics, reducing in rank order
//! (`kernels::collective`), so tests of 2, 4 and 8 ranks run in CI.
//!
//! Ranks meet in a *clique*, found by unique id in a process-wide registry (the model's stand-in
//! for NCCL's bootstrap network; the one piece of process-wide state it adds). An id is used up
//! once every rank has joined. A collective is a job on the rank's stream; when the stream
//! reaches it, the rank posts its buffers to the clique's round for that collective (rounds are
//! numbered per rank in queue order, so the n-th collective of every rank meets the n-th of the
//! others) and waits for every rank's post. Each rank then reads the others' send buffers (they
//! are device memory of the same process) into its result, waits until every rank has read, and
//! only then writes its receive buffer: in-place calls are safe, and a rank leaves a round only
//! when nobody reads its memory any more. Sends copy into a mailbox and do not wait, which is
//! what lets a group's send/receive exchange finish whatever the ranks' order.
//!
//! Nothing waits forever: a post whose call differs from another rank's (kind, type, count,
//! root) aborts the clique with a message naming both; every wait gives up after the timeout and
//! aborts; a rank that aborts or leaves (drops its communicator) wakes every waiter, which fails
//! with `PeerFailed`.

use crate::device::comm::*;
use crate::device::registration::Registrable;
use crate::device::{DevPtr, Device, DeviceError, DeviceResult, StreamId};
use crate::kernels::collective;
use once_cell::sync::Lazy;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Marks ids made by this model, so that an id from elsewhere (an NCCL id) is recognised.
const MAGIC: &[u8; 16] = b"gkrt-host-comm\0\x01";

static CLIQUES: Lazy<Mutex<HashMap<UniqueId, Arc<Clique>>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh id: the magic, then this process's id, a counter and the time, so that ids never
/// repeat within a process and hardly across processes.
pub fn unique_id() -> UniqueId {
    let mut bytes = [0u8; UNIQUE_ID_BYTES];
    bytes[..16].copy_from_slice(MAGIC);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    bytes[16..24].copy_from_slice(&(std::process::id() as u64).to_le_bytes());
    bytes[24..32].copy_from_slice(&NEXT_ID.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    bytes[32..40].copy_from_slice(&nanos.to_le_bytes());
    UniqueId(bytes)
}

/// One rank's part of a round: its call and buffers.
#[derive(Clone, Copy)]
struct Post {
    call: Collective,
}

#[derive(Default)]
struct Round {
    posts: Vec<Option<Post>>,
    /// Ranks that have read every buffer they need: their memory may be overwritten once all
    /// have.
    read: u32,
    /// Ranks that have left the round; the last removes it.
    left: u32,
}

struct CliqueState {
    joined: Vec<bool>,
    /// Ranks whose communicator was dropped: nothing of theirs will come any more.
    departed: Vec<bool>,
    aborted: Option<String>,
    rounds: HashMap<u64, Round>,
    /// (from, to) → messages sent and not yet received, in order.
    mailboxes: HashMap<(u32, u32), VecDeque<Vec<u8>>>,
}

struct Clique {
    nranks: u32,
    state: Mutex<CliqueState>,
    changed: Condvar,
}

/// Waits on the clique until `ready` says so, it is aborted (when `abortable`), or the deadline
/// passes (which aborts it, naming `what` was awaited). The guard comes back with the outcome, so
/// that a caller that gives up can take back what it posted before anyone else sees it.
fn wait_until<'a>(
    clique: &'a Clique,
    mut st: MutexGuard<'a, CliqueState>,
    timeout: Duration,
    abortable: bool,
    what: &dyn Fn(&CliqueState) -> String,
    ready: &dyn Fn(&CliqueState) -> Result<bool, String>,
) -> (MutexGuard<'a, CliqueState>, DeviceResult<()>) {
    let deadline = Instant::now() + timeout;
    loop {
        // Readiness first: what every rank has already done (joined, posted) stands even if
        // one of them aborts right after.
        match ready(&st) {
            Ok(true) => return (st, Ok(())),
            Ok(false) => {}
            Err(why) => {
                st.aborted.get_or_insert_with(|| why.clone());
                clique.changed.notify_all();
                return (st, Err(DeviceError::PeerFailed(why)));
            }
        }
        if let (true, Some(why)) = (abortable, &st.aborted) {
            let e = DeviceError::PeerFailed(format!("communicator aborted: {why}"));
            return (st, Err(e));
        }
        let now = Instant::now();
        if now >= deadline {
            let why = format!(
                "timed out after {} ms waiting for {}",
                timeout.as_millis(),
                what(&st)
            );
            st.aborted.get_or_insert_with(|| why.clone());
            clique.changed.notify_all();
            return (st, Err(DeviceError::PeerFailed(why)));
        }
        st = clique.changed.wait_timeout(st, deadline - now).unwrap().0;
    }
}

/// Ranks in `0..n` for which `pending(rank)`, listed for a message.
fn ranks_where(n: u32, pending: impl Fn(usize) -> bool) -> String {
    let list: Vec<String> = (0..n as usize)
        .filter(|&r| pending(r))
        .map(|r| r.to_string())
        .collect();
    format!("rank(s) {}", list.join(", "))
}

/// A rank of a clique, as the stream worker that runs its calls sees it.
#[derive(Clone)]
struct Member {
    clique: Arc<Clique>,
    rank: u32,
    timeout: Duration,
}

/// A rank's communicator in the host model. Dropping it leaves the clique.
pub struct HostComm {
    member: Member,
    /// The number of the next collective this rank queues (rounds match by it).
    next_round: AtomicU64,
    /// The model of `ncclCommRegister`: ranges registered and not yet deregistered (address →
    /// bytes). Host memory needs no registration; keeping the set lets tests check the device's
    /// bookkeeping (`registration.rs`).
    registered: Mutex<BTreeMap<DevPtr, u64>>,
}

impl HostComm {
    /// The ranges registered with this communicator now.
    #[cfg(test)]
    pub fn registered(&self) -> Vec<(DevPtr, u64)> {
        let r = self.registered.lock().unwrap();
        r.iter().map(|(&a, &b)| (a, b)).collect()
    }
}

impl Registrable for HostComm {
    fn register(&self, addr: DevPtr, bytes: u64) {
        self.registered.lock().unwrap().insert(addr, bytes);
    }

    fn deregister(&self, addr: DevPtr) {
        self.registered.lock().unwrap().remove(&addr);
    }
}

/// Joins the clique of `id` as `rank` of `nranks`, waiting (up to the timeout) for every rank
/// to join, as `ncclCommInitRank` does.
#[cfg(test)]
pub fn init_rank(
    id: &UniqueId,
    rank: u32,
    nranks: u32,
    options: CommOptions,
) -> DeviceResult<Arc<dyn Communicator>> {
    Ok(join(id, rank, nranks, options)?)
}

/// `init_rank`, as the concrete type (the device also registers its memory with it).
pub fn join(
    id: &UniqueId,
    rank: u32,
    nranks: u32,
    options: CommOptions,
) -> DeviceResult<Arc<HostComm>> {
    if nranks == 0 || rank >= nranks {
        return Err(DeviceError::Invalid(format!(
            "rank {rank} of {nranks}: the rank must be below the number of ranks, which must be at least 1"
        )));
    }
    if id.0[..16] != MAGIC[..] {
        return Err(DeviceError::Invalid(
            "the unique id was not made by gkrt_comm_get_unique_id on the host backend".into(),
        ));
    }
    let clique = {
        let mut registry = CLIQUES.lock().unwrap();
        let clique = registry
            .entry(*id)
            .or_insert_with(|| {
                Arc::new(Clique {
                    nranks,
                    state: Mutex::new(CliqueState {
                        joined: vec![false; nranks as usize],
                        departed: vec![false; nranks as usize],
                        aborted: None,
                        rounds: HashMap::new(),
                        mailboxes: HashMap::new(),
                    }),
                    changed: Condvar::new(),
                })
            })
            .clone();
        if clique.nranks != nranks {
            return Err(DeviceError::Invalid(format!(
                "rank {rank} joins with {nranks} ranks, but the communicator of this unique id was started with {}",
                clique.nranks
            )));
        }
        let mut st = clique.state.lock().unwrap();
        if let Some(why) = &st.aborted {
            return Err(DeviceError::PeerFailed(format!(
                "the communicator of this unique id was aborted while ranks joined: {why}"
            )));
        }
        if st.joined[rank as usize] {
            return Err(DeviceError::Invalid(format!(
                "rank {rank} has already joined the communicator of this unique id"
            )));
        }
        st.joined[rank as usize] = true;
        if st.joined.iter().all(|&j| j) {
            // Every rank is in: the id is used up.
            registry.remove(id);
        }
        clique.changed.notify_all();
        drop(st);
        clique
    };
    let comm = HostComm {
        member: Member {
            clique: Arc::clone(&clique),
            rank,
            timeout: options.timeout,
        },
        next_round: AtomicU64::new(0),
        registered: Mutex::new(BTreeMap::new()),
    };
    let st = clique.state.lock().unwrap();
    let (st, joined) = wait_until(
        &clique,
        st,
        options.timeout,
        true,
        &|st| {
            format!(
                "{} to join (rank {rank} of {nranks})",
                ranks_where(nranks, |r| !st.joined[r])
            )
        },
        &|st| Ok(st.joined.iter().all(|&j| j)),
    );
    drop(st);
    if let Err(e) = joined {
        // Nobody can complete this clique now: forget the id (dropping `comm` marks the rank
        // departed).
        CLIQUES.lock().unwrap().remove(id);
        return Err(e);
    }
    Ok(Arc::new(comm))
}

impl Member {
    /// Runs one group of calls on this rank (on its stream's worker).
    fn run_group(&self, calls: &[(u64, Collective)]) -> DeviceResult<()> {
        // Sends first: they never wait, so a receive later in the group can be matched by a
        // peer whose group sends after receiving.
        for (_, call) in calls
            .iter()
            .filter(|(_, c)| matches!(c.kind, CollectiveKind::Send { .. }))
        {
            self.send(call)?;
        }
        for (round, call) in calls {
            match call.kind {
                CollectiveKind::Send { .. } => {}
                CollectiveKind::Recv { peer } => self.recv(peer, call)?,
                _ => self.collective(*round, call)?,
            }
        }
        Ok(())
    }

    fn send(&self, call: &Collective) -> DeviceResult<()> {
        let CollectiveKind::Send { peer } = call.kind else {
            unreachable!()
        };
        let bytes = (call.count * call.dtype.size()) as usize;
        // SAFETY: the send buffer is device memory of this rank, kept alive by stream order.
        let data = unsafe { std::slice::from_raw_parts(call.send as *const u8, bytes) }.to_vec();
        let mut st = self.clique.state.lock().unwrap();
        if let Some(why) = &st.aborted {
            return Err(DeviceError::PeerFailed(format!(
                "communicator aborted: {why}"
            )));
        }
        st.mailboxes
            .entry((self.rank, peer))
            .or_default()
            .push_back(data);
        self.clique.changed.notify_all();
        Ok(())
    }

    fn recv(&self, peer: u32, call: &Collective) -> DeviceResult<()> {
        let me = self.rank;
        let key = (peer, me);
        let st = self.clique.state.lock().unwrap();
        let (mut st, received) = wait_until(
            &self.clique,
            st,
            self.timeout,
            true,
            &|_| format!("rank {peer} to send to rank {me}"),
            &|st| {
                if st.mailboxes.get(&key).is_some_and(|q| !q.is_empty()) {
                    Ok(true)
                } else if st.departed[peer as usize] {
                    Err(format!(
                        "rank {me} waits to receive from rank {peer}, which has left the communicator"
                    ))
                } else {
                    Ok(false)
                }
            },
        );
        received?;
        let data = st.mailboxes.get_mut(&key).unwrap().pop_front().unwrap();
        drop(st);
        let want = (call.count * call.dtype.size()) as usize;
        if data.len() != want {
            let why = format!(
                "rank {me} receives {want} bytes from rank {peer}, which sent {}",
                data.len()
            );
            self.abort(&why);
            return Err(DeviceError::PeerFailed(why));
        }
        // SAFETY: the receive buffer is device memory of this rank, alive by stream order.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), call.recv as *mut u8, want) };
        Ok(())
    }

    fn collective(&self, round: u64, call: &Collective) -> DeviceResult<()> {
        let n = self.clique.nranks;
        let me = self.rank as usize;
        let mut st = self.clique.state.lock().unwrap();
        if let Some(why) = &st.aborted {
            return Err(DeviceError::PeerFailed(format!(
                "communicator aborted: {why}"
            )));
        }
        {
            let r = st.rounds.entry(round).or_default();
            if r.posts.is_empty() {
                r.posts = vec![None; n as usize];
            }
            r.posts[me] = Some(Post { call: *call });
            // A post that differs from one already there: nobody may run this round.
            let other = r
                .posts
                .iter()
                .enumerate()
                .find_map(|(k, p)| p.filter(|p| !same_call(&p.call, call)).map(|p| (k, p)));
            if let Some((k, p)) = other {
                r.posts[me] = None;
                let why = mismatch(round, me, call, k, &p.call);
                st.aborted = Some(why.clone());
                self.clique.changed.notify_all();
                return Err(DeviceError::PeerFailed(why));
            }
        }
        self.clique.changed.notify_all();
        let everyone_posted = |st: &CliqueState| -> Result<bool, String> {
            let posts = &st.rounds[&round].posts;
            if posts.iter().all(|p| p.is_some()) {
                // The poster that made the posts differ aborted; nobody reads mismatched buffers.
                if let Some(k) = posts
                    .iter()
                    .position(|p| !same_call(&p.unwrap().call, call))
                {
                    return Err(mismatch(round, me, call, k, &posts[k].unwrap().call));
                }
                return Ok(true);
            }
            // A rank that aborted (a mismatch it found) and then left: its reason, not only
            // that it left (which rank wakes first is a race).
            if let Some(why) = &st.aborted {
                return Err(format!("communicator aborted: {why}"));
            }
            match (0..n as usize).find(|&k| posts[k].is_none() && st.departed[k]) {
                Some(k) => Err(format!(
                    "rank {me} waits in collective #{round} for rank {k}, which has left the communicator"
                )),
                None => Ok(false),
            }
        };
        let posted;
        (st, posted) = wait_until(
            &self.clique,
            st,
            self.timeout,
            true,
            &|st| {
                format!(
                    "{} to reach collective #{round} ({})",
                    ranks_where(n, |k| st.rounds[&round].posts[k].is_none()),
                    call.kind.name()
                )
            },
            &everyone_posted,
        );
        if let Err(e) = posted {
            // Taken back under the same lock: no rank can now see every post, so none reads
            // this rank's buffers after it has gone on.
            if let Some(r) = st.rounds.get_mut(&round) {
                r.posts[me] = None;
            }
            return Err(e);
        }
        let posts: Vec<Collective> = st.rounds[&round]
            .posts
            .iter()
            .map(|p| p.unwrap().call)
            .collect();
        drop(st);
        // Every rank's buffers stay put until all have read (the barrier below).
        let result = compute(&posts, me as u32);
        let mut st = self.clique.state.lock().unwrap();
        st.rounds.get_mut(&round).unwrap().read += 1;
        self.clique.changed.notify_all();
        // Not abortable: every rank that saw all the posts reads (a copy, bounded), and none may
        // go on (and free its buffers) while another still reads them.
        let read;
        (st, read) = wait_until(
            &self.clique,
            st,
            self.timeout,
            false,
            &|st| {
                format!(
                    "every rank to finish reading collective #{round} ({} of {n} have)",
                    st.rounds[&round].read
                )
            },
            &|st| Ok(st.rounds[&round].read == n),
        );
        read?;
        let r = st.rounds.get_mut(&round).unwrap();
        r.left += 1;
        if r.left == n {
            st.rounds.remove(&round);
        }
        drop(st);
        if let Some(bytes) = result {
            // SAFETY: this rank's receive buffer, alive by stream order; no rank reads it now.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), call.recv as *mut u8, bytes.len())
            };
        }
        Ok(())
    }
}

/// The message of a round whose calls differ.
fn mismatch(round: u64, me: usize, call: &Collective, k: usize, other: &Collective) -> String {
    format!(
        "collective #{round} differs between ranks: rank {me} calls {} on {} {} elements{}, rank {k} calls {} on {} {} elements{}",
        call.kind.name(),
        call.count,
        call.dtype.name(),
        call.node_suffix(),
        other.kind.name(),
        other.count,
        other.dtype.name(),
        other.node_suffix()
    )
}

/// Calls that may meet in one round: same kind (with root and operator), type and count.
fn same_call(a: &Collective, b: &Collective) -> bool {
    a.kind == b.kind && a.dtype == b.dtype && a.count == b.count
}

/// What rank `me` receives from the round of `posts` (one per rank), or None when it receives
/// nothing (a reduce's non-root).
fn compute(posts: &[Collective], me: u32) -> Option<Vec<u8>> {
    let call = posts[me as usize];
    let elem = call.dtype.size();
    // SAFETY: every rank's send buffer is device memory of this process, held by its owner's
    // stream in this round until every rank has read (the round's barrier).
    let view = |c: &Collective, offset_elems: u64, elems: u64| -> &[u8] {
        unsafe {
            std::slice::from_raw_parts(
                (c.send + offset_elems * elem) as *const u8,
                (elems * elem) as usize,
            )
        }
    };
    let count = call.count;
    match call.kind {
        CollectiveKind::AllReduce(op) => {
            let parts: Vec<&[u8]> = posts.iter().map(|c| view(c, 0, count)).collect();
            Some(collective::reduce(op, call.dtype, &parts))
        }
        CollectiveKind::Reduce { op, root } => (me == root).then(|| {
            let parts: Vec<&[u8]> = posts.iter().map(|c| view(c, 0, count)).collect();
            collective::reduce(op, call.dtype, &parts)
        }),
        CollectiveKind::Broadcast { root } => Some(view(&posts[root as usize], 0, count).to_vec()),
        CollectiveKind::AllGather => Some(
            posts
                .iter()
                .flat_map(|c| view(c, 0, count).iter().copied())
                .collect(),
        ),
        CollectiveKind::ReduceScatter(op) => {
            let parts: Vec<&[u8]> = posts
                .iter()
                .map(|c| view(c, me as u64 * count, count))
                .collect();
            Some(collective::reduce(op, call.dtype, &parts))
        }
        CollectiveKind::Send { .. } | CollectiveKind::Recv { .. } => {
            unreachable!("point-to-point calls have no round")
        }
    }
}

impl Member {
    fn abort(&self, why: &str) {
        let mut st = self.clique.state.lock().unwrap();
        if st.aborted.is_none() {
            st.aborted = Some(format!("rank {} aborted: {why}", self.rank));
        }
        self.clique.changed.notify_all();
    }
}

impl Communicator for HostComm {
    fn rank(&self) -> u32 {
        self.member.rank
    }

    fn nranks(&self) -> u32 {
        self.member.clique.nranks
    }

    fn enqueue(
        &self,
        device: &dyn Device,
        calls: &[Collective],
        stream: StreamId,
    ) -> DeviceResult<()> {
        if device.kind() != crate::device::DeviceKind::Host {
            return Err(DeviceError::Invalid(
                "a host-backend communicator queued on a device of another backend".into(),
            ));
        }
        for c in calls {
            c.check_ranks(self.rank(), self.nranks())
                .map_err(DeviceError::Invalid)?;
        }
        if let Some(why) = self.aborted() {
            return Err(DeviceError::PeerFailed(format!(
                "communicator aborted: {why}"
            )));
        }
        // Rounds are numbered now, in queue order, so they match other ranks' queue order
        // whatever the stream's timing.
        let numbered: Vec<(u64, Collective)> = calls
            .iter()
            .map(|c| {
                let round = if c.kind.is_p2p() {
                    u64::MAX
                } else {
                    self.next_round.fetch_add(1, Ordering::Relaxed)
                };
                (round, *c)
            })
            .collect();
        let member = self.member.clone();
        device.enqueue_host_work(
            stream,
            Box::new(move |_| member.run_group(&numbered).map_err(|e| e.to_string())),
        )
    }

    fn abort(&self, why: &str) {
        self.member.abort(why);
    }

    fn aborted(&self) -> Option<String> {
        self.member.clique.state.lock().unwrap().aborted.clone()
    }
}

impl Drop for HostComm {
    fn drop(&mut self) {
        let clique = &self.member.clique;
        let mut st = clique.state.lock().unwrap();
        st.departed[self.member.rank as usize] = true;
        clique.changed.notify_all();
    }
}

#[cfg(test)]
#[path = "comm_tests.rs"]
mod tests;
