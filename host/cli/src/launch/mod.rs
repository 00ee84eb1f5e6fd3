//! `halo launch`: runs N ranks of a program (normally the `halo` executable itself) on one node, one
//! per GPU, and treats them as one job.
//!
//! What the launcher guarantees:
//! - each rank gets `HALO_RANK`, `HALO_NRANKS`, `HALO_LOCAL_RANK`, `HALO_DEVICE` (round-robin over
//!   the chosen GPUs) and `HALO_RENDEZVOUS_DIR`, a private directory through which rank 0 hands
//!   NVSHMEM's unique id to the others ([`halo::launch::rendezvous`]); `CUDA_VISIBLE_DEVICES` is left as it is
//!   because ranks select their GPU by ordinal; `NVSHMEM_DISABLE_NVLS=1` and `NCCL_NVLS_ENABLE=0`
//!   are set unless already present (NVLink SHARP must stay off on the shared machines);
//! - every line a rank prints reaches the launcher's stdout/stderr whole, prefixed `[rank N] `;
//! - when a rank exits non-zero or dies by a signal, the others get SIGTERM and, after the grace
//!   period, SIGKILL; SIGINT/SIGTERM/SIGHUP to the launcher do the same (a second one kills at once);
//! - no rank outlives the launcher: each rank leads its own process group (signalled as a whole)
//!   and, on Linux, gets SIGKILL if the launcher dies (`PR_SET_PDEATHSIG`);
//! - the rendezvous directory is removed when the launch ends, whichever way it ends (except when
//!   the launcher itself is SIGKILLed).
//!
//! Processes started by `mpirun`/`srun` instead find their rank through [`RankEnv::from_env`].
//!
//! What a rank needs at run time (its environment, the rendezvous, the errors) is in the library,
//! `halo::launch`; this module starts and supervises the processes.

mod output;
mod sys;

pub use halo::launch::{LaunchError, RankEnv, RendezvousDir, env, rank_list};
pub use sys::parse_signal;

use output::{Forwarders, Sink};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The grace period between SIGTERM and SIGKILL when stopping ranks, unless configured.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);

/// How long the launcher keeps waiting for a rank after SIGKILL before giving up on it (a process
/// stuck in the kernel, e.g. in the GPU driver, cannot die until the driver lets go).
const ABANDON_AFTER_KILL: Duration = Duration::from_secs(10);

/// How often the supervision loop looks at the ranks and at the launcher's signals.
const POLL: Duration = Duration::from_millis(10);

/// How long to wait for the last output of the ranks after they all ended.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// Variables set in every rank unless the launcher's environment already has them: NVLink SHARP
/// (NVLS) multicast objects are a shared, scarce resource on the H200 machines, so the site rule is
/// to leave it off.
const SITE_DEFAULTS: [(&str, &str); 2] = [("NVSHMEM_DISABLE_NVLS", "1"), ("NCCL_NVLS_ENABLE", "0")];

/// What to launch and how.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// Number of ranks.
    pub nranks: usize,
    /// GPU ordinals, assigned round-robin to the ranks; empty means `0..nranks`.
    pub gpus: Vec<usize>,
    /// The program every rank runs (`halo launch` uses its own executable).
    pub program: PathBuf,
    /// Its arguments (for `halo`, the subcommand and its arguments).
    pub args: Vec<OsString>,
    /// Time between SIGTERM and SIGKILL when stopping ranks.
    pub kill_grace: Duration,
    /// Catch SIGINT/SIGTERM/SIGHUP while the ranks run, to stop them in order (turn off when the
    /// embedding program handles signals itself).
    pub handle_signals: bool,
    /// Whether an empty `args` is an error (`halo` itself needs a subcommand).
    pub needs_args: bool,
    /// Start even when the GPUs get different numbers of ranks (NVSHMEM 3.4.5 never finishes its
    /// initialisation then; see [`uneven_layout`]).
    pub allow_uneven_gpus: bool,
}

impl LaunchConfig {
    /// `nranks` ranks of this very executable with `args`, on GPUs `0..nranks`, default grace.
    pub fn this_executable(nranks: usize, args: Vec<OsString>) -> Result<LaunchConfig, LaunchError> {
        let program = std::env::current_exe().map_err(LaunchError::CurrentExe)?;
        let mut config = LaunchConfig::program(nranks, program, args);
        config.needs_args = true;
        Ok(config)
    }

