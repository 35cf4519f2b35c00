//! Graphs: tensors and kernel nodes as the host describes them, validated as they are added,
//! and the liveness analysis `finalize` derives from them.
//!
//! Nodes run in the order added. A tensor that only nodes produce (intermediates, outputs) must
//! be written by an earlier node before a node reads it; that is checked here, at build time.
//!
//! A node names its kernel in `kernels` terms only (`Kernel`, `BuiltinOp`, `LaunchDims`); this
//! layer knows nothing of devices. `GraphError` converts into the crate's `Error` here.

pub mod buckets;
pub mod collective;
pub mod fused;
pub mod liveness;

use crate::error::Error;
use crate::kernels::{validate_builtin, BuiltinOp, Kernel, LaunchDims};
use std::sync::atomic::{AtomicU32, Ordering};

pub use fused::FusedGroup;
pub use liveness::Liveness;

/// Largest tensor or workspace the runtime accepts (256 TiB): anything larger is a bug in the
/// caller (a negative size cast to unsigned, say), not a real request.
pub(crate) const MAX_BUFFER_BYTES: u64 = 1 << 48;

/// Most bytes one graph's tensors and workspaces may add up to (1 EiB). Every sum the analysis
/// and the planners make over a graph (live bytes, totals, arena offsets, each rounded up to the
/// pool's granule) is then far from 2^64, so the bound is checked once, here, where the caller's
/// sizes come in, and nowhere else can a sum of them wrap.
pub(crate) const MAX_GRAPH_BYTES: u64 = 1 << 60;
/// Most nodes in one graph: node indices are `u32`, and `u32::MAX` means "no further use".
pub(crate) const MAX_NODES: usize = u32::MAX as usize - 1;
/// Most inputs, outputs or workspaces of one node.
pub(crate) const MAX_NODE_BUFFERS: usize = 1 << 20;
/// Largest parameter blob of one node (1 MiB; a CUDA kernel takes at most 32,764 bytes, a host
/// callback's blob is copied into the node).
pub(crate) const MAX_PARAMS_BYTES: usize = 1 << 20;

/// Every graph gets a process-unique serial so a tensor id from another graph is recognised.
static NEXT_GRAPH_SERIAL: AtomicU32 = AtomicU32::new(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorKind {
    /// Written by the host before a run, persists.
    Input = 0,
    /// Weights and other state: written by the host, may be updated by nodes, persists.
    Parameter = 1,
    /// Produced and consumed within a run; freed after its last use.
    Intermediate = 2,
    /// Produced by nodes, read by the host after the run, persists.
    Output = 3,
}

impl TensorKind {
    pub fn from_raw(raw: u32) -> Option<TensorKind> {
        [
            TensorKind::Input,
            TensorKind::Parameter,
            TensorKind::Intermediate,
            TensorKind::Output,
        ]
        .into_iter()
        .find(|k| *k as u32 == raw)
    }

    pub fn name(self) -> &'static str {
        match self {
            TensorKind::Input => "input",
            TensorKind::Parameter => "parameter",
            TensorKind::Intermediate => "intermediate",
            TensorKind::Output => "output",
        }
    }

    /// Persistent tensors keep their memory across runs; only intermediates are freed.
    pub fn persists(self) -> bool {
        self != TensorKind::Intermediate
    }

    /// Inputs and parameters get their first contents from the host.
    pub fn host_written(self) -> bool {
        matches!(self, TensorKind::Input | TensorKind::Parameter)
    }
}

#[derive(Clone, Debug)]
pub struct Tensor {
    pub size: u64,
    pub kind: TensorKind,
    pub name: String,
    /// Index of the first node that writes it.
    pub producer: Option<u32>,
}

impl Tensor {
    /// "tensor 3 'h1' (intermediate, 4096 bytes)" — how every error message names a tensor.
    pub fn describe(&self, index: u32) -> String {
        if self.name.is_empty() {
            format!("tensor {index} ({}, {} bytes)", self.kind.name(), self.size)
        } else {
            format!(
                "tensor {index} '{}' ({}, {} bytes)",
                self.name,
                self.kind.name(),
                self.size
            )
        }
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub kernel: Kernel,
    /// For built-ins: the validated op.
    pub builtin: Option<BuiltinOp>,
    pub inputs: Vec<u32>,
    pub outputs: Vec<u32>,
    pub workspaces: Vec<u64>,
    pub dims: LaunchDims,
    pub params: Vec<u8>,
    /// The host declared the node a pure function of its inputs (`Graph::set_recomputable`):
    /// a swap plan may drop its output and run the node again before a later reader.
    pub recomputable: bool,
    /// The host's name for the node (empty: none), used wherever a message names the node.
    pub name: String,
    /// A collective node's communicator (its kernel is `Kernel::Collective`).
    pub comm: Option<collective::CommRef>,
}

impl Node {
    /// A plan's test node: a host callback that does nothing, reading `inputs` and writing
    /// `outputs` (the planners look at nothing else).
    #[cfg(test)]
    pub(crate) fn test_callback(
        inputs: &[u32],
        outputs: &[u32],
        recomputable: bool,
        name: String,
    ) -> Node {
        unsafe extern "C" fn nothing(
            _: *const crate::kernels::CallbackArgs,
            _: *mut std::ffi::c_void,
        ) -> i32 {
            0
        }
        Node {
            kernel: Kernel::Callback(crate::kernels::HostCallback {
                func: nothing,
                user_data: 0,
                owner: None,
            }),
            builtin: None,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            workspaces: Vec::new(),
            dims: LaunchDims {
                grid: [1; 3],
                block: [1; 3],
                shared_mem_bytes: 0,
            },
            params: Vec::new(),
            recomputable,
            name,
            comm: None,
        }
    }

