//! The parameter layouts of kernels: counted from images without a GPU (NVRTC 13.0 output in
//! ../testdata/), and checked against the driver and real launches on one.

use super::user_kernels::AXPB_PTX;
use super::*;

// ---------------------------------------------------------------------------------------------
// Parameter counts from images (no GPU: NVRTC 13.0 output in testdata/, made by
// scripts/gen_cuda_param_fixtures.py)

const PARAMS_CU: &str = include_str!("../testdata/params_kernels.cu");
const PARAMS_CUBIN: &[u8] = include_bytes!("../testdata/params_kernels.sm_90.cubin");
const PARAMS_PTX: &[u8] = include_bytes!("../testdata/params_kernels.compute_90.ptx");
const BUILTINS_CUBIN: &[u8] = include_bytes!("../testdata/builtins.sm_90.cubin");

/// The kernels of testdata/params_kernels.cu and their parameter sizes.
const PARAM_KERNELS: &[(&str, &[usize])] = &[
    ("gkrt_p0", &[]),
    ("gkrt_p1", &[8]),
    ("gkrt_pmix", &[1, 8, 2, 8, 12, 4, 40, 8]),
    ("gkrt_punused", &[8, 4, 8]),
];

/// The built-ins' parameter sizes (their signatures in builtins.rs).
const BUILTIN_PARAMS: &[(&str, &[usize])] = &[
    (builtins::ADD, &[8, 8, 8, 8]),
    (builtins::SCALE, &[8, 8, 4, 8]),
    (builtins::RELU, &[8, 8, 8]),
    (builtins::RELU_GRAD, &[8, 8, 8, 8]),
    (builtins::MATMUL, &[8, 8, 8, 4, 4, 4]),
];

#[test]
fn param_counts_from_nvrtc_cubins() {
    for &(name, sizes) in PARAM_KERNELS {
        let kp = params::elf_kparams(PARAMS_CUBIN, name).unwrap_or_else(|| panic!("{name}"));
        let got: Vec<usize> = kp.iter().map(|p| p.size as usize).collect();
        assert_eq!(got, sizes, "{name}: sizes from EIATTR_KPARAM_INFO");
        let image = params::KernelImage::Binary(PARAMS_CUBIN.into());
        assert_eq!(image.param_count(name), Some(sizes.len()), "{name}");
    }
    for &(name, sizes) in BUILTIN_PARAMS {
        let kp = params::elf_kparams(BUILTINS_CUBIN, name).unwrap_or_else(|| panic!("{name}"));
        let got: Vec<usize> = kp.iter().map(|p| p.size as usize).collect();
        assert_eq!(got, sizes, "built-in {name}");
    }
    // The fixture is the source the GPU test compiles.
    assert!(PARAMS_CU.contains("gkrt_pmix"));
    // A kernel the cubin does not have, or a prefix of one: no answer.
    assert_eq!(params::elf_param_count(PARAMS_CUBIN, "gkrt_p"), None);
    assert_eq!(params::elf_param_count(PARAMS_CUBIN, "nope"), None);
}

#[test]
fn param_counts_from_ptx() {
    let image = params::KernelImage::Ptx(PARAMS_PTX.into());
    for &(name, sizes) in PARAM_KERNELS {
        assert_eq!(image.param_count(name), Some(sizes.len()), "{name}");
    }
    assert_eq!(image.param_count("gkrt_p"), None);
    // PTX handed over as a "cubin" is read as text, as the driver does.
    assert_eq!(params::binary_param_count(PARAMS_PTX, "gkrt_pmix"), Some(8));

    // Hand-written forms: comments, attributes, no list, empty list, arrays, strings.
    let ptx = br#"
.version 7.0
.target sm_50
.address_size 64
.file 1 "/src//x.cu" // a path with // inside a string
/* .entry commented_out(.param .u64 a) */
.visible .entry none .maxntid 32, 1, 1
{ ret; }
.visible .entry empty()
{ ret; }
.weak .entry three( // a comment in the list
    .param .u64 .ptr .global .align 8 a,
    .param .align 4 .b8 b[12], /* one, two */
    .param .f32 c
)
{ ret; }
.visible .entry gkrt_test_axpb(.param .u64 out_param, .param .u64 in_param, .param .align 4 .b8 p_param[12])
{ ret; }
"#;
    assert_eq!(params::ptx_param_count(ptx, "none"), Some(0));
    assert_eq!(params::ptx_param_count(ptx, "empty"), Some(0));
    assert_eq!(params::ptx_param_count(ptx, "three"), Some(3));
    assert_eq!(params::ptx_param_count(ptx, "gkrt_test_axpb"), Some(3));
    assert_eq!(params::ptx_param_count(ptx, "commented_out"), None);
    assert_eq!(
        params::ptx_param_count(AXPB_PTX.as_bytes(), "gkrt_test_axpb"),
        Some(3)
    );
    // Malformed lists: no answer rather than a wrong one.
    assert_eq!(
        params::ptx_param_count(b".entry k(.param .u64 a", "k"),
        None
    );
    assert_eq!(
        params::ptx_param_count(b".entry k(.param .u64 a,) {}", "k"),
        None
    );
    assert_eq!(
        params::ptx_param_count(b".entry k(.param .u64 a { }", "k"),
        None
    );
}

