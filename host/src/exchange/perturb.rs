//! Perturbations for reliability tests, as a wrapper over any [`Exchange`] ([`Perturbed`]):
//!
//! - **jitter** ([`Jitter`], `HALO_JITTER_US=MAX[:SEED[:SIDE]]`): before about half of the
//!   launches of every rank, chosen at random, a random delay of 0 to `MAX` µs, on the host (the
//!   launching thread waits) and on the GPU (a [`crate::kernels::spin_delay`] kernel enqueued on the
//!   rank's stream just before its launch, so that rank's kernels start late while its peers run
//!   on). The GPU half is what tests the protocol: a host that queued many steps ahead absorbs
//!   host delays, and in one process a host delay before one rank delays every rank launched
//!   after it; only a delay in the stream skews one rank's GPU timeline against its neighbours'.
//!   Every delay is a pure function of the seed, the rank, the direction and the step
//!   ([`Jitter::delays`]), so a run is reproducible, and the same rank gets the same delays
//!   whether it runs in one process or as a PE.
//! - **faults** ([`Fault`], `HALO_FAULT=kill@STEP:RANK`): rank `RANK` kills itself with SIGKILL
//!   right after enqueueing step `STEP`'s coordinate halo, in the middle of a fused step, so its
//!   peers are left waiting for signals that never come. The library does not end the process
//!   itself: it calls the program's kill hook ([`set_kill_hook`]; the `halo` command's raises
//!   SIGKILL), and without one the exchange returns [`HaloError::KillRequested`].
//!
//! Off by default, at no cost: [`Placement::exchange`](super::Placement::exchange) wraps an
//! exchange only when this process asked for a perturbation ([`for_process`]: the environment, or
//! [`install`] from a command-line flag). Steps are counted per process over every exchange it
//! builds (the MD step replans, or rebuilds, its exchange at search steps), one per forward exchange.
//! Captured graphs replay without the wrapper, so they run unperturbed.

use super::interface::{Exchange, ReplanFence};
use super::rank::RankExchange;
use crate::desc::RankHalo;
use crate::desc::{Element, Transport};
use crate::error::CudaContextExt;
use crate::error::{HaloError, Result};
use crate::gpu::{CudaStream, DeviceBuffer, DeviceMemory};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The environment variable that turns jitter on: `MAX_US[:SEED[:host|gpu|both]]`.
pub const JITTER_ENV: &str = "HALO_JITTER_US";

/// The environment variable that injects a fault: `kill@STEP:RANK`.
pub const FAULT_ENV: &str = "HALO_FAULT";

/// Which side of a launch a jitter delays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JitterSide {
    /// The launching thread waits before the launch.
    Host,
    /// A delay kernel holds the rank's stream before the launch.
    Gpu,
    /// Both, drawn independently.
    Both,
}

impl JitterSide {
    fn name(self) -> &'static str {
        match self {
            JitterSide::Host => "host",
            JitterSide::Gpu => "gpu",
            JitterSide::Both => "both",
        }
    }
}

/// Which exchange of a step a launch belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The coordinate halo (forward, gather chain).
    Forward,
    /// The force halo (reverse, accumulate chain).
    Reverse,
}

/// Random delays before random ranks' launches (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Jitter {
    /// The longest delay, in microseconds (at least 1, at most [`Jitter::MAX_US`]).
    pub max_us: u32,
    /// The seed every delay derives from.
    pub seed: u64,
    /// Where the delays go.
    pub side: JitterSide,
}

/// The delays of one rank's launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delays {
    /// How long the launching thread waits first (zero: no delay).
    pub host: Duration,
    /// How long a delay kernel holds the rank's stream first (zero: no delay kernel).
    pub gpu: Duration,
}

impl Jitter {
    /// The longest delay accepted (1 s): a longer one would look like a dead peer to a device
    /// wait with the default 5 s deadline after a few delayed steps in a row.
    pub const MAX_US: u32 = crate::desc::JITTER_MAX_US;
    /// The seed when none is given.
    pub const DEFAULT_SEED: u64 = 1;

    /// Parses `MAX_US[:SEED[:host|gpu|both]]` (`device` is accepted for `gpu`). `Ok(None)` for
    /// `0` or an empty value: jitter off.
    pub fn parse(s: &str) -> std::result::Result<Option<Self>, String> {
        const FORM: &str =
            "write MAX_US[:SEED[:host|gpu|both]], for example 30:7 (up to 30 µs before about half of the launches, seed 7, host and GPU)";
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        let mut parts = s.split(':');
        let max = parts.next().unwrap_or_default().trim();
        let max_us: u64 = max.parse().map_err(|_| format!("`{max}` is not a number of microseconds: {FORM}"))?;
        if max_us == 0 {
            return Ok(None);
        }
        if max_us > u64::from(Self::MAX_US) {
            return Err(format!(
                "{max_us} µs is longer than the {} µs (1 s) jitter allows: delays that long look like a dead peer to the device waits",
                Self::MAX_US
            ));
        }
        let seed = match parts.next().map(str::trim) {
            None | Some("") => Self::DEFAULT_SEED,
            Some(v) => v.parse().map_err(|_| format!("`{v}` is not a seed (a whole number): {FORM}"))?,
        };
        let side = match parts.next().map(|v| v.trim().to_ascii_lowercase()) {
            None => JitterSide::Both,
            Some(v) => match v.as_str() {
                "" | "both" => JitterSide::Both,
                "host" => JitterSide::Host,
                "gpu" | "device" => JitterSide::Gpu,
                other => return Err(format!("`{other}` is not a side: use host, gpu or both ({FORM})")),
            },
        };
        if let Some(extra) = parts.next() {
            return Err(format!("unexpected `:{extra}`: {FORM}"));
        }
        Ok(Some(Jitter { max_us: max_us as u32, seed, side }))
    }

    /// The delays of `rank`'s launch in `direction` at `step`: a pure function of the seed and
    /// these three, so any process computes the same delays for the same launch. Each side is
    /// delayed with probability 1/2, by a uniform 0..=`max_us` µs.
    pub fn delays(&self, rank: usize, direction: Direction, step: u64) -> Delays {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(rank as u64);
        // Four 32-bit words (two draws) per launch: launches never share a draw.
        let launch = u128::from(step) * 2 + u128::from(direction == Direction::Reverse);
        rng.set_word_pos(launch * 4);
        let (host, gpu) = (rng.next_u64(), rng.next_u64());
        let pick = |draw: u64, on: bool| {
            let us = if on && draw & 1 == 1 { (draw >> 1) % (u64::from(self.max_us) + 1) } else { 0 };
            Duration::from_micros(us)
        };
        Delays { host: pick(host, self.side != JitterSide::Gpu), gpu: pick(gpu, self.side != JitterSide::Host) }
    }
}

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = match self.side {
            JitterSide::Host => "on the host",
            JitterSide::Gpu => "on the GPU",
            JitterSide::Both => "on the host and on the GPU",
        };
        write!(
            f,
            "jitter: up to {} µs before about half of the launches of every rank, {side} (seed {}; {JITTER_ENV}={}:{}:{})",
            self.max_us,
            self.seed,
            self.max_us,
            self.seed,
            self.side.name()
        )
    }
}

