//! One pass of the swap planner (`swap.rs`): simulating, over byte counts, the executor's own
//! fallback policy (evict the resident tensor used farthest ahead), moving each eviction right
//! after the tensor's last use and each return as early as the memory profile allows, and the
//! rematerialisation rule (`Policy::recompute`) that drops a victim for its producer to rebuild.
//! `swap::plan_timed` runs it from several run-boundary states and keeps the best plan.

use crate::graph::liveness::{round_up, NEVER};
use crate::graph::{Liveness, Node, Tensor};
use crate::plan::swap::{node_tensors, Policy, SwapPlan, Timings, Victim};
use crate::plan::swap_holds::CommHolds;
use std::collections::BTreeSet;

struct Sim<'a> {
    tensors: &'a [Tensor],
    align: u64,
    resident: Vec<bool>,
    host_valid: Vec<bool>,
    /// Node after which the tensor last left the device (-1: on the host since the run began).
    left_after: Vec<i64>,
    /// Node the tensor last came to the device at (returned or rebuilt; -1: not in this run).
    arrived_at: Vec<i64>,
    /// Resident tensors by (next use, clean): the last entry is the Belady victim, and of two
    /// used next at the same node the clean one (host copy current: leaves without a copy).
    by_next_use: BTreeSet<(u32, bool, u32)>,
    next_key: Vec<(u32, bool)>,
    used: u64,
    usage: Vec<u64>,
    /// Uses added by planned recomputes (the producer's inputs are read there), ascending.
    extra_uses: Vec<Vec<u32>>,
    /// Dropped for a planned recompute and not rebuilt yet.
    dropped: Vec<bool>,
    /// Read by some planned recompute: must stay rebuildable-from, so never dropped itself.
    feeds_recompute: Vec<bool>,
    /// What collectives and fused groups hold on the device (`swap_holds.rs`).
    holds: &'a CommHolds,
    /// Held by a collective or a fused block now: resident but never a victim (not indexed).
    pinned: Vec<bool>,
}

impl Sim<'_> {
    fn size(&self, t: u32) -> u64 {
        round_up(self.tensors[t as usize].size, self.align)
    }

    fn arrive(&mut self, t: u32, n: u32) {
        self.resident[t as usize] = true;
        self.used += self.size(t);
        self.index(t, n);
    }

    /// (Re)indexes resident `t` under its next use `n` (a pinned one is not a candidate).
    fn index(&mut self, t: u32, n: u32) {
        let key = (n, self.host_valid[t as usize]);
        self.next_key[t as usize] = key;
        if !self.pinned[t as usize] {
            self.by_next_use.insert((key.0, key.1, t));
        }
    }

    fn unindex(&mut self, t: u32) {
        let (n, clean) = self.next_key[t as usize];
        self.by_next_use.remove(&(n, clean, t));
    }

    fn leave(&mut self, t: u32) {
        self.resident[t as usize] = false;
        self.used -= self.size(t);
        self.unindex(t);
    }

    /// The next use of `t` after node `n`, planned recomputes included.
    fn next_use_after(&self, lv: &Liveness, t: u32, n: u32) -> u32 {
        let extra = &self.extra_uses[t as usize];
        let i = extra.partition_point(|&u| u <= n);
        lv.next_use_after(t, n)
            .min(extra.get(i).copied().unwrap_or(NEVER))
    }

    /// The last use of `t` before node `n`, planned recomputes included.
    fn last_use_before(&self, lv: &Liveness, t: u32, n: u32) -> Option<u32> {
        let extra = &self.extra_uses[t as usize];
        let i = extra.partition_point(|&u| u < n);
        let e = i.checked_sub(1).map(|i| extra[i]);
        lv.last_use_before(t, n).max(e)
    }
}

/// What the rematerialisation rule needs to know of the graph beyond liveness.
struct Writers {
    /// Per tensor: the nodes that write it, ascending.
    of: Vec<Vec<u32>>,
}

impl Writers {
    fn new(tensors: &[Tensor], nodes: &[Node]) -> Writers {
        let mut of = vec![Vec::new(); tensors.len()];
        for (n, node) in nodes.iter().enumerate() {
            for &t in &node.outputs {
                of[t as usize].push(n as u32);
            }
        }
        Writers { of }
    }

