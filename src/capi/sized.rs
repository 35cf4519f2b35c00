//! Structs that carry their size, so the C API can grow: `gkrt_config` and `gkrt_stats` start
//! with `struct_size`, the bytes of the struct as the program's header declares it.
//!
//! A program built against an older header has a smaller struct, one built against a newer
//! header a larger one; the library reads and writes only the bytes both know:
//! - reading (`gkrt_runtime_create`): the caller's first `min(size, ours)` bytes; fields the
//!   caller's header lacks keep their defaults; bytes beyond ours (fields this library does not
//!   know) must be zero — a set field it cannot honour is GKRT_STATUS_UNSUPPORTED, naming it by
//!   offset — so a newer program that leaves new fields at their defaults runs on an older
//!   library.
//! - writing (`gkrt_config_init_sized`, `gkrt_runtime_stats_sized`): `min(size, ours)` bytes,
//!   the caller's bytes beyond zeroed, and `struct_size` set to the bytes the library filled
//!   (a stats reader learns which fields are real).
//!
//! Sizes below the first version's (`CONFIG_V1_BYTES`, `STATS_V1_BYTES`) or above 64 KiB are
//! argument errors. The unsized entry points (`gkrt_config_init`, `gkrt_runtime_stats`) are the
//! first version's: they always read and write `*_V1_BYTES`, so programs built against it keep
//! working with every later library.

use crate::runtime::Error;
use std::mem::size_of;

/// `gkrt_config` of the first version (struct_size .. host_memory_limit). Never changes.
pub(crate) const CONFIG_V1_BYTES: usize = 56;
/// `gkrt_stats` of the first version (struct_size .. tensors_recomputed). Never changes.
pub(crate) const STATS_V1_BYTES: usize = 224;
/// No struct of the API will be this large; a bigger size is a mistake (or garbage).
const MAX_STRUCT_BYTES: usize = 1 << 16;

fn check_size(size: usize, min: usize, what: &str) -> Result<(), Error> {
    if size < min || size > MAX_STRUCT_BYTES {
        return Err(Error::InvalidArgument(format!(
            "{what} size {size} bytes: at least {min} (this library's first version of the \
             struct) and at most {MAX_STRUCT_BYTES}; fill it with its init function, which sets \
             struct_size"
        )));
    }
    Ok(())
}

/// A `T` from the caller's `size` bytes at `src` (see the module comment); `defaults` supplies
/// the fields the caller's struct lacks.
///
/// # Safety
/// `src` is valid for reads of `size` bytes.
pub(super) unsafe fn read_sized<T: Copy>(
    src: *const u8,
    size: usize,
    min: usize,
    defaults: T,
    what: &str,
) -> Result<T, Error> {
    check_size(size, min, what)?;
    let ours = size_of::<T>();
    // SAFETY: the caller's `size` bytes are readable (contract above).
    let theirs = unsafe { std::slice::from_raw_parts(src, size) };
    if let Some(at) = theirs.iter().skip(ours).position(|&b| b != 0) {
        return Err(Error::Unsupported(format!(
            "{what} has a field at byte offset {} set that this library ({} bytes of {what}) does \
             not know; a newer gkrt is needed for it, or leave it at its default (zero)",
            ours + at,
            ours
        )));
    }
    let mut value = defaults;
    let n = size.min(ours);
    // SAFETY: `value` is a `T` (`ours` bytes, `n` <= ours), `theirs` has `n` bytes; `T` is a
    // `repr(C)` struct of integers, for which any bytes are a value.
    unsafe { std::ptr::copy_nonoverlapping(theirs.as_ptr(), &mut value as *mut T as *mut u8, n) };
    Ok(value)
}

