//! Every `HALO_*` environment variable that halo's crates, its build and its tests read, in one
//! table: [`VARS`]. `docs/environment.md` is generated from it (`cargo xtask docs`), and a test
//! fails when a `HALO_*` name in the source tree is missing from it, or when the table names one
//! that nothing reads any more.
//!
//! Where the code reads a variable through a named constant, the table uses that constant, so the
//! name lives in one place.

use crate::exchange::{heap, pe, perturb, proxy, routing, watch};
use crate::launch::{env as rank_env, ucx};
use crate::route::{config::env as route, feedback};

/// Who reads a variable, and so when it takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Read while `halo` is compiled: its build script and `cargo xtask` (the kernel build).
    Build,
    /// Read at run time by the `halo` library, in any program that uses it.
    Library,
    /// The router's settings, read at run time by the `halo` library (`halo route` prints them).
    Router,
    /// Set by `halo launch` for each rank it starts (or by you under another launcher); read by
    /// the library.
    Launch,
    /// Read at run time by the mini-MD (`halo-md`: `halo verify`, `halo md-bench`).
    Md,
    /// Read by the `halo` command only.
    Cli,
    /// Fault injection and test support: for checking halo, not for production runs.
    Testing,
}

impl Scope {
    /// Every scope, in the order the reference lists them.
    pub const ALL: [Scope; 7] = [Scope::Build, Scope::Library, Scope::Router, Scope::Launch, Scope::Md, Scope::Cli, Scope::Testing];

    /// A short heading.
    pub fn title(self) -> &'static str {
        match self {
            Scope::Build => "Building halo",
            Scope::Library => "The halo library at run time",
            Scope::Router => "The transport router",
            Scope::Launch => "Ranks of a multi-process run",
            Scope::Md => "The mini-MD",
            Scope::Cli => "The halo command",
            Scope::Testing => "Fault injection and tests",
        }
    }

    /// Which code reads the variables of this scope.
    pub fn readers(self) -> &'static str {
        match self {
            Scope::Build => "the `halo` crate's build script and `cargo xtask` (the kernel build, `halo-builder`)",
            Scope::Library => "the `halo` library, in every program that uses it (`halo` and your own)",
            Scope::Router => {
                "the `halo` library's router (`halo::route`); a config file (`HALO_ROUTE_CONFIG`) sets the same values, the environment beats it"
            }
            Scope::Launch => "the `halo` library; `halo launch` sets them for each rank it starts",
            Scope::Md => "the mini-MD (`halo-md`, used by `halo verify` and `halo md-bench`)",
            Scope::Cli => "the `halo` command",
            Scope::Testing => "the `halo` library and command when asked to misbehave on purpose, and halo's own tests",
        }
    }
}

/// One environment variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvVar {
    /// Its name, `HALO_…`.
    pub name: &'static str,
    /// Who reads it.
    pub scope: Scope,
    /// What applies when it is unset.
    pub default: &'static str,
    /// What it does and which values it takes.
    pub meaning: &'static str,
}

const fn var(name: &'static str, scope: Scope, default: &'static str, meaning: &'static str) -> EnvVar {
    EnvVar { name, scope, default, meaning }
}

