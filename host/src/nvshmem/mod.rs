//! Safe NVSHMEM runtime over `nvshmem-sys`: initialisation (unique id from our launcher, or
//! NVSHMEM's own MPI/PMI bootstrap under mpirun/srun), symmetric buffers, peer pointers, barriers
//! and module registration. Finalised when the last handle goes, unless the application started
//! it and halo only attached ([`Nvshmem::attach`]).

use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::{CudaContext, CudaStream, DeviceMemory, KernelModule};
use crate::watchdog::{self, Step, steps};
use bytemuck::Pod;
use nvshmem_sys::{self as sys, NvshmemLib};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

mod attach;
mod kept_gather;
#[cfg(feature = "mpi")]
pub mod mpi;
mod node_gather;
pub mod startup;
pub use attach::{Lifetime, attachable_library, not_initialised, resident_library};
pub use kept_gather::{ENV_KEPT_GATHER, GatherRoute, KeptGather};

/// Set once this process gave up NVSHMEM's collective teardown (see [`abandon_collectives`]).
static ABANDONED: AtomicBool = AtomicBool::new(false);
/// Why, for the log.
static ABANDONED_WHY: Mutex<String> = Mutex::new(String::new());

/// Makes every later collective free and the finalisation of this process a no-op.
///
/// After a failed exchange (a device wait that expired, or a stream that made no progress) the
/// other PEs may be dead or stuck, so a collective `nvshmem_free` (which starts with a barrier)
/// would wait for them forever; and symmetric memory a stuck kernel still uses must not be freed.
/// The process is expected to end soon: its memory goes with it. The exchange calls this when it
/// is dropped after a failure without a `reset_protocol` (the exchange's).
pub fn abandon_collectives(why: &str) {
    if !ABANDONED.swap(true, Ordering::SeqCst) {
        tracing::warn!("NVSHMEM's collective teardown is skipped for the rest of this process: {why}");
        if let Ok(mut w) = ABANDONED_WHY.lock() {
            *w = why.to_owned();
        }
    }
}

/// Whether [`abandon_collectives`] was called.
pub fn collectives_abandoned() -> bool {
    ABANDONED.load(Ordering::SeqCst)
}

/// See [`set_abandon_after_failure`].
static ABANDON_AFTER_FAILURE: AtomicBool = AtomicBool::new(true);

/// Whether a PE exchange dropped after a device wait expired (without a successful
/// `reset_protocol`) gives up the collective teardown ([`abandon_collectives`]). On by default:
/// a command that ends on the failure must not wait for peers that may be dead (their barrier in
/// `nvshmem_free` would hang until the watchdog's deadline). A program that recovers by building a
/// new exchange on every PE together (all alive) turns it off. A stream that is stuck always
/// abandons the teardown.
pub fn set_abandon_after_failure(on: bool) {
    ABANDON_AFTER_FAILURE.store(on, Ordering::SeqCst);
}

/// The setting of [`set_abandon_after_failure`].
pub fn abandon_after_failure() -> bool {
    ABANDON_AFTER_FAILURE.load(Ordering::SeqCst)
}

/// A unique id (128 bytes) made by PE 0 and handed to every PE through a private channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

/// How the PEs find each other.
#[derive(Clone, Debug)]
pub enum Bootstrap {
    /// Our launcher: every PE knows its rank and the PE count, PE 0's unique id came by rendezvous.
    UniqueId {
        /// This PE.
        rank: usize,
        /// Number of PEs.
        nranks: usize,
        /// PE 0's id.
        id: UniqueId,
    },
    /// NVSHMEM's default bootstrap chosen by `NVSHMEM_BOOTSTRAP` (PMI by default; MPI, PMI2, PMIX)
    /// for runs under mpirun or srun, across nodes.
    FromEnvironment,
}

/// Loads NVSHMEM's host library (see `nvshmem_sys::discover` for the search order).
pub fn load_library(explicit: Option<&Path>) -> Result<NvshmemLib> {
    nvshmem_sys::discover::load(explicit).map_err(HaloError::Nvshmem)
}

/// Makes a unique id (PE 0 only, before init).
pub fn unique_id(lib: &NvshmemLib) -> Result<UniqueId> {
    let mut id = sys::nvshmemx_uniqueid_t::default();
    // SAFETY: writes the 128-byte struct.
    let rc = unsafe { (lib.api.nvshmemx_get_uniqueid)(&mut id) };
    if rc != 0 {
        return Err(HaloError::Nvshmem(format!("nvshmemx_get_uniqueid failed ({rc})")));
    }
    Ok(UniqueId(bytemuck_id(&id)))
}

