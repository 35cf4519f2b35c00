//! Every `GKRT_*` environment variable gkrt reads, read here and nowhere else: the layers below
//! the runtime take the values as configuration (`Config`, `PoolConfig`, a `CudaDevice` switch,
//! a graph's timeline path).
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `GKRT_DEVICE` | `auto`, `host` (`cpu`) or `cuda` (`gpu`): overrides `Config::device` of every runtime | the config's (`auto`) |
//! | `GKRT_POOL_VMM` | `1`/`0`: overrides `Config::pool_virtual_memory` (whether a pool grows by virtual-memory pages on every stream) | the config's (auto) |
//! | `GKRT_HOST_JITTER_US` | host backend: random delay (µs) before each queued item (`Config::host_jitter_us`) | the config's (0) |
//! | `GKRT_VMM` | `0` keeps a CUDA device from virtual-memory growth altogether (plain `cuMemAlloc` segments) | on where the device supports it |
//! | `GKRT_POOL_PAGE_MIB` | a pool's largest physical allocation in virtual mode (`PoolConfig::vmm_page_bytes`), MiB | 8 |
//! | `GKRT_POOL_SLACK_PERMILLE` | `PoolConfig::recycle_slack_permille` | 30 |
//! | `GKRT_POOL_RECYCLE_MIN_MIB` | `PoolConfig::recycle_min_bytes`, MiB | 2 |
//! | `GKRT_POOL_RECYCLE_TIME_PERMILLE` | `PoolConfig::recycle_time_permille` (share of wall time the slack rule's page moves may take) | 10 |
//! | `GKRT_POOL_RECYCLE_WAIT` | `PoolConfig::recycle_waits`, 0 or 1 | the config's (0; 1 for the PyTorch entry points' runtime) |
//! | `GKRT_POOL_STARTUP_MOVES` | `PoolConfig::startup_moves`, 0 or 1: slack-rule page moves free of the time budget until a range that moved pages so first empties, or until they have moved the high-water mark's bytes (an experiment knob: BENCHMARKS.md, session 25) | 0 |
//! | `GKRT_POOL_PEAK_MOVES` | `PoolConfig::peak_moves`, 0 or 1: a slack-rule page move for a request that raises the program's own peak of allocated bytes, or reaches it again, goes ahead without the time budget (and is not charged to it), up to moving that peak's bytes in all | 1 |
//! | `GKRT_POOL_PERIOD_PLANS` | `PoolConfig::period_plans`, 0 or 1: a loop that carries a block from turn to turn (a sampler's latents) is found as a period, and its turns follow a plan that keeps the carry in place | 1 |
//! | `GKRT_POOL_STEP_LIVED` | `PoolConfig::step_lived_low`, 0 or 1: a step that follows no plan places at the lowest free place of its range the allocations that, at the same positions in the last step over the same kept blocks, lived to that step's end (an encoder's masks and embedding output) | 1 |
//! | `GKRT_POOL_TIGHT_PEAKS` | `PoolConfig::tight_peaks`, 0 or 1: a request that raises the high-water mark of bytes in use moves free pages rather than map more than that mark (and a page) needs; the slack (`GKRT_POOL_SLACK_PERMILLE`) applies below the mark only | 1 |
//! | `GKRT_POOL_NEW_STEP_MOVES` | `PoolConfig::new_step_moves`, 0 or 1: a slack-rule page move in a step that raised the program's peak of allocated bytes (until the next step starts) goes ahead as a move at the peak does (`GKRT_POOL_PEAK_MOVES`) | 1 |
//! | `GKRT_POOL_PLAN_ROOM_PERMILLE` | `PoolConfig::plan_room_permille`: thousandths over the high-water mark of bytes in use up to which gathering an epoch plan's pages may map new ones where the slack rule's cap (`GKRT_POOL_SLACK_PERMILLE`) is lower; 0: that cap alone | 50 (0 under a memory limit) |
//! | `GKRT_POOL_OWN_STREAM_MOVES` | `PoolConfig::own_stream_moves`, 0 or 1: after the program's first step, a slack-rule page move or a plan's gathering takes pages only from its own stream's ranges and from empty ones, not from another stream's range in use | 1 (0 under a memory limit) |
//! | `GKRT_POOL_EMPTY_RANGE_MOVES` | `PoolConfig::empty_range_moves`, 0 or 1: a request within the slack rule's cap that would raise the most pages ever mapped takes the free pages left mapped in other streams' empty ranges (a warm-up's), and no other range's | 1 (0 under a memory limit) |
//! | `GKRT_POOL_PENDING_BEST_FIT` | `PoolConfig::pending_best_fit`, 0 or 1: an allocation takes a block pending on a copy-out that fits it more closely than any free block, the stream waiting for the copy (an experiment knob) | 0 |
//! | `GKRT_POOL_TAIL_PREFIX_FIRST` | `PoolConfig::tail_first`, 1: `TailFirst::Always`, every request of at most a page whose best fit is a warm free block at least twice its size takes the short mapped start of the range's last block instead (an experiment knob; 0 leaves the default) | 0 |
//! | `GKRT_POOL_SHORT_LIVED_TAIL` | `PoolConfig::tail_first`, 0 or 1 (1: `TailFirst::ShortLived`, over `GKRT_POOL_TAIL_PREFIX_FIRST`; 0: `TailFirst::Off`): as `GKRT_POOL_TAIL_PREFIX_FIRST`, only for requests whose size the pool has seen live fewer allocations than there are live blocks (placement by lifetime) | 1 |
//! | `GKRT_POOL_MAJORITY_MOVES` | `PoolConfig::recycle_majority_moves`, 0 or 1: a slack-rule page move that cannot keep mapping under the cap, when more than one physical allocation is over it, goes ahead only when it moves at least half of the pages over it (0: every such move is made) | 1 |
//! | `GKRT_POOL_ALIASES` | `PoolConfig::page_aliases`, 0, 1, 2 or 3: a page move keeps the moved physical allocation mapped at its old address too (an alias no block may use while it is live elsewhere), so moving it back is bookkeeping with no driver call; 2 also `PoolConfig::alias_moves_again` (pages a move placed may move again within the time budget); 3 also `PoolConfig::alias_again_until_undone` (moving again ends when a move is first undone at the cost of an unmap) | 0 |
//! | `GKRT_POOL_EPOCH_PLANS` | `PoolConfig::epoch_plans`, 0 or 1: a stream's range that returns to the same live blocks (none, or blocks kept for good) and fills again the same way is placed by an offline plan of the last time, around those blocks (`memory/pool/epochs.rs`) | 1 |
//! | `GKRT_POOL_RECYCLE_SPIN_US` | `PoolConfig::recycle_spin_ns`, µs | `PoolConfig::default()` |
//! | `GKRT_POOL_MARKER_EVERY` | `PoolConfig::marker_every` | `PoolConfig::default()` |
//! | `GKRT_POOL_MARKER_MIN_US` | `PoolConfig::marker_min_interval_ns`, µs | `PoolConfig::default()` |
//! | `GKRT_LOG_LEVEL` | the PyTorch entry points' runtime: 0 off … 5 trace | 2 (warnings) |
//! | `GKRT_MEMORY_LIMIT` | the PyTorch entry points' runtime: cap on the device memory its pool takes, bytes with an optional suffix `K`/`M`/`G`/`T` (powers of 1024, `KiB`…`TiB` too) or a fraction of the device's memory such as `0.9` | the device's memory |
//! | `GKRT_SWAP_TIMELINE` | a file to which every run of a swapping graph (or any dynamic-mode graph: the unconstrained baseline) appends its measured timeline (a diagnostic: such runs are timed with events) | none |
//! | `GKRT_SWAP_REFINE` | `0` keeps a swapping graph's tuned plan as the timed runs chose it among the policies' candidates; `1`: refined move by move on the timeline model (`plan::swap_refine`; an experiment knob, to compare both in one run) | 1 |
//! | `GKRT_SWAP_REFINE_SEARCH` | with `GKRT_SWAP_REFINE` on, `1`: the tuned plan is refined by a steepest-descent search on the timeline model (`plan::swap_search`: each round the best of every move, windows of alike tensors along the step, slacks, the budget, kept tensors held until the out-link idles; a move the pool's dry run rejects retried with finer slack), the greedy refinement run too and the shorter estimate kept; `0`: the greedy refinement alone (`plan::swap_refine`, before session 16). Read at the tuning | 1 |
//! | `GKRT_SWAP_BUDGET_PERMILLE` | thousandths of what the memory limit leaves a graph that its swap plans may use (1..1000; an experiment knob: the rest is headroom for the pool) | 1000 |
//! | `GKRT_SWAP_PLACEMENTS` | `1`: a swapping graph's runs take the ranges the plan's dry run placed each block in (`plan::swap_placements`), waiting for the copy-outs still reading them, and the timeline model charges those waits; `0`: the pool places every block. An experiment knob (slower on the H200: session 11, run 2). Read at finalize | 0 |
//! | `GKRT_SWAP_RELEASE` | `1`: once a swapping graph's plan is tuned, its candidates are fitted with each copy-out's block pending until the timeline model's end of the copy (`plan::swap_release`: steady runs of the pool's dry run that map no page and never wait for the device), and its runs give those blocks back at the same steps (the compute stream waiting for the copy), so the pool places every block where the dry run did; turns `GKRT_SWAP_PLACEMENTS` off. `0`: blocks stay pending until taken (the plan fitted with copy-outs' blocks free at once). On by default since session 12 (the H200: GPT-2 medium at ⅓ 1.186 and 1.202 of its unconstrained step against 1.328 and 1.301, small no worse, the swap chain's goals still met). Read at finalize | 1 |
//! | `GKRT_SWAP_RELEASE_ANY_FIT` | `1`: when the release schedule's refit (`GKRT_SWAP_RELEASE`) finds no plan of the default policy that fits with copy-outs' blocks pending, the other policies' plans that do fit are kept (`plan::swap_release::released_candidates`); `0`: every plan falls back to the fit with blocks free at once, as before (GPT-2 small at ⅓ on the H200: 411 page maps and 3 device waits a step). Read at the tuning | 1 |
//! | `GKRT_SWAP_PIN_SMALL` | `1`: a swapping graph's plans keep its persistent tensors of at most one pool page (the device's granularity, when the pool grows by pages) on the device all run, never evicted (`plan::swap::Policy::pin_below`), unless together they exceed a 64th of the budget: evicted and brought back, such blocks land wherever a hole's end is free and cut the large ranges (GPT-2 small at ⅓: no plan that keeps the embedding fitted with copy-outs' blocks pending); `0`: they come and go like the others (before session 14). Read at finalize and at the tuning | 1 |
//! | `GKRT_SWAP_TUNE_EMPTY` | `1`: when a swapping graph's plan is tuned with a release schedule (`GKRT_SWAP_RELEASE`), its tensors on the device go home first and the pool gives its free pages back, so the candidates are fitted to an empty pool, and the chosen plan's kept tensors come back in its canonical start's order: its runs then start as the fit's dry run starts. The first runs' pool (their plan moving pages) left kept blocks scattered; fitted around them, GPT-2 small at ⅓ found no plan between 0.74 and 0.81 of the limit, nor above, that maps no page (the H200: 98.7 ms estimated, 8 ms of it compute waiting for copies). `0`: fitted to the pool as the first runs left it, as before. Read at the tuning | 1 |
//! | `GKRT_SWAP_RELEASE_HOLD_MARKERS` | `1`: while a swapping graph's run follows a release schedule (`GKRT_SWAP_RELEASE`), its pool records and polls no marker event (`memory::pool::Pool::hold_markers`): the free pages it may move without waiting for the device are those its dry run counts so, not those the device has passed, and it makes the dry run's page moves. With markers, the first run of a tuned plan moved idle pages where the dry run waited for the device and took other victims, and the steady runs then mapped pages where the dry run mapped none (GPT-2 small at ⅓ on the H200: 135–193 maps and 1–2 device waits before the logits' gradient; `plan/pool_fidelity_tests.rs`). `0`: markers as in any run, as before. Read at finalize | 1 |
//! | `GKRT_SWAP_RELEASE_CLEAN_START` | `1`: when the tuning emptied the pool (`GKRT_SWAP_TUNE_EMPTY`), the release schedule's fits and dry run start the plan's first run with every tensor clean (`plan::swap_release::Releases::clean_start`), as the executor's starts: the kept tensors come back from the host with their host copies current, so a copy-out before the run writes the tensor leaves without a copy, its block free at once, where the model (every run a steady one) has it copied and pending; the dry run's first run then leaves the executor's layout (GPT-2 small at ⅓ on the H200 with the steady-start fit: 22 page maps and 2 device waits in a steady step). `0`: the first run fitted as a steady one, as before. Read at finalize | 1 |
//! | `GKRT_SWAP_PRUNE_LINKS` | `1`: a swap plan no longer rebuilds a chain link whose rebuild it fed moved to an earlier reader (`plan::swap::Policy::prune_moved_links`: GPT-2's attention scores rebuilt again for nothing after their softmax output was rebuilt earlier); `0`: the planner before session 13. Read at finalize and at the tuning | 1 |
//! | `GKRT_EXEC_ELIDE` | `1`: a graph's runs leave out the compute-stream records and waits the streams' order already implies (`exec/stream_order.rs`: the marker recorded again only after compute work, a copy stream waiting for a marker record once, a wait for a copy left out when a newer copy of the same stream was waited for, consecutive waits timed by one pair of events, a copy stream's wait for another copy left out when it waited for a newer one of that stream or an earlier run of the swapping graph made it, the tensors' copy events and the runtime's marker made without timing); `0`: one marker record per copy and one timed wait per event, every event timed, as before. Results are the same bits either way. Read at finalize (the marker: at the runtime's creation) | 1 |
//! | `GKRT_EXEC_TIME_STALLS` | `0`: a graph's runs queue the compute stream's waits on copies untimed, and the runtime's `copy_wait_ns` stays 0; `1`: each group of waits is timed by a pair of timing events and `copy_wait_ns` adds up the stalls. Timing costs the device: GPT-2 small at a third of its working set steps 2.5% slower timed (H200, session 16). With `GKRT_EXEC_ELIDE=0` the waits are timed whatever this says, as before. Results are the same bits either way. Read at finalize | 0 |
//! | `GKRT_EXEC_POLL_IN_ORDER` | `1`: a swapping graph's runs without a release schedule give back blocks pending on copy-outs by the executor's polling, oldest copy first, stopping at the first still running (`exec/poll.rs`; the pool holds its events); `0`: the pool polls every pending event before every allocation, as before. Read at finalize | 1 |
//!
//! The `GKRT_POOL_*` knobs (benchmark knobs) apply to every pool a runtime makes; values that do
//! not parse are ignored with a warning. `GKRT_DEVICE`, `GKRT_POOL_VMM` and `GKRT_HOST_JITTER_US`
//! that do not parse fail the runtime's creation. Every variable but `GKRT_SWAP_TIMELINE` (read
//! once per process) is read each time a runtime is made. Test-only knobs (`GKRT_TRACES`,
//! `GKRT_CUDA_POISON_TEST`, ...) are read by the tests that use them.

