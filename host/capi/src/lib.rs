//! halo's C API: `libhalo.so` / `libhalo.a` and `include/halo.h` (generated from this crate by
//! `cargo xtask capi-header`), for C and C++ codes that own their device buffers and CUDA streams,
//! such as GROMACS.
//!
//! - [`status`]: `halo_status`, the code every call returns;
//! - [`error`]: the last error of the calling thread (`halo_last_error`), and the boundary that
//!   turns errors and panics into codes (no panic crosses into C);
//! - [`plan`]: a rank's halo plan, pulse by pulse, as GROMACS's `GpuHaloExchange` holds it;
//! - [`exchange`]: the exchange on the caller's `x`/`f` and streams, every rank in one process
//!   or one rank per NVSHMEM PE.
//!
//! Handles are opaque and used by one thread at a time; every pointer argument is checked for
//! null, and sizes against the plan, before anything else happens.
#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

pub mod error;
pub mod exchange;
pub mod plan;
pub mod status;
