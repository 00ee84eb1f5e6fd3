//! The exchange on the caller's buffers and streams: every rank in this process
//! (`halo_local_create`) or this process one NVSHMEM PE (`halo_pe_start`, `halo_pe_create`);
//! then per step `halo_exchange_coordinates` and `halo_exchange_forces` on the caller's streams
//! (enqueued, no host wait), `halo_exchange_finish` where the host needs the results.

use crate::error::{Failure, guard};
use crate::plan::{collect_plans, halo_plan};
use crate::status::halo_status;
use halo::exchange::{CallerBuffers, CallerSlice, Exchange, LocalRanks, PathPolicy, PeExchange, RankHalo, Transport, spec};
use halo::gpu::{self, CudaContext, KernelModule};
use halo::nvshmem::SymmetricBuffer;
use halo::session::PeSession;
use kernels_gpu::abi::Float3;
use std::ffi::{CStr, OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

/// A CUDA stream (`CUstream` of the driver API, the same type as the runtime's `cudaStream_t`).
/// The header declares it as `struct CUstream_st*`, so it needs no CUDA header.
pub type CUstream = cudarc::driver::sys::CUstream;

/// An exchange between ranks: made by `halo_local_create` or `halo_pe_create`, freed by
/// `halo_exchange_destroy`. It reads and writes the caller's `x` and `f` and never frees them.
#[allow(non_camel_case_types)]
pub struct halo_exchange {
    inner: Box<dyn Exchange<Float3>>,
    /// How halos move (`fused` unless `halo_exchange_set_transport` chose another).
    transport: Transport,
    /// The caller's streams in use (one per local rank), or empty while the exchange's own run.
    streams: Vec<CUstream>,
}

/// This process as one NVSHMEM PE (one rank of a multi-process run): its GPU, NVSHMEM and the
/// kernels. Made by `halo_pe_start` (halo starts NVSHMEM) or `halo_pe_attach` (the application
/// did), freed by `halo_pe_destroy` after every exchange and allocation of it.
#[allow(non_camel_case_types)]
pub struct halo_pe {
    /// Symmetric allocations made by `halo_pe_alloc`, freed by `halo_pe_free` or with the PE
    /// (before the session: fields drop in order).
    allocations: Vec<SymmetricBuffer<Float3>>,
    session: PeSession,
}

/// The exchange behind a handle, or why there is none.
///
/// # Safety
/// `ex` must be null or a live exchange used by this thread only.
unsafe fn exchange_mut<'a>(ex: *mut halo_exchange) -> Result<&'a mut halo_exchange, Failure> {
    // SAFETY: the caller's contract.
    unsafe { ex.as_mut() }.ok_or_else(|| Failure::invalid("`ex` is null: create the exchange with halo_local_create or halo_pe_create"))
}

/// The kernels loaded on `ctx`'s GPU.
fn load_module(ctx: &Arc<CudaContext>) -> Result<KernelModule, Failure> {
    let artifacts = halo::artifacts::KernelArtifacts::locate(halo::artifacts::DEFAULT_ARCH)?;
    Ok(KernelModule::load(ctx, &artifacts)?)
}

/// The GPU ordinal of a C `int`, or why it is not one.
fn ordinal(device: i32) -> Result<usize, Failure> {
    usize::try_from(device).map_err(|_| Failure::invalid(format!("device is {device}: pass a GPU ordinal (0 or more)")))
}

/// One rank's `x`/`f` as the exchange's caller-owned buffers (their lengths, GPU and overlap are
/// checked by the exchange).
///
/// # Safety
/// `x` and `f` must be device pointers of `ctx`'s GPU to `len` atoms (3 floats each) that stay
/// allocated while the exchange lives.
unsafe fn caller_buffers(
    ctx: &Arc<CudaContext>,
    halo: &RankHalo,
    who: &str,
    x: *mut f32,
    f: *mut f32,
    len: usize,
) -> Result<CallerBuffers<Float3>, Failure> {
    if x.is_null() || f.is_null() {
        let which = if x.is_null() { "x" } else { "f" };
        return Err(Failure::invalid(format!("{who}: {which} is null: pass the device pointer of its {} atoms (3 floats each)", halo.total_atoms)));
    }
    let slice = |name: &str, ptr: *mut f32| {
        // SAFETY: a device pointer of `ctx`'s GPU to `len` atoms, kept alive by the caller (the caller's contract).
        unsafe { CallerSlice::from_raw(ctx, ptr as u64, len) }.map_err(|e| {
            let failure = Failure::from(e);
            Failure { message: format!("{who}'s {name}: {}", failure.message), ..failure }
        })
    };
    Ok(CallerBuffers { x: slice("x", x)?, f: slice("f", f)? })
}

/// Checks that GPU `device` can run halo: a CUDA driver, the GPU itself, and halo's kernels for
/// its architecture. Call it before allocating anything to learn early (`HALO_NO_GPU`,
/// `HALO_KERNELS`, `HALO_INVALID_ARGUMENT` for a GPU that does not exist). halo runs on the GPU's
/// primary context, the one the CUDA runtime uses.
#[unsafe(no_mangle)]
pub extern "C" fn halo_check_device(device: i32) -> halo_status {
    guard("halo_check_device", || {
        let ctx = gpu::open_device(ordinal(device)?)?;
        load_module(&ctx).map(drop)
    })
}

/// Creates the exchange of `nranks` ranks that all run in this process on GPU `device`:
/// `plans[r]` is rank r's plan, `x[r]` and `f[r]` its coordinates and forces (device pointers
/// from `cudaMalloc`, 3 floats per atom, home atoms first, then each pulse's received atoms where
/// its plan says), `lens[r]` how many atoms `x[r]` and `f[r]` each hold (at least the plan's
/// `total_atoms`). halo never frees `x`/`f`; they must outlive the exchange. The plans are checked
/// to fit together (as `halo_plan_validate`) before the GPU is touched. The transport is `fused`.
///
/// # Safety
/// `plans`, `x`, `f`, `lens` must be null or point to `nranks` elements; the plans live; the
/// buffers device memory of GPU `device` of the given lengths; `out` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_local_create(
    device: i32,
    plans: *const *const halo_plan,
    nranks: i32,
    x: *const *mut f32,
    f: *const *mut f32,
    lens: *const usize,
    out: *mut *mut halo_exchange,
) -> halo_status {
    guard("halo_local_create", || {
        if out.is_null() {
            return Err(Failure::invalid("`out` is null: pass the address of a `halo_exchange*`"));
        }
        // SAFETY: the caller's contract.
        let halos = unsafe { collect_plans(plans, nranks) }?;
        let n = halos.len();
        for (name, null) in [("x", x.is_null()), ("f", f.is_null()), ("lens", lens.is_null())] {
            if null {
                return Err(Failure::invalid(format!("`{name}` is null: pass an array of {n} (one per rank)")));
            }
        }
        spec::validate(&halos)?;
        let device = ordinal(device)?;
        let ctx = gpu::open_device(device)?;
        let module = Arc::new(load_module(&ctx)?);
        // SAFETY: `n` readable elements each (the caller's contract).
        let (xs, fs, lens) = unsafe { (std::slice::from_raw_parts(x, n), std::slice::from_raw_parts(f, n), std::slice::from_raw_parts(lens, n)) };
        let buffers = (0..n)
            // SAFETY: device pointers of this GPU with these lengths (the caller's contract).
            .map(|r| unsafe { caller_buffers(&ctx, &halos[r], &format!("rank {r}"), xs[r], fs[r], lens[r]) })
            .collect::<Result<Vec<_>, _>>()?;
        let inner = LocalRanks::<Float3>::with_buffers(halos, &[module], buffers)?;
        let ex = Box::new(halo_exchange { inner: Box::new(inner), transport: Transport::Fused, streams: Vec::new() });
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { *out = Box::into_raw(ex) };
        Ok(())
    })
}

