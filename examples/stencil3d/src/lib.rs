//! `stencil3d`: halo's second application. A 3-D Jacobi heat-diffusion step (7-point stencil) on a
//! periodic grid decomposed over ranks in 1-D to 3-D, with the face halos exchanged every
//! iteration through halo's public exchange API, verified against the same iterations on the
//! undecomposed grid on the CPU.
//!
//! - [`mod@decomp`]: the block decomposition written as halo pulses ([`halo::exchange::RankHalo`]) and
//!   every rank's neighbour table;
//! - [`mod@reference`]: the CPU reference, a CPU simulation of the exchange, the decomposed CPU run;
//! - [`mod@gpu`]: the run on GPUs (ranks in one process, or one rank per process over NVSHMEM), with
//!   per-iteration timing.
//!
//! ```
//! use stencil3d::{decomp::Decomposition, reference};
//! let d = Decomposition::new([6, 5, 4], [2, 2, 1]).unwrap();
//! let u0 = reference::InitialField::Random(1).values(d.grid);
//! let want = reference::run_global(d.grid, &u0, 0.1, 3);
//! let got = d.gather(&reference::run_decomposed(&d, &u0, 0.1, 3));
//! assert_eq!(got, want); // bit for bit
//! ```
#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

pub mod decomp;
pub mod gpu;
pub mod reference;
