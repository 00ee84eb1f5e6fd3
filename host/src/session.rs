//! Starting a rank: its GPU, the kernel module and, when several processes run, NVSHMEM.
//!
//! Under `halo launch`, rank 0 makes NVSHMEM's unique id and the others receive it through the
//! launcher's private rendezvous; under mpirun/srun NVSHMEM's own MPI/PMI bootstrap is used.

use crate::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use crate::error::{HaloError, Result};
use crate::gpu::{self, CudaContext, KernelModule};
use crate::launch::{Bootstrap as Launcher, RankEnv, rendezvous};
use crate::nvshmem::{self, Bootstrap, Nvshmem, UniqueId};
use crate::watchdog::{self, steps};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How much longer than the rendezvous's own deadline the watchdog gives the unique-id wait (the
/// rendezvous's error, which names rank 0, should come first).
const UNIQUE_ID_MARGIN: Duration = Duration::from_secs(5);

/// A rank that is one of several processes: its GPU, NVSHMEM, and the registered kernels.
pub struct PeSession {
    /// Rank, size and device from the launcher.
    pub env: RankEnv,
    /// This rank's GPU.
    pub ctx: Arc<CudaContext>,
    /// The NVSHMEM PE.
    pub nvshmem: Arc<Nvshmem>,
    /// The kernels, registered with NVSHMEM.
    pub module: Arc<KernelModule>,
}

impl PeSession {
    /// Opens the rank's GPU, initialises NVSHMEM, loads the kernels and registers them.
    ///
    /// Start-up is bounded: the unique-id rendezvous, NVSHMEM's initialisation, module
    /// registration and every later collective of this PE run with the deadline
    /// `HALO_STARTUP_TIMEOUT_S` (default 60 s, [`watchdog::bounded`]); a step that overruns it
    /// returns [`HaloError::Deadline`] naming this rank, the step, the likely cause and the fix
    /// (the process goes on; the `halo` command exits with 86 on it). Under NVSHMEM's MPI
    /// bootstrap init and the collectives stay on the calling thread and an overrun is reported
    /// instead ([`watchdog::set_overrun_hook`]). NVSHMEM's proxy thread dying inside its init is
    /// recognised from NVSHMEM's own lines and returned at once ([`HaloError::NvshmemStartup`]).
    pub fn start(env: RankEnv, nvshmem_lib: Option<&Path>) -> Result<Self> {
        let timeout = watchdog::startup_timeout()?;
        watchdog::set_identity(env.rank, env.nranks, env.device);
        // NVSHMEM's settings first, while this process has no other thread (the watchdog's
        // thread and the bounded-call worker, started below, never read the environment either).
        match env.bootstrap {
            Launcher::UniqueId | Launcher::None => set_default_env("NVSHMEM_REMOTE_TRANSPORT", "none"), // our launcher is single-node
            Launcher::Mpi => set_default_env("NVSHMEM_BOOTSTRAP", "MPI"),
            Launcher::Pmi => set_default_env("NVSHMEM_BOOTSTRAP", "PMI"),
            Launcher::Pmix => {
                set_default_env("NVSHMEM_BOOTSTRAP", "PMI");
                set_default_env("NVSHMEM_BOOTSTRAP_PMI", "PMIX");
            }
        }
        set_default_env("NVSHMEM_DISABLE_NVLS", "1"); // NVLink multicast stays off on shared machines
        // SAFETY: start-up, before NVSHMEM reads the environment (as set_default_env).
        unsafe { crate::exchange::proxy::disable_idle_proxy_by_default() };
        // Before the thread list `keep_launcher_off_proxy` compares with NVSHMEM's threads.
        watchdog::ensure_started();

        let ctx = gpu::open_device(env.device)?;
        let artifacts = KernelArtifacts::locate(DEFAULT_ARCH)?;
        let lib = nvshmem::load_library(nvshmem_lib)?;
        let bootstrap = match env.bootstrap {
            Launcher::UniqueId | Launcher::None => {
                let id = if env.rank == 0 {
                    let id = nvshmem::unique_id(&lib)?;
                    if env.nranks > 1 {
                        rendezvous::publish(&id.0).map_err(|e| HaloError::Nvshmem(format!("publishing the unique id: {e}")))?;
                    }
                    id
                } else {
                    let fetched = watchdog::bounded(steps::UNIQUE_ID, timeout + UNIQUE_ID_MARGIN, None, move || rendezvous::fetch(timeout))?;
                    let bytes = fetched.map_err(|e| HaloError::Nvshmem(format!("waiting for rank 0's unique id: {e}")))?;
                    UniqueId(bytes.try_into().map_err(|b: Vec<u8>| HaloError::Nvshmem(format!("unique id of {} bytes, 128 expected", b.len())))?)
                };
                Bootstrap::UniqueId { rank: env.rank, nranks: env.nranks, id }
            }
            Launcher::Mpi | Launcher::Pmi | Launcher::Pmix => Bootstrap::FromEnvironment,
        };
        let threads_before = crate::exchange::proxy::threads();
        let nvshmem = Nvshmem::init(lib, &ctx, &bootstrap, timeout)?;
        // The kernels are loaded only now: an init that failed is abandoned on its thread, which
        // may still be inside the driver, and unloading a module there could wait for it, so the
        // error would never reach the caller. Nothing of halo's on the GPU is torn down then.
        let mut module = KernelModule::load(&ctx, &artifacts)?;
        if let Some(moved) = crate::exchange::proxy::keep_launcher_off_proxy(&threads_before) {
            tracing::info!("{moved}");
        }
        if nvshmem.my_pe() != env.rank || nvshmem.n_pes() != env.nranks {
            return Err(HaloError::Nvshmem(format!(
                "NVSHMEM says PE {} of {}, the launcher said rank {} of {}",
                nvshmem.my_pe(),
                nvshmem.n_pes(),
                env.rank,
                env.nranks
            )));
        }
        nvshmem.register_module(&mut module)?;
        Ok(Self { env, ctx, nvshmem, module: Arc::new(module) })
    }

