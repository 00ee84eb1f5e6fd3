//! Deadlines for the calls halo cannot poll: NVSHMEM's initialisation, its collectives (symmetric
//! allocation and free, barriers, finalisation), module registration, and the host's own waits as
//! a backstop (issue 20: bounded start-up; issue 19: no hang when a transport dies).
//!
//! A blocking call that never returns cannot be cancelled from the thread that made it. So a
//! thread of its own (started on first use, named `halo-watchdog`) watches the steps that are
//! *armed* ([`arm`], [`bounded`]): if one is still running after its deadline, it writes which
//! rank was in which step, the likely cause and the fix to stderr and ends the process with
//! [`EXIT_CODE`] (with `_exit`: the blocked thread may hold locks that an orderly exit would wait
//! for). Under `halo launch` that exit makes the launcher stop the other ranks, so a job whose
//! start-up or collective hangs ends in bounded time with a message instead of hanging.
//!
//! [`exit_within`] arms the same kind of deadline for a process that must end after a fatal
//! error (a GPU stream that is stuck cannot be freed, and the orderly teardown may block on it).
//!
//! The deadline of start-up and collective steps is `HALO_STARTUP_TIMEOUT_S` (seconds, default
//! 60; see [`startup_timeout`]). Arming costs one uncontended lock; the thread wakes every 50 ms.

use crate::error::{HaloError, Result};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The exit code of a process the watchdog ended (distinct from 1, a plain error, 2, a usage
/// error, and 101, a panic). `halo launch` names it in its summary.
pub const EXIT_CODE: i32 = 86;

/// The variable that sets the deadline of start-up and collective steps, in seconds.
pub const STARTUP_TIMEOUT_ENV: &str = "HALO_STARTUP_TIMEOUT_S";

/// The deadline of start-up and collective steps when [`STARTUP_TIMEOUT_ENV`] is unset.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// How often the watchdog thread looks at the armed steps.
const POLL: Duration = Duration::from_millis(50);

/// A step that can hang, with what usually makes it hang and what to do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// What the rank was doing, e.g. `NVSHMEM init`.
    pub name: &'static str,
    /// The likely cause of a hang in this step.
    pub cause: &'static str,
    /// What to do about it.
    pub fix: &'static str,
}

impl Step {
    /// A step named `name`, with the likely `cause` of a hang in it and the `fix`.
    pub const fn new(name: &'static str, cause: &'static str, fix: &'static str) -> Self {
        Self { name, cause, fix }
    }
}

/// The steps halo arms.
pub mod steps {
    use super::Step;

    const FIND_THE_FIRST_FAILURE: &str = "check the other ranks' messages for the first failure";

    /// `nvshmemx_hostlib_init_attr`: bootstrap, transports, teams.
    pub const NVSHMEM_INIT: Step = Step::new(
        "NVSHMEM init",
        "another rank did not start or died before finishing its own init (see its output); \
         an uneven number of PEs per GPU (NVSHMEM 3.4.5 never finishes its team set-up then); \
         or a remote transport that cannot connect (NVSHMEM_REMOTE_TRANSPORT, UCX_NET_DEVICES, NVSHMEM_HCA_LIST)",
        "use a rank count that is a multiple of the GPU count, check the other ranks' messages, \
         rerun with NVSHMEM_DEBUG=INFO to see the last step NVSHMEM reached, or raise HALO_STARTUP_TIMEOUT_S (seconds) if start-up is only slow",
    );
    /// A rank other than 0 waiting for rank 0's unique id.
    pub const UNIQUE_ID: Step = Step::new(
        "rendezvous: waiting for rank 0's unique id",
        "rank 0 failed before it could publish NVSHMEM's unique id (see its output), or the ranks do not share \
         the launcher's rendezvous directory",
        "fix rank 0's error; start the ranks with `halo launch` on one node (across nodes, use mpirun or srun)",
    );
    /// `nvshmem_align`: collective, every PE must allocate the same size in the same order.
    pub const SYMMETRIC_ALLOC: Step = Step::new(
        "symmetric allocation",
        "another rank did not reach the same allocation (it failed, hangs, or runs a different command or options)",
        "check the other ranks' messages and start every rank with the same arguments",
    );
    /// `nvshmem_free`: collective, with a barrier.
    pub const SYMMETRIC_FREE: Step =
        Step::new("symmetric free", "another rank did not reach the same free (it failed or hangs)", FIND_THE_FIRST_FAILURE);
    /// `nvshmemx_cumodule_init`.
    pub const MODULE_REGISTRATION: Step = Step::new(
        "module registration",
        "NVSHMEM could not set up the kernels' device state (a broken NVSHMEM install or a GPU in a bad state)",
        "rerun with NVSHMEM_DEBUG=INFO; check `halo info` on this GPU",
    );
    /// `nvshmem_barrier_all`.
    pub const BARRIER: Step =
        Step::new("barrier", "another rank did not reach the barrier: it failed, hangs, or is stuck on its GPU", FIND_THE_FIRST_FAILURE);
    /// An all-gather of small host data across PEs (NVSHMEM's fcollect, or host puts and a barrier).
    pub const GATHER: Step = Step::new(
        "all-gather",
        "another rank did not reach the same all-gather (it failed, hangs, or runs a different command or options)",
        "check the other ranks' messages and start every rank with the same arguments",
    );
    /// `nvshmemx_hostlib_finalize`.
    pub const FINALIZE: Step =
        Step::new("NVSHMEM finalize", "another rank did not reach its own finalisation (it failed or hangs)", FIND_THE_FIRST_FAILURE);
    /// The host waiting for an exchange stream, as a backstop when a driver call blocks.
    pub const HOST_WAIT: Step = Step::new(
        "waiting for the halo stream",
        "a CUDA driver call did not return (the GPU context is stuck, or NVSHMEM's proxy thread is exiting)",
        "look above for NVSHMEM's own messages (e.g. `proxy.cpp ... aborting`); see docs/reliability.md",
    );

