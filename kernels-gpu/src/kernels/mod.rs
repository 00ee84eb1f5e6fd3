//! Kernel entry points. Each `extern "ptx-kernel"` function is listed in
//! [`crate::abi::KERNEL_ENTRIES`]; the build keeps exactly those (and the NVSHMEM module globals)
//! public and internalizes the rest.
//!
//! The halo kernels are written once, generic over the element type ([`common::DeviceElement`]),
//! and exported once per type by [`instantiate_halo_kernels!`].

/// Declares a kernel entry point: exported unmangled (under its own name, or under `export` when
/// given), with the kernel ABI, `unsafe` (raw device pointers). The ABI string lives only here, so
/// moving to `extern "gpu-kernel"` is a one-line change.
macro_rules! kernel {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) $body
    };
    (export $export:expr; $(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[unsafe(export_name = $export)]
        pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) $body
    };
}

mod common;
mod delay;
mod extent;
mod fused_coords;
mod fused_coords_tma;
mod fused_forces;
mod home_ids;
mod ll;
mod md;
mod migrate;
mod migrate_merge;
mod nbnxm;
mod nbnxm_grid;
mod nbnxm_layout;
mod nbnxm_order;
mod nbnxm_search;
mod pack;
mod probe;
mod pulse;
mod scan;
mod select;
mod stencil;
mod timeline;

/// Exports every generic halo kernel for element type `$t` with entry-name suffix `$sfx`
/// (which must equal `<$t as HaloElement>::SUFFIX`; the host builds names from that constant).
macro_rules! instantiate_halo_kernels {
    ($module:ident, $t:ty, $sfx:literal) => {
        /// The halo kernels for one element type.
        mod $module {
            use crate::abi::{ProtocolState, PulseMeta, WaitStatus};
            type T = $t;
            // The host builds entry names from HaloElement::SUFFIX: they must agree.
            const _: () = {
                let (a, b) = (<T as crate::abi::HaloElement>::SUFFIX.as_bytes(), $sfx.as_bytes());
                assert!(a.len() == b.len(), "entry suffix differs from HaloElement::SUFFIX");
                let mut i = 0;
                while i < a.len() {
                    assert!(a[i] == b[i], "entry suffix differs from HaloElement::SUFFIX");
                    i += 1;
                }
            };

            kernel! { export concat!("pack_coords", $sfx);
                /// See [`super::pack::pack_coords`].
                fn pack_coords(x: *const T, map: *const u32, n: u32, out: *mut T, sx: f32, sy: f32, sz: f32, use_shift: u32) {
                    // SAFETY: forwarded; the host's contract is documented on the generic function.
                    unsafe { super::pack::pack_coords::<T>(x, map, n, out, sx, sy, sz, use_shift) }
                }
            }
            kernel! { export concat!("unpack_store", $sfx);
                /// See [`super::pack::unpack_store`].
                fn unpack_store(buf: *const T, map: *const u32, n: u32, dst: *mut T) {
                    // SAFETY: forwarded.
                    unsafe { super::pack::unpack_store::<T>(buf, map, n, dst) }
                }
            }
            kernel! { export concat!("unpack_accumulate", $sfx);
                /// See [`super::pack::unpack_accumulate`].
                fn unpack_accumulate(buf: *const T, map: *const u32, n: u32, dst: *mut T) {
                    // SAFETY: forwarded.
                    unsafe { super::pack::unpack_accumulate::<T>(buf, map, n, dst) }
                }
            }
            kernel! { export concat!("pulse_pack_store_signal", $sfx);
                /// See [`super::pulse::pulse_exchange`] (direct stores).
                fn pulse_pack_store_signal(pulses: *const PulseMeta, pulse: u32, num_pulses: u32, x: *mut T, signals: *mut u64, state: *mut ProtocolState, counters: *mut u32, timeout_ns: u64, status: *mut WaitStatus) {
                    // SAFETY: forwarded; the host checked the peer is mapped.
                    unsafe { super::pulse::pulse_exchange::<T>(pulses, pulse, num_pulses, x, signals, state, counters, timeout_ns, status, true) }
                }
            }
            kernel! { export concat!("pulse_pack_put_signal", $sfx);
                /// See [`super::pulse::pulse_exchange`] (NVSHMEM put).
                fn pulse_pack_put_signal(pulses: *const PulseMeta, pulse: u32, num_pulses: u32, x: *mut T, signals: *mut u64, state: *mut ProtocolState, counters: *mut u32, timeout_ns: u64, status: *mut WaitStatus) {
                    // SAFETY: forwarded; the host registered the module with NVSHMEM.
                    unsafe { super::pulse::pulse_exchange::<T>(pulses, pulse, num_pulses, x, signals, state, counters, timeout_ns, status, false) }
                }
            }
            kernel! { export concat!("fused_coords", $sfx);
                /// See [`super::fused_coords::fused_coords`].
                fn fused_coords(pulses: *const PulseMeta, num_pulses: u32, x: *mut T, signals: *mut u64, state: *mut ProtocolState, counters: *mut u32, dep_offset: u32, timeout_ns: u64, status: *mut WaitStatus) {
                    // SAFETY: forwarded.
                    unsafe { super::fused_coords::fused_coords::<T, super::timeline::Off>(pulses, num_pulses, x, signals, state, counters, dep_offset, timeout_ns, status, super::timeline::Off) }
                }
            }
            kernel! { export concat!("fused_coords_tma", $sfx);
                /// See [`super::fused_coords_tma::fused_coords_tma`].
                fn fused_coords_tma(pulses: *const PulseMeta, num_pulses: u32, x: *mut T, signals: *mut u64, state: *mut ProtocolState, counters: *mut u32, dep_offset: u32, timeout_ns: u64, status: *mut WaitStatus) {
                    // SAFETY: forwarded.
                    unsafe { super::fused_coords_tma::fused_coords_tma::<T>(pulses, num_pulses, x, signals, state, counters, dep_offset, timeout_ns, status) }
                }
            }
            kernel! { export concat!("fused_forces", $sfx);
                /// See [`super::fused_forces::fused_forces`].
                fn fused_forces(pulses: *const PulseMeta, num_pulses: u32, f: *mut T, signals: *mut u64, state: *mut ProtocolState, counters: *mut u32, timeout_ns: u64, status: *mut WaitStatus) {
                    // SAFETY: forwarded.
                    unsafe { super::fused_forces::fused_forces::<T, super::timeline::Off>(pulses, num_pulses, f, signals, state, counters, timeout_ns, status, super::timeline::Off) }
                }
            }
        }
    };
}

instantiate_halo_kernels!(float3, crate::abi::Float3, "");
instantiate_halo_kernels!(scalar_f32, f32, "_f32");
instantiate_halo_kernels!(scalar_f64, f64, "_f64");
instantiate_halo_kernels!(vector_f32x4, [f32; 4], "_f32x4");

/// The ABI version, readable by the host with `cuModuleGetGlobal` (see [`crate::abi::ABI_VERSION`]).
#[unsafe(no_mangle)]
pub static HALO_ABI_VERSION: u32 = crate::abi::ABI_VERSION;
