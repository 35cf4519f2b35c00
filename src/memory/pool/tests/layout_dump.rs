//! The layout of a virtual range printed block by block, with where its reserved bytes that hold
//! nothing lie: the replay's `GKRT_REPLAY_DUMP=K` (`replay.rs`), to see the holes a peak is made of.

use super::*;

/// Prints every block of each virtual range, low to high: offset, size, state and
/// how many of the pages it touches are mapped (the holes a peak is made of, and which of them a
/// chunk-sized move could give back), and for an allocated block the trace's events that
/// allocate and free it (`lives`, by address: which neighbour outlives which).
pub(super) fn dump_layout(
    p: &Pool,
    k: usize,
    bytes: u64,
    lives: &HashMap<u64, (usize, Option<usize>)>,
) {
    // Every range, the one holding the most mapped pages first (the trace's, not the warm-up
    // stream's); a stream's side range follows it.
    let mut ranges: Vec<u32> = p
        .streams
        .iter()
        .filter(|s| s.range != NIL)
        .map(|s| s.range)
        .collect();
    if ranges.is_empty() {
        println!("layout after event {k}: no virtual range");
        return;
    }
    ranges.sort_by_key(|&r| {
        std::cmp::Reverse(p.pages_of(r).count_mapped(0, p.segs[r].size / p.page))
    });
    let mib = |x: u64| x as f64 / MIB as f64;
    println!(
        "layout after event {k} (a request of {bytes} bytes): reserved {:.1} MiB, allocated {:.1} MiB",
        mib(p.stats().reserved_bytes),
        mib(p.stats().allocated_bytes)
    );
    for r in ranges {
        dump_range(p, r, lives);
    }
}

/// One range of `dump_layout`: its stream, its free mapped pages, then its blocks.
fn dump_range(p: &Pool, r: u32, lives: &HashMap<u64, (usize, Option<usize>)>) {
    let seg = &p.segs[r];
    let pages = p.pages_of(r);
    let mib = |x: u64| x as f64 / MIB as f64;
    let owner = &p.streams[p.blocks[seg.first].owner as usize];
    println!(
        "range of stream {}: {:.1} MiB mapped",
        owner.stream.0,
        mib(pages.count_mapped(0, seg.size / p.page) * p.page)
    );
    // Where the reserved bytes that hold nothing are: mapped pages wholly inside free blocks
    // (of those, in whole chunks, which recycling can move), and the rest (pages shared by a
    // free block and a live one: the rounding at block seams).
    let (mut free_interior, mut free_chunked) = (0u64, 0u64);
    let mut i = seg.first;
    while i != NIL {
        let b = &p.blocks[i];
        if b.state == State::Free {
            let (q0, q1) = p.interior(r, b.addr, b.size);
            if q0 < q1 {
                free_interior += pages.count_mapped(q0, q1);
                pages.each_chunk_down(q0, q1, |(_, n)| {
                    free_chunked += n;
                    true
                });
            }
        }
        i = b.next;
    }
    println!(
        "  mapped pages inside free blocks: {:.1} MiB, of them in whole chunks: {:.1} MiB",
        mib(free_interior * p.page),
        mib(free_chunked * p.page)
    );
    let mut i = seg.first;
    while i != NIL {
        let b = &p.blocks[i];
        let (p0, p1) = p.touched(r, b.addr, b.size);
        let life = match lives.get(&b.addr) {
            Some(&(born, freed)) if b.state == State::Allocated => {
                let freed = freed.map_or("never freed".to_string(), |f| format!("freed at {f}"));
                format!("  allocated at event {born}, {freed}")
            }
            _ => String::new(),
        };
        println!(
            "  {:>10.3} MiB  +{:>10.3} MiB  {:?}  mapped {} of pages [{p0}, {p1}){life}",
            mib(b.addr - seg.base),
            mib(b.size),
            b.state,
            pages.count_mapped(p0, p1)
        );
        i = b.next;
    }
}
