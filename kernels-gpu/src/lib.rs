//! halo's GPU kernels, written in Rust and compiled to PTX by `cargo xtask build-ptx`.
//!
//! The crate has two faces:
//! - on `nvptx64-nvidia-cuda` (pinned nightly) it holds the kernel entry points and the
//!   `device` module, the one place where GPU intrinsics and inline PTX live;
//! - on the host (stable Rust) it exports only [`abi`]: the `#[repr(C)]` types and constants that
//!   host and device must agree on, so a layout can never drift between the two.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx, link_llvm_intrinsics, gpu_intrinsics, gpu_launch_sized_workgroup_mem, core_intrinsics),
    allow(internal_features)
)]
#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

pub mod abi;

#[cfg(target_arch = "nvptx64")]
pub mod device;

#[cfg(target_arch = "nvptx64")]
mod kernels;

/// A panic on the GPU cannot unwind or print: trap, which the host sees as a launch failure.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; nothing runs after it.
    unsafe { core::arch::nvptx::trap() }
}
