//! Device memory on a GPU: segments (aligned, and an impossible one refused as out of memory),
//! pinned and pageable host memory, and copies between them in every direction.

use super::*;

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_properties_alloc_and_copy_round_trip() {
    let d = gpu();
    assert_eq!(d.kind(), DeviceKind::Cuda);
    assert!(!d.name().is_empty());
    assert!(d.total_memory() > 0);
    eprintln!("{d:?}");
    let s = d.create_stream().unwrap();

    for bytes in [1u64, 4, 513, (1 << 20) + 3] {
        let p = d.alloc_segment(bytes).unwrap();
        assert_eq!(p % 512, 0, "segment of {bytes} bytes not 512-aligned");
        d.free_segment(p, bytes).unwrap();
    }

    const N: usize = (1 << 20) + 77;
    let h1 = d.alloc_pinned(N as u64).unwrap();
    let h2 = d.alloc_pinned(N as u64).unwrap();
    // SAFETY: N-byte pinned blocks we own.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts_mut(h1, N),
            std::slice::from_raw_parts_mut(h2, N),
        )
    };
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 7 + i / 251) as u8;
    }
    dst.fill(0);
    let d1 = d.alloc_segment(N as u64).unwrap();
    let d2 = d.alloc_segment(N as u64).unwrap();
    unsafe { d.copy_h2d_async(d1, h1, N as u64, s).unwrap() };
    d.copy_d2d_async(d2, d1, N as u64, s).unwrap();
    unsafe { d.copy_d2h_async(h2, d2, N as u64, s).unwrap() };
    d.stream_synchronize(s).unwrap();
    assert!(src == dst, "pinned round trip differs");

    // Pageable host memory, and the device used from another thread.
    let pageable: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let s2 = d.create_stream().unwrap();
            unsafe { d.copy_h2d_async(d1, pageable.as_ptr(), 4096, s2) }.unwrap();
            let mut back = vec![0u8; 4096];
            unsafe { d.copy_d2h_async(back.as_mut_ptr(), d1, 4096, s2) }.unwrap();
            d.stream_synchronize(s2).unwrap();
            assert_eq!(back, pageable);
            d.destroy_stream(s2).unwrap();
        });
    });

    d.free_segment(d1, N as u64).unwrap();
    d.free_segment(d2, N as u64).unwrap();
    unsafe { d.free_pinned(h1, N as u64).unwrap() };
    unsafe { d.free_pinned(h2, N as u64).unwrap() };

    assert!(matches!(
        d.copy_d2d_async(8, 8, 4, StreamId(9999)),
        Err(DeviceError::Invalid(_))
    ));
    d.destroy_stream(s).unwrap();
    assert!(matches!(
        d.stream_synchronize(s),
        Err(DeviceError::Invalid(_))
    ));
}

#[test]
#[ignore = "needs a CUDA GPU; fails a driver call on purpose"]
fn gpu_neg_oversized_segment_is_out_of_memory() {
    let d = gpu();
    match d.alloc_segment(1 << 50) {
        Err(DeviceError::OutOfMemory { requested, .. }) => assert_eq!(requested, 1 << 50),
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}