/// Starts this process as one NVSHMEM PE of a multi-process run started by `halo launch -n N --exe PROGRAM`
/// (or mpirun/srun, whose environment says the rank): opens its GPU, initialises NVSHMEM and
/// loads the kernels. Collective: every PE calls it. Stores the PE in `*out`.
///
/// # Safety
/// `out` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_pe_start(out: *mut *mut halo_pe) -> halo_status {
    guard("halo_pe_start", || {
        if out.is_null() {
            return Err(Failure::invalid("`out` is null: pass the address of a `halo_pe*`"));
        }
        let env = halo::launch::RankEnv::from_env().ok_or_else(|| {
            Failure::invalid("this process was not started as one of several PEs: run it under `halo launch -n N --exe PROGRAM` (or mpirun/srun)")
        })?;
        let session = PeSession::start(env, None)?;
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { *out = Box::into_raw(Box::new(halo_pe { allocations: Vec::new(), session })) };
        Ok(())
    })
}

/// Attaches to the NVSHMEM that this process started itself (as GROMACS and other codes do) on
/// GPU `device`, the GPU that NVSHMEM runs on here: loads halo's kernels and registers them with
/// that NVSHMEM, without a second init. The PE's rank and the number of PEs are NVSHMEM's
/// (`halo_pe_info`). `halo_pe_destroy` then frees halo's allocations but never finalises NVSHMEM:
/// the application does, after destroying every halo object. `nvshmem_lib` names the NVSHMEM host
/// library the application loaded (a path), or null for NVSHMEM's soname. `HALO_INVALID_ARGUMENT`
/// when NVSHMEM is not initialised in this process. Stores the PE in `*out`.
///
/// # Safety
/// `nvshmem_lib` null or a NUL-terminated string; `out` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_pe_attach(device: i32, nvshmem_lib: *const c_char, out: *mut *mut halo_pe) -> halo_status {
    guard("halo_pe_attach", || {
        if out.is_null() {
            return Err(Failure::invalid("`out` is null: pass the address of a `halo_pe*`"));
        }
        let device = ordinal(device)?;
        // SAFETY: null or NUL-terminated (the caller's contract).
        let lib = (!nvshmem_lib.is_null()).then(|| unsafe { CStr::from_ptr(nvshmem_lib) });
        let session = PeSession::attach(device, lib.map(|name| Path::new(OsStr::from_bytes(name.to_bytes()))))?;
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { *out = Box::into_raw(Box::new(halo_pe { allocations: Vec::new(), session })) };
        Ok(())
    })
}

