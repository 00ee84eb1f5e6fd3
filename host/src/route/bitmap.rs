//! The topology: where every PE sits, in memory linear in the number of PEs, and the distance
//! between two PEs read from it.
//!
//! The model is a bitmap per PE and level (docs/routing.md): bit `j` of PE `i`'s level-`L` bitmap
//! is set when `i` believes `j` is within `L`. Bitmaps are cumulative (a PE within NVLink is within
//! every level above), so the distance between `i` and `j` is the first level at which both
//! bitmaps carry the other's bit. A bit that only one side sets is not trusted: the pair falls to
//! the next level both agree on, with a warning, because a one-sided claim usually means one PE's
//! view is stale.
//!
//! Storing every PE's bitmaps is n² bits: 16 MiB in every process at 4,096 PEs. They are not
//! stored. Every PE's view follows from its facts, and the facts reduce to a coordinate table, as
//! the seed design keeps one: per PE a few small group ids ([`PeCoord`]: its GPU, host, rack,
//! leaf, cluster, NVLink domain) and the index of the set of GPUs it claims NVLink and P2P to
//! ([`ClaimSet`], interned, so the PEs of one node share one). [`Topology::placed`] reads the
//! nearest level at which `i`'s bitmap holds `j` from the two coordinates, and
//! [`Topology::bitmap`] still materialises any bitmap on demand. At 4,096 PEs the table takes
//! tens of KiB (`host/tests/route_memory.rs` measures it with a counting allocator).

use super::{DistanceLevel, RouteError};
use std::fmt;

/// A set of PEs, one bit each, in 64-bit words (4096 PEs take 512 bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PeBitmap {
    words: Vec<u64>,
}

impl PeBitmap {
    /// An empty set with room for `n_pes` PEs.
    pub fn new(n_pes: usize) -> Self {
        Self { words: vec![0; n_pes.div_ceil(64)] }
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
        self.words.get(pe / 64).is_some_and(|w| w & (1 << (pe % 64)) != 0)
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
        self.words.iter().enumerate().flat_map(|(wi, &w)| (0..64).filter(move |b| w & (1 << b) != 0).map(move |b| wi * 64 + b))
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
    /// The bitmap level at which both PEs agreed. Always set: every PE places every other within
    /// cross-cluster, so the two views agree at that level at the latest.
    pub hit: Option<DistanceLevel>,
    /// A nearer level that only one side claimed: (level, the PE that claimed it).
    pub one_sided: Option<(DistanceLevel, usize)>,
}

/// A group id that matches nothing (rack, leaf or NVLink domain unknown).
pub const NO_GROUP: u32 = u32::MAX;

/// Where one PE sits: small ids of its groups, equal ids meaning the same group. Built by
/// [`super::topology_from_facts`], which interns host names, GPU UUIDs and placement names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PeCoord {
    /// The GPU (PEs with the same GPU UUID share it): same-GPU level.
    pub gpu: u32,
    /// The GPUs this PE claims NVLink and P2P to: an index into the topology's claim sets.
    pub claims: u32,
    /// The multi-node NVLink domain (NVML fabric cluster UUID and clique), or [`NO_GROUP`]: PEs in
    /// one domain on different hosts are NVLink apart. On one host the node's own link discovery
    /// decides, so a pair without peer access is never NVLink there.
    pub nvlink_domain: u32,
    /// The host: same-node level.
    pub host: u32,
    /// The rack, or [`NO_GROUP`].
    pub rack: u32,
    /// The leaf switch, or [`NO_GROUP`].
    pub leaf: u32,
    /// The cluster: spine level (every PE has one; unknown placements share one).
    pub cluster: u32,
}

/// The GPUs one PE claims to reach: NVLink peers, and P2P peers (over NVLink or PCIe).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClaimSet {
    /// GPU ids reached over NVLink.
    pub nvlink: Vec<u32>,
    /// GPU ids reached peer-to-peer; the NVLink ones are added when the topology is built.
    pub p2p: Vec<u32>,
}