use super::config::{Config, DeviceChoice};
use crate::error::{Error, Result};
use crate::memory::pool::{PoolConfig, TailFirst};

const MIB: u64 = 1 << 20;

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `config` with `GKRT_DEVICE`, `GKRT_POOL_VMM` and `GKRT_HOST_JITTER_US` applied, so any program
/// can be pointed at either backend without recompiling.
pub(crate) fn config_overrides(mut config: Config) -> Result<Config> {
    if let Some(v) = var("GKRT_DEVICE") {
        config.device = match v.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => DeviceChoice::Auto,
            "host" | "cpu" => DeviceChoice::Host,
            "cuda" | "gpu" => DeviceChoice::Cuda,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "GKRT_DEVICE='{other}' is not one of auto, host, cuda"
                )))
            }
        };
    }
    if let Some(v) = var("GKRT_POOL_VMM") {
        config.pool_virtual_memory = match v.trim() {
            "1" => Some(true),
            "0" => Some(false),
            other => {
                return Err(Error::InvalidArgument(format!(
                    "GKRT_POOL_VMM='{other}' is not 0 or 1"
                )))
            }
        };
    }
    if let Some(v) = var("GKRT_HOST_JITTER_US") {
        config.host_jitter_us = v.trim().parse().map_err(|_| {
            Error::InvalidArgument(format!("GKRT_HOST_JITTER_US='{v}' is not a number"))
        })?;
    }
    Ok(config)
}

