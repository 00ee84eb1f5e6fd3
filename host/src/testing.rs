//! Support for GPU tests: find the GPUs a test needs or say loudly why the test cannot run.
//!
//! Every GPU-count decision goes through [`gpu_verdict`]. A test (or a part of one) that needs `G`
//! GPUs runs when `G` are present. Otherwise it depends on what the machine was promised,
//! `HALO_REQUIRE_GPUS=N` (`HALO_REQUIRE_GPU=1`, the older spelling, promises one): with `G <= N`
//! the missing GPUs are a broken machine and the test fails; with `G > N` (CI machines without
//! GPUs promise none) it prints one line, `SKIPPED (needs G GPUs) [test]: P present (...)`, and
//! passes. The bundle's `run-gpu-tests.sh` sets the promise and lists those lines by name at the
//! end ("not run"), so a run on a GPU can never report a skipped check as a pass.
//! A GPU whose driver is loaded but fails to initialise ([`gpu::GpuStatus::DriverFailed`]) fails
//! the test whatever the setting: that machine is broken, not GPU-less.
//!
//! Long cases run only in the long tier (`HALO_TEST_TIER=long`, [`long_tier`]); in the default
//! tier they print `SKIPPED (long tier) [test]: ...`, which the runner lists the same way.

use crate::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use crate::gpu::{self, CudaContext, GpuStatus, KernelModule};
use kernels_gpu::abi::Float3;
use std::sync::Arc;

/// A GPU, its context and the loaded halo module. When the test ends (the fixture is dropped) it
/// writes `TIME [test]: S s` to stderr, past the test harness's capture, so that every GPU suite's
/// log says what each test cost (what the suites' tiers are chosen by).
pub struct GpuFixture {
    /// GPU 0's context.
    pub ctx: Arc<CudaContext>,
    /// The kernels (shared: the exchange and the MD types hold their module in an `Arc`).
    pub module: Arc<KernelModule>,
    /// The test and when its fixture was made.
    started: (String, std::time::Instant),
}

impl Drop for GpuFixture {
    fn drop(&mut self) {
        use std::io::Write;
        let (test, at) = &self.started;
        // Straight to the stderr handle: the harness captures `eprintln!` of passing tests.
        let _ = writeln!(std::io::stderr().lock(), "TIME [{test}]: {:.1} s", at.elapsed().as_secs_f64());
    }
}

/// The variable that states how many GPUs the machine was promised.
pub const ENV_REQUIRE_GPUS: &str = "HALO_REQUIRE_GPUS";
/// The older spelling: `HALO_REQUIRE_GPU=1` promises one GPU.
pub const ENV_REQUIRE_GPU: &str = "HALO_REQUIRE_GPU";
/// The variable that picks the test tier: `long` runs the long cases too.
pub const ENV_TEST_TIER: &str = "HALO_TEST_TIER";

/// How many GPUs the machine was promised, from the values of `HALO_REQUIRE_GPUS` and
/// `HALO_REQUIRE_GPU` (the larger promise wins). Pure, for the tests; [`promised_gpus`] reads the
/// environment.
pub fn promised_gpus_from(require_gpus: Option<&str>, require_gpu: Option<&str>) -> std::result::Result<usize, String> {
    let n = match require_gpus.map(str::trim).filter(|v| !v.is_empty()) {
        None => 0,
        Some(v) => v.parse::<usize>().map_err(|_| {
            format!("{ENV_REQUIRE_GPUS}={v:?} is not a number of GPUs: set it to the GPUs this machine should have, e.g. {ENV_REQUIRE_GPUS}=2")
        })?,
    };
    Ok(n.max(usize::from(require_gpu == Some("1"))))
}

/// How many GPUs the machine was promised (`HALO_REQUIRE_GPUS=N`, or 1 for `HALO_REQUIRE_GPU=1`,
/// else 0). Panics on a value that is not a number: a test run must not guess the promise.
pub fn promised_gpus() -> usize {
    let (a, b) = (std::env::var(ENV_REQUIRE_GPUS).ok(), std::env::var(ENV_REQUIRE_GPU).ok());
    promised_gpus_from(a.as_deref(), b.as_deref()).unwrap_or_else(|e| panic!("{e}"))
}

