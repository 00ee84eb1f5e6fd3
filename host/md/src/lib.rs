//! A mini molecular-dynamics step around the halo exchange: Lennard-Jones forces on a decomposed
//! synthetic liquid, integrated with leapfrog, re-decomposed every `nstlist` steps. Its purpose is
//! to give the exchange a real step to overlap with, and the strongest correctness test there is:
//! the decomposed forces must equal the forces of the undecomposed system computed on the CPU.
//!
//! Per step and rank (see docs/architecture.md):
//! local stream: zero home forces → home–home pair forces ─────────────────────────┐
//! halo stream:  coordinate halo → zero halo forces → non-local pair forces → force halo → integrate (local stream)

// The modules here moved from the `halo` crate and name its items `crate::…`.
use halo::*;

pub mod domain;
pub mod md_reference;
pub mod nbnxm;
pub mod rank;
pub mod run;

pub use domain::{Csr, Domain, RankDomain};
pub use rank::{MdRank, Physics};
pub use run::{MdConfig, MdOutcome, StepCheck, run, run_local, run_pe};