    /// `nranks` ranks of `program` (a path, or a name looked up on the PATH) with `args`, on GPUs
    /// `0..nranks`, default grace.
    pub fn program(nranks: usize, program: PathBuf, args: Vec<OsString>) -> LaunchConfig {
        LaunchConfig {
            nranks,
            gpus: Vec::new(),
            program,
            args,
            kill_grace: DEFAULT_KILL_GRACE,
            handle_signals: true,
            needs_args: false,
            allow_uneven_gpus: false,
        }
    }

    /// The GPU ordinal of `rank`.
    pub fn device_of(&self, rank: usize) -> usize {
        if self.gpus.is_empty() { rank } else { self.gpus[rank % self.gpus.len()] }
    }

    /// How many ranks each GPU gets, by ordinal (GPUs that get none are not listed).
    pub fn ranks_per_gpu(&self) -> BTreeMap<usize, usize> {
        let mut count = BTreeMap::new();
        for rank in 0..self.nranks {
            *count.entry(self.device_of(rank)).or_insert(0) += 1;
        }
        count
    }

    fn validate(&self) -> Result<(), LaunchError> {
        if self.nranks == 0 {
            return Err(LaunchError::InvalidConfig("the number of ranks must be at least 1".into()));
        }
        if self.args.is_empty() && self.needs_args {
            return Err(LaunchError::InvalidConfig("no command to run: give the halo subcommand after `--`, e.g. `halo launch -n 2 -- info`".into()));
        }
        if !self.allow_uneven_gpus
            && let Some(why) = uneven_layout(self.nranks, &self.ranks_per_gpu())
        {
            return Err(LaunchError::InvalidConfig(why));
        }
        Ok(())
    }
}

/// Why `nranks` ranks spread as `per_gpu` (ranks by GPU ordinal) cannot start, or `None` when
/// every GPU gets the same number. NVSHMEM 3.4.5 cannot run an uneven number of PEs per GPU: the
/// PEs compute different internal teams (a GPU-leaders team of size 1 on one GPU, 3 on the other,
/// measured with 3 PEs on 2 H200s) and its initialisation never returns on any rank. The message
/// suggests rank counts that work.
pub fn uneven_layout(nranks: usize, per_gpu: &BTreeMap<usize, usize>) -> Option<String> {
    let (min, max) = (per_gpu.values().min()?, per_gpu.values().max()?);
    if min == max {
        return None;
    }
    let gpus = per_gpu.len();
    let spread: Vec<String> = per_gpu.iter().map(|(gpu, n)| format!("{n} on GPU {gpu}")).collect();
    let list: Vec<String> = per_gpu.keys().map(ToString::to_string).collect();
    let below = nranks / gpus * gpus;
    let above = below + gpus;
    let counts = if below > 0 { format!("-n {below} or -n {above}") } else { format!("-n {above}") };
    Some(format!(
        "{nranks} ranks on GPUs {} would put {}. NVSHMEM 3.4.5 cannot start an uneven number of PEs per GPU: \
         its PEs disagree about their internal teams and initialisation never returns. Use a rank count that is a \
         multiple of the {gpus} GPUs ({counts} with --gpus {}), or give every rank its own GPU (--gpus with {nranks} \
         different GPUs); --allow-uneven-gpus starts it anyway",
        list.join(","),
        spread.join(", "),
        list.join(",")
    ))
}

/// How a rank's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankEnd {
    /// It exited with this code.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
}

impl RankEnd {
    /// Exited with code 0.
    pub fn success(self) -> bool {
        self == RankEnd::Exited(0)
    }

    /// The shell's convention: the exit code, or 128 + the signal number.
    pub fn code(self) -> i32 {
        match self {
            RankEnd::Exited(c) => c,
            RankEnd::Signaled(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for RankEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RankEnd::Exited(c) if c == i32::from(crate::exit::DEADLINE_EXIT_CODE) => {
                write!(f, "exited with code {c} (halo's watchdog: a start-up, collective or GPU wait did not finish in time; see its message)")
            }
            RankEnd::Exited(c) => write!(f, "exited with code {c}"),
            RankEnd::Signaled(s) => write!(f, "was killed by signal {s} ({})", sys::signal_name(s)),
        }
    }
}

/// What happened to one rank.
#[derive(Debug, Clone)]
pub struct RankOutcome {
    /// The rank.
    pub rank: usize,
    /// Its process id.
    pub pid: u32,
    /// The GPU it was given.
    pub device: usize,
    /// How it ended; `None` if it did not end even after SIGKILL (the launcher gave up on it).
    pub end: Option<RankEnd>,
    /// It ended after the launcher had begun stopping the job (so its end is a consequence, not a cause).
    pub stopped: bool,
    /// It was still running when the grace period ran out and got SIGKILL.
    pub needed_kill: bool,
}

/// Why the launcher stopped the job early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// These ranks failed (in the same poll round) while the others ran.
    RankFailed(Vec<usize>),
    /// The launcher received this signal.
    Interrupted(i32),
}

