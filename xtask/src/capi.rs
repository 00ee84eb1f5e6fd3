//! The C API's build tasks:
//!
//! - `capi-header`: writes `host/capi/include/halo.h` from the `halo-capi` crate with cbindgen
//!   (its settings in `host/capi/cbindgen.toml`); a test below fails when the committed header differs.
//! - `capi-install --prefix DIR`: builds `halo-capi` in release and installs `lib/libhalo.so`,
//!   `lib/libhalo.a`, `include/halo.h`, the CMake package `lib/cmake/halo/` and
//!   `lib/pkgconfig/halo.pc`.
//! - the `capi` check of `cargo xtask test` ([`check`]): the header is current, the C snippets and
//!   `examples/capi-cpp` (configured with CMake against an installed package, built with g++)
//!   compile and link (the example on `libhalo.so` and on `libhalo.a`), and the example, run without
//!   a GPU, fails with halo's `HALO_NO_GPU` message.
//!
//! CI has no CUDA toolkit and maybe no CMake: the CUDA runtime's headers and `libcudart_static.a`
//! and CMake come from pinned PyPI wheels ([`CUDA_RUNTIME`], [`CUDA_CRT`], [`CMAKE`]), SHA-256
//! checked like the MPI wheels (`mpi.rs`), unpacked under `target/capi/`.

use crate::wheel::unpack_data;
use anyhow::{Context, Result, bail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The C API crate's folder.
pub fn crate_dir() -> PathBuf {
    crate::workspace_root().join("host/capi")
}

/// The committed header.
pub fn header_path() -> PathBuf {
    crate_dir().join("include/halo.h")
}

/// `include/halo.h` as cbindgen writes it from the crate's sources now.
pub fn header() -> Result<String> {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).map_err(anyhow::Error::msg).context("reading host/capi/cbindgen.toml")?;
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .context("cbindgen could not generate halo.h from host/capi/src")?;
    let mut out = Vec::new();
    bindings.write(&mut out);
    Ok(String::from_utf8(out)?)
}

