//! halo: GPU-initiated halo exchange for domain-decomposed simulations, all in Rust.
//!
//! The device kernels live in the `kernels-gpu` crate and are compiled to PTX by
//! `cargo xtask build-ptx`; this crate loads them and drives them:
//!
//! | module | what it does |
//! |---|---|
//! | [`artifacts`] | finds the PTX/cubin and checks it matches this build (ABI, architecture) |
//! | [`gpu`] | cudarc-based plumbing: contexts, device memory, the kernel module, launches |
//! | [`kernels`] | typed launchers for every kernel entry |
//! | [`mod@reference`] | CPU references of every kernel's effect, for the tests |
//!
//! Nothing here needs a GPU or NVSHMEM to build: the CUDA driver and NVSHMEM are loaded at run time.
#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

pub mod artifacts;
pub mod error;
pub mod gpu;
pub mod kernels;
pub mod reference;

pub use error::{HaloError, Result};
pub use kernels_gpu::abi;
pub mod testing;
pub mod exchange;
pub mod launch;
pub mod nvshmem;
pub mod session;
pub mod route;
pub mod system;
pub mod decomp;
pub mod md_reference;
pub mod integrity;
pub mod md;
pub mod bench;
