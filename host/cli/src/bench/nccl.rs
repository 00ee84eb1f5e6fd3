//! The NCCL baseline: the same host-orchestrated structure as `staged` (per pulse a pack kernel,
//! then the transfer; forces last pulse first with an unpack-accumulate), with the transfer done
//! by `ncclGroupStart / ncclSend / ncclRecv / ncclGroupEnd` on the rank's stream. NCCL is
//! stream-ordered, so unlike the staged path no host sync is needed inside a step: this is what
//! a GPU code reaching for NCCL would write, and the fairest host-driven baseline.
//!
//! NCCL is opened at run time by its soname (`libnccl.so.2`, or `HALO_NCCL_LIB`): cudarc's
//! loader only tries unversioned names, which plain runtime installs do not ship. Only the six
//! entry points used here are resolved; their C signatures come from `nccl.h` (2.x, stable since
//! 2.7): `ncclResult_t` and `ncclDataType_t` are C enums (`int`), `ncclComm_t` and `cudaStream_t`
//! are opaque pointers, `ncclUniqueId` is 128 bytes passed by value.

use super::graph::Phase;
use super::pecomm::PeComm;
use crate::error::{CudaContextExt, HaloError, Result};
use crate::exchange::RankExchange;
use crate::gpu::{CudaStream, DeviceMemory, KernelModule};
use crate::session::PeSession;
use cudarc::driver::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use std::ffi::{c_int, c_void};
use std::rc::Rc;
use std::sync::Arc;

/// `ncclFloat32`; a `float3` travels as three of them.
const NCCL_FLOAT32: c_int = 7;
/// `ncclSuccess`.
const NCCL_SUCCESS: c_int = 0;
/// `ncclInProgress` (non-blocking communicators only; never returned by the blocking ones used).
const NCCL_IN_PROGRESS: c_int = 7;

/// `ncclUniqueId`: what rank 0 creates and every rank needs to join the communicator.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

type Comm = *mut c_void;

struct Api {
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int,
    comm_destroy: unsafe extern "C" fn(Comm) -> c_int,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const std::ffi::c_char,
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
}

/// The loaded NCCL library.
pub struct Nccl {
    api: Api,
    path: String,
    _lib: libloading::Library,
}