    /// Every step, for the documentation test.
    pub const ALL: [Step; 9] = [NVSHMEM_INIT, UNIQUE_ID, SYMMETRIC_ALLOC, SYMMETRIC_FREE, MODULE_REGISTRATION, BARRIER, GATHER, FINALIZE, HOST_WAIT];
}

struct Armed {
    id: u64,
    step: Step,
    started: Instant,
    deadline: Instant,
}

#[derive(Default)]
struct State {
    who: Option<String>,
    armed: Vec<Armed>,
    next_id: u64,
    /// A process that must end by then, and why.
    exit_by: Option<(Instant, String)>,
    started: bool,
}

static STATE: Mutex<State> = Mutex::new(State { who: None, armed: Vec::new(), next_id: 0, exit_by: None, started: false });

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Names this process in the watchdog's messages: `rank 1 of 3 (GPU 1)`.
pub fn set_identity(rank: usize, nranks: usize, device: usize) {
    state().who = Some(format!("rank {rank} of {nranks} (GPU {device})"));
}

/// How this process is named in messages: `rank 1 of 3 (GPU 1)` once [`set_identity`] ran, else its
/// process id.
pub fn identity() -> String {
    state().who.clone().unwrap_or_else(|| format!("process {}", std::process::id()))
}

/// The deadline of start-up and collective steps: [`STARTUP_TIMEOUT_ENV`] seconds (fractions
/// allowed), or [`DEFAULT_STARTUP_TIMEOUT`].
pub fn startup_timeout() -> Result<Duration> {
    parse_timeout(std::env::var(STARTUP_TIMEOUT_ENV).ok().as_deref())
}

/// [`startup_timeout`] from the variable's value (`None`: unset).
pub fn parse_timeout(value: Option<&str>) -> Result<Duration> {
    let Some(text) = value.map(str::trim).filter(|t| !t.is_empty()) else { return Ok(DEFAULT_STARTUP_TIMEOUT) };
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 1e6 => Ok(Duration::from_secs_f64(s)),
        _ => Err(HaloError::InvalidInput(format!(
            "{STARTUP_TIMEOUT_ENV}={text:?} is not a time: give seconds above 0, e.g. {STARTUP_TIMEOUT_ENV}=120"
        ))),
    }
}

/// While alive, the step it was armed for is watched; dropping it disarms the step.
#[must_use = "the step is watched only while the guard lives"]
pub struct Guard {
    id: u64,
}

