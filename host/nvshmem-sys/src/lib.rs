//! Raw C ABI of NVSHMEM's host library (`libnvshmem_host.so.3`), for the functions halo uses.
//!
//! Nothing links against NVSHMEM at build time: [`NvshmemLib::load`] opens the library at run time
//! with global symbol visibility (NVSHMEM's transport plugins resolve symbols from it), so the
//! workspace builds and unit-tests on machines without NVSHMEM. [`discover`] finds the library.
//!
//! The init entry points are `nvshmemx_hostlib_init_attr` / `nvshmemx_hostlib_finalize`:
//! `nvshmem_init` and `nvshmemx_init_attr` are header inlines that need NVSHMEM's static device
//! library, which a PTX-based program does not link.
#![allow(non_camel_case_types)]
#![warn(missing_docs)]

pub mod discover;

use std::ffi::{c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

/// `NVSHMEM_SIGNAL_SET`: the signal operation that stores the value. (0 compiles and hangs.)
pub const NVSHMEM_SIGNAL_SET: c_int = 9;
/// `NVSHMEM_SIGNAL_ADD`.
pub const NVSHMEM_SIGNAL_ADD: c_int = 10;
/// `NVSHMEM_CMP_EQ` and friends, for `signal_wait_until`.
pub const NVSHMEM_CMP_EQ: c_int = 0;
/// `NVSHMEM_CMP_NE`.
pub const NVSHMEM_CMP_NE: c_int = 1;
/// `NVSHMEM_CMP_GT`.
pub const NVSHMEM_CMP_GT: c_int = 2;
/// `NVSHMEM_CMP_LE`.
pub const NVSHMEM_CMP_LE: c_int = 3;
/// `NVSHMEM_CMP_LT`.
pub const NVSHMEM_CMP_LT: c_int = 4;
/// `NVSHMEM_CMP_GE`.
pub const NVSHMEM_CMP_GE: c_int = 5;

/// `NVSHMEMX_INIT_THREAD_PES`.
pub const NVSHMEMX_INIT_THREAD_PES: c_uint = 1;
/// `NVSHMEMX_INIT_WITH_MPI_COMM`.
pub const NVSHMEMX_INIT_WITH_MPI_COMM: c_uint = 2;
/// `NVSHMEMX_INIT_WITH_SHMEM`.
pub const NVSHMEMX_INIT_WITH_SHMEM: c_uint = 4;
/// `NVSHMEMX_INIT_WITH_UNIQUEID`.
pub const NVSHMEMX_INIT_WITH_UNIQUEID: c_uint = 8;

/// `nvshmemx_init_status()` values.
pub const NVSHMEM_STATUS_NOT_INITIALIZED: c_int = 0;
/// Bootstrapped, not yet fully initialised.
pub const NVSHMEM_STATUS_IS_BOOTSTRAPPED: c_int = 1;
/// Initialised.
pub const NVSHMEM_STATUS_IS_INITIALIZED: c_int = 2;
/// Several PEs per GPU without MPS.
pub const NVSHMEM_STATUS_LIMITED_MPG: c_int = 3;
/// Several PEs per GPU with MPS.
pub const NVSHMEM_STATUS_FULL_MPG: c_int = 4;

/// `nvshmemx_uniqueid_t`: 128 opaque bytes made by PE 0 and handed to every PE.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct nvshmemx_uniqueid_t {
    /// `(1 << 16) + 128`.
    pub version: c_int,
    /// Opaque.
    pub internal: [u8; 124],
}

/// Version value of [`nvshmemx_uniqueid_t`].
pub const NVSHMEMX_UNIQUEID_VERSION: c_int = (1 << 16) + 128;

impl Default for nvshmemx_uniqueid_t {
    fn default() -> Self {
        Self { version: NVSHMEMX_UNIQUEID_VERSION, internal: [0; 124] }
    }
}

/// `nvshmemx_uniqueid_args_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvshmemx_uniqueid_args_t {
    /// `(1 << 16) + 24`.
    pub version: c_int,
    /// The unique id (NVSHMEM keeps the pointer: it must outlive init).
    pub id: *mut nvshmemx_uniqueid_t,
    /// This PE.
    pub myrank: c_int,
    /// Number of PEs.
    pub nranks: c_int,
}

/// `nvshmemx_init_args_t`, versions 1 (NVSHMEM 3.4) and 2 (3.8: adds `cuda_device_id`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvshmemx_init_args_t {
    /// `(1 << 16) + 128` or `(2 << 16) + 128`.
    pub version: c_int,
    /// Unique-id bootstrap arguments.
    pub uid_args: nvshmemx_uniqueid_args_t,
    /// Version 2 only: the CUDA device NVSHMEM binds to (-1: the current context's).
    pub cuda_device_id: c_int,
    /// Reserved.
    pub content: [u8; 92],
}

/// `nvshmemx_init_attr_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvshmemx_init_attr_t {
    /// `(1 << 16) + 144` or `(2 << 16) + 144`.
    pub version: c_int,
    /// `MPI_Comm*` for the MPI-communicator bootstrap.
    pub mpi_comm: *mut c_void,
    /// Init arguments.
    pub args: nvshmemx_init_args_t,
}

impl nvshmemx_init_attr_t {
    /// NVSHMEM's `NVSHMEMX_INIT_ATTR_INITIALIZER` for struct version `v` (1 or 2).
    pub fn initializer(v: c_int) -> Self {
        Self {
            version: (v << 16) + size_of::<Self>() as c_int,
            mpi_comm: std::ptr::null_mut(),
            args: nvshmemx_init_args_t {
                version: (v << 16) + size_of::<nvshmemx_init_args_t>() as c_int,
                uid_args: nvshmemx_uniqueid_args_t {
                    version: (1 << 16) + size_of::<nvshmemx_uniqueid_args_t>() as c_int,
                    id: std::ptr::null_mut(),
                    myrank: -1,
                    nranks: -1,
                },
                cuda_device_id: -1,
                content: [0; 92],
            },
        }
    }
}

