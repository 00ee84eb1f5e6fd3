//! Using an NVSHMEM the application already started ([`Nvshmem::attach`]).
//!
//! A simulation code that initialised NVSHMEM itself (and allocates its own symmetric memory)
//! hands halo the same runtime: halo opens the host library instance that is already loaded in
//! the process (never a second copy, whose state would be uninitialised), checks that it is
//! initialised and that the kernels' NVSHMEM device library may run with it, reads this PE and
//! the PE count, and never initialises or finalises it: the application owns its lifetime
//! ([`Lifetime::Application`]).

use super::{Collectives, Nvshmem, check_nvshmem_versions};
use crate::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use crate::error::{CudaContextExt, HaloError, Result};
use crate::gpu::CudaContext;
use nvshmem_sys::{self as sys, NvshmemLib, discover::LIBRARY_NAME};
use std::ffi::{CStr, CString};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Who starts and ends an [`Nvshmem`]'s runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// halo initialised it ([`Nvshmem::init`]) and finalises it when the last handle goes.
    Halo,
    /// The application initialised it and finalises it ([`Nvshmem::attach`]); dropping halo's
    /// handle leaves it running.
    Application,
}

impl Nvshmem {
    /// A handle on the NVSHMEM the application already initialised in this process, on `ctx`'s
    /// GPU (the device NVSHMEM was initialised on: the CUDA runtime's current device is its
    /// primary context, which is what [`crate::gpu::open_device`] opens).
    ///
    /// `library` names the host library the application loaded; `None` means NVSHMEM's soname
    /// (`libnvshmem_host.so.3`), which matches the library however the application found it.
    /// The library is only looked up among those already loaded (`RTLD_NOLOAD`), so halo uses the
    /// very instance the application initialised. Refused with a clear error when it is not
    /// loaded, when it is not initialised (`nvshmemx_init_status`), or when halo's kernels were
    /// built against an NVSHMEM this host library cannot run ([`check_nvshmem_versions`]).
    ///
    /// The handle never initialises or finalises NVSHMEM ([`Lifetime::Application`]): the
    /// application finalises it after dropping every halo object that uses it. Module
    /// registration ([`Nvshmem::register_module`]), symmetric allocations and barriers work as
    /// with [`Nvshmem::init`]. halo's collective calls run on the calling thread, as the
    /// application's own NVSHMEM calls do (its bootstrap may be MPI, which wants them there); one
    /// that overruns `timeout` is reported by the watchdog, not interrupted.
    pub fn attach(library: Option<&Path>, ctx: &Arc<CudaContext>, timeout: Duration) -> Result<Arc<Self>> {
        let lib = attachable_library(library)?;
        let kernels = KernelArtifacts::locate(DEFAULT_ARCH)?;
        let device = parse_version(&kernels.manifest.nvshmem_version).ok_or_else(|| {
            HaloError::Nvshmem(format!("the kernels' manifest names NVSHMEM `{}`, not a version major.minor.patch", kernels.manifest.nvshmem_version))
        })?;
        check_nvshmem_versions(device, lib.version(), lib.path())?;
        ctx.bind_to_thread().during("binding the context for NVSHMEM")?;
        // SAFETY: initialised (checked above).
        let (my_pe, n_pes) = unsafe { ((lib.api.nvshmem_my_pe)(), (lib.api.nvshmem_n_pes)()) };
        if my_pe < 0 || n_pes <= 0 || my_pe >= n_pes {
            return Err(HaloError::Nvshmem(format!("the attached NVSHMEM says PE {my_pe} of {n_pes}")));
        }
        Ok(Arc::new(Self {
            lib: ManuallyDrop::new(lib),
            ctx: ctx.clone(),
            my_pe: my_pe as usize,
            n_pes: n_pes as usize,
            timeout,
            // On the calling thread, as the application's own NVSHMEM calls: its bootstrap may be
            // MPI, whose calls must come from the thread that initialised it (overruns are
            // reported by the watchdog, not interrupted).
            collectives: Collectives { timeout, ctx: Some(ctx.clone()), on_calling_thread: true, unusable: OnceLock::new() },
            _id: Box::default(),
            lifetime: Lifetime::Application,
        }))
    }

    /// Who owns this runtime's lifetime: [`Lifetime::Halo`] after [`Nvshmem::init`] (finalised
    /// when the last handle goes), [`Lifetime::Application`] after [`Nvshmem::attach`] (never
    /// finalised by halo).
    pub fn lifetime(&self) -> Lifetime {
        self.lifetime
    }
}