/// `pool` with the `GKRT_POOL_*` benchmark knobs applied; values that do not parse are ignored
/// with a warning.
pub(crate) fn pool_overrides(mut pool: PoolConfig) -> PoolConfig {
    let read = |name: &str| -> Option<u64> {
        let v = var(name)?;
        let n = v.trim().parse().ok();
        if n.is_none() {
            log::warn!("gkrt pool: ignoring {name}='{v}' (not a number)");
        }
        n
    };
    if let Some(m) = read("GKRT_POOL_PAGE_MIB") {
        pool.vmm_page_bytes = m.saturating_mul(MIB);
    }
    if let Some(p) = read("GKRT_POOL_SLACK_PERMILLE") {
        pool.recycle_slack_permille = p;
    }
    if let Some(m) = read("GKRT_POOL_RECYCLE_MIN_MIB") {
        pool.recycle_min_bytes = m.saturating_mul(MIB);
    }
    if let Some(p) = read("GKRT_POOL_RECYCLE_TIME_PERMILLE") {
        pool.recycle_time_permille = p;
    }
    if let Some(w) = read("GKRT_POOL_RECYCLE_WAIT") {
        pool.recycle_waits = w != 0;
    }
    if let Some(b) = read("GKRT_POOL_STARTUP_MOVES") {
        pool.startup_moves = b != 0;
    }
    if let Some(b) = read("GKRT_POOL_PEAK_MOVES") {
        pool.peak_moves = b != 0;
    }
    if let Some(b) = read("GKRT_POOL_PERIOD_PLANS") {
        pool.period_plans = b != 0;
    }
    if let Some(b) = read("GKRT_POOL_STEP_LIVED") {
        pool.step_lived_low = b != 0;
    }
    if let Some(b) = read("GKRT_POOL_TIGHT_PEAKS") {
        pool.tight_peaks = b != 0;
    }
    if let Some(b) = read("GKRT_POOL_NEW_STEP_MOVES") {
        pool.new_step_moves = b != 0;
    }
    if let Some(p) = read("GKRT_POOL_PLAN_ROOM_PERMILLE") {
        pool.plan_room_permille = p;
    }
    if let Some(b) = read("GKRT_POOL_OWN_STREAM_MOVES") {
        pool.own_stream_moves = b != 0;
    }
    if let Some(b) = read("GKRT_POOL_EMPTY_RANGE_MOVES") {
        pool.empty_range_moves = b != 0;
    }
    if let Some(b) = read("GKRT_POOL_PENDING_BEST_FIT") {
        pool.pending_best_fit = b != 0;
    }
    // Short-lived requests at the tail are the default: 0 turns them off, and 1 for every
    // request (`TAIL_PREFIX_FIRST`) replaces them; its 0 leaves the default.
    if let Some(b) = read("GKRT_POOL_TAIL_PREFIX_FIRST") {
        if b != 0 {
            pool.tail_first = TailFirst::Always;
        }
    }
    if let Some(b) = read("GKRT_POOL_SHORT_LIVED_TAIL") {
        if b != 0 {
            pool.tail_first = TailFirst::ShortLived;
        } else if pool.tail_first == TailFirst::ShortLived {
            pool.tail_first = TailFirst::Off;
        }
    }
    if let Some(b) = read("GKRT_POOL_MAJORITY_MOVES") {
        pool.recycle_majority_moves = b != 0;
    }
    if let Some(b) = read("GKRT_POOL_ALIASES") {
        pool.page_aliases = b != 0;
        pool.alias_moves_again = b >= 2;
        pool.alias_again_until_undone = b >= 3;
    }
    if let Some(b) = read("GKRT_POOL_EPOCH_PLANS") {
        pool.epoch_plans = b != 0;
    }
    if let Some(us) = read("GKRT_POOL_RECYCLE_SPIN_US") {
        pool.recycle_spin_ns = us.saturating_mul(1000);
    }
    if let Some(n) = read("GKRT_POOL_MARKER_EVERY") {
        pool.marker_every = n.clamp(1, u32::MAX as u64) as u32;
    }
    if let Some(us) = read("GKRT_POOL_MARKER_MIN_US") {
        pool.marker_min_interval_ns = us.saturating_mul(1000);
    }
    pool
}

