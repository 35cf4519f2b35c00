//! A kernel fault surfaces as a driver error at the next synchronization. It poisons the
//! (process-wide) primary context, so it lives apart and only does something when run alone.

use super::*;

#[test]
#[ignore = "needs a CUDA GPU; poisons the context: run alone with GKRT_CUDA_POISON_TEST=1"]
fn gpu_alone_kernel_fault_surfaces_at_sync() {
    if std::env::var_os("GKRT_CUDA_POISON_TEST").is_none() {
        eprintln!("skipped: set GKRT_CUDA_POISON_TEST=1 and run this test alone");
        return;
    }
    let d = gpu();
    let s = d.create_stream().unwrap();
    let no_options: Vec<String> = Vec::new();
    let src = r#"extern "C" __global__ void gkrt_test_fault(float* p) { p[threadIdx.x] = 1.0f; }"#;
    let f = d
        .load_function(
            ModuleSource::CudaSource {
                source: src,
                options: &no_options,
            },
            "gkrt_test_fault",
        )
        .unwrap();
    let dims = LaunchDims {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_mem_bytes: 0,
    };
    d.launch(
        f,
        &dims,
        &[Buffer {
            ptr: 0x10,
            bytes: 128,
        }],
        &[],
        s,
    )
    .unwrap();
    match d.stream_synchronize(s) {
        Err(DeviceError::Driver {
            call,
            name,
            message,
        }) => {
            eprintln!("{call}: {name} ({message})");
            assert_eq!(call, "cuStreamSynchronize");
            assert!(name.starts_with("CUDA_ERROR_"), "{name}");
        }
        other => panic!("expected a Driver error, got {other:?}"),
    }
}
