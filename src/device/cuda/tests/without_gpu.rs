//! The CUDA backend without a GPU (runs anywhere, no driver needed): probing and opening fail
//! cleanly, never panic; a launch whose buffers or params blob do not match the kernel's
//! signature is refused before the driver sees it.

use super::*;

#[test]
fn probe_returns_a_reason_instead_of_panicking() {
    match probe(0) {
        Ok(()) => eprintln!("CUDA device 0 present"),
        Err(why) => {
            eprintln!("probe(0): {why}");
            assert!(!why.is_empty());
        }
    }
    // No machine has 2^32 - 1 GPUs.
    let why = probe(u32::MAX).unwrap_err();
    assert!(!why.is_empty());
}

#[test]
fn open_without_a_device_is_no_device() {
    match probe(0) {
        Err(why) => assert_eq!(CudaDevice::open(0).unwrap_err(), DeviceError::NoDevice(why)),
        Ok(()) => {
            CudaDevice::open(0).expect("probe succeeded, so open must");
        }
    }
    assert!(matches!(
        CudaDevice::open(u32::MAX),
        Err(DeviceError::NoDevice(_))
    ));
}

fn entry(sizes: &[usize]) -> FuncEntry {
    FuncEntry {
        func: Func(ptr::null_mut()),
        name: "k".into(),
        param_sizes: Some(sizes.to_vec().into_boxed_slice()),
    }
}

#[test]
fn signature_check_rejects_mismatched_launches() {
    let b = Buffer {
        ptr: 0x1000,
        bytes: 4,
    };
    let e = entry(&[8, 8, 12]);
    let sizes = e.param_sizes.as_deref().unwrap();
    assert!(check_signature(&e, sizes, &[b, b], &[0u8; 12]).is_ok());
    assert!(check_signature(&e, sizes, &[b, b], &[0u8; 16]).is_ok());
    assert!(matches!(
        check_signature(&e, sizes, &[b, b], &[0u8; 8]),
        Err(DeviceError::Invalid(_))
    ));
    assert!(matches!(
        check_signature(&e, sizes, &[b, b], &[]),
        Err(DeviceError::Invalid(_))
    ));
    assert!(matches!(
        check_signature(&e, sizes, &[b, b, b], &[]),
        Err(DeviceError::Invalid(_))
    ));
    assert!(matches!(
        check_signature(&e, sizes, &[b], &[0u8; 12]),
        Err(DeviceError::Invalid(_))
    ));
    let e = entry(&[8, 4]);
    let sizes = e.param_sizes.as_deref().unwrap();
    assert!(matches!(
        check_signature(&e, sizes, &[b, b], &[]),
        Err(DeviceError::Invalid(_))
    ));
}
