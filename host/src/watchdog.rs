//! Deadlines for the calls halo cannot poll: NVSHMEM's initialisation, its collectives (symmetric
//! allocation and free, barriers, all-gathers, finalisation), module registration, and the host's
//! own waits as a backstop.
//!
//! The library never ends the process: a step that passes its deadline becomes an error returned
//! to the caller ([`HaloError::Deadline`], an [`Overrun`] naming this rank, the step, the likely
//! cause, the fix and the time waited). Only the program may turn it into an exit code (the `halo`
//! command exits with 86 then, which `halo launch` explains).
//!
//! A blocking call that never returns cannot be cancelled on its own thread. So [`bounded`] runs
//! the call on a worker thread (one per process, named `halo-bounded`, started on first use; a
//! caller on another thread while it is busy gets a second one) with the caller's CUDA context
//! bound, and waits for it with the deadline. On expiry the worker is abandoned, still inside the
//! call (later calls start a new one), and the caller gets the error. The handoff costs a few
//! microseconds (the `bounded_handoff_costs_microseconds` test prints it).
//!
//! A call that must stay on the calling thread (NVSHMEM's init under its MPI bootstrap: MPI wants
//! its later calls from the thread that initialised it) and the host's stream waits (a driver
//! call inside the wait's loop that blocks) are watched instead ([`arm`]): nothing can return
//! before the call does, so a thread of its own (`halo-watchdog`) reports an overrun once through
//! `tracing::error!` and the program's overrun hook ([`set_overrun_hook`]; the `halo` command's
//! ends the process, so that `halo launch` stops the other ranks).
//!
//! The deadline of start-up and collective steps is `HALO_STARTUP_TIMEOUT_S` (seconds, default
//! 60; see [`startup_timeout`]).

use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::CudaContext;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

/// A step that passed its deadline: the error [`HaloError::Deadline`] holds, and what an overrun
/// hook gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overrun {
    /// This process's rank, rank count and GPU, once [`set_identity`] ran.
    pub identity: Option<Identity>,
    /// This process's id (it names the process when there is no identity).
    pub pid: u32,
    /// The step, with its likely cause and fix.
    pub step: Step,
    /// How long the step had run when it was given up on (or reported).
    pub waited: Duration,
}

impl Overrun {
    /// The overrun of `step` in this process after `waited`.
    pub fn now(step: Step, waited: Duration) -> Self {
        Self { identity: state().who, pid: std::process::id(), step, waited }
    }

    /// The rank, when known.
    pub fn rank(&self) -> Option<usize> {
        self.identity.map(|i| i.rank)
    }

    /// This process in words: `rank 1 of 3 (GPU 1)`, or `process 1234`.
    pub fn who(&self) -> String {
        self.identity.map_or_else(|| format!("process {}", self.pid), |i| i.to_string())
    }
}

impl std::fmt::Display for Overrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: `{}` did not finish within {:.1} s. Likely cause: {}. Fix: {}",
            self.who(),
            self.step.name,
            self.waited.as_secs_f64(),
            self.step.cause,
            self.step.fix
        )
    }
}

/// Which rank this process is ([`set_identity`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub nranks: usize,
    /// Its GPU.
    pub device: usize,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} of {} (GPU {})", self.rank, self.nranks, self.device)
    }
}

struct Armed {
    id: u64,
    step: Step,
    started: Instant,
    deadline: Instant,
    reported: bool,
}

#[derive(Default)]
struct State {
    who: Option<Identity>,
    armed: Vec<Armed>,
    next_id: u64,
    started: bool,
    hook: Option<fn(&Overrun)>,
}

static STATE: Mutex<State> = Mutex::new(State { who: None, armed: Vec::new(), next_id: 0, started: false, hook: None });

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Names this process in the deadline errors: `rank 1 of 3 (GPU 1)`.
pub fn set_identity(rank: usize, nranks: usize, device: usize) {
    state().who = Some(Identity { rank, nranks, device });
}

