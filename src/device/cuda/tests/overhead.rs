//! What the device wrapper adds to a raw launch and to an event record and wait (printed, not
//! checked).

use super::*;

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_hot_path_overhead() {
    // Not a pass/fail test: prints what the wrapper adds to a raw cuLaunchKernel / cuEventRecord.
    let d = gpu();
    let s = d.create_stream().unwrap();
    const N: usize = 256;
    const ITERS: u32 = 20_000;
    let (a, o) = (alloc_f32(&d, N), alloc_f32(&d, N));
    let (ins, outs) = ([buf(a, N), buf(a, N)], [buf(o, N)]);
    d.launch_builtin(BuiltinOp::Add, &ins, &outs, s).unwrap();
    d.stream_synchronize(s).unwrap();

    let t = std::time::Instant::now();
    for _ in 0..ITERS {
        d.launch_builtin(BuiltinOp::Add, &ins, &outs, s).unwrap();
    }
    let ours = t.elapsed() / ITERS;
    d.stream_synchronize(s).unwrap();

    let f = d.builtins().unwrap().add;
    let raw_stream = d.streams.get(s.0).unwrap().0;
    let n = N as u64;
    let t = std::time::Instant::now();
    for _ in 0..ITERS {
        let mut args = kernel_args!(o, a, a, n);
        // SAFETY: gkrt_add's signature; live stream.
        unsafe { cu_launch(f, [1, 1, 1], [256, 1, 1], 0, raw_stream, &mut args) }.unwrap();
    }
    let raw = t.elapsed() / ITERS;
    d.stream_synchronize(s).unwrap();

    let e = d.create_event().unwrap();
    let t = std::time::Instant::now();
    for _ in 0..ITERS {
        d.record_event(e, s).unwrap();
        d.stream_wait_event(s, e).unwrap();
    }
    let rec_wait = t.elapsed() / ITERS;
    d.stream_synchronize(s).unwrap();
    eprintln!("launch_builtin(Add): {ours:?}/launch, raw cuLaunchKernel: {raw:?}; record+wait: {rec_wait:?}");
    d.free_segment(a, 0).unwrap();
    d.free_segment(o, 0).unwrap();
}
