//! The layout of `gkrt_config` this library reads and writes (`gkrt_config_init_sized`,
//! `gkrt_runtime_create`): the header's struct, or — in the variant built with the cargo
//! feature `abi-test-extra-field`, only for the compatibility test
//! (`scripts/abi_extra_field_test.sh`, run by `.ci/run`) — the header's struct with one field
//! appended, as a later version of the library would have it. The header never shows the
//! extra field (it is not part of the API); the test declares it itself.

use super::types::gkrt_config;

/// The struct as this library knows it.
#[cfg(not(feature = "abi-test-extra-field"))]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct ConfigLayout {
    pub v1: gkrt_config,
}

/// The struct as this library knows it: one field more than the header's.
#[cfg(feature = "abi-test-extra-field")]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct ConfigLayout {
    pub v1: gkrt_config,
    /// When non-zero: the memory limit in MiB, in place of `memory_limit` (default 0). A
    /// field whose effect the test can see (`gkrt_stats.memory_limit`).
    pub memory_limit_mib: u64,
}

impl ConfigLayout {
    pub fn new(v1: gkrt_config) -> Self {
        ConfigLayout {
            v1,
            #[cfg(feature = "abi-test-extra-field")]
            memory_limit_mib: 0,
        }
    }

    /// The configuration the header's fields describe, with the extra field applied.
    pub fn effective(&self) -> gkrt_config {
        #[allow(unused_mut)]
        let mut c = self.v1;
        #[cfg(feature = "abi-test-extra-field")]
        if self.memory_limit_mib != 0 {
            c.memory_limit = self.memory_limit_mib << 20;
        }
        c
    }
}
