//! Ordering work on a GPU: events between two streams, host work on the native stream, and a
//! captured graph replayed.

use super::*;

const SLOW_FILL_CUDA: &str = r#"
struct SlowFill { long long cycles; float value; unsigned int n; };
extern "C" __global__ void gkrt_test_slow_fill(float* out, SlowFill p) {
    const long long start = clock64();
    while (clock64() - start < p.cycles) { }
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += gridDim.x * blockDim.x) {
        out[i] = p.value;
    }
}
"#;

#[repr(C)]
struct SlowFill {
    cycles: i64,
    value: f32,
    n: u32,
}

/// The slow fill kernel, compiled.
fn slow_fill_kernel(d: &CudaDevice) -> FunctionId {
    let no_options: Vec<String> = Vec::new();
    d.load_function(
        ModuleSource::CudaSource {
            source: SLOW_FILL_CUDA,
            options: &no_options,
        },
        "gkrt_test_slow_fill",
    )
    .unwrap()
}

/// On `s1`: `start`, ~100 ms of spinning, `src` filled with `value`, `done`. On `s2`: a wait for
/// `done`, then `src` copied to `dst`. Returns what `s2` copied: `value` everywhere only if the
/// wait held `s2` back.
fn fill_on_one_stream_copy_on_another(
    d: &CudaDevice,
    f: FunctionId,
    (s1, s2): (StreamId, StreamId),
    (start, done): (EventId, EventId),
    (src, dst): (DevPtr, DevPtr),
    n: usize,
    value: f32,
) -> Vec<f32> {
    d.record_event(start, s1).unwrap();
    let p = SlowFill {
        cycles: 200_000_000,
        value,
        n: n as u32,
    };
    let dims = LaunchDims {
        grid: [1, 1, 1],
        block: [256, 1, 1],
        shared_mem_bytes: 0,
    };
    d.launch(f, &dims, &[buf(src, n)], bytes_of(&p), s1)
        .unwrap();
    d.record_event(done, s1).unwrap();
    d.stream_wait_event(s2, done).unwrap();
    d.copy_d2d_async(dst, src, (n * 4) as u64, s2).unwrap();
    download(d, s2, dst, n)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_events_order_two_streams() {
    let d = gpu();
    let (s1, s2) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    const N: usize = 1 << 16;
    let (src, dst) = (alloc_f32(&d, N), alloc_f32(&d, N));
    d.launch_builtin(BuiltinOp::Fill { value: 0.0 }, &[], &[buf(src, N)], s1)
        .unwrap();
    d.launch_builtin(BuiltinOp::Fill { value: -1.0 }, &[], &[buf(dst, N)], s2)
        .unwrap();
    d.stream_synchronize(s1).unwrap();
    d.stream_synchronize(s2).unwrap();

    let f = slow_fill_kernel(&d);
    let (start, done) = (d.create_event().unwrap(), d.create_event().unwrap());
    assert!(
        d.event_query(done).unwrap(),
        "a never-recorded event counts as complete"
    );

    // s1: ~100 ms of spinning, then src = 7. s2: waits for that, then copies src → dst.
    let got =
        fill_on_one_stream_copy_on_another(&d, f, (s1, s2), (start, done), (src, dst), N, 7.0);
    assert!(
        got.iter().all(|&v| v == 7.0),
        "s2 did not wait for the event: {:?}",
        &got[..4]
    );

    assert!(d.event_query(done).unwrap());
    d.event_synchronize(done).unwrap();
    let ms = d.event_elapsed_ms(start, done).unwrap();
    eprintln!("slow fill took {ms:.2} ms");
    assert!(ms > 1.0, "elapsed {ms} ms");

    d.destroy_event(start).unwrap();
    assert!(matches!(
        d.record_event(start, s1),
        Err(DeviceError::Invalid(_))
    ));
    d.destroy_event(done).unwrap();
    d.destroy_stream(s1).unwrap();
    d.destroy_stream(s2).unwrap();
    d.free_segment(src, 0).unwrap();
    d.free_segment(dst, 0).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_sync_events_order_two_streams_and_are_not_timed() {
    // The executor's copy events and marker (`create_sync_event`, CU_EVENT_DISABLE_TIMING):
    // a wait for one orders the streams as a timed event's does; timing it is refused.
    let d = gpu();
    let (s1, s2) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    const N: usize = 1 << 16;
    let (src, dst) = (alloc_f32(&d, N), alloc_f32(&d, N));
    d.launch_builtin(BuiltinOp::Fill { value: -1.0 }, &[], &[buf(dst, N)], s2)
        .unwrap();
    d.stream_synchronize(s2).unwrap();
    let f = slow_fill_kernel(&d);
    let (start, done) = (d.create_event().unwrap(), d.create_sync_event().unwrap());
    let got =
        fill_on_one_stream_copy_on_another(&d, f, (s1, s2), (start, done), (src, dst), N, 5.0);
    assert!(
        got.iter().all(|&v| v == 5.0),
        "s2 did not wait: {:?}",
        &got[..4]
    );
    assert!(d.event_query(done).unwrap());
    d.event_synchronize(done).unwrap();
    assert!(
        d.event_elapsed_ms(start, done).is_err(),
        "an untimed event was timed"
    );
    for e in [start, done] {
        d.destroy_event(e).unwrap();
    }
    d.destroy_stream(s1).unwrap();
    d.destroy_stream(s2).unwrap();
    d.free_segment(src, 0).unwrap();
    d.free_segment(dst, 0).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_host_work_gets_the_native_stream() {
    let d = gpu();
    let s = d.create_stream().unwrap();
    let native = d.native_stream(s).unwrap() as usize;
    const N: usize = 1000;
    let p = alloc_f32(&d, N);
    // The work enqueues device work itself on the stream it is given.
    d.enqueue_host_work(
        s,
        Box::new(move |stream| {
            assert_eq!(stream as usize, native);
            // SAFETY: p is a live N-float segment; stream is our live CUstream.
            let r =
                unsafe { sys::cuMemsetD32Async(p, 2.5f32.to_bits(), N, stream as sys::CUstream) };
            if r == CUresult::CUDA_SUCCESS {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        }),
    )
    .unwrap();
    assert!(download(&d, s, p, N).iter().all(|&v| v == 2.5));
    match d.enqueue_host_work(s, Box::new(|_| Err("boom".to_owned()))) {
        Err(DeviceError::Async(m)) => assert_eq!(m, "boom"),
        other => panic!("expected Async, got {other:?}"),
    }
    d.free_segment(p, 0).unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_capture_and_replay_a_graph() {
    let d = gpu();
    assert!(d.supports_capture());
    let s = d.create_stream().unwrap();
    const N: usize = 4099;
    let x = upload(&d, s, &vec![1.5f32; N]);
    let y = alloc_f32(&d, N);

    // Step: y = 2x; x = y + y  (x ×= 4 per replay).
    d.begin_capture(s).unwrap();
    d.launch_builtin(
        BuiltinOp::Scale { alpha: 2.0 },
        &[buf(x, N)],
        &[buf(y, N)],
        s,
    )
    .unwrap();
    d.launch_builtin(BuiltinOp::Add, &[buf(y, N), buf(y, N)], &[buf(x, N)], s)
        .unwrap();
    let g = d.end_capture(s).unwrap();
    assert!(
        download(&d, s, x, N).iter().all(|&v| v == 1.5),
        "capture must not run the work"
    );

    for _ in 0..3 {
        d.launch_graph(g, s).unwrap();
    }
    assert!(download(&d, s, x, N).iter().all(|&v| v == 96.0));
    d.destroy_graph(g).unwrap();
    assert!(matches!(d.launch_graph(g, s), Err(DeviceError::Invalid(_))));
    d.free_segment(x, 0).unwrap();
    d.free_segment(y, 0).unwrap();
}