    /// Whether some node strictly between `a` and `b` writes `t`.
    fn written_between(&self, t: u32, a: u32, b: u32) -> bool {
        self.of[t as usize].iter().any(|&w| w > a && w < b)
    }
}

/// Most tensors one planned recompute rebuilds (the victim and the freed tensors its producer's
/// chain reads): each link reruns a node and holds its output at the reader's node.
const MAX_CHAIN: usize = 4;

/// Appends to `chain` the tensors to rebuild before node `m` so that intermediate `x` exists
/// there, producers' order (`x` last). A link is a tensor whose only writer is declared
/// recomputable, has no workspaces and writes only it; each input of that writer is either alive
/// and unchanged until `m`, already rebuilt before `m` (`rebuilt_before[m]`), freed by then and
/// rebuildable in turn (chained recomputation: the softmax output from scores freed after the
/// softmax, themselves from Q and K still alive), or dropped for a recompute planned after `m`
/// and rebuildable at `m` instead (the GELU output from its input, both dropped): that earlier
/// rebuild is listed in `moved` as (tensor, node it was planned before).
#[allow(clippy::too_many_arguments)]
fn rebuild_chain(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    writers: &Writers,
    sim: &Sim,
    rebuilt_before: &[Vec<u32>],
    x: u32,
    m: u32,
    chain: &mut Vec<u32>,
    moved: &mut Vec<(u32, u32)>,
) -> bool {
    let rebuilt = &rebuilt_before[m as usize];
    let tensor = &tensors[x as usize];
    let Some(p) = tensor.producer else {
        return false;
    };
    let node = &nodes[p as usize];
    let link = tensor.kind == crate::graph::TensorKind::Intermediate
        && node.recomputable
        && node.outputs == [x]
        // Its workspaces would add to the memory the reader's node needs.
        && node.workspaces.is_empty()
        && writers.of[x as usize] == [p]
        && !sim.feeds_recompute[x as usize]
        // A collective's tensor or a fused member is never rebuilt in a block of its own.
        && !sim.holds.held(x);
    if !link {
        return false;
    }
    for &y in &node.inputs {
        if rebuilt.contains(&y) || chain.contains(&y) {
            continue;
        }
        let alive = lv.last_use[y as usize].is_some_and(|l| l >= m);
        let rebuild = |chain: &mut _, moved: &mut _| {
            rebuild_chain(
                tensors,
                nodes,
                lv,
                writers,
                sim,
                rebuilt_before,
                y,
                m,
                chain,
                moved,
            )
        };
        let ok = if !alive {
            rebuild(chain, moved)
        } else if !sim.dropped[y as usize] {
            !writers.written_between(y, p, m)
        } else {
            // Dropped, to be rebuilt before a later node: rebuilt here instead, it stays for
            // that use (a rebuild planned before `m` would be read again here: not chained).
            let later =
                (m as usize + 1..rebuilt_before.len()).find(|&k| rebuilt_before[k].contains(&y));
            match later {
                Some(k) if !writers.written_between(y, p, m) && rebuild(chain, moved) => {
                    moved.push((y, k as u32));
                    true
                }
                _ => false,
            }
        };
        if !ok {
            return false;
        }
    }
    if chain.len() >= MAX_CHAIN {
        return false;
    }
    chain.push(x);
    true
}

/// A planned recompute: the tensors to rebuild, in order, and the rebuilds moved to its node
/// from later ones as (tensor, node).
type Rebuild = (Vec<u32>, Vec<(u32, u32)>);

