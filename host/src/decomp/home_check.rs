//! The check that ends a redecomposition: the home atoms of all ranks are the system's atoms
//! `0..atoms`, each on exactly one rank, told from a few numbers per rank instead of every
//! rank's ids.
//!
//! Each rank's home ids are checked where they are held ([`local_homes`]): ascending with no
//! repeat, all below `atoms`. Where a GPU redecomposition merged them, the GPU makes the sums and
//! the order check with the merge ([`HomeIdFacts`], kernel `home_id_facts`) and the host takes
//! those instead of passing over the ids. Between processes only each rank's [`RankHomes`]
//! crosses, with its plan: its home count, two sums over its ids ([`IdSums`]) and its first bad
//! id, if any. With every rank's ids clean and the counts adding up to `atoms`, the ranks hold
//! `0..atoms` once each exactly when no id is on two ranks, and then the sums add up to
//! [`all_ids_sums`]. The sums are
//! of [`scramble`]d ids and of their squares: one or two atoms on two ranks (and as many, the
//! count being right, on none) always change them, and more go unseen only where both sums cancel
//! by chance (far less than one in 2^64 for ids the scramble spreads). Where the sums differ, the
//! caller gathers the ids after all to name the atom ([`name_repeated`]): only a failing run pays
//! for that. A process that drives every rank holds every id: where its GPUs made every rank's
//! sums it takes them as a process among others would, and checks the ids only where they differ;
//! where they did not (the host redecomposes), it checks the ids exactly with one flag per atom
//! instead of making sums ([`name_repeated`], the flags in chunks on the search's workers), which
//! no set of repeats can fool, for a pass over the flags: about 20 µs a search at 45,000 atoms
//! and 65 µs at 180,000 on an H100's host (docs/results/nbnxm/types-on-gpu-ab-h100.log).

use super::PlanError;
use crate::workers::Workers;
// `scramble`: a global id scrambled, the one function the GPU's sums use too (a bijection of
// `0..2^31`, so that ids in arithmetic patterns give sums in none).
use kernels_gpu::abi::{IdFactsPart, scramble_id as scramble};

/// Ids per part of the sums shared out to the workers.
const PART: usize = 16 * 1024;

/// The sums over a set of ids of their [`scramble`]s `y` and of `y²` (the second wrapping). Both
/// are exact for up to two ids changed: the first is below 2^62 for any set of distinct ids, and
/// two pairs of numbers below 2^31 with equal sums and equal sums of squares are the same pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct IdSums {
    /// `Σ y`.
    pub first: u64,
    /// `Σ y²`, wrapping.
    pub second: u64,
}

impl IdSums {
    /// The sums over `ids`.
    #[inline(always)]
    fn of(ids: impl Iterator<Item = u32>) -> Self {
        ids.fold(Self::default(), |s, id| {
            let y = u64::from(scramble(id));
            Self { first: s.first.wrapping_add(y), second: s.second.wrapping_add(y * y) }
        })
    }

    /// The sums over `ids`, in vector lanes of eight where the CPU has them: halo's baseline
    /// target (x86-64's SSE2) multiplies 32-bit words one by one, AVX2 eight at once, about three
    /// times as fast here.
    fn of_slice(ids: &[u32]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above: all `of_slice_avx2` requires.
            return unsafe { Self::of_slice_avx2(ids) };
        }
        Self::of(ids.iter().copied())
    }

    /// [`Self::of_slice`] compiled for AVX2 (the same arithmetic, so the same sums).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn of_slice_avx2(ids: &[u32]) -> Self {
        Self::of(ids.iter().copied())
    }

    /// Both sums added.
    pub fn add(self, o: Self) -> Self {
        Self { first: self.first.wrapping_add(o.first), second: self.second.wrapping_add(o.second) }
    }
}