/// Whether a missing GPU must fail the test (some GPU was promised).
pub fn gpu_required() -> bool {
    promised_gpus() > 0
}

/// What a test that needs some GPUs does ([`gpu_verdict`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuVerdict {
    /// Enough GPUs: run, with this many present.
    Run(usize),
    /// Fewer than it needs, and more than the machine was promised: not run (said by name).
    NotRun {
        /// GPUs the test needs.
        needs: usize,
        /// GPUs present.
        present: usize,
        /// Why there are not more (the driver's word, or the count).
        why: String,
    },
    /// Fewer than it needs although the machine was promised them, or a broken driver: fail.
    Fail(String),
}

/// The one rule for every GPU-count decision of the tests: a test that needs `needs` GPUs on a
/// machine with `status` that was promised `promised` GPUs runs, is not run, or fails (see the
/// module's documentation). Pure, so every case is tested without a GPU.
pub fn gpu_verdict(needs: usize, status: &GpuStatus, promised: usize) -> GpuVerdict {
    let (present, why) = match status {
        GpuStatus::Present(n) if *n >= needs => return GpuVerdict::Run(*n),
        GpuStatus::Present(n) => (*n, format!("{n} present")),
        GpuStatus::Absent(r) => (0, format!("0 present ({r})")),
        GpuStatus::DriverFailed(r) => return GpuVerdict::Fail(format!("a GPU is present but unusable: {r}")),
    };
    if needs <= promised {
        return GpuVerdict::Fail(format!(
            "{ENV_REQUIRE_GPUS}={promised} promises {promised} GPU(s) and this needs {needs}, but {why}: the machine lost GPUs, or lower {ENV_REQUIRE_GPUS} to the GPUs it has"
        ));
    }
    GpuVerdict::NotRun { needs, present, why }
}

/// The line a test that is not run prints: `SKIPPED (<reason>) [<test>]: <detail>`.
/// `run-gpu-tests.sh` reads these lines (the marker is `SKIPPED (`, the name between brackets).
pub fn not_run_line(reason: &str, test: &str, detail: &str) -> String {
    format!("SKIPPED ({reason}) [{test}]: {detail}")
}

/// Prints a [`not_run_line`] on the stderr handle directly: the test harness captures `eprintln!`
/// of passing tests, and a skip must stay visible in every log.
pub fn say_not_run(reason: &str, test: &str, detail: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{}", not_run_line(reason, test, detail));
}

fn gpus_word(n: usize) -> &'static str {
    if n == 1 { "GPU" } else { "GPUs" }
}

/// The number of GPUs when at least `min` are present; `None` (after printing a
/// [`not_run_line`]) when fewer are and the machine was not promised `min`; panics when it was
/// ([`gpu_verdict`]). For a whole test and for a part of one alike: name the part in `test`.
pub fn gpus_or_skip(test: &str, min: usize) -> Option<usize> {
    match gpu_verdict(min, &gpu::gpu_status(), promised_gpus()) {
        GpuVerdict::Run(n) => Some(n),
        GpuVerdict::Fail(why) => panic!("{test}: {why}"),
        GpuVerdict::NotRun { needs, why, .. } => {
            say_not_run(&format!("needs {needs} {}", gpus_word(needs)), test, &why);
            None
        }
    }
}

/// Whether the long cases run (`HALO_TEST_TIER=long`) from the variable's value; anything but
/// unset, empty, `default` or `long` is an error naming the choices. Pure, for the tests.
pub fn long_tier_from(tier: Option<&str>) -> std::result::Result<bool, String> {
    match tier.map(str::trim) {
        None | Some("") | Some("default") => Ok(false),
        Some("long") => Ok(true),
        Some(v) => Err(format!("{ENV_TEST_TIER}={v:?} is not a tier: use `default` or `long`")),
    }
}

/// Whether the long case `test` runs: in the long tier yes; in the default tier it prints a
/// [`not_run_line`] (`SKIPPED (long tier) [test]`) and returns false. A run of the default
/// tier therefore lists every long case it left out.
pub fn long_tier(test: &str) -> bool {
    let tier = std::env::var(ENV_TEST_TIER).ok();
    if long_tier_from(tier.as_deref()).unwrap_or_else(|e| panic!("{test}: {e}")) {
        return true;
    }
    say_not_run("long tier", test, &format!("set {ENV_TEST_TIER}=long to run it"));
    false
}

