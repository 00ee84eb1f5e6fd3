//! Which nbnxm kernels run, and how many warps share one list entry. All designs compute the same
//! forces, energy and inner list for every warp count (each combination is checked against the
//! `f64` references in `tests/gpu_nbnxm.rs`); they differ in speed, which only a GPU timing can
//! rank (`kernel_times` in the same file). Chosen per [`super::NbnxmGpu`] with
//! [`super::NbnxmGpu::set_kernel`] / [`super::NbnxmGpu::set_warps`], or for a whole run with the
//! environment variables [`NbnxmKernel::ENV`] and [`WarpsPerEntry::ENV`].

use crate::abi;
use crate::error::{HaloError, Result};

/// One design of the nbnxm kernels (see `docs/nbnxm.md`, "Kernels").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NbnxmKernel {
    /// j-list words loaded 32 at a time and skipped by a ballot, the LJ table in shared memory,
    /// j-atoms through the slot index.
    Indirect,
    /// [`Self::Indirect`] with the next j-cluster's loads issued before the current one's pairs.
    Prefetch,
    /// [`Self::Prefetch`] whose warps add their i-forces and energy themselves, with no block
    /// barrier before the sum (a warp that runs out of j-list words leaves at once; the block
    /// makes `W` times the i-force atomics). The prune is [`Self::Prefetch`]'s.
    PerWarp,
}

impl NbnxmKernel {
    /// Every design, in the order the timing table prints them.
    pub const ALL: [Self; 3] = [Self::Indirect, Self::Prefetch, Self::PerWarp];
    /// What a new [`super::NbnxmGpu`] uses when [`Self::ENV`] is not set: the fastest in the checked
    /// MD step on an H200 (`docs/nbnxm.md`, "Kernels"; one rank, 45,000 atoms: 62.2 µs per step
    /// against [`Self::Prefetch`]'s 64.7, `docs/results/nbnxm/md-pf-pfw.log`), as fast or faster
    /// with two ranks, and the fastest force kernel in 7 of `kernel_times`' 9 cases
    /// (`docs/results/nbnxm/pf-pfw-2rank-kernel-times.log`).
    pub const DEFAULT: Self = Self::PerWarp;
    /// Environment variable naming the design for a run (`ind`, `pf`, `pfw`).
    pub const ENV: &'static str = "HALO_NBNXM_KERNEL";

    /// Short name, as [`Self::ENV`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Indirect => "ind",
            Self::Prefetch => "pf",
            Self::PerWarp => "pfw",
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

    /// Kernel entries: forces, forces and energy, prune.
    pub(super) fn entries(self) -> [&'static str; 3] {
        abi::NBNXM_KERNELS[self as usize]
    }
}

impl std::fmt::Display for NbnxmKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How many warps share one list entry: a launch runs one block of `32 W` threads per entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WarpsPerEntry {
    /// [`WarpsPerEntry::auto`]'s choice for each launch's list.
    Auto,
    /// Always this many (1 to [`abi::NBNXM_MAX_WARPS_PER_ENTRY`]).
    Fixed(u32),
}

impl WarpsPerEntry {
    /// Environment variable fixing the count for a run (`1` to `16`, or `auto`).
    pub const ENV: &'static str = "HALO_NBNXM_WARPS";
    /// Warps per multiprocessor that [`Self::auto`] aims a launch at: a bit more than the 24 warps
    /// of these kernels that fit on one at once (80 registers per thread), so that one wave fills
    /// the GPU and the blocks that finish early are replaced.
    pub const TARGET_WARPS_PER_SM: usize = 32;
    /// The most [`Self::auto`] picks: each warp of a 32-word entry then still walks 4 words, enough
    /// to pay for its share of the staging and the final reduction.
    pub const AUTO_MAX: u32 = 8;