/// A fault injected into one rank (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The rank raises SIGKILL right after enqueueing the coordinate halo of `step` (0-based,
    /// counted over this process's forward exchanges).
    Kill {
        /// The step.
        step: u64,
        /// The rank that dies.
        rank: usize,
    },
    /// A negative control: right after the coordinate halo of `step`, one atom that `rank`
    /// received in `pulse` is overwritten on the GPU (its first component becomes
    /// [`CORRUPT_VALUE`]), as a halo that delivered a wrong value would leave it. Every check
    /// that compares the halo must fail and name the atom.
    CorruptAtom {
        /// The receiving rank.
        rank: usize,
        /// The pulse that delivers the atom.
        pulse: usize,
        /// The atom's place in the pulse's receive range (`None`: the middle one).
        slot: Option<usize>,
        /// The step.
        step: u64,
    },
    /// A negative control: the coordinate halo of `step` leaves one atom that `rank` receives in
    /// `pulse` at the value the previous step's halo left there, on the GPU (the slot is saved
    /// after step `step - 1`'s halo and written back after step `step`'s), as a store that never
    /// landed would. `step` is at least 1.
    DropAtom {
        /// The receiving rank.
        rank: usize,
        /// The pulse that should deliver the atom.
        pulse: usize,
        /// The atom's place in the pulse's receive range (`None`: the middle one).
        slot: Option<usize>,
        /// The step.
        step: u64,
    },
}

/// The bits a [`Fault::CorruptAtom`] writes into the first 32-bit component of its atom: 1234.5
/// (a coordinate far outside any box halo runs, so the error is plain in every report).
pub const CORRUPT_VALUE: f32 = 1234.5;

impl Fault {
    /// Parses `kill@STEP:RANK`, `corrupt-atom:rank=R,pulse=P[,slot=K][,step=S]` or
    /// `drop-atom:rank=R,pulse=P[,slot=K][,step=S]`. `Ok(None)` for an empty value.
    pub fn parse(s: &str) -> std::result::Result<Option<Self>, String> {
        const FORM: &str = "write kill@STEP:RANK, for example kill@5500:1 (rank 1 kills itself right after enqueueing step 5500's coordinate halo), \
                            or, as a negative control, corrupt-atom:rank=R,pulse=P[,slot=K][,step=S] or drop-atom:rank=R,pulse=P[,slot=K][,step=S]";
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        if let Some((kind, args)) = s.split_once(':').filter(|(k, _)| matches!(k.trim(), "corrupt-atom" | "drop-atom")) {
            return Self::parse_atom(kind.trim(), args, FORM).map(Some);
        }
        let (kind, at) = s.split_once('@').ok_or_else(|| format!("`{s}` names no step: {FORM}"))?;
        if kind.trim() != "kill" {
            return Err(format!("`{}` is not a fault halo can inject (kill, corrupt-atom, drop-atom): {FORM}", kind.trim()));
        }
        let (step, rank) = at.split_once(':').ok_or_else(|| format!("`{at}` names no rank: {FORM}"))?;
        let step = step.trim().parse().map_err(|_| format!("`{}` is not a step number: {FORM}", step.trim()))?;
        let rank = rank.trim().parse().map_err(|_| format!("`{}` is not a rank number: {FORM}", rank.trim()))?;
        Ok(Some(Fault::Kill { step, rank }))
    }

    /// `rank=R,pulse=P[,slot=K][,step=S]` of `corrupt-atom` or `drop-atom`.
    fn parse_atom(kind: &str, args: &str, form: &str) -> std::result::Result<Self, String> {
        let (mut rank, mut pulse, mut slot, mut step) = (None, None, None, None);
        for part in args.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| format!("`{part}` is not KEY=VALUE: {form}"))?;
            let number: u64 = value.trim().parse().map_err(|_| format!("`{}` is not a whole number ({}): {form}", value.trim(), key.trim()))?;
            match key.trim() {
                "rank" => rank = Some(number as usize),
                "pulse" => pulse = Some(number as usize),
                "slot" => slot = Some(number as usize),
                "step" => step = Some(number),
                other => return Err(format!("`{other}` is not a setting of {kind} (rank, pulse, slot, step): {form}")),
            }
        }
        let rank = rank.ok_or_else(|| format!("{kind} names no rank: {form}"))?;
        let pulse = pulse.ok_or_else(|| format!("{kind} names no pulse: {form}"))?;
        if kind == "drop-atom" {
            let step = step.unwrap_or(1);
            if step == 0 {
                return Err(format!("drop-atom at step 0 has no previous halo to leave in place: give step=1 or later ({form})"));
            }
            Ok(Fault::DropAtom { rank, pulse, slot, step })
        } else {
            Ok(Fault::CorruptAtom { rank, pulse, slot, step: step.unwrap_or(0) })
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slot = |s: &Option<usize>| s.map_or_else(|| "the middle atom".to_string(), |k| format!("atom {k}"));
        let slot_arg = |s: &Option<usize>| s.map_or_else(String::new, |k| format!(",slot={k}"));
        match self {
            Fault::Kill { step, rank } => {
                write!(
                    f,
                    "fault: rank {rank} kills itself (SIGKILL) right after enqueueing step {step}'s coordinate halo ({FAULT_ENV}=kill@{step}:{rank})"
                )
            }
            Fault::CorruptAtom { rank, pulse, slot: s, step } => write!(
                f,
                "fault (negative control): after step {step}'s coordinate halo, {} of those rank {rank} received in pulse {pulse} is overwritten on the GPU \
                 (x = {CORRUPT_VALUE}) ({FAULT_ENV}=corrupt-atom:rank={rank},pulse={pulse}{},step={step})",
                slot(s),
                slot_arg(s)
            ),
            Fault::DropAtom { rank, pulse, slot: s, step } => write!(
                f,
                "fault (negative control): step {step}'s coordinate halo leaves {} of those rank {rank} receives in pulse {pulse} at its value of step {} on the GPU \
                 ({FAULT_ENV}=drop-atom:rank={rank},pulse={pulse}{},step={step})",
                slot(s),
                step - 1,
                slot_arg(s)
            ),
        }
    }
}

/// An atom a [`Fault::CorruptAtom`] or [`Fault::DropAtom`] changed, for the run's report and for
/// tests that check that every comparison names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InjectedAtom {
    /// The fault.
    pub fault: Fault,
    /// The receiving rank.
    pub rank: usize,
    /// The step (forward exchanges of this perturbation, 0-based).
    pub step: u64,
    /// Where the atom sits on the rank (pulse, sender, slot).
    pub place: crate::desc::AtomPlace,
}