impl Guard {
    /// Moves the deadline to `timeout` from now (a wait that made progress).
    pub fn extend(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        if let Some(a) = state().armed.iter_mut().find(|a| a.id == self.id) {
            a.deadline = deadline;
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        state().armed.retain(|a| a.id != self.id);
    }
}

/// Watches `step` until the guard is dropped: if it is still running after `timeout`, the
/// process ends with [`EXIT_CODE`] and a message naming this rank, the step, its likely cause and
/// the fix.
pub fn arm(step: Step, timeout: Duration) -> Guard {
    let now = Instant::now();
    let mut s = state();
    let id = s.next_id;
    s.next_id += 1;
    s.armed.push(Armed { id, step, started: now, deadline: now + timeout });
    start_thread(&mut s);
    Guard { id }
}

/// Starts the watchdog thread now (it starts on first use otherwise), e.g. before taking a list
/// of this process's threads that must not include it.
pub fn ensure_started() {
    start_thread(&mut state());
}

/// Runs `f` with `step` armed for `timeout`.
pub fn bounded<T>(step: Step, timeout: Duration, f: impl FnOnce() -> T) -> T {
    let _guard = arm(step, timeout);
    f()
}

/// The process must end within `within`: after a fatal error (a stuck GPU stream) its orderly
/// teardown may block, so the watchdog ends it then with `reason` and [`EXIT_CODE`]. An earlier
/// deadline is kept.
pub fn exit_within(reason: impl Into<String>, within: Duration) {
    let deadline = Instant::now() + within;
    let mut s = state();
    if s.exit_by.as_ref().is_none_or(|(d, _)| deadline < *d) {
        s.exit_by = Some((deadline, reason.into()));
    }
    start_thread(&mut s);
}

/// The watchdog's message for `step` of `who` after `waited`.
pub fn expiry_message(who: &str, step: &Step, waited: Duration) -> String {
    format!(
        "halo: {who}: `{}` did not finish within {:.1} s. Likely cause: {}. Fix: {}. \
         Ending this process (exit code {EXIT_CODE}) so that the launcher stops the other ranks.",
        step.name,
        waited.as_secs_f64(),
        step.cause,
        step.fix
    )
}

/// The message of a process that did not end in time after a fatal error.
pub fn exit_message(who: &str, reason: &str) -> String {
    format!("halo: {who}: {reason}; the process did not end cleanly in time and is ended now (exit code {EXIT_CODE}).")
}

fn start_thread(s: &mut State) {
    if s.started {
        return;
    }
    s.started = true;
    let spawned = std::thread::Builder::new().name("halo-watchdog".into()).spawn(watch);
    if let Err(e) = spawned {
        s.started = false;
        tracing::warn!("could not start halo's watchdog thread ({e}): start-up and collective steps are not bounded");
    }
}

fn watch() {
    loop {
        std::thread::sleep(POLL);
        let s = state();
        let now = Instant::now();
        let who = s.who.clone().unwrap_or_else(|| format!("process {}", std::process::id()));
        if let Some(a) = s.armed.iter().find(|a| now >= a.deadline) {
            fire(&expiry_message(&who, &a.step, now - a.started));
        }
        if let Some((_, reason)) = s.exit_by.as_ref().filter(|(d, _)| now >= *d) {
            fire(&exit_message(&who, reason));
        }
    }
}

/// Where the watchdog writes its messages: standard error (fd 2), or the descriptor that standard
/// error was copied to while NVSHMEM's init reads fd 2 through a pipe
/// ([`crate::nvshmem::startup::StderrTap`]), so a message written just before `_exit` is not left
/// in the pipe.
static MESSAGE_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(2);

/// Sends the watchdog's messages to `fd` (2: standard error) from now on.
#[doc(hidden)]
pub fn write_messages_to(fd: i32) {
    MESSAGE_FD.store(fd, std::sync::atomic::Ordering::Release);
}

/// Writes `message` to stderr and ends the process at once. Uses the raw file descriptor and
/// `_exit`: the thread that is stuck may hold Rust's stderr lock or locks `exit` would take.
fn fire(message: &str) -> ! {
    let line = format!("{message}\n");
    let mut bytes = line.as_bytes();
    while !bytes.is_empty() {
        // SAFETY: writes from a valid buffer of the given length to a descriptor (one that is
        // closed makes the write fail, and the message is lost, nothing else).
        let n = unsafe { libc::write(MESSAGE_FD.load(std::sync::atomic::Ordering::Acquire), bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            break;
        }
        bytes = &bytes[n as usize..];
    }
    // SAFETY: ends the process without running atexit handlers or destructors.
    unsafe { libc::_exit(EXIT_CODE) }
}

/// Whether any step is armed now (for tests).
#[doc(hidden)]
pub fn armed_steps() -> Vec<&'static str> {
    state().armed.iter().map(|a| a.step.name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_and_bad_values_name_the_variable() {
        assert_eq!(parse_timeout(None).unwrap(), DEFAULT_STARTUP_TIMEOUT);
        assert_eq!(parse_timeout(Some(" ")).unwrap(), DEFAULT_STARTUP_TIMEOUT);
        assert_eq!(parse_timeout(Some("2.5")).unwrap(), Duration::from_millis(2500));
        for bad in ["0", "-1", "soon", "nan", "inf"] {
            let e = parse_timeout(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(STARTUP_TIMEOUT_ENV) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn messages_name_the_rank_the_step_the_cause_and_the_fix() {
        let m = expiry_message("rank 1 of 3 (GPU 1)", &steps::NVSHMEM_INIT, Duration::from_secs(60));
        assert!(m.contains("rank 1 of 3 (GPU 1)") && m.contains("`NVSHMEM init`") && m.contains("60.0 s"), "{m}");
        assert!(m.contains("uneven number of PEs per GPU") && m.contains("NVSHMEM_DEBUG=INFO"), "{m}");
        assert!(m.contains(&format!("exit code {EXIT_CODE}")), "{m}");
        for step in steps::ALL {
            assert!(!step.name.is_empty() && !step.cause.is_empty() && !step.fix.is_empty(), "{step:?}");
        }
    }

    #[test]
    fn guards_disarm_on_drop_and_can_be_extended() {
        let g = arm(steps::BARRIER, Duration::from_secs(3600));
        assert!(armed_steps().contains(&"barrier"));
        g.extend(Duration::from_secs(7200));
        let value = bounded(steps::SYMMETRIC_ALLOC, Duration::from_secs(3600), || {
            assert!(armed_steps().contains(&"symmetric allocation"));
            42
        });
        assert_eq!(value, 42);
        assert!(!armed_steps().contains(&"symmetric allocation"));
        drop(g);
        assert!(!armed_steps().contains(&"barrier"));
    }
}
