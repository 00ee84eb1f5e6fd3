//! Every bad input that needs no GPU (issue 8), through the built `halo` binary where a command
//! reaches it and through the library otherwise: each must fail with a message that names the
//! problem and the fix, a non-zero exit, and no panic. GPU-only cases (out of memory, a real heap
//! exhaustion, a forced NVLink transport without peer access) are listed in docs/reliability.md.

use halo::abi::{ABI_VERSION, KERNEL_ENTRIES};
use halo::artifacts::KernelArtifacts;
use halo::decomp::{HaloPlan, PlanError, RankGrid};
use halo::exchange::spec::validate;
use halo::exchange::{RankHalo, Transport};
use halo::nvshmem::{check_nvshmem_versions, heap_too_small_message, load_library};
use halo::system::MolecularSystem;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const HALO: &str = env!("CARGO_BIN_EXE_halo");

/// No bad input may take long: a hang is a failure too.
const BOUND: Duration = Duration::from_secs(30);

/// Runs `halo args` with `env` set, no inherited backtrace setting (a panic would then print only
/// its "panicked at" line, which every check looks for) and no launcher variables.
fn halo(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(HALO);
    cmd.args(args).stdin(Stdio::null()).env_remove("RUST_BACKTRACE").env_remove("RUST_LIB_BACKTRACE");
    for var in ["HALO_RANK", "HALO_NRANKS", "HALO_PTX_DIR", "HALO_NVSHMEM_LIB"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let out = cmd.output().expect("run the halo binary");
    assert!(start.elapsed() < BOUND, "halo {args:?} took {:?}", start.elapsed());
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts a clean failure: non-zero exit, no panic, and every phrase in `wants` on stderr.
fn fails_with(args: &[&str], env: &[(&str, &Path)], wants: &[&str]) -> String {
    let out = halo(args, env);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "halo {args:?} succeeded:\n{stdout}\n{stderr}");
    assert_no_panic(&stdout, &stderr);
    for w in wants {
        assert!(stderr.contains(w), "halo {args:?}: stderr lacks {w:?}:\n{stderr}");
    }
    stderr
}

fn assert_no_panic(stdout: &str, stderr: &str) {
    for s in [stdout, stderr] {
        assert!(!s.contains("panicked") && !s.contains("RUST_BACKTRACE"), "a panic:\n{s}");
    }
}

/// A fresh, empty folder removed on drop (std only: no extra dependency).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("halo-bad-input-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Systems, grids and cutoffs (`halo plan`)
// ---------------------------------------------------------------------------------------------

#[test]
fn zero_atoms_is_refused() {
    fails_with(&["plan", "--atoms", "0"], &[], &["0 atoms", "ask for at least 1 atom", "--atoms"]);
    assert!(MolecularSystem::generate(0, 1).is_err());
}

#[test]
fn too_many_atoms_is_refused() {
    fails_with(&["plan", "--atoms", "2000000000"], &[], &["more than halo supports", "ask for fewer atoms"]);
}

#[test]
fn cutoff_too_large_for_the_box_is_refused() {
    // 1000 atoms make a 2.154 nm cube: a 5 nm cutoff is far beyond half of it.
    fails_with(
        &["plan", "--atoms", "1000", "--ranks", "2x1x1", "--cutoff", "5"],
        &[],
        &["cutoff 5 nm is not below half the box", "use a cutoff below 1.0772 nm or a larger system"],
    );
    // Undecomposed, the cutoff still must respect the minimum image.
    fails_with(&["plan", "--atoms", "1000", "--ranks", "1x1x1", "--cutoff", "1.2"], &[], &["use a cutoff below"]);
}

#[test]
fn more_ranks_than_cells_allow_are_refused() {
    // A small box cut into many thin cells with a big cutoff: the cutoff/box rule fires first.
    fails_with(&["plan", "--atoms", "200", "--ranks", "9x1x1", "--cutoff", "0.7"], &[], &["use a cutoff below"]);
    // More ranks than halo can number.
    fails_with(&["plan", "--ranks", "2048x1024x1"], &[], &["more than 1048576 ranks", "write it as AxBxC"]);
    // The pulse-count rule on its own, through the library: too many pulses for the ranks.
    let e = HaloPlan::from_positions(&[], [4.0, 4.0, 4.0], RankGrid::new([3, 1, 1]).expect("grid"), 2.5).expect_err("cutoff");
    assert!(matches!(e, PlanError::CutoffTooLarge { .. } | PlanError::TooManyRanks { .. }), "{e}");
}

#[test]
fn non_positive_or_non_finite_cutoffs_are_refused() {
    for c in ["0", "-1", "nan", "inf"] {
        fails_with(&["plan", "--atoms", "1000", "--cutoff", c], &[], &["invalid cutoff", "positive finite length"]);
    }
}

#[test]
fn malformed_rank_grids_are_refused() {
    for g in ["2x2", "2x0x1", "axbxc", "-1x1x1", "", "2x2x2x2", "1.5x1x1"] {
        // `--ranks=` so that clap takes "-1x1x1" as the value, not as a flag.
        let arg = format!("--ranks={g}");
        fails_with(&["plan", "--atoms", "1000", &arg], &[], &["invalid rank grid", "write it as AxBxC"]);
    }
    // exchange-check parses its grid with clap: a usage error (exit 2), still no panic.
    let stderr = fails_with(&["exchange-check", "--grid", "2x0"], &[], &["is not a rank grid like 2x2x1"]);
    assert!(!stderr.contains("panicked"));
}

#[test]
fn unknown_transports_and_flags_are_usage_errors() {
    let out = halo(&["exchange-check", "--transport", "carrier-pigeon"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_no_panic(&text(&out.stdout), &text(&out.stderr));
    assert!(text(&out.stderr).contains("possible values"), "{}", text(&out.stderr));
}

/// Issue 18: the jitter, fault and phase options are checked before any GPU work.
#[test]
fn bad_jitter_fault_and_phase_options_are_refused_before_the_gpu() {
    fails_with(
        &["exchange-check", "--jitter-us", "fast"],
        &[],
        &["--jitter-us=\"fast\"", "`fast` is not a number of microseconds", "MAX_US[:SEED[:host|gpu|both]]"],
    );
    fails_with(&["exchange-check", "--jitter-us", "2000000"], &[], &["longer than the 1000000 µs"]);
    fails_with(&["exchange-check", "--jitter-us", "30:1:sideways"], &[], &["`sideways` is not a side"]);
    fails_with(
        &["exchange-check", "--jitter-us", "3000", "--wait-timeout-ms", "2"],
        &[],
        &["(up to 3000 µs) is not shorter than the device wait deadline (--wait-timeout-ms 2)", "use less jitter or a longer deadline"],
    );
    fails_with(&["exchange-check", "--fault", "kill@5"], &[], &["--fault=\"kill@5\"", "kill@STEP:RANK"]);
    fails_with(&["bench", "--fault", "explode@1:1"], &[], &["`explode` is not a fault"]);
    fails_with(&["exchange-check", "--fault", "corrupt-atom:rank=1"], &[], &["--fault=\"corrupt-atom:rank=1\"", "corrupt-atom names no pulse"]);
    fails_with(&["verify", "--fault", "drop-atom:rank=1,pulse=0,step=0"], &[], &["no previous halo to leave in place"]);
    // The variables, when no flag stands for them.
    fails_with(&["exchange-check"], &[("HALO_JITTER_US", Path::new("1:2:gpu:4"))], &["HALO_JITTER_US=\"1:2:gpu:4\"", "unexpected `:4`"]);
    fails_with(&["exchange-check"], &[("HALO_FAULT", Path::new("kill@x:1"))], &["HALO_FAULT=\"kill@x:1\"", "`x` is not a step number"]);
    let out = halo(&["exchange-check", "--phase", "y"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("`y` is not a phase: x (coordinates only), f (forces only) or xf (both)"), "{}", text(&out.stderr));
}

#[test]
fn bad_scaling_options_are_refused_before_the_gpu() {
    fails_with(&["md-scaling", "--gpus", "3"], &[], &["--gpus 3: the 2-rank rows use 1 GPU (both ranks on it) or 2"]);
    fails_with(&["md-scaling", "--gpus", "0"], &[], &["--gpus 0"]);
    fails_with(&["md-scaling", "--steps", "1050"], &[], &["--steps 1050 must be a positive multiple of --nstlist 100"]);
    fails_with(&["md-scaling", "--repeats", "0"], &[], &["--repeats must be at least 1"]);
    fails_with(&["md-scaling", "--out", "/proc/halo-none/md-scaling.json"], &[], &["creating /proc/halo-none"]);
}

// ---------------------------------------------------------------------------------------------
// Inconsistent plans (library): neighbours that disagree, maps out of range
// ---------------------------------------------------------------------------------------------

use halo::testing::ring_halos as ring;

fn spec_error(halos: &[RankHalo]) -> String {
    validate(halos).expect_err("an inconsistent halo must be refused").to_string()
}

#[test]
fn inconsistent_halo_specs_are_refused() {
    validate(&ring(3)).expect("the uncorrupted ring is valid");
    assert!(spec_error(&[]).contains("no ranks"));

    let mut h = ring(3);
    h[1].pulses[0].recv_size = 1;
    let e = spec_error(&h);
    assert!(e.contains("inconsistent halo plan") && e.contains("rank 2 pulse 0 sends 2 atoms, rank 1 expects 1"), "{e}");

    let mut h = ring(3);
    h[0].pulses[0].send_rank = 1; // rank 1 receives from rank 2, not 0
    assert!(spec_error(&h).contains("which receives from 2"));

    let mut h = ring(3);
    h[2].pulses[0].peer_atom_offset = 5;
    assert!(spec_error(&h).contains("writes at offset 5 of rank 1, whose pulse starts at 4"));

    let mut h = ring(3);
    let extra = h[1].pulses[0].clone();
    h[1].pulses.push(extra);
    assert!(spec_error(&h).contains("rank 1 has 2 pulses, rank 0 has 1"));

    let mut h = ring(3);
    h[0].pulses[0].send_rank = 7;
    assert!(spec_error(&h).contains("names rank 7 of 3"));

    let mut h = ring(3);
    h[2].home_atoms = 9;
    assert!(spec_error(&h).contains("more home atoms (9) than atoms (6)"));
}

#[test]
fn index_maps_out_of_range_are_refused() {
    let mut h = ring(3);
    h[0].pulses[0].index_map[1] = 6;
    let e = spec_error(&h);
    assert!(e.contains("map entry 6 is out of range of its 6 atoms"), "{e}");

    let mut h = ring(3);
    h[0].pulses[0].index_map[0] = u32::MAX;
    assert!(spec_error(&h).contains("out of range"));

    let mut h = ring(3);
    for r in &mut h {
        r.pulses[0].atom_offset = 5; // receives atoms 5 and 6 of 6
        r.pulses[0].peer_atom_offset = 5;
    }
    assert!(spec_error(&h).contains("receives past its 6 atoms"));
}

fn md_plan() -> HaloPlan {
    let sys = MolecularSystem::generate(1200, 5).expect("system");
    let plan = HaloPlan::build(&sys, RankGrid::new([2, 2, 1]).expect("grid"), 1.0).expect("plan");
    plan.validate().expect("a built plan is valid");
    plan
}

#[test]
fn corrupted_md_plans_are_refused_with_the_rank_and_pulse() {
    let mut p = md_plan();
    p.ranks[1].pulses[0].spec.send_rank = 1;
    let e = p.validate().expect_err("neighbour").to_string();
    assert!(e.contains("rank 1 pulse 0: its send rank is 1, but the grid gives 0"), "{e}");

    let mut p = md_plan();
    p.ranks[2].pulses[1].spec.recv_size += 4;
    let e = p.validate().expect_err("sizes").to_string();
    assert!(e.contains("expects") || e.contains("atom_offset"), "{e}");

    let mut p = md_plan();
    let hi = p.ranks[0].pulses[1].spec.atom_offset as u32;
    // Replaced, not appended: an extra entry would first be caught as a size mismatch.
    p.ranks[0].pulses[1].spec.index_map[0] = hi + 1000;
    let e = p.validate().expect_err("index").to_string();
    assert!(e.contains("index map entry") && e.contains("outside the atoms this pulse may send"), "{e}");

    let mut p = md_plan();
    p.ranks.swap(0, 3);
    assert!(p.validate().expect_err("order").to_string().contains("rank entry 0 says it is rank 3"));

    let mut p = md_plan();
    p.cutoff = f32::NAN;
    assert!(p.validate().expect_err("cutoff").to_string().contains("invalid cutoff"));

    let mut p = md_plan();
    p.box_size[2] = -1.0;
    assert!(p.validate().expect_err("box").to_string().contains("invalid box"));

    let mut p = md_plan();
    p.ranks[3].global_ids[0] = 5000;
    assert!(p.validate().expect_err("identity").to_string().contains("sends atom 5000"));
    assert!(p.validate_atoms(1200).expect_err("ids").to_string().contains("global id 5000, but the system has 1200 atoms"));
}

#[test]
fn non_finite_positions_are_refused() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let pos = vec![halo::abi::Float3::new(0.5, 0.5, 0.5), halo::abi::Float3::new(0.5, bad, 0.5)];
        let e = HaloPlan::from_positions(&pos, [3.0; 3], RankGrid::new([2, 1, 1]).expect("grid"), 1.0).expect_err("non-finite");
        assert!(matches!(e, PlanError::NonFinitePosition { atom: 1, .. }), "{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel artifacts: missing, stale, foreign
// ---------------------------------------------------------------------------------------------

fn manifest(arch: &str, abi: u32, entries: &[&str]) -> String {
    serde_json::json!({
        "arch": arch,
        "abi_version": abi,
        "nvshmem_version": "3.4.5",
        "entries": entries,
        "ptx": format!("halo_kernels.{arch}.ptx"),
        "cubin": format!("halo_kernels.{arch}.cubin"),
        "ptxas_report": format!("halo_kernels.{arch}.ptxas.txt"),
    })
    .to_string()
}

fn ptx_dir(tag: &str, arch: &str, body: &str) -> TempDir {
    let d = TempDir::new(tag);
    std::fs::write(d.0.join(format!("halo_kernels.{arch}.manifest.json")), body).expect("write manifest");
    d
}

fn load_error(dir: &Path, arch: &str) -> String {
    KernelArtifacts::load(dir, arch).expect_err("must be refused").to_string()
}

#[test]
fn missing_ptx_is_reported_with_the_build_command() {
    let empty = TempDir::new("empty");
    let e = load_error(&empty.0, "sm_90");
    assert!(e.contains("no compiled kernels in") && e.contains("halo_kernels.sm_90.manifest.json is missing"), "{e}");
    assert!(e.contains("cargo xtask build-ptx") && e.contains("HALO_PTX_DIR"), "{e}");

    // `halo info` reports it (info is a report and still exits 0, but names the folder and fix).
    let out = halo(&["info"], &[("HALO_PTX_DIR", &empty.0)]);
    let stdout = text(&out.stdout);
    assert_no_panic(&stdout, &text(&out.stderr));
    assert!(stdout.contains(&format!("kernels: no compiled kernels in {}", empty.0.display())), "{stdout}");
    assert!(stdout.contains("cargo xtask build-ptx"), "{stdout}");

    // A command that needs the kernels fails: for lack of a GPU here, for lack of kernels on a GPU machine.
    let stderr = fails_with(&["exchange-check", "--steps", "1"], &[("HALO_PTX_DIR", &empty.0)], &["halo: error:"]);
    assert!(stderr.contains("needs a GPU") || stderr.contains("cargo xtask build-ptx"), "{stderr}");
}

#[test]
fn stale_ptx_is_reported_with_the_rebuild_command() {
    let entries: Vec<&str> = KERNEL_ENTRIES.to_vec();
    let good = ptx_dir("good", "sm_90", &manifest("sm_90", ABI_VERSION, &entries));
    KernelArtifacts::load(&good.0, "sm_90").expect("a current manifest loads");

    let old = ptx_dir("abi", "sm_90", &manifest("sm_90", ABI_VERSION + 1, &entries));
    let e = load_error(&old.0, "sm_90");
    assert!(e.contains("stale kernels") && e.contains(&format!("built for kernel ABI {}", ABI_VERSION + 1)), "{e}");
    assert!(e.contains(&format!("this halo speaks ABI {ABI_VERSION}")) && e.contains("cargo xtask build-ptx"), "{e}");

    let missing = ptx_dir("entries", "sm_90", &manifest("sm_90", ABI_VERSION, &entries[1..]));
    let e = load_error(&missing.0, "sm_90");
    assert!(e.contains(&format!("kernels [\"{}\"] are missing", entries[0])) && e.contains("Rebuild them"), "{e}");

    let garbage = ptx_dir("garbage", "sm_90", "{ this is not json");
    let e = load_error(&garbage.0, "sm_90");
    assert!(e.contains("unreadable manifest") && e.contains("cargo xtask build-ptx"), "{e}");

    // Through the binary: `halo info` names the stale folder.
    let out = halo(&["info"], &[("HALO_PTX_DIR", &old.0)]);
    assert_no_panic(&text(&out.stdout), &text(&out.stderr));
    assert!(text(&out.stdout).contains("stale kernels"), "{}", text(&out.stdout));
}

#[test]
fn ptx_for_another_architecture_is_not_found_for_this_one() {
    // Kernels built only for sm_100: asking for sm_90 names the file that is missing. (Which file a
    // GPU loads from a build, and the older-GPU error, are `check_arch`'s unit tests in
    // host/src/gpu/module.rs.)
    let entries: Vec<&str> = KERNEL_ENTRIES.to_vec();
    let d = ptx_dir("arch", "sm_100", &manifest("sm_100", ABI_VERSION, &entries));
    KernelArtifacts::load(&d.0, "sm_100").expect("its own arch loads");
    let e = load_error(&d.0, "sm_90");
    assert!(e.contains("halo_kernels.sm_90.manifest.json is missing"), "{e}");
    let out = halo(&["info", "--arch", "sm_90"], &[("HALO_PTX_DIR", &d.0)]);
    assert!(text(&out.stdout).contains("halo_kernels.sm_90.manifest.json is missing"), "{}", text(&out.stdout));
}

// ---------------------------------------------------------------------------------------------
// NVSHMEM: missing library, version mismatch, heap too small; transports needing NVLink
// ---------------------------------------------------------------------------------------------

fn assert_lists_places_and_install(e: &str, path: &str) {
    assert!(e.contains("libnvshmem_host.so.3) was not found"), "{e}");
    assert!(e.contains(&format!("{path} (")) && e.contains("not found"), "{e}");
    assert!(e.contains("python3 -m pip install nvidia-nvshmem-cu13==3.4.5"), "{e}");
    assert!(e.contains("NVSHMEM_HOME") && e.contains("HALO_NVSHMEM_LIB"), "{e}");
}

#[test]
fn missing_nvshmem_library_lists_where_it_looked_and_the_pip_command() {
    let e = load_library(Some(Path::new("/nonexistent/libnvshmem_host.so.3"))).err().expect("no such library").to_string();
    assert_lists_places_and_install(&e, "/nonexistent/libnvshmem_host.so.3");

    // The environment route (`HALO_NVSHMEM_LIB`), in a child process so this one's environment is
    // never modified while other tests run.
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new(exe)
        .args(["--exact", "nvshmem_env_child", "--ignored", "--nocapture", "--test-threads", "1"])
        .env("HALO_NVSHMEM_LIB", "/nonexistent")
        .env("HALO_BAD_INPUT_CHILD", "1")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run the child test");
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("1 passed"), "{}", text(&out.stdout));
}

/// Run by [`missing_nvshmem_library_lists_where_it_looked_and_the_pip_command`] with
/// `HALO_NVSHMEM_LIB=/nonexistent`; ignored otherwise.
#[test]
#[ignore = "child of missing_nvshmem_library_lists_where_it_looked_and_the_pip_command"]
fn nvshmem_env_child() {
    if std::env::var_os("HALO_BAD_INPUT_CHILD").is_none() {
        return;
    }
    let e = load_library(None).err().expect("HALO_NVSHMEM_LIB names no library").to_string();
    assert_lists_places_and_install(&e, "/nonexistent");
    assert!(e.contains("(HALO_NVSHMEM_LIB)"), "{e}");
    // The named library is the only one tried: never silently replaced by another.
    assert!(!e.contains("system loader"), "{e}");
}

#[test]
fn nvshmem_version_rule() {
    let lib = Path::new("/opt/nvshmem/lib/libnvshmem_host.so.3");
    check_nvshmem_versions((3, 4, 5), (3, 4, 5), lib).expect("same version");
    check_nvshmem_versions((3, 4, 5), (3, 4, 0), lib).expect("patch ignored");
    check_nvshmem_versions((3, 4, 5), (3, 8, 1), lib).expect("older device minor on a newer host");

    let e = check_nvshmem_versions((3, 5, 0), (3, 4, 5), lib).expect_err("device newer than host").to_string();
    assert!(e.contains("built against NVSHMEM 3.5.0") && e.contains("is 3.4.5"), "{e}");
    assert!(e.contains("/opt/nvshmem/lib/libnvshmem_host.so.3"), "{e}");
    assert!(e.contains("cargo xtask build-ptx --nvshmem 3.4.5") && e.contains("HALO_NVSHMEM_LIB"), "{e}");

    let e = check_nvshmem_versions((2, 11, 0), (3, 4, 5), lib).expect_err("major mismatch").to_string();
    assert!(e.contains("NVSHMEM 2.11.0") && e.contains("3.4.5"), "{e}");
    assert!(check_nvshmem_versions((4, 0, 0), (3, 9, 0), lib).is_err());
}

#[test]
fn symmetric_heap_too_small_names_the_variable_to_raise() {
    let m = heap_too_small_message(3 << 30, None);
    assert!(m.contains("too small for 3221225472 more bytes"), "{m}");
    assert!(m.contains("NVSHMEM_SYMMETRIC_SIZE is the default (1 GiB)"), "{m}");
    assert!(m.contains("raise NVSHMEM_SYMMETRIC_SIZE, e.g. NVSHMEM_SYMMETRIC_SIZE=4G"), "{m}");
    let m = heap_too_small_message(4096, Some("2G"));
    assert!(m.contains("NVSHMEM_SYMMETRIC_SIZE is 2G") && m.contains("raise NVSHMEM_SYMMETRIC_SIZE"), "{m}");
}

#[test]
fn transports_that_need_nvlink_peers_are_known() {
    // The rule `PeExchange::check_transport` applies; its message needs PEs (a GPU): see
    // docs/reliability.md for the command that shows it.
    let need: Vec<Transport> = Transport::ALL.into_iter().filter(|t| t.needs_direct_peers()).collect();
    assert_eq!(need, [Transport::Staged, Transport::DirectCopy, Transport::PerPulseDirect, Transport::FusedTma]);
}
