//! Builds the GPU kernels (or finds them in the builder's cache) and embeds them in the library,
//! so a crate that depends on `halo` runs them with no environment variable set.
//!
//! Writes `$OUT_DIR/embedded.rs`, included by `src/artifacts.rs`. With `HALO_SKIP_KERNEL_BUILD=1`
//! nothing is built and nothing is embedded: the kernels then come from `HALO_PTX_DIR` at run time.

use std::path::{Path, PathBuf};

fn main() {
    let root = halo_builder::source_root();
    for var in
        ["HALO_SKIP_KERNEL_BUILD", "HALO_KERNEL_ARCH", "HALO_NVSHMEM", "HALO_CACHE_DIR", "NVSHMEM_HOME", "PTXAS", "CUDA_HOME", "CUDA_PATH", "DOCS_RS"]
    {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for input in ["kernels-gpu/src", "kernels-gpu/Cargo.toml", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(input).display());
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"));
    let skip = std::env::var("HALO_SKIP_KERNEL_BUILD").is_ok_and(|v| !v.is_empty() && v != "0");
    // docs.rs builds without network, rustup or a GPU toolchain: document without kernels.
    if skip || std::env::var_os("DOCS_RS").is_some() {
        if skip {
            println!("cargo:warning=HALO_SKIP_KERNEL_BUILD is set: halo is built without embedded kernels; set HALO_PTX_DIR at run time");
        }
        write(&out.join("embedded.rs"), "/// No kernels were embedded (HALO_SKIP_KERNEL_BUILD).\npub const KERNELS: Option<Embedded> = None;\n");
        return;
    }
    let opts = halo_builder::PtxOptions {
        arch: std::env::var("HALO_KERNEL_ARCH").ok().filter(|a| !a.is_empty()).unwrap_or_else(|| halo_builder::PtxOptions::default().arch),
        nvshmem: std::env::var("HALO_NVSHMEM").ok().filter(|n| !n.is_empty()),
        force: false,
    };
    let built = match halo_builder::build(&opts) {
        Ok(a) => a,
        Err(e) => fail(&e, &root),
    };
    // Copied next to the generated code so that cleaning the cache never breaks this build.
    let arts = match built.copy_to(&out.join("kernels")) {
        Ok(a) => a,
        Err(e) => fail(&e, &root),
    };
    let lit = |p: &Path| format!("{:?}", p.display().to_string());
    write(
        &out.join("embedded.rs"),
        &format!(
            "/// The kernels built for this library by halo-builder ({arch}).\n\
             pub const KERNELS: Option<Embedded> = Some(Embedded {{\n    \
                 arch: {arch:?},\n    \
                 manifest: include_str!({manifest}),\n    \
                 ptx: include_bytes!({ptx}),\n    \
                 cubin: include_bytes!({cubin}),\n    \
                 ptxas_report: include_str!({report}),\n\
             }});\n",
            arch = opts.arch,
            manifest = lit(&arts.manifest),
            ptx = lit(&arts.ptx),
            cubin = lit(&arts.cubin),
            report = lit(&arts.report),
        ),
    );
}

fn write(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        panic!("halo build script: writing {}: {e}", path.display());
    }
}

/// Stops the build with what is missing and the two ways out.
fn fail(e: &halo_builder::BuildError, root: &Path) -> ! {
    eprintln!(
        "\nerror: halo could not build its GPU kernels: {e}\n\n\
         halo compiles its kernels ({kernels}) to PTX and a cubin when it is built, with halo-builder:\n  \
           - rustup, which installs the pinned {nightly} with rust-src and llvm-tools when missing;\n  \
           - python3 with pip, which fetches the pinned NVSHMEM ({nvshmem}) and ptxas wheels (or NVSHMEM_HOME / ptxas on PATH);\n  \
           - network access for the first build; later builds reuse the cache in {cache}.\n\n\
         To build halo without them: set HALO_SKIP_KERNEL_BUILD=1, and at run time point HALO_PTX_DIR at a folder\n\
         holding halo_kernels.<arch>.{{ptx,cubin,manifest.json}} (`cargo xtask build-ptx` in a halo checkout writes\n\
         target/ptx/; a bundle has ptx/).\n",
        kernels = root.join("kernels-gpu").display(),
        nightly = halo_builder::NIGHTLY,
        nvshmem = halo_builder::NVSHMEM_VERSION,
        cache = halo_builder::cache_dir().display(),
    );
    std::process::exit(1);
}
