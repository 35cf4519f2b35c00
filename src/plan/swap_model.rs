//! A timeline model of one swapping run, for judging swap plans without a device: the executor's
//! queueing order and its waits (see `exec`), three streams (compute, copy in, copy out), node
//! costs given in milliseconds, one link bandwidth each way, and a pool counted in bytes (no
//! fragmentation). The host queues far ahead of the device, so a pending block is never seen
//! complete while a run is being queued: that is what the executor meets on a GPU.
//!
//! Collectives run on a fourth stream, the communication stream: a collective starts when the
//! compute work queued before it is done (and the stream's previous collective), takes its
//! measured time (`cost_ms`, timed on the communication stream in the first runs) or, where
//! none was measured (0), its bytes over an assumed `ASSUMED_COMM_GBPS`; the compute stream
//! waits for it only at `AwaitCollective`, and a copy-out of a tensor it touched starts after
//! it. A tensor freed while its collective may run is pending on it, like a copy-out's block.
//! A fused group is one block, taken whole at its first producer.
//!
//! The runtime uses it to choose among candidate plans once the first runs have measured
//! the nodes and the link (`RuntimeGraph::tune_swap_plan`); the figures are estimates to compare
//! plans by, not measurements.

use crate::graph::fused::fused_slot;
use crate::graph::liveness::round_up;
use crate::graph::{Node, Tensor};
use crate::plan::program::{Program, Step};

/// The link rate the model assumes for a collective no run has timed, in GB/s of the bytes it
/// sends: PCIe-class, the slow end of what ranks meet over (NVLink is an order of magnitude
/// faster), so an unmeasured collective is not taken to hide behind compute that it may not.
const ASSUMED_COMM_GBPS: f64 = 20.0;

/// A collective's time on the communication stream: measured, else its bytes over
/// `ASSUMED_COMM_GBPS`.
fn collective_ms(tensors: &[Tensor], node: &Node, measured_ms: f64) -> f64 {
    if measured_ms > 0.0 {
        return measured_ms;
    }
    let sum = |ts: &[u32]| ts.iter().map(|&t| tensors[t as usize].size).sum::<u64>();
    let bytes = sum(&node.inputs).max(sum(&node.outputs));
    bytes as f64 / (ASSUMED_COMM_GBPS * 1e6)
}