impl fmt::Display for InjectedAtom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.fault {
            Fault::DropAtom { .. } => "dropped (left at the previous step's value)",
            _ => "corrupted",
        };
        write!(f, "injected: rank {}'s {} {what} on the GPU at step {}", self.rank, self.place, self.step)
    }
}

/// What the wrapper does around one launch of the local ranks ([`Perturbation::plan`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchPlan {
    /// The step (0-based, per direction, over this process).
    pub step: u64,
    /// How long the launching thread waits first: the longest host delay of the local ranks (one
    /// thread launches them all).
    pub host: Duration,
    /// Each local rank's GPU delay, in local-rank order.
    pub gpu: Vec<Duration>,
    /// The local rank that kills itself after this launch, if any.
    pub kill: Option<usize>,
}

/// How much jitter a process applied, for the run's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JitterStats {
    /// Launches of the local ranks (each direction of each step of each rank counts one).
    pub launches: u64,
    /// Delays the launching thread waited.
    pub host_delays: u64,
    /// Their total.
    pub host_total: Duration,
    /// Delay kernels enqueued.
    pub gpu_delays: u64,
    /// Their total.
    pub gpu_total: Duration,
}

impl JitterStats {
    /// What was applied since `earlier` (a snapshot of the same process).
    pub fn since(&self, earlier: &JitterStats) -> JitterStats {
        JitterStats {
            launches: self.launches - earlier.launches.min(self.launches),
            host_delays: self.host_delays - earlier.host_delays.min(self.host_delays),
            host_total: self.host_total.saturating_sub(earlier.host_total),
            gpu_delays: self.gpu_delays - earlier.gpu_delays.min(self.gpu_delays),
            gpu_total: self.gpu_total.saturating_sub(earlier.gpu_total),
        }
    }
}

impl fmt::Display for JitterStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mean = |total: Duration, n: u64| if n == 0 { 0.0 } else { total.as_secs_f64() * 1e6 / n as f64 };
        write!(
            f,
            "jitter applied: {} rank launches, {} delayed on the GPU (mean {:.1} µs, {:.3} s in all), {} on the host (mean {:.1} µs, {:.3} s in all)",
            self.launches,
            self.gpu_delays,
            mean(self.gpu_total, self.gpu_delays),
            self.gpu_total.as_secs_f64(),
            self.host_delays,
            mean(self.host_total, self.host_delays),
            self.host_total.as_secs_f64()
        )
    }
}

/// A process's jitter and fault, with its step counters and what it applied so far. Shared by
/// every exchange of the process (an `Arc`), so steps count across exchanges.
#[derive(Debug, Default)]
pub struct Perturbation {
    jitter: Option<Jitter>,
    fault: Option<Fault>,
    steps: [AtomicU64; 2],
    launches: AtomicU64,
    host_delays: AtomicU64,
    host_ns: AtomicU64,
    gpu_delays: AtomicU64,
    gpu_ns: AtomicU64,
    /// The atoms a negative-control fault changed so far.
    injected: std::sync::Mutex<Vec<InjectedAtom>>,
}

impl Perturbation {
    /// A perturbation, or `None` when neither is given (nothing to do).
    pub fn new(jitter: Option<Jitter>, fault: Option<Fault>) -> Option<Arc<Self>> {
        (jitter.is_some() || fault.is_some()).then(|| Arc::new(Self { jitter, fault, ..Self::default() }))
    }

    /// Parses the values of [`JITTER_ENV`] and [`FAULT_ENV`] (or of the flags that stand for
    /// them; `names` says which, for the error). `None` when both are off.
    pub fn parse(jitter: Option<&str>, fault: Option<&str>, names: (&str, &str)) -> Result<Option<Arc<Self>>> {
        let bad = |name: &str, value: &str, e: String| HaloError::InvalidInput(format!("{name}={value:?}: {e}"));
        let j = jitter.map(|v| Jitter::parse(v).map_err(|e| bad(names.0, v, e))).transpose()?.flatten();
        let f = fault.map(|v| Fault::parse(v).map_err(|e| bad(names.1, v, e))).transpose()?.flatten();
        Ok(Self::new(j, f))
    }

    /// The perturbation [`JITTER_ENV`] and [`FAULT_ENV`] ask for (`None`: neither is set).
    pub fn from_env() -> Result<Option<Arc<Self>>> {
        Self::parse(std::env::var(JITTER_ENV).ok().as_deref(), std::env::var(FAULT_ENV).ok().as_deref(), (JITTER_ENV, FAULT_ENV))
    }

    /// The jitter, if any.
    pub fn jitter(&self) -> Option<Jitter> {
        self.jitter
    }

    /// The fault, if any.
    pub fn fault(&self) -> Option<Fault> {
        self.fault
    }

    /// The atoms a [`Fault::CorruptAtom`] or [`Fault::DropAtom`] changed so far (rank, step,
    /// local index, pulse, sender), in the order they were changed.
    pub fn injected(&self) -> Vec<InjectedAtom> {
        self.injected.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What the perturbation does, one line per part.
    pub fn describe(&self) -> Vec<String> {
        self.jitter.iter().map(ToString::to_string).chain(self.fault.iter().map(ToString::to_string)).collect()
    }

    /// What the jitter applied so far.
    pub fn stats(&self) -> JitterStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        JitterStats {
            launches: load(&self.launches),
            host_delays: load(&self.host_delays),
            host_total: Duration::from_nanos(load(&self.host_ns)),
            gpu_delays: load(&self.gpu_delays),
            gpu_total: Duration::from_nanos(load(&self.gpu_ns)),
        }
    }

    /// The next launch in `direction` of the local ranks `ranks` (global rank ids): its step,
    /// delays and fault. Advances the step counter of `direction` and the statistics.
    pub fn plan(&self, direction: Direction, ranks: &[usize]) -> LaunchPlan {
        let step = self.steps[direction as usize].fetch_add(1, Ordering::Relaxed);
        let delays: Vec<Delays> = ranks.iter().map(|&r| self.jitter.map(|j| j.delays(r, direction, step)).unwrap_or_default()).collect();
        let host = delays.iter().map(|d| d.host).max().unwrap_or_default();
        let gpu: Vec<Duration> = delays.iter().map(|d| d.gpu).collect();
        let count = |n: &AtomicU64, sum: &AtomicU64, d: Duration| {
            if !d.is_zero() {
                n.fetch_add(1, Ordering::Relaxed);
                sum.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
            }
        };
        self.launches.fetch_add(ranks.len() as u64, Ordering::Relaxed);
        count(&self.host_delays, &self.host_ns, host);
        for d in &gpu {
            count(&self.gpu_delays, &self.gpu_ns, *d);
        }
        let kill = match self.fault {
            Some(Fault::Kill { step: s, rank }) if direction == Direction::Forward && s == step && ranks.contains(&rank) => Some(rank),
            _ => None,
        };
        LaunchPlan { step, host, gpu, kill }
    }

