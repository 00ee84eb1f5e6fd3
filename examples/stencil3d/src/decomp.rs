//! The stencil's domain decomposition, written as halo pulses.
//!
//! A periodic grid of `NX x NY x NZ` cells is cut into blocks over a rank grid `A x B x C` (block
//! decomposition: along a dimension of `N` cells over `R` ranks, rank coordinate `c` owns cells
//! `[c N / R, (c + 1) N / R)`, so sizes differ by at most one). Ranks are numbered x fastest:
//! `r = cx + A (cy + B cz)`.
//!
//! Rank `r`'s local array is its interior cells (x fastest: `x + lx (y + ly z)`), then the ghost
//! cells, appended pulse by pulse. Per decomposed dimension (`R > 1`), in the order x, y, z, two
//! pulses:
//!
//! | pulse | sends | to | receives (into) | from |
//! |---|---|---|---|---|
//! | *down* | the lower face (`c = 0`) | the lower neighbour | the upper ghost plane | the upper neighbour |
//! | *up* | the upper face (`c = l - 1`) | the upper neighbour | the lower ghost plane | the lower neighbour |
//!
//! With two ranks along a dimension both pulses go to the same rank, which is fine: they land in
//! different ghost planes. A dimension with one rank is periodic inside the rank: its neighbours
//! wrap around locally and it has no pulse. A 7-point stencil reads faces only, never edges or
//! corners, so no pulse forwards what an earlier pulse received.
//!
//! A face is ordered by its two other coordinates, lower dimension fastest; sender and receiver
//! agree because neighbours along `d` own the same range in the other two dimensions.

use halo::exchange::{PulseSpec, RankHalo};
use halo::{HaloError, Result};

/// Neighbour directions in the order of a neighbour-table row (and of the stencil's sum).
pub const DIRECTIONS: [(usize, i64); 6] = [(0, -1), (0, 1), (1, -1), (1, 1), (2, -1), (2, 1)];

/// One rank's block of the global grid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// The rank's coordinates in the rank grid.
    pub coords: [usize; 3],
    /// First global cell along each dimension.
    pub start: [usize; 3],
    /// Cells along each dimension.
    pub extent: [usize; 3],
}

impl Block {
    /// Interior cells.
    pub fn cells(&self) -> usize {
        self.extent.iter().product()
    }

    /// Local index of the interior cell with local coordinates `c`.
    pub fn local_index(&self, c: [usize; 3]) -> usize {
        c[0] + self.extent[0] * (c[1] + self.extent[1] * c[2])
    }

    /// Local coordinates of interior cell `i`.
    pub fn local_coords(&self, i: usize) -> [usize; 3] {
        let [lx, ly, _] = self.extent;
        [i % lx, (i / lx) % ly, i / (lx * ly)]
    }

    /// Cells in a face normal to dimension `d`.
    pub fn face_cells(&self, d: usize) -> usize {
        let (a, b) = other_dims(d);
        self.extent[a] * self.extent[b]
    }

    /// Position of the cell with local coordinates `c` inside a face normal to `d`.
    pub fn face_index(&self, c: [usize; 3], d: usize) -> usize {
        let (a, b) = other_dims(d);
        c[a] + self.extent[a] * c[b]
    }

    /// Local indices of the face normal to `d` at local coordinate `at`, in face order.
    pub fn face(&self, d: usize, at: usize) -> Vec<u32> {
        let (a, b) = other_dims(d);
        let mut out = Vec::with_capacity(self.face_cells(d));
        for vb in 0..self.extent[b] {
            for va in 0..self.extent[a] {
                let mut c = [0; 3];
                c[d] = at;
                c[a] = va;
                c[b] = vb;
                out.push(self.local_index(c) as u32);
            }
        }
        out
    }
}

/// The two dimensions other than `d`, lower first.
fn other_dims(d: usize) -> (usize, usize) {
    match d {
        0 => (1, 2),
        1 => (0, 2),
        _ => (0, 1),
    }
}

/// Which way a pulse sends its face.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The lower face goes to the lower neighbour (and the upper ghost plane is filled).
    Down,
    /// The upper face goes to the upper neighbour (and the lower ghost plane is filled).
    Up,
}