/// The application's NVSHMEM host library ([`resident_library`]), if it is initialised: the
/// checks [`Nvshmem::attach`] makes before it touches the GPU.
pub fn attachable_library(library: Option<&Path>) -> Result<NvshmemLib> {
    let lib = resident_library(library)?;
    // SAFETY: a plain query, valid once the library is loaded.
    let status = unsafe { (lib.api.nvshmemx_init_status)() };
    match not_initialised(status, lib.path()) {
        Some(why) => Err(HaloError::Nvshmem(why)),
        None => Ok(lib),
    }
}

/// Why NVSHMEM with init status `status` cannot be attached to, if it cannot (pure, for tests).
pub fn not_initialised(status: i32, library: &Path) -> Option<String> {
    (status < sys::NVSHMEM_STATUS_IS_INITIALIZED).then(|| {
        let state = if status == sys::NVSHMEM_STATUS_IS_BOOTSTRAPPED { "bootstrapped but not initialised" } else { "not initialised" };
        format!(
            "NVSHMEM ({}) is loaded in this process but {state} (nvshmemx_init_status() = {status}): \
             initialise it (nvshmem_init or nvshmemx_init_attr) before attaching halo to it, \
             or let halo start it with Nvshmem::init",
            library.display()
        )
    })
}

/// `"3.4.5"` as `(3, 4, 5)`.
fn parse_version(v: &str) -> Option<(i32, i32, i32)> {
    let mut parts = v.trim().split('.').map(|p| p.parse::<i32>().ok());
    let version = (parts.next()??, parts.next()??, parts.next().unwrap_or(Some(0))?);
    parts.next().is_none().then_some(version)
}

/// The NVSHMEM host library already loaded in this process under `library` (a path, or by
/// default the soname), opened again so that halo's function pointers are the same instance's.
pub fn resident_library(library: Option<&Path>) -> Result<NvshmemLib> {
    let wanted = library.map_or_else(|| PathBuf::from(LIBRARY_NAME), Path::to_path_buf);
    let name = CString::new(wanted.as_os_str().as_encoded_bytes())
        .map_err(|_| HaloError::InvalidInput(format!("the NVSHMEM library path {} holds a NUL byte", wanted.display())))?;
    // SAFETY: RTLD_NOLOAD never loads anything: it returns a new reference to an object that is
    // already loaded, or null.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return Err(HaloError::Nvshmem(format!(
            "NVSHMEM's host library {} is not loaded in this process, so there is no NVSHMEM to attach to: \
             load and initialise NVSHMEM before Nvshmem::attach (or name the library the application loaded), \
             or let halo start NVSHMEM with Nvshmem::init",
            wanted.display()
        )));
    }
    // Where the loaded object lives: opening that exact name (the loader's own) again yields the
    // same object, whichever name matched above.
    let loaded = loaded_path(handle).unwrap_or(wanted);
    let opened = NvshmemLib::load(&loaded).map_err(HaloError::Nvshmem);
    // SAFETY: drops the NOLOAD reference taken above; `opened` holds its own.
    unsafe { libc::dlclose(handle) };
    opened
}

/// The file the loader mapped for `handle` (its link map's name).
fn loaded_path(handle: *mut libc::c_void) -> Option<PathBuf> {
    let symbol = c"nvshmemx_init_status";
    // SAFETY: a lookup in a loaded object.
    let addr = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    if addr.is_null() {
        return None;
    }
    // SAFETY: Dl_info is plain pointers, for which all-zero is a valid (null) value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` lies in a loaded object; `info` is written on success.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr's file name is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    use std::os::unix::ffi::OsStrExt;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("3.4.5"), Some((3, 4, 5)));
        assert_eq!(parse_version("3.8"), Some((3, 8, 0)));
        assert_eq!(parse_version("3.x.1"), None);
        assert_eq!(parse_version("3.4.5.6"), None);
    }

    #[test]
    fn only_an_initialised_nvshmem_is_attached_to() {
        let lib = Path::new("/opt/nvshmem/lib/libnvshmem_host.so.3");
        for status in [sys::NVSHMEM_STATUS_NOT_INITIALIZED, sys::NVSHMEM_STATUS_IS_BOOTSTRAPPED] {
            let why = not_initialised(status, lib).expect("refused");
            assert!(why.contains("/opt/nvshmem/lib/libnvshmem_host.so.3") && why.contains(&format!("= {status}")), "{why}");
            assert!(why.contains("before attaching") && why.contains("Nvshmem::init"), "{why}");
        }
        for status in [sys::NVSHMEM_STATUS_IS_INITIALIZED, sys::NVSHMEM_STATUS_LIMITED_MPG, sys::NVSHMEM_STATUS_FULL_MPG] {
            assert_eq!(not_initialised(status, lib), None, "status {status}");
        }
    }
}