/// This PE's rank, the number of PEs, and its GPU ordinal (each output may be null).
///
/// # Safety
/// `pe` null or live; the outputs null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_pe_info(pe: *const halo_pe, rank: *mut i32, nranks: *mut i32, device: *mut i32) -> halo_status {
    guard("halo_pe_info", || {
        // SAFETY: the caller's contract.
        let pe = unsafe { pe.as_ref() }.ok_or_else(|| Failure::invalid("`pe` is null: start it with halo_pe_start"))?;
        let env = &pe.session.env;
        for (out, v) in [(rank, env.rank), (nranks, env.nranks), (device, env.device)] {
            if !out.is_null() {
                // SAFETY: non-null and writable (the caller's contract).
                unsafe { *out = v as i32 };
            }
        }
        Ok(())
    })
}

/// Allocates `atoms` atoms (3 floats each) on NVSHMEM's symmetric heap and stores the device
/// pointer in `*out`: what `halo_pe_create` needs for `x` and `f`. Collective: every PE makes the
/// same allocations in the same order (a null `out` is `HALO_INVALID_ARGUMENT` after the
/// allocation, which stays with the PE, so that the other PEs are not left waiting). Freed by
/// `halo_pe_free` or with the PE.
///
/// # Safety
/// `pe` null or live; `out` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_pe_alloc(pe: *mut halo_pe, atoms: usize, out: *mut *mut f32) -> halo_status {
    guard("halo_pe_alloc", || {
        // SAFETY: the caller's contract.
        let pe = unsafe { pe.as_mut() }.ok_or_else(|| Failure::invalid("`pe` is null: start it with halo_pe_start"))?;
        // The allocation is collective: made even when `out` is null, so that the other PEs are
        // not left waiting in it (it is freed with the PE).
        let buffer = pe.session.nvshmem.alloc::<Float3>(atoms)?;
        let ptr = gpu::DeviceMemory::device_ptr(&buffer) as *mut f32;
        pe.allocations.push(buffer);
        if out.is_null() {
            return Err(Failure::invalid(
                "`out` is null: pass the address of a `float*` (the allocation was made, as on the other PEs, and is freed with the PE)",
            ));
        }
        // SAFETY: non-null and writable (the caller's contract).
        unsafe { *out = ptr };
        Ok(())
    })
}

