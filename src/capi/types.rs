//! Types of the C API. Enumerations that the caller passes in are plain `uint32_t` typedefs
//! with `#define`d values, so an out-of-range number from C is an error we report, never an
//! invalid Rust enum.
#![allow(non_camel_case_types)]

use std::ffi::c_void;

/// Major version of the API this header declares. `gkrt_version()` gives the loaded library's
/// version as a string, to compare against these at run time.
pub const GKRT_VERSION_MAJOR: u32 = 0;
/// Minor version of the API this header declares (see `GKRT_VERSION_MAJOR`).
pub const GKRT_VERSION_MINOR: u32 = 1;
/// Patch version of the API this header declares (see `GKRT_VERSION_MAJOR`).
pub const GKRT_VERSION_PATCH: u32 = 0;

/// The result of every fallible call. Values are fixed and never renumbered.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gkrt_status {
    /// The call succeeded.
    GKRT_STATUS_OK = 0,
    /// A NULL or malformed argument, an unknown or foreign handle or id, a size that does not match.
    GKRT_STATUS_INVALID_ARGUMENT = 1,
    /// The object is not in a state that allows the call (e.g. running an unfinalized graph).
    GKRT_STATUS_INVALID_STATE = 2,
    /// Device memory (or the memory limit) is exhausted.
    GKRT_STATUS_OUT_OF_MEMORY = 3,
    /// No usable device for the requested backend.
    GKRT_STATUS_NO_DEVICE = 4,
    /// A device or driver call failed; the message carries the driver's error name.
    GKRT_STATUS_DEVICE_ERROR = 5,
    /// PTX, cubin or CUDA source failed to compile or load.
    GKRT_STATUS_COMPILE_ERROR = 6,
    /// A host callback returned a non-zero status.
    GKRT_STATUS_CALLBACK_FAILED = 7,
    /// The backend cannot do this (e.g. PTX kernels on the host backend).
    GKRT_STATUS_UNSUPPORTED = 8,
    /// A bug in gkrt (a caught panic). The runtime stays usable.
    GKRT_STATUS_INTERNAL = 9,
    /// Another rank of a communicator failed, left, timed out or issued a different collective;
    /// the communicator is aborted (make a new one). The runtime and graphs stay usable.
    GKRT_STATUS_PEER_FAILED = 10,
}

/// Which backend a runtime uses.
pub type gkrt_device_kind = u32;
/// The GPU when a CUDA driver and device are present, else the host backend.
pub const GKRT_DEVICE_AUTO: gkrt_device_kind = 0;
/// The host backend: a model of a GPU on the CPU.
pub const GKRT_DEVICE_HOST: gkrt_device_kind = 1;
/// A CUDA GPU; GKRT_STATUS_NO_DEVICE when there is none.
pub const GKRT_DEVICE_CUDA: gkrt_device_kind = 2;

/// How a runtime places a graph's intermediates (`gkrt_config.memory_mode`).
pub type gkrt_memory_mode = u32;
/// The pool serves each allocation as its node runs; intermediates are freed after their last use.
pub const GKRT_MEMORY_DYNAMIC: gkrt_memory_mode = 0;
/// Every intermediate has a fixed offset in one arena planned at finalize.
pub const GKRT_MEMORY_PLANNED: gkrt_memory_mode = 1;

/// How a runtime's device pool grows (`gkrt_config.pool_growth`).
pub type gkrt_pool_growth = u32;
/// Virtual ranges for the streams that `gkrt_malloc` brings, and for the runtime's own streams
/// when `memory_limit` is set; plain segments for its own streams otherwise (the default).
pub const GKRT_POOL_GROWTH_AUTO: gkrt_pool_growth = 0;
/// Plain segments (`cuMemAlloc`) for every stream.
pub const GKRT_POOL_GROWTH_SEGMENTS: gkrt_pool_growth = 1;
/// One reserved virtual range per stream, pages mapped under the blocks (CUDA; the host backend
/// and budgets under 512 MiB use segments).
pub const GKRT_POOL_GROWTH_VIRTUAL: gkrt_pool_growth = 2;