/// The whole decomposition: blocks, every rank's halo and neighbour table.
///
/// ```
/// use stencil3d::decomp::Decomposition;
/// let d = Decomposition::new([8, 6, 5], [2, 1, 1]).unwrap();
/// assert_eq!(d.halos.len(), 2);
/// assert_eq!(d.halos[0].pulses.len(), 2); // x is decomposed: one pulse down, one up
/// assert_eq!(d.halos[0].total_atoms, 4 * 6 * 5 + 2 * 6 * 5); // interior + two ghost planes
/// halo::exchange::spec::validate(&d.halos).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct Decomposition {
    /// Global cells along x, y, z.
    pub grid: [usize; 3],
    /// Ranks along x, y, z.
    pub ranks: [usize; 3],
    /// Rank `r`'s block.
    pub blocks: Vec<Block>,
    /// Pulses in execution order: (dimension, direction), the same for every rank.
    pub pulses: Vec<(usize, Direction)>,
    /// Rank `r`'s halo, ready for the exchange (already checked with `spec::validate`).
    pub halos: Vec<RankHalo>,
    /// Rank `r`'s neighbour table: per interior cell, the local indices of its six neighbours in
    /// the order of [`DIRECTIONS`] (interior or ghost cells).
    pub neighbours: Vec<Vec<[u32; 6]>>,
}

impl Decomposition {
    /// Decomposes `grid` over `ranks`. Every rank must own at least one cell per dimension, and a
    /// rank's local array must be indexable by `u32`.
    pub fn new(grid: [usize; 3], ranks: [usize; 3]) -> Result<Self> {
        for d in 0..3 {
            if grid[d] == 0 || ranks[d] == 0 {
                return Err(HaloError::InvalidInput(format!("grid {grid:?} and rank grid {ranks:?} need positive sizes")));
            }
            if ranks[d] > grid[d] {
                return Err(HaloError::InvalidInput(format!(
                    "{} ranks along {} but only {} cells: every rank needs at least one cell",
                    ranks[d],
                    ["x", "y", "z"][d],
                    grid[d]
                )));
            }
        }
        let nranks = ranks.iter().product::<usize>();
        let blocks: Vec<Block> = (0..nranks)
            .map(|r| {
                let coords = [r % ranks[0], (r / ranks[0]) % ranks[1], r / (ranks[0] * ranks[1])];
                let bound = |d: usize, c: usize| c * grid[d] / ranks[d];
                let start = [bound(0, coords[0]), bound(1, coords[1]), bound(2, coords[2])];
                let extent = [0, 1, 2].map(|d| bound(d, coords[d] + 1) - start[d]);
                Block { coords, start, extent }
            })
            .collect();
        let pulses: Vec<(usize, Direction)> = (0..3).filter(|&d| ranks[d] > 1).flat_map(|d| [(d, Direction::Down), (d, Direction::Up)]).collect();
        // Where each pulse's received cells start, per rank.
        let offsets: Vec<Vec<usize>> = blocks
            .iter()
            .map(|b| {
                let mut at = b.cells();
                pulses
                    .iter()
                    .map(|&(d, _)| {
                        let o = at;
                        at += b.face_cells(d);
                        o
                    })
                    .collect()
            })
            .collect();
        let mut this = Self { grid, ranks, blocks, pulses, halos: Vec::new(), neighbours: Vec::new() };
        for (r, b) in this.blocks.iter().enumerate() {
            let total = b.cells() + this.pulses.iter().map(|&(d, _)| b.face_cells(d)).sum::<usize>();
            if total > u32::MAX as usize {
                return Err(HaloError::InvalidInput(format!("rank {r} holds {total} cells, more than u32 indices reach")));
            }
            let specs = this
                .pulses
                .iter()
                .enumerate()
                .map(|(p, &(d, dir))| {
                    let (to, from, at) = match dir {
                        Direction::Down => (this.neighbour_rank(r, d, -1), this.neighbour_rank(r, d, 1), 0),
                        Direction::Up => (this.neighbour_rank(r, d, 1), this.neighbour_rank(r, d, -1), b.extent[d] - 1),
                    };
                    PulseSpec {
                        send_rank: to,
                        recv_rank: from,
                        index_map: b.face(d, at),
                        recv_size: b.face_cells(d),
                        atom_offset: offsets[r][p],
                        peer_atom_offset: offsets[to][p],
                        shift: None,
                        accumulate_forces: true,
                    }
                })
                .collect();
            this.halos.push(RankHalo { home_atoms: b.cells(), total_atoms: total, pulses: specs });
        }
        this.neighbours = (0..nranks).map(|r| this.neighbour_table(r, &offsets[r])).collect();
        halo::exchange::spec::validate(&this.halos)?;
        Ok(this)
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.blocks.len()
    }

