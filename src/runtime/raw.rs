//! Raw pool use from the C API (gkrt_malloc / gkrt_free): not yet in this commit.
