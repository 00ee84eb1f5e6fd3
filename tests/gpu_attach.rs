//! `Nvshmem::attach` on a GPU: this process starts NVSHMEM itself (`Nvshmem::init`, one PE), as an
//! application would, then attaches halo to it twice (`PeSession::attach`, which also loads and
//! registers the kernels, and a plain `Nvshmem::attach`), uses and drops the attached handles, and
//! then still uses the first: NVSHMEM is still initialised, symmetric memory allocated before the
//! attach still holds its data, and allocation, barrier and module registration still work. A
//! handle that finalised NVSHMEM on drop would fail every one of those. Skips without a GPU (fails
//! instead when `HALO_REQUIRE_GPUS` promised one).

use halo::artifacts::{DEFAULT_ARCH, KernelArtifacts};
use halo::gpu::{self, DeviceMemory, KernelModule};
use halo::nvshmem::{self, Bootstrap, Lifetime, Nvshmem};
use halo::session::{ATTACHED, PeSession};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn an_attached_handle_never_finalises_the_nvshmem_the_application_started() {
    let name = "an_attached_handle_never_finalises_the_nvshmem_the_application_started";
    if halo::testing::gpus_or_skip(name, 1).is_none() {
        return;
    }
    for (key, value) in [("NVSHMEM_DISABLE_NVLS", "1"), ("NVSHMEM_REMOTE_TRANSPORT", "none")] {
        if std::env::var_os(key).is_none() {
            // SAFETY: the only test of this binary, before NVSHMEM (the only reader) starts.
            unsafe { std::env::set_var(key, value) };
        }
    }
    // The application: its GPU and its own NVSHMEM, one PE.
    let ctx = gpu::open_device(0).expect("GPU 0");
    let lib = nvshmem::load_library(None).expect("NVSHMEM's host library");
    let id = nvshmem::unique_id(&lib).expect("unique id");
    let owner = Nvshmem::init(lib, &ctx, &Bootstrap::UniqueId { rank: 0, nranks: 1, id }, TIMEOUT).expect("NVSHMEM init");
    assert_eq!(owner.lifetime(), Lifetime::Halo);
    let data: Vec<u64> = (0..4096u64).map(|i| i * 0x9E37_79B9 + 7).collect();
    let kept = owner.alloc::<u64>(data.len()).expect("symmetric alloc");
    kept.copy_from_host(&data).expect("upload");

    // halo attached to it: a session (GPU, kernels registered) and a bare handle; both used, both dropped.
    {
        let session = PeSession::attach(0, Some(owner.library_path())).expect("PeSession::attach");
        assert_eq!((session.env.rank, session.env.nranks, session.env.source), (0, 1, ATTACHED));
        assert_eq!(session.nvshmem.lifetime(), Lifetime::Application);
        assert_eq!(session.nvshmem.library_path(), owner.library_path(), "the application's library instance");
        let scratch = session.nvshmem.alloc::<u64>(64).expect("alloc through the attached handle");
        scratch.copy_from_host(&data[..64]).expect("upload");
        assert_eq!(scratch.to_host().expect("download"), data[..64]);
        session.nvshmem.barrier_all().expect("barrier through the attached handle");
        drop(scratch);
        drop(session);
        let bare = Nvshmem::attach(None, &ctx, TIMEOUT).expect("Nvshmem::attach by soname");
        assert_eq!((bare.my_pe(), bare.n_pes(), bare.lifetime()), (0, 1, Lifetime::Application));
        drop(bare);
    }

    // The application's NVSHMEM is untouched.
    let status = owner.init_status();
    assert!(status >= 2, "NVSHMEM's init status is {status} after the attached handles were dropped: it was finalised");
    assert_eq!(kept.to_host().expect("download"), data, "memory allocated before the attach");
    let after = owner.alloc::<u64>(data.len()).expect("symmetric alloc after the attached handles were dropped");
    after.copy_from_host(&data).expect("upload");
    assert_eq!(after.to_host().expect("download"), data);
    owner.barrier_all().expect("barrier");
    let mut module = KernelModule::load(&ctx, &KernelArtifacts::locate(DEFAULT_ARCH).expect("kernels")).expect("module");
    owner.register_module(&mut module).expect("module registration after the attached handles were dropped");
    println!(
        "gpu_attach: NVSHMEM {:?} still initialised (status {status}) after PeSession::attach and Nvshmem::attach were dropped: \
         old data intact, alloc, barrier and module registration work",
        owner.version()
    );
}