/// What a tensor of a graph is for, and so how long it lives (`gkrt_graph_add_tensor`).
pub type gkrt_tensor_kind = u32;
/// Written by the host before a run; persists.
pub const GKRT_TENSOR_INPUT: gkrt_tensor_kind = 0;
/// Weights and state: written by the host, may be updated by nodes; persists.
pub const GKRT_TENSOR_PARAMETER: gkrt_tensor_kind = 1;
/// Lives inside a run: allocated when first written, freed after its last use.
pub const GKRT_TENSOR_INTERMEDIATE: gkrt_tensor_kind = 2;
/// Produced by nodes, read by the host; persists.
pub const GKRT_TENSOR_OUTPUT: gkrt_tensor_kind = 3;

/// Built-in kernels (all on f32 elements). Parameters go in `gkrt_launch.params`.
pub type gkrt_builtin = u32;
/// outputs: 1; params: float value.
pub const GKRT_BUILTIN_FILL: gkrt_builtin = 0;
/// inputs: 1, outputs: 1 (same size); byte copy.
pub const GKRT_BUILTIN_COPY: gkrt_builtin = 1;
/// inputs: a, b; outputs: a + b.
pub const GKRT_BUILTIN_ADD: gkrt_builtin = 2;
/// inputs: x; outputs: alpha * x; params: float alpha.
pub const GKRT_BUILTIN_SCALE: gkrt_builtin = 3;
/// inputs: x; outputs: x > 0 ? x : 0.
pub const GKRT_BUILTIN_RELU: gkrt_builtin = 4;
/// inputs: grad, x; outputs: x > 0 ? grad : 0.
pub const GKRT_BUILTIN_RELU_GRAD: gkrt_builtin = 5;
/// inputs: a (m×k), b (k×n); outputs: a·b (m×n), row-major; params: uint32_t m, n, k.
pub const GKRT_BUILTIN_MATMUL: gkrt_builtin = 6;

/// A tensor of a graph. Ids are unique across graphs, so a foreign id is detected.
pub type gkrt_tensor = u64;

/// Runtime configuration. Fill with `gkrt_config_init` (or `gkrt_config_init_sized`), then
/// change what you need. Fields are only ever added at the end: `struct_size` tells the library
/// which ones the program's header has (see `gkrt_config_init_sized`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gkrt_config {
    /// Bytes of this struct as the program's header declares it; set by the init functions.
    /// The library reads only that many bytes: fields a program's older header lacks keep their
    /// defaults, and fields a newer header has must be zero for a library that lacks them.
    pub struct_size: u64,
    /// GKRT_DEVICE_AUTO (default), _HOST or _CUDA. The environment variable GKRT_DEVICE
    /// (auto|host|cuda) overrides it.
    pub device: gkrt_device_kind,
    /// CUDA device ordinal (default 0).
    pub device_ordinal: u32,
    /// Cap on the device memory the runtime takes, in bytes; 0 (default) = the device's total
    /// (16 GiB on the host backend).
    pub memory_limit: u64,
    /// GKRT_MEMORY_DYNAMIC (default) or GKRT_MEMORY_PLANNED.
    pub memory_mode: gkrt_memory_mode,
    /// 0 off, 1 error, 2 warn (default), 3 info, 4 debug, 5 trace; messages go to stderr.
    pub log_level: u32,
    /// Host backend only: each queued item waits a random 0..host_jitter_us µs first, so a
    /// missing event wait shows up in tests. Default 0; GKRT_HOST_JITTER_US overrides it.
    pub host_jitter_us: u32,
    /// GKRT_POOL_GROWTH_AUTO (default), _SEGMENTS or _VIRTUAL: how the device pool takes
    /// memory. Virtual ranges strand less memory between blocks (fragmentation), segments cost
    /// less per graph node. The environment variable GKRT_POOL_VMM (1|0) overrides it.
    pub pool_growth: gkrt_pool_growth,
    /// Seed of every random choice the runtime makes (jitter).
    pub seed: u64,
    /// Cap on the pinned host memory that holds swapped-out tensors, in bytes; 0 (default) =
    /// no cap. Pinned memory is taken once and reused, never per copy.
    pub host_memory_limit: u64,
}

