//! The consistency check of a graph's collectives across ranks, made once, before the first run
//! queues anything: every rank must issue the same collectives in the same order on each
//! communicator, or the ranks would wait for each other forever (NCCL) or fail at the first
//! call that differs, naming only its number on the communicator (the host model).
//!
//! Per communicator the graph uses, each rank writes a fixed-size digest of its sequence there
//! (`DIGEST_BYTES`: the number of collectives, a hash of the whole sequence, and per collective,
//! up to `DIGEST_ENTRIES` of them, a hash of its kind, operator, root or peer, type and count
//! with its node index) and all-gathers it on the communicator — one small extra collective,
//! identical on every rank, before the first real one. Each rank then compares the digests and
//! fails with an error naming the first collective that differs, by each rank's node index
//! (`PeerFailed`, `GKRT_STATUS_PEER_FAILED`: the status of every disagreement between ranks).
//!
//! Sends and receives are left out: they pair across ranks (rank 0's send to 1 is rank 1's
//! receive from 0, and ranks outside a pair have neither), so their sequences legitimately
//! differ; NCCL (and the host model) match them pair by pair.

use super::RuntimeGraph;
use crate::device::comm::Communicator;
use crate::kernels::collective::{Collective, CollectiveKind, DType, NO_NODE};
use crate::memory::DeviceBacking;
use crate::runtime::{Error, Result, Runtime, State};
use std::sync::Arc;

/// Bytes of one rank's digest: a 16-byte header and `DIGEST_ENTRIES` entries of 16 bytes.
const DIGEST_BYTES: usize = 4096;
/// Collectives whose entry the digest holds; later ones count in the whole-sequence hash only.
const DIGEST_ENTRIES: usize = (DIGEST_BYTES - 16) / 16;
const MAGIC: u32 = 0x676b_6364; // "gkcd"

/// One rank's digest, decoded.
#[derive(Debug, PartialEq, Eq)]
struct Digest {
    count: u32,
    whole: u64,
    /// (hash, node, element count (saturated)) per collective, at most `DIGEST_ENTRIES`.
    entries: Vec<(u64, u32, u32)>,
}

fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// What a call must agree on across ranks, as text (hashed, and shown in messages).
fn signature(call: &Collective) -> String {
    format!("{:?} of {} x{}", call.kind, call.dtype.name(), call.count)
}

fn encode(calls: &[Collective]) -> Vec<u8> {
    let mut out = vec![0u8; DIGEST_BYTES];
    let mut whole = 0xcbf2_9ce4_8422_2325u64;
    for (i, call) in calls.iter().enumerate() {
        let h = fnv1a(signature(call).as_bytes(), 0xcbf2_9ce4_8422_2325);
        whole = fnv1a(&h.to_le_bytes(), whole);
        if i < DIGEST_ENTRIES {
            let at = 16 + 16 * i;
            out[at..at + 8].copy_from_slice(&h.to_le_bytes());
            out[at + 8..at + 12].copy_from_slice(&call.node.to_le_bytes());
            let count = call.count.min(u32::MAX as u64) as u32;
            out[at + 12..at + 16].copy_from_slice(&count.to_le_bytes());
        }
    }
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&(calls.len() as u32).to_le_bytes());
    out[8..16].copy_from_slice(&whole.to_le_bytes());
    out
}

fn decode(bytes: &[u8]) -> Option<Digest> {
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let long = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    if word(0) != MAGIC {
        return None;
    }
    let count = word(4);
    let entries = (0..(count as usize).min(DIGEST_ENTRIES))
        .map(|i| {
            let at = 16 + 16 * i;
            (long(at), word(at + 8), word(at + 12))
        })
        .collect();
    Some(Digest {
        count,
        whole: long(8),
        entries,
    })
}

/// The first difference between this rank's digest and `other`'s (rank `r`), as a message
/// naming this rank's node (`describe`) and the other's node index.
/// (Each rank's message names its own node fully and the other's by index and count: the digest
/// carries no more.)
fn first_difference(
    mine: &Digest,
    other: &Digest,
    r: u32,
    describe: &dyn Fn(usize) -> String,
) -> Option<String> {
    if mine == other {
        return None;
    }
    let shared = mine.entries.len().min(other.entries.len());
    let k = (0..shared)
        .find(|&i| mine.entries[i].0 != other.entries[i].0)
        .unwrap_or(shared);
    let theirs = |k: usize| match other.entries.get(k) {
        Some(&(_, node, count)) => {
            format!("its node {node} is a different collective (of {count} elements)")
        }
        None if (k as u32) >= other.count => "it has no such collective".to_string(),
        None => "it differs".to_string(),
    };
    if k < DIGEST_ENTRIES && (k < mine.entries.len() || k < other.entries.len()) {
        let ours = if k < mine.entries.len() {
            describe(k)
        } else {
            "none (this rank has no such collective)".to_string()
        };
        return Some(format!(
            "collective {k} on the communicator differs from rank {r}'s: this rank's is {ours}; \
             {} (this rank has {} collectives on it, rank {r} has {})",
            theirs(k),
            mine.count,
            other.count
        ));
    }
    Some(format!(
        "the collectives on the communicator differ from rank {r}'s after the first \
         {DIGEST_ENTRIES} (this rank has {}, rank {r} has {})",
        mine.count, other.count
    ))
}