    /// A session on the NVSHMEM the application already initialised ([`Nvshmem::attach`]):
    /// opens GPU `device` (the one the application initialised NVSHMEM on), attaches, loads the
    /// kernels and registers them. No launcher variable is read: the rank is NVSHMEM's PE
    /// (`env.source` says `"the application's NVSHMEM"`). Dropping the session never finalises
    /// NVSHMEM; the application does, after dropping every halo object.
    ///
    /// `nvshmem_lib` names the host library the application loaded (`None`: NVSHMEM's soname).
    /// Later collectives are bounded by `HALO_STARTUP_TIMEOUT_S` (default 60 s) each.
    pub fn attach(device: usize, nvshmem_lib: Option<&Path>) -> Result<Self> {
        let timeout = watchdog::startup_timeout()?;
        watchdog::ensure_started();
        let ctx = gpu::open_device(device)?;
        let nvshmem = Nvshmem::attach(nvshmem_lib, &ctx, timeout)?;
        let (rank, nranks) = (nvshmem.my_pe(), nvshmem.n_pes());
        watchdog::set_identity(rank, nranks, device);
        let artifacts = KernelArtifacts::locate(DEFAULT_ARCH)?;
        let mut module = KernelModule::load(&ctx, &artifacts)?;
        nvshmem.register_module(&mut module)?;
        let env = RankEnv { rank, nranks, local_rank: rank, device, bootstrap: Launcher::None, source: ATTACHED };
        Ok(Self { env, ctx, nvshmem, module: Arc::new(module) })
    }
}

