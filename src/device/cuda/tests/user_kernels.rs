//! Kernels the user brings, as PTX or CUDA source (NVRTC): launched with a params blob, cached,
//! their signatures known; bad code and missing kernels are compile errors that leave the device
//! usable.

use super::*;

/// out[i] = in[i] * p.a + p.b (two roundings), i < p.n; params struct {float a; float b; u32 n}.
pub(super) const AXPB_PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry gkrt_test_axpb(
    .param .u64 out_param,
    .param .u64 in_param,
    .param .align 4 .b8 p_param[12]
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .f32   %f<5>;
    .reg .b64   %rd<8>;

    ld.param.u64    %rd1, [out_param];
    ld.param.u64    %rd2, [in_param];
    ld.param.f32    %f1, [p_param];
    ld.param.f32    %f2, [p_param+4];
    ld.param.u32    %r1, [p_param+8];
    mov.u32         %r2, %ctaid.x;
    mov.u32         %r3, %ntid.x;
    mov.u32         %r4, %tid.x;
    mad.lo.s32      %r5, %r2, %r3, %r4;
    setp.ge.u32     %p1, %r5, %r1;
    @%p1 bra        DONE;
    cvta.to.global.u64  %rd3, %rd2;
    cvta.to.global.u64  %rd4, %rd1;
    mul.wide.u32    %rd5, %r5, 4;
    add.s64         %rd6, %rd3, %rd5;
    ld.global.f32   %f3, [%rd6];
    mul.rn.f32      %f4, %f3, %f1;
    add.rn.f32      %f4, %f4, %f2;
    add.s64         %rd7, %rd4, %rd5;
    st.global.f32   [%rd7], %f4;
DONE:
    ret;
}
"#;

const AXPB_CUDA: &str = r#"
#ifndef GKRT_TEST_OPTION
#error "the options were not passed to NVRTC"
#endif
struct Axpb { float a; float b; unsigned int n; };
extern "C" __global__ void gkrt_test_axpb(float* out, const float* in, Axpb p) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) out[i] = __fadd_rn(__fmul_rn(in[i], p.a), p.b);
}
"#;

#[repr(C)]
struct Axpb {
    a: f32,
    b: f32,
    n: u32,
}

fn run_axpb(d: &CudaDevice, f: FunctionId, s: StreamId, x: &[f32], p: &Axpb) -> Vec<f32> {
    let n = x.len();
    let (px, po) = (upload(d, s, x), alloc_f32(d, n));
    let dims = LaunchDims {
        grid: [(n as u32).div_ceil(128), 1, 1],
        block: [128, 1, 1],
        shared_mem_bytes: 0,
    };
    d.launch(f, &dims, &[buf(po, n), buf(px, n)], bytes_of(p), s)
        .unwrap();
    let got = download(d, s, po, n);
    d.free_segment(px, 0).unwrap();
    d.free_segment(po, 0).unwrap();
    got
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_ptx_and_cuda_source_kernels_with_params_blob() {
    let d = gpu();
    let s = d.create_stream().unwrap();
    let x = values(10_001, 5);
    let p = Axpb {
        a: 1.7,
        b: -0.3,
        n: x.len() as u32,
    };
    let want: Vec<f32> = x.iter().map(|&v| v * p.a + p.b).collect();

    let f_ptx = d
        .load_function(ModuleSource::Ptx(AXPB_PTX), "gkrt_test_axpb")
        .unwrap();
    assert_bits_eq(&run_axpb(&d, f_ptx, s, &x, &p), &want, "PTX kernel");

    let options = vec!["-DGKRT_TEST_OPTION=1".to_owned()];
    let src = || ModuleSource::CudaSource {
        source: AXPB_CUDA,
        options: &options,
    };
    let f_cu = d.load_function(src(), "gkrt_test_axpb").unwrap();
    assert_bits_eq(&run_axpb(&d, f_cu, s, &x, &p), &want, "CUDA source kernel");
    // Cached: the same source and options give the same function, without compiling again.
    let t = std::time::Instant::now();
    assert_eq!(d.load_function(src(), "gkrt_test_axpb").unwrap(), f_cu);
    assert!(
        t.elapsed().as_millis() < 5,
        "second load_function recompiled?"
    );
    // The signature is known (two pointers and the 12-byte struct), for both.
    for (f, what) in [(f_ptx, "PTX"), (f_cu, "CUDA source")] {
        let sizes = read(&d.functions)[f.0 as usize].param_sizes.clone();
        assert_eq!(sizes.as_deref(), Some(&[8usize, 8, 12][..]), "{what}");
    }

    // A short params blob is rejected before the driver reads past it.
    let dims = LaunchDims {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem_bytes: 0,
    };
    let b = buf(8, 1);
    assert!(matches!(
        d.launch(f_cu, &dims, &[b, b], &[0u8; 8], s),
        Err(DeviceError::Invalid(_))
    ));
}

#[test]
#[ignore = "needs a CUDA GPU; fails driver calls on purpose"]
fn gpu_neg_bad_code_and_missing_kernels_are_compile_errors() {
    let d = gpu();
    let options = vec!["-DGKRT_TEST_OPTION=1".to_owned()];
    let src = || ModuleSource::CudaSource {
        source: AXPB_CUDA,
        options: &options,
    };
    // cuModuleGetFunction: CUDA_ERROR_NOT_FOUND.
    match d.load_function(src(), "no_such_kernel") {
        Err(DeviceError::Compile(m)) => assert!(m.contains("no_such_kernel"), "{m}"),
        other => panic!("expected Compile, got {other:?}"),
    }
    match d.load_function(ModuleSource::Ptx(AXPB_PTX), "no_such_ptx_kernel") {
        Err(DeviceError::Compile(m)) => assert!(m.contains("no_such_ptx_kernel"), "{m}"),
        other => panic!("expected Compile, got {other:?}"),
    }
    // NVRTC: the source's #error.
    let no_options: Vec<String> = Vec::new();
    match d.load_function(
        ModuleSource::CudaSource {
            source: AXPB_CUDA,
            options: &no_options,
        },
        "gkrt_test_axpb",
    ) {
        Err(DeviceError::Compile(m)) => assert!(m.contains("options were not passed"), "{m}"),
        other => panic!("expected Compile with the NVRTC log, got {other:?}"),
    }
    // cuModuleLoadDataEx: CUDA_ERROR_INVALID_PTX / INVALID_IMAGE.
    match d.load_function(
        ModuleSource::Ptx(".version 7.0\n.target sm_50\nnot ptx"),
        "k",
    ) {
        Err(DeviceError::Compile(m)) => eprintln!("bad PTX: {m}"),
        other => panic!("expected Compile, got {other:?}"),
    }
    // (Not an ELF header: the driver would size that from the header and read past the bytes.)
    match d.load_function(ModuleSource::Cubin(&[1, 2, 3, 4]), "k") {
        Err(DeviceError::Compile(m)) => eprintln!("bad cubin: {m}"),
        other => panic!("expected Compile, got {other:?}"),
    }
    // The device still loads and runs good code.
    let f = d.load_function(src(), "gkrt_test_axpb").unwrap();
    let s = d.create_stream().unwrap();
    let x = values(100, 9);
    let p = Axpb {
        a: 2.0,
        b: 1.0,
        n: x.len() as u32,
    };
    let want: Vec<f32> = x.iter().map(|&v| v * p.a + p.b).collect();
    assert_bits_eq(&run_axpb(&d, f, s, &x, &p), &want, "after the errors");
}
