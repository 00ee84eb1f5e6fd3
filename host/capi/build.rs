//! Gives libhalo.so the soname `libhalo.so`, so a program linked against it records that name
//! (found through its rpath or LD_LIBRARY_PATH) instead of the path it was linked from.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libhalo.so");
    println!("cargo:rerun-if-changed=build.rs");
}
