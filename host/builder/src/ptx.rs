//! The pipeline: Rust kernels to PTX and a cubin.
//!
//! 1. `cargo +NIGHTLY build --target nvptx64-nvidia-cuda -Zbuild-std=core` with `--emit=llvm-bc`
//!    leaves one bitcode file per crate (kernels-gpu, core, compiler_builtins);
//! 2. `llvm-link` joins them with NVSHMEM's `libnvshmem_device.bc`;
//! 3. `opt` internalizes everything except the kernel entries, the ABI-version global and NVSHMEM's
//!    two module globals (which `nvshmemx_cumodule_init` looks up by name), then optimises (O3);
//! 4. `llc` lowers to PTX; `ptxas` assembles a cubin and reports registers and spills.
//!
//! A stamp over every input (sources, the kernel crate's locked dependencies, the workspace's
//! profiles, toolchain, NVSHMEM bitcode, arch, this pipeline) names the artifacts' folder in the
//! cache, so a rebuild with unchanged inputs does nothing and every caller finds the same files.

use crate::stamp::input_stamp;
use crate::tools::{self, NIGHTLY, NVSHMEM_VERSION, Nightly};
use crate::{BuildError, IoContext, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bump when the pipeline itself changes, so old artifacts are rebuilt.
pub(crate) const PIPELINE_VERSION: &str = "halo-ptx-pipeline-1";
/// PTX ISA the module is lowered to. 8.0 has `cp.async.bulk` and suits NVSHMEM 3.4.5's bitcode.
pub(crate) const PTX_ISA: &str = "+ptx80";
/// NVSHMEM's module globals that must survive internalization.
const NVSHMEM_GLOBALS: [&str; 2] = ["nvshmemi_device_state_d", "nvshmemi_device_lib_version_d"];

/// What to build.
#[derive(Clone, Debug)]
pub struct PtxOptions {
    /// GPU architecture for llc and ptxas.
    pub arch: String,
    /// NVSHMEM device bitcode: a folder (an NVSHMEM install or unpacked wheel), the `.bc` file, or a
    /// version to fetch from PyPI. Default: NVSHMEM_HOME when set, else the pinned wheel.
    pub nvshmem: Option<String>,
    /// Rebuild even when the inputs are unchanged.
    pub force: bool,
}

impl Default for PtxOptions {
    /// `sm_90` (H100/H200), NVSHMEM from `NVSHMEM_HOME` or the pinned wheel, no forced rebuild.
    fn default() -> Self {
        Self { arch: "sm_90".into(), nvshmem: None, force: false }
    }
}

/// What the build leaves next to the PTX as `<stem>.manifest.json`, for the host to check at load
/// time.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[allow(missing_docs)]
pub struct Manifest {
    pub arch: String,
    pub abi_version: u32,
    pub nvshmem_version: String,
    pub nvshmem_bitcode: String,
    pub toolchain: String,
    pub ptx_isa: String,
    pub entries: Vec<String>,
    pub stamp: String,
    pub ptx: String,
    pub cubin: String,
    pub ptxas_report: String,
}

/// The four files of a build, in one folder.
#[derive(Clone, Debug)]
pub struct Artifacts {
    /// The folder.
    pub dir: PathBuf,
    /// `halo_kernels.<arch>.ptx`.
    pub ptx: PathBuf,
    /// `halo_kernels.<arch>.cubin`.
    pub cubin: PathBuf,
    /// `halo_kernels.<arch>.ptxas.txt`: registers and spills per kernel.
    pub report: PathBuf,
    /// `halo_kernels.<arch>.manifest.json`: ABI version, arch, NVSHMEM version, entries, stamp.
    pub manifest: PathBuf,
}

/// Builds the kernels for `opts.arch`, or finds them in the cache when nothing changed.
pub fn build(opts: &PtxOptions) -> Result<Artifacts> {
    let root = crate::source_root();
    let cache = crate::cache_dir();
    if !opts.arch.starts_with("sm_") || opts.arch[3..].parse::<u32>().map_or(true, |v| v < 70) {
        return Err(BuildError::Invalid(format!(
            "--arch {} is not a supported GPU architecture: use sm_70 or newer, e.g. sm_90 for H100/H200",
            opts.arch
        )));
    }

    let nightly = tools::ensure_nightly()?;
    let (nvshmem_bc, nvshmem_version) = nvshmem_bitcode(opts.nvshmem.as_deref(), &cache)?;
    let stamp = input_stamp(&root, &opts.arch, &nvshmem_bc, &nvshmem_version)?;
    let store = cache.join("halo-ptx");
    let artifacts = Artifacts::in_dir(&store.join(format!("{}-{}", opts.arch, &stamp[..16])), &opts.arch);
    if !opts.force && artifacts.complete(&stamp) {
        eprintln!("halo-builder: {} is up to date", artifacts.ptx.display());
        return Ok(artifacts);
    }
    // Built in a private folder and renamed into place, so concurrent builds (a build script and
    // the xtask, two target dirs) never see half a set.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let work = store.join(format!(".build-{}-{nanos}", std::process::id()));
    fs::create_dir_all(&work).at("creating", &work)?;
    let result = build_into(&root, &cache, &nightly, opts, &nvshmem_bc, nvshmem_version, stamp, &work);
    let built = match result {
        Ok(built) => built,
        Err(e) => {
            let _ = fs::remove_dir_all(&work);
            return Err(e);
        }
    };
    if opts.force && artifacts.dir.exists() {
        fs::remove_dir_all(&artifacts.dir).at("removing", &artifacts.dir)?;
    }
    for f in [&built.linked, &built.optimized] {
        let _ = fs::remove_file(f);
    }
    if let Err(e) = fs::rename(&work, &artifacts.dir) {
        // Another build finished the same stamp first: its files are as good as ours.
        let _ = fs::remove_dir_all(&work);
        if !artifacts.complete(&built.stamp) {
            return Err(BuildError::Io { what: "moving the built kernels to", path: artifacts.dir.clone(), source: e });
        }
    }
    Ok(artifacts)
}

/// Intermediate files of [`build_into`] (removed before the folder is published).
struct Built {
    stamp: String,
    linked: PathBuf,
    optimized: PathBuf,
}

#[allow(clippy::too_many_arguments)]
fn build_into(
    root: &Path,
    cache: &Path,
    nightly: &Nightly,
    opts: &PtxOptions,
    nvshmem_bc: &Path,
    nvshmem_version: String,
    stamp: String,
    work: &Path,
) -> Result<Built> {
    let artifacts = Artifacts::in_dir(work, &opts.arch);
    let started = std::time::Instant::now();

    // 1. Bitcode of the kernel crate and of core / compiler_builtins.
    let bitcode = compile_bitcode(root, nightly, &opts.arch, &cache.join("nvptx"))?;
    // 2-4. Link, internalize + optimise, lower.
    let llvm = nightly.llvm_bin();
    let linked = work.join("linked.bc");
    let mut link = Command::new(llvm.join("llvm-link"));
    link.args(&bitcode).arg(nvshmem_bc).arg("-o").arg(&linked);
    quiet_run(&mut link, "llvm-link")?;

    let mut public: Vec<&str> = kernels_gpu::abi::KERNEL_ENTRIES.to_vec();
    public.push(kernels_gpu::abi::ABI_VERSION_SYMBOL);
    public.extend(NVSHMEM_GLOBALS);
    let optimized = work.join("optimized.bc");
    quiet_run(
        Command::new(llvm.join("opt"))
            .arg("-passes=internalize,default<O3>,globaldce")
            .arg(format!("--internalize-public-api-list={}", public.join(",")))
            .arg(&linked)
            .arg("-o")
            .arg(&optimized),
        "opt",
    )?;
    quiet_run(
        Command::new(llvm.join("llc"))
            .args(["-O3", &format!("-mcpu={}", opts.arch), &format!("-mattr={PTX_ISA}")])
            .arg(&optimized)
            .arg("-o")
            .arg(&artifacts.ptx),
        "llc",
    )?;
    let ptx_text = fs::read_to_string(&artifacts.ptx).at("reading", &artifacts.ptx)?;
    check_entries(&ptx_text)?;

    // ptxas: cubin plus the register / spill report.
    let ptxas = tools::ptxas(cache)?;
    let out = Command::new(&ptxas)
        .args([&format!("-arch={}", opts.arch), "-O3", "-v"])
        .arg(&artifacts.ptx)
        .arg("-o")
        .arg(&artifacts.cubin)
        .output()
        .map_err(|source| BuildError::Start { what: format!("ptxas ({})", ptxas.display()), source })?;
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    fs::write(&artifacts.report, &report).at("writing", &artifacts.report)?;
    if !out.status.success() {
        return Err(BuildError::Failed { what: format!("ptxas on {}", artifacts.ptx.display()), status: out.status, output: report });
    }

    let manifest = Manifest {
        arch: opts.arch.clone(),
        abi_version: kernels_gpu::abi::ABI_VERSION,
        nvshmem_version,
        nvshmem_bitcode: nvshmem_bc.display().to_string(),
        toolchain: NIGHTLY.into(),
        ptx_isa: PTX_ISA.trim_start_matches('+').into(),
        entries: kernels_gpu::abi::KERNEL_ENTRIES.iter().map(|s| s.to_string()).collect(),
        stamp: stamp.clone(),
        ptx: file_name(&artifacts.ptx),
        cubin: file_name(&artifacts.cubin),
        ptxas_report: file_name(&artifacts.report),
    };
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| BuildError::Invalid(format!("encoding the manifest: {e}")))?;
    fs::write(&artifacts.manifest, text).at("writing", &artifacts.manifest)?;
    eprintln!("halo-builder: built {} and {} in {:.1} s", file_name(&artifacts.ptx), file_name(&artifacts.cubin), started.elapsed().as_secs_f64());
    Ok(Built { stamp, linked, optimized })
}