// NVSHMEM asserts these sizes in its headers (identical in 3.4.5 and 3.8.0).
const _: () = {
    assert!(size_of::<nvshmemx_uniqueid_t>() == 128);
    assert!(size_of::<nvshmemx_uniqueid_args_t>() == 24);
    assert!(size_of::<nvshmemx_init_args_t>() == 128);
    assert!(size_of::<nvshmemx_init_attr_t>() == 144);
    assert!(std::mem::offset_of!(nvshmemx_init_attr_t, args) == 16);
};

/// `nvshmem_team_t`.
pub type nvshmem_team_t = i32;
/// `NVSHMEM_TEAM_WORLD`: every PE.
pub const NVSHMEM_TEAM_WORLD: nvshmem_team_t = 0;

/// `CUmodule` / `CUstream`, as opaque pointers (the driver's handles).
pub type CUmodule = *mut c_void;
/// See [`CUmodule`].
pub type CUstream = *mut c_void;

macro_rules! nvshmem_api {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*) => {
        /// Function pointers into a loaded `libnvshmem_host.so`. Calling them is `unsafe`: each
        /// follows NVSHMEM's own contract (most need an initialised NVSHMEM and a current CUDA
        /// context on the calling thread).
        #[allow(missing_docs)]
        pub struct NvshmemApi {
            $(pub $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        impl NvshmemApi {
            /// Resolves every symbol or names the first missing one.
            ///
            /// # Safety
            /// `lib` must be NVSHMEM's host library, whose symbols have these C signatures.
            unsafe fn resolve(lib: &libloading::Library) -> Result<Self, String> {
                Ok(Self {
                    // SAFETY: the caller guarantees the signatures.
                    $($name: unsafe {
                        *lib.get::<unsafe extern "C" fn($($ty),*) $(-> $ret)?>(concat!(stringify!($name), "\0").as_bytes())
                            .map_err(|e| format!("{}: {e}", stringify!($name)))?
                    },)*
                })
            }
        }
    };
}

nvshmem_api! {
    fn nvshmemx_hostlib_init_attr(flags: c_uint, attr: *mut nvshmemx_init_attr_t) -> c_int;
    fn nvshmemx_hostlib_finalize();
    fn nvshmemx_get_uniqueid(id: *mut nvshmemx_uniqueid_t) -> c_int;
    fn nvshmemx_set_attr_uniqueid_args(myrank: c_int, nranks: c_int, id: *const nvshmemx_uniqueid_t, attr: *mut nvshmemx_init_attr_t) -> c_int;
    fn nvshmemx_set_attr_mpi_comm_args(mpi_comm: *mut c_void, attr: *mut nvshmemx_init_attr_t) -> c_int;
    fn nvshmemx_init_status() -> c_int;
    fn nvshmem_malloc(size: usize) -> *mut c_void;
    fn nvshmem_calloc(count: usize, size: usize) -> *mut c_void;
    fn nvshmem_align(alignment: usize, size: usize) -> *mut c_void;
    fn nvshmem_free(ptr: *mut c_void);
    fn nvshmem_ptr(ptr: *const c_void, pe: c_int) -> *mut c_void;
    fn nvshmem_my_pe() -> c_int;
    fn nvshmem_n_pes() -> c_int;
    fn nvshmem_barrier_all();
    fn nvshmemx_barrier_all_on_stream(stream: CUstream);
    fn nvshmemx_sync_all_on_stream(stream: CUstream);
    fn nvshmemx_quiet_on_stream(stream: CUstream);
    fn nvshmemx_cumodule_init(module: CUmodule) -> c_int;
    fn nvshmemx_cumodule_finalize(module: CUmodule) -> c_int;
    fn nvshmemx_vendor_get_version_info(major: *mut c_int, minor: *mut c_int, patch: *mut c_int);
    fn nvshmem_uint8_fcollect(team: nvshmem_team_t, dest: *mut u8, source: *const u8, nelems: usize) -> c_int;
    fn nvshmem_putmem(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int);
}

/// An opened `libnvshmem_host.so` and its resolved functions.
pub struct NvshmemLib {
    /// The functions.
    pub api: NvshmemApi,
    path: PathBuf,
    // Keeps the library mapped for as long as the function pointers are used.
    _lib: libloading::Library,
}

impl NvshmemLib {
    /// Opens the library at `path` with `RTLD_NOW | RTLD_GLOBAL` and resolves every function.
    pub fn load(path: &Path) -> Result<Self, String> {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: loading runs the library's initialisers; NVSHMEM's are safe to run once.
        let lib: libloading::Library =
            unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| format!("cannot open {}: {e}", path.display()))?.into();
        // SAFETY: this is NVSHMEM's host library; the signatures above follow its headers.
        let api = unsafe { NvshmemApi::resolve(&lib) }.map_err(|e| format!("{} lacks a symbol: {e}", path.display()))?;
        Ok(Self { api, path: path.to_path_buf(), _lib: lib })
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `(major, minor, patch)` of the loaded library (callable before init).
    pub fn version(&self) -> (i32, i32, i32) {
        let (mut a, mut b, mut c) = (0, 0, 0);
        // SAFETY: writes three ints; no init needed.
        unsafe { (self.api.nvshmemx_vendor_get_version_info)(&mut a, &mut b, &mut c) };
        (a, b, c)
    }
}