impl ClaimSet {
    /// Sorted, without repeats, and with the NVLink GPUs in the P2P set too (the form the
    /// topology stores and interns).
    pub fn normalised(mut self) -> Self {
        self.nvlink.sort_unstable();
        self.nvlink.dedup();
        self.p2p.extend_from_slice(&self.nvlink);
        self.p2p.sort_unstable();
        self.p2p.dedup();
        self
    }
}

/// Every PE's coordinates and claim sets, with an epoch and a content hash.
///
/// The epoch counts changes: a router that is handed a new topology with a different hash gives
/// it the next epoch. The hash identifies the content across runs, so two runs that print the
/// same hash saw the same topology.
#[derive(Clone, Debug)]
pub struct Topology {
    coords: Vec<PeCoord>,
    /// Claim set `c` is `claim_gpus[start..start + nvlink]` (NVLink, sorted) followed by
    /// `claim_gpus[start + nvlink..start + nvlink + p2p]` (P2P including NVLink, sorted), with
    /// `claim_spans[c] = [start, nvlink, p2p]`.
    claim_spans: Vec<[u32; 3]>,
    claim_gpus: Vec<u32>,
    epoch: u64,
    hash: u64,
}

impl Topology {
    /// A topology from every PE's coordinates (`coords[i]` is PE `i`) and the claim sets they
    /// index, at epoch 1. Claim sets are sorted and their P2P sets made to include their NVLink
    /// sets; a coordinate naming a missing claim set, or no PEs, is an error.
    pub fn from_parts(coords: Vec<PeCoord>, claims: Vec<ClaimSet>) -> Result<Self, RouteError> {
        if coords.is_empty() {
            return Err(RouteError::InvalidTopology("no PEs".into()));
        }
        if coords.len() >= NO_GROUP as usize || claims.len() >= NO_GROUP as usize {
            return Err(RouteError::InvalidTopology(format!("{} PEs is more than this router supports", coords.len())));
        }
        if let Some((pe, c)) = coords.iter().enumerate().find(|(_, c)| c.claims as usize >= claims.len()) {
            return Err(RouteError::InvalidTopology(format!("PE {pe} names claim set {}, but there are only {}", c.claims, claims.len())));
        }
        let mut claim_spans = Vec::with_capacity(claims.len());
        let mut claim_gpus = Vec::new();
        for c in claims {
            let c = c.normalised();
            let too_many = || RouteError::InvalidTopology("a claim set is too large".into());
            let start = u32::try_from(claim_gpus.len()).map_err(|_| too_many())?;
            let nv = u32::try_from(c.nvlink.len()).map_err(|_| too_many())?;
            let pp = u32::try_from(c.p2p.len()).map_err(|_| too_many())?;
            claim_spans.push([start, nv, pp]);
            claim_gpus.extend_from_slice(&c.nvlink);
            claim_gpus.extend_from_slice(&c.p2p);
        }
        let mut coords = coords;
        coords.shrink_to_fit();
        claim_gpus.shrink_to_fit();
        let mut t = Self { coords, claim_spans, claim_gpus, epoch: 1, hash: 0 };
        t.hash = t.compute_hash();
        Ok(t)
    }

    /// How many PEs.
    pub fn n_pes(&self) -> usize {
        self.coords.len()
    }

    /// The change counter (starts at 1).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A 64-bit hash of the content (FNV-1a over the coordinates and claim sets, then mixed):
    /// equal topologies hash equal.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The hash as 16 hex digits, as printed in logs.
    pub fn hash_hex(&self) -> String {
        format!("{:016x}", self.hash)
    }

    /// PE `pe`'s coordinates.
    pub fn coord(&self, pe: usize) -> Result<&PeCoord, RouteError> {
        self.coords.get(pe).ok_or(RouteError::PeOutOfRange { pe, n_pes: self.n_pes() })
    }

