//! `halo_pe_attach` on a GPU, called as a C program calls it: this process starts NVSHMEM itself
//! (one PE), as GROMACS does, then attaches halo to it through the C API, uses the PE (its info,
//! a symmetric allocation written and read back) and destroys it; NVSHMEM must still be
//! initialised and usable afterwards, and memory allocated before the attach must keep its data.
//! A PE that finalised NVSHMEM on destroy would fail every one of those. Before the application
//! starts NVSHMEM, the attach must be refused, saying so. Without a GPU the test says it skipped
//! (and fails instead when `HALO_REQUIRE_GPUS` promised one). Its own binary: NVSHMEM starts once
//! per process.

use halo::gpu::{self, DeviceMemory};
use halo::nvshmem::{self, Bootstrap, Nvshmem};
use halo_capi::exchange::{halo_pe, halo_pe_alloc, halo_pe_attach, halo_pe_destroy, halo_pe_free, halo_pe_info};
use halo_capi::status::halo_status;
use std::ffi::CString;
use std::ptr::null_mut;
use std::time::Duration;

mod common;
use common::{last_error, ok};

#[test]
fn a_pe_attached_through_the_c_api_leaves_the_applications_nvshmem_running() {
    let test = "a_pe_attached_through_the_c_api_leaves_the_applications_nvshmem_running";
    if halo::testing::gpus_or_skip(test, 1).is_none() {
        return;
    }
    // One PE on one node, NVLink multicast off (as on every shared machine); set, not read: this
    // crate's sources read no environment variable.
    for (key, value) in [("NVSHMEM_DISABLE_NVLS", "1"), ("NVSHMEM_REMOTE_TRANSPORT", "none")] {
        // SAFETY: the only test of this binary, before NVSHMEM (the only reader) starts.
        unsafe { std::env::set_var(key, value) };
    }
    let ctx = gpu::open_device(0).expect("GPU 0");
    let lib = nvshmem::load_library(None).expect("NVSHMEM's host library");

    // Before the application starts NVSHMEM: refused, and the message says what to do.
    let path = CString::new(lib.path().as_os_str().as_encoded_bytes()).expect("a path without NUL");
    let mut pe: *mut halo_pe = null_mut();
    // SAFETY: a NUL-terminated path and a writable `pe`.
    let early = unsafe { halo_pe_attach(0, path.as_ptr(), &mut pe) };
    assert_ne!(early, halo_status::HALO_OK, "{test}: attached to an NVSHMEM nobody initialised");
    let why = last_error();
    assert!(why.contains("not initialised") && why.contains("nvshmem_init"), "{test}: the refusal says what to do: {why}");
    assert!(pe.is_null(), "{test}: a refused attach stored a PE");

    // The application: its own NVSHMEM, one PE, and memory of its own on the symmetric heap.
    let id = nvshmem::unique_id(&lib).expect("unique id");
    let owner = Nvshmem::init(lib, &ctx, &Bootstrap::UniqueId { rank: 0, nranks: 1, id }, Duration::from_secs(60)).expect("NVSHMEM init");
    let data: Vec<u64> = (0..4096u64).map(|i| i * 0x9E37_79B9 + 7).collect();
    let kept = owner.alloc::<u64>(data.len()).expect("symmetric alloc");
    kept.copy_from_host(&data).expect("upload");

    // halo through the C API: attached, used, destroyed.
    let path = CString::new(owner.library_path().as_os_str().as_encoded_bytes()).expect("a path without NUL");
    // SAFETY: as above.
    ok(unsafe { halo_pe_attach(0, path.as_ptr(), &mut pe) }, "halo_pe_attach");
    assert!(!pe.is_null());
    let (mut rank, mut nranks, mut device) = (-1, -1, -1);
    // SAFETY: a live PE and writable outputs.
    ok(unsafe { halo_pe_info(pe, &mut rank, &mut nranks, &mut device) }, "halo_pe_info");
    assert_eq!((rank, nranks, device), (0, 1, 0), "{test}: the PE is the application's NVSHMEM PE on GPU 0");
    let mut x: *mut f32 = null_mut();
    // SAFETY: a live PE and a writable `x`.
    ok(unsafe { halo_pe_alloc(pe, 1000, &mut x) }, "halo_pe_alloc");
    assert!(!x.is_null());
    let mut kept_by_halo: *mut f32 = null_mut();
    // SAFETY: as above; freed with the PE.
    ok(unsafe { halo_pe_alloc(pe, 10, &mut kept_by_halo) }, "halo_pe_alloc");
    // SAFETY: an allocation of this PE, used by no exchange.
    ok(unsafe { halo_pe_free(pe, x) }, "halo_pe_free");
    // SAFETY: a PE of halo_pe_attach with no exchange; not used after.
    ok(unsafe { halo_pe_destroy(pe) }, "halo_pe_destroy");

    // The application's NVSHMEM is untouched and still works.
    let status = owner.init_status();
    assert!(status >= 2, "{test}: NVSHMEM's init status is {status} after halo_pe_destroy: it was finalised");
    assert_eq!(kept.to_host().expect("download"), data, "{test}: memory allocated before the attach");
    let after = owner.alloc::<u64>(data.len()).expect("symmetric alloc after halo_pe_destroy");
    after.copy_from_host(&data).expect("upload");
    assert_eq!(after.to_host().expect("download"), data);
    owner.barrier_all().expect("barrier after halo_pe_destroy");
    drop((after, kept));
    drop(owner); // the application finalises its NVSHMEM
    eprintln!("{test}: attached, used and destroyed through the C API; the application's NVSHMEM stayed initialised (status {status})");
}