/// The tensors to rebuild right before node `m` reads intermediate `t` (with the tensors of
/// `rebuilt_before[m]` rebuilt there too, within `budget`), in the order their producers run
/// again, `t` last, and the rebuilds moved from later nodes to `m` (see `rebuild_chain`).
#[allow(clippy::too_many_arguments)]
fn recompute_source(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    writers: &Writers,
    sim: &Sim,
    rebuilt_before: &[Vec<u32>],
    budget: u64,
    t: u32,
    m: u32,
) -> Option<Rebuild> {
    if (m as usize) >= nodes.len() || !nodes[m as usize].inputs.contains(&t) {
        return None;
    }
    let rebuilt = &rebuilt_before[m as usize];
    let (mut chain, mut moved) = (Vec::new(), Vec::new());
    if !rebuild_chain(
        tensors,
        nodes,
        lv,
        writers,
        sim,
        rebuilt_before,
        t,
        m,
        &mut chain,
        &mut moved,
    ) {
        return None;
    }
    // Node m then needs its own tensors, the producers' inputs and the rebuilt tensors (of
    // every recompute before it) at once: within the budget, or the copy is the only way.
    let reader = &nodes[m as usize];
    let mut at_m = node_tensors(reader);
    for &x in rebuilt.iter().chain(&chain) {
        at_m.push(x);
        at_m.extend(
            nodes[tensors[x as usize].producer? as usize]
                .inputs
                .iter()
                .copied(),
        );
    }
    at_m.sort_unstable();
    at_m.dedup();
    let ws: u64 = reader
        .workspaces
        .iter()
        .map(|&w| round_up(w, sim.align))
        .sum();
    let need = at_m.iter().map(|&x| sim.size(x)).sum::<u64>() + ws;
    (need <= budget).then_some((chain, moved))
}

/// Whether rebuilding `victim` through `chain` beats copying it (`Policy::recompute_cap_pct`).
fn worth_rebuilding(
    tensors: &[Tensor],
    sim: &Sim,
    policy: Policy,
    timings: Option<Timings>,
    victim: u32,
    chain: &[u32],
) -> bool {
    let Some(t) = timings.filter(|_| policy.recompute_cap_pct > 0) else {
        return true;
    };
    let rebuild_ms: f64 = chain
        .iter()
        .filter_map(|&x| tensors[x as usize].producer)
        .map(|p| t.node_ms.get(p as usize).copied().unwrap_or(0.0))
        .sum();
    let bytes = sim.size(victim) as f64;
    let mut copy_ms = bytes / (t.link.in_gbps * 1e6);
    if !sim.host_valid[victim as usize] {
        copy_ms += bytes / (t.link.out_gbps * 1e6);
    }
    rebuild_ms * 100.0 <= copy_ms * f64::from(policy.recompute_cap_pct)
}

/// Takes out of the rebuilds before node `k` every chain link nothing reads there any more: not
/// node `k` itself, no other rebuild there, and no node at or after `k` (a link freed after the
/// reader: `free_after`). Left when the rebuild it fed moved to an earlier reader
/// (`Policy::prune_moved_links`). Its producer's inputs lose their use at `k` unless another
/// rebuild there reads them; a pruned link's own inputs may leave dead links in turn.
fn prune_dead_links(
    tensors: &[Tensor],
    nodes: &[Node],
    lv: &Liveness,
    sim: &mut Sim,
    plan: &mut SwapPlan,
    k: u32,
) {
    let producer_of = |x: u32| &nodes[tensors[x as usize].producer.expect("a link") as usize];
    loop {
        let at_k = &plan.recompute_before[k as usize];
        let dead = at_k.iter().copied().find(|&x| {
            !nodes[k as usize].inputs.contains(&x)
                && !at_k.iter().any(|&w| producer_of(w).inputs.contains(&x))
                && lv.last_use[x as usize].is_none_or(|l| l < k)
        });
        let Some(x) = dead else {
            return;
        };
        plan.recompute_before[k as usize].retain(|&w| w != x);
        let at_k = &plan.recompute_before[k as usize];
        for &z in &producer_of(x).inputs {
            if !at_k.iter().any(|&w| producer_of(w).inputs.contains(&z)) {
                sim.extra_uses[z as usize].retain(|&u| u != k);
            }
        }
    }
}