/// Writes the header (`cargo xtask capi-header`).
pub fn write_header() -> Result<PathBuf> {
    let path = header_path();
    fs::create_dir_all(path.parent().context("the header has a folder")?)?;
    fs::write(&path, header()?).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Fails, naming the fix, when the committed header is not what the sources generate.
pub fn check_header() -> Result<()> {
    let committed = fs::read_to_string(header_path()).with_context(|| format!("reading {}", header_path().display()))?;
    if committed != header()? {
        bail!("{} is not what host/capi/src generates: run `cargo xtask capi-header` and commit it", header_path().display());
    }
    Ok(())
}

/// The crate's version (for the CMake package and the pkg-config file).
fn version() -> Result<String> {
    let text = fs::read_to_string(crate::workspace_root().join("Cargo.toml"))?;
    let in_package = text.split("[workspace.package]").nth(1).context("Cargo.toml has no [workspace.package]")?;
    let line = in_package.lines().find(|l| l.trim_start().starts_with("version")).context("[workspace.package] has no version")?;
    Ok(line.split('"').nth(1).context("the version is not a quoted string")?.to_string())
}

/// Builds `halo-capi` (release, or debug where `release` is false) and installs it under `prefix`;
/// returns the folder of `libhalo.so`.
pub fn install(ptx: &crate::PtxArgs, prefix: &Path, release: bool) -> Result<PathBuf> {
    let mut cmd = ptx.cargo();
    cmd.args(["build", "--locked", "-p", "halo-capi"]);
    if release {
        cmd.arg("--release");
    }
    halo_builder::run(&mut cmd, "cargo build -p halo-capi")?;
    let built = crate::workspace_root().join("target").join(if release { "release" } else { "debug" });
    let (lib, include, cmake, pkgconfig) = (prefix.join("lib"), prefix.join("include"), prefix.join("lib/cmake/halo"), prefix.join("lib/pkgconfig"));
    for d in [&lib, &include, &cmake, &pkgconfig] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    // The crate's library is `halo_capi` in target/ (beside the Rust library `halo`'s outputs);
    // C and C++ link it as libhalo (the shared library's soname is libhalo.so: host/capi/build.rs).
    for (from, to) in [("libhalo_capi.so", "libhalo.so"), ("libhalo_capi.a", "libhalo.a")] {
        copy(&built.join(from), &lib.join(to))?;
    }
    copy(&header_path(), &include.join("halo.h"))?;
    let templates = crate_dir().join("cmake");
    copy(&templates.join("haloConfig.cmake"), &cmake.join("haloConfig.cmake"))?;
    let version = version()?;
    for (template, dest) in [("haloConfigVersion.cmake.in", cmake.join("haloConfigVersion.cmake")), ("halo.pc.in", pkgconfig.join("halo.pc"))] {
        let text = fs::read_to_string(templates.join(template))?.replace("@HALO_VERSION@", &version);
        fs::write(&dest, text).with_context(|| format!("writing {}", dest.display()))?;
    }
    eprintln!("xtask: halo's C API {version} installed in {}", prefix.display());
    Ok(lib)
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    // Remove first: a running program may map the old library, which must not be overwritten in place.
    let _ = fs::remove_file(to);
    fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// One pinned wheel whose files are unpacked from `inner` (a folder inside the wheel).
#[derive(Clone, Copy, Debug)]
pub struct Wheel {
    /// PyPI project.
    pub project: &'static str,
    /// Version.
    pub version: &'static str,
    /// SHA-256 of the manylinux x86_64 wheel.
    pub sha256: &'static str,
    /// The folder of the wheel that is unpacked.
    pub inner: &'static str,
}

/// The CUDA runtime for CUDA 13.0 (the GPU machines' driver ABI): `include/cuda_runtime_api.h`
/// and friends, `lib/libcudart_static.a`, `lib/libcudart.so.13`.
pub const CUDA_RUNTIME: Wheel = Wheel {
    project: "nvidia-cuda-runtime",
    version: "13.0.88",
    sha256: "422a38f7c739ecbdd3a4b6ec7ed0a1d74db43d8e9bc26685f3d845638922b178",
    inner: "nvidia/cu13",
};
/// The runtime headers' `crt/` folder (`crt/host_defines.h`, which `cuda_runtime_api.h` includes),
/// shipped apart from the runtime since CUDA 13.
pub const CUDA_CRT: Wheel = Wheel {
    project: "nvidia-cuda-crt",
    version: "13.0.88",
    sha256: "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4",
    inner: "nvidia/cu13",
};
/// CMake (`bin/cmake` and its modules in `share/`).
pub const CMAKE: Wheel =
    Wheel { project: "cmake", version: "4.1.2", sha256: "7587a2b2ce48df1fd68a68657b6c5a711b467c346812e46dfb9cd996cd6e2352", inner: "cmake/data" };

/// `target/capi`.
fn root() -> PathBuf {
    crate::workspace_root().join("target/capi")
}

/// Fetches (once) and unpacks `wheels` into `dest` (all into the same folder); returns it.
fn fetch(dest: &Path, wheels: &[Wheel]) -> Result<PathBuf> {
    let marker = dest.join(".installed");
    let want: Vec<String> = wheels.iter().map(|w| format!("{}=={} sha256:{}", w.project, w.version, w.sha256)).collect();
    if fs::read_to_string(&marker).is_ok_and(|m| m.trim() == want.join("\n")) {
        return Ok(dest.to_path_buf());
    }
    let cache = root().join("wheels");
    if dest.exists() {
        fs::remove_dir_all(dest).with_context(|| format!("clearing {}", dest.display()))?;
    }
    for w in wheels {
        let wheel = crate::wheel::download(&cache, w.project, w.version, w.sha256, "the C API check's CUDA runtime and CMake come from PyPI")?;
        let files = unpack_data(&wheel, &format!("{}/", w.inner), dest)?;
        if files == 0 {
            bail!("{} holds no {}/ files", wheel.display(), w.inner);
        }
    }
    fs::write(&marker, want.join("\n"))?;
    Ok(dest.to_path_buf())
}

/// The CUDA runtime folder (`include/`, `lib/`) from its pinned wheels.
pub fn cuda_runtime() -> Result<PathBuf> {
    fetch(&root().join("cudart"), &[CUDA_RUNTIME, CUDA_CRT])
}

/// `cmake`: the one on PATH when there is one, else the pinned wheel's.
pub fn cmake() -> Result<PathBuf> {
    if Command::new("cmake").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(PathBuf::from("cmake"));
    }
    Ok(fetch(&root().join("cmake"), &[CMAKE])?.join("bin/cmake"))
}

/// The C snippets of the docs (`host/capi/tests/snippets/*.c`).
fn snippets() -> Result<Vec<PathBuf>> {
    let dir = crate_dir().join("tests/snippets");
    let mut found: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    found.sort();
    Ok(found)
}

/// Builds `examples/capi-cpp` with CMake against the package installed in `prefix`, into `build`,
/// with `extra` CMake arguments; returns the program.
pub fn build_example(prefix: &Path, build: &Path, extra: &[&str]) -> Result<PathBuf> {
    let cmake = cmake()?;
    let cudart = cuda_runtime()?;
    let source = crate::workspace_root().join("examples/capi-cpp");
    halo_builder::run(
        Command::new(&cmake)
            .arg("-S")
            .arg(&source)
            .arg("-B")
            .arg(build)
            .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
            .arg(format!("-DCUDART_ROOT={}", cudart.display()))
            .args(["-DCMAKE_CXX_COMPILER=g++", "-DCMAKE_BUILD_TYPE=Release"])
            .args(extra),
        "cmake configure of examples/capi-cpp",
    )?;
    halo_builder::run(Command::new(&cmake).arg("--build").arg(build).arg("--parallel"), "cmake --build of examples/capi-cpp")?;
    Ok(build.join("capi-cpp"))
}

/// The `capi` step of `cargo xtask test` (see the module's documentation).
pub fn check(ptx: &crate::PtxArgs) -> Result<()> {
    let started = std::time::Instant::now();
    check_header()?;
    let prefix = root().join("prefix");
    install(ptx, &prefix, false)?;
    // The docs' C snippets: strict C11 against the installed header, linked against libhalo.so
    // with the flags of the installed halo.pc (pkg-config), or the same flags spelled out where
    // pkg-config is not installed.
    let flags = pkg_config_flags(&prefix)?;
    for snippet in snippets()? {
        let exe = root().join(snippet.file_stem().context("a snippet has a name")?);
        halo_builder::run(
            Command::new("gcc").args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"]).arg(&snippet).args(&flags).arg("-o").arg(&exe),
            &format!("gcc {}", snippet.display()),
        )?;
    }
    let exe = build_example(&prefix, &root().join("example-build"), &[])?;
    expect_no_gpu(&exe)?;
    // The same program on libhalo.a (halo::halo_static): the static library links on its own.
    let exe = build_example(&prefix, &root().join("example-static-build"), &["-DHALO_LINK_STATIC=ON"])?;
    expect_no_gpu(&exe)?;
    eprintln!("xtask: capi check passed in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The C API for the GPU bundle, in `dest`: the release `libhalo.so` and `capi-cpp` built against
/// it (C++ runtime linked statically, so only the driver and `libhalo.so`, found next to it, are
/// needed there); returns the bytes copied.
pub fn for_bundle(ptx: &crate::PtxArgs, dest: &Path) -> Result<u64> {
    let prefix = root().join("bundle-prefix");
    let lib = install(ptx, &prefix, true)?;
    let exe = build_example(&prefix, &root().join("bundle-example-build"), &["-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc"])?;
    fs::create_dir_all(dest)?;
    crate::bundle::copy_stripped(&lib.join("libhalo.so"), &dest.join("libhalo.so"))?;
    crate::bundle::copy_stripped(&exe, &dest.join("capi-cpp"))?;
    Ok(fs::metadata(dest.join("libhalo.so"))?.len() + fs::metadata(dest.join("capi-cpp"))?.len())
}

/// The compiler and linker flags of halo's C API installed in `prefix`: `pkg-config --cflags --libs
/// halo` on the installed halo.pc, or (no pkg-config) what that file says, spelled out.
fn pkg_config_flags(prefix: &Path) -> Result<Vec<String>> {
    let pc = prefix.join("lib/pkgconfig");
    let out = Command::new("pkg-config").args(["--cflags", "--libs", "halo"]).env("PKG_CONFIG_PATH", &pc).output();
    match out {
        Ok(o) if o.status.success() => {
            eprintln!("xtask: the C snippets take their flags from {}/halo.pc (pkg-config)", pc.display());
            Ok(String::from_utf8(o.stdout)?.split_whitespace().map(String::from).collect())
        }
        Ok(o) => bail!("pkg-config --cflags --libs halo failed on {}/halo.pc: {}", pc.display(), String::from_utf8_lossy(&o.stderr)),
        Err(_) => {
            eprintln!("xtask: pkg-config is not installed: halo.pc is not exercised, the C snippets get its flags spelled out");
            let lib = prefix.join("lib");
            Ok(vec![
                format!("-I{}", prefix.join("include").display()),
                format!("-L{}", lib.display()),
                format!("-Wl,-rpath,{}", lib.display()),
                "-lhalo".into(),
            ])
        }
    }
}

/// Runs the example: on a machine without a GPU it must fail with halo's `HALO_NO_GPU` message
/// (and nothing else); where a GPU is present it must pass.
fn expect_no_gpu(exe: &Path) -> Result<()> {
    let out = Command::new(exe).args(["--steps", "5"]).output().with_context(|| format!("running {}", exe.display()))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    judge_run(out.status.success(), &text).with_context(|| format!("{} printed:\n{text}", exe.display()))
}

/// What a run of the example must show: a pass, or (no GPU) a failure with halo's NO_GPU message.
fn judge_run(success: bool, output: &str) -> Result<()> {
    let no_gpu = output.contains("HALO_NO_GPU") && output.contains("no GPU available");
    match (success, no_gpu) {
        (false, true) => Ok(()),
        (true, false) if output.contains("capi-cpp: PASS") => Ok(()),
        (true, _) => bail!("the example exited 0 without its PASS line"),
        (false, false) => bail!("the example failed, but not with halo's HALO_NO_GPU message"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed include/halo.h is what the sources generate (`cargo xtask capi-header`).
    #[test]
    fn the_committed_header_is_current() {
        check_header().unwrap();
    }

    #[test]
    fn the_header_declares_every_call_without_cuda_headers() {
        let h = header().unwrap();
        assert!(h.contains("typedef struct CUstream_st *CUstream;") && !h.contains("#include <cuda"), "{h}");
        for call in ["halo_local_create(", "halo_exchange_coordinates(", "halo_last_error(", "halo_plan_add_pulse(", "halo_pe_create("] {
            assert!(h.contains(call), "{call} missing");
        }
        assert!(h.contains("HALO_NO_GPU = 2"), "{h}");
    }

    #[test]
    fn a_run_passes_only_with_its_pass_line_or_halos_no_gpu_message() {
        judge_run(false, "capi-cpp: halo_check_device failed with HALO_NO_GPU: halo_check_device: no GPU available: x").unwrap();
        judge_run(true, "capi-cpp: PASS: ...").unwrap();
        assert!(judge_run(false, "capi-cpp: cudaMalloc failed: no CUDA-capable device").is_err());
        assert!(judge_run(true, "nothing").is_err());
        assert!(judge_run(false, "error while loading shared libraries: libhalo.so").is_err());
    }

    #[test]
    fn the_version_is_the_workspaces() {
        let v = version().unwrap();
        assert_eq!(v.split('.').count(), 3, "{v}");
    }
}
