//! The cluster-pair search: for every i-supercluster and periodic shift, the j-clusters whose
//! bounding box comes within `rlist` of one of its i-clusters' boxes, as a j-list word per
//! j-cluster (`cj << 8 | mask`, bit `k` = i-cluster `k` of the supercluster).
//!
//! Which cluster pairs are listed, so that every atom pair is counted exactly once:
//! - half list: the pair of clusters `ci` (i) and `cj` (j) under shift `s` is listed when
//!   `ci < cj`, or `ci == cj` and `s >= NBNXM_CENTRAL_SHIFT` (its mirror `(cj, ci, -s)` covers
//!   the same atom pairs and is not listed); on `ci == cj` with no shift the kernel counts atom
//!   pairs `ti < tj` only;
//! - ranks: only clusters whose zones share no bit are paired (see [`super::LocalAtoms`]);
//! - home–home pairs go to the local list (computable before the coordinate halo arrives),
//!   everything involving a halo cluster to the non-local list;
//! - shifts only along periodic (not decomposed) dimensions; along decomposed ones the halo
//!   already holds the right images.
//!
//! The box test is conservative (a box distance never exceeds an atom distance), so every atom
//! pair within `rlist` is in the list; the kernels apply the cutoff per atom pair. Long j-lists are
//! split into entries of at most `max_j_per_entry` words so that the GPU gets enough warps.

use super::NbnxmError;
use super::grid::{BBox, ClusterGrid, ZoneScratch};
use super::local::LocalAtoms;
use crate::abi::{NBNXM_CENTRAL_SHIFT, NBNXM_CLUSTERS_PER_SUPER, NBNXM_MASK_BITS, NbnxmEntry, nbnxm_entry_split};
use crate::workers::Workers;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const SC: usize = NBNXM_CLUSTERS_PER_SUPER as usize;
/// Superclusters per unit of work handed to a search thread.
const BLOCK: usize = 8;

/// How to search.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchOptions {
    /// List cutoff (nm): the interaction cutoff plus the Verlet buffer.
    pub rlist: f32,
    /// Longest j-list of one entry (one warp's work).
    pub max_j_per_entry: usize,
    /// Host threads [`PairSearch::build`] starts for its search (1: search on the calling thread);
    /// [`PairSearch::build_into`] uses the workers it is given instead.
    pub threads: usize,
}

impl SearchOptions {
    /// The longest j-list of one entry by default ([`Self::new`]'s, the GPU search's).
    pub const MAX_J_PER_ENTRY: usize = 32;

    /// `rlist` with [`Self::MAX_J_PER_ENTRY`] j-clusters per entry and one thread per core (at
    /// most 16; the cores counted once per process: `available_parallelism` reads the cgroup's
    /// quota files on every call, tens of microseconds, and a search step makes options at every
    /// search).
    pub fn new(rlist: f32) -> Self {
        static CORES: OnceLock<usize> = OnceLock::new();
        let threads = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(16));
        Self { rlist, max_j_per_entry: Self::MAX_J_PER_ENTRY, threads }
    }
}

/// A cluster-pair list as the kernels read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterPairList {
    /// i-entries (supercluster, shift, range of `j_list`).
    pub entries: Vec<NbnxmEntry>,
    /// j-list words: `cj << NBNXM_MASK_BITS | mask`.
    pub j_list: Vec<u32>,
}

impl ClusterPairList {
    /// Whether the list has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Listed (i-cluster, j-cluster) pairs: set mask bits.
    pub fn cluster_pairs(&self) -> usize {
        self.j_list.iter().map(|w| (w & ((1 << NBNXM_MASK_BITS) - 1)).count_ones() as usize).sum()
    }

    fn append(&mut self, mut o: ClusterPairList) {
        let base = self.j_list.len() as u32;
        for e in &mut o.entries {
            e.j_start += base;
            e.j_end += base;
        }
        self.entries.extend_from_slice(&o.entries);
        self.j_list.extend_from_slice(&o.j_list);
    }

    /// Appends `words` for (`sci`, `shift`) as entries of at most `max_j` words, evenly split.
    fn push(&mut self, sci: usize, shift: u32, words: &[u32], max_j: usize) {
        self.entries.extend(split_entries(sci as u32, shift, self.j_list.len() as u32, words.len() as u32, max_j));
        self.j_list.extend_from_slice(words);
    }
}

