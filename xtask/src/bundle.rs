//! `cargo xtask bundle`: everything a GPU machine without Rust or network needs to run halo and its
//! GPU tests, in `target/bundle/`: `halo`, `stencil3d`, the downstream fixture `halo-downstream`,
//! the GPU test binaries in `tests/`, the kernels in `ptx/` (the binaries embed the same ones),
//! `run-gpu-tests.sh` (every GPU test, with a summary), `gpu-suite.sh` and its table
//! `gpu-suites.txt` (the GPU suites: `gpu-suite.sh NAME [--long]`), `COMMIT`, with `--with-ucx` the UCX libraries in `ucx/`, and with `--mpi` MPICH's and
//! Open MPI's launchers in `mpi/` (outside the bundle's own budget, inside what travels). With
//! `capi/` holds the C API's `libhalo.so` and the C++ example `capi-cpp` built against it. With
//! `--archive` it also writes `target/bundle.tar.xz` (the system `tar -cJf`), which is what travels
//! when the folder itself is too large: unpack it there with `tar -xJf bundle.tar.xz`.

use crate::PtxArgs;
use anyhow::{Context, Result, bail};
use halo_builder::{Artifacts, run};
use std::fs;
use std::path::{Path, PathBuf};

/// The bundle's own budget when the folder travels as it is. Every binary embeds the kernels (PTX
/// and cubin), so the folder is about 65 MiB now; the GPU machines' copy limit is 64 MiB, working
/// tree included, so a folder this large travels compressed (`--archive`: `tar -cJf`, about 6 MB).
const MAX_BUNDLE_BYTES: u64 = 64 << 20;
/// With `--mpi`, the MPI launchers' own budget on top (MPICH's launcher is 2 MiB and its MPI
/// library with what it loads 19 MiB, Open MPI's launcher, libraries and data about 17 MiB); the
/// whole must still travel.
const MAX_MPI_BYTES: u64 = 42 << 20;
/// The copy limit of the GPU machines, working tree included: what travels (the folder, or with
/// `--archive` the compressed archive) must stay under it.
const MAX_CARRIED_BYTES: u64 = 62 << 20;
/// Where `--archive` writes the compressed bundle (relative to the workspace root).
pub const ARCHIVE: &str = "target/bundle.tar.xz";
/// Integration tests that need a GPU (each skips loudly without one, and fails instead when
/// `HALO_REQUIRE_GPUS` promises the GPUs it needs, as run-gpu-tests.sh sets).
const GPU_TESTS: &[&str] = &[
    "gpu_kernels",
    "gpu_exchange",
    "gpu_faults",
    "gpu_md",
    "gpu_nbnxm",
    "gpu_grid",
    "gpu_migrate",
    "gpu_merge",
    "gpu_redecompose",
    "gpu_select",
    "stencil3d_gpu",
    "gpu_pes",
    "gpu_multiprocess",
    "gpu_attach",
    "gpu_capi",
    "gpu_capi_attach",
    "gpu_capi_pes",
];
/// The packages those tests belong to.
const GPU_TEST_PACKAGES: &[&str] = &["halo", "halo-md", "stencil3d", "halo-cli", "halo-capi"];