/// `GKRT_VMM`: false when `0` turns a CUDA device's virtual-memory growth off.
pub(crate) fn device_virtual_memory() -> bool {
    var("GKRT_VMM").is_none_or(|v| v.trim() != "0")
}

/// `GKRT_LOG_LEVEL` (0..5) for the process-wide runtime; 2 when unset.
pub(crate) fn log_level() -> std::result::Result<u32, String> {
    match var("GKRT_LOG_LEVEL") {
        Some(v) => v
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&l| l <= 5)
            .ok_or_else(|| format!("GKRT_LOG_LEVEL='{v}' is not a level 0..5")),
        None => Ok(2),
    }
}

/// `GKRT_MEMORY_LIMIT`, unparsed (`process::parse_limit` reads it once the device is known).
pub(crate) fn memory_limit() -> Option<String> {
    var("GKRT_MEMORY_LIMIT")
}

/// `GKRT_SWAP_PLACEMENTS`: whether a swapping graph's runs take the ranges the pool's dry run
/// placed their blocks in (default off: on the H200 the waits for copy-outs still reading those
/// ranges cost more than the page moves they save; `1` turns it on, other values are ignored with
/// a warning).
pub(crate) fn swap_placements() -> bool {
    let Some(v) = var("GKRT_SWAP_PLACEMENTS") else {
        return false;
    };
    match v.trim() {
        "1" => true,
        "0" => false,
        _ => {
            log::warn!("ignoring GKRT_SWAP_PLACEMENTS='{v}' (not 0 or 1)");
            false
        }
    }
}

