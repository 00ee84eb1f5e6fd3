//! The library's error type. Every variant names the problem and, where there is one, the fix.

use std::path::PathBuf;

/// Errors from the halo library.
#[derive(Debug, thiserror::Error)]
pub enum HaloError {
    /// No usable CUDA driver or GPU.
    #[error("no GPU available: {0}")]
    NoGpu(String),
    /// A CUDA driver call failed.
    #[error("CUDA error during {what}: {source}")]
    Cuda {
        /// What halo was doing.
        what: String,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// The compiled kernels were not found.
    #[error(
        "no compiled kernels in {dir}: {missing} is missing. Build them with `cargo xtask build-ptx`, \
         or point HALO_PTX_DIR at a folder holding halo_kernels.<arch>.ptx"
    )]
    MissingPtx {
        /// Where halo looked.
        dir: PathBuf,
        /// The file that is not there.
        missing: String,
    },
    /// The library was built without its kernels and no folder provides them.
    #[error(
        "this halo was built without its GPU kernels (HALO_SKIP_KERNEL_BUILD=1) and HALO_PTX_DIR is not set: \
         point HALO_PTX_DIR at a folder holding halo_kernels.{arch}.{{ptx,cubin,manifest.json}} \
         (`cargo xtask build-ptx` writes target/ptx/, a bundle has ptx/), or rebuild halo without HALO_SKIP_KERNEL_BUILD"
    )]
    NoKernels {
        /// The architecture asked for.
        arch: String,
    },
    /// The compiled kernels do not match this build of halo.
    #[error("stale kernels in {path}: {detail}. Rebuild them with `cargo xtask build-ptx`")]
    StalePtx {
        /// The module file.
        path: PathBuf,
        /// What does not match.
        detail: String,
    },
    /// The kernels were built for a different GPU.
    #[error(
        "the kernels in {path} were built for {built}, but GPU {ordinal} is {device}: \
         rebuild with `cargo xtask build-ptx --arch {device}`"
    )]
    WrongArch {
        /// The module file.
        path: PathBuf,
        /// The architecture the PTX targets.
        built: String,
        /// The GPU's architecture.
        device: String,
        /// Which GPU.
        ordinal: usize,
    },
    /// A device spin-wait expired: a peer never signalled (see the message for which one).
    #[error("halo exchange timed out: {0}")]
    WaitTimeout(crate::desc::WaitTimeout),
    /// A host wait on an exchange stream saw no progress for its whole budget: a kernel is stuck
    /// where no halo deadline reaches (see the message for the rank, path and GPU state).
    #[error("halo exchange stuck: {0}")]
    StreamStuck(Box<crate::desc::StuckStream>),
    /// A host-side handshake of a host-driven transport expired: a peer process never posted
    /// (see the message for which one, what and at which step).
    #[error("halo exchange timed out on the host: {0}")]
    HostWaitTimeout(String),
    /// A step with a deadline (NVSHMEM's init, a collective, a symmetric allocation or free, module
    /// registration, finalisation, the unique-id rendezvous) did not finish in time: the message
    /// names the rank, the step, its likely cause, the fix and the time waited. The call was left
    /// running on a thread of its own; an NVSHMEM instance that overran one is unusable from then
    /// on ([`HaloError::NvshmemUnusable`]). A program may end on it (the `halo` command exits with 86).
    #[error("{0}")]
    Deadline(Box<crate::watchdog::Overrun>),
    /// halo could not start, or lost, the thread a bounded call runs on (the system's thread limit).
    #[error("halo's thread for `{step}`: {detail}; raise the process's thread limit (ulimit -u) or free threads")]
    Thread {
        /// The step that was to run on it.
        step: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// This process's NVSHMEM can no longer be used: an earlier collective call overran its
    /// deadline and may still be running (the peers are gone or stuck).
    #[error(
        "NVSHMEM on {who} is unusable: an earlier call did not finish ({why}). Every PE must start again: end this program \
         (or drop every handle) and check the other ranks' messages for the first failure"
    )]
    NvshmemUnusable {
        /// The rank, e.g. `rank 1 of 2 (GPU 0)`.
        who: String,
        /// The deadline error that made it unusable.
        why: String,
    },
    /// An exchange whose stream did not make progress ([`HaloError::StreamStuck`]) was used again:
    /// its GPU work never ends, so it refuses every call.
    #[error(
        "the halo exchange of rank {rank} is unusable: its stream is stuck ({why}); build a new one (on a GPU that recovered) or end the program"
    )]
    ExchangeStuck {
        /// The rank.
        rank: usize,
        /// The stuck-stream error.
        why: String,
    },
    /// A fault injection asked this process to kill itself (`HALO_FAULT=kill@STEP:RANK`), but the
    /// program installed no kill hook (`halo::exchange::perturb::set_kill_hook`): the library does
    /// not end the process itself.
    #[error(
        "{fault} asks rank {rank} to kill itself at step {step}, but this program installed no kill hook \
         (exchange::perturb::set_kill_hook): only the halo command and test programs simulate a crash; unset {fault}"
    )]
    KillRequested {
        /// The variable or option that asked, e.g. `HALO_FAULT=kill@20:1`.
        fault: String,
        /// The rank.
        rank: usize,
        /// The step.
        step: u64,
    },
    /// NVSHMEM could not be loaded, initialised or used.
    #[error("NVSHMEM: {0}")]
    Nvshmem(String),
    /// NVSHMEM's initialisation can never finish: halo recognised a fatal failure in NVSHMEM's own
    /// output (its proxy thread died) and returns at once instead of waiting out the start-up deadline.
    #[error("NVSHMEM start-up failed on {who}: {failure}")]
    NvshmemStartup {
        /// The rank, e.g. `rank 1 of 2 (GPU 0)`.
        who: String,
        /// What NVSHMEM printed, the cause and the fix.
        failure: crate::nvshmem::startup::StartupFailure,
    },
    /// The router could not plan the exchange's paths (or the PEs' plans disagree).
    #[error("routing: {0}")]
    Route(#[from] crate::desc::route::PathError),
    /// A decomposition cannot be built, or a halo plan is inconsistent.
    #[error(transparent)]
    Plan(#[from] crate::decomp::PlanError),
    /// An argument a user or caller passed is invalid.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A checked step's results differ from their references: coordinates after the halo, the
    /// two ends of a pulse, or forces and energy against the undecomposed system.
    #[error("verification failed at step {step}: {detail}")]
    Verification {
        /// The step checked.
        step: u64,
        /// What differed, and where.
        detail: String,
    },
    /// Reading a file failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What halo was reading.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with [`HaloError`].
pub type Result<T, E = HaloError> = std::result::Result<T, E>;

/// Attaches "what halo was doing" to a driver error.
pub trait CudaContextExt<T> {
    /// Maps a driver error into [`HaloError::Cuda`].
    fn during(self, what: impl Into<String>) -> Result<T>;
    /// [`Self::during`] with the description built only on error (for hot paths such as a
    /// launch, where formatting it every time would cost more than the call it describes).
    fn during_with<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T> CudaContextExt<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn during(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|source| HaloError::Cuda { what: what.into(), source })
    }

    fn during_with<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|source| HaloError::Cuda { what: what().into(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::{DriverError, sys::CUresult};

    #[test]
    fn during_with_builds_its_text_only_on_error() {
        let mut built = 0;
        let ok: std::result::Result<u32, DriverError> = Ok(7);
        assert_eq!(
            ok.during_with(|| {
                built += 1;
                "launching k".to_string()
            })
            .ok(),
            Some(7)
        );
        assert_eq!(built, 0, "the success path formatted the description");
        let err: std::result::Result<u32, DriverError> = Err(DriverError(CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES));
        match err.during_with(|| {
            built += 1;
            format!("launching {} {:?}", "k", (1, 2))
        }) {
            Err(HaloError::Cuda { what, source }) => {
                assert_eq!(what, "launching k (1, 2)");
                assert_eq!(source.0, CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
            }
            other => panic!("{:?}", other.map_err(|e| format!("{e:?}"))),
        }
        assert_eq!(built, 1);
    }
}
