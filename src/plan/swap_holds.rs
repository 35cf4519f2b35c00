//! What collectives and fused groups ask of the swap plan (`swap.rs`).
//!
//! A collective runs on the communication stream, beside compute; the compute stream waits for
//! its event only before the first later node that touches one of its tensors (its *completion
//! node*, `Step::AwaitCollective`), or at the run's end when none does. Until then the
//! collective may still read or write its tensors, so each of them is **pinned**: resident and
//! never a victim from its last use before the collective (its producer, for a gradient) through
//! the completion node. A copy-out the plan places after a tensor's last use is moved past the
//! completion node when that use falls inside the pin (`leave_after`), so the copy starts after
//! the compute stream has waited for the collective; a persistent tensor whose collective
//! completes only at the run's end leaves with the run's end sends home, which follow the
//! run's final waits.
//!
//! A fused group (`graph::fused`) is one allocation: its block is taken at the first producer
//! of any member and returned after the last member's last use. Its members arrive together,
//! stay pinned for the block's whole life (a member cannot leave alone) and leave together.

use crate::graph::collective::completion_node;
use crate::graph::{FusedGroup, Liveness, Node};

/// A span of nodes during which a tensor must stay on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pin {
    from: u32,
    /// The completion node (inclusive); the node count when the run's end completes it.
    until: u32,
}

/// One fused group as the plan sees it.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub members: Vec<u32>,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct CommHolds {
    /// Per tensor: its pins, sorted, disjoint.
    pins: Vec<Vec<Pin>>,
    /// Per node: tensors whose pin starts at it / ends after it.
    pub pin_starts: Vec<Vec<u32>>,
    pub pin_ends: Vec<Vec<u32>>,
    /// Per tensor: its fused block (index into `blocks`, the graph's fused group index).
    block_of: Vec<Option<u32>>,
    pub blocks: Vec<Block>,
    /// Per node: blocks taken at it (its first producer of any member) / returned after it (the
    /// last member's last use).
    pub blocks_at: Vec<Vec<u32>>,
    pub blocks_end: Vec<Vec<u32>>,
}

impl CommHolds {
    /// The holds of a graph's collective nodes and fused groups (empty without collectives).
    pub fn new(tensors: usize, nodes: &[Node], lv: &Liveness, fused: &[FusedGroup]) -> CommHolds {
        let n_nodes = nodes.len() as u32;
        let mut h = CommHolds {
            pins: vec![Vec::new(); tensors],
            pin_starts: vec![Vec::new(); nodes.len()],
            pin_ends: vec![Vec::new(); nodes.len()],
            block_of: vec![None; tensors],
            blocks: Vec::new(),
            blocks_at: vec![Vec::new(); nodes.len()],
            blocks_end: vec![Vec::new(); nodes.len()],
        };
        if !nodes.iter().any(|n| n.comm.is_some()) {
            return h;
        }
        let mut spans: Vec<Vec<Pin>> = vec![Vec::new(); tensors];
        for (c, node) in nodes.iter().enumerate() {
            if node.comm.is_none() || node.is_absorbed() {
                continue;
            }
            let c32 = c as u32;
            let touched: Vec<u32> = node.inputs.iter().chain(&node.outputs).copied().collect();
            let until = completion_node(nodes, c, &touched);
            for &t in &touched {
                let from = lv.last_use_before(t, c32).unwrap_or(c32);
                spans[t as usize].push(Pin { from, until });
            }
        }
        for (g, group) in fused.iter().enumerate() {
            // (One block per group, so `Buf::Group` indices and block indices agree.)
            h.blocks.push(Block {
                members: group.members.clone(),
            });
            let first = group
                .members
                .iter()
                .filter_map(|&t| lv.first_use[t as usize])
                .min();
            let last = group
                .members
                .iter()
                .filter_map(|&t| lv.last_use[t as usize])
                .max();
            let (Some(first), Some(last)) = (first, last) else {
                continue;
            };
            // The block goes back after its last member's last use, pending on the collective.
            let until = spans_end(&spans, &group.members).max(last);
            for &t in &group.members {
                h.block_of[t as usize] = Some(g as u32);
                spans[t as usize].push(Pin { from: first, until });
            }
            h.blocks_at[first as usize].push(g as u32);
            h.blocks_end[last as usize].push(g as u32);
        }
        for (t, mut s) in spans.into_iter().enumerate() {
            s.sort_unstable_by_key(|p| p.from);
            let mut merged: Vec<Pin> = Vec::new();
            for p in s {
                match merged.last_mut() {
                    Some(q) if p.from <= q.until.saturating_add(1) => {
                        q.until = q.until.max(p.until)
                    }
                    _ => merged.push(p),
                }
            }
            for p in &merged {
                h.pin_starts[p.from as usize].push(t as u32);
                h.pin_ends[p.until.min(n_nodes - 1) as usize].push(t as u32);
            }
            h.pins[t] = merged;
        }
        h
    }

    /// True when tensor `t` must stay on the device during node `n`.
    pub fn pinned_at(&self, t: u32, n: u32) -> bool {
        self.pins
            .get(t as usize)
            .is_some_and(|ps| ps.iter().any(|p| p.from <= n && n <= p.until))
    }

    /// True when a collective touches `t` or `t` is a fused member: the plan never drops it
    /// for a recompute (a rebuilt member would need a block of its own).
    pub fn held(&self, t: u32) -> bool {
        self.pins.get(t as usize).is_some_and(|ps| !ps.is_empty())
    }

    /// The fused block `t` is a member of.
    pub fn block_of(&self, t: u32) -> Option<u32> {
        self.block_of.get(t as usize).copied().flatten()
    }

    /// Where a copy-out of `t`, placed after its last use `last`, goes: after `last`, or after
    /// the completion node of a pin `last` falls inside; `None` when that is the run's end (the
    /// run's end sends it home after waiting for the collective).
    pub fn leave_after(&self, t: u32, last: u32, n_nodes: u32) -> Option<u32> {
        let pin = self
            .pins
            .get(t as usize)
            .and_then(|ps| ps.iter().find(|p| p.from <= last && last < p.until));
        match pin {
            None => Some(last),
            Some(p) if p.until >= n_nodes => None,
            Some(p) => Some(p.until),
        }
    }
}

/// The latest pin end among `members`' collective pins (0 when none).
fn spans_end(spans: &[Vec<Pin>], members: &[u32]) -> u32 {
    members
        .iter()
        .flat_map(|&t| spans[t as usize].iter().map(|p| p.until))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
#[path = "swap_holds_tests.rs"]
mod tests;
