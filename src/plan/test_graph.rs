//! The small graphs the swap plan's tests build (`swap_tests.rs`, `swap_holds_tests.rs`):
//! tensors sized in MB, host callback nodes, in-place all-reduces.

use crate::graph::{Node, Tensor, TensorKind};

pub const MB: u64 = 1_000_000;

#[derive(Default)]
pub struct G {
    pub tensors: Vec<Tensor>,
    pub nodes: Vec<Node>,
}

impl G {
    pub fn tensor(&mut self, mb: u64, kind: TensorKind) -> u32 {
        self.tensors.push(Tensor {
            size: mb * MB,
            kind,
            name: format!("t{}", self.tensors.len()),
            producer: None,
        });
        self.tensors.len() as u32 - 1
    }

    /// A node writing `output` alone, rerunnable by the plan when `recomputable`.
    pub fn node(&mut self, inputs: &[u32], output: u32, recomputable: bool) -> u32 {
        self.add(inputs, &[output], recomputable)
    }

    /// A node writing `outputs`, never rerun.
    pub fn node_writing(&mut self, inputs: &[u32], outputs: &[u32]) -> u32 {
        self.add(inputs, outputs, false)
    }

    /// An in-place all-reduce of `ts` (fused when several).
    pub fn all_reduce(&mut self, ts: &[u32]) -> u32 {
        let n = self.node_writing(ts, ts);
        self.nodes[n as usize] = Node::test_all_reduce(ts, format!("n{n}"));
        n
    }

    fn add(&mut self, inputs: &[u32], outputs: &[u32], recomputable: bool) -> u32 {
        let n = self.nodes.len() as u32;
        for &t in outputs {
            self.tensors[t as usize].producer.get_or_insert(n);
        }
        let name = format!("n{n}");
        self.nodes
            .push(Node::test_callback(inputs, outputs, recomputable, name));
        n
    }
}