#[cfg(feature = "mpi")]
impl PeSession {
    /// A session started over the caller's MPI communicator (feature `mpi`): the GPU from the
    /// rank's node-local rank ([`nvshmem::mpi::device_from_communicator`]; `HALO_DEVICE` overrides it), the kernels, NVSHMEM
    /// bootstrapped by the unique id broadcast over `comm` ([`Nvshmem::init_with_mpi`]; PE = rank
    /// in `comm`), and the module registered. No launcher variable is read. halo owns NVSHMEM's
    /// lifetime here: drop the session (and everything built on it) before finalising MPI.
    /// NVSHMEM's own settings (`NVSHMEM_*`) come from the caller's environment as it is.
    /// Collective over `comm`; NVSHMEM's init and later collectives are bounded by
    /// `HALO_STARTUP_TIMEOUT_S` (default 60 s) each.
    pub fn init_with_mpi<C: ::mpi::traits::Communicator>(comm: &C, nvshmem_lib: Option<&Path>) -> Result<Self> {
        let (rank, nranks) = (comm.rank() as usize, comm.size() as usize);
        let (local_rank, local_size) = nvshmem::mpi::local_rank_and_size(comm);
        let device = nvshmem::mpi::device_of_local_rank(local_rank);
        // No launcher says how many ranks share a GPU: the node's ranks take the GPUs round robin
        // (unless `HALO_DEVICE` placed this one; `HALO_PES_PER_GPU` then says it, as under srun).
        if std::env::var_os(crate::launch::env::ENV_DEVICE).is_none() {
            crate::launch::env::set_pes_per_gpu(nvshmem::mpi::ranks_sharing_gpu(local_rank, local_size, gpu::device_count()));
        }
        // Every rank's own preparation first, agreed over `comm`: a rank that fails here (its
        // settings, GPU, kernels or library) must not leave the others waiting in the unique id's
        // broadcast.
        let prepared = device.and_then(|device| {
            let timeout = watchdog::startup_timeout()?;
            watchdog::set_identity(rank, nranks, device);
            watchdog::ensure_started();
            let ctx = gpu::open_device(device)?;
            let module = KernelModule::load(&ctx, &KernelArtifacts::locate(DEFAULT_ARCH)?)?;
            Ok((timeout, device, ctx, module, nvshmem::load_library(nvshmem_lib)?))
        });
        let (timeout, device, ctx, mut module, lib) =
            nvshmem::mpi::all_ready(comm, "to read their settings or open their GPU, kernels or NVSHMEM library", prepared)?;
        let nvshmem = match Nvshmem::init_with_mpi(lib, &ctx, comm, timeout) {
            Ok(nvshmem) => nvshmem,
            Err(e) => {
                // An init abandoned on its thread may still be inside the driver, where unloading
                // the module could wait for it (see `start`, which loads after init): leave it.
                if matches!(e, HaloError::NvshmemStartup { .. } | HaloError::Deadline(_)) {
                    std::mem::forget(module);
                }
                return Err(e);
            }
        };
        // Agreed too: a rank that fails here must not go on to the caller's next MPI collective
        // while the others enter another.
        let registered = nvshmem.register_module(&mut module);
        nvshmem::mpi::all_ready(comm, "to register halo's kernels with NVSHMEM", registered)?;
        let env = RankEnv { rank, nranks, local_rank, device, bootstrap: Launcher::None, source: MPI_COMMUNICATOR };
        Ok(Self { env, ctx, nvshmem, module: Arc::new(module) })
    }
}

/// [`RankEnv::source`] of a session made by `PeSession::init_with_mpi` (feature `mpi`).
pub const MPI_COMMUNICATOR: &str = "the caller's MPI communicator";

/// [`RankEnv::source`] of a session made by [`PeSession::attach`].
pub const ATTACHED: &str = "the application's NVSHMEM";

/// Sets an environment variable for NVSHMEM unless the user already chose a value.
fn set_default_env(key: &str, value: &str) {
    if std::env::var_os(key).is_none() {
        // SAFETY: called during start-up, before this process starts any thread that reads the
        // environment (NVSHMEM reads it during init, which comes after; halo's watchdog thread
        // never reads it).
        unsafe { std::env::set_var(key, value) };
    }
}