/// Launch parameters of a node. For built-ins only `params` is used (grid and block are chosen
/// by the runtime). For device functions the kernel's parameters are, in order: one pointer per
/// input, one per output, one per workspace, then — if `params_size` > 0 — the bytes at
/// `params` as one by-value struct parameter.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gkrt_launch {
    /// Grid dimensions in blocks (x, y, z), for device functions.
    pub grid: [u32; 3],
    /// Block dimensions in threads (x, y, z), for device functions.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes, for device functions.
    pub shared_mem_bytes: u32,
    /// Copied at add time; may be NULL when params_size is 0.
    pub params: *const c_void,
    /// Bytes at `params`.
    pub params_size: usize,
}

/// Memory and execution statistics of a runtime (`gkrt_runtime_stats`). Byte figures count
/// allocations rounded up to 256 bytes. Fields are only ever added at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gkrt_stats {
    /// Bytes of this struct the library filled (set by the library): fields past it were not
    /// filled (a library older than the program's header) and read as zero.
    pub struct_size: u64,
    /// Bytes in live allocations.
    pub allocated_bytes: u64,
    /// Bytes the pool holds from the device (live allocations + cached free blocks).
    pub reserved_bytes: u64,
    /// Highest `allocated_bytes` since the runtime was made or
    /// `gkrt_runtime_reset_peak_stats`.
    pub peak_allocated_bytes: u64,
    /// Highest `reserved_bytes` since the runtime was made or
    /// `gkrt_runtime_reset_peak_stats`.
    pub peak_reserved_bytes: u64,
    /// Bytes of live allocations as requested (before rounding).
    pub requested_bytes: u64,
    /// Allocations served, cumulative.
    pub alloc_count: u64,
    /// Frees, cumulative (stream-ordered ones included).
    pub free_count: u64,
    /// Allocations that failed for lack of memory or a device error, cumulative.
    pub failed_alloc_count: u64,
    /// Segments (plain segments and reserved virtual ranges) the pool holds now.
    pub segment_count: u64,
    /// Segments the pool has taken from the device, cumulative.
    pub segment_alloc_count: u64,
    /// Segments the pool has given back to the device, cumulative.
    pub segment_free_count: u64,
    /// The cap on the pool's reserved bytes: `gkrt_config.memory_limit`, or the device's total
    /// memory when that is 0.
    pub memory_limit: u64,
    /// Runs started, failed ones included.
    pub runs: u64,
    /// Nodes launched by all runs, cumulative.
    pub nodes_launched: u64,
    /// Pool allocations made by the last run. In planned mode 0 from the second run on: the
    /// first run takes the arena (not counted here) and allocates each persistent tensor that no
    /// write has put on the device yet (counted).
    pub last_run_pool_allocs: u64,
    /// Swapping, cumulative over runs: bytes copied device→host and host→device, tensors
    /// copied each way, evictions the fallback made (allocations the swap plan did not
    /// foresee), and the time the compute stream waited for copies, in nanoseconds.
    pub swap_out_bytes: u64,
    /// Bytes copied host→device (see `swap_out_bytes`).
    pub swap_in_bytes: u64,
    /// Tensors copied device→host (see `swap_out_bytes`).
    pub tensors_swapped_out: u64,
    /// Tensors copied host→device (see `swap_out_bytes`).
    pub tensors_swapped_in: u64,
    /// Evictions the fallback made (see `swap_out_bytes`).
    pub evictions: u64,
    /// Time the compute stream waited for copies, in nanoseconds (see `swap_out_bytes`), when
    /// the waits are timed (`GKRT_EXEC_TIME_STALLS=1`); 0 otherwise, the default, since timing
    /// them slows the device's stream.
    pub copy_wait_ns: u64,
    /// Pinned host memory held for swapped tensors: reserved now and at its peak.
    pub pinned_reserved_bytes: u64,
    /// Highest `pinned_reserved_bytes` (see `peak_reserved_bytes`).
    pub pinned_peak_reserved_bytes: u64,
    /// Pool pages (virtual-memory growth) mapped and unmapped, cumulative: a page moved from a
    /// free hole to where a request needs it counts once each way.
    pub page_map_count: u64,
    /// Pool pages unmapped, cumulative (see `page_map_count`).
    pub page_unmap_count: u64,
    /// Times the pool waited for the device to finish queued work before moving pages.
    pub pool_device_waits: u64,
    /// Tensors a swap plan rebuilt by running their producer again (nodes declared with
    /// `gkrt_graph_set_node_recomputable`) instead of copying them out and back, cumulative.
    pub tensors_recomputed: u64,
    /// Runs (or other epochs: the compute stream's working blocks all freed, then allocated
    /// again the same way) that the pool placed by the plan of the one before, cumulative. On a
    /// device with virtual memory a graph's second run is planned from its first, and every
    /// run after that that allocates alike follows a plan: no search, no page mapped. 0 on the
    /// host backend (no virtual memory) and with `GKRT_POOL_EPOCH_PLANS=0`.
    pub pool_epochs_followed: u64,
    /// Plans the pool left before their end: a run that allocated otherwise than the one it
    /// was planned from (the rest of it placed as usual), cumulative.
    pub pool_epochs_left: u64,
}