/// What a device found of one rank's home ids where they are: the home check's two sums over them
/// and whether they ascend strictly. A redecomposition on the GPU makes them with its merge
/// (kernel `home_id_facts`, folded by [`fold_id_facts`]); the host's check of each rank's ids
/// then takes them in place of its own pass over those ids, and passes over them only to name a
/// bad id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HomeIdFacts {
    /// How many ids the facts are of.
    pub count: usize,
    /// `Σ y` over the ids' scrambles `y` ([`kernels_gpu::abi::scramble_id`]), wrapping.
    pub first: u64,
    /// `Σ y²`, wrapping.
    pub second: u64,
    /// Every id is above the one before it.
    pub ascending: bool,
}

impl HomeIdFacts {
    /// The facts of `ids`, made on the CPU with the host check's own sums: what the GPU's parts
    /// must fold to.
    pub fn of(ids: &[u32]) -> Self {
        let IdSums { first, second } = IdSums::of_slice(ids);
        Self { count: ids.len(), first, second, ascending: ids.windows(2).all(|w| w[0] < w[1]) }
    }
}

/// The facts of `count` ids from the parts kernel `home_id_facts` wrote over them
/// ([`kernels_gpu::abi::ID_FACTS_PARTS`]): the sums added up (wrapping, so in any order the host's), ascending
/// when no part saw an id out of order.
pub fn fold_id_facts(parts: &[IdFactsPart], count: usize) -> HomeIdFacts {
    parts.iter().fold(HomeIdFacts { count, ascending: true, ..HomeIdFacts::default() }, |f, p| HomeIdFacts {
        count,
        first: f.first.wrapping_add(p.first),
        second: f.second.wrapping_add(p.second),
        ascending: f.ascending && p.unordered == 0,
    })
}

/// What a rank's home ids tell the home check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RankHomes {
    /// Home atoms.
    pub count: usize,
    /// The sums over their ids.
    pub sums: IdSums,
    /// The first id that is beyond the system, repeated or out of order.
    pub bad: Option<BadHome>,
}

/// A rank's first home id that is beyond the system, or not above the id before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BadHome {
    /// Its index among the rank's home atoms.
    pub local: u32,
    /// The id.
    pub id: u32,
    /// The id before it (`id` itself for the first).
    pub previous: u32,
}

impl BadHome {
    /// The error it is on `rank` of a system of `atoms`.
    pub fn error(self, rank: usize, atoms: usize) -> PlanError {
        let BadHome { local, id, previous } = self;
        if id as usize >= atoms {
            PlanError::GlobalId { rank, local: local as usize, id, atoms }
        } else if id == previous {
            PlanError::HomeCount { atom: id as usize, count: 2 }
        } else {
            PlanError::HomeOrder { rank, local: local as usize, id, previous }
        }
    }
}

/// Each of `ranks`' home ids checked, and with `sums` summed, their parts shared out to
/// `workers` (without `sums` the sums are 0: a process that holds every rank's ids checks them
/// exactly instead, [`name_repeated`]). Where `facts` (indexed like `ranks`; missing entries are
/// `None`) holds a device's [`HomeIdFacts`] of a rank's ids, those are taken instead of a pass
/// over them; its ids are read only to name a bad one. The caller checks that the facts are of
/// as many ids as the rank has.
pub(super) fn local_homes(ranks: &[&[u32]], facts: &[Option<HomeIdFacts>], atoms: usize, sums: bool, workers: &Workers) -> Vec<RankHomes> {
    let given = |r: usize| facts.get(r).copied().flatten();
    let parts: Vec<(usize, usize)> = ranks
        .iter()
        .enumerate()
        .filter(|&(r, _)| given(r).is_none())
        .flat_map(|(r, ids)| (0..ids.len()).step_by(PART).map(move |at| (r, at)))
        .collect();
    let mut sums_of = workers.map(parts, |(r, at)| {
        let ids = ranks[r];
        let end = (at + PART).min(ids.len());
        // Each part's ids with the one before them, so that every neighbouring pair is looked at.
        let ascending = ids[at.saturating_sub(1)..end].windows(2).fold(true, |ok, w| ok & (w[0] < w[1]));
        let sum = if sums { IdSums::of_slice(&ids[at..end]) } else { IdSums::default() };
        (r, ascending, sum)
    });
    sums_of.extend((0..ranks.len()).filter_map(|r| {
        let f = given(r)?;
        Some((r, f.ascending, if sums { IdSums { first: f.first, second: f.second } } else { IdSums::default() }))
    }));
    let mut out: Vec<RankHomes> = ranks.iter().map(|ids| RankHomes { count: ids.len(), ..RankHomes::default() }).collect();
    let mut clean = vec![true; ranks.len()];
    for (r, ascending, sum) in sums_of {
        out[r].sums = out[r].sums.add(sum);
        clean[r] &= ascending;
    }
    for ((h, ids), clean) in out.iter_mut().zip(ranks).zip(clean) {
        // Ascending ids are all below `atoms` when the last is.
        if !clean || ids.last().is_some_and(|&id| id as usize >= atoms) {
            h.bad = first_bad(ids, atoms);
        }
    }
    out
}