impl Nccl {
    /// Opens NCCL: `HALO_NCCL_LIB` if set, else `libnccl.so.2`, else `libnccl.so`.
    pub fn load() -> Result<Arc<Self>> {
        let candidates: Vec<String> = match std::env::var("HALO_NCCL_LIB") {
            Ok(p) => vec![p],
            Err(_) => vec!["libnccl.so.2".into(), "libnccl.so".into()],
        };
        let mut last = String::new();
        for name in &candidates {
            // SAFETY: loading NCCL runs its (side-effect free) initialisers only.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Self::resolve(lib, name.clone()).map(Arc::new),
                Err(e) => last = e.to_string(),
            }
        }
        Err(HaloError::InvalidInput(format!(
            "NCCL is not installed here (tried {}: {last}); set HALO_NCCL_LIB to libnccl.so.2's path",
            candidates.join(", ")
        )))
    }

    fn resolve(lib: libloading::Library, path: String) -> Result<Self> {
        fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T> {
            // SAFETY: `T` is the documented C signature of `name` in nccl.h (see the module docs).
            unsafe { lib.get::<T>(name.as_bytes()).map(|s| *s) }.map_err(|e| HaloError::InvalidInput(format!("NCCL library lacks {name}: {e}")))
        }
        let api = Api {
            get_unique_id: sym(&lib, "ncclGetUniqueId")?,
            comm_init_rank: sym(&lib, "ncclCommInitRank")?,
            comm_init_all: sym(&lib, "ncclCommInitAll")?,
            comm_destroy: sym(&lib, "ncclCommDestroy")?,
            send: sym(&lib, "ncclSend")?,
            recv: sym(&lib, "ncclRecv")?,
            group_start: sym(&lib, "ncclGroupStart")?,
            group_end: sym(&lib, "ncclGroupEnd")?,
            get_error_string: sym(&lib, "ncclGetErrorString")?,
            get_version: sym(&lib, "ncclGetVersion")?,
        };
        Ok(Self { api, path, _lib: lib })
    }

    /// Where NCCL was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// NCCL's version code (e.g. 22805 for 2.28.5).
    pub fn version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check(unsafe { (self.api.get_version)(&mut v) }, "ncclGetVersion")?;
        Ok(v)
    }

    fn check(&self, code: c_int, what: &str) -> Result<()> {
        if code == NCCL_SUCCESS || code == NCCL_IN_PROGRESS {
            return Ok(());
        }
        // SAFETY: NCCL returns a static C string for any code.
        let msg = unsafe {
            let p = (self.api.get_error_string)(code);
            if p.is_null() { "unknown".into() } else { std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned() }
        };
        Err(HaloError::InvalidInput(format!("{what} failed: NCCL error {code} ({msg})")))
    }

    /// A new unique id (rank 0 makes it, the others receive it).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId([0; 128]);
        // SAFETY: writes 128 bytes.
        self.check(unsafe { (self.api.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// Joins a communicator of `nranks` as `rank` (collective across processes). The calling
    /// thread must have this rank's CUDA context current.
    pub fn comm_init_rank(self: &Arc<Self>, nranks: usize, id: UniqueId, rank: usize) -> Result<NcclComm> {
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the handle; the id is passed by value as nccl.h declares.
        self.check(unsafe { (self.api.comm_init_rank)(&mut comm, nranks as c_int, id, rank as c_int) }, "ncclCommInitRank")?;
        Ok(NcclComm { nccl: self.clone(), comm })
    }

    /// One communicator per GPU of `ordinals` in this process, rank `i` on `ordinals[i]` (which
    /// must be distinct: NCCL allows one rank per GPU).
    pub fn comm_init_all(self: &Arc<Self>, ordinals: &[usize]) -> Result<Vec<NcclComm>> {
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); ordinals.len()];
        let devs: Vec<c_int> = ordinals.iter().map(|&o| o as c_int).collect();
        // SAFETY: `comms` and `devs` both hold `len` entries.
        self.check(unsafe { (self.api.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) }, "ncclCommInitAll")?;
        Ok(comms.into_iter().map(|comm| NcclComm { nccl: self.clone(), comm }).collect())
    }

    /// `ncclGroupStart`.
    pub fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.check(unsafe { (self.api.group_start)() }, "ncclGroupStart")
    }

    /// `ncclGroupEnd`.
    pub fn group_end(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.check(unsafe { (self.api.group_end)() }, "ncclGroupEnd")
    }
}

/// One rank's communicator; destroyed on drop.
pub struct NcclComm {
    nccl: Arc<Nccl>,
    comm: Comm,
}

// SAFETY: an NCCL communicator may be used from any one thread at a time; halo uses it from the
// thread that owns this value.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Enqueues sending `atoms` float3 at device address `buf` to `peer` on `stream`.
    ///
    /// # Safety
    /// `buf` must hold `atoms` float3 of live device memory on this communicator's GPU, unchanged
    /// until the send completes in stream order.
    pub unsafe fn send(&self, buf: u64, atoms: usize, peer: usize, stream: &CudaStream) -> Result<()> {
        // SAFETY: the caller's contract; count is in floats.
        let code = unsafe {
            (self.nccl.api.send)(buf as *const c_void, 3 * atoms, NCCL_FLOAT32, peer as c_int, self.comm, stream.cu_stream() as *mut c_void)
        };
        self.nccl.check(code, "ncclSend")
    }

    /// Enqueues receiving `atoms` float3 into device address `buf` from `peer` on `stream`.
    ///
    /// # Safety
    /// `buf` must hold `atoms` float3 of live device memory on this communicator's GPU, not used
    /// by anything else until the receive completes in stream order.
    pub unsafe fn recv(&self, buf: u64, atoms: usize, peer: usize, stream: &CudaStream) -> Result<()> {
        // SAFETY: the caller's contract.
        let code =
            unsafe { (self.nccl.api.recv)(buf as *mut c_void, 3 * atoms, NCCL_FLOAT32, peer as c_int, self.comm, stream.cu_stream() as *mut c_void) };
        self.nccl.check(code, "ncclRecv")
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: created once by NCCL, destroyed once; its streams were synchronised by the owner.
        let code = unsafe { (self.nccl.api.comm_destroy)(self.comm) };
        if code != NCCL_SUCCESS {
            tracing::warn!("ncclCommDestroy returned {code}");
        }
    }
}