/// Frees an allocation of `halo_pe_alloc` (collective, in the same order on every PE). Null is allowed.
///
/// # Safety
/// `pe` null or live; no exchange may still use `ptr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_pe_free(pe: *mut halo_pe, ptr: *mut f32) -> halo_status {
    guard("halo_pe_free", || {
        // SAFETY: the caller's contract.
        let pe = unsafe { pe.as_mut() }.ok_or_else(|| Failure::invalid("`pe` is null: start it with halo_pe_start"))?;
        if ptr.is_null() {
            return Ok(());
        }
        let i = pe.allocations.iter().position(|b| gpu::DeviceMemory::device_ptr(b) == ptr as u64);
        let i = i.ok_or_else(|| Failure::invalid(format!("{ptr:p} is not an allocation of halo_pe_alloc on this PE (or was freed)")))?;
        drop(pe.allocations.remove(i));
        Ok(())
    })
}

/// Creates this PE's exchange: `plan` is this PE's own plan (every PE's plans are gathered over
/// NVSHMEM and checked to fit together), `x` and `f` its coordinates and forces on the symmetric
/// heap (`halo_pe_alloc`, same order on every PE), `len` atoms each. Collective: every PE calls it,
/// and a refusal on any PE (buffers that do not qualify, a null `plan` or `out`) is returned by
/// every PE, naming the PE.
///
/// # Safety
/// `pe` and `plan` null or live; `x`/`f` symmetric device memory of `len` atoms; `out` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_pe_create(
    pe: *const halo_pe,
    plan: *const halo_plan,
    x: *mut f32,
    f: *mut f32,
    len: usize,
    out: *mut *mut halo_exchange,
) -> halo_status {
    guard("halo_pe_create", || {
        // SAFETY: the caller's contract.
        let pe = unsafe { pe.as_ref() }.ok_or_else(|| Failure::invalid("`pe` is null: start it with halo_pe_start"))?;
        // SAFETY: the caller's contract.
        let plan = unsafe { plan.as_ref() };
        let s = &pe.session;
        let who = format!("PE {}", s.env.rank);
        // Every refusal (a null `plan` or `out` too) goes through the exchange's first all-gather,
        // so that every PE returns it (returning here would leave the others waiting in that
        // gather). Without a plan this PE's halo there is an empty one.
        let buffers = match (plan, out.is_null()) {
            (None, _) => Err(halo::HaloError::InvalidInput("`plan` is null: pass this PE's plan".into())),
            (Some(_), true) => Err(halo::HaloError::InvalidInput("`out` is null: pass the address of a `halo_exchange*`".into())),
            // SAFETY: symmetric device memory of this GPU of `len` atoms (the caller's contract).
            (Some(plan), false) => {
                unsafe { caller_buffers(&s.ctx, &plan.halo, &who, x, f, len) }.map_err(|e| halo::HaloError::InvalidInput(e.message))
            }
        };
        let halo = plan.map_or_else(|| RankHalo { home_atoms: 0, total_atoms: 0, pulses: Vec::new() }, |p| p.halo.clone());
        let inner = PeExchange::<Float3>::with_buffers_or_refusal(s.nvshmem.clone(), s.module.clone(), halo, PathPolicy::Routed, buffers)?;
        let ex = Box::new(halo_exchange { inner: Box::new(inner), transport: Transport::Fused, streams: Vec::new() });
        // SAFETY: `out` is non-null and writable (the caller's contract).
        unsafe { *out = Box::into_raw(ex) };
        Ok(())
    })
}

/// Ends this PE: frees its remaining allocations and, for a PE of `halo_pe_start`, finalises
/// NVSHMEM (a PE of `halo_pe_attach` leaves the application's NVSHMEM running). Destroy its
/// exchanges first. Collective. Null is allowed.
///
/// # Safety
/// `pe` null or a PE of `halo_pe_start` or `halo_pe_attach` not destroyed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_pe_destroy(pe: *mut halo_pe) -> halo_status {
    // SAFETY: the caller's contract (made by Box::into_raw in its create call, not freed before).
    unsafe { crate::error::destroy("halo_pe_destroy", pe) }
}

