//! The cluster grid: one rank's local atoms sorted into spatial clusters of 8 slots, grouped in
//! superclusters of 8 clusters (64 slots), one column grid per zone.
//!
//! Per zone (home atoms, and each halo zone separately, so no cluster mixes home and halo atoms or
//! two halo zones): the zone's bounding box is cut into columns in x-y, sized so that a column
//! holds a whole number of 64-atom superclusters at the zone's density (cubic ones where the zone
//! is tall, flatter ones in thin halo slabs). Each column's atoms are sorted by z and cut into
//! chunks of 64, one supercluster each; a chunk is split in two by z (32 + rest), each half in two
//! by y (16 + rest), each quarter in two by x (8 + rest), giving 8 compact clusters of at most 8
//! atoms. Slots a cluster does not fill are padding (`NBNXM_FILLER`); clusters a short chunk does
//! not reach are empty (an empty bounding box, never listed).
//!
//! Superclusters are numbered zone by zone (home first), column by column, bottom to top; cluster
//! `c` of supercluster `s` is `8 s + c`, and its slots are `8 (8 s + c) ..`.

use super::{LocalAtoms, NbnxmError};
use crate::abi::{NBNXM_CLUSTER_SIZE, NBNXM_CLUSTERS_PER_SUPER, NBNXM_FILLER, NBNXM_MASK_BITS, NBNXM_SUPER_SIZE};

const CL: usize = NBNXM_CLUSTER_SIZE as usize;
const SC: usize = NBNXM_CLUSTERS_PER_SUPER as usize;
const SS: usize = NBNXM_SUPER_SIZE as usize;

/// Fewest atoms of a zone per grid thread: starting a thread costs about as much as sorting this
/// many atoms into clusters.
const MIN_ATOMS_PER_THREAD: usize = 2048;

/// A sort key for `(coordinate, atom)`: ascending keys order by the coordinate's total order
/// (`f32::total_cmp`), ties by atom index, so sorting is deterministic; integers sort faster than
/// a comparison of floats.
fn key(v: f32, atom: u32) -> u64 {
    let b = v.to_bits();
    let ordered = if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 };
    (u64::from(ordered) << 32) | u64::from(atom)
}

/// The atom of a [`key`].
fn atom_of(k: u64) -> u32 {
    k as u32
}

/// An axis-aligned bounding box; [`BBox::EMPTY`] is at infinite distance from everything.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BBox {
    /// Lower corner (nm).
    pub lo: [f32; 3],
    /// Upper corner (nm).
    pub hi: [f32; 3],
}

impl BBox {
    /// The box of no point.
    pub const EMPTY: BBox = BBox { lo: [f32::INFINITY; 3], hi: [f32::NEG_INFINITY; 3] };

    /// Whether it holds no point.
    pub fn is_empty(&self) -> bool {
        self.lo[0] > self.hi[0]
    }

    /// Grows the box to hold `p`.
    pub fn include(&mut self, p: [f32; 3]) {
        for d in 0..3 {
            self.lo[d] = self.lo[d].min(p[d]);
            self.hi[d] = self.hi[d].max(p[d]);
        }
    }

    /// Grows the box to hold `o`.
    pub fn union(&mut self, o: &BBox) {
        for d in 0..3 {
            self.lo[d] = self.lo[d].min(o.lo[d]);
            self.hi[d] = self.hi[d].max(o.hi[d]);
        }
    }

    /// The box moved by `s`.
    pub fn shifted(&self, s: [f32; 3]) -> BBox {
        BBox { lo: std::array::from_fn(|d| self.lo[d] + s[d]), hi: std::array::from_fn(|d| self.hi[d] + s[d]) }
    }

    /// Squared distance between the closest points of two boxes (0 when they overlap, infinite
    /// when either is empty). Never larger than the squared distance of any two points inside.
    pub fn distance2(&self, o: &BBox) -> f32 {
        let mut s = 0.0;
        for d in 0..3 {
            let g = (self.lo[d] - o.hi[d]).max(o.lo[d] - self.hi[d]).max(0.0);
            s += g * g;
        }
        s
    }
}