/// How this process is named in messages: `rank 1 of 3 (GPU 1)` once [`set_identity`] ran, else its
/// process id.
pub fn identity() -> String {
    state().who.map_or_else(|| format!("process {}", std::process::id()), |w| w.to_string())
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

// ---- Bounded calls: on a worker thread, waited for with the deadline. ----

type Job = Box<dyn FnOnce() + Send>;

/// A worker thread that runs one job at a time.
struct Worker {
    jobs: mpsc::Sender<Job>,
}

/// The workers not running a job now (normally one).
static IDLE: Mutex<Vec<Worker>> = Mutex::new(Vec::new());
/// Workers started so far (names the later ones, and for tests).
static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn idle() -> MutexGuard<'static, Vec<Worker>> {
    IDLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn take_worker() -> std::io::Result<Worker> {
    if let Some(w) = idle().pop() {
        return Ok(w);
    }
    let (jobs, queue) = mpsc::channel::<Job>();
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = if n == 0 { "halo-bounded".to_string() } else { format!("halo-bounded-{n}") };
    std::thread::Builder::new().name(name).spawn(move || {
        // Ends when its sender is dropped: the worker was abandoned, or the process ends. After a
        // job it looks for the next one without sleeping for a moment (collectives come in runs:
        // a gather's puts, then its barrier), so such a call does not pay a wake-up.
        loop {
            let spin_until = Instant::now() + SPIN;
            let job = loop {
                match queue.try_recv() {
                    Ok(job) => break Some(job),
                    Err(TryRecvError::Disconnected) => return,
                    Err(TryRecvError::Empty) if Instant::now() < spin_until => std::hint::spin_loop(),
                    Err(TryRecvError::Empty) => break None,
                }
            };
            let job = match job {
                Some(job) => job,
                None => match queue.recv() {
                    Ok(job) => job,
                    Err(_) => return,
                },
            };
            job();
        }
    })?;
    Ok(Worker { jobs })
}

/// How many bounded-call workers this process started (the first, and one for each abandoned or
/// busy one); for tests.
#[doc(hidden)]
pub fn workers_started() -> usize {
    STARTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Runs `f` for `step` on the bounded-call worker with `ctx` (the caller's CUDA context, when the
/// call needs one) bound, and waits at most `timeout` for it.
///
/// Returns `f`'s value, or [`HaloError::Deadline`] naming this rank, the step, its likely cause and
/// fix and the time waited once `timeout` passes; the call is then left running on its worker
/// (abandoned: whatever it returns later is dropped there), so what it uses must stay valid (leak
/// it). A panic in `f` is resumed on the caller. A context that cannot be bound is
/// [`HaloError::Cuda`], and `f` does not run.
pub fn bounded<R: Send + 'static>(
    step: Step,
    timeout: Duration,
    ctx: Option<&Arc<CudaContext>>,
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R> {
    type Outcome<R> = std::thread::Result<Result<R>>;
    let started = Instant::now();
    let worker = take_worker().map_err(|e| HaloError::Thread { step: step.name, detail: format!("could not start it: {e}") })?;
    let (reply, answer) = mpsc::sync_channel::<Outcome<R>>(1);
    let ctx = ctx.cloned();
    let job: Job = Box::new(move || {
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            if let Some(ctx) = &ctx {
                ctx.bind_to_thread().during("binding the CUDA context for a bounded call")?;
            }
            Ok(f())
        }));
        let _ = reply.send(out);
    });
    if worker.jobs.send(job).is_err() {
        return Err(HaloError::Thread { step: step.name, detail: "it ended before it took the call".into() });
    }
    // A short call (a gather of a few hundred bytes) answers within microseconds: look for it
    // without sleeping first, so the handoff does not pay a wake-up of this thread too.
    let spin_until = started + SPIN;
    let outcome = loop {
        match answer.try_recv() {
            Ok(out) => break Some(out),
            Err(TryRecvError::Disconnected) => break None,
            Err(TryRecvError::Empty) if Instant::now() < spin_until => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => match answer.recv_timeout(timeout.saturating_sub(started.elapsed())) {
                Ok(out) => break Some(out),
                Err(RecvTimeoutError::Disconnected) => break None,
                Err(RecvTimeoutError::Timeout) => {
                    drop(worker); // abandoned: it ends once the call returns, if ever
                    return Err(HaloError::Deadline(Box::new(Overrun::now(step, started.elapsed()))));
                }
            },
        }
    };
    idle().push(worker);
    match outcome {
        Some(Ok(value)) => value,
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        None => Err(HaloError::Thread { step: step.name, detail: "it ended without an answer".into() }),
    }
}

/// How long [`bounded`] looks for the answer, and a worker for its next job, before sleeping.
const SPIN: Duration = Duration::from_micros(50);

// ---- Watched steps: calls that stay on the calling thread. ----

