//! One physical allocation mapped at two addresses (`VirtualMemory::map_alias`, what the pool's
//! page aliases use: `memory/pool/alias.rs`), and the pool with aliases on replaying a recorded
//! training trace with every block's bytes checked before it is freed. (The pool lives above the
//! device layer; its GPU check is here, with the backend's other GPU tests.)

use super::*;
use crate::memory::pool::{Pool, PoolConfig};
use crate::memory::DeviceBacking;

fn write_words(d: &CudaDevice, s: StreamId, at: DevPtr, words: &[u64]) {
    // SAFETY: `words` outlives the copy (synchronised below).
    unsafe { d.copy_h2d_async(at, words.as_ptr() as *const u8, words.len() as u64 * 8, s) }
        .unwrap();
    d.stream_synchronize(s).unwrap();
}

fn read_words(d: &CudaDevice, s: StreamId, at: DevPtr, n: usize) -> Vec<u64> {
    let mut v = vec![0u64; n];
    // SAFETY: `v` outlives the copy (synchronised below).
    unsafe { d.copy_d2h_async(v.as_mut_ptr() as *mut u8, at, n as u64 * 8, s) }.unwrap();
    d.stream_synchronize(s).unwrap();
    v
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_one_allocation_at_two_addresses_shows_the_same_bytes() {
    let d = gpu();
    let vm = d.virtual_memory().expect("a device with virtual memory");
    assert!(vm.supports_aliases());
    let g = vm.granularity();
    let s = d.create_stream().unwrap();
    let base = vm.reserve(4 * g).unwrap();
    vm.map(base, g, 1).unwrap();
    let alias = base + 2 * g;
    vm.map_alias(alias, base, g).unwrap();
    assert_eq!(d.vmm_handle_counts(), (2, 0, 1));
    // The whole page written through one address reads back through the other, both ways.
    let n = (g / 8) as usize;
    let data: Vec<u64> = (0..n as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    write_words(&d, s, base, &data);
    assert!(
        read_words(&d, s, alias, n) == data,
        "alias does not see the bytes"
    );
    write_words(&d, s, alias + 4096, &[7, 8, 9]);
    assert_eq!(read_words(&d, s, base + 4096, 3), vec![7, 8, 9]);
    // Unmapping the first address leaves the memory at the second: not a spare yet.
    vm.unmap(base, g, 1).unwrap();
    assert_eq!(d.vmm_handle_counts(), (1, 0, 0));
    assert_eq!(read_words(&d, s, alias + 4096, 3), vec![7, 8, 9]);
    assert_eq!(read_words(&d, s, alias, 2), data[..2].to_vec());
    // An alias of nothing, or over a mapped address, is refused with a message.
    let err = vm.map_alias(base, base + g, g).unwrap_err();
    assert!(err.to_string().contains("nothing mapped"), "{err}");
    let err = vm.map_alias(alias, alias, g).unwrap_err();
    assert!(err.to_string().contains("already mapped"), "{err}");
    // Its last address gone, the allocation is a spare until trimmed: freed once.
    vm.unmap(alias, g, 1).unwrap();
    assert_eq!(d.vmm_handle_counts(), (0, 1, 0));
    vm.trim().unwrap();
    assert_eq!(d.vmm_handle_counts(), (0, 0, 0));
    vm.unreserve(base, 4 * g).unwrap();
    d.destroy_stream(s).unwrap();
}

/// The recorded trace (`benches/traces/bert_train`: the repository root when run by
/// `scripts/gpu/run.sh tests`, else this crate's) as (id, bytes or None for a free, stream).
fn load_bert() -> Vec<(u32, Option<u64>, u32)> {
    let rel = "benches/traces/bert_train.trace.gz";
    let path = if std::path::Path::new(rel).exists() {
        rel.to_string()
    } else {
        format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"))
    };
    let raw = std::process::Command::new("gzip")
        .args(["-dcf", &path])
        .output()
        .expect("gzip runs");
    assert!(raw.status.success(), "reading {path}");
    let text = String::from_utf8(raw.stdout).expect("utf-8 trace");
    let mut ids = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w[0] == "a" {
            let n = out.len() as u32;
            ids.insert(w[1].to_string(), n);
            let stream = w.get(3).map_or(0, |s| s.parse().unwrap());
            out.push((n, Some(w[2].parse().unwrap()), stream));
        } else if let Some(n) = ids.remove(w[1]) {
            out.push((n, None, 0));
        }
    }
    out
}

/// The words a block's check writes: its first and last, and one at every 2 MiB edge inside.
fn points(addr: u64, size: u64) -> Vec<u64> {
    const EDGE: u64 = 2 << 20;
    let mut v = vec![addr];
    v.extend((addr / EDGE + 1..(addr + size).div_ceil(EDGE)).map(|k| k * EDGE));
    v.push(addr + size - 8);
    v
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_pool_with_aliases_replays_a_training_trace_keeping_every_blocks_bytes() {
    let d = gpu();
    let backing = DeviceBacking(&d);
    // Moves unlimited, so that the passes after the first move pages back and forth: with
    // aliases they go back to their shadows where the device is seen past their frees.
    let mut p = Pool::new(PoolConfig {
        page_aliases: true,
        alias_moves_again: true,
        recycle_time_permille: 1000,
        ..PoolConfig::default()
    });
    let evs = load_bert();
    let mut streams = std::collections::HashMap::new();
    let mut live: std::collections::HashMap<u32, (u64, u64, StreamId)> = Default::default();
    let mut checked = 0u64;
    for pass in 0..3u64 {
        for &(id, bytes, s) in &evs {
            match bytes {
                Some(n) => {
                    let st = *streams
                        .entry(s)
                        .or_insert_with(|| d.create_stream().unwrap());
                    let addr = p.alloc(&backing, n, st).unwrap();
                    let size = p.block_size(addr).unwrap();
                    for (k, x) in points(addr, size).into_iter().enumerate() {
                        let stamp = (pass << 56) ^ ((id as u64) << 20) ^ k as u64;
                        write_words(&d, st, x, &[stamp]);
                    }
                    live.insert(id, (addr, size, st));
                }
                None => {
                    let (addr, size, st) = live.remove(&id).unwrap();
                    for (k, x) in points(addr, size).into_iter().enumerate() {
                        let stamp = (pass << 56) ^ ((id as u64) << 20) ^ k as u64;
                        assert_eq!(
                            read_words(&d, st, x, 1)[0],
                            stamp,
                            "pass {pass}: block {id} at {addr:#x}, word {k} changed"
                        );
                        checked += 1;
                    }
                    p.free(&backing, addr).unwrap();
                }
            }
        }
        for (_, (addr, _, _)) in live.drain() {
            p.free(&backing, addr).unwrap();
        }
        p.validate().unwrap();
    }
    let (switched, aliased) = p.alias_counts();
    eprintln!("{checked} words checked; {switched} chunks switched back, {aliased} aliased");
    // Chunks moved as aliases in every pass; how many went back to a shadow is printed (it
    // depends on when the device is seen past their frees).
    assert!(aliased > 0, "the replay moved no chunk");
    p.release_cached(&backing).unwrap();
    assert_eq!(p.stats().reserved_bytes, 0);
    p.release_all(&backing).unwrap();
    // Every address unmapped, every allocation released once.
    assert_eq!(d.vmm_handle_counts(), (0, 0, 0));
    for (_, s) in streams {
        d.destroy_stream(s).unwrap();
    }
}
