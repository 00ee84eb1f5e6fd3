//! PE bitmaps per distance level, and the distance between two PEs read from them.
//!
//! PE `i` keeps one bitmap per level; bit `j` of level `L` is set when `i` believes `j` is within
//! `L`. Bitmaps are cumulative (a PE within NVLink is within every level above), so the distance
//! between `i` and `j` is the first level at which both bitmaps carry the other's bit. A bit that
//! only one side sets is not trusted: the pair falls to the next level both agree on, with a
//! warning, because a one-sided claim usually means one PE's view is stale.

use super::{DistanceLevel, LEVELS, RouteError};
use std::fmt;

/// A set of PEs, one bit each, in 64-bit words (4096 PEs take 512 bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PeBitmap {
    words: Vec<u64>,
}

impl PeBitmap {
    /// An empty set with room for `n_pes` PEs.
    pub fn new(n_pes: usize) -> Self {
        Self {
            words: vec![0; n_pes.div_ceil(64)],
        }
    }

    /// The set of all `n_pes` PEs.
    pub fn full(n_pes: usize) -> Self {
        let mut words = vec![!0u64; n_pes.div_ceil(64)];
        if let Some(last) = words.last_mut().filter(|_| !n_pes.is_multiple_of(64)) {
            *last = (1u64 << (n_pes % 64)) - 1;
        }
        Self { words }
    }

    /// Adds `pe`; grows the set if it is too small.
    pub fn set(&mut self, pe: usize) {
        let w = pe / 64;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (pe % 64);
    }

    /// Removes `pe`.
    pub fn clear(&mut self, pe: usize) {
        if let Some(w) = self.words.get_mut(pe / 64) {
            *w &= !(1 << (pe % 64));
        }
    }

    /// Whether `pe` is in the set (false beyond its end).
    #[inline]
    pub fn contains(&self, pe: usize) -> bool {
        self.words
            .get(pe / 64)
            .is_some_and(|w| w & (1 << (pe % 64)) != 0)
    }

    /// Adds every PE of `other`.
    pub fn union_with(&mut self, other: &PeBitmap) {
        if other.words.len() > self.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }

    /// How many PEs are in the set.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The PEs in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| {
            (0..64)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| wi * 64 + b)
        })
    }

    /// The lowest PE in the set that is `>= from`, checked word by word.
    fn first_at_or_after(&self, from: usize) -> Option<usize> {
        let start = from / 64;
        self.words
            .iter()
            .enumerate()
            .skip(start)
            .find_map(|(wi, &w)| {
                let w = if wi == start {
                    w & (!0u64).checked_shl((from % 64) as u32).unwrap_or(0)
                } else {
                    w
                };
                (w != 0).then(|| wi * 64 + w.trailing_zeros() as usize)
            })
    }

    /// The raw words (bit `j % 64` of word `j / 64` is PE `j`).
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Bytes of heap this set uses.
    pub fn heap_bytes(&self) -> usize {
        self.words.capacity() * std::mem::size_of::<u64>()
    }
}

/// Where the distance between two PEs came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistanceInfo {
    /// The distance.
    pub level: DistanceLevel,
    /// The bitmap level at which both PEs agreed; `None` when no level did (then the distance is
    /// [`DistanceLevel::CrossCluster`] by default).
    pub hit: Option<DistanceLevel>,
    /// A nearer level that only one side claimed: (level, the PE that claimed it).
    pub one_sided: Option<(DistanceLevel, usize)>,
}

/// The bitmaps of every PE at every level, with an epoch and a content hash.
///
/// The epoch counts changes: every mutation increments it, and a router that is handed a new
/// topology with a different hash gives it the next epoch. The hash identifies the content
/// across runs, so two runs that print the same hash saw the same topology.
#[derive(Clone, Debug)]
pub struct Topology {
    n_pes: usize,
    per_pe: Vec<[PeBitmap; LEVELS]>,
    epoch: u64,
    hash: u64,
}