/// Chooses how halos move from the next step on, by name: `fused` (the default), `fused-tma`,
/// `per-pulse`, `per-pulse-direct`, `staged`, `direct-copy`. `HALO_INVALID_ARGUMENT` for an
/// unknown name or one these ranks cannot run (the message says why).
///
/// # Safety
/// `ex` null or live; `name` null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_exchange_set_transport(ex: *mut halo_exchange, name: *const c_char) -> halo_status {
    guard("halo_exchange_set_transport", || {
        // SAFETY: the caller's contract.
        let ex = unsafe { exchange_mut(ex) }?;
        if name.is_null() {
            return Err(Failure::invalid("`name` is null: pass a transport name such as \"fused\""));
        }
        // SAFETY: a NUL-terminated string (the caller's contract).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let transport: Transport = name.parse().map_err(|e: halo::exchange::UnknownTransport| Failure::invalid(e.to_string()))?;
        ex.inner.check_transport(transport)?;
        ex.transport = transport;
        Ok(())
    })
}

impl halo_exchange {
    /// Runs the local ranks on `streams` (one per local rank) from now on; null keeps the streams
    /// in use. A changed stream is ordered after the work already enqueued on the old one.
    ///
    /// # Safety
    /// `streams` null or `n` live CUDA streams of the exchange's GPU(s).
    unsafe fn select_streams(&mut self, streams: *const CUstream, n: i32) -> Result<(), Failure> {
        if streams.is_null() {
            return if n == 0 {
                Ok(())
            } else {
                Err(Failure::invalid(format!("`streams` is null but n is {n}: pass n streams, or null and 0 to keep the streams in use")))
            };
        }
        let ranks = self.inner.local_ranks().len();
        if usize::try_from(n).ok() != Some(ranks) {
            return Err(Failure::invalid(format!("n is {n}, but this exchange drives {ranks} rank(s) in this process: pass one stream per rank")));
        }
        // SAFETY: `n` readable handles (the caller's contract).
        let raw = unsafe { std::slice::from_raw_parts(streams, ranks) };
        if let Some(i) = raw.iter().position(|s| s.is_null()) {
            return Err(Failure::invalid(format!(
                "streams[{i}] is null (the legacy default stream, which waits for every other stream and would stall the exchange's waits): pass a stream from cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)"
            )));
        }
        if raw == self.streams.as_slice() {
            return Ok(());
        }
        let borrowed: Vec<_> = self
            .inner
            .local_ranks()
            .iter()
            .zip(raw)
            // SAFETY: live streams of the rank's GPU, owned and kept alive by the caller (the caller's contract).
            .map(|(rank, &s)| unsafe { gpu::borrow_stream(rank.context(), s) })
            .collect::<halo::Result<_>>()?;
        self.inner.use_streams(&borrowed)?;
        self.streams = raw.to_vec();
        Ok(())
    }
}

/// Enqueues one step's coordinate halo on `streams` (`streams[i]` for local rank i: every rank
/// for `halo_local_create`, the one PE for `halo_pe_create`; n = that count): each rank's sent
/// atoms are packed (shifted where the pulse says) into its peers' received ranges. Returns once
/// enqueued: work after it on the same stream sees the halo; the host does not wait (see
/// `halo_exchange_finish`). Null `streams` with n = 0 keeps the streams in use (first the
/// exchange's own). The caller orders its own writes of `x` before this on the same stream.
///
/// The streams must belong to the exchange's GPU (its primary context, the CUDA runtime's) and
/// should be non-blocking (`cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)`): work on the
/// legacy default stream, from any thread, waits for a blocking stream's halo kernels, which wait
/// for their peers. halo keeps using the streams after this call returns: `halo_exchange_finish`
/// and `halo_exchange_destroy` wait on them, so they must stay valid until the exchange is
/// destroyed or a later call passes others. `halo_exchange_finish` waits for everything on them,
/// the caller's own work after the halo included.
///
/// # Safety
/// `ex` null or live; `streams` null or `n` streams of the exchange's GPU that stay valid until
/// `halo_exchange_destroy(ex)` or until a later call passes others.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_exchange_coordinates(ex: *mut halo_exchange, streams: *const CUstream, n: i32) -> halo_status {
    guard("halo_exchange_coordinates", || {
        // SAFETY: the caller's contract.
        let ex = unsafe { exchange_mut(ex) }?;
        // SAFETY: the caller's contract.
        unsafe { ex.select_streams(streams, n) }?;
        Ok(ex.inner.exchange_forward(ex.transport)?)
    })
}