fn bytemuck_id(id: &sys::nvshmemx_uniqueid_t) -> [u8; 128] {
    let mut out = [0u8; 128];
    out[..4].copy_from_slice(&id.version.to_ne_bytes());
    out[4..].copy_from_slice(&id.internal);
    out
}

/// An initialised NVSHMEM PE. Dropping the last handle finalises NVSHMEM when halo started it
/// ([`Lifetime::Halo`]; unless it became unusable: see [`Self::usable`]), never when it is attached
/// to the application's ([`Lifetime::Application`]).
pub struct Nvshmem {
    /// Dropped after finalisation only: a call abandoned on its thread may still run its code.
    lib: ManuallyDrop<NvshmemLib>,
    ctx: Arc<CudaContext>,
    my_pe: usize,
    n_pes: usize,
    /// Deadline of every collective call ([`watchdog::startup_timeout`]).
    timeout: Duration,
    /// How the collective calls run, and whether they still may.
    collectives: Collectives,
    // NVSHMEM keeps a pointer to the id it was initialised with.
    _id: Box<sys::nvshmemx_uniqueid_t>,
    /// Whether dropping the last handle finalises NVSHMEM.
    lifetime: Lifetime,
}

// SAFETY: NVSHMEM's host API may be called from any thread with the context bound; halo calls it
// from one thread per PE, and the handle only hands out plain values.
unsafe impl Send for Nvshmem {}
// SAFETY: as above.
unsafe impl Sync for Nvshmem {}