/// Every `HALO_*` variable, grouped by [`Scope`] in the order of [`Scope::ALL`].
pub const VARS: &[EnvVar] = &[
    // Build.
    var(
        "HALO_SKIP_KERNEL_BUILD",
        Scope::Build,
        "unset",
        "Any value but empty or `0`: build the `halo` library without its GPU kernels (no nightly toolchain or NVSHMEM bitcode needed); at run time the kernels then come from `HALO_PTX_DIR`, `ptx/` next to the executable, or the workspace's `target/ptx/`.",
    ),
    var(
        "HALO_KERNEL_ARCH",
        Scope::Build,
        "`sm_90`",
        "The GPU architecture the embedded kernels are compiled for (`llc` and `ptxas`). `cargo xtask` sets it from `--arch`.",
    ),
    var(
        "HALO_NVSHMEM",
        Scope::Build,
        "`NVSHMEM_HOME`, else the pinned NVSHMEM wheel",
        "Where the kernel build takes NVSHMEM's device bitcode: an NVSHMEM install or unpacked wheel folder, the `.bc` file, or a version to fetch. `cargo xtask` sets it from `--nvshmem`.",
    ),
    var(
        "HALO_CACHE_DIR",
        Scope::Build,
        "`target/` of the halo checkout, else `$CARGO_HOME/halo-cache`, else `~/.cache/halo`",
        "Folder for built kernels, the nested nvptx build and the fetched toolchain wheels, shared by every build of this checkout.",
    ),
    // Library.
    var(
        crate::artifacts::PTX_DIR_ENV,
        Scope::Library,
        "unset: the kernels embedded in the library",
        "A folder holding `halo_kernels.<arch>.{ptx,cubin,manifest.json}` to load instead of the embedded kernels (`cargo xtask build-ptx` writes `target/ptx/`; a bundle has `ptx/`).",
    ),
    var(
        "HALO_NVSHMEM_LIB",
        Scope::Library,
        "`NVSHMEM_HOME/lib`, then the python3 package `nvidia-nvshmem-cu13`, then the system loader",
        "Path of the NVSHMEM host library (`libnvshmem_host.so.3`) to load. When set, it is the only one tried.",
    ),
    var(
        pe::PutSignaling::ENV,
        Scope::Library,
        "`auto`",
        "How pulses on the NVSHMEM put path signal their peer: `put-signal` (put with a remote signal atomic), `fenced-put` (put, fence, then a put of the step counter; works on every transport) or `auto` (`fenced-put` when NVSHMEM's remote transport is UCX, else `put-signal`).",
    ),
    var(
        crate::nvshmem::ENV_KEPT_GATHER,
        Scope::Library,
        "`auto`",
        "How repeated all-gathers between PEs travel: `node` (shared host memory; every PE must be on this machine), `symmetric` (NVSHMEM symmetric buffers) or `auto` (`node` when every PE is on this machine).",
    ),
    var(
        crate::watchdog::STARTUP_TIMEOUT_ENV,
        Scope::Library,
        "60",
        "Seconds a rank may spend in a start-up or collective step (the unique-id rendezvous, NVSHMEM init, symmetric allocation and free, barriers, gathers, module registration, finalisation) before the call returns an error naming the rank, the step, the likely cause and the fix; that PE's NVSHMEM is unusable afterwards, and the `halo` command exits with code 86. Under NVSHMEM's MPI bootstrap these calls stay on the calling thread: an overrun is reported (the `halo` command exits with 86) but cannot be returned.",
    ),
    var(
        watch::HOST_WAIT_ENV,
        Scope::Library,
        "the device wait deadline plus 3 s",
        "Seconds a host wait on the exchange's kernels may go without progress before it fails with a snapshot of the device state (above 0, at most 1e6).",
    ),
    var(
        proxy::ENV_PIN_LAUNCHER,
        Scope::Library,
        "on",
        "`0`: leave the launching thread's CPU affinity alone. Otherwise, after NVSHMEM starts, the thread that launches the kernels is moved off the CPUs NVSHMEM pinned its proxy threads to.",
    ),
    var(
        routing::SAFE_POINT_ENV,
        Scope::Library,
        "the driver's own interval (`halo exchange-check`: `--check-every`)",
        "Steps between safe points (where a routed exchange may fail over to another transport) for drivers that take no flag for it; a whole number, at least 1.",
    ),
    // Router.
    var(
        route::CONFIG,
        Scope::Router,
        "unset",
        "A router config file (TOML: `[weights]`, `[reliability]`, overrides); the environment variables below beat its values.",
    ),
    var(route::W_LATENCY, Scope::Router, "3", "Weight of latency in a transport's score for small messages."),
    var(route::W_BANDWIDTH, Scope::Router, "3", "Weight of bandwidth in a transport's score for large messages."),
    var(route::W_TOPOLOGY, Scope::Router, "1", "Weight of topological distance in a transport's score."),
    var(route::W_CAPABILITY, Scope::Router, "1", "Weight of what a transport can do on this pair (capability) in its score."),
    var(route::W_RELIABILITY, Scope::Router, "2", "Weight of a transport's recent failures in its score."),
    var(
        route::RATIO,
        Scope::Router,
        "3",
        "Ratio of the dominant weight to the other at either end of the size range (latency below `HALO_ROUTE_SMALL_BYTES`, bandwidth above `HALO_ROUTE_LARGE_BYTES`); at least 1.",
    ),
    var(route::SMALL_BYTES, Scope::Router, "`2KiB`", "Message size up to which latency dominates the score (bytes, or with a unit such as `KiB`)."),
    var(route::LARGE_BYTES, Scope::Router, "`64KiB`", "Message size from which bandwidth dominates the score (bytes, or with a unit such as `KiB`)."),
    var(route::HALF_LIFE_S, Scope::Router, "30", "Half-life, in seconds, of a transport's failure count. Must be the same on every PE."),
    var(route::SKIP_THRESHOLD, Scope::Router, "1", "Decayed failure count at which the router skips a transport. Must be the same on every PE."),
    var(
        route::FORCE,
        Scope::Router,
        "unset: the router decides",
        "One transport for every PE pair, by name: `nvlink-store`, `nvlink-tma`, `nvshmem-put`, `staged` or `nccl`.",
    ),
    var(
        route::OVERRIDE,
        Scope::Router,
        "unset",
        "Per-pair transports, comma separated `A-B=name` (both directions of PEs A and B), e.g. `0-1=nvshmem-put,2-3=staged`; `--route-override` beats it.",
    ),
    var(route::DEBUG, Scope::Router, "`0`", "`1`: write one block per routing decision to stderr, every candidate with its numbers and the reason."),
    var(
        route::CALIBRATION,
        Scope::Router,
        "unset: built-in performance numbers",
        "A calibration file written by `halo calibrate`: the router scores transports with its measured latencies and bandwidths.",
    ),
    var(
        route::TOPOLOGY,
        Scope::Router,
        "unset: node placement from each PE's facts",
        "Where the nodes sit: a halo topology file (TOML), or Slurm's `topology.conf` or `scontrol show topology` output.",
    ),
    // Launch.
    var(
        rank_env::ENV_RANK,
        Scope::Launch,
        "unset: the rank comes from MPI, PMI or Slurm variables, else this is rank 0 of 1",
        "This process's rank.",
    ),
    var(rank_env::ENV_NRANKS, Scope::Launch, "unset (see `HALO_RANK`)", "The number of ranks; required when `HALO_RANK` is set."),
    var(rank_env::ENV_LOCAL_RANK, Scope::Launch, "`HALO_RANK`", "This rank's index among the ranks of its node."),
    var(
        rank_env::ENV_DEVICE,
        Scope::Launch,
        "the local rank (modulo the `CUDA_VISIBLE_DEVICES` entries when that is set)",
        "The CUDA device ordinal this rank uses; honoured under any launcher.",
    ),
    var(
        rank_env::ENV_PES_PER_GPU,
        Scope::Launch,
        "1",
        "How many ranks share this rank's GPU; set it yourself under `mpirun` or `srun` when several ranks share a GPU (a session started from an MPI communicator counts them itself).",
    ),
    var(
        rank_env::ENV_RENDEZVOUS_DIR,
        Scope::Launch,
        "unset: no `halo launch` rendezvous",
        "The private folder through which the ranks of one `halo launch` exchange their start-up data; set by `halo launch` only.",
    ),
    // Md.
    var(
        "HALO_NBNXM_KERNEL",
        Scope::Md,
        "`pfw`",
        "The non-bonded (nbnxm) force kernel design: `ind` (indirect), `pf` (prefetch) or `pfw` (prefetch, i-forces added warp by warp).",
    ),
    var("HALO_NBNXM_WARPS", Scope::Md, "`auto`", "Warps per nbnxm list entry: `auto` (sized to the list and the GPU) or 1 to 16."),
    var(
        "HALO_NBNXM_ENTRY_WORDS",
        Scope::Md,
        "`32`",
        "The most j-cluster words per nbnxm list entry of the GPU searches (1 to 64; longer runs are split evenly): shorter entries give short lists, such as those of the halo atoms, more entries to spread over the GPU.",
    ),
    // Cli.
    var(
        "HALO_LOG",
        Scope::Cli,
        "`RUST_LOG`, else `warn`",
        "The log filter (`tracing` directives, e.g. `info` or `halo::route=debug`); beats `RUST_LOG` when both are set. Spans it lets through print their busy time when they close: `halo=debug,halo_md=debug` shows every part of every search step (`search.*`).",
    ),
    var("HALO_NCCL_LIB", Scope::Cli, "`libnccl.so.2`, then `libnccl.so`", "Path of the NCCL library that `halo bench` loads for its NCCL baseline."),
    // Testing.
    var(
        perturb::JITTER_ENV,
        Scope::Testing,
        "off",
        "Random delays before about half of every rank's launches: `MAX_US[:SEED[:host|gpu|both]]`. `--jitter-us` beats it.",
    ),
    var(
        perturb::FAULT_ENV,
        Scope::Testing,
        "off",
        "`kill@STEP:RANK`: rank RANK kills itself (SIGKILL) right after enqueueing step STEP's coordinate halo. `--fault` beats it.",
    ),
    var(
        feedback::INJECT_ENV,
        Scope::Testing,
        "off",
        "A transport failure injected on purpose: `transport[:step][@pe,pe...]` (every step, or one step; every PE, or the ones listed).",
    ),
    var(
        heap::RESERVE_ENV,
        Scope::Testing,
        "unset",
        "`G[:RANK]`: `halo exchange-check` holds G GiB of device memory (on every rank, or only RANK) before it builds the exchange, to test the out-of-memory checks.",
    ),
    var(
        ucx::ENV_UCX_DIR,
        Scope::Testing,
        "unset: the UCX test cases skip",
        "A folder with the UCX libraries that NVSHMEM's UCX transport loads (`cargo xtask fetch-ucx` writes `target/ucx/`; a bundle carries `ucx/`): the multi-PE GPU tests then also run the put path through that transport over TCP loopback, as between nodes.",
    ),
    var("HALO_REQUIRE_GPU", Scope::Testing, "unset: GPU tests skip without a GPU", "`1`: the older spelling of `HALO_REQUIRE_GPUS=1`."),
    var(
        "HALO_REQUIRE_GPUS",
        Scope::Testing,
        "unset: GPU tests skip when too few GPUs are present",
        "`N`: the GPUs the machine was promised. A GPU test that needs at most `N` GPUs fails instead of skipping when they are missing; one that needs more is reported as not run (the bundle's `run-gpu-tests.sh` sets 1 unless told otherwise).",
    ),
    var(
        "HALO_UCX_ATOMICS",
        Scope::Testing,
        "unset: without `/dev/gdrdrv` (GDRCopy), `gpu-suite.sh` leaves out the `ucx` lines that must pass",
        "`1`: this machine's NVSHMEM can run UCX's atomics without GDRCopy (NVSHMEM 3.8 or later with driver R610 or later): `gpu-suite.sh` runs those lines too.",
    ),
    var(
        "HALO_TEST_PE_CHILD",
        Scope::Testing,
        "unset",
        "Set by a GPU test for the PEs it starts under `halo launch` from its own binary (`gpu_pes`'s put path after a timeout); unset, the child test does nothing.",
    ),
    var(
        "HALO_TEST_TIER",
        Scope::Testing,
        "`default`",
        "`long`: GPU tests also run their long cases (45k-atom grids, the NVE drift); otherwise those print `SKIPPED (long tier)`.",
    ),
    var(
        "HALO_REQUIRE_MPI",
        Scope::Testing,
        "unset: the MPI tests skip without `mpiexec`",
        "Set: the tests under a real process manager fail when they find no `mpiexec` (`cargo xtask test` sets it).",
    ),
    var(
        "HALO_MPIEXEC",
        Scope::Testing,
        "`target/mpi/mpich/bin/mpiexec` (`cargo xtask fetch-mpi`)",
        "The `mpiexec` the MPI tests start their ranks with (`halo-cli`'s `mpi` test, and `halo`'s `mpi_runtime` test with feature `mpi`).",
    ),
    var(
        "HALO_TEST_MPI_RANK_CHILD",
        Scope::Testing,
        "unset",
        "Set by the `mpi_runtime` test (feature `mpi`) in the environment of the ranks it starts under `mpiexec`; not for users.",
    ),
    var(
        "HALO_REQUIRE_NVSHMEM_LIB",
        Scope::Testing,
        "unset: the attach test's loaded-library half skips without NVSHMEM's host library",
        "Set: the `nvshmem_attach` test fails when it finds no NVSHMEM host library (`HALO_NVSHMEM_LIB`, or the wheel the kernel build fetches into `target/toolchains`).",
    ),
    var(
        "HALO_BIN",
        Scope::Testing,
        "the `halo` built with the tests",
        "The `halo` executable the multi-process GPU tests start (the bundle's runner points it at its own `halo`).",
    ),
    var("HALO_BAD_INPUT_CHILD", Scope::Testing, "unset", "Internal to the `bad_input` test: marks the child process it re-runs itself as."),
];