pub fn assemble(ptx: &PtxArgs, artifacts: &Artifacts, ucx: Option<&Path>, with_mpi: bool, archive: bool) -> Result<()> {
    let root = crate::workspace_root();
    let bundle = root.join("target/bundle");
    if bundle.exists() {
        fs::remove_dir_all(&bundle)?;
    }
    fs::create_dir_all(bundle.join("tests"))?;

    run(ptx.cargo().args(["build", "--release", "--locked", "-p", "halo-cli", "-p", "stencil3d"]), "cargo build --release")?;
    for bin in ["halo", "stencil3d"] {
        copy_stripped(&root.join("target/release").join(bin), &bundle.join(bin))?;
    }
    copy_stripped(&crate::build_downstream(ptx, true)?, &bundle.join("halo-downstream"))?;
    let capi = crate::capi::for_bundle(ptx, &bundle.join("capi"))?;
    eprintln!("xtask: the C API and its C++ example in {} ({:.1} MiB)", bundle.join("capi").display(), capi as f64 / (1 << 20) as f64);
    artifacts.copy_to(&bundle.join("ptx"))?;
    for (name, exe) in test_executables(ptx, &root)? {
        copy_stripped(&exe, &bundle.join("tests").join(&name))?;
    }
    if let Some(ucx) = ucx {
        copy_tree(ucx, &bundle.join("ucx"))?;
    }
    for (name, text) in [("run-gpu-tests.sh", RUN_GPU_TESTS), ("gpu-suite.sh", GPU_SUITE)] {
        let script = bundle.join(name);
        fs::write(&script, text)?;
        set_executable(&script)?;
    }
    let table = check_suites(GPU_SUITES, GPU_SUITE).map_err(anyhow::Error::msg)?;
    eprintln!("xtask: {table}");
    fs::write(bundle.join("gpu-suites.txt"), GPU_SUITES)?;
    fs::write(bundle.join("COMMIT"), commit(&root))?;

    // The folder's own budget matters where the folder itself travels; an archive is held to the
    // copy limit by its compressed size below.
    let size = dir_size(&bundle)?;
    if size > MAX_BUNDLE_BYTES && !archive {
        bail!("the bundle is {} MiB, over the {} MiB budget: build it with `cargo xtask bundle --archive`", size >> 20, MAX_BUNDLE_BYTES >> 20);
    }
    let mut total = size;
    if with_mpi {
        // The `mpi` feature's example, run as `mpi/mpich/bin/mpiexec -n 2 mpi_exchange` with
        // LD_LIBRARY_PATH=mpi/mpich/lib.
        let env = crate::mpi::feature_env()?;
        let mut build = ptx.cargo();
        build.args(["build", "--release", "--locked", "-p", "halo", "--features", "mpi", "--example", "mpi_exchange"]).envs(env);
        run(&mut build, "cargo build --release --example mpi_exchange --features mpi")?;
        copy_stripped(&root.join("target/release/examples/mpi_exchange"), &bundle.join("mpi_exchange"))?;
        total += fs::metadata(bundle.join("mpi_exchange"))?.len();
        let mpi = crate::mpi::copy_for_bundle(&bundle.join("mpi"))?;
        if mpi > MAX_MPI_BYTES {
            bail!("the MPI launchers take {} MiB, over their {} MiB budget", mpi >> 20, MAX_MPI_BYTES >> 20);
        }
        total += mpi;
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    if archive {
        let out = root.join(ARCHIVE);
        let packed = write_archive(&bundle, &out)?;
        if packed > MAX_CARRIED_BYTES {
            bail!("{} is {:.1} MiB: over the {} MiB that travel", out.display(), mib(packed), MAX_CARRIED_BYTES >> 20);
        }
        eprintln!("xtask: bundle ready in {} ({:.1} MiB), compressed in {} ({:.1} MiB)", bundle.display(), mib(total), out.display(), mib(packed));
    } else {
        if total > MAX_CARRIED_BYTES {
            bail!(
                "the bundle is {:.1} MiB in all, over the {} MiB that travel uncompressed: build it with `cargo xtask bundle --archive` and carry {ARCHIVE}",
                mib(total),
                MAX_CARRIED_BYTES >> 20
            );
        }
        eprintln!("xtask: bundle ready in {} ({:.1} MiB)", bundle.display(), mib(total));
    }
    Ok(())
}

/// Writes `bundle` (the folder) as an xz-compressed tar at `out` with the system `tar -cJf`, the
/// folder named `bundle` inside; returns the archive's size.
fn write_archive(bundle: &Path, out: &Path) -> Result<u64> {
    let (parent, name) = match (bundle.parent(), bundle.file_name()) {
        (Some(p), Some(n)) => (p, n),
        _ => bail!("{} has no parent folder to archive it from", bundle.display()),
    };
    if out.exists() {
        fs::remove_file(out).with_context(|| format!("removing the old {}", out.display()))?;
    }
    let mut tar = std::process::Command::new("tar");
    tar.arg("-cJf").arg(out).arg("-C").arg(parent).arg(name);
    let status = tar.status().context("running `tar` (install tar and xz, or build without --archive)")?;
    if !status.success() {
        bail!("`tar -cJf {}` failed ({status}): is xz installed?", out.display());
    }
    Ok(fs::metadata(out).with_context(|| format!("reading {}", out.display()))?.len())
}

/// Builds the GPU test binaries in release mode and returns (test name, executable).
fn test_executables(ptx: &PtxArgs, root: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut cmd = ptx.cargo();
    cmd.args(["test", "--release", "--locked", "--no-run", "--message-format=json-render-diagnostics"]);
    for p in GPU_TEST_PACKAGES {
        cmd.args(["-p", p]);
    }
    for t in GPU_TESTS {
        cmd.args(["--test", t]);
    }
    let out = cmd.stderr(std::process::Stdio::inherit()).output().context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the GPU tests failed");
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let name = msg["target"]["name"].as_str().unwrap_or_default();
        if msg["reason"] == "compiler-artifact"
            && GPU_TESTS.contains(&name)
            && let Some(exe) = msg["executable"].as_str()
        {
            found.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    if found.len() != GPU_TESTS.len() {
        bail!("expected test executables {GPU_TESTS:?} under {}, found {found:?}", root.display());
    }
    Ok(found)
}

/// Copies a binary without its debug sections (`strip` when available, a plain copy otherwise).
pub(crate) fn copy_stripped(from: &Path, to: &Path) -> Result<()> {
    let stripped = std::process::Command::new("strip").arg("-o").arg(to).arg(from).status().map(|s| s.success()).unwrap_or(false);
    if !stripped {
        fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    }
    set_executable(to)
}

/// Copies a file, or the files under a folder (not its dot-files: fetch stamps), to `to`, following
/// symbolic links and keeping modes; returns the bytes copied.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<u64> {
    let meta = fs::metadata(from).with_context(|| format!("reading {}", from.display()))?;
    if !meta.is_dir() {
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)?;
        }
        return fs::copy(from, to).with_context(|| format!("copying {}", from.display()));
    }
    fs::create_dir_all(to)?;
    let mut total = 0;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        total += copy_tree(&entry.path(), &to.join(&name))?;
    }
    Ok(total)
}