/// Enqueues one step's force halo on `streams` (as `halo_exchange_coordinates`): the forces on
/// each rank's received atoms are added into their owners' atoms, last pulse first. The received
/// atoms' forces stay as they were; zero them before the next step's force computation.
///
/// # Safety
/// As `halo_exchange_coordinates`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_exchange_forces(ex: *mut halo_exchange, streams: *const CUstream, n: i32) -> halo_status {
    guard("halo_exchange_forces", || {
        // SAFETY: the caller's contract.
        let ex = unsafe { exchange_mut(ex) }?;
        // SAFETY: the caller's contract.
        unsafe { ex.select_streams(streams, n) }?;
        Ok(ex.inner.exchange_reverse_accumulate(ex.transport)?)
    })
}

/// Waits (bounded) until the enqueued halo work of every local rank has finished and reports how
/// it ended: `HALO_TIMEOUT` when a peer never signalled (the message names the rank, pulse and
/// step), `HALO_STUCK` when a stream made no progress, `HALO_CUDA` for a failed launch. Call it
/// where the host reads the results; a step needs no host wait otherwise.
///
/// # Safety
/// `ex` null or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_exchange_finish(ex: *mut halo_exchange) -> halo_status {
    guard("halo_exchange_finish", || {
        // SAFETY: the caller's contract.
        let ex = unsafe { exchange_mut(ex) }?;
        Ok(ex.inner.finish()?)
    })
}