impl Nvshmem {
    /// Initialises this process as one PE on `ctx`'s GPU (the context is made current first:
    /// NVSHMEM binds to the current context's device). Initialisation and every later collective
    /// call (allocation, free, barrier, all-gather, module registration, finalisation) run on a
    /// thread of their own with a deadline of `timeout` each ([`watchdog::bounded`]): a call that
    /// overruns it returns [`HaloError::Deadline`] naming the rank and the step, and leaves this
    /// PE's NVSHMEM unusable ([`Self::usable`]) instead of hanging the job.
    ///
    /// A failure NVSHMEM prints during init but never returns from (its proxy thread dying, as over
    /// UCX without a GPU-CPU mapping: [`startup`]) ends this call at once with
    /// [`HaloError::NvshmemStartup`], naming the cause and the fix.
    ///
    /// Under NVSHMEM's MPI bootstrap init stays on the calling thread (MPI wants its later calls
    /// from the thread that initialised it), so nothing can return before NVSHMEM does: an init
    /// that overruns `timeout` is only reported, through `tracing::error!` and the program's
    /// overrun hook ([`watchdog::set_overrun_hook`]; the `halo` command's ends the process).
    pub fn init(lib: NvshmemLib, ctx: &Arc<CudaContext>, bootstrap: &Bootstrap, timeout: Duration) -> Result<Arc<Self>> {
        ctx.bind_to_thread().during("binding the context for NVSHMEM")?;
        let (major, minor, _) = lib.version();
        // NVSHMEM 3.8 introduced version 2 of the init structs; 3.4 reads version 1.
        let struct_version = if (major, minor) >= (3, 8) { 2 } else { 1 };
        let mut attr = sys::nvshmemx_init_attr_t::initializer(struct_version);
        let mut id = Box::new(sys::nvshmemx_uniqueid_t::default());
        let flags = match bootstrap {
            Bootstrap::UniqueId { rank, nranks, id: UniqueId(bytes) } => {
                id.version = i32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                id.internal.copy_from_slice(&bytes[4..]);
                // SAFETY: `id` is boxed and kept in `Self` for NVSHMEM's lifetime.
                let rc = unsafe { (lib.api.nvshmemx_set_attr_uniqueid_args)(*rank as i32, *nranks as i32, &*id, &mut attr) };
                if rc != 0 {
                    return Err(HaloError::Nvshmem(format!("nvshmemx_set_attr_uniqueid_args failed ({rc})")));
                }
                sys::NVSHMEMX_INIT_WITH_UNIQUEID
            }
            Bootstrap::FromEnvironment => 0,
        };
        // Init runs on a thread of its own while NVSHMEM's output is read ([`startup`]): a proxy
        // thread that dies inside init (NVSHMEM never returns then) ends this call at once with
        // the cause and the fix, and an init that overruns `timeout` with the deadline error.
        struct SendAttr(sys::nvshmemx_init_attr_t);
        // SAFETY: the attributes hold pointers to `id` (kept alive below, and leaked if init is
        // abandoned) and are used by the one thread they are moved to.
        unsafe impl Send for SendAttr {}
        let (init_fn, attr, init_ctx) = (lib.api.nvshmemx_hostlib_init_attr, SendAttr(attr), ctx.clone());
        let call = move || -> std::result::Result<i32, String> {
            let mut attr = attr;
            init_ctx.bind_to_thread().map_err(|e| format!("binding the context for NVSHMEM: {e}"))?;
            // SAFETY: attr is fully initialised for this library's struct version; the library
            // stays loaded while the call runs (leaked if it is abandoned).
            Ok(unsafe { init_fn(flags, &mut attr.0) })
        };
        // Under NVSHMEM's MPI bootstrap init may initialise MPI, whose later calls (NVSHMEM's
        // collectives, from this thread) must come from the thread that did: init stays here,
        // watched (an overrun is reported, not returned: see above).
        let mpi = std::env::var("NVSHMEM_BOOTSTRAP").is_ok_and(|b| b.trim().eq_ignore_ascii_case("mpi"));
        let started = std::time::Instant::now();
        let on_calling_thread = matches!(bootstrap, Bootstrap::FromEnvironment) && mpi;
        let watched = if on_calling_thread {
            let _watched = watchdog::arm(steps::NVSHMEM_INIT, timeout);
            startup::Watched::Done(call())
        } else {
            startup::run_watched(call, |on_line| startup::StderrTap::start(on_line), timeout)
                .map_err(|e| HaloError::Nvshmem(format!("could not watch NVSHMEM's init (a pipe for its messages, or a thread): {e}")))?
        };
        let rc = match watched {
            startup::Watched::Done(Ok(rc)) => rc,
            startup::Watched::Done(Err(e)) => return Err(HaloError::Nvshmem(e)),
            abandoned => {
                // The init thread is still inside NVSHMEM: the library and the id it reads stay.
                std::mem::forget(lib);
                Box::leak(id);
                return Err(match abandoned {
                    startup::Watched::Failed(failure) => HaloError::NvshmemStartup { who: watchdog::identity(), failure },
                    _ => HaloError::Deadline(Box::new(watchdog::Overrun::now(steps::NVSHMEM_INIT, started.elapsed()))),
                });
            }
        };
        if rc != 0 {
            return Err(HaloError::Nvshmem(format!("nvshmemx_hostlib_init_attr failed ({rc}); rerun with NVSHMEM_DEBUG=INFO for NVSHMEM's reason")));
        }
        // SAFETY: initialised above.
        let (status, my_pe, n_pes) = unsafe { ((lib.api.nvshmemx_init_status)(), (lib.api.nvshmem_my_pe)(), (lib.api.nvshmem_n_pes)()) };
        if status < sys::NVSHMEM_STATUS_IS_INITIALIZED {
            return Err(HaloError::Nvshmem(format!("NVSHMEM init status is {status} after init")));
        }
        Ok(Arc::new(Self {
            lib: ManuallyDrop::new(lib),
            ctx: ctx.clone(),
            my_pe: my_pe as usize,
            n_pes: n_pes as usize,
            timeout,
            collectives: Collectives { timeout, ctx: Some(ctx.clone()), on_calling_thread, unusable: OnceLock::new() },
            _id: id,
            lifetime: Lifetime::Halo,
        }))
    }

    /// `Ok` while this PE's NVSHMEM can run collectives; [`HaloError::NvshmemUnusable`] once one of
    /// its calls overran its deadline (it may still be running, and the peers are gone or stuck):
    /// every later collective is refused at once, and dropping the last handle skips the
    /// finalisation and the frees (their memory and the library stay until the process ends).
    pub fn usable(&self) -> Result<()> {
        self.collectives.usable()
    }

