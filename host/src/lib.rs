//! halo: GPU-initiated halo exchange for domain-decomposed simulations, all in Rust.
//!
//! The device kernels live in the `kernels-gpu` crate; this library's build script compiles them
//! to PTX and a cubin (with `halo-builder`) and embeds them, so a crate that adds `halo` to its
//! `Cargo.toml` runs them with no setup (`HALO_PTX_DIR` overrides them with a folder). This crate
//! loads them and drives them:
//!
//! | module | what it does |
//! |---|---|
//! | [`artifacts`] | the embedded kernels, or a folder of them; checks they match this build (ABI, architecture) |
//! | [`desc`] | the descriptions every layer shares, below all of them: a rank's halo ([`desc::RankHalo`]), the exchange's [`desc::Transport`], the errors a halo wait raises ([`desc::WaitTimeout`], [`desc::StuckStream`]), the router's vocabulary and errors ([`desc::route`]) |
//! | [`gpu`] | cudarc-based plumbing: contexts, device memory, the kernel module, launches |
//! | [`kernels`] | typed launchers for every kernel entry |
//! | [`exchange`] | the halo exchange: ranks in one process ([`exchange::LocalRanks`]) or one per NVSHMEM PE ([`exchange::PeExchange`]) behind one [`exchange::Exchange`] interface |
//! | [`nvshmem`], [`session`] | NVSHMEM loaded at run time; starting a rank (GPU, NVSHMEM, registered kernels) |
//! | [`watchdog`] | deadlines for the calls halo cannot poll (NVSHMEM init, collectives): a call stuck in one returns an error naming the rank and the step |
//! | [`launch`] | what a rank of a multi-process run needs: its environment and the rendezvous |
//! | [`decomp`], [`system`] | the MD domain decomposition and its halo plan; a synthetic liquid |
//! | [`route`] | topology discovery and the transport router |
//! | [`integrity`] | order-independent checksums for cross-rank checks |
//! | [`mod@reference`] | CPU references of every kernel's effect |
//! | [`env_vars`] | every `HALO_*` environment variable halo reads: who reads it, its default, what it does |
//!
//! The `halo` command, benchmarks and the launcher are in the `halo-cli` crate, the mini-MD
//! application in `halo-md`. Nothing here needs a GPU or NVSHMEM to build: the CUDA driver and
//! NVSHMEM are loaded at run time.
//!
//! Two features, off by default, add APIs that tests and tools need: `test-support` adds `testing`
//! (GPU-or-skip for tests, test doubles and fixtures); `diagnostics` adds `exchange::perturb`
//! (jitter and injected faults around any exchange) and `exchange::rank::timeline` (the timeline
//! probe). Without `diagnostics` the exchanges still honour `HALO_FAULT` and `HALO_JITTER_US`.
//!
//! The layers point one way: the shared descriptions ([`desc`]: halos, transports, the errors of
//! waits and routing) lie below everything; [`gpu`], [`kernels`], [`nvshmem`] and [`error`] never name
//! [`exchange`] or [`route`], and [`route`] never names [`exchange`], which is built on all of
//! them. A unit test in [`desc`] scans the sources to keep it so.
#![warn(missing_docs, unsafe_op_in_unsafe_fn)]

pub mod artifacts;
pub mod desc;
pub mod env_vars;
pub mod error;
pub mod gpu;
pub mod kernels;
pub mod reference;

pub use error::{HaloError, Result};
// The host-device ABI (`Float3`, kernel arguments, protocol words): documented in `kernels-gpu`,
// linked from here rather than copied.
#[doc(no_inline)]
pub use kernels_gpu::abi;
pub mod decomp;
pub mod exchange;
pub mod integrity;
pub mod launch;
pub(crate) mod node;
pub mod nvshmem;
pub mod route;
pub mod session;
pub mod system;
// Test support: GPU-or-skip, test doubles, fixtures (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod watchdog;
pub mod workers;

// The Rust snippets of docs/library.md, compiled by every `cargo test` (the runnable ones run).
#[cfg(doctest)]
#[doc = include_str!("../../docs/library.md")]
mod library_guide {}