/// `GKRT_SWAP_RELEASE`: whether a swapping graph's tuned plan is fitted and run with its
/// copy-outs' blocks given back at the model's copy ends (`plan::swap_release`); on unless `0`
/// (anything else but `1` is ignored with a warning).
pub(crate) fn swap_release() -> bool {
    match var("GKRT_SWAP_RELEASE").as_deref().map(str::trim) {
        None | Some("1") => true,
        Some("0") => false,
        Some(v) => {
            log::warn!("ignoring GKRT_SWAP_RELEASE='{v}' (not 0 or 1)");
            true
        }
    }
}

/// A `0`/`1` variable, `default` when unset (anything else is ignored with a warning).
fn flag(name: &str, default: bool) -> bool {
    match var(name).as_deref().map(str::trim) {
        None => default,
        Some("1") => true,
        Some("0") => false,
        Some(v) => {
            log::warn!("ignoring {name}='{v}' (not 0 or 1)");
            default
        }
    }
}

/// `GKRT_EXEC_TIME_STALLS`: whether a graph's runs time the compute stream's waits on copies
/// with a pair of timing events (the runtime's `copy_wait_ns`). Off by default: the timing
/// records cost the device more than the waits they measure.
pub(crate) fn exec_time_stalls() -> bool {
    flag("GKRT_EXEC_TIME_STALLS", false)
}