    /// Runs NVSHMEM host call `f` for `step` ([`Collectives::run`]).
    fn bounded<R: Send + 'static>(&self, step: Step, f: impl FnOnce() -> R + Send + 'static) -> Result<R> {
        self.collectives.run(step, f)
    }

    /// This PE.
    pub fn my_pe(&self) -> usize {
        self.my_pe
    }

    /// Number of PEs.
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }

    /// The host library's version.
    pub fn version(&self) -> (i32, i32, i32) {
        self.lib.version()
    }

    /// Where the host library was loaded from.
    pub fn library_path(&self) -> &Path {
        self.lib.path()
    }

    /// The CUDA context this PE uses.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The address at which this process can load/store PE `pe`'s copy of the symmetric address
    /// `local`, or `None` when `pe` is not reachable that way (then only put/get work).
    pub fn peer_ptr(&self, local: u64, pe: usize) -> Option<u64> {
        // SAFETY: a query on a symmetric address.
        let p = unsafe { (self.lib.api.nvshmem_ptr)(local as *const _, pe as i32) };
        (!p.is_null()).then_some(p as u64)
    }

    /// NVSHMEM's initialisation status (`nvshmemx_init_status`: 2 is initialised), for messages.
    pub fn init_status(&self) -> i32 {
        // SAFETY: a plain query, valid at any time after the library is loaded.
        unsafe { (self.lib.api.nvshmemx_init_status)() }
    }

    /// The deadline of each collective call of this PE.
    pub fn collective_timeout(&self) -> Duration {
        self.timeout
    }

    /// Host barrier across all PEs (also completes outstanding puts), bounded by the collective deadline.
    pub fn barrier_all(&self) -> Result<()> {
        let barrier = self.lib.api.nvshmem_barrier_all;
        // SAFETY: initialised; collective across PEs.
        self.bounded(steps::BARRIER, move || unsafe { barrier() })
    }

    /// A barrier across all PEs enqueued on `stream` (refused when [`Self::usable`] is not).
    pub fn barrier_all_on_stream(&self, stream: &CudaStream) -> Result<()> {
        self.usable()?;
        // SAFETY: initialised; the stream belongs to this PE's context.
        unsafe { (self.lib.api.nvshmemx_barrier_all_on_stream)(stream.cu_stream() as *mut _) };
        Ok(())
    }

    /// Registers `module`'s NVSHMEM device state (after checking the NVSHMEM version compiled into
    /// it), so its kernels may call NVSHMEM device functions. Must happen before any such launch.
    pub fn register_module(self: &Arc<Self>, module: &mut KernelModule) -> Result<()> {
        let device = module_nvshmem_version(module)?;
        check_nvshmem_versions(device, self.version(), self.library_path())?;
        let (init, raw) = (self.lib.api.nvshmemx_cumodule_init, module.raw() as usize);
        // SAFETY: the module is loaded in this PE's context and holds NVSHMEM's module globals (if
        // the call is abandoned, the module is not unloaded: an unusable PE skips its finalisation).
        let rc = self.bounded(steps::MODULE_REGISTRATION, move || unsafe { init(raw as *mut _) })?;
        if rc != 0 {
            return Err(HaloError::Nvshmem(format!("nvshmemx_cumodule_init failed ({rc})")));
        }
        module.set_nvshmem(Some(self.clone()));
        Ok(())
    }

    /// Undoes [`Self::register_module`]; called by the module before it unloads.
    pub(crate) fn finalize_module(&self, raw: cudarc::driver::sys::CUmodule) {
        if self.usable().is_err() {
            return; // NVSHMEM may still be inside a call: leave its module state alone
        }
        // SAFETY: the module was registered by this PE and is still loaded.
        unsafe { (self.lib.api.nvshmemx_cumodule_finalize)(raw as *mut _) };
    }

    /// Allocates `len` elements of `T` on the symmetric heap. Collective: every PE must call it
    /// with the same size, in the same order.
    pub fn alloc<T: Pod>(self: &Arc<Self>, len: usize) -> Result<SymmetricBuffer<T>> {
        let bytes = (len * size_of::<T>()).max(1);
        let align = self.lib.api.nvshmem_align;
        // SAFETY: collective allocation; the size is identical on every PE by the caller's contract.
        let p = self.bounded(steps::SYMMETRIC_ALLOC, move || unsafe { align(256, bytes) as usize })?;
        if p == 0 {
            let configured = std::env::var("NVSHMEM_SYMMETRIC_SIZE").ok();
            return Err(HaloError::Nvshmem(heap_too_small_message(bytes, configured.as_deref())));
        }
        Ok(SymmetricBuffer { ptr: p as u64, len, nvshmem: self.clone(), _marker: PhantomData })
    }
}

/// How a PE's collective host calls run: bounded by `timeout` on the bounded-call worker with
/// `ctx` bound ([`watchdog::bounded`]), or on the calling thread under NVSHMEM's MPI bootstrap
/// (MPI wants its calls from the thread that initialised it; an overrun is only reported there:
/// [`watchdog::arm`]). The first call that overruns its deadline makes the PE unusable: it gives
/// up the collective teardown ([`abandon_collectives`]) and every later call is refused at once.
struct Collectives {
    timeout: Duration,
    ctx: Option<Arc<CudaContext>>,
    on_calling_thread: bool,
    /// Set when a call overran its deadline: why.
    unusable: OnceLock<String>,
}