/// What finalize derived from a graph (`gkrt_graph_get_info`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gkrt_graph_info {
    /// Tensors added to the graph.
    pub num_tensors: u64,
    /// Nodes added to the graph.
    pub num_nodes: u64,
    /// 1 once the graph is finalized, else 0 (the fields below are then 0).
    pub finalized: u32,
    /// Node at which the transient peak is reached.
    pub peak_node: u32,
    /// Bytes of inputs, parameters and outputs (rounded to 256).
    pub persistent_bytes: u64,
    /// Peak of live intermediate + workspace bytes in a run (rounded to 256): what the pool's
    /// allocated bytes rise by during a run in dynamic mode.
    pub peak_transient_bytes: u64,
    /// Sum of all intermediates and workspaces (rounded to 256): what a runtime without
    /// reference-count freeing would hold.
    pub transient_total_bytes: u64,
    /// The smallest `memory_limit` the graph can run under in dynamic mode, swapping (and
    /// recomputing) everything a node does not use: the largest sum over the nodes of a node's
    /// own inputs, outputs and workspaces (each rounded to 256; a tensor read twice counted
    /// once), plus, with collectives, the tensors they hold on the device during that node
    /// (from their last use before the collective until it is waited for; a fused block whole).
    /// Below it a node cannot run; graphs whose working set
    /// (`persistent_bytes + peak_transient_bytes`) exceeds the limit run slower, by copies.
    pub min_memory_limit: u64,
}

// The callback's argument structs are defined next to the executor that fills them
// (`kernels::CallbackArgs`, `kernels::CallbackBuffer`); cbindgen.toml exports them as
// `gkrt_callback_args` and `gkrt_buffer`.
use crate::runtime::CallbackArgs;

/// A host callback: called with the node's buffers and the stream, returns 0 on success and
/// anything else to report failure (the run then fails with GKRT_STATUS_CALLBACK_FAILED).
/// On the CUDA backend it is called on the thread running `gkrt_runtime_run` with device
/// pointers and the `CUstream`: it must enqueue its work on that stream (e.g. a cuBLAS call),
/// or synchronise it. On the host backend it is called on the stream's worker thread in stream
/// order, and the pointers are host addresses it may read and write directly.
/// A callback may call gkrt functions on other runtimes and graphs; a call that needs the
/// runtime or graph that is running it (or any that is busy at that moment) returns
/// GKRT_STATUS_INVALID_STATE instead of waiting, since waiting could never end.
pub type gkrt_callback_fn =
    Option<unsafe extern "C" fn(args: *const CallbackArgs, user_data: *mut c_void) -> i32>;