/// `GKRT_EXEC_ELIDE`: whether a graph's runs leave out the compute-stream records and waits the
/// streams' order implies (`exec/stream_order.rs`); on unless `0`.
pub(crate) fn exec_elide() -> bool {
    flag("GKRT_EXEC_ELIDE", true)
}

/// `GKRT_SWAP_PRUNE_LINKS`: whether swap plans leave out the chain links a moved rebuild no
/// longer needs (`plan::swap::Policy::prune_moved_links`); on unless `0`.
pub(crate) fn swap_prune_links() -> bool {
    flag("GKRT_SWAP_PRUNE_LINKS", true)
}

/// `GKRT_SWAP_RELEASE_ANY_FIT`: whether a release-schedule refit whose default policy's plan
/// does not fit with blocks pending keeps the other candidates that do
/// (`plan::swap_release::released_candidates`); on unless `0` (the plain fit kept, as before).
pub(crate) fn swap_release_any_fit() -> bool {
    flag("GKRT_SWAP_RELEASE_ANY_FIT", true)
}

/// `GKRT_SWAP_PIN_SMALL`: whether swap plans keep persistent tensors of at most the pool's page
/// on the device all run (`plan::swap::Policy::pin_below`); on unless `0`.
pub(crate) fn swap_pin_small() -> bool {
    flag("GKRT_SWAP_PIN_SMALL", true)
}

/// `GKRT_SWAP_TUNE_EMPTY`: whether a swapping graph's tuning with a release schedule empties
/// the pool of the graph's blocks and free pages before fitting its candidates; on unless `0`.
pub(crate) fn swap_tune_empty() -> bool {
    flag("GKRT_SWAP_TUNE_EMPTY", true)
}