#[derive(Clone, Debug, Default)]
pub struct Estimate {
    /// Per queued node, in order: when its kernel starts on the compute stream (a collective:
    /// on the communication stream), and how long compute had waited on copies since the
    /// previous kernel (0 for a collective).
    pub starts: Vec<(f64, f64)>,
    pub step_ms: f64,
    pub compute_ms: f64,
    pub compute_waited_ms: f64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// Per program step: the compute stream's clock when the executor performs it (the end of
    /// the work queued before it), non-decreasing.
    pub step_clock: Vec<f64>,
    /// Per copy-out that copies (the block goes back pending on the copy): (step, tensor, when
    /// the copy ends). The sends home after the last node included.
    pub copy_ends: Vec<(u32, u32, f64)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Where {
    Host,
    Device,
    In(f64),
}

struct Pending {
    bytes: u64,
    done: f64,
}

pub use crate::plan::swap::Link;

/// Per tensor: whether a run of `program` leaves it newer on the device than on the host — written
/// (by a node or a rebuild) and not copied out since. A kept tensor copied out after its last
/// write and brought back is clean, as the executor finds it at the next run's start.
pub fn dirty_at_end(tensor_count: usize, nodes: &[Node], program: &Program) -> Vec<bool> {
    let mut dirty = vec![false; tensor_count];
    for &step in &program.steps {
        match step {
            Step::Launch(n) => {
                for &t in &nodes[n as usize].outputs {
                    dirty[t as usize] = true;
                }
            }
            Step::Recompute { tensor, .. } => dirty[tensor as usize] = true,
            Step::CopyOut(t) | Step::SendHome(t) => dirty[t as usize] = false,
            _ => {}
        }
    }
    dirty
}

/// Estimates the step time of one run of `program` (compiled for a swap plan), nodes costing
/// `cost_ms`. It walks the program's steps as the executor does: an allocation that finds no
/// free memory takes one pending block (only its user waits for its copy), else waits for every
/// pending copy-out on the compute stream.
#[cfg_attr(not(test), allow(dead_code))] // (the runtime estimates with copy waits)
pub fn estimate(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    cost_ms: &[f64],
    link: Link,
    align: u64,
) -> Estimate {
    estimate_with_copy_waits(tensors, nodes, program, cost_ms, link, align, &[])
}

/// `estimate` of a run that places its blocks where the pool's dry run did
/// (`swap_placements`): an allocation of step `s` that takes the range tensor `t`'s copy-out
/// freed earlier in the run waits for that copy, for each `(s, t)` of `copy_waits` (sorted by
/// step) — the compute stream for a node's memory, the copy-in stream for a return's.
pub fn estimate_with_copy_waits(
    tensors: &[Tensor],
    nodes: &[Node],
    program: &Program,
    cost_ms: &[f64],
    link: Link,
    align: u64,
    copy_waits: &[(u32, u32)],
) -> Estimate {
    let ms_in = |bytes: u64| bytes as f64 / (link.in_gbps * 1e6);
    let ms_out = |bytes: u64| bytes as f64 / (link.out_gbps * 1e6);
    let size = |t: u32| round_up(tensors[t as usize].size, align);
    let mut at = vec![Where::Host; tensors.len()];
    // A kept tensor the run leaves newer on the device than on the host starts the next run so:
    // leaving, it is copied.
    let dirty_at_end = dirty_at_end(tensors.len(), nodes, program);
    let mut host_valid: Vec<bool> = tensors.iter().map(|t| t.kind.persists()).collect();
    for &t in &program.keep {
        host_valid[t as usize] &= !dirty_at_end[t as usize];
    }
    let mut out_done = vec![0.0f64; tensors.len()];
    // Per tensor: when its block, freed by a copy-out this run, is free of the copy (0: none).
    let mut freed_after = vec![0.0f64; tensors.len()];
    // When the allocations of step `i` may use the copy-out ranges they take.
    let copies_done = |i: usize, freed_after: &[f64]| {
        let from = copy_waits.partition_point(|&(s, _)| (s as usize) < i);
        copy_waits[from..]
            .iter()
            .take_while(|&&(s, _)| s as usize == i)
            .map(|&(_, t)| freed_after[t as usize])
            .fold(0.0, f64::max)
    };
    let mut m = Model {
        e: Estimate::default(),
        budget: program.budget,
        allocated: 0,
        pending: Vec::new(),
        compute: 0.0,
    };
    let (mut copy_in, mut copy_out) = (0.0f64, 0.0f64);
    // The communication stream's clock; per node, when its collective ends; per tensor, when
    // the last collective touching it ends.
    let mut comm = 0.0f64;
    let mut comm_done = vec![0.0f64; nodes.len()];
    let mut comm_busy = vec![0.0f64; tensors.len()];
    let mut group_held = vec![false; program.fused.len()];
    let group_size = |g: usize| round_up(program.fused[g].bytes, align);
    for &t in &program.keep {
        at[t as usize] = Where::Device;
        m.allocated += size(t);
    }
    // Returns that found no room, with the step that deferred them (its copy waits).
    let mut deferred: Vec<(u32, usize)> = Vec::new();
    let mut waited_until_last = 0.0f64;
    let n_nodes = nodes.len() as u32;
    let start_len = program.start_len(nodes.len());
    // A tensor the compute stream reads: wait for its copy-in, or copy it in now.
    // (`taken`: when the copy-out ranges its block takes are free of their copies.)
    let ready = |t: u32,
                 m: &mut Model,
                 at: &mut [Where],
                 copy_in: &mut f64,
                 out_done: &[f64],
                 taken: f64| match at[t as usize] {
        Where::Device => {}
        Where::In(done) => {
            m.wait(done);
            at[t as usize] = Where::Device;
        }
        Where::Host => {
            // The model has no fallback eviction: count the bytes, wait for the link.
            m.wait(taken);
            let s = size(t);
            m.allocated += s;
            let start = copy_in.max(m.compute).max(out_done[t as usize]);
            *copy_in = start + ms_in(s);
            m.e.bytes_in += s;
            m.wait(*copy_in);
            at[t as usize] = Where::Device;
        }
    };
    for (i, &step) in program.steps.iter().enumerate() {
        let node = program.step_node[i];
        m.e.step_clock.push(m.compute);
        match step {
            Step::SendHome(t) | Step::CopyOut(t) => {
                if at[t as usize] != Where::Device {
                    continue;
                }
                let s = size(t);
                at[t as usize] = Where::Host;
                if node == n_nodes && i >= start_len {
                    // End of run: the copies home run after the last node.
                    if !host_valid[t as usize] {
                        copy_out = copy_out.max(m.compute).max(comm_busy[t as usize]) + ms_out(s);
                        m.e.copy_ends.push((i as u32, t, copy_out));
                        m.e.bytes_out += s;
                        host_valid[t as usize] = true;
                    }
                    continue;
                }
                m.allocated -= s;
                freed_after[t as usize] = 0.0;
                if !host_valid[t as usize] {
                    let start = copy_out.max(m.compute).max(comm_busy[t as usize]);
                    copy_out = start + ms_out(s);
                    out_done[t as usize] = copy_out;
                    freed_after[t as usize] = copy_out;
                    m.e.copy_ends.push((i as u32, t, copy_out));
                    m.pending.push(Pending {
                        bytes: s,
                        done: copy_out,
                    });
                    host_valid[t as usize] = true;
                    m.e.bytes_out += s;
                }
            }
            Step::RetryDeferred | Step::CopyIn(_) => {
                let waiting = match step {
                    Step::CopyIn(t) => vec![(t, i)],
                    _ => std::mem::take(&mut deferred),
                };
                for (t, from) in waiting {
                    if at[t as usize] != Where::Host {
                        continue;
                    }
                    let s = size(t);
                    match m.take(s, false) {
                        Some(ready_at) => {
                            let start = copy_in
                                .max(m.compute)
                                .max(out_done[t as usize])
                                .max(ready_at)
                                .max(copies_done(from, &freed_after));
                            copy_in = start + ms_in(s);
                            at[t as usize] = Where::In(copy_in);
                            m.e.bytes_in += s;
                        }
                        None => deferred.push((t, from)),
                    }
                }
            }
            Step::Recompute {
                tensor, producer, ..
            } => {
                if at[tensor as usize] != Where::Host {
                    continue;
                }
                let taken = copies_done(i, &freed_after);
                for &t in &nodes[producer as usize].inputs {
                    ready(t, &mut m, &mut at, &mut copy_in, &out_done, taken);
                }
                m.wait(taken);
                m.output(size(tensor));
                at[tensor as usize] = Where::Device;
                host_valid[tensor as usize] = false;
                m.compute += cost_ms[producer as usize];
                m.e.compute_ms += cost_ms[producer as usize];
            }
            Step::Ready(t) | Step::Settle(t) => {
                if matches!(step, Step::Settle(_)) && !matches!(at[t as usize], Where::In(_)) {
                    continue;
                }
                let taken = copies_done(i, &freed_after);
                ready(t, &mut m, &mut at, &mut copy_in, &out_done, taken);
            }
            Step::Alloc { node: n, .. } => {
                m.wait(copies_done(i, &freed_after));
                for &t in &nodes[n as usize].outputs {
                    if let Some((g, _)) = fused_slot(&program.fused, t) {
                        // The whole block, at the first producer of any member.
                        if !std::mem::replace(&mut group_held[g as usize], true) {
                            m.output(group_size(g as usize));
                            for &member in &program.fused[g as usize].members {
                                at[member as usize] = Where::Device;
                            }
                        }
                    } else if at[t as usize] == Where::Host {
                        m.output(size(t));
                        at[t as usize] = Where::Device;
                    }
                    host_valid[t as usize] = false;
                }
            }
            Step::Launch(n) => {
                m.e.starts
                    .push((m.compute, m.e.compute_waited_ms - waited_until_last));
                waited_until_last = m.e.compute_waited_ms;
                m.compute += cost_ms[n as usize];
                m.e.compute_ms += cost_ms[n as usize];
            }
            Step::FreeWorkspaces(_) => {}
            Step::Collective(n) => {
                let node = &nodes[n as usize];
                let start = comm.max(m.compute);
                m.e.starts.push((start, 0.0));
                comm = start + collective_ms(tensors, node, cost_ms[n as usize]);
                comm_done[n as usize] = comm;
                for &t in node.inputs.iter().chain(&node.outputs) {
                    comm_busy[t as usize] = comm;
                }
            }
            Step::AwaitCollective(n) => m.wait(comm_done[n as usize]),
            Step::FreeGroup(g) => {
                if std::mem::take(&mut group_held[g as usize]) {
                    let members = &program.fused[g as usize].members;
                    let busy = members
                        .iter()
                        .map(|&t| comm_busy[t as usize])
                        .fold(0.0, f64::max);
                    m.release(group_size(g as usize), busy);
                }
            }
            Step::Free(t) => {
                if fused_slot(&program.fused, t).is_some() {
                    at[t as usize] = Where::Host; // its block goes back at `FreeGroup`
                } else if at[t as usize] != Where::Host {
                    m.release(size(t), comm_busy[t as usize]);
                    at[t as usize] = Where::Host;
                }
            }
            Step::Drop(t) => {
                if at[t as usize] == Where::Device {
                    m.allocated -= size(t); // no copy: it is recomputed before its next use
                    at[t as usize] = Where::Host;
                }
            }
        }
    }
    m.e.step_ms = m.compute.max(copy_in).max(copy_out).max(comm);
    m.e
}

/// The compute stream's clock and the pool counted in bytes.
struct Model {
    e: Estimate,
    budget: u64,
    allocated: u64,
    pending: Vec<Pending>,
    compute: f64,
}

impl Model {
    /// The compute stream waits until `done`.
    fn wait(&mut self, done: f64) {
        if done > self.compute {
            self.e.compute_waited_ms += done - self.compute;
            self.compute = done;
        }
    }

