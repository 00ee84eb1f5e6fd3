//! The check that ends a redecomposition: the home atoms of all ranks are the system's atoms
//! `0..atoms`, each on exactly one rank, told from three numbers per rank instead of every
//! rank's ids.
//!
//! Each rank's home ids are checked where they are held ([`local_homes`]): ascending with no
//! repeat, all below `atoms`. Between processes only each rank's [`RankHomes`] crosses, with its
//! plan: its home count, the sum of its ids' [`mix`]es and its first bad id, if any. With every
//! rank's ids clean and the counts adding up to `atoms`, the ranks hold `0..atoms` once each
//! exactly when no id is on two ranks, and then the sums add up to [`all_ids_sum`]. [`mix`] is
//! injective, so one atom on two ranks (and, the count being right, another on none) always shows
//! in the sum; several such errors at once go unseen only where their mixes cancel by chance
//! (about one in 2^64). Where the sums differ, the caller gathers the ids after all to name the
//! atom ([`name_repeated`]): only a failing run pays for that.

use super::PlanError;
use crate::workers::Workers;

/// Ids per part of the sums shared out to the workers.
const PART: usize = 16 * 1024;

/// A 64-bit mix of a global id (SplitMix64's output function): a bijection of 64-bit words
/// (an added constant, xor-shifts and multiplications by odd constants are each invertible), so
/// two different ids never mix to the same word.
pub(super) fn mix(id: u32) -> u64 {
    let mut z = u64::from(id).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What a rank's home ids tell the home check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RankHomes {
    /// Home atoms.
    pub count: usize,
    /// The wrapping sum of their ids' [`mix`]es.
    pub sum: u64,
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

/// Each of `ranks`' home ids checked and summed, their parts shared out to `workers`.
pub(super) fn local_homes(ranks: &[&[u32]], atoms: usize, workers: &Workers) -> Vec<RankHomes> {
    let parts: Vec<(usize, usize)> = ranks.iter().enumerate().flat_map(|(r, ids)| (0..ids.len()).step_by(PART).map(move |at| (r, at))).collect();
    let sums = workers.map(parts.clone(), |(r, at)| {
        let ids = ranks[r];
        let end = (at + PART).min(ids.len());
        // Each part's ids with the one before them, so that every neighbouring pair is looked at.
        let ascending = ids[at.saturating_sub(1)..end].windows(2).fold(true, |ok, w| ok & (w[0] < w[1]));
        (ascending, ids[at..end].iter().fold(0u64, |s, &id| s.wrapping_add(mix(id))))
    });
    let mut out: Vec<RankHomes> = ranks.iter().map(|ids| RankHomes { count: ids.len(), ..RankHomes::default() }).collect();
    let mut clean = vec![true; ranks.len()];
    for (&(r, _), (ascending, sum)) in parts.iter().zip(sums) {
        out[r].sum = out[r].sum.wrapping_add(sum);
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

/// The wrapping sum of [`mix`] over `0..atoms`: what the ranks' sums add up to when they hold
/// every atom once.
pub(super) fn all_ids_sum(atoms: usize, workers: &Workers) -> u64 {
    let parts: Vec<usize> = (0..atoms).step_by(PART).collect();
    let sums = workers.map(parts, |at| (at..(at + PART).min(atoms)).fold(0u64, |s, id| s.wrapping_add(mix(id as u32))));
    sums.into_iter().fold(0, u64::wrapping_add)
}

/// Why the ranks' home atoms are not `0..atoms` once each.
#[derive(Debug, PartialEq)]
pub(super) enum Mismatch {
    /// What is wrong, named from the numbers alone.
    Named(PlanError),
    /// The counts add up and every rank's ids are clean, but some id is on two ranks (and
    /// another on none): the sums differ. Naming it takes the ids.
    Repeated,
}

/// Checks every rank's [`RankHomes`] (indexed by rank) against a system of `atoms` whose
/// [`all_ids_sum`] is `expected`: the count first, then each rank's ids in rank order, then the
/// sum.
pub(super) fn check(homes: &[RankHomes], atoms: usize, expected: u64) -> Result<(), Mismatch> {
    let found: usize = homes.iter().map(|h| h.count).sum();
    if found != atoms {
        return Err(Mismatch::Named(PlanError::HomeTotal { found, expected: atoms }));
    }
    if let Some((rank, bad)) = homes.iter().enumerate().find_map(|(r, h)| h.bad.map(|b| (r, b))) {
        return Err(Mismatch::Named(bad.error(rank, atoms)));
    }
    let sum = homes.iter().fold(0u64, |s, h| s.wrapping_add(h.sum));
    if sum == expected { Ok(()) } else { Err(Mismatch::Repeated) }
}

/// The first atom (in rank order, then local order) whose id an earlier home atom already has,
/// among every rank's home `ids` (indexed by rank; each clean and below `atoms`), with `seen` as
/// one flag per atom.
pub(super) fn name_repeated(ids: &[&[u32]], atoms: usize, seen: &mut Vec<bool>) -> Option<PlanError> {
    seen.clear();
    seen.resize(atoms, false);
    for &rank in ids {
        for &id in rank {
            match seen.get_mut(id as usize) {
                Some(true) => return Some(PlanError::HomeCount { atom: id as usize, count: 2 }),
                Some(s) => *s = true,
                None => return Some(PlanError::HomeSet { atoms }),
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn homes(ranks: &[&[u32]], atoms: usize) -> Vec<RankHomes> {
        local_homes(ranks, atoms, &Workers::serial())
    }

    #[test]
    fn mixes_of_distinct_ids_differ() {
        let mut all: Vec<u64> = (0..200_000u32).chain([u32::MAX - 1, u32::MAX]).map(mix).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 200_002);
    }

    #[test]
    fn every_atom_once_passes_in_any_split() {
        let atoms = 40_000usize;
        let ids: Vec<u32> = (0..atoms as u32).collect();
        let want = all_ids_sum(atoms, &Workers::serial());
        assert_eq!(want, all_ids_sum(atoms, &Workers::new(3).unwrap()), "the sum on any workers");
        // Contiguous blocks, and every third atom to each of three ranks.
        let (a, b) = ids.split_at(12_345);
        assert_eq!(check(&homes(&[a, b], atoms), atoms, want), Ok(()));
        let thirds: Vec<Vec<u32>> = (0..3).map(|r| ids.iter().copied().filter(|i| i % 3 == r).collect()).collect();
        let split: Vec<&[u32]> = thirds.iter().map(Vec::as_slice).collect();
        let on_workers = local_homes(&split, atoms, &Workers::new(2).unwrap());
        assert_eq!(on_workers, homes(&split, atoms), "the same on any workers");
        assert_eq!(check(&on_workers, atoms, want), Ok(()));
        assert_eq!(check(&homes(&[&[], &[]], 0), 0, all_ids_sum(0, &Workers::serial())), Ok(()));
    }

    /// Each way the ids can be wrong gives its error, in the check's order, wherever it lies
    /// (parts are 16 Ki ids: bad ids on either side of a part's edge too).
    #[test]
    fn each_wrong_id_is_named() {
        let atoms = 50_000usize;
        let want = all_ids_sum(atoms, &Workers::serial());
        let ids: Vec<u32> = (0..atoms as u32).collect();
        let run = |a: &[u32], b: &[u32]| check(&local_homes(&[a, b], atoms, &Workers::new(2).unwrap()), atoms, want);
        let (a, b) = ids.split_at(20_000);
        // One atom lost.
        assert_eq!(run(a, &b[1..]), Err(Mismatch::Named(PlanError::HomeTotal { found: atoms - 1, expected: atoms })));
        for at in [0, 1, PART - 1, PART, PART + 1, a.len() - 1] {
            // A repeat inside rank 0 in place of the next id.
            let mut bad = a.to_vec();
            if at + 1 < bad.len() {
                bad[at + 1] = bad[at];
                assert_eq!(run(&bad, b), Err(Mismatch::Named(PlanError::HomeCount { atom: at, count: 2 })), "repeat at {at}");
            }
            // An id beyond the system, and two ids swapped.
            let mut bad = a.to_vec();
            bad[at] = atoms as u32 + 7;
            // Beyond the system comes first, before the order of the id after it.
            let e = PlanError::GlobalId { rank: 0, local: at, id: atoms as u32 + 7, atoms };
            assert_eq!(run(&bad, b), Err(Mismatch::Named(e)), "beyond at {at}");
            if at + 1 < a.len() {
                let mut bad = a.to_vec();
                bad.swap(at, at + 1);
                let e = PlanError::HomeOrder { rank: 0, local: at + 1, id: at as u32, previous: at as u32 + 1 };
                assert_eq!(run(&bad, b), Err(Mismatch::Named(e)), "swap at {at}");
            }
        }
        // An atom of rank 1 also on rank 0, in place of one of rank 0's own: every rank's ids
        // clean, the counts right, the sums not.
        let mut dup = a.to_vec();
        dup[7] = b[3];
        dup.sort_unstable();
        assert_eq!(run(&dup, b), Err(Mismatch::Repeated));
        let mut seen = vec![true; 3];
        assert_eq!(name_repeated(&[&dup, b], atoms, &mut seen), Some(PlanError::HomeCount { atom: b[3] as usize, count: 2 }));
        assert_eq!(name_repeated(&[a, b], atoms, &mut seen), None);
    }
}