/// What a program does when a watched step ([`arm`]) overruns its deadline, after halo reported it
/// through `tracing::error!`: e.g. end the process (the `halo` command). The call itself cannot be
/// made to return; without a hook the step simply goes on.
pub fn set_overrun_hook(hook: fn(&Overrun)) {
    state().hook = Some(hook);
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

/// Watches `step`, which runs on the calling thread, until the guard is dropped: if it is still
/// running after `timeout`, the overrun ([`Overrun`]) is reported once through `tracing::error!`
/// and the program's hook ([`set_overrun_hook`]). The step is not interrupted: use [`bounded`]
/// wherever the call may run on another thread.
pub fn arm(step: Step, timeout: Duration) -> Guard {
    let now = Instant::now();
    let mut s = state();
    let id = s.next_id;
    s.next_id += 1;
    s.armed.push(Armed { id, step, started: now, deadline: now + timeout, reported: false });
    start_thread(&mut s);
    Guard { id }
}

/// Starts the watchdog thread and the bounded-call worker now (they start on first use otherwise),
/// e.g. before taking a list of this process's threads that must not include them.
pub fn ensure_started() {
    start_thread(&mut state());
    if let Ok(w) = take_worker() {
        idle().push(w);
    }
}

fn start_thread(s: &mut State) {
    if s.started {
        return;
    }
    s.started = true;
    let spawned = std::thread::Builder::new().name("halo-watchdog".into()).spawn(watch);
    if let Err(e) = spawned {
        s.started = false;
        tracing::warn!("could not start halo's watchdog thread ({e}): overruns of steps that stay on their thread are not reported");
    }
}

fn watch() {
    loop {
        std::thread::sleep(POLL);
        let now = Instant::now();
        let (overruns, hook) = {
            let mut s = state();
            let due: Vec<(Step, Duration)> = s
                .armed
                .iter_mut()
                .filter(|a| !a.reported && now >= a.deadline)
                .map(|a| {
                    a.reported = true;
                    (a.step, now - a.started)
                })
                .collect();
            (due, s.hook)
        };
        for (step, waited) in overruns {
            let overrun = Overrun::now(step, waited);
            tracing::error!("{overrun}");
            if let Some(hook) = hook {
                hook(&overrun);
            }
        }
    }
}

/// Where a program's overrun hook should write a message: standard error (fd 2), or the descriptor
/// that standard error was copied to while NVSHMEM's init reads fd 2 through a pipe
/// ([`crate::nvshmem::startup::StderrTap`]), so a message written just before the process ends is
/// not left in the pipe.
static MESSAGE_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(2);

/// Sends the watchdog's messages to `fd` (2: standard error) from now on.
#[doc(hidden)]
pub fn write_messages_to(fd: i32) {
    MESSAGE_FD.store(fd, std::sync::atomic::Ordering::Release);
}

/// The descriptor a message that must not wait in a pipe goes to (see [`write_messages_to`]).
pub fn message_fd() -> i32 {
    MESSAGE_FD.load(std::sync::atomic::Ordering::Acquire)
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
    fn overruns_name_the_rank_the_step_the_cause_and_the_fix() {
        let identity = Some(Identity { rank: 1, nranks: 3, device: 1 });
        let o = Overrun { identity, pid: 7, step: steps::NVSHMEM_INIT, waited: Duration::from_secs(60) };
        assert_eq!(Overrun { identity: None, ..o.clone() }.who(), "process 7");
        let m = HaloError::Deadline(Box::new(o)).to_string();
        assert!(m.contains("rank 1 of 3 (GPU 1)") && m.contains("`NVSHMEM init`") && m.contains("60.0 s"), "{m}");
        assert!(m.contains("uneven number of PEs per GPU") && m.contains("NVSHMEM_DEBUG=INFO"), "{m}");
        assert!(!m.contains("exit"), "the library does not end the process: {m}");
        for step in steps::ALL {
            assert!(!step.name.is_empty() && !step.cause.is_empty() && !step.fix.is_empty(), "{step:?}");
        }
    }

    #[test]
    fn guards_disarm_on_drop_and_can_be_extended() {
        let g = arm(steps::BARRIER, Duration::from_secs(3600));
        assert!(armed_steps().contains(&"barrier"));
        g.extend(Duration::from_secs(7200));
        drop(g);
        assert!(!armed_steps().contains(&"barrier"));
    }

    /// A call that sleeps past its deadline returns the error naming the step and the rank in
    /// bounded time; the next call runs (on a new worker) and returns its value.
    #[test]
    fn a_call_past_its_deadline_returns_an_error_and_later_calls_still_work() {
        set_identity(2, 4, 1);
        let (release, held) = mpsc::channel::<()>();
        let (tell, stuck_on) = mpsc::channel::<std::thread::ThreadId>();
        let started = Instant::now();
        let out = bounded(steps::BARRIER, Duration::from_millis(200), None, move || {
            let _ = tell.send(std::thread::current().id());
            let _ = held.recv_timeout(Duration::from_secs(30)); // a barrier a peer never reaches
            7
        });
        let took = started.elapsed();
        match out {
            Err(HaloError::Deadline(o)) => {
                assert_eq!((o.step, o.identity), (steps::BARRIER, Some(Identity { rank: 2, nranks: 4, device: 1 })), "{o}");
                assert!(o.waited >= Duration::from_millis(200), "{o}");
                let m = o.to_string();
                assert!(m.contains("rank 2 of 4 (GPU 1)") && m.contains("`barrier`") && m.contains("Fix:"), "{m}");
            }
            other => panic!("expected the deadline error, got {other:?}"),
        }
        assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(10), "returned after {took:?}");
        // The stuck worker still holds the first call; a later one runs on another worker.
        let stuck = stuck_on.recv().expect("the first call ran");
        let (value, on) = bounded(steps::GATHER, Duration::from_secs(30), None, || (42, std::thread::current().id())).unwrap();
        assert_eq!(value, 42);
        assert_ne!(on, stuck, "the abandoned worker was given a new call");
        drop(release);
    }

    #[test]
    fn a_call_that_finishes_returns_its_value_and_panics_reach_the_caller() {
        let v = bounded(steps::SYMMETRIC_ALLOC, Duration::from_secs(30), None, || vec![1u8, 2, 3]).unwrap();
        assert_eq!(v, [1, 2, 3]);
        let name = bounded(steps::GATHER, Duration::from_secs(30), None, || std::thread::current().name().map(str::to_string)).unwrap();
        assert!(name.is_some_and(|n| n.starts_with("halo-bounded")), "not on the worker");
        let panicked = std::panic::catch_unwind(|| bounded(steps::GATHER, Duration::from_secs(30), None, || panic!("inside")));
        assert!(panicked.is_err());
        assert_eq!(bounded(steps::GATHER, Duration::from_secs(30), None, || 5).unwrap(), 5, "the worker survives a panic");
    }

    /// The handoff's cost (the fast path of every bounded call, e.g. the kept gather of every
    /// search step): back to back (a gather's puts, then its barrier) and after the worker went to
    /// sleep (the first call of a search). Prints the medians; asserts nothing about time
    /// (machines differ), only that every call returned its own value.
    #[test]
    fn bounded_handoff_costs_microseconds() {
        let _ = bounded(steps::GATHER, Duration::from_secs(30), None, || ());
        for (what, pause, calls) in [("back to back", Duration::ZERO, 2000u64), ("after 2 ms idle", Duration::from_millis(2), 300)] {
            let mut times: Vec<Duration> = (0..calls)
                .map(|i| {
                    std::thread::sleep(pause);
                    let t = Instant::now();
                    let v = bounded(steps::GATHER, Duration::from_secs(30), None, move || i + 1).unwrap();
                    let took = t.elapsed();
                    assert_eq!(v, i + 1);
                    took
                })
                .collect();
            times.sort();
            println!(
                "bounded handoff, {what}: median {:.1} us, p90 {:.1} us, min {:.1} us over {calls} calls",
                times[times.len() / 2].as_secs_f64() * 1e6,
                times[times.len() * 9 / 10].as_secs_f64() * 1e6,
                times[0].as_secs_f64() * 1e6,
            );
        }
    }

    #[test]
    fn a_watched_step_reports_its_overrun_to_the_hook_once() {
        static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
        fn hook(o: &Overrun) {
            SEEN.lock().unwrap().push(o.to_string());
        }
        set_overrun_hook(hook);
        let g = arm(steps::HOST_WAIT, Duration::from_millis(50));
        let deadline = Instant::now() + Duration::from_secs(10);
        while SEEN.lock().unwrap().iter().all(|m| !m.contains("`waiting for the halo stream`")) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        drop(g);
        let seen: Vec<String> = SEEN.lock().unwrap().iter().filter(|m| m.contains("`waiting for the halo stream`")).cloned().collect();
        assert_eq!(seen.len(), 1, "{seen:?}");
    }
}
