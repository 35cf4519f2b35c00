//! Generates include/gkrt.h from the C API with cbindgen. The header is committed; CI rebuilds
//! it and fails when the committed copy differs.

fn main() {
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    // cbindgen reads every public item of the crate, so any source change may change the header.
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    // A SONAME, so the shared object can be versioned and found by ld.so like any system library.
    // The link named by the SONAME is made beside the library (in target/<profile>/), so a
    // program linked against target/<profile>/libgkrt.so runs without an install step.
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let soname = format!("libgkrt.so.{major}");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
        // OUT_DIR is target/<profile>/build/gkrt-<hash>/out.
        if let Some(profile_dir) = std::path::Path::new(&std::env::var("OUT_DIR").unwrap())
            .ancestors()
            .nth(3)
        {
            let link = profile_dir.join(&soname);
            if std::fs::symlink_metadata(&link).is_err() {
                let _ = std::os::unix::fs::symlink("libgkrt.so", &link);
            }
        }
    }
    let config = cbindgen::Config::from_file(format!("{crate_dir}/cbindgen.toml"))
        .expect("reading cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate();
    match bindings {
        Ok(b) => {
            b.write_to_file(format!("{crate_dir}/include/gkrt.h"));
        }
        Err(e) => panic!("cbindgen failed to generate include/gkrt.h: {e}"),
    }
}