impl Topology {
    /// A topology from per-PE bitmaps (`per_pe[i][level]`), at epoch 1.
    ///
    /// Bitmaps are made cumulative (each level includes the levels below it) and every PE is put
    /// in its own same-GPU set and everyone's cross-cluster set; bits at or beyond
    /// `per_pe.len()` are an error.
    pub fn from_bitmaps(per_pe: Vec<[PeBitmap; LEVELS]>) -> Result<Self, RouteError> {
        let n_pes = per_pe.len();
        if n_pes == 0 {
            return Err(RouteError::InvalidTopology("no PEs".into()));
        }
        let mut per_pe = per_pe;
        for (pe, levels) in per_pe.iter_mut().enumerate() {
            normalise(pe, n_pes, levels)?;
        }
        let mut t = Self {
            n_pes,
            per_pe,
            epoch: 1,
            hash: 0,
        };
        t.hash = t.compute_hash();
        Ok(t)
    }

    /// How many PEs.
    pub fn n_pes(&self) -> usize {
        self.n_pes
    }

    /// The change counter (starts at 1).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A 64-bit hash of every bitmap (FNV-1a over the words, then mixed): equal topologies hash equal.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The hash as 16 hex digits, as printed in logs.
    pub fn hash_hex(&self) -> String {
        format!("{:016x}", self.hash)
    }

    /// PE `pe`'s bitmap at `level`.
    pub fn bitmap(&self, pe: usize, level: DistanceLevel) -> Result<&PeBitmap, RouteError> {
        self.per_pe
            .get(pe)
            .map(|l| &l[level.index()])
            .ok_or(RouteError::PeOutOfRange {
                pe,
                n_pes: self.n_pes,
            })
    }

    /// Replaces PE `pe`'s view (made cumulative as in [`Topology::from_bitmaps`]); bumps the
    /// epoch and recomputes the hash when anything changed.
    pub fn set_pe(&mut self, pe: usize, mut levels: [PeBitmap; LEVELS]) -> Result<(), RouteError> {
        if pe >= self.n_pes {
            return Err(RouteError::PeOutOfRange {
                pe,
                n_pes: self.n_pes,
            });
        }
        normalise(pe, self.n_pes, &mut levels)?;
        if self.per_pe[pe] != levels {
            self.per_pe[pe] = levels;
            self.epoch += 1;
            self.hash = self.compute_hash();
        }
        Ok(())
    }

    /// Sets the epoch (a router continues its own count when it is handed a new topology).
    pub(crate) fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The distance between `a` and `b`; warns (`tracing::warn!`) when a nearer level is claimed
    /// by only one of them.
    pub fn distance(&self, a: usize, b: usize) -> Result<DistanceLevel, RouteError> {
        let info = self.distance_info(a, b)?;
        if let Some((claimed, by)) = info.one_sided {
            let other = if by == a { b } else { a };
            tracing::warn!(
                "route: PE {by} places PE {other} within {claimed} but PE {other} does not agree; \
                 using {} (topology {})",
                info.level,
                self.hash_hex()
            );
        }
        Ok(info.level)
    }

    /// The distance between `a` and `b` with the level that matched and any one-sided claim, without logging.
    pub fn distance_info(&self, a: usize, b: usize) -> Result<DistanceInfo, RouteError> {
        let la = self.per_pe.get(a).ok_or(RouteError::PeOutOfRange {
            pe: a,
            n_pes: self.n_pes,
        })?;
        let lb = self.per_pe.get(b).ok_or(RouteError::PeOutOfRange {
            pe: b,
            n_pes: self.n_pes,
        })?;
        let mut one_sided = None;
        for level in DistanceLevel::ALL {
            let (ab, ba) = (la[level.index()].contains(b), lb[level.index()].contains(a));
            if ab && ba {
                return Ok(DistanceInfo {
                    level,
                    hit: Some(level),
                    one_sided,
                });
            }
            if one_sided.is_none() && (ab || ba) {
                one_sided = Some((level, if ab { a } else { b }));
            }
        }
        Ok(DistanceInfo {
            level: DistanceLevel::CrossCluster,
            hit: None,
            one_sided,
        })
    }

    /// Heap bytes of all bitmaps (for the size check: 4096 PEs are 512 B per PE and level).
    pub fn heap_bytes(&self) -> usize {
        self.per_pe
            .iter()
            .flat_map(|l| l.iter())
            .map(PeBitmap::heap_bytes)
            .sum()
    }

