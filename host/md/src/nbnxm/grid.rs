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
use crate::workers::Workers;

const CL: usize = NBNXM_CLUSTER_SIZE as usize;
const SC: usize = NBNXM_CLUSTERS_PER_SUPER as usize;
const SS: usize = NBNXM_SUPER_SIZE as usize;

/// Fewest atoms of a zone per grid thread: starting a thread costs about as much as sorting this
/// many atoms into clusters.
const MIN_ATOMS_PER_THREAD: usize = 2048;

/// A sort key for `(coordinate, atom)`: ascending keys order by the coordinate's total order
/// (`f32::total_cmp`), ties by atom index, so sorting is deterministic; integers sort faster than
/// a comparison of floats.
pub(crate) fn key(v: f32, atom: u32) -> u64 {
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
        for ((lo, hi), v) in self.lo.iter_mut().zip(&mut self.hi).zip(p) {
            *lo = lo.min(v);
            *hi = hi.max(v);
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
    #[inline]
    pub fn column_index(&self, d: usize, v: f32) -> usize {
        column_of(v, self.extent.lo[d], self.cell[d], self.columns[d])
    }
}

/// [`ZoneGrid::column_index`] from the grid's lower edge, column width and column count along
/// the dimension (copies, which a loop keeps in registers).
#[inline]
pub(crate) fn column_of(v: f32, lo: f32, cell: f32, columns: usize) -> usize {
    let c = (v - lo) / cell;
    // Without a branch (it mispredicts for atoms in random columns): the saturating
    // conversion truncates toward zero, sends NaN to 0 and anything below 1 to at most 0.
    ((c as i32).max(0) as usize).min(columns - 1)
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
        Self::build_into(atoms, &Workers::serial(), &mut ZoneScratch::default())
    }

    /// [`Self::build`] on `workers` (the columns of a zone are shared out), with `scratch` for the
    /// working arrays, so that a caller that builds grids again and again reuses their
    /// allocations. The grid depends neither on the workers nor on `scratch`.
    pub fn build_into(atoms: &LocalAtoms, workers: &Workers, scratch: &mut ZoneScratch) -> Result<Self, NbnxmError> {
        atoms.check_types_held()?;
        atoms.check_positions_held()?;
        atoms.validate()?;
        // Each zone's members, ascending: zone `z` holds `by_zone[zone_start[z]..zone_start[z + 1]]`
        // (the scratch's list, taken out while zones are added). Validated: the home atoms (zone
        // 0) come first, every halo atom's zone is 1 to 7.
        let mut by_zone = std::mem::take(&mut scratch.by_zone);
        let halo = &atoms.zones[atoms.home..];
        let mut zone_start = [atoms.home; 9];
        zone_start[0] = 0;
        for &z in halo {
            zone_start[usize::from(z) + 1] += 1;
        }
        for z in 1..8 {
            zone_start[z + 1] += zone_start[z] - atoms.home;
        }
        by_zone.clear();
        by_zone.extend(0..atoms.len() as u32);
        let mut next = zone_start;
        for (i, &z) in halo.iter().enumerate() {
            by_zone[next[usize::from(z)]] = (atoms.home + i) as u32;
            next[usize::from(z)] += 1;
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
        for (zone, w) in zone_start.windows(2).enumerate() {
            if w[1] > w[0] {
                g.add_zone(zone as u8, &by_zone[w[0]..w[1]], atoms, workers, scratch);
            }
        }
        scratch.by_zone = by_zone;
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

    /// Appends the column grid and superclusters of one zone (`members`: its local atoms,
    /// ascending), using `scratch` for the zone's sort keys in column order.
    fn add_zone(&mut self, zone: u8, members: &[u32], atoms: &LocalAtoms, workers: &Workers, scratch: &mut ZoneScratch) {
        let extent = zone_extent(members, atoms);
        let (columns, cell) = column_shape(&extent, members.len());
        let mut grid = ZoneGrid { zone, extent, columns, cell, column_start: Vec::with_capacity(columns[0] * columns[1] + 1) };
        let ncol = columns[0] * columns[1];
        let bins = scratch.sort_into_columns(&grid, members, atoms, workers);
        let start = &scratch.start;
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
        let groups = workers.threads().min(ncol).min(members.len().div_ceil(MIN_ATOMS_PER_THREAD)).max(1);
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
        let ZoneScratch { start, order, bin_start, .. } = scratch;
        let (start, bin_start) = (&*start, &*bin_start);
        let mut work = Vec::with_capacity(bounds.len() - 1);
        {
            let (mut ai, mut at_, mut cb, mut sb) =
                (&mut self.atom_index[sc0 * SS..], &mut self.atom_type[sc0 * SS..], &mut self.cluster_bbox[sc0 * SC..], &mut self.super_bbox[sc0..]);
            let mut ord: &mut [u64] = order;
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
                cut_into_halves(col, start[c], &bin_start[c * bins..=(c + 1) * bins]);
                for chunk in col.chunks(SS) {
                    sb[s] =
                        fill_supercluster(chunk, atoms, &mut ai[s * SS..(s + 1) * SS], &mut at[s * SS..(s + 1) * SS], &mut cb[s * SC..(s + 1) * SC]);
                    s += 1;
                }
            }
        };
        workers.map(work, run);
        self.zones.push(grid);
    }
}

/// The bounding box of a zone's atoms, the whole box along periodic dimensions (only the other
/// dimensions are scanned).
fn zone_extent(members: &[u32], atoms: &LocalAtoms) -> BBox {
    let mut extent = BBox::EMPTY;
    for d in 0..3 {
        if atoms.periodic[d] {
            (extent.lo[d], extent.hi[d]) = (0.0, atoms.box_size[d]);
        } else {
            for &i in members {
                let p = atoms.positions[i as usize];
                let v = [p.x, p.y, p.z][d];
                extent.lo[d] = extent.lo[d].min(v);
                extent.hi[d] = extent.hi[d].max(v);
            }
        }
    }
    extent
}

/// Columns along x and y, and their widths, for a zone of `n` atoms in `extent`: columns holding a
/// whole number of superclusters at the zone's density (cubic ones where the zone is tall). The GPU
/// grid (`gpu_grid.rs`) takes its shape from here too.
pub(crate) fn column_shape(extent: &BBox, n: usize) -> ([usize; 2], [f32; 2]) {
    let size: [f64; 3] = std::array::from_fn(|d| f64::from(extent.hi[d] - extent.lo[d]).max(1e-3));
    let density = n as f64 / (size[0] * size[1] * size[2]);
    let cube = (SS as f64 / density).cbrt();
    let per_column = (size[2] / cube).round().max(1.0);
    let side = (SS as f64 * per_column / (density * size[2])).sqrt();
    let columns: [usize; 2] = std::array::from_fn(|d| ((size[d] / side).round() as usize).clamp(1, 4096));
    let cell: [f32; 2] = std::array::from_fn(|d| (size[d] / columns[d] as f64) as f32);
    (columns, cell)
}

/// Keys per z-bin of a column on average, when a zone's atoms are put in columns ([`ZoneScratch`]):
/// fewer bins cost less to count and sum, more keys per bin more to sort where a half
/// supercluster's boundary cuts a bin.
const KEYS_PER_BIN: usize = 4;

/// One zone's sort keys in column order and, within a column, in bins of z, so that cutting a
/// column into superclusters touches contiguous memory and sorts only a few keys. Kept across
/// zones (and searches) to reuse its allocations.
#[derive(Debug, Default)]
pub struct ZoneScratch {
    /// Local atoms by zone, ascending within each.
    by_zone: Vec<u32>,
    /// Bin (column, then z-bin within it) of every member.
    bin: Vec<u32>,
    /// Start of every bin in column order, and the total (`bins + 1` entries).
    bin_start: Vec<u32>,
    /// Next free place of every bin while scattering.
    next: Vec<u32>,
    /// Start of every column in column order, and the total (`columns + 1` entries).
    start: Vec<usize>,
    /// Sort keys `key(z, atom)` in column order, by bin within a column.
    order: Vec<u64>,
}

impl ZoneScratch {
    /// Counting sort of `members` into the columns of `grid` and, within a column, into
    /// z-bins spread evenly over the zone's z extent: fills `order` with their keys, `bin_start`
    /// with the bins' starts (bin `b` of column `c`, `b < bins`, is bin `c * bins + b`) and
    /// `start` with the column starts (column `c` holds places `start[c]..start[c + 1]`);
    /// returns `bins`, the z-bins per column. The z-bin never decreases as the key grows (each
    /// step of its arithmetic is monotonic; -0 and +0 share one), so all keys of a bin lie
    /// between those of the bins below and above it.
    ///
    /// The bins are computed on `workers` (in parts of at least [`MIN_ATOMS_PER_THREAD`]); the
    /// counting and placing are serial.
    fn sort_into_columns(&mut self, grid: &ZoneGrid, members: &[u32], atoms: &LocalAtoms, workers: &Workers) -> usize {
        let ncol = grid.columns[0] * grid.columns[1];
        let n = members.len();
        let bins = (n / (ncol * KEYS_PER_BIN)).max(1);
        let (lo, hi) = (grid.extent.lo[2], grid.extent.hi[2]);
        // Coordinates are finite and inside the extent (validated), so `z - lo >= 0`; the
        // saturating cast sends NaN (`0 × inf` when `hi == lo`) to 0 and infinity to the top.
        let scale = bins as f32 / (hi - lo);
        let top = bins as u32 - 1;
        let pos = &atoms.positions;
        let ([x0, y0, _], [wx, wy], [nx, ny]) = (grid.extent.lo, grid.cell, grid.columns);
        self.bin_start.clear();
        self.bin_start.resize(ncol * bins + 1, 0);
        self.bin.resize(n, 0);
        let part = n.div_ceil(workers.threads().min(n.div_ceil(MIN_ATOMS_PER_THREAD)).max(1));
        let parts: Vec<_> = self.bin.chunks_mut(part).zip(members.chunks(part)).collect();
        workers.map(parts, |(bin, members)| {
            for (bin, &i) in bin.iter_mut().zip(members) {
                let p = pos[i as usize];
                let c = column_of(p.x, x0, wx, nx) + nx * column_of(p.y, y0, wy, ny);
                *bin = (c * bins) as u32 + (((p.z - lo) * scale) as u32).min(top);
            }
        });
        for &b in &self.bin {
            self.bin_start[b as usize + 1] += 1;
        }
        for b in 0..ncol * bins {
            self.bin_start[b + 1] += self.bin_start[b];
        }
        self.start.clear();
        self.start.extend((0..=ncol).map(|c| self.bin_start[c * bins] as usize));
        self.next.clear();
        self.next.extend_from_slice(&self.bin_start[..ncol * bins]);
        self.order.resize(n, 0);
        for (&i, &b) in members.iter().zip(&self.bin) {
            let j = self.next[b as usize];
            self.next[b as usize] += 1;
            self.order[j as usize] = key(pos[i as usize].z, i);
        }
        bins
    }
}

/// Orders a column's keys (in bins of z, see [`ZoneScratch::sort_into_columns`]) enough that
/// every 32 of them, from the start, are the next 32 by rank, in any order: what sorting them
/// and cutting them into 32s gives as sets, all that [`fill_supercluster`] reads (it sorts each
/// half by y and each quarter by x itself). Only a bin that a cut falls inside is sorted. `from`:
/// the column's first place; `bin_start`: its bins' starts and end (absolute places).
fn cut_into_halves(col: &mut [u64], from: usize, bin_start: &[u32]) {
    let mut sorted_to = 0;
    for cut in (HALF..col.len()).step_by(HALF) {
        // The bin holding place `cut`: the last that starts at or below it.
        let b = bin_start.partition_point(|&s| s as usize <= from + cut) - 1;
        let (lo, hi) = (bin_start[b] as usize - from, bin_start[b + 1] as usize - from);
        if lo < cut && hi > sorted_to {
            sort_few(&mut col[lo..hi]);
            sorted_to = hi;
        }
    }
}

/// Sorts distinct keys: by rank (each key goes to the place of the count of keys below it, with
/// no branch on the keys, which a comparison sort of a few keys mispredicts) up to 64 keys,
/// `sort_unstable` above.
fn sort_few(v: &mut [u64]) {
    const MOST: usize = 64;
    if v.len() > MOST {
        v.sort_unstable();
        return;
    }
    let mut out = [0u64; MOST];
    for &k in v.iter() {
        let rank = v.iter().map(|&o| usize::from(o < k)).sum::<usize>();
        out[rank] = k;
    }
    v.copy_from_slice(&out[..v.len()]);
}

/// A thread's share of a zone: its columns, and their superclusters' slots (atom, type), cluster
/// boxes, supercluster boxes, and the columns' sort keys.
type ColumnWork<'a> = (std::ops::Range<usize>, &'a mut [u32], &'a mut [u32], &'a mut [BBox], &'a mut [BBox], &'a mut [u64]);

