//! The few POSIX calls the launcher needs that std does not offer: process groups, parent-death
//! signals, peeking at an exit without reaping, and catching SIGINT/SIGTERM/SIGHUP.

use super::RankEnd;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// Makes the child of `cmd` lead its own process group (so one `kill(-pgid)` reaches anything it
/// starts, and the terminal's Ctrl-C reaches only the launcher, which then stops the ranks in
/// order) and, on Linux, receive SIGKILL when the launcher dies, so no rank outlives it.
///
/// Linux ties the parent-death signal to the *thread* that forked the child, not the process, so
/// ranks must be spawned from a thread that lives as long as they do: [`super::launch`] spawns them
/// from its caller's thread and does not return before they end.
pub fn isolate(cmd: &mut Command) {
    // SAFETY of getpid: no preconditions.
    let launcher = unsafe { libc::getpid() };
    let hook = move || -> io::Result<()> {
        // Only async-signal-safe calls here: this runs between fork and exec.
        // SAFETY: setpgid(0, 0) on the calling process has no memory-safety preconditions.
        if unsafe { libc::setpgid(0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number; no pointers involved.
            if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // The launcher may have died before prctl took effect; then nobody would ever signal us.
            // SAFETY: getppid has no preconditions.
            if unsafe { libc::getppid() } != launcher {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        Ok(())
    };
    // SAFETY: the hook only makes async-signal-safe system calls and allocates nothing.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Sends `signal` to the process group led by `pid` (and to `pid` itself if the group is gone).
///
/// Callers only pass children that have not been reaped yet, so the id cannot have been recycled.
pub fn signal_group(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill has no memory-safety preconditions; failures (ESRCH) just mean nothing is left.
    unsafe {
        if libc::kill(-pid, signal) != 0 {
            libc::kill(pid, signal);
        }
    }
}

/// Whether child `pid` has ended, without reaping it, so that its process group id stays reserved
/// while we sweep that group (a reaped leader's id could be reused by an unrelated process).
pub fn peek_exit(pid: u32) -> io::Result<Option<RankEnd>> {
    let id = libc::id_t::from(pid);
    // SAFETY: siginfo_t is plain data; all-zero is a valid value, and waitid fills it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t.
    let rc = unsafe { libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: after a successful waitid these fields are initialised (si_pid is 0 if nothing ended).
    let (child, status) = unsafe { (info.si_pid(), info.si_status()) };
    if child == 0 {
        return Ok(None);
    }
    Ok(match info.si_code {
        libc::CLD_EXITED => Some(RankEnd::Exited(status)),
        libc::CLD_KILLED | libc::CLD_DUMPED => Some(RankEnd::Signaled(status)),
        _ => None,
    })
}

/// The conventional name of a signal number, e.g. `SIGKILL`.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}

/// Parses `KILL`, `SIGKILL` or `9` into a signal number.
pub fn parse_signal(text: &str) -> Option<i32> {
    let t = text.trim();
    if let Ok(n) = t.parse::<i32>() {
        return (n > 0).then_some(n);
    }
    let upper = t.to_ascii_uppercase();
    let wanted = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    (1..32).find(|&s| signal_name(s) == wanted)
}

/// The last termination signal the launcher received (0: none) and how many it received.
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);
static SIGNAL_COUNT: AtomicU32 = AtomicU32::new(0);

extern "C" fn record_signal(signal: libc::c_int) {
    // Atomics are async-signal-safe; everything else happens in the supervision loop.
    LAST_SIGNAL.store(signal, Ordering::SeqCst);
    SIGNAL_COUNT.fetch_add(1, Ordering::SeqCst);
}

const CAUGHT: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Handlers saved by the first live [`SignalGuard`], restored by the last; launches in one process
/// share the handlers.
static INSTALLED: Mutex<(usize, Vec<(libc::c_int, libc::sigaction)>)> = Mutex::new((0, Vec::new()));

/// While alive, SIGINT, SIGTERM and SIGHUP to this process are recorded instead of killing it, so the
/// launcher can stop its ranks and remove its directory (SIGINT and SIGHUP stay ignored if they
/// already were). Children get default handlers back at exec.
pub struct SignalGuard {
    _private: (),
}

impl SignalGuard {
    /// Installs the handlers (once per process while any guard lives).
    pub fn install() -> io::Result<SignalGuard> {
        let mut installed = INSTALLED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if installed.0 == 0 {
            LAST_SIGNAL.store(0, Ordering::SeqCst);
            SIGNAL_COUNT.store(0, Ordering::SeqCst);
            let mut saved = Vec::new();
            for &signal in &CAUGHT {
                // SAFETY: sigaction structs are plain data; we fill the fields sigaction reads.
                let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
                action.sa_sigaction = record_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                // SAFETY: both pointers are valid; sa_mask is initialised by sigemptyset.
                let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
                let rc = unsafe {
                    libc::sigemptyset(&mut action.sa_mask);
                    libc::sigaction(signal, &action, &mut old)
                };
                if rc != 0 {
                    let e = io::Error::last_os_error();
                    restore(&saved);
                    return Err(e);
                }
                saved.push((signal, old));
                // Respect `nohup` and background jobs of non-interactive shells, which start us with
                // SIGHUP/SIGINT ignored: put SIG_IGN back rather than turn them into a stop request.
                if signal != libc::SIGTERM && old.sa_sigaction == libc::SIG_IGN {
                    // SAFETY: `old` came from the successful sigaction call above.
                    unsafe {
                        libc::sigaction(signal, &old, std::ptr::null_mut());
                    }
                }
            }
            installed.1 = saved;
        }
        installed.0 += 1;
        Ok(SignalGuard { _private: () })
    }

    /// The last signal received and how many so far (`(0, 0)` if none).
    pub fn received(&self) -> (i32, u32) {
        (LAST_SIGNAL.load(Ordering::SeqCst), SIGNAL_COUNT.load(Ordering::SeqCst))
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        let mut installed = INSTALLED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        installed.0 -= 1;
        if installed.0 == 0 {
            let saved = std::mem::take(&mut installed.1);
            restore(&saved);
        }
    }
}

fn restore(saved: &[(libc::c_int, libc::sigaction)]) {
    for (signal, old) in saved {
        // SAFETY: `old` came from a successful sigaction call.
        unsafe {
            libc::sigaction(*signal, old, std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_round_trip() {
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(77), "signal 77");
        assert_eq!(parse_signal("KILL"), Some(libc::SIGKILL));
        assert_eq!(parse_signal("sigterm"), Some(libc::SIGTERM));
        assert_eq!(parse_signal("11"), Some(11));
        assert_eq!(parse_signal("NOPE"), None);
        assert_eq!(parse_signal("0"), None);
    }
}
