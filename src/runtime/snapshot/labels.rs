//! Who a pool block belongs to: the labels the runtime sets on the pool before each allocation
//! (`Pool::set_owner`), and their frames in a snapshot.
//!
//! A label is a `u32`. Fixed ones name the runtime's own callers (`LABEL_RAW`: `gkrt_malloc`
//! and the PyTorch entry points); every finalized graph registers a range of its own — one
//! label per tensor, one per node (its workspaces), one for its arena — taken from a counter
//! that never reuses a label, so a history event of a released graph is never credited to
//! another. A released graph's range is unregistered (its names are dropped); its events then
//! read "a released graph". After 2^32 labels new graphs get none (0: unknown), which only
//! loses names.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::graph::Graph;

/// No owner known (the runtime's own blocks, a graph finalized after labels ran out).
pub(crate) const LABEL_UNKNOWN: u32 = 0;
/// A host buffer from `gkrt_malloc` or `gkrt_torch_alloc`.
pub(crate) const LABEL_RAW: u32 = 1;
const FIRST_GRAPH_LABEL: u32 = 16;

/// One frame of a block's "stack" in PyTorch's snapshot format (innermost first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub name: String,
    pub filename: String,
    pub line: u64,
}

/// The names a graph's labels stand for, made when it is finalized.
#[derive(Debug)]
struct GraphNames {
    file: String,
    /// Per tensor: how messages describe it, and its first writer's description and index.
    tensors: Vec<(String, Option<(String, u32)>)>,
    nodes: Vec<String>,
}

#[derive(Debug)]
pub struct Labels {
    next: u32,
    graphs: BTreeMap<u32, Arc<GraphNames>>,
}

impl Default for Labels {
    fn default() -> Self {
        Labels {
            next: FIRST_GRAPH_LABEL,
            graphs: BTreeMap::new(),
        }
    }
}

impl Labels {
    /// Registers the labels of finalized `graph` and returns the first (tensor 0's), or
    /// `LABEL_UNKNOWN` when labels ran out.
    pub fn register(&mut self, graph: &Graph) -> u32 {
        let (tensors, nodes) = (graph.tensors(), graph.nodes());
        let count = tensors.len() as u64 + nodes.len() as u64 + 1;
        if self.next as u64 + count > u32::MAX as u64 {
            return LABEL_UNKNOWN;
        }
        let mut writer: Vec<Option<(String, u32)>> = vec![None; tensors.len()];
        for (n, node) in nodes.iter().enumerate().rev() {
            for &t in &node.outputs {
                writer[t as usize] = Some((node.describe(n as u32), n as u32));
            }
        }
        let names = GraphNames {
            file: format!("gkrt graph {}", graph.serial()),
            tensors: tensors
                .iter()
                .enumerate()
                .map(|(t, tensor)| tensor.describe(t as u32))
                .zip(writer)
                .collect(),
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(n, node)| node.describe(n as u32))
                .collect(),
        };
        let base = self.next;
        self.next += count as u32;
        self.graphs.insert(base, Arc::new(names));
        base
    }

    /// Forgets the names of the graph whose labels start at `base`.
    pub fn unregister(&mut self, base: u32) {
        self.graphs.remove(&base);
    }

    /// Graphs registered now.
    pub fn graphs(&self) -> usize {
        self.graphs.len()
    }

    /// The frames of `label`, innermost first: a tensor and the node that writes it, a node's
    /// workspace, a graph's arena, or the raw allocator.
    pub fn frames(&self, label: u32) -> Vec<Frame> {
        let frame = |name: String, filename: &str, line: u64| Frame {
            name,
            filename: filename.to_string(),
            line,
        };
        match label {
            LABEL_UNKNOWN => return vec![frame("gkrt runtime".into(), "gkrt", 0)],
            LABEL_RAW => return vec![frame("gkrt_malloc".into(), "gkrt", 0)],
            l if l < FIRST_GRAPH_LABEL || l >= self.next => {
                return vec![frame(format!("unknown owner {l}"), "gkrt", 0)]
            }
            _ => {}
        }
        let Some((&base, names)) = self.graphs.range(..=label).next_back() else {
            return vec![frame("a released graph".into(), "gkrt", 0)];
        };
        let local = (label - base) as usize;
        let (nt, nn) = (names.tensors.len(), names.nodes.len());
        let file = &names.file;
        if local < nt {
            let (tensor, writer) = &names.tensors[local];
            let mut frames = vec![frame(tensor.clone(), file, local as u64)];
            match writer {
                Some((node, n)) => frames.push(frame(node.clone(), file, *n as u64)),
                None => frames.push(frame("written by the host".into(), file, 0)),
            }
            frames
        } else if local < nt + nn {
            let n = local - nt;
            vec![
                frame("workspace".into(), file, n as u64),
                frame(names.nodes[n].clone(), file, n as u64),
            ]
        } else if local == nt + nn {
            vec![frame("planned arena".into(), file, 0)]
        } else {
            vec![frame("a released graph".into(), "gkrt", 0)]
        }
    }
}