/// One rank's part of one pulse, resolved from its exchange: who and where.
struct PulseIo {
    send_to: usize,
    recv_from: usize,
    send_atoms: usize,
    recv_atoms: usize,
}

fn pulse_io(rank: &RankExchange, p: usize) -> PulseIo {
    let spec = &rank.halo().pulses[p];
    PulseIo { send_to: spec.send_rank, recv_from: spec.recv_rank, send_atoms: spec.index_map.len(), recv_atoms: spec.recv_size }
}

/// The NCCL coordinate halo of one step for the ranks this process drives (all of them in one
/// process, or its own under a launcher): per pulse, pack on every rank, then one NCCL group
/// with every rank's send (its send slot) and receive (straight into its coordinate array).
pub fn coordinates(nccl: &Nccl, ranks: &[(&RankExchange, &NcclComm, &Arc<CudaStream>)]) -> Result<()> {
    let pulses = ranks.first().map_or(0, |r| r.0.halo().pulses.len());
    for p in 0..pulses {
        for (rank, _, stream) in ranks {
            // NCCL switches the thread's current device (runtime API); launches need the rank's.
            rank.context().bind_to_thread().during("binding a rank's context")?;
            rank.stage_pack(p, stream)?;
        }
        nccl.group_start()?;
        let queued = ranks.iter().try_for_each(|(rank, comm, stream)| {
            let io = pulse_io(rank, p);
            let at = rank.halo().pulses[p].atom_offset;
            // SAFETY: the send slot holds the packed pulse (stage_pack above, same stream); the
            // receive range x[atom_offset..+recv] lies inside x by the validated plan.
            unsafe {
                comm.send(rank.send_slot(p), io.send_atoms, io.send_to, stream)?;
                comm.recv(rank.x.device_ptr_at(at), io.recv_atoms, io.recv_from, stream)
            }
        });
        // The group must be closed even when queueing failed, or NCCL stays in group mode.
        let ended = nccl.group_end();
        queued?;
        ended?;
    }
    Ok(())
}

/// The NCCL force halo of one step, last pulse first: one group sending every rank's halo
/// forces back to their owner's receive slot, then unpack-accumulate on every rank.
pub fn forces(nccl: &Nccl, ranks: &[(&RankExchange, &NcclComm, &Arc<CudaStream>)]) -> Result<()> {
    let pulses = ranks.first().map_or(0, |r| r.0.halo().pulses.len());
    for p in (0..pulses).rev() {
        nccl.group_start()?;
        let queued = ranks.iter().try_for_each(|(rank, comm, stream)| {
            let io = pulse_io(rank, p);
            let at = rank.halo().pulses[p].atom_offset;
            // SAFETY: f[atom_offset..+recv] lies inside f (validated plan); the receive slot holds
            // the pulse's slot_atoms >= send_atoms float3.
            unsafe {
                comm.send(rank.f.device_ptr_at(at), io.recv_atoms, io.recv_from, stream)?;
                comm.recv(rank.recv_slot(p), io.send_atoms, io.send_to, stream)
            }
        });
        let ended = nccl.group_end();
        queued?;
        ended?;
        for (rank, _, stream) in ranks {
            rank.context().bind_to_thread().during("binding a rank's context")?;
            rank.stage_unpack_forces(p, stream)?;
        }
    }
    Ok(())
}