/// The column grid of one zone.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneGrid {
    /// The zone (0 = home).
    pub zone: u8,
    /// Bounding box of the zone's atoms (the whole box along periodic dimensions).
    pub extent: BBox,
    /// Columns along x and y.
    pub columns: [usize; 2],
    /// Column widths along x and y (nm).
    pub cell: [f32; 2],
    /// Superclusters of column `cx + columns[0] * cy`: `column_start[c]..column_start[c + 1]`
    /// (global supercluster indices, ascending z).
    pub column_start: Vec<u32>,
}

impl ZoneGrid {
    /// The zone's superclusters.
    pub fn superclusters(&self) -> std::ops::Range<usize> {
        self.column_start[0] as usize..self.column_start[self.column_start.len() - 1] as usize
    }

    /// Column index along `d` (0 = x, 1 = y) of coordinate `v`: `floor((v - lo) / cell)`, clamped
    /// into the grid. Truncation equals `floor` for `c >= 1`, every `c < 1` (and NaN) gives 0;
    /// the GPU search computes it the same way.
    pub fn column_index(&self, d: usize, v: f32) -> usize {
        let c = (v - self.extent.lo[d]) / self.cell[d];
        if c < 1.0 { 0 } else { (c as usize).min(self.columns[d] - 1) }
    }
}

/// One rank's atoms in clusters (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterGrid {
    /// Local atom index of every slot, `NBNXM_FILLER` for padding (`64 × superclusters` entries).
    pub atom_index: Vec<u32>,
    /// Atom type of every slot (0 for padding).
    pub atom_type: Vec<u32>,
    /// Bounding box of every cluster ([`BBox::EMPTY`] for an empty one).
    pub cluster_bbox: Vec<BBox>,
    /// Bounding box of every supercluster.
    pub super_bbox: Vec<BBox>,
    /// Zone of every supercluster.
    pub super_zone: Vec<u8>,
    /// The column grid of every zone that has atoms, home zone first.
    pub zones: Vec<ZoneGrid>,
    /// Box edges (nm).
    pub box_size: [f32; 3],
    /// Dimensions searched through periodic images.
    pub periodic: [bool; 3],
    /// Local atoms (home + halo).
    pub atoms: usize,
    /// Home atoms.
    pub home_atoms: usize,
    /// Atom types.
    pub ntypes: usize,
}

impl ClusterGrid {
    /// Sorts `atoms` into clusters.
    pub fn build(atoms: &LocalAtoms) -> Result<Self, NbnxmError> {
        Self::build_with(atoms, 1)
    }

    /// [`Self::build`] on `threads` host threads (the columns of a zone are shared out; the result
    /// does not depend on the thread count).
    pub fn build_with(atoms: &LocalAtoms, threads: usize) -> Result<Self, NbnxmError> {
        atoms.validate()?;
        let mut by_zone: Vec<Vec<u32>> = vec![Vec::new(); 8];
        for (i, &z) in atoms.zones.iter().enumerate() {
            by_zone[usize::from(z)].push(i as u32);
        }
        let mut g = ClusterGrid {
            atom_index: Vec::new(),
            atom_type: Vec::new(),
            cluster_bbox: Vec::new(),
            super_bbox: Vec::new(),
            super_zone: Vec::new(),
            zones: Vec::new(),
            box_size: atoms.box_size,
            periodic: atoms.periodic,
            atoms: atoms.len(),
            home_atoms: atoms.home,
            ntypes: atoms.ntypes,
        };
        for (zone, members) in by_zone.iter().enumerate() {
            if !members.is_empty() {
                g.add_zone(zone as u8, members, atoms, threads.max(1));
            }
        }
        let max = 1usize << (32 - NBNXM_MASK_BITS);
        if g.clusters() > max {
            return Err(NbnxmError::TooManyClusters { clusters: g.clusters(), max });
        }
        Ok(g)
    }

    /// Number of superclusters.
    pub fn superclusters(&self) -> usize {
        self.super_bbox.len()
    }

    /// Number of clusters (empty ones included).
    pub fn clusters(&self) -> usize {
        self.cluster_bbox.len()
    }

    /// Superclusters of home atoms: `0..home_superclusters()`.
    pub fn home_superclusters(&self) -> usize {
        self.zones.first().filter(|z| z.zone == 0).map_or(0, |z| z.superclusters().end)
    }