    fn claims(&self, c: u32) -> (&[u32], &[u32]) {
        let [start, nv, pp] = self.claim_spans[c as usize].map(|v| v as usize);
        (&self.claim_gpus[start..start + nv], &self.claim_gpus[start + nv..start + nv + pp])
    }

    /// The nearest level at which PE `x`'s bitmap holds PE `y` (x's view, which `y` may not
    /// share): same GPU, then a GPU `x` claims NVLink to (or one NVLink domain, across hosts), one `x` claims
    /// P2P to, the same host, rack, leaf, cluster; cross-cluster otherwise.
    pub fn placed(&self, x: usize, y: usize) -> Result<DistanceLevel, RouteError> {
        let (cx, cy) = (self.coord(x)?, self.coord(y)?);
        let same = |a: u32, b: u32| a != NO_GROUP && a == b;
        let (nvlink, p2p) = self.claims(cx.claims);
        Ok(if x == y || cx.gpu == cy.gpu {
            DistanceLevel::SameGpu
        } else if nvlink.binary_search(&cy.gpu).is_ok() || (same(cx.nvlink_domain, cy.nvlink_domain) && cx.host != cy.host) {
            DistanceLevel::NvLink
        } else if p2p.binary_search(&cy.gpu).is_ok() {
            DistanceLevel::Pcie
        } else if cx.host == cy.host {
            DistanceLevel::SameNodeNoP2p
        } else if same(cx.rack, cy.rack) {
            DistanceLevel::Rack
        } else if same(cx.leaf, cy.leaf) {
            DistanceLevel::Leaf
        } else if cx.cluster == cy.cluster {
            DistanceLevel::Spine
        } else {
            DistanceLevel::CrossCluster
        })
    }

    /// PE `pe`'s bitmap at `level`, materialised (n bits; the topology does not store it).
    pub fn bitmap(&self, pe: usize, level: DistanceLevel) -> Result<PeBitmap, RouteError> {
        self.coord(pe)?;
        let mut b = PeBitmap::new(self.n_pes());
        for y in 0..self.n_pes() {
            if self.placed(pe, y)? <= level {
                b.set(y);
            }
        }
        Ok(b)
    }

    /// Sets the epoch (a router continues its own count when it is handed a new topology).
    pub(crate) fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The distance between `a` and `b`; warns (`tracing::warn!`) when a nearer level is claimed
    /// by only one of them.
    pub fn distance(&self, a: usize, b: usize) -> Result<DistanceLevel, RouteError> {
        let info = self.distance_info(a, b)?;
        self.warn_one_sided(a, b, &info);
        Ok(info.level)
    }

    /// Logs the warning for a one-sided claim in `info` (what [`Topology::distance`] does).
    pub fn warn_one_sided(&self, a: usize, b: usize, info: &DistanceInfo) {
        if let Some((claimed, by)) = info.one_sided {
            let other = if by == a { b } else { a };
            tracing::warn!(
                "route: PE {by} places PE {other} within {claimed} but PE {other} does not agree; \
                 using {} (topology {})",
                info.level,
                self.hash_hex()
            );
        }
    }

    /// The distance between `a` and `b` with the level that matched and any one-sided claim, without logging.
    pub fn distance_info(&self, a: usize, b: usize) -> Result<DistanceInfo, RouteError> {
        let (ab, ba) = (self.placed(a, b)?, self.placed(b, a)?);
        // Cumulative bitmaps: both carry the other's bit from the farther of the two levels on.
        let level = ab.max(ba);
        let one_sided = (ab != ba).then(|| if ab < ba { (ab, a) } else { (ba, b) });
        Ok(DistanceInfo { level, hit: Some(level), one_sided })
    }

    /// Heap bytes of the coordinate table and the claim sets.
    pub fn heap_bytes(&self) -> usize {
        self.coords.capacity() * size_of::<PeCoord>()
            + self.claim_spans.capacity() * size_of::<[u32; 3]>()
            + self.claim_gpus.capacity() * size_of::<u32>()
    }