pub(crate) fn file_name(p: &Path) -> String {
    p.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

fn quiet_run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().map_err(|source| BuildError::Start { what: what.into(), source })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(BuildError::Failed { what: what.into(), status: out.status, output: stderr.into_owned() });
    }
    // llvm-link warns that NVSHMEM's data layout string differs from rustc's; it is harmless.
    for line in stderr.lines().filter(|l| !l.contains("data layout") && !l.trim().is_empty()) {
        eprintln!("{what}: {line}");
    }
    Ok(())
}

/// Builds kernels-gpu for nvptx64 in `target_dir` and returns the bitcode files of it and its std
/// crates. The nightly's own cargo and rustc run with none of the variables an outer cargo gives
/// a build script ([`crate::leaks_into_nested_cargo`]).
fn compile_bitcode(root: &Path, nightly: &Nightly, arch: &str, target_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut cmd = Command::new(nightly.cargo());
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(crate::leaks_into_nested_cargo) {
            cmd.env_remove(&name);
        }
    }
    let out = cmd
        .current_dir(root)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "nvptx64-nvidia-cuda",
            "-Zbuild-std=core",
            "-p",
            "kernels-gpu",
            "--message-format=json-render-diagnostics",
        ])
        .env("RUSTUP_AUTO_INSTALL", "0")
        .env("RUSTC", nightly.rustc())
        .env("CARGO_TARGET_DIR", target_dir)
        .env("RUSTFLAGS", format!("--emit=llvm-bc,link -C target-cpu={arch} -C panic=abort"))
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .env("CARGO_PROFILE_RELEASE_INCREMENTAL", "false")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|source| BuildError::Start { what: format!("{} for the nvptx64 build", nightly.cargo().display()), source })?;
    if !out.status.success() {
        return Err(BuildError::Failed {
            what: "compiling kernels-gpu for nvptx64-nvidia-cuda (see the errors above)".into(),
            status: out.status,
            output: String::new(),
        });
    }
    // Each compiled crate reports deps/lib<name>-<hash>.rmeta; its bitcode is deps/<name>-<hash>.bc.
    let mut files = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let name = msg["target"]["name"].as_str().unwrap_or_default();
        if msg["reason"] != "compiler-artifact" || !["kernels_gpu", "core", "compiler_builtins"].contains(&name) {
            continue;
        }
        let in_deps = msg["filenames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str())
            .map(Path::new)
            .find(|p| p.parent().is_some_and(|d| d.ends_with("deps")));
        let Some(hashed) = in_deps else { return Err(BuildError::Invalid(format!("cargo reported no deps/ artifact for {name}"))) };
        let stem = hashed.file_stem().unwrap_or_default().to_string_lossy();
        let bc = hashed.with_file_name(format!("{}.bc", stem.trim_start_matches("lib")));
        if !bc.exists() {
            return Err(BuildError::Invalid(format!("expected bitcode {} next to {}", bc.display(), hashed.display())));
        }
        files.push(bc);
    }
    if files.len() != 3 {
        return Err(BuildError::Invalid(format!("expected bitcode for kernels_gpu, core and compiler_builtins, found {files:?}")));
    }
    // kernels_gpu first: llvm-link keeps the first module's identification.
    files.sort_by_key(|p| !p.to_string_lossy().contains("kernels_gpu"));
    Ok(files)
}