impl Collectives {
    /// `Ok` while no call overran its deadline, else [`HaloError::NvshmemUnusable`].
    fn usable(&self) -> Result<()> {
        match self.unusable.get() {
            None => Ok(()),
            Some(why) => Err(HaloError::NvshmemUnusable { who: watchdog::identity(), why: why.clone() }),
        }
    }

    /// Runs `f` for `step` (see the type), or refuses it when the PE is unusable.
    fn run<R: Send + 'static>(&self, step: Step, f: impl FnOnce() -> R + Send + 'static) -> Result<R> {
        self.usable()?;
        if self.on_calling_thread {
            if let Some(ctx) = &self.ctx {
                ctx.bind_to_thread().during("binding the context")?;
            }
            let _watched = watchdog::arm(step, self.timeout);
            return Ok(f());
        }
        watchdog::bounded(step, self.timeout, self.ctx.as_ref(), f).inspect_err(|e| {
            if matches!(e, HaloError::Deadline(_)) {
                let why = e.to_string();
                abandon_collectives(&why);
                let _ = self.unusable.set(why);
            }
        })
    }
}

/// How [`Nvshmem::all_gather_bytes`] moves small host data between the PEs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatherPath {
    /// `nvshmem_uint8_fcollect` over the world team: one PE per GPU, or several under MPS.
    Fcollect,
    /// `halo launch`'s rendezvous directory ([`crate::launch::rendezvous`]).
    Rendezvous,
    /// Every PE puts its bytes from the host into its own slot of every PE's symmetric buffer
    /// (`nvshmem_putmem`), then `nvshmem_barrier_all` completes them all.
    PutsAndBarrier,
}

impl GatherPath {
    /// A short name, for the start-up line and messages.
    pub fn describe(self) -> &'static str {
        match self {
            GatherPath::Fcollect => "NVSHMEM fcollect",
            GatherPath::Rendezvous => "halo launch's rendezvous (several PEs per GPU)",
            GatherPath::PutsAndBarrier => "NVSHMEM puts and a barrier (several PEs per GPU)",
        }
    }
}

/// The all-gather of a PE whose NVSHMEM reports `init_status` (`nvshmemx_init_status`), with
/// `rendezvous` true when `halo launch` started it (`HALO_RENDEZVOUS_DIR` is set).
///
/// With several PEs on one GPU and no MPS (NVSHMEM's *limited MPG* mode,
/// [`sys::NVSHMEM_STATUS_LIMITED_MPG`]) NVSHMEM ends the process on any collective but barriers
/// (fcollect among them), while RMA and barriers work. So such a run gathers through the
/// launcher's rendezvous when it has one, and by host puts and a barrier under any other launcher
/// (mpirun, srun); every other run keeps fcollect, which works across nodes and transports.
pub fn gather_path(init_status: i32, rendezvous: bool) -> GatherPath {
    match (init_status == sys::NVSHMEM_STATUS_LIMITED_MPG, rendezvous) {
        (false, _) => GatherPath::Fcollect,
        (true, true) => GatherPath::Rendezvous,
        (true, false) => GatherPath::PutsAndBarrier,
    }
}

/// Why NVSHMEM refuses host call `call` in a run whose init status is `init_status`, or `None`
/// when the call is allowed. For a collective other than a barrier. NVSHMEM ends the process on
/// such a call with only its own line (`Called NVSHMEM API not supported with limited MPG ...`),
/// so halo asks before calling and the error names the call, the reason and the fixes.
pub fn limited_mpg_refusal(call: &str, init_status: i32) -> Option<String> {
    (init_status == sys::NVSHMEM_STATUS_LIMITED_MPG).then(|| {
        format!(
            "NVSHMEM refuses {call} here: several PEs per GPU without MPS (NVSHMEM's limited MPG mode), and it would end \
             the process; run one PE per GPU, or start CUDA MPS (nvidia-cuda-mps-control -d) before the run"
        )
    })
}

/// Numbers the rendezvous all-gathers of this process, so each has a tag of its own (every PE
/// makes the same collective calls in the same order, so the numbers agree across PEs).
static RENDEZVOUS_GATHERS: AtomicU64 = AtomicU64::new(0);