    /// Refuses a fault that cannot be injected into an exchange of the local ranks `ranks`: a
    /// kill ends the whole process, so its rank must be the only one here.
    pub fn check_layout(&self, ranks: &[usize]) -> Result<()> {
        if let Some(Fault::Kill { rank, .. }) = self.fault
            && ranks.contains(&rank)
            && ranks.len() > 1
        {
            let others: Vec<String> = ranks.iter().filter(|&&r| r != rank).map(ToString::to_string).collect();
            return Err(HaloError::InvalidInput(format!(
                "{FAULT_ENV}=kill@..:{rank}: rank {rank} shares this process with rank(s) {}, and killing it would kill them too: \
                 run one rank per process (`halo launch -n N -- ...`, mpiexec or srun)",
                others.join(", ")
            )));
        }
        Ok(())
    }
}

/// The perturbation of this process: set once, by [`install`] or else from the environment.
static PROCESS: OnceLock<std::result::Result<Option<Arc<Perturbation>>, String>> = OnceLock::new();

/// Fixes this process's perturbation (a command-line flag), before any exchange is built.
/// Refused once [`for_process`] has read the environment or another `install` ran.
pub fn install(p: Option<Arc<Perturbation>>) -> Result<()> {
    PROCESS
        .set(Ok(p))
        .map_err(|_| HaloError::InvalidInput("the jitter and fault of this process were already fixed before the flags were read".into()))
}

/// This process's perturbation: what [`install`] set, or else what [`JITTER_ENV`] and
/// [`FAULT_ENV`] ask for (read once).
pub fn process() -> Result<Option<Arc<Perturbation>>> {
    PROCESS.get_or_init(|| Perturbation::from_env().map_err(|e| e.to_string())).clone().map_err(HaloError::InvalidInput)
}

/// `x` itself when this process asked for no perturbation, else `x` wrapped in [`Perturbed`].
pub fn for_process<T: Element>(x: Box<dyn Exchange<T>>) -> Result<Box<dyn Exchange<T>>> {
    match process()? {
        None => Ok(x),
        Some(p) => Ok(Box::new(Perturbed::new(x, p)?)),
    }
}

/// Waits `d` on this thread with microsecond precision: sleeps all but the last 100 µs (the
/// scheduler's wake-up latency), then spins.
pub fn wait_precisely(d: Duration) {
    let deadline = Instant::now() + d;
    let asleep = asleep_part(d);
    if !asleep.is_zero() {
        std::thread::sleep(asleep);
    }
    while Instant::now() < deadline {
        std::hint::spin_loop();
    }
}

/// The part of [`wait_precisely`]'s wait spent asleep: all but the last 100 µs (the scheduler's
/// wake-up latency), nothing for a wait of 200 µs or less; the rest is spun.
fn asleep_part(d: Duration) -> Duration {
    let margin = Duration::from_micros(100);
    if d > 2 * margin { d - margin } else { Duration::ZERO }
}

/// A `kill` fault that is due: rank `rank` should die right after enqueueing step `step`'s
/// coordinate halo, the way a crash or the OOM killer would end it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KillRequest {
    /// The rank that dies.
    pub rank: usize,
    /// The step.
    pub step: u64,
}

impl KillRequest {
    /// The line a kill hook prints before it ends the process, with the time (for the tests that
    /// measure how long the peers take to notice).
    pub fn message(&self) -> String {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        format!(
            "halo: {FAULT_ENV}: rank {} kills itself with SIGKILL right after enqueueing step {}'s coordinate halo (at {:.6} s since the epoch)",
            self.rank,
            self.step,
            now.as_secs_f64()
        )
    }
}

/// What the program does with a due `kill` fault ([`set_kill_hook`]).
static KILL_HOOK: std::sync::Mutex<Option<fn(&KillRequest)>> = std::sync::Mutex::new(None);

/// Installs the program's `kill` fault: `hook` is called when a `kill@STEP:RANK` fault is due and
/// should end the process the way a crash would (the `halo` command's prints
/// [`KillRequest::message`] and raises SIGKILL). The library never ends the process itself: with
/// no hook installed, the exchange returns [`HaloError::KillRequested`]. A hook that returns lets
/// the exchange go on.
pub fn set_kill_hook(hook: fn(&KillRequest)) {
    *KILL_HOOK.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
}

/// Carries out a due `kill` fault through the program's hook, or refuses it without one.
fn request_kill(request: KillRequest) -> Result<()> {
    let hook = *KILL_HOOK.lock().unwrap_or_else(|p| p.into_inner());
    match hook {
        Some(hook) => {
            hook(&request);
            Ok(())
        }
        None => Err(HaloError::KillRequested {
            fault: format!("{FAULT_ENV}=kill@{}:{}", request.step, request.rank),
            rank: request.rank,
            step: request.step,
        }),
    }
}

/// An exchange with this process's jitter and fault around every launch (see the module
/// documentation). Everything else is passed through unchanged.
pub struct Perturbed<E> {
    inner: E,
    p: Arc<Perturbation>,
    ranks: Vec<usize>,
    /// A [`Fault::DropAtom`]'s slot as the previous step's halo left it: (local rank index, local
    /// atom, its bytes on the GPU).
    saved: Option<(usize, usize, DeviceBuffer<u8>)>,
}

impl<E> Perturbed<E> {
    /// Wraps `inner`, whose local ranks are known from [`Exchange::local_ranks`]. With GPU jitter,
    /// every local rank's spinning grids are capped one block lower per rank on its GPU, so a
    /// delay kernel always finds room beside the spinning blocks it delays (otherwise it could
    /// wait behind blocks that wait for the rank it holds back).
    pub fn new<T: Element>(mut inner: E, p: Arc<Perturbation>) -> Result<Self>
    where
        E: Exchange<T>,
    {
        if p.jitter.is_some_and(|j| j.side != JitterSide::Host) {
            leave_room_for_delay_kernels(inner.local_ranks_mut())?;
        }
        let ranks = inner.local_ranks().iter().map(RankExchange::rank).collect();
        Self::with_ranks(inner, p, ranks)
    }

    /// Wraps `inner` whose local ranks are `ranks` (for exchanges that hold no
    /// [`RankExchange`], such as test doubles; GPU delays go only to ranks that
    /// [`Exchange::local_ranks`] lists).
    pub fn with_ranks(inner: E, p: Arc<Perturbation>, ranks: Vec<usize>) -> Result<Self> {
        p.check_layout(&ranks)?;
        Ok(Self { inner, p, ranks, saved: None })
    }