/// The result of a launch.
#[derive(Debug, Clone)]
pub struct LaunchReport {
    /// One entry per rank, in rank order.
    pub ranks: Vec<RankOutcome>,
    /// Why the launcher stopped the job, if it did.
    pub stop: Option<StopReason>,
}

impl LaunchReport {
    /// Every rank exited with code 0 and nothing was stopped.
    pub fn success(&self) -> bool {
        self.stop.is_none() && self.ranks.iter().all(|r| r.end.is_some_and(RankEnd::success))
    }

    /// The launcher's exit code: 0 on success, else the worst code among the ranks that failed on
    /// their own (a signal counts as 128 + its number), 128 + the signal if the launcher was
    /// interrupted, and never 0 when anything failed. Ranks the launcher stopped do not count:
    /// their SIGTERM would otherwise hide the real cause.
    pub fn exit_code(&self) -> u8 {
        if self.success() {
            return 0;
        }
        let own = self.ranks.iter().filter(|r| !r.stopped).filter_map(|r| r.end).filter(|e| !e.success());
        let worst = own.map(RankEnd::code).max();
        let code = match (worst, &self.stop) {
            (Some(c), _) => c,
            (None, Some(StopReason::Interrupted(s))) => 128 + s,
            (None, _) => 1,
        };
        u8::try_from(code.clamp(1, 255)).unwrap_or(1)
    }

    /// A one-line account of a failed launch, e.g. `rank 1 was killed by signal 9 (SIGKILL); stopped
    /// ranks 0, 2`; `None` on success.
    pub fn summary(&self) -> Option<String> {
        if self.success() {
            return None;
        }
        let mut parts: Vec<String> = Vec::new();
        if let Some(StopReason::Interrupted(s)) = self.stop {
            parts.push(format!("interrupted by {}", sys::signal_name(s)));
        }
        for r in self.ranks.iter().filter(|r| !r.stopped) {
            if let Some(end) = r.end.filter(|e| !e.success()) {
                parts.push(format!("rank {} {end}", r.rank));
            }
        }
        let stopped: Vec<usize> = self.ranks.iter().filter(|r| r.stopped).map(|r| r.rank).collect();
        if !stopped.is_empty() {
            let mut text = format!("stopped {}", rank_list(&stopped));
            let killed: Vec<usize> = self.ranks.iter().filter(|r| r.needed_kill).map(|r| r.rank).collect();
            if !killed.is_empty() {
                let _ = write!(text, " ({} ignored SIGTERM and got SIGKILL)", rank_list(&killed));
            }
            parts.push(text);
        }
        let lost: Vec<usize> = self.ranks.iter().filter(|r| r.end.is_none()).map(|r| r.rank).collect();
        if !lost.is_empty() {
            parts.push(format!(
                "{} did not exit within {} s of SIGKILL (stuck in the kernel or GPU driver?)",
                rank_list(&lost),
                ABANDON_AFTER_KILL.as_secs()
            ));
        }
        if parts.is_empty() {
            parts.push("the launch failed".into());
        }
        Some(parts.join("; "))
    }
}

/// One started rank.
struct Rank {
    rank: usize,
    device: usize,
    child: Child,
    end: Option<RankEnd>,
    stopped: bool,
    needed_kill: bool,
    /// Given up on after SIGKILL; not reaped.
    abandoned: bool,
}

impl Rank {
    fn running(&self) -> bool {
        self.end.is_none() && !self.abandoned
    }
}

/// The started ranks. Dropping it (an error or a panic in the launcher) kills and reaps whatever
/// still runs, so no path out of [`launch`] leaves ranks behind.
struct Ranks(Vec<Rank>);