impl Nvshmem {
    /// How this PE gathers host data ([`gather_path`] for this run).
    pub fn gather_path(&self) -> GatherPath {
        gather_path(self.init_status(), std::env::var_os(crate::launch::env::ENV_RENDEZVOUS_DIR).is_some())
    }

    /// Every PE's `value`, indexed by PE. Collective: every PE calls it at the same point.
    pub fn all_gather_u64(self: &Arc<Self>, value: u64) -> Result<Vec<u64>> {
        let bytes = match self.gather_path() {
            GatherPath::Rendezvous => self.gather_by_rendezvous(&value.to_ne_bytes())?.concat(),
            path => self.gather_slots(&value.to_ne_bytes(), path)?,
        };
        if bytes.len() != 8 * self.n_pes {
            return Err(HaloError::Nvshmem(format!("an all-gather of {} PEs' words returned {} bytes", self.n_pes, bytes.len())));
        }
        Ok(bytes.chunks_exact(8).map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect())
    }

    /// Every PE's bytes, indexed by PE, under any launcher (halo launch, mpirun, srun), across
    /// nodes and with several PEs per GPU ([`gather_path`]): through the rendezvous, or the
    /// lengths by [`Self::all_gather_u64`] and then the bytes padded to the longest in one
    /// all-gather. Collective; for small host data (facts, plans, checks).
    pub fn all_gather_bytes(self: &Arc<Self>, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let path = self.gather_path();
        if path == GatherPath::Rendezvous {
            return self.gather_by_rendezvous(mine);
        }
        let lens = self.all_gather_u64(mine.len() as u64)?;
        let max = lens.iter().copied().max().unwrap_or(0) as usize;
        if max == 0 {
            return Ok(vec![Vec::new(); self.n_pes]);
        }
        let mut padded = mine.to_vec();
        padded.resize(max, 0);
        let all = self.gather_slots(&padded, path)?;
        Ok(all.chunks(max).zip(&lens).map(|(c, &n)| c[..n as usize].to_vec()).collect())
    }

    /// Every PE's `mine` (the same length on every PE), concatenated in PE order, through two
    /// symmetric buffers: by fcollect, or by host puts into this PE's slot on every PE and a
    /// barrier. Bounded by the watchdog.
    fn gather_slots(self: &Arc<Self>, mine: &[u8], path: GatherPath) -> Result<Vec<u8>> {
        let slot = mine.len();
        let src = self.alloc::<u8>(slot)?;
        let dst = self.alloc::<u8>(slot * self.n_pes)?;
        src.copy_from_host(mine)?;
        if path == GatherPath::PutsAndBarrier {
            let mine_at = dst.ptr + (self.my_pe * slot) as u64;
            let (put, from, n_pes) = (self.lib.api.nvshmem_putmem, src.ptr, self.n_pes);
            self.bounded(steps::GATHER, move || {
                for pe in 0..n_pes {
                    // SAFETY: both buffers are symmetric (allocated on every PE, same sizes, and
                    // the allocation's barrier ensures every PE has them); this PE's slot of `dst`
                    // holds `slot` bytes; the blocking put has completed locally when it returns
                    // (if it is abandoned, the PE is unusable and the buffers are never freed).
                    unsafe { put(mine_at as *mut _, from as *const _, slot, pe as i32) };
                }
            })?;
            // Completes every PE's puts before anyone reads: each put returned before its PE
            // entered the barrier.
            self.barrier_all()?;
        } else {
            if let Some(why) = limited_mpg_refusal("nvshmem_uint8_fcollect", self.init_status()) {
                return Err(HaloError::Nvshmem(why));
            }
            // SAFETY: as above; `dst` holds `slot` bytes of every PE; the host collective completes
            // before it returns.
            let (fcollect, to, from) = (self.lib.api.nvshmem_uint8_fcollect, dst.ptr, src.ptr);
            let rc = self.bounded(steps::GATHER, move || unsafe { fcollect(sys::NVSHMEM_TEAM_WORLD, to as *mut u8, from as *const u8, slot) })?;
            if rc != 0 {
                return Err(HaloError::Nvshmem(format!("nvshmem_uint8_fcollect failed ({rc})")));
            }
        }
        dst.to_host()
    }

