//! Kernel entry points. Each `extern "ptx-kernel"` function is listed in
//! [`crate::abi::KERNEL_ENTRIES`]; the build keeps exactly those (and the NVSHMEM module globals)
//! public and internalizes the rest.

/// Declares a kernel entry point: `#[no_mangle]`, the kernel ABI, `unsafe` (raw device pointers).
/// The ABI string lives only here, so moving to `extern "gpu-kernel"` is a one-line change.
macro_rules! kernel {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) $body
    };
}

mod common;
mod fused_coords;
mod fused_coords_tma;
mod fused_forces;
mod md;
mod pack;
mod probe;
mod pulse;
mod stencil;

/// The ABI version, readable by the host with `cuModuleGetGlobal` (see [`crate::abi::ABI_VERSION`]).
#[unsafe(no_mangle)]
pub static HALO_ABI_VERSION: u32 = crate::abi::ABI_VERSION;