impl Ranks {
    fn signal_running(&mut self, signal: i32) {
        for r in self.0.iter().filter(|r| r.running()) {
            sys::signal_group(r.child.id(), signal);
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        let live: Vec<&mut Rank> = self.0.iter_mut().filter(|r| r.running()).collect();
        if live.is_empty() {
            return;
        }
        for r in &live {
            sys::signal_group(r.child.id(), libc::SIGKILL);
        }
        // Reap boundedly: a process in uninterruptible sleep would otherwise block us forever.
        let deadline = Instant::now() + Duration::from_secs(5);
        for r in live {
            while Instant::now() < deadline {
                match r.child.try_wait() {
                    Ok(None) => std::thread::sleep(POLL),
                    _ => break,
                }
            }
        }
    }
}

/// Runs the job described by `config` to its end and reports how each rank ended.
///
/// Rank output goes to this process's stdout/stderr; short notices about stopping the job go to
/// stderr prefixed `halo launch: `. Returns an error only when the launcher itself fails (a rank
/// cannot be started, ...); failed ranks are reported in the [`LaunchReport`].
pub fn launch(config: &LaunchConfig) -> Result<LaunchReport, LaunchError> {
    config.validate()?;
    // Installed before the first spawn so a Ctrl-C during start-up is not lost.
    let signals = if config.handle_signals { Some(sys::SignalGuard::install().map_err(LaunchError::Signals)?) } else { None };
    // Declared before the ranks so that it is dropped (removed) after they are gone.
    let rendezvous = RendezvousDir::create()?;
    let mut forwarders = Forwarders::new();
    let mut ranks = Ranks(Vec::with_capacity(config.nranks));
    let per_gpu = config.ranks_per_gpu();
    for rank in 0..config.nranks {
        let device = config.device_of(rank);
        let sharing = per_gpu.get(&device).copied().unwrap_or(1);
        let mut child = spawn_rank(config, rank, (device, sharing), &rendezvous)?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        ranks.0.push(Rank { rank, device, child, end: None, stopped: false, needed_kill: false, abandoned: false });
        for (pipe, sink) in [(stdout.map(PipeReader::Out), Sink::Stdout), (stderr.map(PipeReader::Err), Sink::Stderr)] {
            if let Some(pipe) = pipe {
                forwarders.forward(rank, pipe, sink).map_err(|source| LaunchError::Output { rank, source })?;
            }
        }
    }

    let grace = config.kill_grace;
    let mut stop: Option<StopReason> = None;
    let mut kill_at: Option<Instant> = None;
    let mut abandon_at: Option<Instant> = None;
    let mut signals_seen = 0;
    loop {
        if let Some(guard) = &signals {
            let (signal, count) = guard.received();
            if count > signals_seen {
                signals_seen = count;
                if stop.is_none() {
                    stop = Some(StopReason::Interrupted(signal));
                    notice(&format!("received {}", sys::signal_name(signal)), &ranks, grace);
                    ranks.signal_running(libc::SIGTERM);
                    kill_at = Some(Instant::now() + grace);
                } else if count >= 2 {
                    // A second Ctrl-C means "now".
                    kill_at = Some(Instant::now());
                }
            }
        }

        // Look at every rank before deciding, so ranks failing together are all named as causes.
        let stopping = stop.is_some();
        let mut failed_now = Vec::new();
        for r in ranks.0.iter_mut().filter(|r| r.running()) {
            let pid = r.child.id();
            let Some(end) = sys::peek_exit(pid).map_err(|source| LaunchError::Wait { rank: r.rank, source })? else {
                continue;
            };
            // The rank is a zombie, so its group id is still ours: sweep anything it left behind.
            sys::signal_group(pid, libc::SIGKILL);
            r.child.wait().map_err(|source| LaunchError::Wait { rank: r.rank, source })?;
            r.end = Some(end);
            r.stopped = stopping;
            if !stopping && !end.success() {
                failed_now.push((r.rank, end));
            }
        }
        if !failed_now.is_empty() {
            let what: Vec<String> = failed_now.iter().map(|(rank, end)| format!("rank {rank} {end}")).collect();
            stop = Some(StopReason::RankFailed(failed_now.iter().map(|(rank, _)| *rank).collect()));
            notice(&what.join(", "), &ranks, grace);
            ranks.signal_running(libc::SIGTERM);
            kill_at = Some(Instant::now() + grace);
        }

        if ranks.0.iter().all(|r| !r.running()) {
            break;
        }
        let now = Instant::now();
        if kill_at.is_some_and(|t| now >= t) && abandon_at.is_none() {
            for r in ranks.0.iter_mut().filter(|r| r.running()) {
                r.needed_kill = true;
                sys::signal_group(r.child.id(), libc::SIGKILL);
            }
            abandon_at = Some(now + ABANDON_AFTER_KILL);
        }
        if abandon_at.is_some_and(|t| now >= t) {
            for r in ranks.0.iter_mut().filter(|r| r.running()) {
                r.abandoned = true;
                r.stopped = true;
            }
            break;
        }
        std::thread::sleep(POLL);
    }

    forwarders.finish(OUTPUT_DRAIN);
    let outcomes = ranks
        .0
        .iter()
        .map(|r| RankOutcome { rank: r.rank, pid: r.child.id(), device: r.device, end: r.end, stopped: r.stopped, needed_kill: r.needed_kill })
        .collect();
    drop(ranks);
    drop(rendezvous);
    drop(signals);
    Ok(LaunchReport { ranks: outcomes, stop })
}

/// Tells the user, while it happens, why the job is being stopped.
fn notice(cause: &str, ranks: &Ranks, grace: Duration) {
    let running: Vec<usize> = ranks.0.iter().filter(|r| r.running()).map(|r| r.rank).collect();
    if running.is_empty() {
        eprintln!("halo launch: {cause}");
    } else {
        eprintln!("halo launch: {cause}; stopping {} (SIGTERM, SIGKILL after {:.1} s)", rank_list(&running), grace.as_secs_f64());
    }
}

/// Starts `rank` on GPU `device.0`, which `device.1` ranks share.
fn spawn_rank(config: &LaunchConfig, rank: usize, device: (usize, usize), rendezvous: &RendezvousDir) -> Result<Child, LaunchError> {
    let (device, sharing) = device;
    let mut cmd = Command::new(&config.program);
    cmd.args(&config.args)
        .env(env::ENV_RANK, rank.to_string())
        .env(env::ENV_NRANKS, config.nranks.to_string())
        // One node: the local rank is the rank.
        .env(env::ENV_LOCAL_RANK, rank.to_string())
        .env(env::ENV_DEVICE, device.to_string())
        .env(env::ENV_PES_PER_GPU, sharing.to_string())
        .env(env::ENV_RENDEZVOUS_DIR, rendezvous.path())
        // Ranks run in their own process groups, where reading the terminal would stop them (SIGTTIN).
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in SITE_DEFAULTS {
        if std::env::var_os(name).is_none() {
            cmd.env(name, value);
        }
    }
    sys::isolate(&mut cmd);
    cmd.spawn().map_err(|source| LaunchError::Spawn { rank, program: config.program.clone(), source })
}

/// A rank's stdout or stderr pipe, as one type for the forwarding threads.
enum PipeReader {
    Out(std::process::ChildStdout),
    Err(std::process::ChildStderr),
}

impl std::io::Read for PipeReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            PipeReader::Out(p) => p.read(buf),
            PipeReader::Err(p) => p.read(buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(rank: usize, end: Option<RankEnd>, stopped: bool) -> RankOutcome {
        RankOutcome { rank, pid: 1000 + rank as u32, device: rank, end, stopped, needed_kill: false }
    }

    #[test]
    fn success_report() {
        let report = LaunchReport { ranks: vec![outcome(0, Some(RankEnd::Exited(0)), false)], stop: None };
        assert!(report.success());
        assert_eq!(report.exit_code(), 0);
        assert_eq!(report.summary(), None);
    }

    #[test]
    fn the_cause_not_the_stopped_ranks_decides_the_code() {
        let report = LaunchReport {
            ranks: vec![
                outcome(0, Some(RankEnd::Signaled(libc::SIGTERM)), true),
                outcome(1, Some(RankEnd::Signaled(libc::SIGKILL)), false),
                outcome(2, Some(RankEnd::Signaled(libc::SIGTERM)), true),
            ],
            stop: Some(StopReason::RankFailed(vec![1])),
        };
        assert_eq!(report.exit_code(), 128 + 9);
        assert_eq!(report.summary().as_deref(), Some("rank 1 was killed by signal 9 (SIGKILL); stopped ranks 0, 2"));
    }

    #[test]
    fn worst_of_several_failures_and_interrupts() {
        let report = LaunchReport {
            ranks: vec![outcome(0, Some(RankEnd::Exited(3)), false), outcome(1, Some(RankEnd::Exited(7)), false)],
            stop: Some(StopReason::RankFailed(vec![0, 1])),
        };
        assert_eq!(report.exit_code(), 7);
        let report = LaunchReport {
            ranks: vec![outcome(0, Some(RankEnd::Signaled(libc::SIGTERM)), true), outcome(1, None, true)],
            stop: Some(StopReason::Interrupted(libc::SIGINT)),
        };
        assert_eq!(report.exit_code(), 130);
        let summary = report.summary().unwrap_or_default();
        assert!(summary.starts_with("interrupted by SIGINT; stopped ranks 0, 1"), "{summary}");
        assert!(summary.contains("rank 1 did not exit"), "{summary}");
    }

    #[test]
    fn devices_round_robin() {
        let mut config = LaunchConfig {
            nranks: 4,
            gpus: vec![],
            program: "/bin/true".into(),
            args: vec!["x".into()],
            kill_grace: DEFAULT_KILL_GRACE,
            handle_signals: false,
            needs_args: true,
            allow_uneven_gpus: false,
        };
        assert_eq!((0..4).map(|r| config.device_of(r)).collect::<Vec<_>>(), [0, 1, 2, 3]);
        config.gpus = vec![2, 5];
        assert_eq!((0..4).map(|r| config.device_of(r)).collect::<Vec<_>>(), [2, 5, 2, 5]);
        config.nranks = 0;
        assert!(config.validate().is_err());
    }

    #[test]
    fn uneven_pes_per_gpu_are_refused_with_counts_that_work() {
        let mut config = LaunchConfig::program(3, "/bin/true".into(), vec![]);
        config.gpus = vec![0, 1];
        assert_eq!(config.ranks_per_gpu(), BTreeMap::from([(0, 2), (1, 1)]));
        let e = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
        for part in ["3 ranks on GPUs 0,1 would put 2 on GPU 0, 1 on GPU 1", "NVSHMEM 3.4.5", "-n 2 or -n 4 with --gpus 0,1", "--allow-uneven-gpus"] {
            assert!(e.contains(part), "missing {part:?} in {e}");
        }
        config.allow_uneven_gpus = true;
        assert!(config.validate().is_ok());
        // Even layouts start: one rank per GPU, two per GPU, more GPUs listed than ranks.
        for (n, gpus) in [(4, vec![0, 1]), (8, vec![0, 1]), (2, vec![]), (2, vec![0, 1, 2]), (1, vec![3])] {
            let mut c = LaunchConfig::program(n, "/bin/true".into(), vec![]);
            c.gpus = gpus;
            assert!(c.validate().is_ok(), "{n} ranks on {:?}", c.gpus);
        }
        let one = uneven_layout(1, &BTreeMap::from([(0, 1), (1, 0)])).unwrap_or_default();
        assert!(one.contains("-n 2 with"), "{one}");
    }

    #[test]
    fn the_watchdogs_exit_code_is_explained() {
        let end = RankEnd::Exited(i32::from(crate::exit::DEADLINE_EXIT_CODE));
        assert!(end.to_string().contains("watchdog"), "{end}");
        assert_eq!(RankEnd::Exited(3).to_string(), "exited with code 3");
    }

    #[test]
    fn only_halo_itself_needs_a_subcommand() {
        let other = LaunchConfig::program(2, "/bin/true".into(), vec![]);
        assert!(other.validate().is_ok());
        let halo = LaunchConfig::this_executable(2, vec![]).expect("current exe");
        let e = halo.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("no command to run"), "{e}");
    }

    #[test]
    fn launches_shell_ranks_and_stops_the_rest() {
        let config = LaunchConfig {
            nranks: 3,
            gpus: vec![],
            program: "/bin/sh".into(),
            args: vec!["-c".into(), r#"if [ "$HALO_RANK" = 1 ]; then exit 4; fi; sleep 30"#.into()],
            kill_grace: Duration::from_secs(2),
            handle_signals: false,
            needs_args: false,
            allow_uneven_gpus: false,
        };
        let started = Instant::now();
        let report = launch(&config).expect("launch");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(report.exit_code(), 4);
        assert_eq!(report.stop, Some(StopReason::RankFailed(vec![1])));
        assert!(report.ranks[0].stopped && report.ranks[2].stopped);
        assert_eq!(report.ranks[0].end, Some(RankEnd::Signaled(libc::SIGTERM)));
    }
}
