//! `Nvshmem::attach`'s checks without a GPU: it refuses, naming the problem and the fix, when
//! NVSHMEM's host library is not loaded in the process, and when it is loaded but not
//! initialised; and it finds the very instance the application loaded (by path or by soname),
//! never a second copy. The loaded-library half uses NVSHMEM's real host library, from the pinned
//! wheel the kernel build fetches into `target/toolchains` (or `HALO_NVSHMEM_LIB`).

use halo::nvshmem::{attachable_library, resident_library};

/// One test, in order: the process starts without NVSHMEM loaded, then loads it.
#[test]
fn attach_refuses_an_nvshmem_that_is_not_loaded_or_not_initialised() {
    // Nothing loaded yet: by soname and by path, a clear refusal and nothing loaded by the check.
    let err = attachable_library(None).err().expect("no NVSHMEM is loaded in this test process").to_string();
    assert!(err.contains("libnvshmem_host.so.3 is not loaded in this process"), "{err}");
    assert!(err.contains("load and initialise NVSHMEM before Nvshmem::attach") && err.contains("Nvshmem::init"), "{err}");
    let Some(path) = halo::testing::nvshmem_host_library() else {
        assert!(
            std::env::var_os("HALO_REQUIRE_NVSHMEM_LIB").is_none(),
            "HALO_REQUIRE_NVSHMEM_LIB is set but no NVSHMEM host library was found (build halo first, or set HALO_NVSHMEM_LIB)"
        );
        eprintln!("SKIPPED the loaded-library half: no NVSHMEM host library here (build halo, or set HALO_NVSHMEM_LIB)");
        return;
    };
    let err = attachable_library(Some(&path)).err().expect("not loaded yet").to_string();
    assert!(err.contains(&format!("{} is not loaded in this process", path.display())), "{err}");
    assert!(resident_library(None).is_err(), "the refusals above must not have loaded the library");

    // The application loads NVSHMEM (without initialising it).
    let app = nvshmem_sys::NvshmemLib::load(&path).expect("loading NVSHMEM's host library");
    for by in [None, Some(path.as_path())] {
        let found = resident_library(by).expect("loaded now");
        assert_eq!(
            found.api.nvshmemx_init_status as usize, app.api.nvshmemx_init_status as usize,
            "attach must use the instance the application loaded ({by:?})"
        );
        assert_eq!(found.version(), app.version());
        let err = attachable_library(by).err().expect("loaded but not initialised").to_string();
        assert!(err.contains("is loaded in this process but not initialised (nvshmemx_init_status() = 0)"), "{err}");
        assert!(err.contains("before attaching halo"), "{err}");
    }
}