    /// Every PE's bytes through `halo launch`'s rendezvous directory, under a tag of its own, waiting
    /// at most the collective deadline for the slowest PE.
    fn gather_by_rendezvous(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let tag = format!("nvshmem-gather-{}", RENDEZVOUS_GATHERS.fetch_add(1, Ordering::SeqCst));
        let all = crate::launch::rendezvous::Rendezvous::from_env()
            .and_then(|r| r.all_gather(&tag, mine, self.timeout))
            .map_err(|e| HaloError::Nvshmem(format!("all-gather `{tag}` through halo launch's rendezvous: {e}")))?;
        if all.len() != self.n_pes {
            return Err(HaloError::Nvshmem(format!(
                "all-gather `{tag}`: halo launch's rendezvous has {} ranks but NVSHMEM {} PEs",
                all.len(),
                self.n_pes
            )));
        }
        Ok(all)
    }
}

impl Drop for Nvshmem {
    fn drop(&mut self) {
        if self.lifetime == Lifetime::Application {
            // The application initialised NVSHMEM and finalises it. Only halo's own reference to
            // the library goes (the application holds its own), unless a call of ours may still run.
            if self.usable().is_ok() {
                // SAFETY: no call of halo's through this handle runs any more.
                unsafe { ManuallyDrop::drop(&mut self.lib) };
            }
            return;
        }
        if collectives_abandoned() || self.usable().is_err() {
            // The peers may be gone (finalising would wait for them: see abandon_collectives), or
            // a call is still inside NVSHMEM: the library stays loaded, nothing is finalised.
            return;
        }
        let finalize = self.lib.api.nvshmemx_hostlib_finalize;
        // SAFETY: the last handle: every symmetric buffer (which holds an Arc) is already freed.
        match self.bounded(steps::FINALIZE, move || unsafe { finalize() }) {
            // SAFETY: finalised: no call of this library runs any more.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.lib) },
            Err(e) => tracing::error!("{e}; NVSHMEM stays loaded"),
        }
    }
}

/// Whether kernels built against NVSHMEM `device` (the device library linked into the PTX) may run
/// with the host library of version `host` loaded from `library`. NVSHMEM's rule: the same major
/// version, and a device minor no newer than the host minor (the patch level does not matter).
/// The error names both versions, the library and both fixes. Pure, so it is tested without a GPU.
pub fn check_nvshmem_versions(device: (i32, i32, i32), host: (i32, i32, i32), library: &Path) -> Result<()> {
    if device.0 != host.0 || device.1 > host.1 {
        return Err(HaloError::Nvshmem(format!(
            "the kernels were built against NVSHMEM {}.{}.{} but the host library {} is {}.{}.{}: \
             rebuild with `cargo xtask build-ptx --nvshmem {}.{}.{}` or load a matching library (HALO_NVSHMEM_LIB)",
            device.0,
            device.1,
            device.2,
            library.display(),
            host.0,
            host.1,
            host.2,
            host.0,
            host.1,
            host.2
        )));
    }
    Ok(())
}

/// The message for a failed symmetric allocation of `bytes` bytes, given the value of
/// `NVSHMEM_SYMMETRIC_SIZE` (`None`: unset, so NVSHMEM's 1 GiB default applies). It names the
/// variable to raise, because NVSHMEM sizes the heap once at init and cannot grow it.
pub fn heap_too_small_message(bytes: usize, configured: Option<&str>) -> String {
    let configured = configured.unwrap_or("the default (1 GiB)");
    format!(
        "the NVSHMEM symmetric heap is too small for {bytes} more bytes (NVSHMEM_SYMMETRIC_SIZE is {configured}): \
         raise NVSHMEM_SYMMETRIC_SIZE, e.g. NVSHMEM_SYMMETRIC_SIZE=4G"
    )
}

/// `(major, minor, patch)` of the NVSHMEM device library linked into a module
/// (its `nvshmemi_device_lib_version_d` global).
pub fn module_nvshmem_version(module: &KernelModule) -> Result<(i32, i32, i32)> {
    let name = std::ffi::CString::new("nvshmemi_device_lib_version_d").expect("no NUL");
    module.context().bind_to_thread().during("binding the context")?;
    // SAFETY: reads a 12-byte global of the loaded module.
    let (ptr, bytes) = unsafe { cudarc::driver::result::module::get_global(module.raw(), name) }
        .map_err(|_| HaloError::StalePtx { path: module.path().clone(), detail: "no NVSHMEM device library linked in".into() })?;
    let mut v = [0i32; 3];
    if bytes < 12 {
        return Err(HaloError::StalePtx { path: module.path().clone(), detail: format!("NVSHMEM version global of {bytes} bytes") });
    }
    // SAFETY: `ptr` is at least 12 bytes.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut v, ptr) }.during("reading the NVSHMEM version of the module")?;
    Ok((v[0], v[1], v[2]))
}