    fn add_zone(&mut self, zone: u8, members: &[u32], atoms: &LocalAtoms, threads: usize) {
        let pos = &atoms.positions;
        let mut extent = BBox::EMPTY;
        for &i in members {
            let p = pos[i as usize];
            extent.include([p.x, p.y, p.z]);
        }
        for d in 0..3 {
            if atoms.periodic[d] {
                extent.lo[d] = 0.0;
                extent.hi[d] = atoms.box_size[d];
            }
        }
        // Columns holding a whole number of superclusters at the zone's density.
        let size: [f64; 3] = std::array::from_fn(|d| f64::from(extent.hi[d] - extent.lo[d]).max(1e-3));
        let n = members.len() as f64;
        let density = n / (size[0] * size[1] * size[2]);
        let cube = (SS as f64 / density).cbrt();
        let per_column = (size[2] / cube).round().max(1.0);
        let side = (SS as f64 * per_column / (density * size[2])).sqrt();
        let columns: [usize; 2] = std::array::from_fn(|d| ((size[d] / side).round() as usize).clamp(1, 4096));
        let cell: [f32; 2] = std::array::from_fn(|d| (size[d] / columns[d] as f64) as f32);
        let mut grid = ZoneGrid { zone, extent, columns, cell, column_start: Vec::with_capacity(columns[0] * columns[1] + 1) };

        // Counting sort into columns (keys by z), then each column sorted and cut into superclusters.
        let ncol = columns[0] * columns[1];
        let column_of: Vec<u32> = members
            .iter()
            .map(|&i| {
                let p = pos[i as usize];
                (grid.column_index(0, p.x) + columns[0] * grid.column_index(1, p.y)) as u32
            })
            .collect();
        let mut start = vec![0usize; ncol + 1];
        for &c in &column_of {
            start[c as usize + 1] += 1;
        }
        for c in 0..ncol {
            start[c + 1] += start[c];
        }
        let mut fill = start.clone();
        let mut order = vec![0u64; members.len()];
        for (&i, &c) in members.iter().zip(&column_of) {
            order[fill[c as usize]] = key(pos[i as usize].z, i);
            fill[c as usize] += 1;
        }
        // Superclusters: a column of m atoms has ceil(m / 64), numbered column by column.
        let sc0 = self.super_bbox.len();
        let mut at = sc0;
        for c in 0..ncol {
            grid.column_start.push(at as u32);
            at += (start[c + 1] - start[c]).div_ceil(SS);
        }
        grid.column_start.push(at as u32);
        let total = at;
        self.atom_index.resize(total * SS, NBNXM_FILLER);
        self.atom_type.resize(total * SS, 0);
        self.cluster_bbox.resize(total * SC, BBox::EMPTY);
        self.super_bbox.resize(total, BBox::EMPTY);
        self.super_zone.resize(total, zone);
        // Columns in contiguous groups of about equal atom counts, one group per thread; each
        // group writes only its own superclusters' slots. A thread only pays for itself with a
        // couple of thousand atoms (a thin halo zone gets few).
        let groups = threads.min(ncol).min(members.len().div_ceil(MIN_ATOMS_PER_THREAD)).max(1);
        let mut bounds = vec![0usize];
        for g in 1..groups {
            let want = members.len() * g / groups;
            let c = start.partition_point(|&s| s < want).min(ncol);
            if c > *bounds.last().unwrap_or(&0) {
                bounds.push(c);
            }
        }
        if *bounds.last().unwrap_or(&0) < ncol {
            bounds.push(ncol);
        }
        let column_start = &grid.column_start;
        let mut work = Vec::with_capacity(bounds.len() - 1);
        {
            let (mut ai, mut at_, mut cb, mut sb) = (
                &mut self.atom_index[sc0 * SS..],
                &mut self.atom_type[sc0 * SS..],
                &mut self.cluster_bbox[sc0 * SC..],
                &mut self.super_bbox[sc0..],
            );
            let mut ord: &mut [u64] = &mut order;
            for w in bounds.windows(2) {
                let (c0, c1) = (w[0], w[1]);
                let scs = (column_start[c1] - column_start[c0]) as usize;
                let (a, rest) = std::mem::take(&mut ai).split_at_mut(scs * SS);
                ai = rest;
                let (t, rest) = std::mem::take(&mut at_).split_at_mut(scs * SS);
                at_ = rest;
                let (b, rest) = std::mem::take(&mut cb).split_at_mut(scs * SC);
                cb = rest;
                let (sbox, rest) = std::mem::take(&mut sb).split_at_mut(scs);
                sb = rest;
                let (o, rest) = std::mem::take(&mut ord).split_at_mut(start[c1] - start[c0]);
                ord = rest;
                work.push((c0..c1, a, t, b, sbox, o));
            }
        }
        let run = |(cols, ai, at, cb, sb, ord): ColumnWork<'_>| {
            let (mut s, mut o) = (0usize, 0usize);
            for c in cols {
                let len = start[c + 1] - start[c];
                let col = &mut ord[o..o + len];
                o += len;
                col.sort_unstable();
                for chunk in col.chunks_mut(SS) {
                    sb[s] = fill_supercluster(chunk, atoms, &mut ai[s * SS..(s + 1) * SS], &mut at[s * SS..(s + 1) * SS], &mut cb[s * SC..(s + 1) * SC]);
                    s += 1;
                }
            }
        };
        if work.len() == 1 {
            work.into_iter().for_each(run);
        } else {
            std::thread::scope(|scope| {
                for w in work {
                    scope.spawn(move || run(w));
                }
            });
        }
        self.zones.push(grid);
    }
}