/// GPU 0 with the kernels loaded, or `None` as [`gpus_or_skip`]. Panics if a GPU is present but
/// the kernels cannot be loaded: that is a failure, not a reason to skip.
pub fn gpu_or_skip(test: &str) -> Option<GpuFixture> {
    gpus_or_skip(test, 1)?;
    let started = std::time::Instant::now();
    let ctx = gpu::open_device(0).unwrap_or_else(|e| panic!("{test}: {e}"));
    let artifacts = KernelArtifacts::locate(DEFAULT_ARCH).unwrap_or_else(|e| panic!("{test}: {e}"));
    let module = KernelModule::load(&ctx, &artifacts).unwrap_or_else(|e| panic!("{test}: {e}"));
    Some(GpuFixture { ctx, module: Arc::new(module), started: (test.to_string(), started) })
}

/// An exchange with no GPU rank that records the calls it gets (with feature `diagnostics`, which
/// `test-support` turns on, also at `halo::exchange::null`).
pub use crate::exchange::null::NullExchange;

/// What a child process printed and how it ended ([`run_captured`]).
#[derive(Debug)]
pub struct Captured {
    /// Its exit code; `None` when it was killed for running past the limit (or by a signal).
    pub code: Option<i32>,
    /// Everything it wrote to standard output.
    pub stdout: String,
    /// Everything it wrote to standard error.
    pub stderr: String,
    /// Whether it was killed for running past the limit.
    pub timed_out: bool,
}