/// The first of `ids` beyond `atoms` or not above the id before it.
fn first_bad(ids: &[u32], atoms: usize) -> Option<BadHome> {
    ids.iter().enumerate().find_map(|(k, &id)| {
        let previous = if k == 0 { id } else { ids[k - 1] };
        let bad = id as usize >= atoms || (k > 0 && id <= previous);
        bad.then_some(BadHome { local: k as u32, id, previous })
    })
}

/// The [`IdSums`] of `0..atoms`: what the ranks' sums add up to when they hold every atom once.
pub(super) fn all_ids_sums(atoms: usize, workers: &Workers) -> IdSums {
    let parts: Vec<usize> = (0..atoms).step_by(PART).collect();
    let sums = workers.map(parts, |at| IdSums::of((at..(at + PART).min(atoms)).map(|id| id as u32)));
    sums.into_iter().fold(IdSums::default(), IdSums::add)
}

/// Checks every rank's [`RankHomes`] (indexed by rank) against a system of `atoms`: the count
/// first, then each rank's ids in rank order. What is left to check after it passes is that no id
/// is on two ranks: [`sums_match`] or [`name_repeated`].
pub(super) fn check_counts(homes: &[RankHomes], atoms: usize) -> Result<(), PlanError> {
    let found: usize = homes.iter().map(|h| h.count).sum();
    if found != atoms {
        return Err(PlanError::HomeTotal { found, expected: atoms });
    }
    match homes.iter().enumerate().find_map(|(r, h)| h.bad.map(|b| (r, b))) {
        Some((rank, bad)) => Err(bad.error(rank, atoms)),
        None => Ok(()),
    }
}

/// Whether the ranks' sums (of [`local_homes`] with sums) add up to `expected`, the
/// [`all_ids_sums`] of the system: after [`check_counts`], whether no id is on two ranks (exactly
/// for one or two such ids; for more, but for a chance far below 2^-64).
pub(super) fn sums_match(homes: &[RankHomes], expected: IdSums) -> bool {
    homes.iter().fold(IdSums::default(), |s, h| s.add(h.sums)) == expected
}

/// The first atom (in rank order, then local order) whose id an earlier home atom already has,
/// among every rank's home `ids` (indexed by rank; after [`check_counts`]: as many as `atoms`,
/// each rank's ascending and below `atoms`), with `seen` as one flag per atom; `None` where
/// every atom is there once. Exact: a pass of plain stores and counts on `workers`
/// ([`all_once`]), and only where it finds an atom missing a second pass for the first repeat.
pub(super) fn name_repeated(ids: &[&[u32]], atoms: usize, workers: &Workers, seen: &mut Vec<bool>) -> Option<PlanError> {
    if all_once(ids, atoms, workers, seen) {
        return None;
    }
    seen.clear();
    seen.resize(atoms, false);
    for &id in ids.iter().flat_map(|r| r.iter()) {
        match seen.get_mut(id as usize) {
            Some(true) => return Some(PlanError::HomeCount { atom: id as usize, count: 2 }),
            Some(s) => *s = true,
            None => return Some(PlanError::HomeSet { atoms }),
        }
    }
    Some(PlanError::HomeSet { atoms })
}

/// Atoms per chunk of [`all_once`]'s flags: a chunk's flags, a byte each, stay in the cache of
/// the worker that sets them.
const CHUNK: usize = 16 * 1024;