    /// Memory for `bytes`: free, else pending blocks as the executor takes them. Returns the
    /// time the block is usable, or None when nothing would do.
    fn take(&mut self, bytes: u64, for_compute: bool) -> Option<f64> {
        let held = self.allocated + self.pending.iter().map(|p| p.bytes).sum::<u64>();
        if held + bytes <= self.budget {
            self.allocated += bytes;
            return Some(0.0);
        }
        if self.pending.is_empty() {
            return None;
        }
        // A close fit, as `Pool::take_pending` takes.
        if let Some(i) = self
            .pending
            .iter()
            .position(|p| p.bytes >= bytes && p.bytes - bytes <= bytes / 8)
        {
            let p = self.pending.remove(i);
            if p.bytes > bytes {
                self.pending.insert(
                    i,
                    Pending {
                        bytes: p.bytes - bytes,
                        done: p.done,
                    },
                );
            }
            self.allocated += bytes;
            if for_compute {
                self.wait(p.done);
            }
            return Some(p.done);
        }
        let done = self.pending.iter().map(|p| p.done).fold(0.0, f64::max);
        self.wait(done);
        self.pending.clear();
        if self.allocated + bytes <= self.budget {
            self.allocated += bytes;
            Some(0.0)
        } else {
            None
        }
    }