/// The entry for `name`, if halo reads such a variable.
pub fn lookup(name: &str) -> Option<&'static EnvVar> {
    VARS.iter().find(|v| v.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    /// `HALO_*` names in the source tree that are not environment variables.
    const NOT_VARIABLES: &[(&str, &str)] = &[
        ("HALO_ABI_VERSION", "the kernels' ABI version symbol in the PTX"),
        ("HALO_VERSION", "the @HALO_VERSION@ placeholder of the C API's CMake and pkg-config templates"),
        ("HALO_NO_GPU", "the C API's status code, which xtask's capi check expects without a GPU"),
    ];

    /// Sources that name C identifiers, not variables: the C API's `halo_status` codes
    /// (`HALO_OK`, `HALO_NO_GPU`, ...). They read no environment variable (a test below checks).
    const C_IDENTIFIER_SOURCES: &[&str] = &["host/capi/src", "host/capi/tests"];

    /// The folders whose sources may read variables.
    const SOURCE_DIRS: &[&str] = &["host", "kernels-gpu", "xtask", "tests", "examples"];

    fn workspace_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ has a parent").to_path_buf()
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "target" && !name.to_string_lossy().starts_with('.') {
                    rust_files(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every maximal `HALO_[A-Z0-9_]+` in `text` that is a whole name (not a prefix such as
    /// `HALO_ROUTE_*`, which ends in `_`).
    fn names_in(text: &str) -> Vec<String> {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while let Some(at) = text[i..].find("HALO_").map(|a| a + i) {
            let before_ok = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
            let mut end = at + "HALO_".len();
            while end < bytes.len() && (bytes[end].is_ascii_uppercase() || bytes[end].is_ascii_digit() || bytes[end] == b'_') {
                end += 1;
            }
            let name = &text[at..end];
            if before_ok && name.len() > "HALO_".len() && !name.ends_with('_') {
                out.push(name.to_owned());
            }
            i = end;
        }
        out
    }

    #[test]
    fn the_c_api_sources_read_no_environment_variable() {
        let root = workspace_root();
        let mut files = Vec::new();
        for dir in C_IDENTIFIER_SOURCES {
            rust_files(&root.join(dir), &mut files);
        }
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            assert!(!text.contains("env::var"), "{} reads the environment: list what it reads in VARS and scan it", file.display());
        }
    }

    #[test]
    fn names_are_found_whole() {
        assert_eq!(names_in("a HALO_RANK=1, `HALO_ROUTE_*` X_HALO_NOT HALO_ROUTE_W_LATENCY."), ["HALO_RANK", "HALO_ROUTE_W_LATENCY"]);
    }

    #[test]
    fn every_halo_variable_in_the_source_tree_is_in_the_table_and_every_entry_is_read() {
        let root = workspace_root();
        let this_file = root.join("host/src/env_vars.rs");
        let mut files = Vec::new();
        for dir in SOURCE_DIRS {
            rust_files(&root.join(dir), &mut files);
        }
        assert!(files.len() > 50, "found only {} source files under {}", files.len(), root.display());
        let c_sources: Vec<PathBuf> = C_IDENTIFIER_SOURCES.iter().map(|d| root.join(d)).collect();
        let mut in_source = BTreeSet::new();
        for file in files.iter().filter(|f| **f != this_file && !c_sources.iter().any(|d| f.starts_with(d))) {
            let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            in_source.extend(names_in(&text));
        }
        for (name, _) in NOT_VARIABLES {
            in_source.remove(*name);
        }
        let in_table: BTreeSet<String> = VARS.iter().map(|v| v.name.to_owned()).collect();
        let missing: Vec<&String> = in_source.difference(&in_table).collect();
        let stale: Vec<&String> = in_table.difference(&in_source).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "host/src/env_vars.rs's VARS is not the source tree's list of HALO_* variables: add {missing:?} (named in the sources), \
             remove {stale:?} (named by no source), then run `cargo xtask docs`"
        );
    }

    #[test]
    fn the_table_has_one_entry_per_name_grouped_by_scope() {
        let names: BTreeSet<&str> = VARS.iter().map(|v| v.name).collect();
        assert_eq!(names.len(), VARS.len(), "a name appears twice in VARS");
        let order: Vec<usize> = VARS.iter().map(|v| Scope::ALL.iter().position(|s| *s == v.scope).expect("in ALL")).collect();
        assert!(order.is_sorted(), "VARS is grouped by scope in the order of Scope::ALL");
        for v in VARS {
            assert!(v.name.starts_with("HALO_") && !v.default.is_empty() && v.meaning.ends_with('.'), "{v:?}");
        }
        assert_eq!(lookup("HALO_PTX_DIR").map(|v| v.scope), Some(Scope::Library));
    }
}
