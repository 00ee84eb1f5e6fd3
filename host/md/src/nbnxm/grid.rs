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

/// Orders `(key, atom)` by key, ties by atom index (deterministic).
fn by_key(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
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

    /// Column index along `d` (0 = x, 1 = y) of coordinate `v`, clamped into the grid.
    pub fn column_index(&self, d: usize, v: f32) -> usize {
        let c = ((v - self.extent.lo[d]) / self.cell[d]).floor();
        if c <= 0.0 { 0 } else { (c as usize).min(self.columns[d] - 1) }
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
                g.add_zone(zone as u8, members, atoms);
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

    fn add_zone(&mut self, zone: u8, members: &[u32], atoms: &LocalAtoms) {
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

        // Counting sort into columns, then z order within each.
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
        let mut order: Vec<(f32, u32)> = vec![(0.0, 0); members.len()];
        for (&i, &c) in members.iter().zip(&column_of) {
            order[fill[c as usize]] = (pos[i as usize].z, i);
            fill[c as usize] += 1;
        }
        for c in 0..ncol {
            let col = &mut order[start[c]..start[c + 1]];
            col.sort_unstable_by(by_key);
            grid.column_start.push(self.super_bbox.len() as u32);
            for chunk in col.chunks_mut(SS) {
                self.add_supercluster(zone, chunk, atoms);
            }
        }
        grid.column_start.push(self.super_bbox.len() as u32);
        self.zones.push(grid);
    }

    /// One supercluster from a z-sorted chunk of at most 64 atoms: halves by z, quarters by y,
    /// eighths by x (see the module docs).
    fn add_supercluster(&mut self, zone: u8, chunk: &mut [(f32, u32)], atoms: &LocalAtoms) {
        let pos = &atoms.positions;
        let sc = self.super_bbox.len();
        self.atom_index.resize((sc + 1) * SS, NBNXM_FILLER);
        self.atom_type.resize((sc + 1) * SS, 0);
        let mut sbox = BBox::EMPTY;
        let (zlo, zhi) = chunk.split_at_mut(chunk.len().min(SS / 2));
        for (zh, half) in [zlo, zhi].into_iter().enumerate() {
            for e in half.iter_mut() {
                e.0 = pos[e.1 as usize].y;
            }
            half.sort_unstable_by(by_key);
            let (ylo, yhi) = half.split_at_mut(half.len().min(SS / 4));
            for (yh, quarter) in [ylo, yhi].into_iter().enumerate() {
                for e in quarter.iter_mut() {
                    e.0 = pos[e.1 as usize].x;
                }
                quarter.sort_unstable_by(by_key);
                let (xlo, xhi) = quarter.split_at_mut(quarter.len().min(CL));
                for (xh, cluster) in [xlo, xhi].into_iter().enumerate() {
                    let k = 4 * zh + 2 * yh + xh;
                    let mut cbox = BBox::EMPTY;
                    for (t, e) in cluster.iter().enumerate() {
                        let slot = sc * SS + k * CL + t;
                        let p = pos[e.1 as usize];
                        self.atom_index[slot] = e.1;
                        self.atom_type[slot] = atoms.types[e.1 as usize];
                        cbox.include([p.x, p.y, p.z]);
                    }
                    sbox.union(&cbox);
                    self.cluster_bbox.push(cbox);
                }
            }
        }
        // The loops above push clusters in k order: (zh, yh, xh) = 0..8.
        debug_assert_eq!(self.cluster_bbox.len(), (sc + 1) * SC);
        self.super_bbox.push(sbox);
        self.super_zone.push(zone);
    }
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
    fn box_distance_is_a_lower_bound_and_empty_is_far() {
        let a = BBox { lo: [0.0; 3], hi: [1.0; 3] };
        let b = BBox { lo: [2.0, 0.5, 3.0], hi: [2.5, 0.7, 4.0] };
        assert_eq!(a.distance2(&b), 1.0 + 0.0 + 4.0);
        assert_eq!(a.distance2(&a), 0.0);
        assert_eq!(a.distance2(&BBox::EMPTY), f32::INFINITY);
        assert_eq!(BBox::EMPTY.shifted([1.0; 3]).distance2(&a), f32::INFINITY);
    }
}
