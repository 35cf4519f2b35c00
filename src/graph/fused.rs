//! Fused groups: the tensors a collective node takes several of (all-reduce, broadcast,
//! reduce) share one contiguous block, in the order given, so one collective call covers them
//! all. Each member's producer writes straight into its slot; nothing is copied into a bucket.
//!
//! A member is an intermediate tensor in at most one group. An in-place node's inputs and
//! outputs are one group; an out-of-place node has an input group and an output group. The
//! step program allocates a group's block at the first producer of any member and frees it
//! after the last member's last use (pending on the collective's event).

use super::{invalid, Graph, GraphResult, TensorKind};

/// Tensors of one collective node laid out back to back in one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusedGroup {
    /// The collective node.
    pub node: u32,
    /// Tensor indices, in the order the node was given them.
    pub members: Vec<u32>,
    /// Per member: its byte offset in the block (no padding: members hold whole elements).
    pub offsets: Vec<u64>,
    /// The block's size.
    pub bytes: u64,
}

impl FusedGroup {
    /// Member `t`'s byte offset, if `t` is a member.
    pub fn offset_of(&self, t: u32) -> Option<u64> {
        self.members
            .iter()
            .position(|&m| m == t)
            .map(|i| self.offsets[i])
    }
}

impl Graph {
    /// The graph's fused groups, in the order their nodes were added.
    pub fn fused_groups(&self) -> &[FusedGroup] {
        &self.fused
    }

    /// The group tensor `t` belongs to and its offset there.
    pub fn fused_slot(&self, t: u32) -> Option<(u32, u64)> {
        fused_slot(&self.fused, t)
    }

    /// The group `members` (tensor indices) of node `node` would form, checked (`what` names
    /// the node in messages); the caller records it once the node exists.
    pub(super) fn fused_group(
        &self,
        node: u32,
        members: &[u32],
        what: &str,
    ) -> GraphResult<FusedGroup> {
        let mut offsets = Vec::with_capacity(members.len());
        let mut bytes = 0u64;
        for (i, &t) in members.iter().enumerate() {
            let tensor = &self.tensors[t as usize];
            if members[..i].contains(&t) {
                return invalid(format!(
                    "{what}: {} is given twice; fused tensors must be distinct",
                    tensor.describe(t)
                ));
            }
            if tensor.kind != TensorKind::Intermediate {
                return invalid(format!(
                    "{what}: {} is fused with others but is not an intermediate; only intermediates \
                     can share a contiguous block (the host places persistent tensors itself)",
                    tensor.describe(t)
                ));
            }
            if let Some((g, _)) = self.fused_slot(t) {
                return invalid(format!(
                    "{what}: {} is already fused into node {}'s block; a tensor belongs to one block",
                    tensor.describe(t),
                    self.fused[g as usize].node
                ));
            }
            offsets.push(bytes);
            bytes += tensor.size;
        }
        Ok(FusedGroup {
            node,
            members: members.to_vec(),
            offsets,
            bytes,
        })
    }
}

/// The group of `groups` tensor `t` belongs to and its offset there.
pub fn fused_slot(groups: &[FusedGroup], t: u32) -> Option<(u32, u64)> {
    groups
        .iter()
        .enumerate()
        .find_map(|(g, group)| group.offset_of(t).map(|off| (g as u32, off)))
}