/// The entries of `count` words of (`sci`, `shift`) starting at word `start`: at most `max_j`
/// words each, split evenly (the GPU search lays its lists out the same way).
pub(crate) fn split_entries(sci: u32, shift: u32, start: u32, count: u32, max_j: usize) -> impl Iterator<Item = NbnxmEntry> {
    let [n, size] = nbnxm_entry_split(count, u32::try_from(max_j).unwrap_or(u32::MAX));
    (0..n).map(move |k| {
        let first = k * size;
        NbnxmEntry { sci, shift, j_start: start + first, j_end: start + first + size.min(count - first) }
    })
}

/// The squared list cutoff of the box tests: a hair larger than `rl²`, so that `f32` rounding of
/// the boxes cannot drop a pair at `rl` (the host and the GPU search use this same value).
pub(crate) fn list_cutoff2(rl: f32) -> f32 {
    rl * rl * (1.0 + 1e-5)
}

/// Where the time of one search went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SearchTiming {
    /// Building the cluster grid (binning, sorting, boxes).
    pub grid: Duration,
    /// Building both lists.
    pub lists: Duration,
}

/// One rank's cluster grid and its two cluster-pair lists.
#[derive(Clone, Debug, PartialEq)]
pub struct PairSearch {
    /// The clusters.
    pub grid: ClusterGrid,
    /// Home–home pairs (the local kernel, before the coordinate halo).
    pub local: ClusterPairList,
    /// Pairs with a halo cluster (the non-local kernel, after the coordinate halo).
    pub nonlocal: ClusterPairList,
    /// The list cutoff the lists were built for (nm).
    pub rlist: f32,
    /// Time of each part.
    pub timing: SearchTiming,
}

impl PairSearch {
    /// Sorts `atoms` into clusters and builds both lists, on `opts.threads` threads started for
    /// this one search.
    pub fn build(atoms: &LocalAtoms, opts: &SearchOptions) -> Result<Self, NbnxmError> {
        let workers = Workers::new(opts.threads).map_err(|e| NbnxmError::Setup(e.to_string()))?;
        Self::build_into(atoms, opts, &workers, &mut ZoneScratch::default())
    }

    /// [`Self::build`] on `workers` (not `opts.threads`), with `scratch` for the grid's working
    /// arrays; the same grid and lists for any workers and scratch.
    pub fn build_into(atoms: &LocalAtoms, opts: &SearchOptions, workers: &Workers, scratch: &mut ZoneScratch) -> Result<Self, NbnxmError> {
        if !(opts.rlist.is_finite() && opts.rlist > 0.0) {
            return Err(NbnxmError::Setup(format!("list cutoff {} nm must be positive", opts.rlist)));
        }
        let t0 = Instant::now();
        let grid = ClusterGrid::build_into(atoms, workers, scratch)?;
        let t1 = Instant::now();
        let (local, nonlocal) = search(&grid, opts, workers);
        let timing = SearchTiming { grid: t1 - t0, lists: t1.elapsed() };
        Ok(Self { grid, local, nonlocal, rlist: opts.rlist, timing })
    }
}

/// Every allowed shift: `(index, vector)`, central first.
pub(crate) fn shifts(grid: &ClusterGrid) -> Vec<(u32, [f32; 3])> {
    shifts_of(grid.periodic, grid.box_size)
}

/// [`shifts`] of a grid searched through periodic images along `periodic`, in a box of `box_size`.
pub(crate) fn shifts_of(periodic: [bool; 3], box_size: [f32; 3]) -> Vec<(u32, [f32; 3])> {
    let range = |d: usize| if periodic[d] { vec![0i32, -1, 1] } else { vec![0] };
    let mut out = Vec::new();
    for &sz in &range(2) {
        for &sy in &range(1) {
            for &sx in &range(0) {
                let idx = ((sx + 1) + 3 * (sy + 1) + 9 * (sz + 1)) as u32;
                let s = [sx, sy, sz];
                out.push((idx, std::array::from_fn(|d| s[d] as f32 * box_size[d])));
            }
        }
    }
    out
}

/// Both lists, the superclusters shared out to `workers` in blocks; the blocks' lists are joined
/// in block order, so the result does not depend on the workers or their timing.
fn search(grid: &ClusterGrid, opts: &SearchOptions, workers: &Workers) -> (ClusterPairList, ClusterPairList) {
    let n = grid.superclusters();
    let blocks = n.div_ceil(BLOCK);
    let shifts = shifts(grid);
    let rl = opts.rlist;
    let rl2 = list_cutoff2(rl);
    let run = |b: usize| search_block(grid, &shifts, rl, rl2, opts.max_j_per_entry, b * BLOCK..((b + 1) * BLOCK).min(n));
    let results = workers.map((0..blocks).collect(), run);
    let (mut local, mut nonlocal) = (ClusterPairList::default(), ClusterPairList::default());
    for [l, nl] in results {
        local.append(l);
        nonlocal.append(nl);
    }
    (local, nonlocal)
}

