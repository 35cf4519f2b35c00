//! Pending-aware dry runs (`Pool::dry_run_pending`): a block freed pending on a copy stays out of
//! reach until the copy is completed, and an allocation that finds no free memory takes pending
//! blocks as the executor does.

use super::*;
use crate::memory::pool::PendingTakes;

/// The addresses each `Alloc` step got.
fn placed(p: &Pool, steps: &[DryRunStep]) -> (Vec<Option<u64>>, PendingTakes) {
    let mut at = vec![None; steps.len()];
    let (_, takes) = p
        .dry_run_pending(steps, |i, _, addr, _| at[i] = addr)
        .expect("the steps succeed");
    (at, takes)
}

#[test]
fn a_block_pending_on_a_copy_is_reused_only_after_the_copy_completes() {
    let p = pool();
    let before = p.stats();
    let alloc = DryRunStep::Alloc {
        bytes: MIB,
        stream: st(0),
    };
    let free_now = [
        alloc,
        alloc, // keeps the first block from coalescing with the rest
        DryRunStep::Free { step: 0 },
        alloc,
    ];
    let (at, _) = placed(&p, &free_now);
    assert_eq!(at[3], at[0], "a block freed at once is reused at once");

    let pending = [
        alloc,
        alloc,
        DryRunStep::FreePending { step: 0, copy: 3 },
        alloc,
        DryRunStep::Complete { copy: 3 },
        alloc,
    ];
    let (at, takes) = placed(&p, &pending);
    assert_ne!(
        at[3], at[0],
        "placed in the range its copy is still reading"
    );
    assert_eq!(at[5], at[0], "free once its copy completed");
    assert_eq!(takes, PendingTakes::default());
    // Another copy's completion frees nothing.
    let other = [
        alloc,
        alloc,
        DryRunStep::FreePending { step: 0, copy: 3 },
        DryRunStep::Complete { copy: 4 },
        alloc,
        DryRunStep::CompleteAll,
        alloc,
    ];
    let (at, _) = placed(&p, &other);
    assert_ne!(at[4], at[0]);
    assert_eq!(at[6], at[0], "every copy has ended");
    // The real pool is untouched.
    assert_eq!(p.stats().allocated_bytes, before.allocated_bytes);
    check(&p);
}

#[test]
fn under_the_limit_an_allocation_takes_a_pending_block_as_the_executor_does() {
    // Room for the two blocks only: the third allocation takes the first one's pending block
    // (a close fit) where a plain dry run would have found it free.
    let alloc = DryRunStep::Alloc {
        bytes: MIB,
        stream: st(0),
    };
    let probe = pool();
    let (at, _) = placed(&probe, &[alloc, alloc]);
    let stats = probe.dry_run(&[alloc, alloc]).unwrap();
    let p = limited(stats.reserved_bytes);
    let (again, _) = placed(&p, &[alloc, alloc]);
    assert_eq!(again, at);
    let steps = [
        alloc,
        alloc,
        DryRunStep::FreePending { step: 0, copy: 1 },
        alloc,
    ];
    let (at, takes) = placed(&p, &steps);
    assert_eq!(at[3], at[0]);
    assert_eq!(takes, PendingTakes { one: 1, all: 0 });
    // Two pending blocks and a request neither holds alone: every one is taken back.
    let steps = [
        alloc,
        alloc,
        DryRunStep::FreePending { step: 0, copy: 1 },
        DryRunStep::FreePending { step: 1, copy: 2 },
        DryRunStep::Alloc {
            bytes: 2 * MIB,
            stream: st(0),
        },
    ];
    let (_, takes) = p
        .dry_run_pending(&steps, |_, _, _, _| {})
        .expect("the freed pair holds it");
    assert_eq!(takes, PendingTakes { one: 0, all: 1 });
    check(&p);
}