/// Runs `cmd` (no input) with both outputs captured, killed after `limit`: for tests that drive
/// the built `halo` (under `halo launch`, mpiexec) and must never hang.
pub fn run_captured(mut cmd: std::process::Command, limit: std::time::Duration) -> std::io::Result<Captured> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut s);
            }
            s
        })
    };
    let out = reader(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = reader(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let started = std::time::Instant::now();
    let (code, timed_out) = loop {
        if let Some(status) = child.try_wait()? {
            break (status.code(), false);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Ok(Captured { code, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default(), timed_out })
}

/// The smallest valid halo for tests of validation: a ring of `n` ranks of 4 home atoms each, one
/// pulse that sends atoms 0 and 3 to the next rank and receives 2 atoms from the previous one.
/// Tests corrupt one field and check the error that names it.
pub fn ring_halos(n: usize) -> Vec<crate::desc::RankHalo> {
    (0..n)
        .map(|r| crate::desc::RankHalo {
            home_atoms: 4,
            total_atoms: 6,
            pulses: vec![crate::desc::PulseSpec {
                send_rank: (r + n - 1) % n,
                recv_rank: (r + 1) % n,
                index_map: vec![0, 3],
                recv_size: 2,
                atom_offset: 4,
                peer_atom_offset: 4,
                shift: None,
                accumulate_forces: true,
            }],
        })
        .collect()
}

/// Each rank's home atoms as its GPU holds them between searches when the atoms moved to
/// `positions` (with `velocities`, both by global id) after `plan` placed them: the plan's home ids
/// in its order. For tests of redecompositions and their GPU passes.
pub fn homes_of(plan: &crate::decomp::HaloPlan, positions: &[Float3], velocities: &[Float3]) -> Vec<crate::decomp::HomeAtoms> {
    plan.ranks
        .iter()
        .map(|r| {
            let ids = r.global_ids[..r.home_atoms].to_vec();
            crate::decomp::HomeAtoms {
                positions: ids.iter().map(|&i| positions[i as usize]).collect(),
                velocities: ids.iter().map(|&i| velocities[i as usize]).collect(),
                ids,
            }
        })
        .collect()
}

/// `positions` moved as in a few search intervals (seeded): every atom by up to 0.3 nm along each
/// axis, 3 % also across the periodic boundary by whole boxes (-2 to +3), 1 % anywhere from one
/// box below to two above. For tests of redecompositions and their GPU passes.
pub fn moved_positions(positions: &[Float3], box_size: [f32; 3], seed: u64) -> Vec<Float3> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    positions
        .iter()
        .map(|p| {
            let mut x = [p.x, p.y, p.z];
            match rng.random_range(0..100) {
                0 => x = std::array::from_fn(|d| rng.random_range(-1.0..2.0) * box_size[d]),
                1..4 => {
                    let d = rng.random_range(0..3);
                    x[d] += box_size[d] * [-2.0, -1.0, 1.0, 3.0][rng.random_range(0..4)];
                }
                _ => {}
            }
            for c in &mut x {
                *c += rng.random_range(-0.3..0.3);
            }
            Float3::new(x[0], x[1], x[2])
        })
        .collect()
}

/// [`moved_positions`] and new velocities (seeded, up to 2 nm/ps along x and y, 1 along z).
pub fn moved_atoms(positions: &[Float3], box_size: [f32; 3], seed: u64) -> (Vec<Float3>, Vec<Float3>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x7e1);
    let v = positions.iter().map(|_| Float3::new(rng.random_range(-2.0..2.0), rng.random_range(-2.0..2.0), rng.random())).collect();
    (moved_positions(positions, box_size, seed), v)
}

/// Home atoms for tests of the GPU migration ([`crate::decomp::GpuMigrate`]) in `geo`: positions,
/// velocities and ids of `n` atoms. A generated liquid scaled to `geo`'s box, ids a shuffled
/// sparse set, and moved as the hard cases need: every third atom by whole boxes (-3 to +3, the
/// wrap's division and floor), every seventh a little outside a face; then, while atoms last, the
/// special positions: exactly on each cell threshold of `geo` and one float either side, 0, -0.0,
/// the box's last float, the box edge itself, one float outside, a threshold plus whole boxes,
/// far away and tiny negatives. No non-finite position (tests add their own).
pub fn migration_atoms(geo: &crate::decomp::Decomposition, n: usize, seed: u64) -> (Vec<Float3>, Vec<Float3>, Vec<u32>) {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let b = geo.box_size;
    let liquid = crate::system::MolecularSystem::generate(n.max(1), seed).map(|s| (s.positions, s.box_size)).unwrap_or_default();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x6d16);
    // The liquid scaled to this box (its own box differs), or uniform where it has no atoms.
    let mut x: Vec<Float3> = (0..n)
        .map(|i| match liquid.0.get(i) {
            Some(p) => Float3::new(p.x / liquid.1[0] * b[0], p.y / liquid.1[1] * b[1], p.z / liquid.1[2] * b[2]),
            None => Float3::new(rng.random_range(0.0..b[0]), rng.random_range(0.0..b[1]), rng.random_range(0.0..b[2])),
        })
        .collect();
    for (i, p) in x.iter_mut().enumerate() {
        if i % 3 == 0 {
            let k = [rng.random_range(-3..4) as f32, rng.random_range(-3..4) as f32, rng.random_range(-3..4) as f32];
            *p = Float3::new(p.x + k[0] * b[0], p.y + k[1] * b[1], p.z + k[2] * b[2]);
        } else if i % 7 == 0 {
            p.y = if i % 2 == 0 { -rng.random_range(0.0..0.05f32) } else { b[1] + rng.random_range(0.0..0.05f32) };
        }
    }
    let mut special = Vec::new();
    let mid = [0.5 * b[0], 0.5 * b[1], 0.5 * b[2]];
    let at = |d: usize, v: f32| {
        let mut c = mid;
        c[d] = v;
        Float3::new(c[0], c[1], c[2])
    };
    for (d, &l) in b.iter().enumerate() {
        for i in 1..geo.grid.dims[d] {
            let t = geo.cell_threshold(d, i);
            special.extend([at(d, t), at(d, t.next_down()), at(d, t.next_up()), at(d, t + l), at(d, t - 2.0 * l)]);
        }
        special.extend([at(d, 0.0), at(d, -0.0), at(d, l.next_down()), at(d, l), at(d, l.next_up()), at(d, -l), at(d, 3.0 * l), at(d, -1e-7)]);
        special.extend([at(d, -1e-30), at(d, 1e6), at(d, -3e5), at(d, (-l).next_up()), at(d, (2.0 * l).next_down())]);
    }
    special.push(Float3::new(-0.0, -0.0, -0.0));
    special.push(Float3::new(b[0].next_down(), b[1].next_down(), b[2].next_down()));
    // Spread over the input, so they fall in different blocks and warps.
    let stride = (n / special.len().max(1)).max(1);
    for (k, p) in special.into_iter().enumerate() {
        if let Some(slot) = x.get_mut(k * stride) {
            *slot = p;
        }
    }
    let v = (0..n).map(|_| Float3::new(rng.random_range(-2.0..2.0), rng.random_range(-2.0..2.0), rng.random_range(-2.0..2.0))).collect();
    let mut ids: Vec<u32> = (0..n as u32).map(|i| 3 * i + 1).collect();
    ids.shuffle(&mut rng);
    (x, v, ids)
}

