//! `halo selftest-child` (hidden): a well-behaved or badly-behaved rank for the launcher's tests.
//!
//! It needs no GPU. Everything that could block is bounded, so a broken launcher fails the tests
//! instead of hanging them.

use anyhow::{Context, Result, bail};
use halo::launch::{RankEnv, rendezvous};
use rand::Rng;
use std::os::unix::fs::PermissionsExt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct SelftestArgs {
    /// Exit with this code.
    #[arg(long, default_value_t = 0)]
    exit_code: u8,
    /// Sleep this long before acting.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    sleep_ms: u64,
    /// Print this line on stdout (repeatable).
    #[arg(long, value_name = "TEXT")]
    print: Vec<String>,
    /// Print each --print/--eprint line this many times (to test that long output stays whole).
    #[arg(long, default_value_t = 1, value_name = "N")]
    repeat: usize,
    /// Print this line on stderr (repeatable).
    #[arg(long, value_name = "TEXT")]
    eprint: Vec<String>,
    /// Print `env NAME=<value or (unset)>` for this variable (repeatable).
    #[arg(long, value_name = "NAME")]
    print_env: Vec<String>,
    /// Print `selftest-child pid <PID> rank <R>` first.
    #[arg(long)]
    print_pid: bool,
    /// Send this signal (KILL, SIGSEGV, 9, ...) to itself.
    #[arg(long, value_name = "SIG")]
    signal_self: Option<String>,
    /// Hang instead of exiting (bounded by --hang-max-secs, then exit 124).
    #[arg(long)]
    hang: bool,
    /// Upper bound of --hang and --others-hang.
    #[arg(long, default_value_t = 60, value_name = "S")]
    hang_max_secs: u64,
    /// Ignore SIGTERM, so only SIGKILL stops it.
    #[arg(long)]
    ignore_sigterm: bool,
    /// Apply --exit-code, --signal-self and --hang only on this rank; the others exit 0
    /// (or hang, with --others-hang).
    #[arg(long, value_name = "R")]
    only_rank: Option<usize>,
    /// With --only-rank: the other ranks hang (bounded).
    #[arg(long)]
    others_hang: bool,
    /// Behave like a rank stuck in NVSHMEM's initialisation: run a call that never returns (bounded
    /// by --hang-max-secs) as halo's bounded `NVSHMEM init` step (`HALO_STARTUP_TIMEOUT_S`), which
    /// gives up on it with the deadline error (exit code 86). Only on --only-rank when given.
    #[arg(long)]
    stall_startup: bool,
    /// Exercise the rendezvous: rank 0 publishes a random 128-byte id, the others fetch it, then all
    /// ranks all-gather `rank-<R>`; prints what each got.
    #[arg(long)]
    rendezvous: bool,
    /// Drive this many steps of an exchange with no GPU (`halo::exchange::null::NullExchange`), 10 ms
    /// apart, through the process's jitter and fault (HALO_JITTER_US, HALO_FAULT).
    #[arg(long, value_name = "N")]
    null_exchange_steps: Option<u64>,
}

