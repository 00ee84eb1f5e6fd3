//! Which design of the nbnxm kernels runs. All compute the same forces, energy and inner list (each
//! is checked against the `f64` references in `tests/gpu_nbnxm.rs`); they differ in how they load
//! atoms and parameters, which only a GPU timing can rank (`kernel_times` in the same file). Chosen
//! per [`super::NbnxmGpu`] with [`super::NbnxmGpu::set_kernel`], or for a whole run with the
//! environment variable [`NbnxmKernel::ENV`].

use crate::abi;
use crate::error::{HaloError, Result};

/// One design of the nbnxm kernels (see `docs/nbnxm.md`, "Kernel").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NbnxmKernel {
    /// The first version: per j-list word and per pair a global load (word, atoms, LJ entry).
    Baseline,
    /// Tiled: j-list words 32 at a time skipped by a ballot, the LJ table in shared memory,
    /// j-atoms through the slot index.
    Indirect,
    /// [`Self::Indirect`] with the next j-cluster's loads issued before the current one's pairs.
    Prefetch,
    /// Tiled, atoms from a cluster-ordered `[x, y, z, type]` copy gathered before each launch.
    Xq,
}

impl NbnxmKernel {
    /// Every design, in the order the timing table prints them.
    pub const ALL: [Self; 4] = [Self::Baseline, Self::Indirect, Self::Prefetch, Self::Xq];
    /// What a new [`super::NbnxmGpu`] uses when [`Self::ENV`] is not set.
    pub const DEFAULT: Self = Self::Indirect;
    /// Environment variable naming the design for a run (`baseline`, `ind`, `pf`, `xq`).
    pub const ENV: &'static str = "HALO_NBNXM_KERNEL";

    /// Short name, as [`Self::ENV`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Indirect => "ind",
            Self::Prefetch => "pf",
            Self::Xq => "xq",
        }
    }

    /// The design named `name` (see [`Self::name`]).
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name.trim()).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
            HaloError::InvalidInput(format!("{}={name:?} names no nbnxm kernel: use one of {}", Self::ENV, names.join(", ")))
        })
    }

    /// [`Self::ENV`]'s design, `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var(Self::ENV) {
            Ok(v) if !v.trim().is_empty() => Self::parse(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// [`Self::DEFAULT`] where it takes `ntypes` atom types, else [`Self::Baseline`].
    pub fn default_for(ntypes: usize) -> Self {
        if ntypes <= Self::DEFAULT.max_types() { Self::DEFAULT } else { Self::Baseline }
    }

    /// Kernel entries: forces, forces and energy, prune.
    pub(super) fn entries(self) -> [&'static str; 3] {
        match self {
            Self::Baseline => [abi::NBNXM_FORCES, abi::NBNXM_FORCES_ENERGY, abi::NBNXM_PRUNE],
            Self::Indirect => abi::NBNXM_TILED[0],
            Self::Prefetch => abi::NBNXM_TILED[1],
            Self::Xq => abi::NBNXM_TILED[2],
        }
    }

    /// Dynamic shared memory of a force launch for `ntypes` atom types.
    pub(super) fn force_shared_bytes(self, ntypes: u32) -> u32 {
        match self {
            Self::Baseline => abi::NBNXM_SHARED_BYTES,
            _ => abi::nbnxm_tiled_shared_bytes(ntypes),
        }
    }

    /// Whether the launches read the cluster-ordered copy (gathered first).
    pub(super) fn gathers(self) -> bool {
        self == Self::Xq
    }

    /// Most atom types the design takes.
    pub fn max_types(self) -> usize {
        match self {
            Self::Baseline => usize::MAX,
            _ => abi::NBNXM_MAX_TYPES as usize,
        }
    }
}

impl std::fmt::Display for NbnxmKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_say_what_is_valid() {
        for k in NbnxmKernel::ALL {
            assert_eq!(NbnxmKernel::parse(k.name()).unwrap(), k);
            assert_eq!(k.entries().len(), 3);
        }
        assert_eq!(NbnxmKernel::parse(" xq\n").unwrap(), NbnxmKernel::Xq);
        let e = NbnxmKernel::parse("fast").unwrap_err().to_string();
        assert!(e.contains("HALO_NBNXM_KERNEL") && e.contains("baseline, ind, pf, xq"), "{e}");
        // Every entry exists in the kernel list the PTX must export.
        for k in NbnxmKernel::ALL {
            for name in k.entries() {
                assert!(abi::KERNEL_ENTRIES.contains(&name), "{name}");
            }
        }
        assert!(abi::KERNEL_ENTRIES.contains(&abi::NBNXM_GATHER_XQ));
        assert_eq!(NbnxmKernel::Indirect.force_shared_bytes(2), abi::NBNXM_SHARED_BYTES + 32);
        assert_eq!(NbnxmKernel::Indirect.force_shared_bytes(3), abi::NBNXM_SHARED_BYTES + 80);
        assert_eq!(NbnxmKernel::default_for(2), NbnxmKernel::DEFAULT);
        assert_eq!(NbnxmKernel::default_for(1000), NbnxmKernel::Baseline);
    }
}