/// One supercluster from a chunk of at most 64 keys of atoms, its first 32 the lowest by z (see the
/// module docs: halves by z, quarters by y, eighths by x; the order within a half does not
/// matter), into its 64 slots and 8 cluster boxes; returns its box.
///
/// A half's split by y needs only the set of its 16 lowest keys (each quarter is sorted again by
/// x): the half's two sixteens are sorted by y and the lowest set is `min(a[i], b[15 - i])` (the
/// first step of a bitonic merge). Keys are distinct and below [`PAD`], which fills short halves
/// and quarters and sorts last, so every result is that of sorting the whole half and quarter.
fn fill_supercluster(chunk: &[u64], atoms: &LocalAtoms, atom_index: &mut [u32], atom_type: &mut [u32], cluster_bbox: &mut [BBox]) -> BBox {
    let pos = &atoms.positions;
    // The key of atom `k`'s coordinate `d`, padding kept.
    let rekey = |k: u64, d: usize| {
        if k == PAD {
            PAD
        } else {
            let p = pos[atom_of(k) as usize];
            key([p.x, p.y, p.z][d], atom_of(k))
        }
    };
    let mut sbox = BBox::EMPTY;
    let (zlo, zhi) = chunk.split_at(chunk.len().min(SS / 2));
    for (zh, half) in [zlo, zhi].into_iter().enumerate() {
        let (mut a, mut b) = ([PAD; 16], [PAD; 16]);
        for (t, &k) in half.iter().enumerate() {
            if t < 16 { a[t] = rekey(k, 1) } else { b[t - 16] = rekey(k, 1) }
        }
        sort16(&mut a);
        sort16(&mut b);
        let lower: [u64; 16] = std::array::from_fn(|i| a[i].min(b[15 - i]));
        let upper: [u64; 16] = std::array::from_fn(|i| a[i].max(b[15 - i]));
        let n_lower = half.len().min(SS / 4);
        for (yh, (quarter, n)) in [(lower, n_lower), (upper, half.len() - n_lower)].into_iter().enumerate() {
            let mut x = quarter.map(|k| rekey(k, 0));
            sort16(&mut x);
            let (xlo, xhi) = x[..n].split_at(n.min(CL));
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

/// Keys in a half supercluster.
const HALF: usize = SS / 2;

/// Fills the places a half or quarter does not have; above every [`key`] of a finite coordinate.
const PAD: u64 = u64::MAX;

/// Sorts 16 keys without a branch on their values (a small sort's branches mispredict on random
/// keys). A sorting network of 60 comparators in 10 layers (one a line), checked on every input
/// of zeros and ones in the tests (which proves it sorts anything); written out comparator by
/// comparator, so that the keys stay in registers (a loop over a table of comparators loads and
/// stores both keys of each).
#[inline]
fn sort16(v: &mut [u64; 16]) {
    macro_rules! network {
        ($(($i:literal, $j:literal)),* $(,)?) => {
            $(
                let (a, b) = (v[$i], v[$j]);
                v[$i] = a.min(b);
                v[$j] = a.max(b);
            )*
        };
    }
    #[rustfmt::skip]
    network!(
        (0, 13), (1, 12), (2, 15), (3, 14), (4, 8), (5, 6), (7, 11), (9, 10),
        (0, 5), (1, 7), (2, 9), (3, 4), (6, 13), (8, 14), (10, 15), (11, 12),
        (0, 1), (2, 3), (4, 5), (6, 8), (7, 9), (10, 11), (12, 13), (14, 15),
        (0, 2), (1, 3), (4, 10), (5, 11), (6, 7), (8, 9), (12, 14), (13, 15),
        (1, 2), (3, 12), (4, 6), (5, 7), (8, 10), (9, 11), (13, 14),
        (1, 4), (2, 6), (5, 8), (7, 10), (9, 13), (11, 14),
        (2, 4), (3, 6), (9, 12), (11, 13),
        (3, 5), (6, 8), (7, 9), (10, 12),
        (3, 4), (5, 6), (7, 8), (9, 10), (11, 12),
        (6, 7), (8, 9),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Float3;
    use crate::system::MolecularSystem;
    use proptest::prelude::*;

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
        let mean_edge: f64 =
            g.cluster_bbox.iter().filter(|b| !b.is_empty()).map(|b| (0..3).map(|d| f64::from(b.hi[d] - b.lo[d])).sum::<f64>() / 3.0).sum::<f64>()
                / g.cluster_bbox.iter().filter(|b| !b.is_empty()).count() as f64;
        assert!(mean_edge < 0.8, "mean cluster edge {mean_edge} nm");
    }

    #[test]
    fn the_grid_does_not_depend_on_the_thread_count() {
        let (a, g) = grid_of(6000, 9);
        for t in [2, 3, 7, 64] {
            assert_eq!(ClusterGrid::build_into(&a, &Workers::new(t).unwrap(), &mut ZoneScratch::default()).unwrap(), g, "{t} threads");
        }
        let s = MolecularSystem::generate(6000, 9).unwrap();
        let plan = crate::decomp::HaloPlan::build(&s, crate::decomp::RankGrid::new([2, 2, 1]).unwrap(), 1.2).unwrap();
        let local = LocalAtoms::from_plan(&plan, 1, &s.positions, &s.types).unwrap();
        let one = ClusterGrid::build(&local).unwrap();
        assert!(one.zones.len() > 1);
        assert_eq!(ClusterGrid::build_into(&local, &Workers::new(5).unwrap(), &mut ZoneScratch::default()).unwrap(), one);
    }

    /// The slots of every zone the straightforward way: each column's atoms (by the zone's own
    /// column grid) sorted by `key(z, atom)`, cut into 64s, halves sorted by y, quarters by x.
    fn reference_slots(a: &LocalAtoms, g: &ClusterGrid) -> Vec<u32> {
        let mut slots = Vec::new();
        let by = |v: &mut Vec<u32>, d: usize| {
            v.sort_unstable_by_key(|&i| {
                let p = a.positions[i as usize];
                key([p.x, p.y, p.z][d], i)
            })
        };
        for z in &g.zones {
            let members: Vec<u32> = (0..a.len() as u32).filter(|&i| a.zones[i as usize] == z.zone).collect();
            for c in 0..z.columns[0] * z.columns[1] {
                let mut col: Vec<u32> = members
                    .iter()
                    .copied()
                    .filter(|&i| {
                        let p = a.positions[i as usize];
                        z.column_index(0, p.x) + z.columns[0] * z.column_index(1, p.y) == c
                    })
                    .collect();
                by(&mut col, 2);
                for chunk in col.chunks(SS) {
                    let mut sc = vec![NBNXM_FILLER; SS];
                    for (zh, half) in chunk.chunks(SS / 2).enumerate() {
                        let mut half = half.to_vec();
                        by(&mut half, 1);
                        for (yh, quarter) in half.chunks(SS / 4).enumerate() {
                            let mut quarter = quarter.to_vec();
                            by(&mut quarter, 0);
                            for (xh, cluster) in quarter.chunks(CL).enumerate() {
                                let k = 4 * zh + 2 * yh + xh;
                                sc[k * CL..k * CL + cluster.len()].copy_from_slice(cluster);
                            }
                        }
                    }
                    slots.extend(sc);
                }
            }
        }
        slots
    }

    #[test]
    fn slots_equal_the_straightforward_sort() {
        for (atoms, seed, dims) in [(3000, 5, [1, 1, 1]), (6000, 9, [2, 2, 1]), (8000, 3, [3, 1, 2]), (1500, 4, [2, 1, 1])] {
            let s = MolecularSystem::generate(atoms, seed).unwrap();
            let plan = crate::decomp::HaloPlan::build(&s, crate::decomp::RankGrid::new(dims).unwrap(), 1.1).unwrap();
            for r in [0, plan.ranks.len() - 1] {
                let a = LocalAtoms::from_plan(&plan, r, &s.positions, &s.types).unwrap();
                let g = ClusterGrid::build(&a).unwrap();
                assert_eq!(g.atom_index, reference_slots(&a, &g), "{atoms} atoms, {dims:?}, rank {r}");
            }
        }
    }

    /// Random local atoms, some anywhere in the box, some on a coarse lattice (equal coordinates
    /// in every dimension, atoms on column edges, -0 beside +0 along open dimensions), numbered
    /// in no spatial order, in up to 8 zones, periodic or open along each dimension.
    fn lattice_atoms() -> impl Strategy<Value = LocalAtoms> {
        let atom = (0u32..8, 0u32..8, 0u32..8, 0u8..8, any::<bool>(), [0.0f32..1.0, 0.0f32..1.0, 0.0f32..1.0], 0u32..4);
        (prop::collection::vec(atom, 1..3000), 1u32..8, any::<[bool; 3]>(), 0usize..3, 1.0f32..4.0).prop_map(
            |(mut raw, levels, periodic, halo, edge)| {
                // Home atoms first; the last atoms of the others go to the halo zones.
                let home = raw.len() - raw.len() * halo / 4;
                let box_size = [edge, edge * 0.75, edge * 1.5];
                let step: [f32; 3] = std::array::from_fn(|d| box_size[d] / levels as f32);
                let positions = raw
                    .iter()
                    .map(|&(x, y, z, _, neg, free, lattice)| {
                        let q = [x, y, z];
                        let c: [f32; 3] = std::array::from_fn(|d| {
                            // Each coordinate on the lattice with probability 1/2 (more ties in x
                            // and y than in z when `lattice` is 1).
                            let on = (lattice >> (d / 2)) & 1 == 1;
                            let v = if on { (q[d] % levels) as f32 * step[d] } else { (free[d] * box_size[d]).min(box_size[d].next_down()) };
                            if !periodic[d] && v == 0.0 && neg { -0.0 } else { v }
                        });
                        Float3::new(c[0], c[1], c[2])
                    })
                    .collect();
                for (i, a) in raw.iter_mut().enumerate() {
                    a.3 = if i < home { 0 } else { 1 + a.3 % 7 };
                }
                LocalAtoms {
                    positions,
                    types: raw.iter().map(|a| a.0 % 2).collect(),
                    zones: raw.iter().map(|a| a.3).collect(),
                    home,
                    box_size,
                    periodic,
                    ntypes: 2,
                    types_from: 0,
                    positions_from: 0,
                }
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// The grid on random atoms with many equal coordinates: slots as the straightforward
        /// sort puts them, every cluster box exactly its atoms' box, on any thread count.
        #[test]
        fn grids_of_random_atoms_equal_the_straightforward_sort(a in lattice_atoms()) {
            let g = ClusterGrid::build(&a).unwrap();
            prop_assert_eq!(&g.atom_index, &reference_slots(&a, &g));
            for (c, b) in g.cluster_bbox.iter().enumerate() {
                let mut want = BBox::EMPTY;
                for &i in g.atom_index[c * CL..(c + 1) * CL].iter().filter(|&&i| i != NBNXM_FILLER) {
                    let p = a.positions[i as usize];
                    want.include([p.x, p.y, p.z]);
                }
                prop_assert_eq!(b.lo.map(f32::to_bits), want.lo.map(f32::to_bits));
                prop_assert_eq!(b.hi.map(f32::to_bits), want.hi.map(f32::to_bits));
            }
            let mut scratch = ZoneScratch::default();
            prop_assert_eq!(&ClusterGrid::build_into(&a, &Workers::new(3).unwrap(), &mut scratch).unwrap(), &g);
        }
    }

    proptest! {
        /// Distinct keys, from none to past the rank sort's limit.
        #[test]
        fn a_few_keys_sort_as_sort_unstable_does(keys in prop::collection::hash_set(any::<u64>(), 0..100)) {
            let mut v: Vec<u64> = keys.into_iter().collect();
            let mut want = v.clone();
            want.sort_unstable();
            sort_few(&mut v);
            prop_assert_eq!(v, want);
        }
    }

    #[test]
    fn a_reused_scratch_gives_the_grid_of_a_fresh_one() {
        // Zones of different sizes one after another through one scratch, then the same again.
        let s = MolecularSystem::generate(6000, 2).unwrap();
        let plan = crate::decomp::HaloPlan::build(&s, crate::decomp::RankGrid::new([2, 2, 2]).unwrap(), 1.1).unwrap();
        let a = LocalAtoms::from_plan(&plan, 7, &s.positions, &s.types).unwrap();
        let g = ClusterGrid::build(&a).unwrap();
        assert!(g.zones.len() == 8);
        let (b, _) = grid_of(3000, 1);
        for w in [Workers::serial(), Workers::new(3).unwrap()] {
            let mut scratch = ZoneScratch::default();
            assert_eq!(ClusterGrid::build_into(&a, &w, &mut scratch).unwrap(), g);
            assert_eq!(ClusterGrid::build_into(&b, &w, &mut scratch).unwrap(), ClusterGrid::build(&b).unwrap());
            assert_eq!(ClusterGrid::build_into(&a, &w, &mut scratch).unwrap(), g);
        }
    }

    #[test]
    fn column_indices_equal_the_floor_clamped_into_the_grid() {
        let z = ZoneGrid { zone: 0, extent: BBox { lo: [-1.5, 0.0, 0.0], hi: [3.0; 3] }, columns: [5, 1], cell: [0.7, 3.0], column_start: vec![0] };
        let want = |d: usize, v: f32| {
            let c = (v - z.extent.lo[d]) / z.cell[d];
            if c < 1.0 { 0 } else { (c as usize).min(z.columns[d] - 1) }
        };
        let edges = (0..8).flat_map(|k| {
            let e = -1.5 + 0.7 * k as f32;
            [e.next_down(), e, e.next_up()]
        });
        let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0, 1e30, -1e30, 3e9, -3e9, f32::MIN_POSITIVE];
        for v in edges.chain(special).chain((0..2000).map(|k| -5.0 + k as f32 * 0.0061)) {
            for d in 0..2 {
                assert_eq!(z.column_index(d, v), want(d, v), "{v} along {d}");
            }
        }
    }

    #[test]
    fn the_network_sorts_every_input() {
        // A comparator network that sorts every input of zeros and ones sorts every input.
        for bits in 0u32..1 << 16 {
            let mut v: [u64; 16] = std::array::from_fn(|i| u64::from(bits >> i & 1));
            sort16(&mut v);
            assert!(v.is_sorted(), "{bits:#x}");
        }
        let mut v = [9, 3, u64::MAX, 0, 7, 7, 1, 12, 4, 2, 8, 6, 5, 11, 10, 13];
        let mut want = v;
        want.sort_unstable();
        sort16(&mut v);
        assert_eq!(v, want);
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