/// A thread's share of a zone: its columns, and their superclusters' slots (atom, type), cluster
/// boxes, supercluster boxes, and the columns' sort keys.
type ColumnWork<'a> = (std::ops::Range<usize>, &'a mut [u32], &'a mut [u32], &'a mut [BBox], &'a mut [BBox], &'a mut [u64]);

/// One supercluster from a z-sorted chunk of at most 64 atom keys (see the module docs: halves by
/// z, quarters by y, eighths by x) into its 64 slots and 8 cluster boxes; returns its box.
fn fill_supercluster(chunk: &mut [u64], atoms: &LocalAtoms, atom_index: &mut [u32], atom_type: &mut [u32], cluster_bbox: &mut [BBox]) -> BBox {
    let pos = &atoms.positions;
    let mut sbox = BBox::EMPTY;
    let (zlo, zhi) = chunk.split_at_mut(chunk.len().min(SS / 2));
    for (zh, half) in [zlo, zhi].into_iter().enumerate() {
        for e in half.iter_mut() {
            *e = key(pos[atom_of(*e) as usize].y, atom_of(*e));
        }
        half.sort_unstable();
        let (ylo, yhi) = half.split_at_mut(half.len().min(SS / 4));
        for (yh, quarter) in [ylo, yhi].into_iter().enumerate() {
            for e in quarter.iter_mut() {
                *e = key(pos[atom_of(*e) as usize].x, atom_of(*e));
            }
            quarter.sort_unstable();
            let (xlo, xhi) = quarter.split_at_mut(quarter.len().min(CL));
            for (xh, cluster) in [xlo, xhi].into_iter().enumerate() {
                let k = 4 * zh + 2 * yh + xh;
                let mut cbox = BBox::EMPTY;
                for (t, e) in cluster.iter().enumerate() {
                    let i = atom_of(*e);
                    let p = pos[i as usize];
                    atom_index[k * CL + t] = i;
                    atom_type[k * CL + t] = atoms.types[i as usize];
                    cbox.include([p.x, p.y, p.z]);
                }
                sbox.union(&cbox);
                cluster_bbox[k] = cbox;
            }
        }
    }
    sbox
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::MolecularSystem;

    fn grid_of(atoms: usize, seed: u64) -> (LocalAtoms, ClusterGrid) {
        let s = MolecularSystem::generate(atoms, seed).unwrap();
        let types: Vec<u32> = s.types.iter().map(|&t| u32::from(t)).collect();
        let a = LocalAtoms::single_rank(&s.positions, &types, 2, s.box_size).unwrap();
        let g = ClusterGrid::build(&a).unwrap();
        (a, g)
    }

    #[test]
    fn every_atom_sits_in_exactly_one_slot_inside_its_cluster_box() {
        for (atoms, seed) in [(1, 1), (7, 2), (64, 3), (65, 4), (3000, 5)] {
            let (a, g) = grid_of(atoms, seed);
            let mut seen = vec![0u32; a.len()];
            for (slot, &i) in g.atom_index.iter().enumerate() {
                if i == NBNXM_FILLER {
                    assert_eq!(g.atom_type[slot], 0);
                    continue;
                }
                seen[i as usize] += 1;
                assert_eq!(g.atom_type[slot], a.types[i as usize]);
                let p = a.positions[i as usize];
                let b = g.cluster_bbox[slot / CL];
                let q = [p.x, p.y, p.z];
                assert!((0..3).all(|d| b.lo[d] <= q[d] && q[d] <= b.hi[d]), "{atoms}: slot {slot}");
                let sb = g.super_bbox[slot / SS];
                assert!((0..3).all(|d| sb.lo[d] <= q[d] && q[d] <= sb.hi[d]));
            }
            assert!(seen.iter().all(|&c| c == 1), "{atoms}: every atom once");
            assert_eq!(g.atom_index.len(), g.superclusters() * SS);
            // Filled slots come first in every cluster; empty clusters have empty boxes.
            for c in 0..g.clusters() {
                let slots = &g.atom_index[c * CL..(c + 1) * CL];
                let n = slots.iter().take_while(|&&i| i != NBNXM_FILLER).count();
                assert!(slots[n..].iter().all(|&i| i == NBNXM_FILLER));
                assert_eq!(n == 0, g.cluster_bbox[c].is_empty());
            }
            assert_eq!(g.home_superclusters(), g.superclusters());
        }
    }

    #[test]
    fn clusters_are_compact_and_mostly_full() {
        let (a, g) = grid_of(6000, 7);
        let filled = g.atom_index.iter().filter(|&&i| i != NBNXM_FILLER).count();
        assert_eq!(filled, a.len());
        let fill = filled as f64 / g.atom_index.len() as f64;
        assert!(fill > 0.75, "slots filled {fill}");
        // A cluster of 8 atoms at 100 atoms/nm³ spans about 0.43 nm; allow twice that on average.
        let mean_edge: f64 = g
            .cluster_bbox
            .iter()
            .filter(|b| !b.is_empty())
            .map(|b| (0..3).map(|d| f64::from(b.hi[d] - b.lo[d])).sum::<f64>() / 3.0)
            .sum::<f64>()
            / g.cluster_bbox.iter().filter(|b| !b.is_empty()).count() as f64;
        assert!(mean_edge < 0.8, "mean cluster edge {mean_edge} nm");
    }

    #[test]
    fn the_grid_does_not_depend_on_the_thread_count() {
        let (a, g) = grid_of(6000, 9);
        for t in [2, 3, 7, 64] {
            assert_eq!(ClusterGrid::build_with(&a, t).unwrap(), g, "{t} threads");
        }
        let s = MolecularSystem::generate(6000, 9).unwrap();
        let plan = crate::decomp::HaloPlan::build(&s, crate::decomp::RankGrid::new([2, 2, 1]).unwrap(), 1.2).unwrap();
        let local = LocalAtoms::from_plan(&plan, 1, &s.positions, &s.types).unwrap();
        let one = ClusterGrid::build(&local).unwrap();
        assert!(one.zones.len() > 1);
        assert_eq!(ClusterGrid::build_with(&local, 5).unwrap(), one);
    }

    #[test]
    fn sort_keys_order_like_total_cmp_then_the_atom() {
        let vals = [-2.5f32, -0.0, 0.0, 1e-30, 3.0, f32::INFINITY, f32::NEG_INFINITY, -1e-30];
        for &a in &vals {
            for &b in &vals {
                for (i, j) in [(1u32, 2u32), (2, 1), (5, 5)] {
                    let want = a.total_cmp(&b).then(i.cmp(&j));
                    assert_eq!(key(a, i).cmp(&key(b, j)), want, "{a} {i} vs {b} {j}");
                }
            }
        }
        assert_eq!(atom_of(key(1.5, 77)), 77);
    }

    #[test]
    fn box_distance_is_a_lower_bound_and_empty_is_far() {
        let a = BBox { lo: [0.0; 3], hi: [1.0; 3] };
        let b = BBox { lo: [2.0, 0.5, 3.0], hi: [2.5, 0.7, 4.0] };
        assert_eq!(a.distance2(&b), 1.0 + 0.0 + 4.0);
        assert_eq!(a.distance2(&a), 0.0);
        assert_eq!(a.distance2(&BBox::EMPTY), f32::INFINITY);
        assert_eq!(BBox::EMPTY.shifted([1.0; 3]).distance2(&a), f32::INFINITY);
    }
}