/// `GKRT_SWAP_RELEASE_HOLD_MARKERS`: whether the pool records and polls no marker event while
/// a run follows a release schedule (`memory::pool::Pool::hold_markers`); on unless `0`.
pub(crate) fn swap_release_hold_markers() -> bool {
    flag("GKRT_SWAP_RELEASE_HOLD_MARKERS", true)
}

/// `GKRT_SWAP_RELEASE_CLEAN_START`: whether, after the tuning emptied the pool, the released
/// fits' first run starts with every tensor clean (`plan::swap_release::Releases::clean_start`);
/// on unless `0`.
pub(crate) fn swap_release_clean_start() -> bool {
    flag("GKRT_SWAP_RELEASE_CLEAN_START", true)
}

/// `GKRT_EXEC_POLL_IN_ORDER`: whether a swapping graph's runs without a release schedule poll
/// the copies' events oldest first in the executor (`exec/poll.rs`); on unless `0`.
pub(crate) fn exec_poll_in_order() -> bool {
    flag("GKRT_EXEC_POLL_IN_ORDER", true)
}

/// `GKRT_SWAP_REFINE`: whether a swapping graph's tuned plan is refined (`plan::swap_refine`);
/// on unless `0` (anything else but `1` is ignored with a warning).
pub(crate) fn swap_refine() -> bool {
    match var("GKRT_SWAP_REFINE").as_deref().map(str::trim) {
        None | Some("1") => true,
        Some("0") => false,
        Some(v) => {
            log::warn!("ignoring GKRT_SWAP_REFINE='{v}' (not 0 or 1)");
            true
        }
    }
}

/// `GKRT_SWAP_REFINE_SEARCH`: whether the refinement is `plan::swap_search`'s steepest descent
/// beside `plan::swap_refine`'s greedy one, the better kept (else the greedy one alone); on
/// unless `0`.
pub(crate) fn swap_refine_search() -> bool {
    flag("GKRT_SWAP_REFINE_SEARCH", true)
}

/// `GKRT_SWAP_BUDGET_PERMILLE`: the thousandths (1..=1000) of what the memory limit leaves a
/// graph that its swap plans are fitted to; 1000 when unset, and when it does not parse or is out
/// of range (with a warning).
pub(crate) fn swap_budget_permille() -> u64 {
    let Some(v) = var("GKRT_SWAP_BUDGET_PERMILLE") else {
        return 1000;
    };
    match v.trim().parse::<u64>() {
        Ok(p) if (1..=1000).contains(&p) => p,
        _ => {
            log::warn!("ignoring GKRT_SWAP_BUDGET_PERMILLE='{v}' (not a number 1..1000)");
            1000
        }
    }
}

/// `GKRT_SWAP_TIMELINE`, read once per process: a file to which every run of a swapping graph
/// (or of a dynamic-mode one: the unconstrained baseline) appends its measured timeline (each such run is then timed with events: a diagnostic, not for
/// production).
pub(crate) fn swap_timeline() -> Option<&'static str> {
    static PATH: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    PATH.get_or_init(|| var("GKRT_SWAP_TIMELINE").filter(|p| !p.is_empty()))
        .as_deref()
}

#[cfg(test)]
mod tests {
    /// Every variable this file reads is documented for users: in the README's table and in the
    /// header's list.
    #[test]
    fn every_variable_is_documented_in_the_readme_and_the_header() {
        let source = include_str!("env.rs");
        let code = &source[..source.find("#[cfg(test)]").unwrap()];
        let readme = include_str!("../../README.md");
        let header = include_str!("../../include/gkrt.h");
        // Every string literal that is a whole variable name: "GKRT_" and capitals up to '"'.
        let mut names: Vec<&str> = code
            .match_indices("\"GKRT_")
            .filter_map(|(i, _)| {
                let rest = &code[i + 1..];
                let end = rest.find(|c: char| !(c.is_ascii_uppercase() || c == '_'))?;
                (rest[end..].starts_with('"') && end > "GKRT_".len()).then(|| &rest[..end])
            })
            .collect();
        names.sort_unstable();
        names.dedup();
        assert!(names.len() >= 10, "{names:?}");
        for name in names {
            assert!(
                readme.contains(&format!("`{name}`")),
                "{name} is not in README.md's table"
            );
            assert!(header.contains(name), "{name} is not in include/gkrt.h");
        }
    }
}