/// Writes `value` into the caller's `size` bytes at `dst` (see the module comment), with its
/// leading `struct_size` (a `u64`) set to the bytes written. Returns them.
///
/// # Safety
/// `dst` is valid for writes of `size` bytes; `T` starts with a `u64` struct_size.
pub(super) unsafe fn write_sized<T: Copy>(
    value: &T,
    dst: *mut u8,
    size: usize,
    min: usize,
    what: &str,
) -> Result<usize, Error> {
    check_size(size, min, what)?;
    let n = size.min(size_of::<T>());
    // SAFETY: `dst` has `size` >= n writable bytes; `value` has size_of::<T>() >= n.
    unsafe {
        std::ptr::copy_nonoverlapping(value as *const T as *const u8, dst, n);
        std::ptr::write_bytes(dst.add(n), 0, size - n);
        std::ptr::write_unaligned(dst as *mut u64, n as u64);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 1 of a struct, and version 2 with one more field: a program and a library built
    /// against either.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct V1 {
        struct_size: u64,
        a: u32,
        b: u32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct V2 {
        struct_size: u64,
        a: u32,
        b: u32,
        extra: u64,
    }
    const MIN: usize = 16;

    fn bytes<T>(v: &T) -> &[u8] {
        // SAFETY: any `T` is readable as its bytes; the test structs have no padding.
        unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }
    }

    #[test]
    fn an_older_program_runs_on_a_newer_library() {
        // Reading: the new field keeps the library's default.
        let old = V1 {
            struct_size: 16,
            a: 7,
            b: 8,
        };
        let defaults = V2 {
            struct_size: 24,
            a: 0,
            b: 0,
            extra: 99,
        };
        let got: V2 =
            unsafe { read_sized(bytes(&old).as_ptr(), 16, MIN, defaults, "cfg") }.unwrap();
        assert_eq!(
            got,
            V2 {
                struct_size: 16,
                a: 7,
                b: 8,
                extra: 99
            }
        );
        // Writing: only the program's 16 bytes, its struct_size says so.
        let mut buf = [0xAAu8; 24];
        let value = V2 {
            struct_size: 0,
            a: 1,
            b: 2,
            extra: 3,
        };
        let n = unsafe { write_sized(&value, buf.as_mut_ptr(), 16, MIN, "stats") }.unwrap();
        assert_eq!(n, 16);
        assert_eq!(
            &buf[16..],
            &[0xAA; 8],
            "nothing written past the program's struct"
        );
        let back: V1 = unsafe { std::ptr::read_unaligned(buf.as_ptr() as *const V1) };
        assert_eq!(
            back,
            V1 {
                struct_size: 16,
                a: 1,
                b: 2
            }
        );
    }

    #[test]
    fn a_newer_program_runs_on_an_older_library() {
        // Reading: a new field left at zero is accepted; set, it is refused by offset.
        let mut new = V2 {
            struct_size: 24,
            a: 5,
            b: 6,
            extra: 0,
        };
        let defaults = V1 {
            struct_size: 16,
            a: 0,
            b: 0,
        };
        let got: V1 =
            unsafe { read_sized(bytes(&new).as_ptr(), 24, MIN, defaults, "cfg") }.unwrap();
        assert_eq!((got.a, got.b), (5, 6));
        new.extra = 1;
        let e = unsafe { read_sized(bytes(&new).as_ptr(), 24, MIN, defaults, "cfg") }.unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported(m) if m.contains("offset 16")),
            "{e:?}"
        );
        // Writing: the library's 16 bytes, the rest zeroed, struct_size 16 (extra not filled).
        let mut buf = [0xAAu8; 24];
        let value = V1 {
            struct_size: 0,
            a: 3,
            b: 4,
        };
        let n = unsafe { write_sized(&value, buf.as_mut_ptr(), 24, MIN, "stats") }.unwrap();
        assert_eq!(n, 16);
        let back: V2 = unsafe { std::ptr::read_unaligned(buf.as_ptr() as *const V2) };
        assert_eq!(
            back,
            V2 {
                struct_size: 16,
                a: 3,
                b: 4,
                extra: 0
            }
        );
    }

    #[test]
    fn sizes_below_the_first_version_or_absurd_are_refused() {
        let v = V1 {
            struct_size: 8,
            a: 0,
            b: 0,
        };
        for size in [0, 8, 15, MAX_STRUCT_BYTES + 1] {
            let e = unsafe { read_sized(bytes(&v).as_ptr(), size.min(16), MIN, v, "cfg") };
            if size < MIN {
                assert!(matches!(e, Err(Error::InvalidArgument(_))), "{size}");
            }
            let mut buf = [0u8; 16];
            let e = unsafe { write_sized(&v, buf.as_mut_ptr(), size, MIN, "stats") };
            if !(MIN..=MAX_STRUCT_BYTES).contains(&size) {
                assert!(
                    matches!(&e, Err(Error::InvalidArgument(m)) if m.contains("size")),
                    "{size}"
                );
            }
        }
    }

    #[test]
    fn the_first_versions_are_todays_structs() {
        // When a field is added, these constants stay: they are what old programs were built with.
        assert!(size_of::<super::super::types::gkrt_config>() >= CONFIG_V1_BYTES);
        assert!(size_of::<super::super::types::gkrt_stats>() >= STATS_V1_BYTES);
        assert_eq!(
            std::mem::offset_of!(super::super::types::gkrt_config, host_memory_limit) + 8,
            CONFIG_V1_BYTES
        );
        assert_eq!(
            std::mem::offset_of!(super::super::types::gkrt_stats, tensors_recomputed) + 8,
            STATS_V1_BYTES
        );
    }
}