    /// The wrapped exchange.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// The perturbation.
    pub fn perturbation(&self) -> &Arc<Perturbation> {
        &self.p
    }

    /// The next launch's plan, applied before the launch: the host waits, then each local rank's
    /// delay kernel goes on its stream.
    fn before<T: Element>(&mut self, direction: Direction) -> Result<LaunchPlan>
    where
        E: Exchange<T>,
    {
        let plan = self.p.plan(direction, &self.ranks);
        if !plan.host.is_zero() {
            wait_precisely(plan.host);
        }
        let (ranks, streams): (&[RankExchange<T>], &[Arc<CudaStream>]) = (self.inner.local_ranks(), self.inner.streams());
        for ((rank, stream), d) in ranks.iter().zip(streams).zip(&plan.gpu) {
            if !d.is_zero() {
                crate::kernels::spin_delay(rank.module(), stream, d.as_nanos() as u64)?;
            }
        }
        Ok(plan)
    }

    /// A negative-control fault's work after the coordinate halo of `step` has been enqueued on
    /// the local ranks' streams: a corrupted atom is overwritten, a dropped one saved (after the
    /// step before its own) or written back to that saved value (after its own), each on the
    /// rank's stream, so the GPU changes the atom after the halo's kernels and before anything
    /// later on that stream reads it.
    fn inject_after_halo<T: Element>(&mut self, step: u64) -> Result<()>
    where
        E: Exchange<T>,
    {
        let Some(fault) = self.p.fault else { return Ok(()) };
        let (rank, pulse, slot, at, drop) = match fault {
            Fault::CorruptAtom { rank, pulse, slot, step: at } => (rank, pulse, slot, at, false),
            Fault::DropAtom { rank, pulse, slot, step: at } => (rank, pulse, slot, at, true),
            Fault::Kill { .. } => return Ok(()),
        };
        let (save, change) = (drop && step + 1 == at, step == at);
        if !save && !change {
            return Ok(());
        }
        let (ranks, streams): (&[RankExchange<T>], &[Arc<CudaStream>]) = (self.inner.local_ranks(), self.inner.streams());
        let Some(i) = ranks.iter().position(|r| r.rank() == rank) else { return Ok(()) };
        let (r, stream) = (&ranks[i], &streams[i]);
        let halo = r.halo();
        let Some(p) = halo.pulses.get(pulse) else {
            return Err(HaloError::InvalidInput(format!("{FAULT_ENV}: rank {rank} has {} pulses, no pulse {pulse}", halo.pulses.len())));
        };
        let k = slot.unwrap_or(p.recv_size / 2);
        if k >= p.recv_size {
            return Err(HaloError::InvalidInput(format!(
                "{FAULT_ENV}: rank {rank} receives {} atoms in pulse {pulse}, so it has no slot {k} to change (slots 0..{})",
                p.recv_size, p.recv_size
            )));
        }
        let local = p.atom_offset + k;
        let bytes = size_of::<T>();
        if bytes < 4 || !bytes.is_multiple_of(4) {
            return Err(HaloError::InvalidInput(format!("{FAULT_ENV}: an element of {bytes} bytes has no 32-bit component to change")));
        }
        let atom = r.x.device_ptr_at(local);
        r.context().bind_to_thread().during("binding the context")?;
        if save {
            let keep = DeviceBuffer::<u8>::uninit(r.context(), bytes)?;
            // SAFETY: both ranges lie inside their allocations (`local` < total atoms, checked by the
            // layout; `keep` holds `bytes`); the copy runs in the rank's stream order, and `keep`
            // lives in `self` until after the write-back, which is enqueued on the same stream.
            unsafe { cudarc::driver::result::memcpy_dtod_async(keep.device_ptr(), atom, bytes, stream.cu_stream()) }.during("saving a halo slot")?;
            self.saved = Some((i, local, keep));
            return Ok(());
        }
        if drop {
            let Some((_, kept, keep)) = self.saved.as_ref().filter(|(j, kept, _)| *j == i && *kept == local) else {
                return Err(HaloError::InvalidInput(format!(
                    "{FAULT_ENV}: rank {rank}'s slot {k} of pulse {pulse} was not saved after step {}'s halo (the layout changed in between)",
                    at - 1
                )));
            };
            // SAFETY: as above; the same stream orders the save before this write-back.
            unsafe { cudarc::driver::result::memcpy_dtod_async(r.x.device_ptr_at(*kept), keep.device_ptr(), bytes, stream.cu_stream()) }
                .during("writing back a halo slot")?;
        } else {
            // SAFETY: four bytes at the start of element `local`, inside the coordinate buffer.
            unsafe { cudarc::driver::sys::cuMemsetD32Async(atom, CORRUPT_VALUE.to_bits(), 1, stream.cu_stream()) }
                .result()
                .during("overwriting a halo slot")?;
        }
        let place = halo.place_of(local);
        self.p.injected.lock().unwrap_or_else(|e| e.into_inner()).push(InjectedAtom { fault, rank, step, place });
        Ok(())
    }
}

/// Caps the spinning grids of `ranks` so that, per GPU, one block per rank stays free.
fn leave_room_for_delay_kernels<T: Element>(ranks: &mut [RankExchange<T>]) -> Result<()> {
    let ordinals: Vec<usize> = ranks.iter().map(|r| r.context().ordinal()).collect();
    for (i, rank) in ranks.iter_mut().enumerate() {
        let sharing = ordinals.iter().filter(|&&o| o == ordinals[i]).count() as u32;
        let (sms, per_sm) = rank.residency()?;
        let pulses = rank.halo().pulses.len().max(1);
        // Two grids per rank where the fused launches overlap (see `residency`).
        let Some(fit) = super::residency::fit(sms * per_sm, sharing, sharing, pulses) else {
            return Err(HaloError::InvalidInput(format!(
                "{sharing} ranks x {pulses} pulses of spinning blocks and a delay kernel per rank cannot all be resident on GPU {} \
                 ({sms} SMs x {per_sm} blocks): turn GPU jitter off ({JITTER_ENV}=MAX:SEED:host) or use fewer ranks per GPU",
                ordinals[i]
            )));
        };
        rank.fit_grids(fit);
    }
    Ok(())
}