    fn compute_hash(&self) -> u64 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        // Word-wise FNV-1a keeps hashing 4096 PEs cheap in debug builds; the splitmix finish
        // spreads the last words' bits, which plain word-wise FNV leaves in the low bits.
        let mut h = OFFSET ^ self.n_pes as u64;
        for levels in &self.per_pe {
            for bm in levels {
                h = (h ^ bm.words.len() as u64).wrapping_mul(PRIME);
                for &w in &bm.words {
                    h = (h ^ w).wrapping_mul(PRIME);
                }
            }
        }
        h ^= h >> 30;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 27;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} PEs, epoch {}, hash {}",
            self.n_pes,
            self.epoch,
            self.hash_hex()
        )
    }
}

/// Makes one PE's bitmaps cumulative, sized to `n_pes`, with itself at same-GPU and everyone at cross-cluster.
fn normalise(pe: usize, n_pes: usize, levels: &mut [PeBitmap; LEVELS]) -> Result<(), RouteError> {
    levels[DistanceLevel::SameGpu.index()].set(pe);
    levels[DistanceLevel::CrossCluster.index()] = PeBitmap::full(n_pes);
    for i in 0..LEVELS {
        if let Some(beyond) = levels[i].first_at_or_after(n_pes) {
            return Err(RouteError::InvalidTopology(format!(
                "PE {pe}'s {} bitmap names PE {beyond}, but there are only {n_pes} PEs",
                DistanceLevel::ALL[i]
            )));
        }
        levels[i].words.resize(n_pes.div_ceil(64), 0);
        if i > 0 {
            let (lower, upper) = levels.split_at_mut(i);
            upper[0].union_with(&lower[i - 1]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty(n: usize) -> [PeBitmap; LEVELS] {
        std::array::from_fn(|_| PeBitmap::new(n))
    }

    #[test]
    fn bitmap_basics() {
        let mut b = PeBitmap::new(130);
        assert_eq!(b.words().len(), 3);
        b.set(0);
        b.set(129);
        assert!(b.contains(129) && !b.contains(128) && !b.contains(5000));
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![0, 129]);
        b.clear(0);
        assert_eq!(b.count(), 1);
    }

    #[test]
    fn cumulative_and_one_sided() {
        let mut views = vec![empty(3), empty(3), empty(3)];
        views[0][DistanceLevel::NvLink.index()].set(1);
        views[1][DistanceLevel::NvLink.index()].set(0);
        // PE 2 claims NVLink to 0; PE 0 only places 2 in the same rack.
        views[2][DistanceLevel::NvLink.index()].set(0);
        views[0][DistanceLevel::Rack.index()].set(2);
        let t = Topology::from_bitmaps(views).expect("valid");
        assert_eq!(t.distance(0, 1).ok(), Some(DistanceLevel::NvLink));
        let info = t.distance_info(0, 2).expect("in range");
        assert_eq!(info.level, DistanceLevel::Rack);
        assert_eq!(info.one_sided, Some((DistanceLevel::NvLink, 2)));
        assert_eq!(t.distance(1, 2).ok(), Some(DistanceLevel::CrossCluster));
        assert_eq!(t.distance(2, 2).ok(), Some(DistanceLevel::SameGpu));
        assert!(t.distance(0, 3).is_err());
    }

    #[test]
    fn epoch_and_hash_follow_changes() {
        let mut t = Topology::from_bitmaps(vec![empty(2), empty(2)]).expect("valid");
        let (e, h) = (t.epoch(), t.hash());
        t.set_pe(0, empty(2)).expect("in range");
        assert_eq!((t.epoch(), t.hash()), (e, h), "no change, no new epoch");
        let mut v = empty(2);
        v[DistanceLevel::Rack.index()].set(1);
        t.set_pe(0, v).expect("in range");
        assert_eq!(t.epoch(), e + 1);
        assert_ne!(t.hash(), h);
        let mut bad = empty(2);
        bad[1].set(7);
        assert!(t.set_pe(1, bad).is_err());
    }
}