    /// `Fixed(warps)`, or an error naming the valid range.
    pub fn fixed(warps: u32) -> Result<Self> {
        if (1..=abi::NBNXM_MAX_WARPS_PER_ENTRY).contains(&warps) {
            Ok(Self::Fixed(warps))
        } else {
            Err(HaloError::InvalidInput(format!("{warps} warps per nbnxm list entry: use 1 to {} (or auto)", abi::NBNXM_MAX_WARPS_PER_ENTRY)))
        }
    }

    /// `auto` or a count, as [`Self::ENV`] takes it.
    pub fn parse(text: &str) -> Result<Self> {
        let t = text.trim();
        if t == "auto" {
            return Ok(Self::Auto);
        }
        let bad = || HaloError::InvalidInput(format!("{}={text:?}: use auto or 1 to {}", Self::ENV, abi::NBNXM_MAX_WARPS_PER_ENTRY));
        let n: u32 = t.parse().map_err(|_| bad())?;
        Self::fixed(n).map_err(|_| bad())
    }

    /// [`Self::ENV`]'s choice, `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var(Self::ENV) {
            Ok(v) if !v.trim().is_empty() => Self::parse(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// Warps per entry for a launch over `entries` entries on a GPU of `sms` multiprocessors.
    pub fn for_list(self, entries: usize, sms: u32) -> u32 {
        match self {
            Self::Auto => Self::auto(entries, sms),
            // Clamped: a launch outside the range would fail (a `Fixed` built without `fixed`).
            Self::Fixed(w) => w.clamp(1, abi::NBNXM_MAX_WARPS_PER_ENTRY),
        }
    }

    /// Warps per entry for the launches of a rank's lists, of `entries` entries each (its local
    /// and non-local lists), on a GPU of `sms` multiprocessors: one count for all of them, the
    /// count [`Self::for_list`] gives their entries together. A step runs the non-local list's
    /// kernels on the halo stream while the local list's run, so a short non-local list need not
    /// fill the GPU by itself, and more warps would only add its staging and reductions (at
    /// 45,000 atoms on 2x1x1 the rule per list gave the non-local list 8 warps beside the local
    /// list's 4, and the step was 3.7–5.3 µs slower than with 4 for both: docs/nbnxm.md).
    pub fn for_lists(self, entries: &[usize], sms: u32) -> u32 {
        self.for_list(entries.iter().sum(), sms)
    }

    /// The rule: the fewest warps per entry, a power of two up to [`Self::AUTO_MAX`], that give the
    /// launch at least [`Self::TARGET_WARPS_PER_SM`] warps per multiprocessor. The kernels are
    /// latency-bound while a multiprocessor has few warps (each walks its words one dependent load
    /// after the other), so a short list gets many warps per entry; a long one already fills the
    /// GPU with one, and more would only add staging and reductions. On an H200 (132
    /// multiprocessors): 1 warp from 4,224 entries on, 2 from 2,112, 4 from 1,056, else 8.
    pub fn auto(entries: usize, sms: u32) -> u32 {
        let target = Self::TARGET_WARPS_PER_SM * sms.max(1) as usize;
        let mut w = 1;
        while w < Self::AUTO_MAX && entries * (w as usize) < target {
            w *= 2;
        }
        w
    }
}

/// The most j-cluster words a list entry of a GPU search holds (`max_j`: a longer run of words of
/// one i-super-cluster is split evenly into entries of at most this many). More, shorter entries
/// give a short list more warps to spread over the GPU; fewer, longer ones less staging and
/// reduction per word. `docs/nbnxm.md` ("What a profile shows") has the local list's measurements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryWords(u32);

impl EntryWords {
    /// Environment variable setting it for a run's GPU searches (1 to
    /// [`abi::NBNXM_ORDER_MAX_J`]); the host searches keep [`super::SearchOptions::MAX_J_PER_ENTRY`].
    pub const ENV: &'static str = "HALO_NBNXM_ENTRY_WORDS";
    /// The default, [`super::SearchOptions::MAX_J_PER_ENTRY`]: the host search's.
    pub const DEFAULT: Self = Self(super::SearchOptions::MAX_J_PER_ENTRY as u32);