/// Whether `ids` (indexed by rank) hold every atom of `0..atoms` exactly once: the id space cut
/// into chunks shared out to `workers`, each chunk's flags set from the ids in it and counted.
/// Each rank's ids that a chunk takes are one run of them, found by a binary search, which is
/// where they lie when each rank's ids ascend (the check's precondition). For any input, `true`
/// means every atom once: every id lay in its run's chunk, there are `atoms` ids in all, and every
/// chunk is full, so no id is there twice. Ids out of order may give `false` for a whole set (an
/// id outside its run's chunk); with them ascending the answer is exact. `seen` is left
/// unspecified.
fn all_once(ids: &[&[u32]], atoms: usize, workers: &Workers, seen: &mut Vec<bool>) -> bool {
    if ids.iter().map(|r| r.len()).sum::<usize>() != atoms {
        return false;
    }
    let chunks = atoms.div_ceil(CHUNK);
    // Per rank, where each chunk's run starts, made monotone so that the runs take every id
    // once, in any order; the last run ends at the rank's last id.
    let starts: Vec<Vec<usize>> = ids
        .iter()
        .map(|r| {
            let mut at = Vec::with_capacity(chunks + 1);
            for c in 0..chunks {
                let first = r.partition_point(|&id| (id as usize) < c * CHUNK);
                at.push(first.max(at.last().copied().unwrap_or(0)));
            }
            at.push(r.len());
            at
        })
        .collect();
    seen.clear();
    seen.resize(atoms, false);
    let parts: Vec<(usize, &mut [bool])> = seen.chunks_mut(CHUNK).enumerate().collect();
    let full = workers.map(parts, |(c, flags)| {
        let (lo, last) = (c * CHUNK, flags.len() - 1);
        let mut inside = true;
        for (r, at) in ids.iter().zip(&starts) {
            for &id in &r[at[c]..at[c + 1]] {
                let k = (id as usize).wrapping_sub(lo);
                inside &= k <= last;
                flags[k.min(last)] = true;
            }
        }
        // Counted in 32 bits (wider lanes vectorize worse), which hold a chunk.
        inside && flags.iter().map(|&f| u32::from(f)).sum::<u32>() as usize == flags.len()
    });
    full.into_iter().all(|f| f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn homes(ranks: &[&[u32]], atoms: usize) -> Vec<RankHomes> {
        local_homes(ranks, &[], atoms, true, &Workers::serial())
    }

    /// The whole check as a process that holds only the numbers runs it.
    fn check(homes: &[RankHomes], atoms: usize, expected: IdSums) -> Result<bool, PlanError> {
        check_counts(homes, atoms).map(|()| sums_match(homes, expected))
    }

    #[test]
    fn the_scramble_is_a_bijection_of_31_bit_ids() {
        let top = 1u32 << 31;
        let mut all: Vec<u32> = (0..300_000u32).chain(top - 300_000..top).map(scramble).collect();
        assert!(all.iter().all(|&y| y < top), "31 bits in, 31 bits out");
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 600_000);
        // Neighbouring ids land far apart.
        assert!((0..1000u32).all(|i| scramble(i).abs_diff(scramble(i + 1)) > 64));
    }

    /// Any one or two ids swapped for others change the sums (a pseudo-random sample, and an
    /// arithmetic pattern that fools plain power sums of the ids).
    #[test]
    fn one_or_two_changed_ids_change_the_sums() {
        let atoms = 1u32 << 20;
        let base = IdSums::of(0..atoms);
        let changed = |out: &[u32], inn: &[u32]| {
            let mut ids: Vec<u32> = (0..atoms).filter(|i| !out.contains(i)).collect();
            ids.extend_from_slice(inn);
            IdSums::of(ids.into_iter())
        };
        let mut x = 12345u64;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as u32 % atoms
        };
        for _ in 0..40 {
            let (a, b, c, d) = (next(), next(), next(), next());
            if a != b {
                assert_ne!(changed(&[a], &[b]), base, "{a} for {b}");
            }
            if a != b && c != d && [a, b] != [c, d] && [a, b] != [d, c] {
                assert_ne!(changed(&[a, b], &[c, d]), base, "{a}, {b} for {c}, {d}");
            }
        }
        // The vector path's sums are the scalar path's.
        let ids: Vec<u32> = (0..100_003).map(|_| next()).collect();
        assert_eq!(IdSums::of_slice(&ids), IdSums::of(ids.iter().copied()));
        // Equal sums and sums of squares of the ids themselves: {1, 5, 6} and {2, 3, 7}.
        assert_ne!(changed(&[1, 5, 6], &[2, 3, 7]), base);
    }

    #[test]
    fn every_atom_once_passes_in_any_split() {
        let atoms = 40_000usize;
        let ids: Vec<u32> = (0..atoms as u32).collect();
        let want = all_ids_sums(atoms, &Workers::serial());
        assert_eq!(want, all_ids_sums(atoms, &Workers::new(3).unwrap()), "the sum on any workers");
        // Contiguous blocks, and every third atom to each of three ranks.
        let (a, b) = ids.split_at(12_345);
        assert_eq!(check(&homes(&[a, b], atoms), atoms, want), Ok(true));
        let thirds: Vec<Vec<u32>> = (0..3).map(|r| ids.iter().copied().filter(|i| i % 3 == r).collect()).collect();
        let split: Vec<&[u32]> = thirds.iter().map(Vec::as_slice).collect();
        let on_workers = local_homes(&split, &[], atoms, true, &Workers::new(2).unwrap());
        assert_eq!(on_workers, homes(&split, atoms), "the same on any workers");
        assert_eq!(check(&on_workers, atoms, want), Ok(true));
        assert_eq!(name_repeated(&split, atoms, &Workers::new(2).unwrap(), &mut Vec::new()), None);
        // Without sums: the same checks, every sum 0.
        let unsummed = local_homes(&split, &[], atoms, false, &Workers::new(2).unwrap());
        assert!(unsummed.iter().zip(&on_workers).all(|(u, s)| u.sums == IdSums::default() && u.bad == s.bad && u.count == s.count));
        assert_eq!(check(&homes(&[&[], &[]], 0), 0, all_ids_sums(0, &Workers::serial())), Ok(true));
        assert_eq!(name_repeated(&[&[], &[]], 0, &Workers::serial(), &mut vec![true; 4]), None);
    }

    /// A device's facts of a rank's ids stand in for the host's pass over them: the same
    /// [`RankHomes`] where they are the ids' own ([`HomeIdFacts::of`], and the parts the kernel
    /// writes folded), with the sums taken from the facts (**negative control:** other sums show
    /// through) and a bad id named from the ids where the facts say they do not ascend.
    #[test]
    fn a_devices_id_facts_stand_in_for_the_hosts_pass() {
        let atoms = 50_000usize;
        let ids: Vec<u32> = (0..atoms as u32).collect();
        let thirds: Vec<Vec<u32>> = (0..3).map(|r| ids.iter().copied().filter(|i| i % 3 == r).collect()).collect();
        let split: Vec<&[u32]> = thirds.iter().map(Vec::as_slice).collect();
        let workers = Workers::new(2).unwrap();
        for sums in [true, false] {
            let want = local_homes(&split, &[], atoms, sums, &workers);
            let all: Vec<_> = split.iter().map(|ids| Some(HomeIdFacts::of(ids))).collect();
            assert_eq!(local_homes(&split, &all, atoms, sums, &workers), want, "every rank's facts, sums {sums}");
            let some = [None, all[1], None];
            assert_eq!(local_homes(&split, &some, atoms, sums, &workers), want, "one rank's facts, sums {sums}");
        }
        // The kernel's parts: each warp's share summed, folded in any order.
        let ids = split[1];
        let parts: Vec<IdFactsPart> = ids
            .chunks(97)
            .map(|c| {
                let f = HomeIdFacts::of(c);
                IdFactsPart { first: f.first, second: f.second, unordered: 0, pad: 0 }
            })
            .chain(std::iter::repeat_n(IdFactsPart::default(), 5))
            .rev()
            .collect();
        assert_eq!(fold_id_facts(&parts, ids.len()), HomeIdFacts::of(ids));
        let mut flagged = parts.clone();
        flagged[3].unordered = 1;
        assert!(!fold_id_facts(&flagged, ids.len()).ascending);
        assert_eq!(fold_id_facts(&[], 0), HomeIdFacts { count: 0, first: 0, second: 0, ascending: true });
        // Negative control: the facts' sums are the ones used.
        let mut wrong = HomeIdFacts::of(split[0]);
        wrong.first ^= 1;
        let got = local_homes(&split, &[Some(wrong)], atoms, true, &workers);
        assert_ne!(got[0].sums, local_homes(&split, &[], atoms, true, &workers)[0].sums);
        assert_eq!(check(&got, atoms, all_ids_sums(atoms, &workers)), Ok(false));
        // Facts that say the ids do not ascend: the bad id named from the ids themselves, as
        // without facts.
        let mut swapped = thirds[2].clone();
        swapped.swap(100, 101);
        let bad: Vec<&[u32]> = vec![split[0], split[1], &swapped];
        let facts = [None, None, Some(HomeIdFacts::of(&swapped))];
        assert!(!HomeIdFacts::of(&swapped).ascending);
        let with = local_homes(&bad, &facts, atoms, true, &workers);
        assert_eq!(with, local_homes(&bad, &[], atoms, true, &workers));
        assert_eq!(with[2].bad, Some(BadHome { local: 101, id: swapped[101], previous: swapped[100] }));
        // An id beyond the system at the end of ids that ascend: named too.
        let mut beyond = thirds[0].clone();
        beyond.push(atoms as u32 + 3);
        let with = local_homes(&[&beyond], &[Some(HomeIdFacts::of(&beyond))], atoms, true, &workers);
        assert_eq!(with[0].bad.map(|b| b.id), Some(atoms as u32 + 3));
    }

    /// [`all_once`] against a plain count per atom, on one worker and on three: sets of 0 to
    /// 70,000 atoms over 1 to 4 ranks, whole and ascending (`true`), then with one id repeated in
    /// place of another (in one rank or across two, at chunk edges and at random), one lost, one
    /// beyond the system (each `false`), and two neighbours of one rank swapped (a whole set out
    /// of order: never a wrong `true`, and `true` or `false` alike on any workers).
    #[test]
    fn all_once_is_exact_on_any_input() {
        let reference = |ids: &[&[u32]], atoms: usize| {
            let mut count = vec![0u32; atoms];
            ids.iter().flat_map(|r| r.iter()).all(|&id| count.get_mut(id as usize).map(|c| *c += 1).is_some()) && count.iter().all(|&c| c == 1)
        };
        let (serial, three) = (Workers::serial(), Workers::new(3).unwrap());
        let mut seen = vec![true; 5];
        let mut state = 0x9e37_79b9u32;
        let mut next = |below: usize| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as usize % below.max(1)
        };
        for (atoms, nranks) in [(0, 1), (1, 1), (5, 2), (CHUNK, 2), (CHUNK + 1, 3), (3 * CHUNK - 1, 4), (70_000, 2), (70_000, 3)] {
            let owner: Vec<usize> = (0..atoms).map(|_| next(nranks)).collect();
            let whole: Vec<Vec<u32>> = (0..nranks).map(|r| (0..atoms as u32).filter(|&i| owner[i as usize] == r).collect()).collect();
            let mut cases = vec![("whole", whole.clone())];
            let edges = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, atoms.saturating_sub(1), next(atoms)];
            for &at in edges.iter().filter(|&&at| at < atoms) {
                let r = owner[at];
                let k = whole[r].iter().position(|&id| id as usize == at).unwrap();
                let other = (at + 1 + next(atoms.saturating_sub(1))) % atoms;
                if other != at {
                    let mut c = whole.clone();
                    c[r][k] = other as u32;
                    c[r].sort_unstable();
                    cases.push(("repeat", c));
                }
                let mut c = whole.clone();
                c[r].remove(k);
                cases.push(("lost", c.clone()));
                c[r].push(atoms as u32 + next(9) as u32);
                cases.push(("beyond", c));
                if whole[r].len() > 1 {
                    let mut c = whole.clone();
                    let j = if k + 1 < c[r].len() { k + 1 } else { k - 1 };
                    c[r].swap(k, j);
                    cases.push(("swapped", c));
                }
            }
            for (what, c) in &cases {
                let ids: Vec<&[u32]> = c.iter().map(Vec::as_slice).collect();
                let whole_set = reference(&ids, atoms);
                assert_eq!(whole_set, matches!(*what, "whole" | "swapped"), "{what}, {atoms} atoms on {nranks} ranks: the reference");
                let got = all_once(&ids, atoms, &serial, &mut seen);
                assert_eq!(all_once(&ids, atoms, &three, &mut seen), got, "{what}, {atoms} atoms on {nranks} ranks: on three workers");
                if *what == "swapped" {
                    assert!(!got || whole_set, "{what}, {atoms} atoms on {nranks} ranks");
                } else {
                    assert_eq!(got, whole_set, "{what}, {atoms} atoms on {nranks} ranks");
                }
            }
        }
    }

    /// Each way the ids can be wrong gives its error, in the check's order, wherever it lies
    /// (parts are 16 Ki ids: bad ids on either side of a part's edge too).
    #[test]
    fn each_wrong_id_is_named() {
        let atoms = 50_000usize;
        let want = all_ids_sums(atoms, &Workers::serial());
        let ids: Vec<u32> = (0..atoms as u32).collect();
        let run = |a: &[u32], b: &[u32]| check(&local_homes(&[a, b], &[], atoms, true, &Workers::new(2).unwrap()), atoms, want);
        let (a, b) = ids.split_at(20_000);
        // One atom lost.
        assert_eq!(run(a, &b[1..]), Err(PlanError::HomeTotal { found: atoms - 1, expected: atoms }));
        for at in [0, 1, PART - 1, PART, PART + 1, a.len() - 1] {
            // A repeat inside rank 0 in place of the next id.
            let mut bad = a.to_vec();
            if at + 1 < bad.len() {
                bad[at + 1] = bad[at];
                assert_eq!(run(&bad, b), Err(PlanError::HomeCount { atom: at, count: 2 }), "repeat at {at}");
            }
            // An id beyond the system (which comes first, before the order of the id after it).
            let mut bad = a.to_vec();
            bad[at] = atoms as u32 + 7;
            assert_eq!(run(&bad, b), Err(PlanError::GlobalId { rank: 0, local: at, id: atoms as u32 + 7, atoms }), "beyond at {at}");
            // Two ids swapped.
            if at + 1 < a.len() {
                let mut bad = a.to_vec();
                bad.swap(at, at + 1);
                let e = PlanError::HomeOrder { rank: 0, local: at + 1, id: at as u32, previous: at as u32 + 1 };
                assert_eq!(run(&bad, b), Err(e), "swap at {at}");
            }
        }
        // An atom of rank 1 also on rank 0, in place of one of rank 0's own: every rank's ids
        // clean, the counts right, the sums not; the flags name the atom.
        let mut dup = a.to_vec();
        dup[7] = b[3];
        dup.sort_unstable();
        assert_eq!(run(&dup, b), Ok(false));
        let mut seen = vec![true; 3];
        assert_eq!(name_repeated(&[&dup, b], atoms, &Workers::serial(), &mut seen), Some(PlanError::HomeCount { atom: b[3] as usize, count: 2 }));
        assert_eq!(name_repeated(&[a, b], atoms, &Workers::serial(), &mut seen), None);
        // Several pairs at once, on both ranks.
        let (mut x, mut y) = (a.to_vec(), b.to_vec());
        for k in [3, 900, 19_000] {
            x[k] = b[k];
            y[k + 5] = a[k + 1];
        }
        x.sort_unstable();
        y.sort_unstable();
        assert_eq!(run(&x, &y), Ok(false));
        assert!(matches!(name_repeated(&[&x, &y], atoms, &Workers::new(3).unwrap(), &mut seen), Some(PlanError::HomeCount { .. })));
    }
}