/// `n` home atoms of `rank` for the GPU selection's tests (`decomp::GpuSelect`): wrapped
/// positions and ids (`3 i + 1`, shuffled), seeded. A quarter anywhere in the box, a quarter in
/// the rank's cell, a quarter within 1.5 cutoffs of its cell's faces (wrapped), and a quarter with
/// every decomposed coordinate where a first pulse's test changes (the term reaching the squared
/// range or leaving 0, and the floats either side: `decomp/select.rs`'s bit ranges) or at 0, the
/// box's last float or `-0.0` (which a wrap leaves as it is), spread over blocks and warps.
pub fn selection_atoms(geo: &crate::decomp::Decomposition, rank: usize, n: usize, seed: u64) -> (Vec<Float3>, Vec<u32>) {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let b = geo.box_size;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5e1e);
    let edges = crate::decomp::selection_edges(geo, rank);
    let cell = geo.grid.coords_of(rank);
    let (lo, hi) = (|d: usize| geo.lower(d, cell[d]) as f32, |d: usize| geo.upper(d, cell[d]) as f32);
    let x = (0..n)
        .map(|i| {
            let c: [f32; 3] = std::array::from_fn(|d| {
                let v = match i % 4 {
                    0 => rng.random_range(0.0..b[d]),
                    1 => rng.random_range(lo(d)..hi(d)),
                    2 => {
                        let face = if rng.random_bool(0.5) { lo(d) } else { hi(d) };
                        let mut p = [0.0f32; 3];
                        p[d] = face + rng.random_range(-1.5..1.5) * geo.cutoff;
                        let w = crate::decomp::wrap_position(Float3::new(p[0], p[1], p[2]), b);
                        [w.x, w.y, w.z][d]
                    }
                    _ => match edges[d].len() {
                        0 => rng.random_range(0.0..b[d]),
                        k => match rng.random_range(0..k + 4) {
                            j if j < k => edges[d][j],
                            j if j == k => -0.0,
                            _ => rng.random_range(0.0..b[d]),
                        },
                    },
                };
                // A wrapped coordinate is in [0, box) (or -0.0).
                if (0.0..b[d]).contains(&v) { v } else { 0.0 }
            });
            Float3::new(c[0], c[1], c[2])
        })
        .collect();
    let mut ids: Vec<u32> = (0..n as u32).map(|i| 3 * i + 1).collect();
    ids.shuffle(&mut rng);
    (x, ids)
}