    /// `words` per entry, or an error naming the valid range (the GPU's launch order sorts entries
    /// of at most [`abi::NBNXM_ORDER_MAX_J`] words).
    pub fn new(words: u32) -> Result<Self> {
        if (1..=abi::NBNXM_ORDER_MAX_J).contains(&words) {
            Ok(Self(words))
        } else {
            Err(HaloError::InvalidInput(format!("{words} words per nbnxm list entry: use 1 to {}", abi::NBNXM_ORDER_MAX_J)))
        }
    }

    /// A count, as [`Self::ENV`] takes it.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || HaloError::InvalidInput(format!("{}={text:?}: use a count of words from 1 to {}", Self::ENV, abi::NBNXM_ORDER_MAX_J));
        let n: u32 = text.trim().parse().map_err(|_| bad())?;
        Self::new(n).map_err(|_| bad())
    }

    /// [`Self::ENV`]'s count, `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var(Self::ENV) {
            Ok(v) if !v.trim().is_empty() => Self::parse(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// The count.
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for WarpsPerEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(w) => write!(f, "{w}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_say_what_is_valid() {
        for k in NbnxmKernel::ALL {
            assert_eq!(NbnxmKernel::parse(k.name()).unwrap(), k);
            // Every entry exists in the kernel list the PTX must export.
            for name in k.entries() {
                assert!(abi::KERNEL_ENTRIES.contains(&name), "{name}");
            }
        }
        assert_eq!(NbnxmKernel::parse(" pf\n").unwrap(), NbnxmKernel::Prefetch);
        assert_eq!(NbnxmKernel::Indirect.entries(), ["nbnxm_forces_ind", "nbnxm_forces_energy_ind", "nbnxm_prune_ind"]);
        assert_eq!(NbnxmKernel::Prefetch.entries(), ["nbnxm_forces_pf", "nbnxm_forces_energy_pf", "nbnxm_prune_pf"]);
        assert_eq!(NbnxmKernel::PerWarp.entries(), ["nbnxm_forces_pfw", "nbnxm_forces_energy_pfw", "nbnxm_prune_pf"]);
        let e = NbnxmKernel::parse("xq").unwrap_err().to_string();
        assert!(e.contains("HALO_NBNXM_KERNEL") && e.contains("ind, pf, pfw"), "{e}");
    }

    #[test]
    fn entry_words_are_1_to_the_launch_orders_most_and_default_to_the_host_searchs() {
        assert_eq!(EntryWords::DEFAULT.get(), crate::nbnxm::SearchOptions::MAX_J_PER_ENTRY);
        assert_eq!(EntryWords::parse(" 8\n").unwrap().get(), 8);
        assert_eq!(EntryWords::parse("1").unwrap().get(), 1);
        assert_eq!(EntryWords::parse(&abi::NBNXM_ORDER_MAX_J.to_string()).unwrap().get(), abi::NBNXM_ORDER_MAX_J as usize);
        for bad in ["0", "65", "-1", "eight", ""] {
            let e = EntryWords::parse(bad).unwrap_err().to_string();
            assert!(e.contains("HALO_NBNXM_ENTRY_WORDS") && e.contains("from 1 to 64"), "{bad}: {e}");
        }
    }

    #[test]
    fn warp_counts_parse_and_out_of_range_counts_are_refused() {
        assert_eq!(WarpsPerEntry::parse(" auto ").unwrap(), WarpsPerEntry::Auto);
        assert_eq!(WarpsPerEntry::parse("4").unwrap(), WarpsPerEntry::Fixed(4));
        assert_eq!(WarpsPerEntry::parse("16").unwrap(), WarpsPerEntry::Fixed(16));
        assert_eq!(WarpsPerEntry::parse("3").unwrap(), WarpsPerEntry::Fixed(3));
        for bad in ["0", "17", "-1", "many", ""] {
            let e = WarpsPerEntry::parse(bad).unwrap_err().to_string();
            assert!(e.contains("HALO_NBNXM_WARPS") && e.contains("1 to 16"), "{bad}: {e}");
        }
        assert!(WarpsPerEntry::fixed(0).is_err() && WarpsPerEntry::fixed(17).is_err());
        assert_eq!(WarpsPerEntry::Fixed(2).for_list(100_000, 132), 2);
        assert_eq!(WarpsPerEntry::Fixed(0).for_list(10, 132), 1);
        assert_eq!(WarpsPerEntry::Fixed(99).for_list(10, 132), 16);
        assert_eq!(WarpsPerEntry::Auto.to_string(), "auto");
    }

    #[test]
    fn the_rule_gives_short_lists_more_warps_per_entry() {
        // The lists of `kernel_times` (docs/nbnxm.md) on an H200 (132 multiprocessors).
        for (entries, want) in [
            (172, 8),    // 6,000 atoms, 2x1x1, non-local
            (681, 8),    // 6,000 atoms, 1x1x1
            (1_632, 4),  // 45,000 atoms, 2x1x1, local
            (335, 8),    // 45,000 atoms, 2x1x1, non-local
            (3_946, 2),  // 45,000 atoms, 1x1x1
            (7_279, 1),  // 180,000 atoms, 2x1x1, local
            (15_046, 1), // 180,000 atoms, 1x1x1
            (0, 8),
        ] {
            assert_eq!(WarpsPerEntry::auto(entries, 132), want, "{entries} entries");
        }
        // At the boundaries: exactly the target with fewer warps is enough.
        assert_eq!(WarpsPerEntry::auto(4_224, 132), 1);
        assert_eq!(WarpsPerEntry::auto(4_223, 132), 2);
        assert_eq!(WarpsPerEntry::auto(1_056, 132), 4);
        assert_eq!(WarpsPerEntry::auto(1_055, 132), 8);
        // Always a valid launch, whatever the GPU says.
        for sms in [0, 1, 1000] {
            for entries in [0, 1, 10_000_000] {
                let w = WarpsPerEntry::auto(entries, sms);
                assert!(w.is_power_of_two() && w <= WarpsPerEntry::AUTO_MAX && w <= abi::NBNXM_MAX_WARPS_PER_ENTRY);
            }
        }
    }

    #[test]
    fn a_ranks_lists_share_one_count_from_their_entries_together() {
        // The lists of `kernel_times` on an H200: 45,000 atoms on 2x1x1 (the non-local list alone
        // would get 8), 180,000 atoms on 2x1x1 (alone 4), 6,000 atoms on 2x1x1, one rank.
        for (entries, want) in [([1_632, 335], 4), ([7_279, 1_125], 1), ([221, 172], 8), ([3_946, 0], 2)] {
            assert_eq!(WarpsPerEntry::Auto.for_lists(&entries, 132), want, "{entries:?}");
        }
        assert_eq!(WarpsPerEntry::auto(335, 132), 8);
        assert_eq!(WarpsPerEntry::auto(1_125, 132), 4);
        // A fixed count stays fixed; no list at all is the rule's empty launch.
        assert_eq!(WarpsPerEntry::Fixed(2).for_lists(&[1_632, 335], 132), 2);
        assert_eq!(WarpsPerEntry::Auto.for_lists(&[], 132), WarpsPerEntry::auto(0, 132));
    }

    #[test]
    fn force_blocks_have_room_for_every_warp() {
        // Staged atoms 1024 B, indices 256 B, a 2-type table 32 B, then 880 B per warp.
        assert_eq!(abi::nbnxm_force_shared_bytes(2, 1), 1024 + 256 + 32 + 880);
        assert_eq!(abi::nbnxm_force_shared_bytes(3, 4), 1024 + 256 + 80 + 4 * 880);
        assert_eq!(abi::NBNXM_PRUNE_SHARED_BYTES, 1024);
        assert!(abi::nbnxm_force_shared_bytes(abi::NBNXM_MAX_TYPES, abi::NBNXM_MAX_WARPS_PER_ENTRY) <= 48 * 1024);
    }
}