    fn compute_hash(&self) -> u64 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut h = OFFSET ^ self.coords.len() as u64;
        let mut mix = |v: u64| h = (h ^ v).wrapping_mul(PRIME);
        for c in &self.coords {
            for v in [c.gpu, c.claims, c.nvlink_domain, c.host, c.rack, c.leaf, c.cluster] {
                mix(u64::from(v));
            }
        }
        for span in &self.claim_spans {
            mix(u64::from(span[1]) << 32 | u64::from(span[2]));
        }
        for &g in &self.claim_gpus {
            mix(u64::from(g));
        }
        // The splitmix finish spreads the last words' bits, which plain FNV leaves in the low bits.
        h ^= h >> 30;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 27;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} PEs, epoch {}, hash {}", self.n_pes(), self.epoch, self.hash_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(PeBitmap::full(70).count(), 70);
    }

    fn at(gpu: u32, claims: u32, host: u32, rack: u32) -> PeCoord {
        PeCoord { gpu, claims, nvlink_domain: NO_GROUP, host, rack, leaf: NO_GROUP, cluster: 0 }
    }

    #[test]
    fn levels_one_sided_claims_and_materialised_bitmaps() {
        // PEs 0, 1 on host 0 (GPUs 0, 1, NVLink both ways); PE 2 on host 1 (GPU 2) claims NVLink
        // to GPU 0, which does not claim it back; PE 3 on host 2 shares PE 0's rack; PE 4 shares
        // GPU 0.
        let claims = vec![ClaimSet { nvlink: vec![0, 1], p2p: vec![] }, ClaimSet { nvlink: vec![2, 0], p2p: vec![] }, ClaimSet::default()];
        let coords = vec![at(0, 0, 0, 7), at(1, 0, 0, 7), at(2, 1, 1, NO_GROUP), at(3, 2, 2, 7), at(0, 0, 0, 7)];
        let t = Topology::from_parts(coords, claims).expect("valid");
        assert_eq!(t.distance(0, 1).ok(), Some(DistanceLevel::NvLink));
        assert_eq!(t.distance(0, 4).ok(), Some(DistanceLevel::SameGpu));
        assert_eq!(t.distance(2, 2).ok(), Some(DistanceLevel::SameGpu));
        let info = t.distance_info(0, 2).expect("in range");
        assert_eq!(info.level, DistanceLevel::Spine, "PE 0 places PE 2 only in the cluster");
        assert_eq!(info.one_sided, Some((DistanceLevel::NvLink, 2)));
        assert_eq!(t.distance(0, 3).ok(), Some(DistanceLevel::Rack));
        assert!(t.distance(0, 5).is_err());
        // Materialised bitmaps are cumulative.
        let bm = |pe, l| t.bitmap(pe, l).expect("in range").iter().collect::<Vec<_>>();
        assert_eq!(bm(0, DistanceLevel::SameGpu), vec![0, 4]);
        assert_eq!(bm(0, DistanceLevel::NvLink), vec![0, 1, 4]);
        assert_eq!(bm(2, DistanceLevel::NvLink), vec![0, 2, 4]);
        assert_eq!(bm(0, DistanceLevel::Rack), vec![0, 1, 3, 4]);
        assert_eq!(bm(0, DistanceLevel::CrossCluster), vec![0, 1, 2, 3, 4]);
        assert!(Topology::from_parts(vec![at(0, 3, 0, 0)], vec![]).is_err(), "missing claim set");
        assert!(Topology::from_parts(vec![], vec![]).is_err());
    }

    #[test]
    fn hash_follows_content() {
        let one = |rack| Topology::from_parts(vec![at(0, 0, 0, rack), at(1, 0, 1, rack)], vec![ClaimSet::default()]);
        let (a, b, c) = (one(0).expect("valid"), one(0).expect("valid"), one(NO_GROUP).expect("valid"));
        assert_eq!(a.hash(), b.hash());
        assert_ne!(a.hash(), c.hash());
        assert_eq!(a.epoch(), 1);
    }
}
