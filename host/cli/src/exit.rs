//! How the `halo` command ends. The library never ends the process; the command does, here:
//!
//! - an error whose cause is a deadline (a start-up or collective step that did not finish in
//!   time, [`HaloError::Deadline`]; NVSHMEM left unusable by one; a stream that is stuck) ends it
//!   with [`DEADLINE_EXIT_CODE`], which `halo launch` explains, and any other error with 1;
//! - after printing an error, the process ends within [`ERROR_GRACE`] whatever its teardown does
//!   (NVSHMEM's or the driver's, or a call still stuck on a thread of its own may block it), so
//!   that `halo launch` can stop the other ranks;
//! - a step that must stay on its thread (NVSHMEM's init under its MPI bootstrap, a driver call
//!   inside a stream wait) and overruns its deadline ends the process at once ([`install_hooks`]);
//! - a `kill@STEP:RANK` fault (`HALO_FAULT`, `--fault`) raises SIGKILL, as a crash would.

use halo::HaloError;
use halo::watchdog::Overrun;
use std::process::ExitCode;
use std::time::Duration;

/// The exit code of a rank that ended on a deadline (distinct from 1, a plain error, 2, a usage
/// error, and 101, a panic). `halo launch` names it in its summary.
pub const DEADLINE_EXIT_CODE: u8 = 86;

/// How long the process may take to end after an error was printed.
pub const ERROR_GRACE: Duration = Duration::from_secs(2);

/// The exit code for `e`: [`DEADLINE_EXIT_CODE`] when a deadline or a stuck stream caused it
/// (anywhere in its chain), else 1.
pub fn code_for(e: &anyhow::Error) -> u8 {
    let deadline = e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<HaloError>(),
            Some(HaloError::Deadline(_) | HaloError::NvshmemUnusable { .. } | HaloError::StreamStuck(_) | HaloError::ExchangeStuck { .. })
        )
    });
    if deadline { DEADLINE_EXIT_CODE } else { 1 }
}

/// Prints `e` as `halo: error: ...` and returns its exit code ([`code_for`]); the process ends
/// within [`ERROR_GRACE`] even if its teardown blocks.
pub fn after_error(e: &anyhow::Error) -> ExitCode {
    eprintln!("halo: error: {e:#}");
    let code = code_for(e);
    end_within(ERROR_GRACE, code, "exiting after the error above");
    ExitCode::from(code)
}

/// Ends the process with `code` after `grace` unless it ended by then: a thread of its own that
/// writes `reason` and calls `_exit` (the thread that is stuck may hold locks that an orderly exit
/// would wait for).
pub fn end_within(grace: Duration, code: u8, reason: &'static str) {
    let spawned = std::thread::Builder::new().name("halo-exit".into()).spawn(move || {
        std::thread::sleep(grace);
        end_now(
            &format!("halo: {reason}: the process did not end cleanly within {:.1} s and is ended now (exit code {code})", grace.as_secs_f64()),
            code,
        );
    });
    if let Err(e) = spawned {
        eprintln!("halo: could not start the thread that bounds the exit ({e})");
    }
}

/// Writes `message` to standard error (through the raw descriptor halo's watchdog names, so that
/// it does not wait in a pipe or behind Rust's stderr lock) and ends the process with `code` at once.
pub fn end_now(message: &str, code: u8) -> ! {
    let line = format!("{message}\n");
    let mut bytes = line.as_bytes();
    while !bytes.is_empty() {
        // SAFETY: writes from a valid buffer of the given length to a descriptor (one that is
        // closed makes the write fail, and the message is lost, nothing else).
        let n = unsafe { libc::write(halo::watchdog::message_fd(), bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            break;
        }
        bytes = &bytes[n as usize..];
    }
    // SAFETY: ends the process without running atexit handlers or destructors.
    unsafe { libc::_exit(i32::from(code)) }
}

/// The message of a watched step that overran its deadline, as the command prints it.
pub fn overrun_message(o: &Overrun) -> String {
    format!("halo: error: {o}. Ending this process (exit code {DEADLINE_EXIT_CODE}) so that the launcher stops the other ranks.")
}

fn on_overrun(o: &Overrun) {
    end_now(&overrun_message(o), DEADLINE_EXIT_CODE);
}

fn on_kill(request: &halo::exchange::perturb::KillRequest) {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = writeln!(std::io::stderr().lock(), "{}", request.message());
    // SAFETY: raising a signal is always allowed; SIGKILL cannot be caught, so this never returns.
    unsafe { libc::raise(libc::SIGKILL) };
}

/// Installs the command's ends for what the library reports but does not act on: a watched step
/// past its deadline ends the process with [`DEADLINE_EXIT_CODE`], and a due `kill` fault raises
/// SIGKILL.
pub fn install_hooks() {
    halo::watchdog::set_overrun_hook(on_overrun);
    halo::exchange::perturb::set_kill_hook(on_kill);
}

#[cfg(test)]
mod tests {
    use super::*;
    use halo::watchdog::steps;

    fn overrun() -> HaloError {
        let identity = Some(halo::watchdog::Identity { rank: 1, nranks: 2, device: 0 });
        HaloError::Deadline(Box::new(Overrun { identity, pid: 1, step: steps::BARRIER, waited: Duration::from_secs(60) }))
    }

    #[test]
    fn deadlines_and_stuck_streams_exit_86_and_other_errors_1() {
        assert_eq!(code_for(&anyhow::Error::from(overrun())), DEADLINE_EXIT_CODE);
        // Under context, as the subcommands add it.
        let wrapped = anyhow::Error::from(overrun()).context("running the exchange check");
        assert_eq!(code_for(&wrapped), 86);
        let unusable = HaloError::NvshmemUnusable { who: "rank 0 of 2 (GPU 0)".into(), why: overrun().to_string() };
        assert_eq!(code_for(&anyhow::Error::from(unusable)), 86);
        let stuck = HaloError::ExchangeStuck { rank: 0, why: "nothing moved for 8 s".into() };
        assert_eq!(code_for(&anyhow::Error::from(stuck).context("step 3")), 86);
        assert_eq!(code_for(&anyhow::Error::from(HaloError::InvalidInput("bad".into()))), 1);
        assert_eq!(code_for(&anyhow::anyhow!("plain")), 1);
    }

    #[test]
    fn the_overrun_message_names_the_rank_the_step_and_the_exit_code() {
        let HaloError::Deadline(o) = overrun() else { unreachable!() };
        let m = overrun_message(&o);
        assert!(m.starts_with("halo: error: rank 1 of 2 (GPU 0): `barrier` did not finish within 60.0 s"), "{m}");
        assert!(m.contains("exit code 86"), "{m}");
    }
}