    /// A plan's test collective: an all-reduce (sum, f32) of `tensors` in place, over a
    /// communicator the planners never call.
    #[cfg(test)]
    pub(crate) fn test_all_reduce(tensors: &[u32], name: String) -> Node {
        struct Unused;
        impl crate::device::comm::Communicator for Unused {
            fn rank(&self) -> u32 {
                0
            }
            fn nranks(&self) -> u32 {
                1
            }
            fn enqueue(
                &self,
                _: &dyn crate::device::Device,
                _: &[crate::kernels::collective::Collective],
                _: crate::device::StreamId,
            ) -> crate::device::DeviceResult<()> {
                unreachable!("the planners queue nothing")
            }
            fn abort(&self, _: &str) {}
            fn aborted(&self) -> Option<String> {
                None
            }
        }
        use crate::kernels::collective::{CollectiveKind, DType, ReduceOp};
        let mut node = Node::test_callback(tensors, tensors, false, name);
        node.kernel = Kernel::Collective {
            kind: CollectiveKind::AllReduce(ReduceOp::Sum),
            dtype: DType::F32,
        };
        node.comm = Some(collective::CommRef(std::sync::Arc::new(Unused)));
        node
    }

    /// "node 3 'attn.qkv' (built-in matmul)" — how every message names a node.
    pub fn describe(&self, index: u32) -> String {
        if self.name.is_empty() {
            format!("node {index} ({})", self.kernel.describe())
        } else {
            format!("node {index} '{}' ({})", self.name, self.kernel.describe())
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum GraphError {
    Invalid(String),
    /// The graph is finalized (no more edits) or not yet finalized (cannot run).
    State(String),
}

impl std::fmt::Display for GraphError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GraphError::Invalid(m) | GraphError::State(m) => f.write_str(m),
        }
    }
}

impl From<GraphError> for Error {
    fn from(e: GraphError) -> Error {
        match e {
            GraphError::Invalid(m) => Error::InvalidArgument(m),
            GraphError::State(m) => Error::InvalidState(m),
        }
    }
}

pub type GraphResult<T> = Result<T, GraphError>;

fn invalid<T>(msg: String) -> GraphResult<T> {
    Err(GraphError::Invalid(msg))
}

pub struct Graph {
    serial: u32,
    tensors: Vec<Tensor>,
    nodes: Vec<Node>,
    liveness: Option<Liveness>,
    /// Bytes of every tensor and workspace so far (at most `MAX_GRAPH_BYTES`).
    total_bytes: u64,
    /// Tensors collective nodes share one contiguous block with (`fused.rs`).
    fused: Vec<FusedGroup>,
}

impl Default for Graph {
    fn default() -> Self {
        Self::new()
    }
}

impl Graph {
    pub fn new() -> Graph {
        Graph {
            serial: NEXT_GRAPH_SERIAL.fetch_add(1, Ordering::Relaxed),
            tensors: Vec::new(),
            nodes: Vec::new(),
            liveness: None,
            total_bytes: 0,
            fused: Vec::new(),
        }
    }

    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The graph's process-unique serial (the high half of its tensor ids).
    pub fn serial(&self) -> u32 {
        self.serial
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn liveness(&self) -> Option<&Liveness> {
        self.liveness.as_ref()
    }

    pub fn is_finalized(&self) -> bool {
        self.liveness.is_some()
    }

    /// The public id of tensor `index`: the graph's serial in the high half, so ids of other
    /// graphs (and made-up numbers) are told apart.
    pub fn tensor_id(&self, index: u32) -> u64 {
        ((self.serial as u64) << 32) | index as u64
    }

    /// Resolves a public tensor id to an index into `tensors()`.
    pub fn tensor_index(&self, id: u64) -> GraphResult<u32> {
        let (serial, index) = ((id >> 32) as u32, id as u32);
        if serial != self.serial {
            return invalid(format!("tensor id {id:#x} does not belong to this graph"));
        }
        if index as usize >= self.tensors.len() {
            return invalid(format!(
                "tensor id {id:#x}: no tensor {index} in this graph"
            ));
        }
        Ok(index)
    }

    fn check_editable(&self) -> GraphResult<()> {
        if self.is_finalized() {
            return Err(GraphError::State(
                "the graph is finalized; it can no longer be changed".into(),
            ));
        }
        Ok(())
    }

    pub fn add_tensor(&mut self, size: u64, kind: TensorKind, name: &str) -> GraphResult<u64> {
        self.check_editable()?;
        let label = if name.is_empty() {
            String::new()
        } else {
            format!(" '{name}'")
        };
        if size == 0 {
            return invalid(format!(
                "tensor{label}: size 0 bytes; a tensor needs at least one byte"
            ));
        }
        if size > MAX_BUFFER_BYTES {
            return invalid(format!(
                "tensor{label}: size {size} bytes exceeds the maximum of {MAX_BUFFER_BYTES} bytes"
            ));
        }
        if self.tensors.len() >= u32::MAX as usize {
            return invalid("too many tensors in one graph".into());
        }
        self.total_bytes = self.checked_total(size, || format!("tensor{label} of {size} bytes"))?;
        let index = self.tensors.len() as u32;
        self.tensors.push(Tensor {
            size,
            kind,
            name: name.to_string(),
            producer: None,
        });
        Ok(self.tensor_id(index))
    }

    /// Adds a node; returns its index. Everything about the node is checked here.
    pub fn add_node(
        &mut self,
        kernel: Kernel,
        input_ids: &[u64],
        output_ids: &[u64],
        workspaces: &[u64],
        dims: LaunchDims,
        params: &[u8],
    ) -> GraphResult<u32> {
        self.check_editable()?;
        if self.nodes.len() >= MAX_NODES {
            return invalid(format!("too many nodes in one graph (at most {MAX_NODES})"));
        }
        let node = self.nodes.len() as u32;
        // Formatted only when an error needs it: graphs of many thousand nodes are built often.
        let what = || format!("node {node} ({})", kernel.describe());
        if params.len() > MAX_PARAMS_BYTES {
            return invalid(format!(
                "{}: a parameter blob of {} bytes; a node's is at most {MAX_PARAMS_BYTES}",
                what(),
                params.len()
            ));
        }
        for (role, count) in [
            ("inputs", input_ids.len()),
            ("outputs", output_ids.len()),
            ("workspaces", workspaces.len()),
        ] {
            if count > MAX_NODE_BUFFERS {
                return invalid(format!(
                    "{}: {count} {role}; a node has at most {MAX_NODE_BUFFERS}",
                    what()
                ));
            }
        }
        let resolve = |ids: &[u64], role: &str| -> GraphResult<Vec<u32>> {
            ids.iter()
                .enumerate()
                .map(|(i, &id)| {
                    self.tensor_index(id)
                        .map_err(|e| GraphError::Invalid(format!("{}, {role} {i}: {e}", what())))
                })
                .collect()
        };
        let inputs = resolve(input_ids, "input")?;
        let outputs = resolve(output_ids, "output")?;
        if outputs.is_empty() && !matches!(kernel, Kernel::Callback(_) | Kernel::Collective { .. })
        {
            return invalid(format!("{} has no outputs", what()));
        }
        for (i, &t) in inputs.iter().enumerate() {
            let tensor = &self.tensors[t as usize];
            if !tensor.kind.host_written() && tensor.producer.is_none() {
                return invalid(format!(
                    "{}, input {i}: {} is read before any node writes it",
                    what(),
                    tensor.describe(t)
                ));
            }
        }
        for (i, &t) in outputs.iter().enumerate() {
            if outputs[..i].contains(&t) {
                return invalid(format!(
                    "{}: {} appears twice among the outputs",
                    what(),
                    self.tensors[t as usize].describe(t)
                ));
            }
        }
        let mut workspace_bytes = 0u64;
        for (i, &w) in workspaces.iter().enumerate() {
            if w == 0 || w > MAX_BUFFER_BYTES {
                return invalid(format!(
                    "{}, workspace {i}: size {w} bytes (must be between 1 and {MAX_BUFFER_BYTES})",
                    what()
                ));
            }
            // Each term is at most 2^48 and the sum stops at 2^60: this cannot wrap.
            workspace_bytes += w;
            if workspace_bytes > MAX_GRAPH_BYTES {
                return invalid(format!(
                    "{}: its {} workspaces add up to more than {MAX_GRAPH_BYTES} bytes (the first {} make {workspace_bytes})",
                    what(),
                    workspaces.len(),
                    i + 1
                ));
            }
        }
        let total = self.checked_total(workspace_bytes, || {
            format!("{}'s workspaces of {workspace_bytes} bytes", what())
        })?;
        let builtin = match &kernel {
            Kernel::Builtin(kind) => {
                let sizes = |ts: &[u32]| {
                    ts.iter()
                        .map(|&t| self.tensors[t as usize].size)
                        .collect::<Vec<_>>()
                };
                let op = validate_builtin(*kind, &sizes(&inputs), &sizes(&outputs), params)
                    .map_err(|e| GraphError::Invalid(format!("{}: {e}", what())))?;
                if matches!(op, BuiltinOp::Matmul { .. })
                    && inputs.iter().any(|t| outputs.contains(t))
                {
                    return invalid(format!(
                        "{}: matmul cannot write one of its own inputs",
                        what()
                    ));
                }
                Some(op)
            }
            _ => None,
        };
        for &t in &outputs {
            self.tensors[t as usize].producer.get_or_insert(node);
        }
        self.total_bytes = total;
        self.nodes.push(Node {
            kernel,
            builtin,
            inputs,
            outputs,
            workspaces: workspaces.to_vec(),
            dims,
            params: params.to_vec(),
            recomputable: false,
            name: String::new(),
            comm: None,
        });
        Ok(node)
    }

    /// Names node `node` (an empty name removes it); messages about the node use the name.
    pub fn set_node_name(&mut self, node: u32, name: &str) -> GraphResult<()> {
        self.check_editable()?;
        let count = self.nodes.len();
        let Some(n) = self.nodes.get_mut(node as usize) else {
            return invalid(format!(
                "node {node} does not exist (the graph has {count} nodes)"
            ));
        };
        n.name = name.to_string();
        Ok(())
    }

    /// Declares node `node` a pure function of its inputs: run again on the same inputs it
    /// writes the same bytes to its output and has no other effect. Only then may a swap plan
    /// drop the node's output instead of copying it to the host, and run the node once more
    /// before the output's next reader (rematerialisation); nothing else ever runs a node
    /// twice. Only a node with exactly one output, which it does not also read, qualifies.
    pub fn set_recomputable(&mut self, node: u32, recomputable: bool) -> GraphResult<()> {
        self.check_editable()?;
        let Some(n) = self.nodes.get(node as usize) else {
            return invalid(format!(
                "node {node} does not exist (the graph has {} nodes)",
                self.nodes.len()
            ));
        };
        if recomputable {
            if n.comm.is_some() {
                return invalid(format!(
                    "{} is a collective; only a kernel node can be recomputed",
                    n.describe(node)
                ));
            }
            if n.outputs.len() != 1 {
                return invalid(format!(
                    "{} writes {} outputs; only a node with exactly one output can be recomputed",
                    n.describe(node),
                    n.outputs.len()
                ));
            }
            if n.inputs.contains(&n.outputs[0]) {
                return invalid(format!(
                    "{} reads the tensor it writes; running it again would not give the same bytes",
                    n.describe(node)
                ));
            }
        }
        self.nodes[node as usize].recomputable = recomputable;
        Ok(())
    }

    /// The graph's total with `bytes` more, or an error naming `what` when it would pass
    /// `MAX_GRAPH_BYTES`.
    fn checked_total(&self, bytes: u64, what: impl FnOnce() -> String) -> GraphResult<u64> {
        match self.total_bytes.checked_add(bytes) {
            Some(t) if t <= MAX_GRAPH_BYTES => Ok(t),
            _ => invalid(format!(
                "{}: the graph's tensors and workspaces would add up to more than {MAX_GRAPH_BYTES} bytes \
                 ({} bytes so far)",
                what(),
                self.total_bytes
            )),
        }
    }

    /// Undoes `finalize` when what the runtime derives from the liveness fails (a swap or
    /// arena plan): a graph is finalized only when all of it succeeded.
    pub(crate) fn unfinalize(&mut self) {
        self.liveness = None;
    }

    /// Freezes the graph and derives liveness. `align` is the pool's allocation granule, so the
    /// computed peak is in the same units the pool's statistics report.
    pub fn finalize(&mut self, align: u64) -> GraphResult<&Liveness> {
        self.check_editable()?;
        if self.nodes.is_empty() {
            return invalid("the graph has no nodes".into());
        }
        for (i, t) in self.tensors.iter().enumerate() {
            if t.kind == TensorKind::Output && t.producer.is_none() {
                return invalid(format!(
                    "{} is never written by any node",
                    t.describe(i as u32)
                ));
            }
        }
        let liveness = Liveness::analyse(&self.tensors, &self.nodes, align);
        Ok(self.liveness.insert(liveness))
    }
}