/// Opaque: a runtime. Internally locked: every call on one may come from any thread.
pub struct gkrt_runtime {
    _private: [u8; 0],
}

/// Opaque: a graph of one runtime. Internally locked; calls on one graph are serialised.
pub struct gkrt_graph {
    _private: [u8; 0],
}

/// Opaque: a kernel of one runtime (built-in, device code, or host callback). Immutable;
/// may be used by any number of graphs of that runtime, from any thread.
pub struct gkrt_kernel {
    _private: [u8; 0],
}

/// Opaque: a device data queue of one runtime (`gkrt_queue_create`). Internally locked: pushes,
/// closes and statistics may come from any thread.
pub struct gkrt_queue {
    _private: [u8; 0],
}

/// A device data queue's counters (`gkrt_queue_get_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gkrt_queue_stats {
    /// Batches pushed.
    pub pushes: u64,
    /// Batches popped by graph runs.
    pub pops: u64,
    /// Bytes pushed (copied to the device).
    pub bytes_pushed: u64,
    /// Time pushes waited for a free slot, in nanoseconds.
    pub push_wait_ns: u64,
    /// Time pops waited for a batch, in nanoseconds.
    pub pop_wait_ns: u64,
}

/// Opaque: one rank's communicator (see `gkrt_comm_init_rank`). Internally locked: calls on one
/// may come from any thread.
pub struct gkrt_comm {
    _private: [u8; 0],
}

/// The 128 bytes ranks share to join one communicator (NCCL_UNIQUE_ID_BYTES), made by
/// `gkrt_comm_get_unique_id`. Copy it by value (it holds no pointer).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct gkrt_unique_id {
    pub internal: [u8; 128],
}

/// What a collective node does (`gkrt_graph_add_collective`), with NCCL's semantics.
pub type gkrt_collective = u32;
/// Every rank's input reduced (`op`) into every rank's output; in place when they are one tensor.
pub const GKRT_COLLECTIVE_ALL_REDUCE: gkrt_collective = 0;
/// The root's input (`root_or_peer`) copied into every rank's output.
pub const GKRT_COLLECTIVE_BROADCAST: gkrt_collective = 1;
/// Every rank's input reduced into the root's output; other ranks' outputs are left as they were.
pub const GKRT_COLLECTIVE_REDUCE: gkrt_collective = 2;
/// Every rank's input concatenated in rank order into every rank's output (nranks times larger).
pub const GKRT_COLLECTIVE_ALL_GATHER: gkrt_collective = 3;
/// Every rank's input (nranks equal slices) reduced; rank r's output gets slice r.
pub const GKRT_COLLECTIVE_REDUCE_SCATTER: gkrt_collective = 4;
/// The input sent to rank `root_or_peer` (no output); matched in order by its receive.
pub const GKRT_COLLECTIVE_SEND: gkrt_collective = 5;
/// The output received from rank `root_or_peer` (no input).
pub const GKRT_COLLECTIVE_RECV: gkrt_collective = 6;

/// Reduction operator of a collective node.
pub type gkrt_reduce_op = u32;
pub const GKRT_REDUCE_SUM: gkrt_reduce_op = 0;
pub const GKRT_REDUCE_PROD: gkrt_reduce_op = 1;
pub const GKRT_REDUCE_MIN: gkrt_reduce_op = 2;
pub const GKRT_REDUCE_MAX: gkrt_reduce_op = 3;
/// The sum divided by the number of ranks (integers: truncated).
pub const GKRT_REDUCE_AVG: gkrt_reduce_op = 4;

/// Element type of a collective node.
pub type gkrt_dtype = u32;
pub const GKRT_DTYPE_F32: gkrt_dtype = 0;
pub const GKRT_DTYPE_F16: gkrt_dtype = 1;
pub const GKRT_DTYPE_BF16: gkrt_dtype = 2;
pub const GKRT_DTYPE_I32: gkrt_dtype = 3;