/// Every listed kernel must be a PTX `.entry`, and every `.entry` must be listed.
fn check_entries(ptx: &str) -> Result<()> {
    let found: Vec<&str> = ptx.lines().filter_map(|l| l.split(".entry").nth(1)).map(|rest| rest.trim().trim_end_matches('(').trim()).collect();
    let listed = kernels_gpu::abi::KERNEL_ENTRIES;
    let missing: Vec<_> = listed.iter().filter(|e| !found.contains(e)).collect();
    let unlisted: Vec<_> = found.iter().filter(|e| !listed.contains(e)).collect();
    if !missing.is_empty() || !unlisted.is_empty() {
        return Err(BuildError::Invalid(format!("PTX entries do not match abi::KERNEL_ENTRIES: missing {missing:?}, not listed {unlisted:?}")));
    }
    Ok(())
}

/// NVSHMEM's device bitcode and its version.
fn nvshmem_bitcode(choice: Option<&str>, cache: &Path) -> Result<(PathBuf, String)> {
    let from_root = |root: &Path| -> Result<(PathBuf, String)> {
        let bc = if root.is_file() { root.to_path_buf() } else { root.join("lib/libnvshmem_device.bc") };
        if !bc.exists() {
            return Err(BuildError::Missing {
                what: format!("libnvshmem_device.bc at {}", bc.display()),
                hint: "point --nvshmem or NVSHMEM_HOME at an NVSHMEM install, or unset it to fetch the pinned wheel".into(),
            });
        }
        let header = bc.parent().and_then(Path::parent).map(|r| r.join("include/non_abi/nvshmem_version.h"));
        let version = header.and_then(|h| fs::read_to_string(h).ok()).and_then(|t| parse_version_header(&t));
        Ok((bc, version.unwrap_or_else(|| "unknown".into())))
    };
    match choice {
        Some(c) if Path::new(c).exists() => from_root(Path::new(c)),
        Some(version) if version.chars().all(|ch| ch.is_ascii_digit() || ch == '.') => {
            from_root(&tools::pip_install(cache, &format!("nvidia-nvshmem-cu13=={version}"))?.join("nvidia/nvshmem"))
        }
        Some(other) => Err(BuildError::Invalid(format!("--nvshmem {other}: neither an existing path nor a version like {NVSHMEM_VERSION}"))),
        None => match std::env::var("NVSHMEM_HOME") {
            Ok(home) => from_root(Path::new(&home)),
            Err(_) => from_root(&tools::pip_install(cache, &format!("nvidia-nvshmem-cu13=={NVSHMEM_VERSION}"))?.join("nvidia/nvshmem")),
        },
    }
}

/// `MAJOR.MINOR.PATCH` from NVSHMEM's `nvshmem_version.h`.
fn parse_version_header(text: &str) -> Option<String> {
    let get = |key: &str| {
        text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some("#define") && it.next() == Some(key)).then(|| it.next().map(str::to_owned)).flatten()
        })
    };
    Some(format!("{}.{}.{}", get("NVSHMEM_VENDOR_MAJOR_VERSION")?, get("NVSHMEM_VENDOR_MINOR_VERSION")?, get("NVSHMEM_VENDOR_PATCH_VERSION")?))
}