/// Frees an exchange (its own protocol memory; never the caller's `x`/`f` or streams). Call it
/// after `halo_exchange_finish`. Null is allowed.
///
/// # Safety
/// `ex` null or an exchange not destroyed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn halo_exchange_destroy(ex: *mut halo_exchange) -> halo_status {
    // SAFETY: the caller's contract (made by Box::into_raw in its create call, not freed before).
    unsafe { crate::error::destroy("halo_exchange_destroy", ex) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::last_error;
    use crate::plan::{halo_plan_add_pulse, halo_plan_create, halo_plan_destroy};
    use std::ptr::{null, null_mut};

    fn ring_plan(peer: i32, map: &[i32]) -> *mut halo_plan {
        let mut p = null_mut();
        let d = crate::plan::tests::desc(peer, map, false);
        // SAFETY: `p` writable, `d` over `map`.
        unsafe {
            assert_eq!(halo_plan_create(4, 6, &mut p), halo_status::HALO_OK);
            assert_eq!(halo_plan_add_pulse(p, &d), halo_status::HALO_OK);
        }
        p
    }

    #[test]
    fn exchange_calls_refuse_a_null_handle() {
        // SAFETY: null handles are checked first.
        unsafe {
            for status in [
                halo_exchange_coordinates(null_mut(), null(), 0),
                halo_exchange_forces(null_mut(), null(), 0),
                halo_exchange_finish(null_mut()),
                halo_exchange_set_transport(null_mut(), c"fused".as_ptr()),
            ] {
                assert_eq!(status, halo_status::HALO_INVALID_ARGUMENT);
                assert!(last_error().contains("`ex` is null"), "{}", last_error());
            }
            assert_eq!(halo_exchange_destroy(null_mut()), halo_status::HALO_OK);
            assert_eq!(halo_pe_destroy(null_mut()), halo_status::HALO_OK);
            assert_eq!(halo_pe_info(null(), null_mut(), null_mut(), null_mut()), halo_status::HALO_INVALID_ARGUMENT);
            assert_eq!(halo_pe_create(null(), null(), null_mut(), null_mut(), 0, null_mut()), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("`pe` is null"));
            assert_eq!(halo_pe_start(null_mut()), halo_status::HALO_INVALID_ARGUMENT);
        }
    }

    #[test]
    fn a_pe_outside_a_multi_process_launch_is_refused_with_the_launcher_to_use() {
        if halo::launch::RankEnv::from_env().is_some() {
            return; // started by a launcher: halo_pe_start would start NVSHMEM (a GPU test's case)
        }
        let mut pe = null_mut();
        // SAFETY: `pe` is writable.
        assert_eq!(unsafe { halo_pe_start(&mut pe) }, halo_status::HALO_INVALID_ARGUMENT);
        assert!(pe.is_null());
        assert!(last_error().contains("run it under `halo launch -n N --exe PROGRAM`"), "{}", last_error());
    }

    #[test]
    fn local_create_checks_its_arguments_and_the_plans_before_the_gpu() {
        let map = [0, 3];
        let (a, b) = (ring_plan(1, &map), ring_plan(0, &map));
        let plans = [a as *const halo_plan, b];
        let bufs = [0x1000 as *mut f32, 0x2000 as *mut f32];
        let lens = [6usize, 6];
        let mut ex = null_mut();
        // SAFETY: every array has two elements; nothing reaches a GPU (the checks come first).
        unsafe {
            assert_eq!(
                halo_local_create(0, plans.as_ptr(), 2, bufs.as_ptr(), bufs.as_ptr(), lens.as_ptr(), null_mut()),
                halo_status::HALO_INVALID_ARGUMENT
            );
            assert!(last_error().contains("`out` is null"));
            assert_eq!(halo_local_create(0, plans.as_ptr(), 2, null(), bufs.as_ptr(), lens.as_ptr(), &mut ex), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("`x` is null: pass an array of 2"), "{}", last_error());
            assert_eq!(halo_local_create(0, plans.as_ptr(), 2, bufs.as_ptr(), bufs.as_ptr(), null(), &mut ex), halo_status::HALO_INVALID_ARGUMENT);
            assert!(last_error().contains("`lens` is null"));
            assert_eq!(halo_local_create(0, null(), 2, bufs.as_ptr(), bufs.as_ptr(), lens.as_ptr(), &mut ex), halo_status::HALO_INVALID_ARGUMENT);
            assert_eq!(
                halo_local_create(0, plans.as_ptr(), -1, bufs.as_ptr(), bufs.as_ptr(), lens.as_ptr(), &mut ex),
                halo_status::HALO_INVALID_ARGUMENT
            );
            assert!(last_error().contains("nranks is -1"));
            // One plan names a rank that is not there.
            assert_eq!(
                halo_local_create(0, plans.as_ptr(), 1, bufs.as_ptr(), bufs.as_ptr(), lens.as_ptr(), &mut ex),
                halo_status::HALO_INVALID_ARGUMENT
            );
            assert!(
                last_error().starts_with("halo_local_create: invalid input: inconsistent halo plan: rank 0 pulse 0 names rank 1 of 1"),
                "{}",
                last_error()
            );
            assert_eq!(
                halo_local_create(-3, plans.as_ptr(), 2, bufs.as_ptr(), bufs.as_ptr(), lens.as_ptr(), &mut ex),
                halo_status::HALO_INVALID_ARGUMENT
            );
            assert!(last_error().contains("device is -3"));
            assert!(ex.is_null(), "no exchange on failure");
            halo_plan_destroy(a);
            halo_plan_destroy(b);
        }
    }

    /// Without a GPU (CI) creating an exchange or checking the device fails with `HALO_NO_GPU` and
    /// the library's reason; with one, `halo_check_device` passes (the GPU tests run the exchange).
    #[test]
    fn without_a_gpu_the_device_calls_say_so() {
        let map = [0, 3];
        let (a, b) = (ring_plan(1, &map), ring_plan(0, &map));
        let plans = [a as *const halo_plan, b];
        let bufs = [0x1000 as *mut f32, 0x2000 as *mut f32];
        let lens = [6usize, 6];
        let mut ex = null_mut();
        let present = gpu::gpu_unavailable_reason().is_none();
        let check = halo_check_device(0);
        // SAFETY: two-element arrays; without a GPU the device is never touched.
        let create = if present {
            None
        } else {
            Some(unsafe { halo_local_create(0, plans.as_ptr(), 2, bufs.as_ptr(), bufs.as_ptr(), lens.as_ptr(), &mut ex) })
        };
        if present {
            assert_eq!(check, halo_status::HALO_OK, "{}", last_error());
        } else {
            assert_eq!(check, halo_status::HALO_NO_GPU);
            assert_eq!(create, Some(halo_status::HALO_NO_GPU));
            assert!(last_error().starts_with("halo_local_create: no GPU available: "), "{}", last_error());
        }
        // SAFETY: live plans.
        unsafe {
            halo_plan_destroy(a);
            halo_plan_destroy(b);
        }
    }
}