/// A typed allocation on the symmetric heap: the same offset on every PE. Freed collectively on
/// drop (every PE must drop its buffers in the same order).
pub struct SymmetricBuffer<T: Pod> {
    ptr: u64,
    len: usize,
    nvshmem: Arc<Nvshmem>,
    _marker: PhantomData<T>,
}

impl<T: Pod> SymmetricBuffer<T> {
    /// This buffer on PE `pe`, if reachable by loads and stores.
    pub fn peer_ptr(&self, pe: usize) -> Option<u64> {
        self.nvshmem.peer_ptr(self.ptr, pe)
    }
}

impl<T: Pod> DeviceMemory<T> for SymmetricBuffer<T> {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn context(&self) -> &Arc<CudaContext> {
        &self.nvshmem.ctx
    }
}

impl<T: Pod> Drop for SymmetricBuffer<T> {
    fn drop(&mut self) {
        if collectives_abandoned() || self.nvshmem.usable().is_err() {
            return; // see abandon_collectives and Nvshmem::usable: leaked until the process ends
        }
        let (free, ptr) = (self.nvshmem.lib.api.nvshmem_free, self.ptr);
        // SAFETY: allocated by nvshmem_align; collective free in matching order on every PE.
        if let Err(e) = self.nvshmem.bounded(steps::SYMMETRIC_FREE, move || unsafe { free(ptr as *mut _) }) {
            tracing::error!("{e}; the buffer is not freed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four PEs on two GPUs (limited MPG) died in `nvshmem_uint8_fcollect`. Such a run
    /// must gather another way under every launcher; every other run keeps fcollect.
    #[test]
    fn several_pes_per_gpu_without_mps_never_gather_by_fcollect() {
        let limited = sys::NVSHMEM_STATUS_LIMITED_MPG;
        assert_eq!(gather_path(limited, true), GatherPath::Rendezvous);
        assert_eq!(gather_path(limited, false), GatherPath::PutsAndBarrier);
        for status in [sys::NVSHMEM_STATUS_IS_INITIALIZED, sys::NVSHMEM_STATUS_FULL_MPG] {
            for rendezvous in [false, true] {
                assert_eq!(gather_path(status, rendezvous), GatherPath::Fcollect, "status {status}, rendezvous {rendezvous}");
            }
        }
    }

    /// A collective that overruns its deadline returns the error in bounded time and leaves the PE
    /// unusable: every later collective is refused at once, without running, and names why.
    #[test]
    fn a_pe_whose_collective_overran_refuses_every_later_one() {
        let c = Collectives { timeout: Duration::from_millis(100), ctx: None, on_calling_thread: false, unusable: OnceLock::new() };
        assert_eq!(c.run(steps::BARRIER, || 3).unwrap(), 3);
        let (release, held) = std::sync::mpsc::channel::<()>();
        let started = std::time::Instant::now();
        let e = c.run(steps::BARRIER, move || held.recv_timeout(Duration::from_secs(30)).is_ok()).unwrap_err();
        assert!(matches!(&e, HaloError::Deadline(o) if o.step == steps::BARRIER), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(collectives_abandoned(), "the teardown would wait for the stuck barrier");
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let refused = c.run(steps::SYMMETRIC_ALLOC, move || flag.store(true, Ordering::SeqCst)).unwrap_err();
        assert!(!ran.load(Ordering::SeqCst), "an unusable PE ran a collective");
        let m = refused.to_string();
        assert!(matches!(refused, HaloError::NvshmemUnusable { .. }), "{m}");
        assert!(m.contains("unusable") && m.contains("`barrier` did not finish"), "{m}");
        assert!(c.usable().is_err());
        drop(release);
    }

    #[test]
    fn a_refused_collective_is_named_with_the_reason_and_the_fixes() {
        let why = limited_mpg_refusal("nvshmem_uint8_fcollect", sys::NVSHMEM_STATUS_LIMITED_MPG).expect("refused");
        assert!(why.contains("nvshmem_uint8_fcollect") && why.contains("several PEs per GPU"), "{why}");
        assert!(why.contains("one PE per GPU") && why.contains("MPS"), "{why}");
        for status in [sys::NVSHMEM_STATUS_IS_INITIALIZED, sys::NVSHMEM_STATUS_FULL_MPG] {
            assert_eq!(limited_mpg_refusal("nvshmem_uint8_fcollect", status), None);
        }
    }
}