impl<T: Element, E: Exchange<T>> Exchange<T> for Perturbed<E> {
    fn local_ranks(&self) -> &[RankExchange<T>] {
        self.inner.local_ranks()
    }
    fn local_ranks_mut(&mut self) -> &mut [RankExchange<T>] {
        self.inner.local_ranks_mut()
    }
    fn streams(&self) -> &[Arc<CudaStream>] {
        self.inner.streams()
    }
    fn check_transport(&self, transport: Transport) -> Result<()> {
        self.inner.check_transport(transport)
    }
    fn exchange_forward(&mut self, transport: Transport) -> Result<()> {
        let plan = self.before::<T>(Direction::Forward)?;
        self.inner.exchange_forward(transport)?;
        if let Some(rank) = plan.kill {
            request_kill(KillRequest { rank, step: plan.step })?;
        }
        self.inject_after_halo::<T>(plan.step)?;
        Ok(())
    }
    fn exchange_reverse_accumulate(&mut self, transport: Transport) -> Result<()> {
        self.before::<T>(Direction::Reverse)?;
        self.inner.exchange_reverse_accumulate(transport)
    }
    fn finish(&mut self) -> Result<()> {
        self.inner.finish()
    }
    fn use_streams(&mut self, streams: &[Arc<CudaStream>]) -> Result<()> {
        self.inner.use_streams(streams)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn host_syncs(&self) -> u64 {
        self.inner.host_syncs()
    }
    fn reset_protocol(&mut self) -> Result<()> {
        self.inner.reset_protocol()
    }
    fn replan(&mut self, halos: Vec<RankHalo>) -> Result<bool> {
        // The grids keep the cap that left room for delay kernels (a replan keeps every cap).
        self.inner.replan(halos)
    }
    fn fits(&self, halos: &[RankHalo]) -> bool {
        self.inner.fits(halos)
    }
    fn replan_fenced(&mut self, halos: Vec<RankHalo>, fence: ReplanFence) -> Result<bool> {
        // The fence is the inner exchange's: a delay kernel runs on the stream of the launch it
        // delays, so the caller's wait for its streams covers it.
        self.inner.replan_fenced(halos, fence)
    }
    fn replan_barriers(&self) -> u64 {
        self.inner.replan_barriers()
    }
    fn routes(&self) -> Vec<crate::route::RoutedSummary> {
        self.inner.routes()
    }
    fn set_wait_timeout(&mut self, timeout: Duration) {
        self.inner.set_wait_timeout(timeout)
    }
    fn read_forward(&self) -> Result<Vec<Vec<T>>> {
        self.inner.read_forward()
    }
    fn read_reverse(&self) -> Result<Vec<Vec<T>>> {
        self.inner.read_reverse()
    }
}

/// A boxed exchange is an exchange (so `perturb::Perturbed` can wrap what
/// [`Placement::exchange`](super::Placement::exchange) builds). Every method is passed through,
/// the provided ones too, so an implementation's own versions are kept.
impl<T: Element, E: Exchange<T> + ?Sized> Exchange<T> for Box<E> {
    fn local_ranks(&self) -> &[RankExchange<T>] {
        (**self).local_ranks()
    }
    fn local_ranks_mut(&mut self) -> &mut [RankExchange<T>] {
        (**self).local_ranks_mut()
    }
    fn streams(&self) -> &[Arc<CudaStream>] {
        (**self).streams()
    }
    fn check_transport(&self, transport: Transport) -> Result<()> {
        (**self).check_transport(transport)
    }
    fn exchange_forward(&mut self, transport: Transport) -> Result<()> {
        (**self).exchange_forward(transport)
    }
    fn exchange_reverse_accumulate(&mut self, transport: Transport) -> Result<()> {
        (**self).exchange_reverse_accumulate(transport)
    }
    fn finish(&mut self) -> Result<()> {
        (**self).finish()
    }
    fn use_streams(&mut self, streams: &[Arc<CudaStream>]) -> Result<()> {
        (**self).use_streams(streams)
    }
    fn barrier(&self) -> Result<()> {
        (**self).barrier()
    }
    fn host_syncs(&self) -> u64 {
        (**self).host_syncs()
    }
    fn reset_protocol(&mut self) -> Result<()> {
        (**self).reset_protocol()
    }
    fn replan(&mut self, halos: Vec<RankHalo>) -> Result<bool> {
        (**self).replan(halos)
    }
    fn fits(&self, halos: &[RankHalo]) -> bool {
        (**self).fits(halos)
    }
    fn replan_fenced(&mut self, halos: Vec<RankHalo>, fence: ReplanFence) -> Result<bool> {
        (**self).replan_fenced(halos, fence)
    }
    fn replan_barriers(&self) -> u64 {
        (**self).replan_barriers()
    }
    fn routes(&self) -> Vec<crate::route::RoutedSummary> {
        (**self).routes()
    }
    fn set_wait_timeout(&mut self, timeout: Duration) {
        (**self).set_wait_timeout(timeout)
    }
    fn read_forward(&self) -> Result<Vec<Vec<T>>> {
        (**self).read_forward()
    }
    fn read_reverse(&self) -> Result<Vec<Vec<T>>> {
        (**self).read_reverse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::NullExchange;
    use kernels_gpu::abi::Float3;

    #[test]
    fn jitter_parses_max_seed_and_side_and_refuses_the_rest() {
        assert_eq!(Jitter::parse("30").unwrap(), Some(Jitter { max_us: 30, seed: Jitter::DEFAULT_SEED, side: JitterSide::Both }));
        assert_eq!(Jitter::parse(" 30:7 ").unwrap(), Some(Jitter { max_us: 30, seed: 7, side: JitterSide::Both }));
        assert_eq!(Jitter::parse("5:9:host").unwrap().unwrap().side, JitterSide::Host);
        assert_eq!(Jitter::parse("5:9:GPU").unwrap().unwrap().side, JitterSide::Gpu);
        assert_eq!(Jitter::parse("5:9:device").unwrap().unwrap().side, JitterSide::Gpu);
        assert_eq!(Jitter::parse("5::both").unwrap().unwrap().seed, Jitter::DEFAULT_SEED);
        assert_eq!(Jitter::parse("").unwrap(), None, "empty: off");
        assert_eq!(Jitter::parse("0:3").unwrap(), None, "zero: off");
        assert_eq!(Jitter::parse("1000000").unwrap().unwrap().max_us, Jitter::MAX_US);
        for (bad, says) in [
            ("abc", "`abc` is not a number of microseconds"),
            ("-5", "is not a number"),
            ("1000001", "longer than the 1000000 µs"),
            ("30:x", "`x` is not a seed"),
            ("30:1:sideways", "`sideways` is not a side"),
            ("30:1:gpu:9", "unexpected `:9`"),
        ] {
            let e = Jitter::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(bad == "1000001" || e.contains("MAX_US[:SEED[:host|gpu|both]]"), "{bad}: the form is shown: {e}");
        }
    }

    #[test]
    fn faults_parse_kill_at_step_and_rank() {
        assert_eq!(Fault::parse("kill@5500:1").unwrap(), Some(Fault::Kill { step: 5500, rank: 1 }));
        assert_eq!(Fault::parse(" kill @ 0 : 3 ").unwrap(), Some(Fault::Kill { step: 0, rank: 3 }));
        assert_eq!(Fault::parse("").unwrap(), None);
        for (bad, says) in [
            ("kill", "names no step"),
            ("kill@5", "names no rank"),
            ("stall@5:1", "`stall` is not a fault"),
            ("kill@x:1", "`x` is not a step"),
            ("kill@5:-1", "`-1` is not a rank"),
        ] {
            let e = Fault::parse(bad).unwrap_err();
            assert!(e.contains(says) && e.contains("kill@STEP:RANK"), "{bad}: {e}");
        }
        let e = Perturbation::parse(None, Some("kill@5"), ("--jitter-us", "--fault")).unwrap_err().to_string();
        assert!(e.contains("--fault=\"kill@5\""), "the flag is named: {e}");
        let e = Perturbation::parse(Some("x"), None, (JITTER_ENV, FAULT_ENV)).unwrap_err().to_string();
        assert!(e.contains("HALO_JITTER_US=\"x\""), "the variable is named: {e}");
        assert!(Perturbation::parse(Some("0"), Some(""), (JITTER_ENV, FAULT_ENV)).unwrap().is_none(), "both off: no wrapper at all");
    }

    #[test]
    fn negative_control_faults_parse_with_their_defaults_and_refuse_the_rest() {
        assert_eq!(Fault::parse("corrupt-atom:rank=1,pulse=0").unwrap(), Some(Fault::CorruptAtom { rank: 1, pulse: 0, slot: None, step: 0 }));
        assert_eq!(
            Fault::parse(" corrupt-atom: rank=3 , pulse=1, slot=7, step=4 ").unwrap(),
            Some(Fault::CorruptAtom { rank: 3, pulse: 1, slot: Some(7), step: 4 })
        );
        assert_eq!(Fault::parse("drop-atom:rank=2,pulse=1").unwrap(), Some(Fault::DropAtom { rank: 2, pulse: 1, slot: None, step: 1 }));
        for (bad, says) in [
            ("corrupt-atom:pulse=0", "names no rank"),
            ("drop-atom:rank=1", "names no pulse"),
            ("drop-atom:rank=1,pulse=0,step=0", "no previous halo"),
            ("corrupt-atom:rank=1,pulse=x", "`x` is not a whole number (pulse)"),
            ("corrupt-atom:rank=1,pulse=0,atom=3", "`atom` is not a setting of corrupt-atom"),
            ("corrupt-atom:rank=1,pulse", "is not KEY=VALUE"),
        ] {
            let e = Fault::parse(bad).unwrap_err();
            assert!(e.contains(says) && e.contains("corrupt-atom:rank=R,pulse=P"), "{bad}: {e}");
        }
        let p = Perturbation::parse(None, Some("drop-atom:rank=2,pulse=1,slot=4,step=3"), (JITTER_ENV, FAULT_ENV)).unwrap().unwrap();
        let d = p.describe().join("\n");
        assert!(d.contains("negative control") && d.contains("atom 4 of those rank 2 receives in pulse 1") && d.contains("value of step 2"), "{d}");
        assert!(d.contains("HALO_FAULT=drop-atom:rank=2,pulse=1,slot=4,step=3"), "the line gives the variable back: {d}");
        assert!(p.injected().is_empty(), "nothing injected before an exchange ran");
        // Neither kills, and neither is refused beside other ranks in one process.
        assert_eq!(p.plan(Direction::Forward, &[2]).kill, None);
        p.check_layout(&[0, 1, 2, 3]).unwrap();
    }
    #[test]
    fn delays_are_reproducible_bounded_and_about_half_the_launches() {
        let j = Jitter { max_us: 40, seed: 11, side: JitterSide::Both };
        let draws: Vec<Delays> = (0..4000).map(|s| j.delays(2, Direction::Forward, s)).collect();
        // A pure function of (seed, rank, direction, step), whatever was drawn before.
        assert_eq!(j.delays(2, Direction::Forward, 1234), draws[1234]);
        assert_eq!(Jitter { seed: 11, ..j }.delays(2, Direction::Forward, 7), draws[7]);
        for d in &draws {
            assert!(d.host <= Duration::from_micros(40) && d.gpu <= Duration::from_micros(40), "{d:?}");
        }
        let host = draws.iter().filter(|d| !d.host.is_zero()).count();
        let gpu = draws.iter().filter(|d| !d.gpu.is_zero()).count();
        // Half are delayed, by 0..=40 µs (1/41 of those draw 0): about 1951 of 4000.
        for n in [host, gpu] {
            assert!((1750..2150).contains(&n), "{n} of 4000 delayed");
        }
        let mean = draws.iter().map(|d| d.gpu.as_secs_f64()).sum::<f64>() / gpu as f64 * 1e6;
        assert!((16.0..24.0).contains(&mean), "mean delay {mean} µs, about 20 expected");
        // Other ranks, directions, seeds draw differently; sides are independent.
        let other = |f: &dyn Fn(u64) -> Delays| (0..4000).filter(|&s| f(s) != draws[s as usize]).count();
        assert!(other(&|s| j.delays(3, Direction::Forward, s)) > 3000);
        assert!(other(&|s| j.delays(2, Direction::Reverse, s)) > 3000);
        assert!(other(&|s| Jitter { seed: 12, ..j }.delays(2, Direction::Forward, s)) > 3000);
        assert!(draws.iter().filter(|d| d.host != d.gpu).count() > 2800, "host and GPU draws are independent (both zero a quarter of the time)");
        // One side only.
        let host_only = Jitter { side: JitterSide::Host, ..j };
        assert!((0..500).all(|s| host_only.delays(0, Direction::Forward, s).gpu.is_zero()));
        assert!((0..500).any(|s| !host_only.delays(0, Direction::Forward, s).host.is_zero()));
        let gpu_only = Jitter { side: JitterSide::Gpu, ..j };
        assert!((0..500).all(|s| gpu_only.delays(0, Direction::Forward, s).host.is_zero()));
    }

    #[test]
    fn plans_count_steps_per_direction_and_kill_only_at_the_step_on_the_rank() {
        let j = Jitter { max_us: 10, seed: 3, side: JitterSide::Both };
        let p = Perturbation::new(Some(j), Some(Fault::Kill { step: 2, rank: 1 })).unwrap();
        let mut kills = Vec::new();
        for _ in 0..5 {
            let fwd = p.plan(Direction::Forward, &[1]);
            let rev = p.plan(Direction::Reverse, &[1]);
            assert_eq!(fwd.step, rev.step);
            assert!(rev.kill.is_none(), "a kill follows the coordinate halo only");
            assert_eq!(fwd.gpu, vec![j.delays(1, Direction::Forward, fwd.step).gpu]);
            assert_eq!(fwd.host, j.delays(1, Direction::Forward, fwd.step).host);
            kills.push(fwd.kill);
        }
        assert_eq!(kills, [None, None, Some(1), None, None]);
        // Another process's ranks never kill; several local ranks wait the longest host delay.
        let q = Perturbation::new(Some(j), Some(Fault::Kill { step: 0, rank: 1 })).unwrap();
        let plan = q.plan(Direction::Forward, &[0, 2, 3]);
        assert_eq!(plan.kill, None);
        assert_eq!(plan.host, [0, 2, 3].map(|r| j.delays(r, Direction::Forward, 0).host).into_iter().max().unwrap());
        assert_eq!(plan.gpu.len(), 3);
        let s = q.stats();
        assert_eq!(s.launches, 3);
        assert_eq!(s.gpu_delays, plan.gpu.iter().filter(|d| !d.is_zero()).count() as u64);
        assert_eq!(s.gpu_total, plan.gpu.iter().sum::<Duration>());
        assert_eq!(s.host_delays, u64::from(!plan.host.is_zero()));
    }

    /// The library never kills the process: a due kill goes to the program's hook, and without one
    /// the exchange returns an error naming the fault and the hook.
    #[test]
    fn a_due_kill_goes_to_the_hook_or_is_an_error_without_one() {
        let p = Perturbation::new(None, Some(Fault::Kill { step: 1, rank: 3 })).unwrap();
        let mut x = Perturbed::with_ranks(NullExchange::default(), p, vec![3]).unwrap();
        Exchange::<Float3>::exchange_forward(&mut x, Transport::Fused).unwrap(); // step 0: nothing due
        let e = Exchange::<Float3>::exchange_forward(&mut x, Transport::Fused).unwrap_err();
        assert!(matches!(e, HaloError::KillRequested { rank: 3, step: 1, .. }), "{e:?}");
        let m = e.to_string();
        assert!(m.contains("HALO_FAULT=kill@1:3") && m.contains("set_kill_hook"), "{m}");

        static SEEN: std::sync::Mutex<Vec<KillRequest>> = std::sync::Mutex::new(Vec::new());
        fn hook(r: &KillRequest) {
            SEEN.lock().unwrap().push(*r);
        }
        set_kill_hook(hook);
        let p = Perturbation::new(None, Some(Fault::Kill { step: 0, rank: 5 })).unwrap();
        let mut x = Perturbed::with_ranks(NullExchange::default(), p, vec![5]).unwrap();
        Exchange::<Float3>::exchange_forward(&mut x, Transport::Fused).unwrap();
        assert_eq!(*SEEN.lock().unwrap(), [KillRequest { rank: 5, step: 0 }]);
        let line = KillRequest { rank: 5, step: 0 }.message();
        assert!(line.starts_with("halo: HALO_FAULT: rank 5 kills itself with SIGKILL right after enqueueing step 0's coordinate halo"), "{line}");
        *KILL_HOOK.lock().unwrap() = None;
    }

    #[test]
    fn a_kill_is_refused_where_it_would_take_other_ranks_along() {
        let p = Perturbation::new(None, Some(Fault::Kill { step: 9, rank: 1 })).unwrap();
        let e = p.check_layout(&[0, 1, 2]).unwrap_err().to_string();
        assert!(e.contains("rank 1 shares this process with rank(s) 0, 2") && e.contains("halo launch -n N"), "{e}");
        p.check_layout(&[1]).unwrap();
        p.check_layout(&[0, 2]).unwrap();
        assert!(Perturbed::with_ranks(NullExchange::default(), p.clone(), vec![1, 2]).is_err());
    }

    #[test]
    fn the_wrapper_passes_every_call_through_and_waits_its_host_delays() {
        let j = Jitter { max_us: 300, seed: 5, side: JitterSide::Host };
        let p = Perturbation::new(Some(j), None).unwrap();
        let routes = vec![crate::route::RoutedPaths { self_pe: 4, ..Default::default() }.summary().unwrap()];
        let null = NullExchange { routes: routes.clone(), ..NullExchange::default() };
        let mut x: Box<dyn Exchange<Float3>> = Box::new(Perturbed::with_ranks(null, p.clone(), vec![4]).unwrap());
        assert_eq!(x.routes(), routes, "the router's choice shows through the wrapper");
        let started = Instant::now();
        for _ in 0..20 {
            x.exchange_forward(Transport::Fused).unwrap();
            x.exchange_reverse_accumulate(Transport::Fused).unwrap();
        }
        x.finish().unwrap();
        x.reset_protocol().unwrap();
        assert!(x.replan(Vec::new()).unwrap());
        let waited = started.elapsed();
        let want: Duration = (0..20).flat_map(|s| [Direction::Forward, Direction::Reverse].map(|d| j.delays(4, d, s).host)).sum();
        assert!(waited >= want, "waited {waited:?}, the plan says {want:?}");
        assert!(!want.is_zero());
        assert_eq!(x.host_syncs(), 43, "every call reached the inner exchange");
        let s = p.stats();
        assert_eq!((s.launches, s.gpu_delays), (40, 0));
        assert_eq!(s.host_total, want);
    }

    #[test]
    fn precise_waits_are_never_short_and_spin_their_last_100_us() {
        for us in [5u64, 50, 400, 2000] {
            let d = Duration::from_micros(us);
            let t = Instant::now();
            wait_precisely(d);
            let took = t.elapsed();
            assert!(took >= d, "{took:?} < {d:?}");
        }
        // What keeps a wait from overshooting by the scheduler's wake-up latency: it never sleeps
        // to its end, only to 100 µs before it (short waits not at all), and spins the rest. A
        // wall-clock bound on the overshoot would measure the machine's load, not this.
        assert_eq!(asleep_part(Duration::from_micros(5)), Duration::ZERO);
        assert_eq!(asleep_part(Duration::from_micros(200)), Duration::ZERO);
        assert_eq!(asleep_part(Duration::from_micros(201)), Duration::from_micros(101));
        assert_eq!(asleep_part(Duration::from_millis(2)), Duration::from_micros(1900));
    }

    #[test]
    fn descriptions_say_what_the_run_does() {
        let p = Perturbation::parse(Some("30:7"), Some("kill@5500:1"), (JITTER_ENV, FAULT_ENV)).unwrap().unwrap();
        let d = p.describe().join("\n");
        assert!(d.contains("up to 30 µs") && d.contains("host and on the GPU") && d.contains("HALO_JITTER_US=30:7:both"), "{d}");
        assert!(d.contains("rank 1 kills itself (SIGKILL) right after enqueueing step 5500's coordinate halo"), "{d}");
        let s = JitterStats { launches: 10, host_delays: 2, host_total: Duration::from_micros(30), gpu_delays: 0, gpu_total: Duration::ZERO };
        assert_eq!(
            s.to_string(),
            "jitter applied: 10 rank launches, 0 delayed on the GPU (mean 0.0 µs, 0.000 s in all), 2 on the host (mean 15.0 µs, 0.000 s in all)"
        );
    }
}