impl RuntimeGraph {
    /// At the first run of a graph with collectives: compares the ranks' collective sequences
    /// on each communicator the graph uses (see the module docs). Blocking; the state lock is
    /// held by the caller.
    pub(super) fn check_collective_digest(&mut self, rt: &Runtime, st: &mut State) -> Result<()> {
        let mut comms: Vec<Arc<dyn Communicator>> = Vec::new();
        for node in self.graph.nodes() {
            if let Some(c) = &node.comm {
                if !comms.iter().any(|k| Arc::ptr_eq(k, &c.0)) {
                    comms.push(Arc::clone(&c.0));
                }
            }
        }
        for comm in comms {
            let nodes: Vec<u32> = (0..self.graph.nodes().len() as u32)
                .filter(|&n| {
                    let node = &self.graph.nodes()[n as usize];
                    let p2p = matches!(
                        node.kernel,
                        crate::kernels::Kernel::Collective {
                            kind: CollectiveKind::Send { .. } | CollectiveKind::Recv { .. },
                            ..
                        }
                    );
                    !p2p && !node.is_absorbed()
                        && node.comm.as_ref().is_some_and(|c| Arc::ptr_eq(&c.0, &comm))
                })
                .collect();
            let calls: Vec<Collective> = nodes
                .iter()
                .map(|&n| self.graph.collective_call(n))
                .collect();
            let gathered = exchange(rt, st, comm.as_ref(), &encode(&calls))?;
            let mine = decode(&encode(&calls)).expect("our own digest decodes");
            let describe = |k: usize| {
                let n = nodes[k];
                format!(
                    "{} ({})",
                    self.graph.nodes()[n as usize].describe(n),
                    signature(&calls[k])
                )
            };
            for r in 0..comm.nranks() {
                let bytes = &gathered[r as usize * DIGEST_BYTES..(r as usize + 1) * DIGEST_BYTES];
                let Some(other) = decode(bytes) else {
                    return Err(Error::PeerFailed(format!(
                        "rank {r} sent no collective digest (is it running a gkrt graph?)"
                    )));
                };
                if let Some(m) = first_difference(&mine, &other, r, &describe) {
                    return Err(Error::PeerFailed(format!(
                        "rank {} of {}: the ranks' graphs issue different collectives: {m}",
                        comm.rank(),
                        comm.nranks()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// All-gathers `digest` on `comm`: returns every rank's, in rank order. Device memory for the
/// call comes from the pool and goes back before returning.
fn exchange(
    rt: &Runtime,
    st: &mut State,
    comm: &dyn Communicator,
    digest: &[u8],
) -> Result<Vec<u8>> {
    let device = rt.device();
    let (compute, comm_stream) = (rt.streams.compute, rt.streams.comm);
    let n = comm.nranks() as usize;
    let bytes = (DIGEST_BYTES * (n + 1)) as u64;
    let block = st.pool.alloc(&DeviceBacking(device), bytes, compute)?;
    let mut gathered = vec![0u8; DIGEST_BYTES * n];
    let result = (|| -> Result<()> {
        // SAFETY: `digest` outlives the copy (the stream is synchronized before returning).
        unsafe { device.copy_h2d_async(block, digest.as_ptr(), DIGEST_BYTES as u64, compute)? };
        device.stream_synchronize(compute)?;
        let call = Collective {
            kind: CollectiveKind::AllGather,
            dtype: DType::I32,
            count: (DIGEST_BYTES / 4) as u64,
            send: block,
            recv: block + DIGEST_BYTES as u64,
            node: NO_NODE,
        };
        comm.enqueue(device, &[call], comm_stream)?;
        device
            .stream_synchronize(comm_stream)
            .map_err(|e| match e {
                crate::device::DeviceError::Async(m) => Error::PeerFailed(m),
                other => Error::from(other),
            })?;
        // SAFETY: `gathered` outlives the copy (synchronized below).
        unsafe {
            device.copy_d2h_async(
                gathered.as_mut_ptr(),
                block + DIGEST_BYTES as u64,
                gathered.len() as u64,
                compute,
            )?
        };
        device.stream_synchronize(compute)?;
        Ok(())
    })();
    // The streams were synchronized (or the call failed before anything was queued after it).
    let _ = device.stream_synchronize(comm_stream);
    let _ = device.stream_synchronize(compute);
    st.pool.free(&DeviceBacking(device), block)?;
    result.map(|()| gathered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: CollectiveKind, count: u64, node: u32) -> Collective {
        Collective {
            kind,
            dtype: DType::F32,
            count,
            send: 0,
            recv: 0,
            node,
        }
    }

    #[test]
    fn digests_name_the_first_difference() {
        use crate::kernels::collective::ReduceOp;
        let sum = CollectiveKind::AllReduce(ReduceOp::Sum);
        let a = [call(sum, 10, 3), call(sum, 20, 5)];
        let b = [call(sum, 10, 4), call(sum, 21, 7)];
        let (da, db) = (decode(&encode(&a)).unwrap(), decode(&encode(&b)).unwrap());
        let describe = |k: usize| format!("node #{k}");
        assert_eq!(first_difference(&da, &da, 1, &describe), None);
        let m = first_difference(&da, &db, 1, &describe).unwrap();
        assert!(
            m.contains("collective 1") && m.contains("node #1") && m.contains("its node 7"),
            "{m}"
        );
        let m = first_difference(&da, &decode(&encode(&a[..1])).unwrap(), 1, &describe).unwrap();
        assert!(
            m.contains("collective 1") && m.contains("no such collective"),
            "{m}"
        );
        // Beyond the entries: only the whole hash tells.
        let long: Vec<Collective> = (0..DIGEST_ENTRIES as u64 + 3)
            .map(|i| call(sum, 1 + i, 0))
            .collect();
        let mut other = long.clone();
        other.last_mut().unwrap().count += 1;
        let m = first_difference(
            &decode(&encode(&long)).unwrap(),
            &decode(&encode(&other)).unwrap(),
            2,
            &describe,
        )
        .unwrap();
        assert!(m.contains("after the first"), "{m}");
        assert!(decode(&[0u8; DIGEST_BYTES]).is_none());
    }
}