/// NVSHMEM's real host library on this machine, if any, for CPU tests that load it without a GPU:
/// `HALO_NVSHMEM_LIB`, else the wheel the kernel build fetched into `target/toolchains`.
pub fn nvshmem_host_library() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("HALO_NVSHMEM_LIB") {
        return Some(std::path::PathBuf::from(p));
    }
    let toolchains = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/toolchains");
    std::fs::read_dir(toolchains)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("nvidia-nvshmem-cu13-")))
        .map(|p| p.join("nvidia/nvshmem/lib/libnvshmem_host.so.3"))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Duration;

    #[test]
    fn a_child_is_captured_and_one_that_hangs_is_killed() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let c = run_captured(cmd, Duration::from_secs(10)).unwrap();
        assert_eq!((c.code, c.stdout.as_str(), c.stderr.as_str(), c.timed_out), (Some(3), "out\n", "err\n", false));
        let mut cmd = Command::new("sleep");
        cmd.arg("10");
        let started = std::time::Instant::now();
        let c = run_captured(cmd, Duration::from_millis(200)).unwrap();
        assert!(c.timed_out && c.code.is_none() && started.elapsed() < Duration::from_secs(5), "{c:?}");
    }

    #[test]
    fn the_promise_comes_from_either_variable_and_a_bad_one_is_an_error() {
        assert_eq!(promised_gpus_from(None, None), Ok(0));
        assert_eq!(promised_gpus_from(None, Some("1")), Ok(1));
        assert_eq!(promised_gpus_from(None, Some("0")), Ok(0));
        assert_eq!(promised_gpus_from(Some("2"), None), Ok(2));
        assert_eq!(promised_gpus_from(Some(" 8 "), Some("1")), Ok(8));
        assert_eq!(promised_gpus_from(Some("0"), Some("1")), Ok(1));
        assert_eq!(promised_gpus_from(Some(""), None), Ok(0));
        let e = promised_gpus_from(Some("two"), None).unwrap_err();
        assert!(e.contains("HALO_REQUIRE_GPUS=\"two\"") && e.contains("HALO_REQUIRE_GPUS=2"), "{e}");
        assert!(promised_gpus_from(Some("-1"), None).is_err());
    }

    #[test]
    fn a_test_runs_fails_or_is_not_run_by_what_it_needs_and_what_was_promised() {
        let absent = GpuStatus::Absent("the CUDA driver found no GPU".into());
        let one = GpuStatus::Present(1);
        let two = GpuStatus::Present(2);
        // Enough GPUs: run, whatever the promise.
        assert_eq!(gpu_verdict(1, &one, 0), GpuVerdict::Run(1));
        assert_eq!(gpu_verdict(2, &two, 8), GpuVerdict::Run(2));
        assert_eq!(gpu_verdict(1, &two, 1), GpuVerdict::Run(2));
        // Nothing promised (CI without GPUs): not run, with the count and the driver's reason.
        match gpu_verdict(1, &absent, 0) {
            GpuVerdict::NotRun { needs: 1, present: 0, why } => assert!(why.contains("found no GPU"), "{why}"),
            v => panic!("{v:?}"),
        }
        // One GPU promised and one present: a two-GPU test is not run, a one-GPU test runs.
        assert!(matches!(gpu_verdict(2, &one, 1), GpuVerdict::NotRun { needs: 2, present: 1, .. }));
        // Two promised, one present: the two-GPU test fails (before: it skipped and passed).
        match gpu_verdict(2, &one, 2) {
            GpuVerdict::Fail(why) => assert!(why.contains("HALO_REQUIRE_GPUS=2") && why.contains("needs 2") && why.contains("1 present"), "{why}"),
            v => panic!("{v:?}"),
        }
        // Promised GPUs and none present: even a one-GPU test fails.
        assert!(matches!(gpu_verdict(1, &absent, 1), GpuVerdict::Fail(_)));
        // A test needing more than promised, with none present, is not run.
        assert!(matches!(gpu_verdict(4, &absent, 2), GpuVerdict::NotRun { needs: 4, present: 0, .. }));
        // A broken driver fails whatever the promise.
        assert!(matches!(gpu_verdict(1, &GpuStatus::DriverFailed("cuInit: 999".into()), 0), GpuVerdict::Fail(w) if w.contains("unusable")));
    }

    #[test]
    fn a_not_run_line_carries_the_reason_and_the_name_the_runner_reads() {
        // run-gpu-tests.sh reads `SKIPPED (<reason>) [<test>]` (xtask's runner tests feed it such lines).
        let l = not_run_line("needs 2 GPUs", "ring of 4 on two GPUs, phase x", "1 present");
        assert_eq!(l, "SKIPPED (needs 2 GPUs) [ring of 4 on two GPUs, phase x]: 1 present");
    }

    #[test]
    fn the_tier_is_default_or_long_and_nothing_else() {
        assert_eq!(long_tier_from(None), Ok(false));
        assert_eq!(long_tier_from(Some("")), Ok(false));
        assert_eq!(long_tier_from(Some("default")), Ok(false));
        assert_eq!(long_tier_from(Some("long")), Ok(true));
        let e = long_tier_from(Some("full")).unwrap_err();
        assert!(e.contains("HALO_TEST_TIER=\"full\"") && e.contains("long"), "{e}");
    }
}
