//! Fusion by size: consecutive all-reduces on one communicator, of one type and operator, each
//! of one intermediate (all in place, or all out of place), merged at finalize into buckets of
//! at most a given size — the first bucket smaller, so communication starts early (PyTorch
//! DDP's defaults: 1 MiB, then 25 MiB). The same graph gives the same buckets on every rank.
//!
//! A bucket's last node becomes a fused node (`fused.rs`) taking every member's tensors in node
//! order; the earlier nodes are *absorbed*: they keep their index (and the communicator) but no
//! tensors, and the step program skips them. An earlier member's collective is thereby delayed
//! to the bucket's last node, so a bucket closes at any kernel node that touches a tensor of
//! the bucket (it would read a result not reduced yet), at any other collective, and where the
//! next member would pass the size.

use super::fused::FusedGroup;
use super::{Graph, Node, TensorKind};
use crate::kernels::collective::CollectiveKind;
use crate::kernels::Kernel;
use std::sync::Arc;

/// Default bucket size (bytes), as PyTorch DDP's `bucket_cap_mb`.
pub(crate) const DEFAULT_BUCKET_BYTES: u64 = 25 << 20;
/// Default size of the first bucket (bytes), as DDP's first bucket.
pub(crate) const DEFAULT_FIRST_BUCKET_BYTES: u64 = 1 << 20;

impl Node {
    /// A collective node merged into a later node's bucket: it issues nothing itself.
    pub fn is_absorbed(&self) -> bool {
        self.comm.is_some() && self.inputs.is_empty() && self.outputs.is_empty()
    }
}

impl Graph {
    /// Merges consecutive all-reduces into buckets of at most `bucket_bytes` (the first at most
    /// `first_bytes`); `bucket_bytes == 0` turns fusion off. Returns how many nodes were
    /// absorbed. Called before the graph is finalized.
    pub fn fuse_all_reduces(&mut self, first_bytes: u64, bucket_bytes: u64) -> usize {
        if bucket_bytes == 0 {
            return 0;
        }
        let mut buckets: Vec<Vec<u32>> = Vec::new();
        let mut bucket: Vec<u32> = Vec::new();
        let mut bytes = 0u64;
        let mut touched: Vec<u32> = Vec::new();
        let cap = |closed: usize| {
            if closed == 0 {
                first_bytes
            } else {
                bucket_bytes
            }
        };
        let mut closed = 0usize;
        let close = |bucket: &mut Vec<u32>,
                     touched: &mut Vec<u32>,
                     buckets: &mut Vec<Vec<u32>>,
                     closed: &mut usize| {
            if !bucket.is_empty() {
                *closed += 1;
                if bucket.len() > 1 {
                    buckets.push(std::mem::take(bucket));
                }
                bucket.clear();
                touched.clear();
            }
        };
        for n in 0..self.nodes.len() as u32 {
            let node = &self.nodes[n as usize];
            if node.comm.is_none() {
                let clash = node
                    .inputs
                    .iter()
                    .chain(&node.outputs)
                    .any(|t| touched.contains(t));
                if clash {
                    close(&mut bucket, &mut touched, &mut buckets, &mut closed);
                }
                continue;
            }
            let size = self.eligible(n).filter(|_| {
                let node = &self.nodes[n as usize];
                !node
                    .inputs
                    .iter()
                    .chain(&node.outputs)
                    .any(|t| touched.contains(t))
            });
            let joins = match (size, bucket.last()) {
                (Some(size), Some(&last)) => {
                    self.same_bucket(last, n) && bytes + size <= cap(closed)
                }
                _ => false,
            };
            if !joins {
                close(&mut bucket, &mut touched, &mut buckets, &mut closed);
                bytes = 0;
            }
            if let Some(size) = size {
                bucket.push(n);
                bytes += size;
                let node = &self.nodes[n as usize];
                touched.extend(node.inputs.iter().chain(&node.outputs));
            }
        }
        close(&mut bucket, &mut touched, &mut buckets, &mut closed);
        let mut absorbed = 0;
        for b in buckets {
            let last = *b.last().expect("a bucket has members");
            let (mut ins, mut outs) = (Vec::new(), Vec::new());
            for &n in &b {
                let node = &mut self.nodes[n as usize];
                ins.append(&mut node.inputs);
                outs.append(&mut node.outputs);
            }
            for &t in &outs {
                let producer = &mut self.tensors[t as usize].producer;
                if ins != outs {
                    *producer = Some(last); // out of place: the bucket's node writes it now
                }
            }
            let group = |members: &[u32]| {
                let mut offsets = Vec::with_capacity(members.len());
                let mut at = 0;
                for &t in members {
                    offsets.push(at);
                    at += self.tensors[t as usize].size;
                }
                FusedGroup {
                    node: last,
                    members: members.to_vec(),
                    offsets,
                    bytes: at,
                }
            };
            let mut groups = vec![group(&ins)];
            if ins != outs {
                groups.push(group(&outs));
            }
            self.fused.extend(groups);
            let node = &mut self.nodes[last as usize];
            node.inputs = ins;
            node.outputs = outs;
            absorbed += b.len() - 1;
        }
        absorbed
    }

    /// Node `n`'s bytes if it may join a bucket: an all-reduce of one intermediate, not fused.
    fn eligible(&self, n: u32) -> Option<u64> {
        let node = &self.nodes[n as usize];
        let Kernel::Collective {
            kind: CollectiveKind::AllReduce(_),
            ..
        } = node.kernel
        else {
            return None;
        };
        if node.inputs.len() != 1 || node.outputs.len() != 1 {
            return None;
        }
        let (i, o) = (node.inputs[0], node.outputs[0]);
        let plain = |t: u32| {
            self.tensors[t as usize].kind == TensorKind::Intermediate
                && self.fused_slot(t).is_none()
        };
        (plain(i) && plain(o)).then(|| self.tensors[i as usize].size)
    }

    /// Nodes `a` and `b` (both eligible) may share a bucket: one communicator, type and
    /// operator, both in place or both not.
    fn same_bucket(&self, a: u32, b: u32) -> bool {
        let (na, nb) = (&self.nodes[a as usize], &self.nodes[b as usize]);
        let in_place = |n: &Node| n.inputs == n.outputs;
        let comm = |n: &Node| n.comm.as_ref().map(|c| Arc::as_ptr(&c.0) as *const ());
        na.kernel_key() == nb.kernel_key() && comm(na) == comm(nb) && in_place(na) == in_place(nb)
    }
}

impl Node {
    fn kernel_key(&self) -> Option<(CollectiveKind, crate::kernels::collective::DType)> {
        match self.kernel {
            Kernel::Collective { kind, dtype } => Some((kind, dtype)),
            _ => None,
        }
    }
}