/// Mask bits `k` that the half-list rule allows for i-supercluster == j-supercluster, j-cluster
/// `kj`: `k < kj`, and `k == kj` for shifts at or above the central one.
fn same_super_mask(kj: usize, shift: u32) -> u32 {
    let below = (1u32 << kj) - 1;
    if shift >= NBNXM_CENTRAL_SHIFT { below | (1 << kj) } else { below }
}

fn search_block(
    grid: &ClusterGrid,
    shifts: &[(u32, [f32; 3])],
    rl: f32,
    rl2: f32,
    max_j: usize,
    scis: std::ops::Range<usize>,
) -> [ClusterPairList; 2] {
    let mut out = [ClusterPairList::default(), ClusterPairList::default()];
    let mut words: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    for sci in scis {
        let zi = grid.super_zone[sci];
        let ibox = grid.super_bbox[sci];
        let iclusters = &grid.cluster_bbox[sci * SC..(sci + 1) * SC];
        for &(sidx, s) in shifts {
            let bi = ibox.shifted(s);
            // The i-cluster boxes, shifted, by dimension (the loop over k vectorises).
            let lo: [[f32; SC]; 3] = std::array::from_fn(|d| std::array::from_fn(|k| iclusters[k].lo[d] + s[d]));
            let hi: [[f32; SC]; 3] = std::array::from_fn(|d| std::array::from_fn(|k| iclusters[k].hi[d] + s[d]));
            words[0].clear();
            words[1].clear();
            for zg in &grid.zones {
                let scs = zg.superclusters();
                if zg.zone & zi != 0 || scs.end <= sci {
                    continue;
                }
                let e = &zg.extent;
                if (0..3).any(|d| bi.lo[d] - rl > e.hi[d] || bi.hi[d] + rl < e.lo[d]) {
                    continue;
                }
                let kind = usize::from(zi != 0 || zg.zone != 0);
                let (cx0, cx1) = (zg.column_index(0, bi.lo[0] - rl), zg.column_index(0, bi.hi[0] + rl));
                let (cy0, cy1) = (zg.column_index(1, bi.lo[1] - rl), zg.column_index(1, bi.hi[1] + rl));
                let (zmin, zmax) = (bi.lo[2] - rl, bi.hi[2] + rl);
                for cy in cy0..=cy1 {
                    for cx in cx0..=cx1 {
                        let c = cx + zg.columns[0] * cy;
                        let (a, b) = (zg.column_start[c] as usize, zg.column_start[c + 1] as usize);
                        let first = a + grid.super_bbox[a..b].partition_point(|sb| sb.hi[2] < zmin);
                        for scj in first.max(sci)..b {
                            let sb = &grid.super_bbox[scj];
                            if sb.lo[2] > zmax {
                                break;
                            }
                            if bi.distance2(sb) >= rl2 {
                                continue;
                            }
                            for kj in 0..SC {
                                let cj = scj * SC + kj;
                                let cb = &grid.cluster_bbox[cj];
                                if bi.distance2(cb) >= rl2 {
                                    continue;
                                }
                                let mut mask = cluster_mask(&lo, &hi, cb, rl2);
                                if scj == sci {
                                    mask &= same_super_mask(kj, sidx);
                                }
                                if mask != 0 {
                                    words[kind].push(((cj as u32) << NBNXM_MASK_BITS) | mask);
                                }
                            }
                        }
                    }
                }
            }
            out[0].push(sci, sidx, &words[0], max_j);
            out[1].push(sci, sidx, &words[1], max_j);
        }
    }
    out
}

/// Bit `k` set when i-cluster box `k` (by dimension in `lo`, `hi`) is within `rl2` of `cb`.
#[inline]
fn cluster_mask(lo: &[[f32; SC]; 3], hi: &[[f32; SC]; 3], cb: &BBox, rl2: f32) -> u32 {
    let mut d2 = [0.0f32; SC];
    for d in 0..3 {
        for k in 0..SC {
            let g = (lo[d][k] - cb.hi[d]).max(cb.lo[d] - hi[d][k]).max(0.0);
            d2[k] += g * g;
        }
    }
    let mut mask = 0;
    for (k, v) in d2.iter().enumerate() {
        mask |= u32::from(*v < rl2) << k;
    }
    mask
}
