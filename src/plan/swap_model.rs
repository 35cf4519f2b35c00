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
/// default first).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Liveness;
    use crate::graph::TensorKind;
    use crate::plan::swap::{plan_swaps, SwapPlan};

    /// `estimate` of `plan`'s compiled program.
    fn estimate_plan(
        tensors: &[Tensor],
        nodes: &[Node],
        lv: &Liveness,
        plan: &SwapPlan,
        cost_ms: &[f64],
        link: Link,
        align: u64,
    ) -> Estimate {
        let program = Program::compile(tensors, nodes, lv, Some(plan), None);
        estimate(tensors, nodes, &program, cost_ms, link, align)
    }

    #[derive(Default)]
    struct Chain {
        tensors: Vec<Tensor>,
        nodes: Vec<Node>,
        cost: Vec<f64>,
    }

    impl Chain {
        fn tensor(&mut self, size: u64, kind: TensorKind, name: String) -> u32 {
            self.tensors.push(Tensor {
                size,
                kind,
                name,
                producer: None,
            });
            self.tensors.len() as u32 - 1
        }
        fn node(&mut self, inputs: &[u32], output: u32, cost: f64) {
            let node = self.nodes.len() as u32;
            self.tensors[output as usize].producer.get_or_insert(node);
            self.nodes
                .push(Node::test_callback(inputs, &[output], false, String::new()));
            self.cost.push(cost);
        }
    }

    const MB: u64 = 1_000_000;
    /// 1 GB/s each way: a MB moves in a millisecond.
    const SLOW: Link = Link {
        in_gbps: 1.0,
        out_gbps: 1.0,
    };

    fn empty_plan(nodes: usize, budget: u64) -> SwapPlan {
        SwapPlan {
            budget,
            swap_out_after: vec![Vec::new(); nodes],
            prefetch_before: vec![Vec::new(); nodes + 1],
            drop_after: vec![Vec::new(); nodes],
            recompute_before: vec![Vec::new(); nodes],
            ..SwapPlan::default()
        }
    }

    /// A kept tensor the run writes starts the next run newer on the device than on the host:
    /// leaving at the start, it is copied (3 MB over [0, 3]), and the node whose output takes
    /// its block waits for that copy.
    #[test]
    fn a_kept_tensor_the_run_writes_is_copied_when_it_leaves() {
        let mut c = Chain::default();
        let m = c.tensor(3 * MB, TensorKind::Parameter, "m".into());
        let a = c.tensor(3 * MB, TensorKind::Intermediate, "a".into());
        let out = c.tensor(MB, TensorKind::Output, "out".into());
        c.node(&[], a, 1.0);
        c.node(&[a, m], m, 1.0);
        c.node(&[m], out, 1.0);
        let lv = Liveness::analyse(&c.tensors, &c.nodes, 1);
        let mut plan = empty_plan(3, 4 * MB);
        plan.keep.push(m);
        plan.leave_at_start.push(m);
        plan.prefetch_before[1].push(m);
        let e = estimate_plan(&c.tensors, &c.nodes, &lv, &plan, &c.cost, SLOW, 1);
        assert!(e.bytes_out >= 3 * MB, "{e:?}");
        assert!(e.starts[0].1 >= 3.0 - 1e-9, "{e:?}");
    }

    /// Hand-computed timelines: a return the first node waits for, and an output sent home
    /// after the last node.
    #[test]
    fn estimate_follows_a_hand_computed_timeline() {
        let mut c = Chain::default();
        let p = c.tensor(MB, TensorKind::Parameter, "p".into());
        let a = c.tensor(MB, TensorKind::Intermediate, "a".into());
        let out = c.tensor(MB, TensorKind::Output, "out".into());
        c.node(&[p], a, 2.0);
        c.node(&[a], out, 1.0);
        let lv = Liveness::analyse(&c.tensors, &c.nodes, 1);
        let mut plan = empty_plan(2, 10 * MB);
        plan.prefetch_before[0].push(p);
        plan.swap_out_after[0].push(p);
        let e = estimate_plan(&c.tensors, &c.nodes, &lv, &plan, &c.cost, SLOW, 1);
        // p comes in over [0, 1]; node 0 runs over [1, 3] (it waited 1 ms), node 1 over [3, 4];
        // p leaves clean (no copy), out is copied home over [4, 5].
        assert_eq!(e.starts, vec![(1.0, 1.0), (3.0, 0.0)]);
        assert_eq!((e.bytes_in, e.bytes_out), (MB, MB));
        assert!((e.step_ms - 5.0).abs() < 1e-9, "{}", e.step_ms);
        assert!((e.compute_waited_ms - 1.0).abs() < 1e-9);

        // The same graph when p stays on the device across runs: nothing waits, nothing comes in.
        let mut kept = empty_plan(2, 10 * MB);
        kept.keep.push(p);
        let e = estimate_plan(&c.tensors, &c.nodes, &lv, &kept, &c.cost, SLOW, 1);
        assert_eq!(e.starts, vec![(0.0, 0.0), (2.0, 0.0)]);
        assert_eq!((e.bytes_in, e.bytes_out), (0, MB));
        assert!((e.step_ms - 4.0).abs() < 1e-9, "{}", e.step_ms);
    }

    /// A node's output allocation that finds only a block pending on a copy-out waits for that
    /// copy (as `Pool::take_pending` makes the executor do), and no longer.
    #[test]
    fn estimate_waits_for_the_copy_out_whose_block_it_takes() {
        let mut c = Chain::default();
        let x = c.tensor(MB, TensorKind::Input, "x".into());
        let a = c.tensor(MB, TensorKind::Output, "a".into());
        let b = c.tensor(MB, TensorKind::Output, "b".into());
        let y = c.tensor(MB, TensorKind::Output, "y".into());
        c.node(&[x], a, 1.0);
        c.node(&[a], b, 1.0);
        c.node(&[b], y, 1.0);
        let lv = Liveness::analyse(&c.tensors, &c.nodes, 1);
        // Budget 2 MB, x kept from the last run. x leaves clean after node 0; a (dirty) is
        // copied out after node 1, over [2, 3]; y's memory at node 2 is a's pending block.
        let mut plan = empty_plan(3, 2 * MB);
        plan.keep.push(x);
        plan.swap_out_after[0].push(x);
        plan.swap_out_after[1].push(a);
        let e = estimate_plan(&c.tensors, &c.nodes, &lv, &plan, &c.cost, SLOW, 1);
        assert_eq!(e.starts, vec![(0.0, 0.0), (1.0, 0.0), (3.0, 1.0)]);
        // a, then b and y (sent home at the end: [4, 5], [5, 6]).
        assert_eq!((e.bytes_out, e.bytes_in), (3 * MB, 0));
        assert!((e.step_ms - 6.0).abs() < 1e-9, "{}", e.step_ms);
    }

    /// A block that takes the range a copy-out freed waits for that copy (`copy_waits`, from
    /// the dry run's placements): the node whose output takes it starts when the copy ends.
    #[test]
    fn a_block_taking_a_copy_outs_range_waits_for_the_copy() {
        let mut c = Chain::default();
        let x = c.tensor(MB, TensorKind::Input, "x".into());
        let a = c.tensor(MB, TensorKind::Output, "a".into());
        let b = c.tensor(MB, TensorKind::Output, "b".into());
        c.node(&[x], a, 1.0);
        c.node(&[x], b, 1.0);
        let lv = Liveness::analyse(&c.tensors, &c.nodes, 1);
        // a is copied out after node 0, over [1, 2]; room is plenty.
        let mut plan = empty_plan(2, 10 * MB);
        plan.keep.push(x);
        plan.swap_out_after[0].push(a);
        let program = Program::compile(&c.tensors, &c.nodes, &lv, Some(&plan), None);
        let alloc_b = program
            .steps
            .iter()
            .position(|s| matches!(s, Step::Alloc { node: 1, .. }))
            .unwrap() as u32;
        let free = estimate(&c.tensors, &c.nodes, &program, &c.cost, SLOW, 1);
        assert_eq!(free.starts[1], (1.0, 0.0));
        let waits = [(alloc_b, a)];
        let e = estimate_with_copy_waits(&c.tensors, &c.nodes, &program, &c.cost, SLOW, 1, &waits);
        assert_eq!(e.starts[1], (2.0, 1.0));
        // A wait listed for another step, or for a tensor that left without a copy, costs nothing.
        let elsewhere = [(alloc_b + 1, a), (alloc_b, x)];
        let e =
            estimate_with_copy_waits(&c.tensors, &c.nodes, &program, &c.cost, SLOW, 1, &elsewhere);
        assert_eq!(e.starts[1], (1.0, 0.0));
    }

    /// A collective runs on the communication stream: compute that does not read its tensors
    /// overlaps it, the node that does waits for it, and a copy-out of its tensor starts after
    /// it. Unmeasured, it takes its bytes over the assumed rate.
    #[test]
    fn estimate_runs_collectives_on_the_communication_stream() {
        let mut c = Chain::default();
        let x = c.tensor(MB, TensorKind::Input, "x".into());
        let g = c.tensor(MB, TensorKind::Intermediate, "g".into());
        let h = c.tensor(MB, TensorKind::Output, "h".into());
        let y = c.tensor(MB, TensorKind::Output, "y".into());
        c.node(&[x], g, 1.0); // 0
        c.nodes
            .push(Node::test_all_reduce(&[g], "all-reduce".into())); // 1
        c.cost.push(5.0);
        c.node(&[x], h, 1.0); // 2: overlaps the all-reduce
        c.node(&[g], y, 1.0); // 3: waits for it
        let lv = Liveness::analyse(&c.tensors, &c.nodes, 1);
        // x stays on the device across runs.
        let mut plan = empty_plan(4, 10 * MB);
        plan.keep.push(x);
        let e = estimate_plan(&c.tensors, &c.nodes, &lv, &plan, &c.cost, SLOW, 1);
        // Node 0 [0, 1]; the all-reduce [1, 6] beside node 2 [1, 2]; node 3 waits until 6
        // and runs [6, 7]; h and y go home over [7, 9] (h's copy waits for the last node: the
        // sends home come after the run).
        let want = vec![(0.0, 0.0), (1.0, 0.0), (1.0, 0.0), (6.0, 4.0)];
        assert_eq!(e.starts, want);
        assert!((e.step_ms - 9.0).abs() < 1e-9, "{}", e.step_ms);

        // g copied out after the all-reduce node and back before node 3: the copy-out waits
        // for the all-reduce's end (6), the return for the copy-out (7), node 3 for the return.
        let mut moved = plan.clone();
        moved.swap_out_after[1].push(g);
        moved.prefetch_before[3].push(g);
        let e = estimate_plan(&c.tensors, &c.nodes, &lv, &moved, &c.cost, SLOW, 1);
        assert_eq!(e.starts[3], (8.0, 6.0));

        // Unmeasured: 20 MB over the assumed 20 GB/s is 1 ms.
        let big = c.tensor(20 * MB, TensorKind::Intermediate, "big".into());
        let node = Node::test_all_reduce(&[big], String::new());
        assert!((collective_ms(&c.tensors, &node, 0.0) - 1.0).abs() < 1e-9);
        assert_eq!(collective_ms(&c.tensors, &node, 2.5), 2.5);
    }

    /// The graph of benches/swap_chain.c: Linear+ReLU layers, forward and (optionally) backward.
    fn swap_chain(hidden: u64, tokens: u64, layers: usize, train: bool) -> Chain {
        let act = tokens * hidden * 2;
        let w = hidden * hidden * 2;
        // Matrix products at ~680 TFLOP/s; element-wise kernels at ~4.5 TB/s.
        let gemm = 2.0 * (tokens * hidden * hidden) as f64 / 680e9;
        let elementwise = |bytes: u64| bytes as f64 / 4.5e9;
        let mut c = Chain::default();
        let x0 = c.tensor(act, TensorKind::Input, "x0".into());
        let dy = train.then(|| c.tensor(act, TensorKind::Input, "dy".into()));
        let (mut x, mut z, mut ws, mut dws) = (vec![x0], vec![], vec![], vec![]);
        for i in 0..layers {
            let wi = c.tensor(w, TensorKind::Parameter, format!("w{i}"));
            ws.push(wi);
            if train {
                dws.push(c.tensor(w, TensorKind::Output, format!("dw{i}")));
            }
            let zi = c.tensor(act, TensorKind::Intermediate, format!("z{i}"));
            let kind = if i + 1 == layers {
                TensorKind::Output
            } else {
                TensorKind::Intermediate
            };
            let xi = c.tensor(act, kind, format!("x{}", i + 1));
            c.node(&[x[i], wi], zi, gemm);
            c.node(&[zi], xi, elementwise(2 * act));
            // The ReLU is declared recomputable, as benches/swap_chain.c does.
            c.nodes.last_mut().expect("just added").recomputable = true;
            z.push(zi);
            x.push(xi);
        }
        if let Some(dy) = dy {
            let mut dx = dy;
            for i in (0..layers).rev() {
                let dz = c.tensor(act, TensorKind::Intermediate, format!("dz{i}"));
                c.node(&[dx, z[i]], dz, elementwise(3 * act));
                c.node(&[x[i], dz], dws[i], gemm);
                if i > 0 {
                    dx = c.tensor(act, TensorKind::Intermediate, format!("dx{i}"));
                    c.node(&[dz, ws[i]], dx, gemm);
                }
            }
        }
        c
    }

    const H200_LINK: Link = Link {
        in_gbps: 55.3,
        out_gbps: 55.3,
    };

    /// Every candidate of the benchmark's chains at 2x and 3x their budget, estimated; the
    /// choice the runtime would make is never worse than the default plan, and on the training
    /// step it is better by a margin (the default plan leaves no room for copy-outs in flight,
    /// so each backward layer waits for its weight gradient's copy). Print the table with
    /// `cargo test --release --lib swap_model -- --nocapture`.
    #[test]
    fn choosing_by_estimate_beats_the_default_plan_on_a_training_step() {
        let align = 512;
        for (train, tokens) in [(true, 8192), (false, 16384)] {
            let c = swap_chain(8192, tokens, 16, train);
            let lv = Liveness::analyse(&c.tensors, &c.nodes, align);
            let ws = lv.persistent_bytes + lv.peak_transient_bytes;
            for factor in [2u64, 3] {
                let budget = ws / factor;
                let cands = crate::plan::swap_candidates::candidates(
                    &c.tensors,
                    &c.nodes,
                    &lv,
                    &[],
                    budget,
                    align,
                );
                assert_eq!(
                    cands[0].1,
                    plan_swaps(&c.tensors, &c.nodes, &lv, budget, align)
                );
                let est: Vec<Estimate> = cands
                    .iter()
                    .map(|(_, p)| {
                        estimate_plan(&c.tensors, &c.nodes, &lv, p, &c.cost, H200_LINK, align)
                    })
                    .collect();
                for ((policy, plan), e) in cands.iter().zip(&est) {
                    assert!(plan.infeasible_nodes.is_empty());
                    println!(
                        "{} {factor}x {policy:?}: keep {}, step {:.1} ms (compute {:.1}, waited {:.1}), out {} MiB, in {} MiB",
                        if train { "train" } else { "forward" },
                        plan.keep.len(),
                        e.step_ms,
                        e.compute_ms,
                        e.compute_waited_ms,
                        e.bytes_out >> 20,
                        e.bytes_in >> 20
                    );
                }
                let best = choose(&est);
                if std::env::var("GKRT_MODEL_DUMP").is_ok() {
                    let plan = &cands[best].1;
                    let names = |v: &[u32]| {
                        v.iter()
                            .map(|&t| c.tensors[t as usize].name.clone())
                            .collect::<Vec<_>>()
                            .join(",")
                    };
                    println!("chosen {:?}, keep {}", cands[best].0, names(&plan.keep));
                    for n in 0..c.nodes.len() {
                        let (start, waited) = est[best].starts[n];
                        println!(
                            "  {n:3} at {start:6.1} waited {waited:4.1} in [{}] recompute [{}] {} -> {} out [{}] drop [{}]",
                            names(&plan.prefetch_before[n]),
                            names(&plan.recompute_before[n]),
                            names(&c.nodes[n].inputs),
                            names(&c.nodes[n].outputs),
                            names(&plan.swap_out_after[n]),
                            names(&plan.drop_after[n])
                        );
                    }
                }
                assert!(est[best].step_ms <= est[0].step_ms);
                if train && factor == 3 {
                    // Rebuilding the ReLU outputs beats copying them where the link bounds the
                    // step (at 2x it is compute-bound either way).
                    let copy_only = cands
                        .iter()
                        .zip(&est)
                        .filter(|((p, _), _)| !p.recompute)
                        .map(|(_, e)| e.step_ms)
                        .fold(f64::INFINITY, f64::min);
                    assert!(cands[best].1.recomputes() > 0);
                    assert!(
                        est[best].step_ms < 0.9 * copy_only,
                        "{factor}x: {:.1} ms recomputing vs {copy_only:.1} ms copying",
                        est[best].step_ms
                    );
                }
                if train && factor == 2 {
                    assert!(
                        est[best].step_ms < 0.95 * est[0].step_ms,
                        "expected a clearly better plan than the default: {:.1} vs {:.1} ms",
                        est[best].step_ms,
                        est[0].step_ms
                    );
                }
            }
        }
    }
}
