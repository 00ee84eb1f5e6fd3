//! `cargo xtask build-ptx`: Rust kernels to PTX and a cubin.
//!
//! 1. `cargo +NIGHTLY build --target nvptx64-nvidia-cuda -Zbuild-std=core` with `--emit=llvm-bc`
//!    leaves one bitcode file per crate (kernels-gpu, core, compiler_builtins);
//! 2. `llvm-link` joins them with NVSHMEM's `libnvshmem_device.bc`;
//! 3. `opt` internalizes everything except the kernel entries, the ABI-version global and NVSHMEM's
//!    two module globals (which `nvshmemx_cumodule_init` looks up by name), then optimises (O3);
//! 4. `llc` lowers to PTX; `ptxas` assembles a cubin and reports registers and spills.
//!
//! A stamp over every input (sources, lock file, toolchain, NVSHMEM bitcode, arch, this pipeline)
//! makes a rebuild with unchanged inputs do nothing.

use crate::tools::{self, NIGHTLY, NVSHMEM_VERSION};
use anyhow::{Context, Result, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bump when the pipeline itself changes, so old artifacts are rebuilt.
const PIPELINE_VERSION: &str = "halo-ptx-pipeline-1";
/// PTX ISA the module is lowered to. 8.0 has `cp.async.bulk` and suits NVSHMEM 3.4.5's bitcode.
const PTX_ISA: &str = "+ptx80";
/// NVSHMEM's module globals that must survive internalization.
const NVSHMEM_GLOBALS: [&str; 2] = ["nvshmemi_device_state_d", "nvshmemi_device_lib_version_d"];

/// Options shared by every task that needs the PTX.
#[derive(Args, Clone, Debug)]
pub struct PtxOptions {
    /// GPU architecture for llc and ptxas.
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// NVSHMEM device bitcode: a folder (an NVSHMEM install or unpacked wheel), the `.bc` file, or a
    /// version to fetch from PyPI. Default: NVSHMEM_HOME when set, else the pinned wheel.
    #[arg(long)]
    pub nvshmem: Option<String>,
    /// Rebuild even when the inputs are unchanged.
    #[arg(long)]
    pub force: bool,
}

/// What the build leaves in `target/ptx/`, also written there as `<stem>.manifest.json` for the
/// host to check at load time.
#[derive(Serialize, Deserialize, Debug, Clone)]
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

/// The artifacts of a build.
pub struct Artifacts {
    pub dir: PathBuf,
    pub ptx: PathBuf,
    pub cubin: PathBuf,
    pub report: PathBuf,
    pub manifest: PathBuf,
}

pub fn build(opts: &PtxOptions) -> Result<Artifacts> {
    let root = crate::workspace_root();
    let out_dir = root.join("target/ptx");
    let stem = format!("halo_kernels.{}", opts.arch);
    let artifacts = Artifacts {
        ptx: out_dir.join(format!("{stem}.ptx")),
        cubin: out_dir.join(format!("{stem}.cubin")),
        report: out_dir.join(format!("{stem}.ptxas.txt")),
        manifest: out_dir.join(format!("{stem}.manifest.json")),
        dir: out_dir.clone(),
    };
    if !opts.arch.starts_with("sm_") || opts.arch[3..].parse::<u32>().map_or(true, |v| v < 70) {
        bail!("--arch {} is not a supported GPU architecture: use sm_70 or newer, e.g. sm_90 for H100/H200", opts.arch);
    }

    let sysroot = tools::ensure_nightly()?;
    let (nvshmem_bc, nvshmem_version) = nvshmem_bitcode(opts.nvshmem.as_deref())?;
    let stamp = input_stamp(&root, &opts.arch, &nvshmem_bc)?;
    if !opts.force {
        if let Ok(text) = fs::read_to_string(&artifacts.manifest) {
            if let Ok(m) = serde_json::from_str::<Manifest>(&text) {
                if m.stamp == stamp && artifacts.ptx.exists() && artifacts.cubin.exists() {
                    eprintln!("xtask: {} is up to date", artifacts.ptx.display());
                    return Ok(artifacts);
                }
            }
        }
    }
    fs::create_dir_all(&out_dir)?;
    let started = std::time::Instant::now();

    // 1. Bitcode of the kernel crate and of core / compiler_builtins.
    let bitcode = compile_bitcode(&root, &opts.arch)?;
    // 2-4. Link, internalize + optimise, lower.
    let llvm = tools::llvm_bin(&sysroot);
    let work = root.join("target/nvptx/link");
    fs::create_dir_all(&work)?;
    let linked = work.join("linked.bc");
    let mut link = Command::new(llvm.join("llvm-link"));
    link.args(&bitcode).arg(&nvshmem_bc).arg("-o").arg(&linked);
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
    let ptx_text = fs::read_to_string(&artifacts.ptx)?;
    check_entries(&ptx_text)?;

    // ptxas: cubin plus the register / spill report.
    let ptxas = tools::ptxas()?;
    let out = Command::new(&ptxas)
        .args([&format!("-arch={}", opts.arch), "-O3", "-v"])
        .arg(&artifacts.ptx)
        .arg("-o")
        .arg(&artifacts.cubin)
        .output()
        .with_context(|| format!("could not run {}", ptxas.display()))?;
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    fs::write(&artifacts.report, &report)?;
    if !out.status.success() {
        bail!("ptxas rejected {}:\n{report}", artifacts.ptx.display());
    }

    let manifest = Manifest {
        arch: opts.arch.clone(),
        abi_version: kernels_gpu::abi::ABI_VERSION,
        nvshmem_version,
        nvshmem_bitcode: nvshmem_bc.display().to_string(),
        toolchain: NIGHTLY.into(),
        ptx_isa: PTX_ISA.trim_start_matches('+').into(),
        entries: kernels_gpu::abi::KERNEL_ENTRIES.iter().map(|s| s.to_string()).collect(),
        stamp,
        ptx: file_name(&artifacts.ptx),
        cubin: file_name(&artifacts.cubin),
        ptxas_report: file_name(&artifacts.report),
    };
    fs::write(&artifacts.manifest, serde_json::to_string_pretty(&manifest)?)?;
    eprintln!(
        "xtask: built {} and {} in {:.1} s",
        artifacts.ptx.display(),
        file_name(&artifacts.cubin),
        started.elapsed().as_secs_f64()
    );
    Ok(artifacts)
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

fn quiet_run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("could not start {what}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("{what} failed ({}):\n{stderr}", out.status);
    }
    // llvm-link warns that NVSHMEM's data layout string differs from rustc's; it is harmless.
    for line in stderr.lines().filter(|l| !l.contains("data layout") && !l.trim().is_empty()) {
        eprintln!("{what}: {line}");
    }
    Ok(())
}

/// Builds kernels-gpu for nvptx64 and returns the bitcode files of it and its std crates.
fn compile_bitcode(root: &Path, arch: &str) -> Result<Vec<PathBuf>> {
    let target_dir = root.join("target/nvptx");
    let out = Command::new("cargo")
        .current_dir(root)
        .args([&format!("+{NIGHTLY}"), "build", "--release", "--locked", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core", "-p", "kernels-gpu", "--message-format=json-render-diagnostics"])
        .env("RUSTUP_AUTO_INSTALL", "0")
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("RUSTFLAGS", format!("--emit=llvm-bc,link -C target-cpu={arch} -C panic=abort"))
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
        .env("CARGO_PROFILE_RELEASE_LTO", "false")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("could not run cargo for the nvptx64 build")?;
    if !out.status.success() {
        bail!("compiling kernels-gpu for nvptx64-nvidia-cuda failed (see the errors above)");
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
        let Some(hashed) = in_deps else { bail!("cargo reported no deps/ artifact for {name}") };
        let stem = hashed.file_stem().unwrap_or_default().to_string_lossy();
        let bc = hashed.with_file_name(format!("{}.bc", stem.trim_start_matches("lib")));
        if !bc.exists() {
            bail!("expected bitcode {} next to {}", bc.display(), hashed.display());
        }
        files.push(bc);
    }
    if files.len() != 3 {
        bail!("expected bitcode for kernels_gpu, core and compiler_builtins, found {files:?}");
    }
    // kernels_gpu first: llvm-link keeps the first module's identification.
    files.sort_by_key(|p| !p.to_string_lossy().contains("kernels_gpu"));
    Ok(files)
}

/// Every listed kernel must be a PTX `.entry`, and every `.entry` must be listed.
fn check_entries(ptx: &str) -> Result<()> {
    let found: Vec<&str> = ptx
        .lines()
        .filter_map(|l| l.split(".entry").nth(1))
        .map(|rest| rest.trim().trim_end_matches('(').trim())
        .collect();
    let listed = kernels_gpu::abi::KERNEL_ENTRIES;
    let missing: Vec<_> = listed.iter().filter(|e| !found.contains(e)).collect();
    let unlisted: Vec<_> = found.iter().filter(|e| !listed.contains(e)).collect();
    if !missing.is_empty() || !unlisted.is_empty() {
        bail!("PTX entries do not match abi::KERNEL_ENTRIES: missing {missing:?}, not listed {unlisted:?}");
    }
    Ok(())
}

/// NVSHMEM's device bitcode and its version.
fn nvshmem_bitcode(choice: Option<&str>) -> Result<(PathBuf, String)> {
    let from_root = |root: &Path| -> Result<(PathBuf, String)> {
        let bc = if root.is_file() { root.to_path_buf() } else { root.join("lib/libnvshmem_device.bc") };
        if !bc.exists() {
            bail!("no libnvshmem_device.bc at {}", bc.display());
        }
        let header = bc.parent().and_then(Path::parent).map(|r| r.join("include/non_abi/nvshmem_version.h"));
        let version = header.and_then(|h| fs::read_to_string(h).ok()).and_then(|t| parse_version_header(&t));
        Ok((bc, version.unwrap_or_else(|| "unknown".into())))
    };
    match choice {
        Some(c) if Path::new(c).exists() => from_root(Path::new(c)),
        Some(version) if version.chars().all(|ch| ch.is_ascii_digit() || ch == '.') => {
            from_root(&tools::pip_install(&format!("nvidia-nvshmem-cu13=={version}"))?.join("nvidia/nvshmem"))
        }
        Some(other) => bail!("--nvshmem {other}: neither an existing path nor a version like {NVSHMEM_VERSION}"),
        None => match std::env::var("NVSHMEM_HOME") {
            Ok(home) => from_root(Path::new(&home)).with_context(|| format!("NVSHMEM_HOME={home}")),
            Err(_) => from_root(&tools::pip_install(&format!("nvidia-nvshmem-cu13=={NVSHMEM_VERSION}"))?.join("nvidia/nvshmem")),
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
    Some(format!(
        "{}.{}.{}",
        get("NVSHMEM_VENDOR_MAJOR_VERSION")?,
        get("NVSHMEM_VENDOR_MINOR_VERSION")?,
        get("NVSHMEM_VENDOR_PATCH_VERSION")?
    ))
}

/// A digest of everything the PTX depends on.
fn input_stamp(root: &Path, arch: &str, nvshmem_bc: &Path) -> Result<String> {
    let mut h = Sha256::new();
    h.update(PIPELINE_VERSION);
    h.update(NIGHTLY);
    h.update(arch);
    h.update(PTX_ISA);
    let meta = fs::metadata(nvshmem_bc)?;
    h.update(nvshmem_bc.display().to_string());
    h.update(meta.len().to_le_bytes());
    let mut files = vec![root.join("Cargo.lock"), root.join("Cargo.toml"), root.join("kernels-gpu/Cargo.toml")];
    collect_files(&root.join("kernels-gpu/src"), &mut files)?;
    files.sort();
    for f in files {
        h.update(f.strip_prefix(root).unwrap_or(&f).display().to_string());
        h.update(fs::read(&f).with_context(|| format!("reading {}", f.display()))?);
    }
    Ok(format!("{:x}", h.finalize()))
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_files(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}