    /// Total cells of the global grid.
    pub fn global_cells(&self) -> usize {
        self.grid.iter().product()
    }

    /// The rank at rank-grid coordinates `c`.
    pub fn rank_at(&self, c: [usize; 3]) -> usize {
        c[0] + self.ranks[0] * (c[1] + self.ranks[1] * c[2])
    }

    /// Rank `r`'s neighbour along dimension `d` in direction `step` (periodic).
    pub fn neighbour_rank(&self, r: usize, d: usize, step: i64) -> usize {
        let mut c = self.blocks[r].coords;
        c[d] = (c[d] as i64 + step).rem_euclid(self.ranks[d] as i64) as usize;
        self.rank_at(c)
    }

    /// Index into the global grid (x fastest) of cell `(x, y, z)`.
    pub fn global_index(&self, c: [usize; 3]) -> usize {
        c[0] + self.grid[0] * (c[1] + self.grid[1] * c[2])
    }

    /// The global index of rank `r`'s interior cell `i`.
    pub fn global_of(&self, r: usize, i: usize) -> usize {
        let b = &self.blocks[r];
        let l = b.local_coords(i);
        self.global_index([0, 1, 2].map(|d| b.start[d] + l[d]))
    }

    /// Each rank's interior values cut out of a global field.
    pub fn scatter<T: Copy>(&self, global: &[T]) -> Vec<Vec<T>> {
        (0..self.nranks()).map(|r| (0..self.blocks[r].cells()).map(|i| global[self.global_of(r, i)]).collect()).collect()
    }

    /// The global field put together from every rank's interior values (`local[r]` may be longer:
    /// ghost cells are ignored).
    pub fn gather<T: Copy + Default>(&self, local: &[Vec<T>]) -> Vec<T> {
        let mut out = vec![T::default(); self.global_cells()];
        for (r, values) in local.iter().enumerate() {
            for (i, v) in values.iter().take(self.blocks[r].cells()).enumerate() {
                out[self.global_of(r, i)] = *v;
            }
        }
        out
    }

    /// Index of the pulse of dimension `d` in direction `dir`, if `d` is decomposed.
    pub fn pulse_index(&self, d: usize, dir: Direction) -> Option<usize> {
        self.pulses.iter().position(|&p| p == (d, dir))
    }

