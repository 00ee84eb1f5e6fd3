//! A mini molecular-dynamics step around the halo exchange: Lennard-Jones forces (cutoff,
//! potential shift) from cluster-pair lists ([`nbnxm`]) on a decomposed synthetic liquid,
//! integrated with leapfrog, re-decomposed and searched every `nstlist` steps. Its purpose is to
//! give the exchange a real step to overlap with, and the strongest correctness test there is: the
//! decomposed forces and energy must equal those of the undecomposed system computed on the CPU.
//!
//! Per step and rank (see docs/architecture.md):
//! local stream: (zero home forces) → (prune) → home–home forces ─────────────────────────────┐
//! halo stream:  coordinate halo → (zero halo forces) → (prune) → forces with halo atoms → force halo → integrate (local stream)
//!
//! The integration clears the forces it leaves behind (the halo forces where the transport lets
//! it), so the memsets run only after a search ([`zeroing`]).

// The modules here moved from the `halo` crate and name its items `crate::…`.
use halo::*;

pub mod gather;
mod lookup;
pub mod md_reference;
pub mod nbnxm;
pub mod phases;
pub mod rank;
pub mod run;
pub mod search;
pub mod zeroing;

pub use rank::{EnergyRecord, IntegrationStream, MdRank, StepWork};
pub use run::{Drift, EnergyPoint, GPU_REDECOMPOSE_MIN_HOME, ListSizes, MdConfig, MdOutcome, MdRun, Redecompose, StepCheck, run, run_local, run_pe};
pub use search::SearchTimes;