fn set_executable(p: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        total += if entry.file_type()?.is_dir() { dir_size(&entry.path())? } else { entry.metadata()?.len() };
    }
    Ok(total)
}

/// The GPU test runner (`run-gpu-tests.sh`): every GPU test binary, bounded, then a summary.
pub const RUN_GPU_TESTS: &str = include_str!("run-gpu-tests.sh");
/// The GPU suite driver (`gpu-suite.sh`) and its table of suites (`gpu-suites.txt`).
pub const GPU_SUITE: &str = include_str!("gpu-suite.sh");
pub const GPU_SUITES: &str = include_str!("gpu-suites.txt");

/// The commit the bundle is built from (`git describe --always --dirty`), for the suites' machine
/// block; "unknown" outside a git checkout.
fn commit(root: &Path) -> String {
    let out = std::process::Command::new("git").arg("-C").arg(root).args(["describe", "--always", "--dirty", "--abbrev=12"]).output();
    match out {
        Ok(o) if o.status.success() => format!("{}\n", String::from_utf8_lossy(&o.stdout).trim()),
        _ => "unknown\n".into(),
    }
}

/// One command of the suite table (`gpu-suites.txt`).
#[derive(Debug)]
pub struct SuiteLine<'a> {
    pub suite: &'a str,
    pub long: bool,
    pub seconds: u32,
    pub gpus: u32,
    /// The exit status that passes; `None` for any non-zero one (`nz`).
    pub expect: Option<i32>,
    /// The command's words after its NAME=VALUE words.
    pub words: Vec<&'a str>,
}

/// Parses the suite table: every line that is not blank or a comment, or the first bad line's
/// number and what is wrong with it.
pub fn parse_suites(table: &str) -> std::result::Result<Vec<SuiteLine<'_>>, String> {
    let mut lines = Vec::new();
    for (i, line) in table.lines().enumerate() {
        let bad = |why: &str| format!("gpu-suites.txt line {}: {why}: {line}", i + 1);
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        if line.contains(['"', '\'', '`', '$', ';', '|', '&', '>', '<']) {
            return Err(bad("quotes and shell syntax are not split as a shell would: use words and placeholders"));
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() < 6 {
            return Err(bad("expected SUITE TIER SECONDS GPUS EXPECT COMMAND"));
        }
        let long = match w[1] {
            "default" => false,
            "long" => true,
            _ => return Err(bad("the tier is `default` or `long`")),
        };
        let seconds = w[2].parse().ok().filter(|&s| s > 0).ok_or_else(|| bad("SECONDS is a positive number"))?;
        let gpus = w[3].parse().ok().filter(|&g| g > 0).ok_or_else(|| bad("GPUS is a positive number"))?;
        let expect = match w[4] {
            "nz" => None,
            e => Some(e.parse().map_err(|_| bad("EXPECT is an exit status or `nz`"))?),
        };
        let words: Vec<&str> = w[5..]
            .iter()
            .copied()
            .skip_while(|x| {
                x.split_once('=').is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            })
            .collect();
        if words.is_empty() {
            return Err(bad("no command after the environment"));
        }
        lines.push(SuiteLine { suite: w[0], long, seconds, gpus, expect, words });
    }
    Ok(lines)
}