    fn neighbour_table(&self, r: usize, offsets: &[usize]) -> Vec<[u32; 6]> {
        let b = &self.blocks[r];
        (0..b.cells())
            .map(|i| {
                let c = b.local_coords(i);
                DIRECTIONS.map(|(d, step)| {
                    let n = c[d] as i64 + step;
                    let l = b.extent[d] as i64;
                    if (0..l).contains(&n) {
                        let mut m = c;
                        m[d] = n as usize;
                        return b.local_index(m) as u32;
                    }
                    if self.ranks[d] == 1 {
                        let mut m = c;
                        m[d] = n.rem_euclid(l) as usize;
                        return b.local_index(m) as u32;
                    }
                    // Below the block: the lower ghost plane, which the *up* pulse fills (the lower
                    // neighbour sends its upper face). Above: the upper ghost plane, from *down*.
                    let dir = if n < 0 { Direction::Up } else { Direction::Down };
                    // `d` is decomposed (ranks[d] > 1), so both of its pulses exist.
                    let p = self.pulse_index(d, dir).unwrap_or_default();
                    (offsets[p] + b.face_index(c, d)) as u32
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::{self, InitialField, exchange_forward};

    /// 1-D, 2-D and 3-D rank grids; uneven sizes; one, two and three ranks per dimension; blocks
    /// one cell thick; degenerate grids one cell wide.
    const CASES: &[([usize; 3], [usize; 3])] = &[
        ([8, 3, 2], [2, 1, 1]),
        ([7, 5, 3], [3, 1, 1]),
        ([7, 5, 3], [1, 2, 1]),
        ([5, 5, 5], [1, 1, 2]),
        ([9, 7, 5], [2, 3, 1]),
        ([6, 7, 5], [1, 2, 2]),
        ([5, 6, 7], [2, 2, 2]),
        ([7, 8, 9], [3, 2, 2]),
        ([4, 4, 4], [1, 1, 1]),
        ([2, 3, 4], [2, 3, 4]),
        ([6, 1, 1], [2, 1, 1]),
        ([3, 4, 5], [3, 1, 1]),
    ];

    #[test]
    fn every_ghost_cell_is_filled_once_with_the_right_neighbour() {
        for &(grid, ranks) in CASES {
            let d = Decomposition::new(grid, ranks).unwrap();
            // Every cell carries its global index + 1 (0 = never written).
            let mut f: Vec<Vec<u64>> = (0..d.nranks())
                .map(|r| {
                    let mut v: Vec<u64> = (0..d.blocks[r].cells()).map(|i| d.global_of(r, i) as u64 + 1).collect();
                    v.resize(d.halos[r].total_atoms, 0);
                    v
                })
                .collect();
            let writes = exchange_forward(&d.halos, &mut f);
            for r in 0..d.nranks() {
                let (home, total) = (d.halos[r].home_atoms, d.halos[r].total_atoms);
                assert!(writes[r][..home].iter().all(|&w| w == 0), "{grid:?}/{ranks:?} rank {r}: an interior cell was overwritten");
                assert!(writes[r][home..total].iter().all(|&w| w == 1), "{grid:?}/{ranks:?} rank {r}: a ghost cell written {:?}", &writes[r][home..]);
                let b = &d.blocks[r];
                for i in 0..b.cells() {
                    let l = b.local_coords(i);
                    for (k, &(dim, step)) in DIRECTIONS.iter().enumerate() {
                        let mut g = [0, 1, 2].map(|e| b.start[e] + l[e]);
                        g[dim] = (g[dim] as i64 + step).rem_euclid(grid[dim] as i64) as usize;
                        let want = d.global_index(g) as u64 + 1;
                        let got = f[r][d.neighbours[r][i][k] as usize];
                        assert_eq!(got, want, "{grid:?}/{ranks:?} rank {r} cell {l:?} direction {k}");
                    }
                }
            }
            // Ghost cells are exactly what the neighbour tables read: nothing is sent in vain.
            for r in 0..d.nranks() {
                let mut read = vec![false; d.halos[r].total_atoms];
                d.neighbours[r].iter().flatten().for_each(|&j| read[j as usize] = true);
                assert!(read[d.halos[r].home_atoms..].iter().all(|&x| x), "{grid:?}/{ranks:?} rank {r}: an unread ghost cell");
            }
        }
    }

    #[test]
    fn pulses_per_decomposed_dimension_and_layout() {
        for &(grid, ranks) in CASES {
            let d = Decomposition::new(grid, ranks).unwrap();
            let decomposed = ranks.iter().filter(|&&r| r > 1).count();
            assert_eq!(d.pulses.len(), 2 * decomposed);
            assert_eq!(d.blocks.iter().map(Block::cells).sum::<usize>(), d.global_cells());
            for (r, h) in d.halos.iter().enumerate() {
                assert_eq!(h.pulses.len(), 2 * decomposed);
                // Ghosts are appended pulse by pulse, right after the interior.
                let mut at = h.home_atoms;
                for p in &h.pulses {
                    assert_eq!(p.atom_offset, at, "rank {r}");
                    assert!(p.shift.is_none());
                    at += p.recv_size;
                }
                assert_eq!(at, h.total_atoms);
                let extents = &d.blocks[r].extent;
                assert!(
                    extents.iter().zip(&ranks).zip(&grid).all(|((&e, &n), &g)| e == g / n || e == g / n + 1),
                    "block sizes differ by at most one"
                );
            }
        }
    }

    #[test]
    fn decomposed_iterations_match_the_undecomposed_grid_bit_for_bit() {
        for &(grid, ranks) in CASES {
            let d = Decomposition::new(grid, ranks).unwrap();
            for init in [InitialField::Random(3), InitialField::HotSpot] {
                let u0 = init.values(grid);
                let want = reference::run_global(grid, &u0, 0.15, 5);
                let got = d.gather(&reference::run_decomposed(&d, &u0, 0.15, 5));
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{grid:?}/{ranks:?} {init:?}");
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused_with_a_reason() {
        let e = Decomposition::new([4, 4, 4], [5, 1, 1]).unwrap_err().to_string();
        assert!(e.contains("5 ranks along x but only 4 cells"), "{e}");
        assert!(Decomposition::new([0, 4, 4], [1, 1, 1]).is_err());
        assert!(Decomposition::new([4, 4, 4], [1, 0, 1]).is_err());
    }

    #[test]
    fn scatter_then_gather_is_the_identity() {
        let d = Decomposition::new([5, 4, 3], [2, 2, 3]).unwrap();
        let u: Vec<u32> = (0..d.global_cells() as u32).collect();
        assert_eq!(d.gather(&d.scatter(&u)), u);
    }
}