    /// `bytes` go back to the pool: at once, or pending until `busy` (a collective that may
    /// still touch them) when that is later than the compute stream's clock.
    fn release(&mut self, bytes: u64, busy: f64) {
        self.allocated -= bytes;
        if busy > self.compute {
            self.pending.push(Pending { bytes, done: busy });
        }
    }

    /// A node's new output: taken like any block, or counted over budget (the real run would
    /// evict).
    fn output(&mut self, bytes: u64) {
        if self.take(bytes, true).is_none() {
            self.allocated += bytes;
        }
    }
}

/// The index of the estimate with the shortest step (the first of equals: candidates come
/// default first). The tests' choice; the runtime's is `choose_feasible`.
#[cfg(test)]
pub fn choose(estimates: &[Estimate]) -> usize {
    let mut best = 0;
    for (i, e) in estimates.iter().enumerate() {
        // A plan must be faster by a margin to replace the default: the model is coarse.
        if e.step_ms < 0.99 * estimates[best].step_ms {
            best = i;
        }
    }
    best
}

/// `choose` among the candidates with the fewest infeasible nodes (`infeasible[i]`: candidate
/// i's count; the default, first, is kept only if it is among them): a plan whose run needs the
/// fallback at a node (it evicts around it, or the node fails) is never chosen over one that
/// fits, whatever the model, which does not model the fallback, says of its step.
pub fn choose_feasible(estimates: &[Estimate], infeasible: &[usize]) -> usize {
    let fewest = infeasible.iter().copied().min().unwrap_or(0);
    let mut best: Option<usize> = None;
    for (i, e) in estimates.iter().enumerate() {
        if infeasible.get(i).copied().unwrap_or(0) != fewest {
            continue;
        }
        match best {
            Some(b) if e.step_ms >= 0.99 * estimates[b].step_ms => {}
            _ => best = Some(i),
        }
    }
    best.unwrap_or(0)
}

#[cfg(test)]
#[path = "swap_model_tests.rs"]
mod tests;