/// NCCL, set up: its API and one communicator per rank this process drives.
pub type NcclComms = (Arc<Nccl>, Rc<Vec<NcclComm>>);

/// NCCL communicators for the ranks of one process (one GPU per rank).
pub fn setup_local(modules: &[Arc<KernelModule>], nranks: usize) -> Result<NcclComms> {
    if modules.len() < nranks {
        return Err(HaloError::InvalidInput(format!("NCCL needs one GPU per rank ({nranks} ranks, {} GPUs in use)", modules.len())));
    }
    let nccl = Nccl::load()?;
    let ordinals: Vec<usize> = (0..nranks).map(|r| modules[r].context().ordinal()).collect();
    let comms = Rc::new(nccl.comm_init_all(&ordinals)?);
    Ok((nccl, comms))
}

/// Every PE joins one NCCL communicator (rank = PE), the unique id travelling over the
/// symmetric heap. Collective: every PE gets the same outcome.
pub fn setup_pe(session: &PeSession, comm: &PeComm) -> Result<NcclComms> {
    let nv = &session.nvshmem;
    let loaded = Nccl::load();
    if !comm.all(loaded.is_ok())? {
        return Err(loaded.err().unwrap_or_else(|| HaloError::InvalidInput("NCCL is missing on another rank".into())));
    }
    let nccl = loaded?;
    let id = if nv.my_pe() == 0 { nccl.unique_id() } else { Ok(UniqueId([0; 128])) };
    if !comm.all(id.is_ok())? {
        return Err(id.err().unwrap_or_else(|| HaloError::InvalidInput("rank 0 could not create an NCCL id".into())));
    }
    let id = UniqueId(comm.broadcast_bytes(&id?.0)?);
    session.ctx.bind_to_thread().during("binding the context")?;
    let c = nccl.comm_init_rank(nv.n_pes(), id, nv.my_pe());
    if !comm.all(c.is_ok())? {
        return Err(c.err().unwrap_or_else(|| HaloError::InvalidInput("NCCL init failed on another rank".into())));
    }
    Ok((nccl, Rc::new(vec![c?])))
}

/// Enqueues `steps` steps of `phase` of the NCCL exchange for the ranks of this process.
pub fn enqueue(nccl: &Nccl, ranks: &[(&RankExchange, &NcclComm, &Arc<CudaStream>)], phase: Phase, steps: usize) -> Result<()> {
    phase.repeat(steps, |forces| if forces { self::forces(nccl, ranks) } else { coordinates(nccl, ranks) })
}

/// One step of `phase` of every local rank captured as a CUDA graph (one per rank, on its
/// stream): NCCL's calls are stream-ordered and capturable, and every local stream is captured
/// at once because one NCCL group spans them. Replays need every rank to replay its graph, as it
/// would enqueue the step.
pub fn capture(nccl: &Nccl, ranks: &[(&RankExchange, &NcclComm, &Arc<CudaStream>)], phase: Phase) -> Result<Vec<CudaGraph>> {
    let mut capturing = Vec::new();
    let mut begun = Ok(());
    for (_, _, stream) in ranks {
        begun = stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).during("starting a graph capture");
        if begun.is_err() {
            break;
        }
        capturing.push(*stream);
    }
    let queued = begun.and_then(|()| enqueue(nccl, ranks, phase, 1));
    // Always end every capture that began, or the streams stay in capture mode.
    let ended: Vec<_> = capturing.iter().map(|s| s.end_capture(CUgraphInstantiate_flags(0)).during("ending a graph capture")).collect();
    queued?;
    ended
        .into_iter()
        .map(|g| {
            let g = g?.ok_or_else(|| HaloError::InvalidInput("the captured NCCL step is empty".into()))?;
            g.upload().during("uploading a graph")?;
            Ok(g)
        })
        .collect()
}