/// What every planning pass of one `swap::plan_timed` call shares: the graph, what its
/// collectives hold, the budget, and the policy with its slack (bytes) and timings.
pub(super) struct Pass<'a> {
    pub tensors: &'a [Tensor],
    pub nodes: &'a [Node],
    pub lv: &'a Liveness,
    pub holds: &'a CommHolds,
    pub budget: u64,
    pub align: u64,
    pub policy: Policy,
    pub slack: u64,
    pub timings: Option<Timings<'a>>,
    /// Per tensor (empty: none): what overrides the policy for it as a victim (`plan_masked`).
    pub victims: &'a [Victim],
    /// The small persistent tensors kept and never evicted (`Policy::pin_below`), sorted.
    pub pinned: &'a [u32],
    /// Kept tensors held on the device until a node (`swap::Overrides::held`).
    pub held: &'a [(u32, u32)],
}

/// One planning pass; `keep` are resident when the run starts and must be again when it ends.
/// Also returns the persistent tensors the policy would leave resident at the end.
pub(super) fn simulate(pass: &Pass, keep: &[u32]) -> (SwapPlan, Vec<u32>) {
    let &Pass {
        tensors,
        nodes,
        lv,
        holds,
        budget,
        align,
        policy,
        slack,
        timings,
        victims,
        pinned,
        held,
    } = pass;
    let (linger, kept_wait) = (policy.linger, policy.kept_wait);
    let n_nodes = nodes.len();
    let writers = Writers::new(tensors, nodes);
    let mut sim = Sim {
        tensors,
        align,
        resident: vec![false; tensors.len()],
        // Persistent tensors start on the host with their contents there, but for kept ones
        // the run writes: the previous run left them on the device, newer than the host copy.
        host_valid: (0..tensors.len())
            .map(|t| {
                tensors[t].kind.persists()
                    && (writers.of[t].is_empty() || !keep.contains(&(t as u32)))
            })
            .collect(),
        left_after: vec![-1; tensors.len()],
        arrived_at: vec![-1; tensors.len()],
        by_next_use: BTreeSet::new(),
        next_key: vec![(NEVER, false); tensors.len()],
        used: 0,
        usage: vec![0; n_nodes + 1],
        extra_uses: vec![Vec::new(); tensors.len()],
        dropped: vec![false; tensors.len()],
        feeds_recompute: vec![false; tensors.len()],
        holds,
        pinned: vec![false; tensors.len()],
    };
    let mut plan = SwapPlan {
        budget,
        swap_out_after: vec![Vec::new(); n_nodes],
        prefetch_before: vec![Vec::new(); n_nodes + 1],
        drop_after: vec![Vec::new(); n_nodes],
        recompute_before: vec![Vec::new(); n_nodes],
        free_after: vec![Vec::new(); n_nodes],
        keep: keep.to_vec(),
        ..SwapPlan::default()
    };
    let mut kept = vec![false; tensors.len()];
    for &t in keep {
        kept[t as usize] = true;
        // (`Policy::pin_below`: `plan_masked` keeps them; they are never a victim.)
        if pinned.binary_search(&t).is_ok() {
            sim.pinned[t as usize] = true;
        }
        let first = lv.uses[t as usize].first().copied().unwrap_or(NEVER);
        sim.arrive(t, first);
    }
    // Held kept tensors are no victims until their node (`swap::Overrides::held`).
    let held: Vec<(u32, u32)> = held
        .iter()
        .copied()
        .filter(|&(t, k)| k > 0 && kept[t as usize] && !sim.pinned[t as usize] && !holds.held(t))
        .collect();
    let mut held_from = vec![None; tensors.len()];
    for &(t, k) in &held {
        sim.unindex(t);
        sim.pinned[t as usize] = true;
        held_from[t as usize] = Some(k - 1);
    }
    // (node that needs it, tensor, node after which it left)
    let mut returns: Vec<(u32, u32, i64)> = Vec::new();

    let n_nodes32 = n_nodes as u32;
    // The key a resident tensor is indexed under after node `n`: its next use, or for a
    // persistent one with none left in this run, its first use in the next.
    let key_after = |sim: &Sim, t: u32, n: u32| match sim.next_use_after(lv, t, n) {
        NEVER if tensors[t as usize].kind.persists() => {
            n_nodes32 + lv.uses[t as usize].first().copied().unwrap_or(0)
        }
        next => next,
    };
    for (n, node) in nodes.iter().enumerate() {
        let n32 = n as u32;
        for &(t, _) in held.iter().filter(|&&(_, k)| k == n32) {
            sim.pinned[t as usize] = false;
            if sim.resident[t as usize] {
                let key = sim.next_key[t as usize].0;
                sim.index(t, key);
            }
        }
        // Collectives' tensors and fused blocks stay from here on (`swap_holds.rs`).
        for &t in &holds.pin_starts[n] {
            sim.pinned[t as usize] = true;
            sim.unindex(t);
        }
        // The node's tensors, and those of the recomputes planned before it: the rebuilt
        // tensors and their producers' inputs (read here), plus the producers' workspaces.
        let mut touched = node_tensors(node);
        let mut reads: Vec<u32> = node.inputs.clone();
        let mut workspace: u64 = node.workspaces.iter().map(|&w| round_up(w, align)).sum();
        for &x in &plan.recompute_before[n] {
            let p = &nodes[tensors[x as usize].producer.expect("planned") as usize];
            touched.push(x);
            touched.extend(p.inputs.iter().copied());
            reads.extend(p.inputs.iter().copied());
            workspace += p
                .workspaces
                .iter()
                .map(|&w| round_up(w, align))
                .sum::<u64>();
        }
        // A fused block arrives whole at the first producer of any member.
        for &b in &holds.blocks_at[n] {
            touched.extend(holds.blocks[b as usize].members.iter().copied());
        }
        touched.sort_unstable();
        touched.dedup();
        let incoming: Vec<u32> = touched
            .iter()
            .copied()
            .filter(|&t| !sim.resident[t as usize])
            .collect();
        let need: u64 = incoming.iter().map(|&t| sim.size(t)).sum::<u64>() + workspace;

        // Make room: evict the resident tensor used farthest in the future.
        // Evictions keep the slack free too, so that allocations do not wait for copy-outs
        // in flight (only room for the node itself is a must: see the check below).
        while sim.used + need + slack > budget {
            let Some(&(key, _, victim)) = sim.by_next_use.iter().next_back() else {
                break;
            };
            if key <= n32 {
                break; // only this node's own tensors are left
            }
            sim.leave(victim);
            // It leaves right after its last use, so a copy overlaps what runs until now; a
            // clean one (host copy current) leaves without a copy. A kept tensor not used yet
            // in this run leaves as the run starts.
            // A rebuild can bring it back after its last use before `n` (a rebuild planned at
            // k for a reader whose own rebuild later moved elsewhere): it has been resident since
            // then, and leaves after that node, not before it arrived.
            let arrived = u32::try_from(sim.arrived_at[victim as usize]).ok();
            let last = sim
                .last_use_before(lv, victim, n32)
                .max(arrived)
                .max(held_from[victim as usize]);
            let next = key; // its next use: the eviction order's key
            let rule = victims.get(victim as usize).copied().unwrap_or_default();
            let source = (rule == Victim::Rebuild || (policy.recompute && rule != Victim::Copy))
                .then(|| {
                    let rebuilt = &plan.recompute_before;
                    recompute_source(
                        tensors, nodes, lv, &writers, &sim, rebuilt, budget, victim, next,
                    )
                })
                .flatten()
                .filter(|(chain, _)| {
                    rule == Victim::Rebuild
                        || worth_rebuilding(tensors, &sim, policy, timings, victim, chain)
                });
            if let (Some((chain, moved)), Some(last)) = (source, last) {
                // Dropped without a copy; its producer (after those of the freed tensors it
                // reads, if any) runs again before its next use, which becomes a use of the
                // producers' other inputs.
                plan.drop_after[last as usize].push(victim);
                for (y, k) in moved {
                    // Rebuilt at `next` now, not at k: its producer's inputs lose their use at
                    // k unless another rebuild there reads them (they gain one at `next`
                    // below, so no resident one is indexed under k).
                    let at_k = &mut plan.recompute_before[k as usize];
                    at_k.retain(|&x| x != y);
                    let producer_of =
                        |x: u32| &nodes[tensors[x as usize].producer.expect("a link") as usize];
                    // (A freed link rebuilt at k only for y — the scores under a moved softmax
                    // output — is then rebuilt at k for nothing. Dropping it shortened the
                    // model's step but lengthened the H200's, small 1.33 -> 1.40 and medium 1.30
                    // -> 1.33 side by side (session 11, run 5, before release schedules: the
                    // real pool drifted less from the plain dry run with them). With release
                    // schedules the pool makes the dry run's calls, so it is dropped by default
                    // (`Policy::prune_moved_links`), kept with the knob off to compare.)
                    for &z in &producer_of(y).inputs {
                        if !at_k.iter().any(|&x| producer_of(x).inputs.contains(&z)) {
                            sim.extra_uses[z as usize].retain(|&u| u != k);
                        }
                    }
                    if policy.prune_moved_links {
                        prune_dead_links(tensors, nodes, lv, &mut sim, &mut plan, k);
                    }
                }
                let leaves: Vec<u32> = chain
                    .iter()
                    .flat_map(|&x| {
                        &nodes[tensors[x as usize].producer.expect("a link") as usize].inputs
                    })
                    .copied()
                    .filter(|y| {
                        !chain.contains(y) && !plan.recompute_before[next as usize].contains(y)
                    })
                    .collect();
                plan.recompute_before[next as usize].extend(chain);
                sim.dropped[victim as usize] = true;
                for y in leaves {
                    sim.feeds_recompute[y as usize] = true;
                    let extra = &mut sim.extra_uses[y as usize];
                    if let Err(i) = extra.binary_search(&next) {
                        extra.insert(i, next);
                    }
                    if sim.resident[y as usize] {
                        let (key, _) = sim.next_key[y as usize];
                        if next < key {
                            sim.unindex(y);
                            sim.index(y, next);
                        }
                    }
                }
                sim.left_after[victim as usize] = last as i64;
                let size = sim.size(victim);
                for u in &mut sim.usage[last as usize + 1..n] {
                    *u -= size;
                }
                continue;
            }
            // Not before a collective that touched it has been waited for.
            let last = last.map(|l| holds.leave_after(victim, l, n_nodes32).unwrap_or(l));
            match last {
                Some(last) => plan.swap_out_after[last as usize].push(victim),
                None => plan.leave_at_start.push(victim),
            }
            if !sim.host_valid[victim as usize] {
                plan.bytes_out += sim.size(victim);
                sim.host_valid[victim as usize] = true;
            }
            let left = last.map_or(-1, |l| l as i64);
            sim.left_after[victim as usize] = left;
            // It has been off the device since then: lower the profile retroactively.
            let size = sim.size(victim);
            for u in &mut sim.usage[(left + 1) as usize..n] {
                *u -= size;
            }
        }
        if sim.used + need > budget {
            plan.infeasible_nodes.push(n32);
        }

        for &t in &incoming {
            if sim.dropped[t as usize] || plan.recompute_before[n].contains(&t) {
                sim.dropped[t as usize] = false; // rebuilt here, not copied
            } else if reads.contains(&t) {
                returns.push((n32, t, sim.left_after[t as usize]));
                plan.bytes_in += sim.size(t);
            }
            sim.arrive(t, n32);
            sim.arrived_at[t as usize] = n as i64;
        }
        for &t in node.outputs.iter().chain(&plan.recompute_before[n]) {
            sim.host_valid[t as usize] = false;
        }
        sim.usage[n] = sim.used + workspace;

        // After the node: dead intermediates leave; a persistent tensor at its last use in
        // the run waits for its first use in the next one (evicted first when room is needed);
        // the rest move to their next use.
        for &t in &touched {
            sim.unindex(t);
            let tensor = &tensors[t as usize];
            if holds.block_of(t).is_some() {
                // A fused member leaves with its block (below).
                let key = key_after(&sim, t, n32);
                sim.index(t, key);
                continue;
            }
            if plan.recompute_before[n].contains(&t)
                && lv.last_use[t as usize].is_none_or(|l| l < n32)
            {
                // Rebuilt only for another recompute here (a link of a chain): freed now.
                plan.free_after[n].push(t);
                sim.resident[t as usize] = false;
                sim.used -= sim.size(t);
                continue;
            }
            if lv.last_use[t as usize] == Some(n32) {
                // Only what the next run reads, or what the plan keeps, lingers: one it first
                // overwrites (an output) has no use for its device contents and leaves now,
                // its copy overlapping this run. With `kept_wait`, a kept tensor waits too
                // (rather than leave and come back at the end).
                let first = lv.uses[t as usize][0];
                let read_next = nodes[first as usize].inputs.contains(&t);
                // (`keep_last_writes` keeps a tensor so that it waits.)
                let kept_waits = kept_wait || policy.keep_last_writes;
                // (A small one `Policy::pin_below` keeps always stays.)
                let waits = (linger && (read_next || kept[t as usize]))
                    || (kept_waits && kept[t as usize])
                    || pinned.binary_search(&t).is_ok();
                if tensor.kind.persists() && waits {
                    sim.index(t, n_nodes as u32 + first);
                } else {
                    if tensor.kind.persists() {
                        // (After the collective that touched it completes; at the run's end
                        // the sends home copy it.)
                        if let Some(k) = holds.leave_after(t, n32, n_nodes32) {
                            plan.swap_out_after[k as usize].push(t);
                        }
                        if !sim.host_valid[t as usize] {
                            plan.bytes_out += sim.size(t);
                            sim.host_valid[t as usize] = true;
                        }
                    }
                    sim.resident[t as usize] = false;
                    sim.used -= sim.size(t);
                    sim.left_after[t as usize] = n as i64;
                }
            } else {
                let next = sim.next_use_after(lv, t, n32);
                sim.index(t, next);
            }
        }
        for &b in &holds.blocks_end[n] {
            for &m in &holds.blocks[b as usize].members {
                if sim.resident[m as usize] {
                    sim.leave(m);
                    sim.left_after[m as usize] = n as i64;
                }
            }
        }
        for &t in &holds.pin_ends[n] {
            sim.pinned[t as usize] = false;
            if sim.resident[t as usize] {
                let key = key_after(&sim, t, n32);
                sim.index(t, key);
            }
        }
    }

    // Run boundary. What the policy leaves resident is the next state to try; what is resident
    // but not kept leaves after its last use (copied if dirty), and the kept ones that left
    // come back.
    let mut end_state: Vec<u32> = (0..tensors.len() as u32)
        .filter(|&t| sim.resident[t as usize] && tensors[t as usize].kind.persists())
        .collect();
    end_state.sort_unstable();
    for &t in &end_state {
        if kept[t as usize] {
            continue;
        }
        let last = lv.last_use[t as usize].expect("a resident tensor was used");
        sim.leave(t);
        if !sim.host_valid[t as usize] {
            plan.bytes_out += sim.size(t);
            sim.host_valid[t as usize] = true;
        }
        // At the run's end (`None`) the sends home copy it.
        let Some(last) = holds.leave_after(t, last, n_nodes32) else {
            continue;
        };
        plan.swap_out_after[last as usize].push(t);
        sim.left_after[t as usize] = last as i64;
        let size = sim.size(t);
        for u in &mut sim.usage[last as usize + 1..n_nodes] {
            *u -= size;
        }
    }
    sim.usage[n_nodes] = sim.used;
    for &t in keep {
        if !sim.resident[t as usize] {
            returns.push((n_nodes as u32, t, sim.left_after[t as usize]));
            plan.bytes_in += sim.size(t);
        }
    }

    // Returns: as early as the profile leaves room, in the order they are needed.
    returns.sort_unstable();
    for (m, t, left) in returns {
        let size = sim.size(t);
        let earliest = (left + 1).max(0) as usize;
        let mut k = m as usize;
        while k > earliest && sim.usage[k - 1] + size + slack <= budget {
            k -= 1;
        }
        for u in &mut sim.usage[k..m as usize] {
            *u += size;
        }
        plan.prefetch_before[k].push(t);
    }
    plan.peak = sim.usage.iter().copied().max().unwrap_or(0);
    (plan, end_state)
}