/// `payload` as the one entry of a fatbin (`flags` of the entry header).
fn fatbin_of(kind: u16, payload: &[u8], flags: u64) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&0xBA55_ED50u32.to_le_bytes());
    f.extend_from_slice(&1u16.to_le_bytes());
    f.extend_from_slice(&16u16.to_le_bytes());
    f.extend_from_slice(&(64 + payload.len() as u64).to_le_bytes());
    let mut h = vec![0u8; 64];
    h[0..2].copy_from_slice(&kind.to_le_bytes());
    h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
    h[4..8].copy_from_slice(&64u32.to_le_bytes());
    h[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    h[40..48].copy_from_slice(&flags.to_le_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(payload);
    f
}

#[test]
fn param_counts_from_fatbins_and_bad_images() {
    let elf = fatbin_of(2, PARAMS_CUBIN, 0);
    assert_eq!(params::binary_param_count(&elf, "gkrt_pmix"), Some(8));
    assert_eq!(params::binary_param_count(&elf, "gkrt_p0"), Some(0));
    let ptx = fatbin_of(1, PARAMS_PTX, 0);
    assert_eq!(params::binary_param_count(&ptx, "gkrt_punused"), Some(3));
    // Compressed: not read.
    let compressed = fatbin_of(2, PARAMS_CUBIN, 0x2000);
    assert_eq!(params::binary_param_count(&compressed, "gkrt_pmix"), None);
    // Truncated or garbled images never panic and never answer.
    for cut in [0, 3, 4, 20, 64, 100, 1000, PARAMS_CUBIN.len() - 1] {
        let _ = params::binary_param_count(&PARAMS_CUBIN[..cut], "gkrt_pmix");
        let _ = params::binary_param_count(&elf[..cut.min(elf.len())], "gkrt_pmix");
    }
    let mut garbled = PARAMS_CUBIN.to_vec();
    for i in (0..garbled.len()).step_by(7) {
        garbled[i] ^= 0x5a;
    }
    garbled[..4].copy_from_slice(b"\x7fELF");
    let _ = params::binary_param_count(&garbled, "gkrt_pmix");
    assert_eq!(params::binary_param_count(&[1, 2, 3, 4], "f"), None);
}

// ---------------------------------------------------------------------------------------------
// Helpers for the GPU tests

#[repr(C)]
#[derive(Clone, Copy)]
struct P12 {
    a: f32,
    b: f32,
    n: u32,
}

/// Checks the layout recorded for kernel `name` (loaded as `f` from `what`), and that the
/// image's count alone (the path of drivers before CUDA 13.2) gives the same sizes, and the
/// driver's own count (13.2+) where it has one.
fn check_layout(d: &CudaDevice, f: FunctionId, name: &str, want: &[usize], what: &str) {
    let recorded = read(&d.functions)[f.0 as usize].param_sizes.clone();
    assert_eq!(
        recorded.as_deref(),
        Some(want),
        "{what}: {name}: recorded sizes"
    );
    let func = d.func(f).unwrap();
    assert_eq!(
        param_sizes_of(func, want.len(), name).as_deref(),
        Some(want),
        "{what}: {name}: sizes for the image's count"
    );
    match driver_param_count(func) {
        Some(n) => assert_eq!(n, want.len(), "{what}: {name}: cuFuncGetParamCount"),
        None => {
            eprintln!("{what}: {name}: no cuFuncGetParamCount in this driver: count from the image")
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_param_layouts_of_ptx_cubin_and_source_kernels() {
    let d = gpu();
    let s = d.create_stream().unwrap();
    let (major, minor) = d.compute_capability();
    let none: Vec<String> = Vec::new();
    let ptx_only = vec![format!("--gpu-architecture=compute_{major}{minor}")];
    let source = |options| ModuleSource::CudaSource {
        source: PARAMS_CU,
        options,
    };
    // NVRTC's cubin for this GPU, and its PTX (the cubin-less path: JIT-compiled by the
    // driver), handed over as PTX text and as a "cubin" (which the driver reads as text).
    let cubin = match nvrtc::compile(PARAMS_CU, &none, d.cc).unwrap() {
        nvrtc::Image::Cubin(c) => c,
        nvrtc::Image::Ptx(_) => panic!("NVRTC gave PTX for sm_{major}{minor}"),
    };
    let ptx = match nvrtc::compile(PARAMS_CU, &ptx_only, d.cc).unwrap() {
        nvrtc::Image::Ptx(p) => p,
        nvrtc::Image::Cubin(_) => panic!("NVRTC gave a cubin for compute_{major}{minor}"),
    };
    let ptx = ptx.strip_suffix(&[0]).unwrap_or(&ptx);
    let ptx_text = std::str::from_utf8(ptx).unwrap();
    let fixture_ptx = std::str::from_utf8(PARAMS_PTX.strip_suffix(&[0]).unwrap()).unwrap();
    for &(name, want) in PARAM_KERNELS {
        let mut loads: Vec<(&str, ModuleSource<'_>)> = vec![
            ("NVRTC source (cubin)", source(&none)),
            ("NVRTC source (PTX)", source(&ptx_only)),
            ("cubin", ModuleSource::Cubin(&cubin)),
            ("PTX", ModuleSource::Ptx(ptx_text)),
            ("PTX as a cubin", ModuleSource::Cubin(ptx)),
            ("PTX fixture", ModuleSource::Ptx(fixture_ptx)),
        ];
        if d.cc == (9, 0) {
            loads.push(("sm_90 cubin fixture", ModuleSource::Cubin(PARAMS_CUBIN)));
        }
        for (what, src) in loads {
            let f = d.load_function(src, name).unwrap();
            check_layout(&d, f, name, want, what);
        }
    }
    // Hand-written PTX, and the built-ins (NVRTC cubins).
    let f = d
        .load_function(ModuleSource::Ptx(AXPB_PTX), "gkrt_test_axpb")
        .unwrap();
    check_layout(&d, f, "gkrt_test_axpb", &[8, 8, 12], "hand-written PTX");
    let b = d.builtins().unwrap();
    let funcs = [b.add, b.scale, b.relu, b.relu_grad, b.matmul];
    for (&(name, want), func) in BUILTIN_PARAMS.iter().zip(funcs) {
        let id = read(&d.functions)
            .iter()
            .position(|e| e.func.0 == func.0)
            .unwrap();
        check_layout(&d, FunctionId(id as u32), name, want, "built-in");
    }

    // Launches are checked against the layout, and the right ones run.
    let out = alloc_f32(&d, 1);
    let dims = LaunchDims {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_mem_bytes: 0,
    };
    let load = |name| d.load_function(source(&none), name).unwrap();
    let (p0, p1, pmix, punused) = (
        load("gkrt_p0"),
        load("gkrt_p1"),
        load("gkrt_pmix"),
        load("gkrt_punused"),
    );
    d.launch(p0, &dims, &[], &[], s).unwrap();
    assert!(matches!(
        d.launch(p0, &dims, &[buf(out, 1)], &[], s),
        Err(DeviceError::Invalid(_))
    ));
    d.launch(p1, &dims, &[buf(out, 1)], &[], s).unwrap();
    assert_eq!(download(&d, s, out, 1), [1.0]);
    // (An 8-byte blob would match the one 8-byte parameter: sizes are all the check can see.)
    assert!(matches!(
        d.launch(p1, &dims, &[], &[0u8; 4], s),
        Err(DeviceError::Invalid(_))
    ));
    // (float*, int, double) is not (buffers..., one struct): rejected, not misread.
    assert!(matches!(
        d.launch(punused, &dims, &[buf(out, 1)], &[0u8; 16], s),
        Err(DeviceError::Invalid(_))
    ));
    // Every size matters: a raw launch of (char, float*, short, double, P12, int, P40, u64);
    // the kernel adds them all up: 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9.
    let (c, o, sh, db) = (1i8, out, 2i16, 3.0f64);
    let p = P12 {
        a: 4.0,
        b: 5.0,
        n: 6,
    };
    let (i, q, u) = (7i32, [0.0f64, 0.0, 0.0, 0.0, 8.0], 9u64);
    let mut args = kernel_args!(c, o, sh, db, p, i, q, u);
    let raw_stream = d.streams.get(s.0).unwrap().0;
    let f = d.func(pmix).unwrap();
    // SAFETY: the arguments match gkrt_pmix's signature; live stream.
    unsafe { cu_launch(f, [1, 1, 1], [1, 1, 1], 0, raw_stream, &mut args) }.unwrap();
    assert_eq!(download(&d, s, out, 1), [45.0]);
    d.free_segment(out, 0).unwrap();
    d.destroy_stream(s).unwrap();
}