/// Checks the suite table against the bundle: every `tests` line names GPU test binaries it holds,
/// every `call` a function `gpu-suite.sh` defines. Returns a one-line account of the table.
pub fn check_suites(table: &str, driver: &str) -> std::result::Result<String, String> {
    let lines = parse_suites(table)?;
    for l in &lines {
        let at = format!("gpu-suites.txt, suite {}: {}", l.suite, l.words.join(" "));
        match l.words[0] {
            "tests" => {
                let bins: Vec<&str> = l.words[1..].iter().copied().take_while(|w| *w != "--").collect();
                if bins.is_empty() {
                    return Err(format!("{at}: `tests` names no binary"));
                }
                if let Some(b) = bins.iter().find(|b| !(**b == "all" || **b == "halo-downstream" || GPU_TESTS.contains(b))) {
                    return Err(format!("{at}: {b} is not a GPU test binary of the bundle ({GPU_TESTS:?})"));
                }
            }
            "call" => match l.words.get(1) {
                Some(f) if driver.contains(&format!("\n{f}() {{")) => {}
                _ => return Err(format!("{at}: gpu-suite.sh defines no such function")),
            },
            "halo" | "ucx" | "mpich" | "ompi" | "stencil3d" | "halo-downstream" | "capi-cpp" => {}
            other => return Err(format!("{at}: unknown command {other}")),
        }
    }
    let mut suites: Vec<&str> = lines.iter().map(|l| l.suite).collect();
    suites.dedup();
    let default_s: u32 = lines.iter().filter(|l| !l.long).map(|l| l.seconds).sum();
    Ok(format!(
        "gpu-suites.txt: {} suites, {} commands ({} long-tier), up to {} GPUs, {} that must fail, {} s of default-tier limits",
        suites.len(),
        lines.len(),
        lines.iter().filter(|l| l.long).count(),
        lines.iter().map(|l| l.gpus).max().unwrap_or(0),
        lines.iter().filter(|l| l.expect != Some(0)).count(),
        default_s
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `halo`'s subcommands, read from the CLI's `Command` enum (`ExchangeCheck` is `exchange-check`).
    fn halo_subcommands() -> Vec<String> {
        let src = fs::read_to_string(crate::workspace_root().join("host/cli/src/cli/mod.rs")).unwrap();
        let body = &src[src.find("enum Command").expect("the CLI's Command enum")..];
        let body = &body[..body.find("\n}").unwrap()];
        body.lines()
            .filter_map(|l| {
                let l = l.trim();
                let name = l.split(['(', ',', ' ', '{']).next()?;
                (!l.starts_with("//") && !l.starts_with('#') && name.chars().next()?.is_ascii_uppercase()).then_some(name)
            })
            .map(|n| {
                n.chars().enumerate().fold(String::new(), |mut s, (i, c)| {
                    if c.is_ascii_uppercase() && i > 0 {
                        s.push('-');
                    }
                    s.push(c.to_ascii_lowercase());
                    s
                })
            })
            .collect()
    }

    /// The word after `halo`'s options that take no subcommand position: `halo launch ... -- SUB`.
    fn check_halo(words: &[&str], subs: &[String]) -> std::result::Result<(), String> {
        let sub = words.first().ok_or("`halo` with no subcommand")?;
        if !subs.iter().any(|s| s == sub) {
            return Err(format!("`halo {sub}` is not a halo subcommand ({subs:?})"));
        }
        if *sub == "launch" && !words.contains(&"--exe") {
            let after = words.iter().position(|w| *w == "--").ok_or("`halo launch` without `--`")?;
            return check_halo(&words[after + 1..], subs);
        }
        Ok(())
    }

    #[test]
    fn the_suite_table_parses_and_every_command_names_what_the_bundle_holds() {
        let account = check_suites(GPU_SUITES, GPU_SUITE).unwrap_or_else(|e| panic!("{e}"));
        assert!(account.contains("11 suites"), "{account}");
        let lines = parse_suites(GPU_SUITES).unwrap_or_else(|e| panic!("{e}"));
        let subs = halo_subcommands();
        assert!(subs.iter().any(|s| s == "exchange-check") && subs.iter().any(|s| s == "md-bench"), "{subs:?}");
        let placeholders = ["@OUT", "@B", "@GPUS"];
        for l in &lines {
            let at = format!("{} ({:?})", l.suite, l.words);
            for w in &l.words {
                if let Some(i) = w.find('@') {
                    assert!(
                        placeholders.iter().any(|p| w[i..].starts_with(p)) || w.contains(":3@") || w[..i].contains(':'),
                        "{at}: unknown placeholder in {w}"
                    );
                }
            }
            let rest = &l.words[1..];
            match l.words[0] {
                "tests" => {
                    let bins: Vec<&&str> = rest.iter().take_while(|w| **w != "--").collect();
                    assert!(!bins.is_empty(), "{at}: `tests` names no binary");
                    for b in bins {
                        assert!(
                            *b == "all" || *b == "halo-downstream" || GPU_TESTS.contains(b),
                            "{at}: {b} is not a GPU test binary of the bundle ({GPU_TESTS:?})"
                        );
                    }
                }
                "halo" => check_halo(rest, &subs).unwrap_or_else(|e| panic!("{at}: {e}")),
                "ucx" => {
                    assert_eq!(rest.first(), Some(&"halo"), "{at}: ucx runs halo");
                    check_halo(&rest[1..], &subs).unwrap_or_else(|e| panic!("{at}: {e}"));
                }
                // MPICH also runs the `mpi` feature's example, which `bundle --mpi` carries.
                "mpich" if rest.last() == Some(&"@B/mpi_exchange") => {}
                "mpich" | "ompi" => {
                    let exe =
                        rest.iter().position(|w| *w == "@B/halo").unwrap_or_else(|| panic!("{at}: an MPI launcher runs @B/halo or @B/mpi_exchange"));
                    check_halo(&rest[exe + 1..], &subs).unwrap_or_else(|e| panic!("{at}: {e}"));
                }
                "stencil3d" | "halo-downstream" | "capi-cpp" => {}
                "call" => {
                    let f = rest.first().unwrap_or_else(|| panic!("{at}: `call` names no function"));
                    assert!(GPU_SUITE.contains(&format!("\n{f}() {{")), "{at}: gpu-suite.sh defines no function {f}");
                }
                other => panic!("{at}: unknown command {other}"),
            }
        }
        // The suites named by what they check, each with a default tier, and a long tier.
        for s in ["correctness", "md", "baselines", "faults", "multi-process", "scaling", "routing", "protocol", "kernel-times", "adoption", "words"]
        {
            assert!(lines.iter().any(|l| l.suite == s && !l.long), "suite {s} has no default-tier command");
        }
        assert!(lines.iter().any(|l| l.long), "no long tier");
        // Every GPU test binary runs whole (no filter) in a default tier on one GPU: the
        // correctness suite's, or the multi-process suite's for the binaries that start PEs.
        let whole = |suite: &str, bin: &str| {
            lines.iter().any(|l| {
                l.suite == suite && !l.long && l.gpus == 1 && l.words[0] == "tests" && !l.words.contains(&"--") && l.words[1..].contains(&bin)
            })
        };
        for bin in GPU_TESTS.iter().copied().chain(["halo-downstream"]) {
            let suite = if ["gpu_multiprocess", "gpu_pes", "gpu_capi_pes"].contains(&bin) { "multi-process" } else { "correctness" };
            assert!(whole(suite, bin), "{bin} does not run whole in the default tier of the {suite} suite");
        }
        // The benchmark tests run only where asked for, with --ignored.
        assert!(lines.iter().any(|l| l.suite == "kernel-times" && l.words.contains(&"--ignored")));
    }

    #[test]
    fn a_table_naming_what_the_bundle_lacks_is_refused() {
        let e = check_suites("x default 10 1 0 tests gpu_nothing\n", GPU_SUITE).unwrap_err();
        assert!(e.contains("gpu_nothing is not a GPU test binary"), "{e}");
        let e = check_suites("x default 10 1 0 call no_such_check\n", GPU_SUITE).unwrap_err();
        assert!(e.contains("defines no such function"), "{e}");
        let e = check_suites("x default 10 1 0 cargo test\n", GPU_SUITE).unwrap_err();
        assert!(e.contains("unknown command cargo"), "{e}");
        assert!(check_suites("x default 10 1 0 call md_rows a\n", GPU_SUITE).is_ok());
    }

    #[test]
    fn a_bad_table_line_is_refused_with_its_number() {
        for (line, want) in [
            ("md sometimes 10 1 0 halo info", "tier"),
            ("md default 0 1 0 halo info", "SECONDS"),
            ("md default 10 0 0 halo info", "GPUS"),
            ("md default 10 1 maybe halo info", "EXPECT"),
            ("md default 10 1 0 A=1", "no command"),
            ("md default 10 1 0 halo verify --json \"x y\"", "quotes"),
        ] {
            let e = parse_suites(&format!("# c\n\n{line}\n")).unwrap_err();
            assert!(e.contains("line 3") && e.contains(want), "{line}: {e}");
        }
        let ok = parse_suites("x long 5 2 nz A=1 B_2=@OUT halo info\n").unwrap();
        assert_eq!((ok[0].long, ok[0].seconds, ok[0].gpus, ok[0].expect, ok[0].words.clone()), (true, 5, 2, None, vec!["halo", "info"]));
    }

    /// A bundle of fake test binaries (shell scripts that print what the test harness prints) in a
    /// fresh folder; returns the folder.
    fn fake_bundle(tag: &str, tests: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("halo-runner-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("tests")).unwrap();
        let write = |p: PathBuf, body: &str| {
            fs::write(&p, format!("#!/usr/bin/env bash\n{body}\n")).unwrap();
            set_executable(&p).unwrap();
        };
        write(dir.join("run-gpu-tests.sh"), RUN_GPU_TESTS);
        write(dir.join("halo-downstream"), "echo downstream ok");
        for (name, body) in tests {
            write(dir.join("tests").join(name), body);
        }
        dir
    }

    fn run_runner(dir: &Path, env: &[(&str, &str)]) -> (i32, String) {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(dir.join("run-gpu-tests.sh")).env("OUT", dir.join("logs")).env_remove("HALO_TEST_TIER");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (out.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }

    #[test]
    fn the_runner_sums_up_passes_failures_and_tests_not_run_by_name() {
        let dir = fake_bundle(
            "mixed",
            &[
                // As a test binary on one thread prints: `test NAME ... `, what the test wrote to
                // stderr itself (a SKIPPED line), then the result.
                (
                    "gpu_a",
                    "echo 'test one ... ok'; printf 'test two ... '; echo 'SKIPPED (needs 2 GPUs) [two_pes_on_two_gpus]: 1 present' >&2; echo ok; echo 'test three ... ok'",
                ),
                (
                    "gpu_b",
                    "echo 'test good ... ok'; printf 'test nve ... '; echo 'SKIPPED (long tier) [nve_drift]: set HALO_TEST_TIER=long to run it' >&2; echo ok; \
                     echo 'test bad ... FAILED'; echo 'test kernel_times ... ignored, benchmark'; exit 101",
                ),
            ],
        );
        let (code, out) = run_runner(&dir, &[]);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("HALO_REQUIRE_GPUS=1"), "the promise defaults to one GPU: {out}");
        assert!(out.contains("\ngpu-tests: 4 passed, 1 failed, 2 skipped\n"), "a test that said SKIPPED is not counted as passed: {out}");
        assert!(out.contains("FAILED gpu_b::bad"), "{out}");
        assert!(out.contains("  gpu_a::two\n") && out.contains("  gpu_b::nve\n"), "the skipped tests by name: {out}");
        assert!(out.contains("not run: long tier:\n  gpu_b: nve_drift"), "{out}");
        assert!(out.contains("not run: needs 2 GPUs:\n  gpu_a: two_pes_on_two_gpus"), "{out}");
        assert!(out.contains("gpu_b::kernel_times"), "ignored benchmarks are listed: {out}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_runner_fails_a_crash_a_hang_and_a_filter_that_matches_nothing() {
        let dir = fake_bundle(
            "crash",
            &[
                ("gpu_crash", "echo 'test first ... ok'; printf 'test second ... '; kill -SEGV $$"),
                ("gpu_hang", "printf 'test slow ... '; sleep 30"),
                ("gpu_none", "echo 'running 0 tests'"),
            ],
        );
        let (code, out) = run_runner(&dir, &[("GPU_TEST_TIMEOUT_S", "1")]);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("FAILED gpu_crash::second (rc=139)"), "{out}");
        assert!(out.contains("FAILED gpu_hang::slow (killed after 1 s)"), "{out}");
        assert!(out.contains("FAILED gpu_none (ran no test"), "{out}");
        assert!(out.contains("\ngpu-tests: 2 passed, 3 failed, 0 skipped\n"), "downstream and gpu_crash::first passed: {out}");
        // Only the passing one, by --bin: exit 0.
        let mut cmd = std::process::Command::new("bash");
        let out = cmd.arg(dir.join("run-gpu-tests.sh")).args(["--bin", "halo-downstream"]).env("OUT", dir.join("logs")).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("gpu-tests: 1 passed, 0 failed, 0 skipped"), "{text}");
        let _ = fs::remove_dir_all(&dir);
    }

    /// Runs `gpu-suite.sh` of a fake bundle (a `halo` that passes, fails or hangs as told, an
    /// `nvidia-smi` that lists one GPU) on `table`; returns its exit status and output.
    fn run_suite(tag: &str, table: &str, args: &[&str], promise: &str) -> (i32, String) {
        run_suite_with(tag, table, args, promise, &[])
    }

    /// [`run_suite`] with more environment, in a bundle that also holds an (empty) `ucx/`.
    fn run_suite_with(tag: &str, table: &str, args: &[&str], promise: &str, env: &[(&str, &str)]) -> (i32, String) {
        let dir = std::env::temp_dir().join(format!("halo-suite-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::create_dir_all(dir.join("ucx")).unwrap();
        let write = |p: PathBuf, body: &str| {
            fs::write(&p, body).unwrap();
            set_executable(&p).unwrap();
        };
        write(dir.join("gpu-suite.sh"), GPU_SUITE);
        fs::write(dir.join("gpu-suites.txt"), table).unwrap();
        let row = r#"[{"transport": "fused", "atoms": 45000, "step_us_median": 64.8, "ns_per_day": 2667.0, "search_share": 0.03, "graph": false, "halo_atoms_checked": 9, "checked": true}]"#;
        write(
            dir.join("halo"),
            &format!(
                "#!/usr/bin/env bash\ncase $1 in ok) echo fine;; fail) echo refused >&2; exit 3;; hang) sleep 30;; json) echo '{row}' > \"$2\";; esac\n"
            ),
        );
        // The fake runner takes 3 s, whatever it runs, and says what it was given.
        write(dir.join("run-gpu-tests.sh"), "#!/usr/bin/env bash\nsleep 3\necho \"ran $* budget=$GPU_TEST_BUDGET_S each=$GPU_TEST_TIMEOUT_S\"\n");
        write(dir.join("bin/nvidia-smi"), "#!/usr/bin/env bash\n[ \"$1\" = -L ] && echo 'GPU 0: Fake H200 (UUID: GPU-0)'\nexit 0\n");
        let path = format!("{}:{}", dir.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        let out = std::process::Command::new("bash")
            .arg(dir.join("gpu-suite.sh"))
            .args(args)
            .env("PATH", path)
            .env("OUT", dir.join("logs"))
            .env("HALO_REQUIRE_GPUS", promise)
            .env_remove("HALO_TEST_TIER")
            .env_remove("HALO_UCX_ATOMICS")
            .env_remove("HALO_UCX_DIR")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let log = fs::read_to_string(dir.join("logs").join(format!("{}.log", args.first().unwrap_or(&"correctness")))).unwrap_or_default();
        let _ = fs::remove_dir_all(&dir);
        (out.status.code().unwrap_or(-1), format!("{}{}\n--- log\n{log}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }

    #[test]
    fn a_suite_passes_fails_and_leaves_out_commands_by_the_gpus_promised() {
        let table = "# a comment\n\
            s default 10 1 0  halo ok\n\
            s default 10 1 nz halo fail\n\
            s default 10 1 0  halo fail\n\
            s default 10 2 0  halo ok two\n\
            s long    10 1 0  halo ok long\n\
            s default 1  1 0  halo hang\n\
            s default 10 1 0  call md_rows missing\n\
            t default 10 1 0  halo fail other-suite\n";
        let (code, out) = run_suite("promise1", table, &["s"], "1");
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("# HALO_REQUIRE_GPUS=1, 1 GPU(s) listed by nvidia-smi"), "the machine block: {out}");
        assert!(out.contains("\ns: 2 passed, 3 failed\n"), "{out}");
        assert!(out.contains("FAILED [3] halo fail (rc=3, expected 0)"), "{out}");
        assert!(out.contains("FAILED [6] halo hang (killed after 1 s)"), "{out}");
        assert!(out.contains("FAILED [7] call md_rows missing"), "{out}");
        assert!(out.contains("not run: needs 2 GPU(s):\n  [4] halo ok two"), "{out}");
        assert!(out.contains("not run: long tier (--long):\n  [5] halo ok long"), "{out}");
        assert!(!out.contains("other-suite"), "another suite's command ran: {out}");
        assert!(out.contains("--- log\n# gpu-suite s (tier default)"), "the log starts with the machine block: {out}");
        // Promised two GPUs, the two-GPU command fails instead of being left out; --long runs the
        // long tier.
        let (code, out) = run_suite("promise2", table, &["s", "--long"], "2");
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("FAILED [4] halo ok two (needs 2 GPUs, 1 present)"), "{out}");
        assert!(out.contains("\ns: 3 passed, 4 failed\n"), "{out}");
        // A suite that passes exits 0; an unknown one is refused with the list.
        let (code, out) = run_suite("pass", "s default 10 1 0 halo ok\ns default 10 1 nz halo fail\n", &["s"], "1");
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("\ns: 2 passed, 0 failed\n"), "{out}");
        let (code, out) = run_suite("unknown", "s default 10 1 0 halo ok\n", &["nope"], "1");
        assert!(code == 2 && out.contains("no suite `nope`; the suites are: s"), "{out}");
    }

    #[test]
    fn ucx_lines_that_must_pass_need_a_gpu_cpu_mapping() {
        let table = "s default 10 1 0  ucx halo ok\ns default 10 1 nz ucx halo fail\n";
        // A machine with GDRCopy's device runs both lines whatever it is told.
        if !std::path::Path::new("/dev/gdrdrv").exists() {
            let (code, out) = run_suite("ucx-none", table, &["s"], "1");
            assert_eq!(code, 0, "{out}");
            assert!(out.contains("\ns: 1 passed, 0 failed\n"), "only the line that must fail runs: {out}");
            assert!(out.contains("not run: UCX without a GPU-CPU mapping") && out.contains("  [1] ucx halo ok"), "{out}");
        }
        let (code, out) = run_suite_with("ucx-vouched", table, &["s"], "1", &[("HALO_UCX_ATOMICS", "1")]);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("\ns: 2 passed, 0 failed\n") && !out.contains("not run: "), "{out}");
    }

    #[test]
    fn md_rows_shows_the_files_written_and_says_which_were_not() {
        // The fake `halo json FILE` writes one md-bench row into FILE.
        let table = "s default 10 1 0  halo json @OUT/one.json\n\
            s default 10 1 0  call md_rows one missing\n\
            s default 10 1 0  call md_rows missing\n";
        let (code, out) = run_suite("mdrows", table, &["s"], "1");
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("== missing: not written here"), "{out}");
        let row = out.lines().find(|l| l.contains("\"atoms\": 45000")).unwrap_or_else(|| panic!("no row shown: {out}"));
        assert!(row.contains("\"step_us_median\": 64.8") && row.contains("\"checked\": true") && !row.contains("halo_atoms_checked"), "{row}");
        assert!(out.contains("\ns: 2 passed, 1 failed\n") && out.contains("FAILED [3] call md_rows missing"), "no file at all fails: {out}");
    }

    #[test]
    fn a_tests_line_hands_its_limit_to_the_runner_as_the_binaries_budget() {
        let table = "s default 60 1 0  tests a b\ns default 2 1 0  tests a\n";
        let (code, out) = run_suite("tests-budget", table, &["s"], "1");
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("ran --bin a --bin b budget=50 each=40"), "{out}");
        assert!(out.contains("FAILED [2] tests a (killed after 2 s)"), "the line's own limit still holds: {out}");
    }

    #[test]
    fn the_runner_starts_no_binary_its_budget_cannot_finish_and_still_sums_up() {
        let dir = fake_bundle("budget", &[("gpu_a", "sleep 3; echo 'test slow ... ok'"), ("gpu_b", "echo 'test quick ... ok'")]);
        // 27 s: downstream and gpu_a start (12 s left each, less the 15 s kept for the summary),
        // gpu_b, with 9 s left after gpu_a's 3 s, does not.
        let (code, out) = run_runner(&dir, &[("GPU_TEST_BUDGET_S", "27")]);
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("FAILED gpu_b (not started: the run's time budget ran out)"), "{out}");
        assert!(out.contains("\ngpu-tests: 2 passed, 1 failed, 0 skipped\n"), "{out}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn lines_runs_part_of_a_suite() {
        let table = "s default 10 1 0  halo ok one\ns default 10 1 0  halo ok two\ns default 10 1 0  halo fail three\n";
        let (code, out) = run_suite("lines", table, &["s", "--lines=2-2"], "1");
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("\ns: 1 passed, 0 failed\n") && out.contains("=== [2] halo ok two"), "{out}");
        assert!(out.contains("not run: outside --lines=2-2:\n  [1] halo ok one\n  [3] halo fail three"), "{out}");
        let (code, out) = run_suite("lines-one", table, &["s", "--lines=3"], "1");
        assert!(code == 1 && out.contains("\ns: 0 passed, 1 failed\n"), "{out}");
        let (code, out) = run_suite("lines-bad", table, &["s", "--lines=3-1"], "1");
        assert!(code == 2 && out.contains("give A-B or N"), "{out}");
    }

    #[test]
    fn the_words_suite_refuses_to_run_under_mps() {
        // A process whose command line names the MPS control daemon, as pgrep sees it.
        let mut mps = std::process::Command::new("bash").arg("-c").arg("exec -a nvidia-cuda-mps-control sleep 20").spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (code, out) = run_suite("mps", "words default 10 1 0 halo ok\ns default 10 1 0 halo ok\n", &["words"], "1");
        let (other, other_out) = run_suite("mps2", "words default 10 1 0 halo ok\ns default 10 1 0 halo ok\n", &["s"], "1");
        let _ = mps.kill();
        let _ = mps.wait();
        assert!(code == 2 && out.contains("runs without CUDA MPS"), "{out}");
        assert_eq!(other, 0, "another suite runs under MPS: {other_out}");
    }
}