pub fn main(args: SelftestArgs) -> ExitCode {
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        // A deadline (--stall-startup) ends it as it would any `halo` command: exit code 86.
        Err(e) if crate::exit::code_for(&e) == crate::exit::DEADLINE_EXIT_CODE => crate::exit::after_error(&e),
        Err(e) => {
            eprintln!("halo selftest-child: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &SelftestArgs) -> Result<u8> {
    // First, so that a SIGTERM sent as soon as another rank fails already finds it ignored.
    if args.ignore_sigterm {
        // SAFETY: SIG_IGN is a valid disposition; no handler code runs.
        unsafe {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
        }
    }
    let env = RankEnv::try_from_env()?.unwrap_or_else(RankEnv::single);
    if args.print_pid {
        println!("selftest-child pid {} rank {}", std::process::id(), env.rank);
    }
    for name in &args.print_env {
        let value = std::env::var(name).unwrap_or_else(|_| "(unset)".into());
        println!("env {name}={value}");
    }
    for _ in 0..args.repeat {
        for line in &args.print {
            println!("{line}");
        }
        for line in &args.eprint {
            eprintln!("{line}");
        }
    }
    if args.rendezvous {
        exercise_rendezvous(&env)?;
    }
    std::thread::sleep(Duration::from_millis(args.sleep_ms));
    if let Some(steps) = args.null_exchange_steps {
        null_exchange(&env, steps)?;
    }

    let hang_limit = Duration::from_secs(args.hang_max_secs);
    if let Some(target) = args.only_rank
        && target != env.rank
    {
        return Ok(if args.others_hang { hang(hang_limit) } else { 0 });
    }
    if let Some(sig) = &args.signal_self {
        let Some(signal) = crate::launch::parse_signal(sig) else { bail!("unknown signal {sig:?}") };
        // SAFETY: raising a signal at ourselves has no memory-safety preconditions.
        unsafe {
            libc::raise(signal);
        }
        // Only reached for signals whose default action is not to terminate.
    }
    if args.stall_startup {
        let timeout = halo::watchdog::startup_timeout()?;
        halo::watchdog::set_identity(env.rank, env.nranks, env.device);
        return Ok(halo::watchdog::bounded(halo::watchdog::steps::NVSHMEM_INIT, timeout, None, move || hang(hang_limit))?);
    }
    if args.hang {
        return Ok(hang(hang_limit));
    }
    Ok(args.exit_code)
}

/// Sleeps until `limit`, then gives up with 124 (what `timeout` returns).
fn hang(limit: Duration) -> u8 {
    let start = Instant::now();
    while start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("selftest-child: --hang gave up after {} s", limit.as_secs());
    124
}

fn exercise_rendezvous(env: &RankEnv) -> Result<()> {
    let dir = std::env::var_os(halo::launch::env::ENV_RENDEZVOUS_DIR).context("HALO_RENDEZVOUS_DIR is not set")?;
    let dir = std::path::PathBuf::from(dir);
    let mode = std::fs::metadata(&dir).context("rendezvous dir")?.permissions().mode() & 0o777;
    println!("rendezvous-dir {} mode {mode:o}", dir.display());
    let id = if env.rank == 0 {
        let mut id = [0u8; 128];
        rand::rng().fill(&mut id[..]);
        rendezvous::publish(&id)?;
        let file_mode = std::fs::metadata(dir.join("unique-id")).context("unique-id file")?.permissions().mode() & 0o777;
        println!("unique-id-file mode {file_mode:o}");
        id.to_vec()
    } else {
        rendezvous::fetch(Duration::from_secs(10))?
    };
    println!("unique-id {} bytes {}", id.len(), hex(&id));
    let all = rendezvous::all_gather("selftest", format!("rank-{}", env.rank).as_bytes())?;
    let all: Vec<String> = all.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
    println!("gathered {}", all.join(","));
    Ok(())
}

/// `steps` forward and reverse exchanges of a [`NullExchange`] as rank `env.rank`, wrapped like
/// a real exchange when the process asked for jitter or a fault.
fn null_exchange(env: &RankEnv, steps: u64) -> Result<()> {
    use halo::exchange::null::NullExchange;
    use halo::exchange::perturb::{self, Perturbed};
    use halo::exchange::{Exchange, Transport};
    let mut x: Box<dyn Exchange> = match perturb::process()? {
        Some(p) => Box::new(Perturbed::with_ranks(NullExchange::default(), p, vec![env.rank])?),
        None => Box::new(NullExchange::default()),
    };
    for _ in 0..steps {
        x.exchange_forward(Transport::Fused)?;
        x.exchange_reverse_accumulate(Transport::Fused)?;
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("null exchange: rank {} ran {steps} steps", env.rank);
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
