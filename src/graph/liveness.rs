//! Liveness: for every intermediate, the node that allocates it, how many uses it has (a tensor
//! read twice by one node is two uses), and the node after which its last use frees it; and the
//! peak of live bytes the dynamic schedule reaches — the lower bound any schedule of this node
//! order needs, and the figure the pool's peak must equal when nothing else is allocated.
//! One pass over the nodes: linear in the graph's size. Its sums cannot wrap: the graph bounds
//! its tensors' and workspaces' total (`MAX_GRAPH_BYTES`) as they are added.

use super::{Node, Tensor, TensorKind};

#[derive(Clone, Debug, Default)]
pub struct Liveness {
    /// Per tensor: number of uses (input or output occurrences) over the whole graph.
    pub use_count: Vec<u64>,
    /// Per tensor: the nodes that touch it, ascending, each once.
    pub uses: Vec<Vec<u32>>,
    /// Per tensor: first and last node that touches it (None when no node does).
    pub first_use: Vec<Option<u32>>,
    pub last_use: Vec<Option<u32>>,
    /// Per node: intermediates first written by this node (allocated before it runs).
    pub allocs: Vec<Vec<u32>>,
    /// Per node: intermediates whose last use is this node (freed right after it).
    pub frees: Vec<Vec<u32>>,
    /// Bytes of all persistent tensors (inputs, parameters, outputs), rounded to `align`.
    pub persistent_bytes: u64,
    /// Sum of every intermediate's and workspace's rounded size.
    pub transient_total_bytes: u64,
    /// Peak of live intermediate + workspace bytes during a run, rounded to `align`.
    pub peak_transient_bytes: u64,
    /// Node at which that peak is reached.
    pub peak_node: u32,
    /// Per node: live transient bytes while it runs (its inputs, outputs, workspaces included).
    pub live_at_node: Vec<u64>,
}

pub fn round_up(bytes: u64, align: u64) -> u64 {
    bytes.div_ceil(align) * align
}

/// Marks "no further use in this run" in next-use keys.
pub(crate) const NEVER: u32 = u32::MAX;

impl Liveness {
    /// The first node after `n` that uses tensor `t`, or `NEVER`.
    pub fn next_use_after(&self, t: u32, n: u32) -> u32 {
        let uses = &self.uses[t as usize];
        let i = uses.partition_point(|&u| u <= n);
        uses.get(i).copied().unwrap_or(NEVER)
    }

    /// The last node before `n` that uses tensor `t` (None when none does).
    pub fn last_use_before(&self, t: u32, n: u32) -> Option<u32> {
        let uses = &self.uses[t as usize];
        let i = uses.partition_point(|&u| u < n);
        i.checked_sub(1).map(|i| uses[i])
    }
}

impl Liveness {
    pub fn analyse(tensors: &[Tensor], nodes: &[Node], align: u64) -> Liveness {
        let n_t = tensors.len();
        let mut lv = Liveness {
            use_count: vec![0; n_t],
            uses: vec![Vec::new(); n_t],
            first_use: vec![None; n_t],
            last_use: vec![None; n_t],
            allocs: vec![Vec::new(); nodes.len()],
            frees: vec![Vec::new(); nodes.len()],
            live_at_node: vec![0; nodes.len()],
            ..Liveness::default()
        };
        for (n, node) in nodes.iter().enumerate() {
            for &t in node.inputs.iter().chain(&node.outputs) {
                let t = t as usize;
                lv.use_count[t] += 1;
                if lv.uses[t].last() != Some(&(n as u32)) {
                    lv.uses[t].push(n as u32);
                }
                lv.first_use[t].get_or_insert(n as u32);
                lv.last_use[t] = Some(n as u32);
            }
        }
        for (t, tensor) in tensors.iter().enumerate() {
            let size = round_up(tensor.size, align);
            if tensor.kind.persists() {
                lv.persistent_bytes += size;
                continue;
            }
            // An intermediate no node touches is never allocated.
            if let (Some(first), Some(last)) = (lv.first_use[t], lv.last_use[t]) {
                lv.allocs[first as usize].push(t as u32);
                lv.frees[last as usize].push(t as u32);
                lv.transient_total_bytes += size;
            }
        }
        let mut live = 0u64;
        for (n, node) in nodes.iter().enumerate() {
            let workspace: u64 = node.workspaces.iter().map(|&w| round_up(w, align)).sum();
            lv.transient_total_bytes += workspace;
            live += lv.allocs[n]
                .iter()
                .map(|&t| round_up(tensors[t as usize].size, align))
                .sum::<u64>();
            live += workspace;
            lv.live_at_node[n] = live;
            if live > lv.peak_transient_bytes {
                lv.peak_transient_bytes = live;
                lv.peak_node = n as u32;
            }
            live -= workspace;
            live -= lv.frees[n]
                .iter()
                .map(|&t| round_up(tensors[t as usize].size, align))
                .sum::<u64>();
        }
        debug_assert!(tensors
            .iter()
            .all(|t| t.kind != TensorKind::Intermediate || t.size > 0));
        lv
    }
}
