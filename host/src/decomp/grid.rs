//! The rank grid and the uniform-cell geometry of a decomposition: which rank owns which slab of
//! the box, and how many pulses the cutoff needs along each dimension.

use super::PlanError;
use kernels_gpu::abi::Float3;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Names of the three dimensions, for messages.
pub const DIM_NAMES: [&str; 3] = ["x", "y", "z"];

/// Largest rank count a grid may have (PE ids are `i32` on the device; this is far below).
pub const MAX_RANKS: usize = 1 << 20;

/// A grid of `A x B x C` ranks. Rank numbers run x fastest: `rank = x + A * (y + B * z)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RankGrid {
    /// Ranks along x, y and z (each at least 1).
    pub dims: [usize; 3],
}

impl RankGrid {
    /// A grid with `dims` ranks along x, y, z; every count must be at least 1.
    pub fn new(dims: [usize; 3]) -> Result<Self, PlanError> {
        let bad = |reason: String| PlanError::BadGrid { input: format!("{}x{}x{}", dims[0], dims[1], dims[2]), reason };
        if dims.contains(&0) {
            return Err(bad("every count must be at least 1".into()));
        }
        let total = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        match total {
            Some(t) if t <= MAX_RANKS => Ok(Self { dims }),
            _ => Err(bad(format!("more than {MAX_RANKS} ranks"))),
        }
    }

    /// Parses `"AxBxC"` (for example `"2x2x1"`; `X` works too).
    pub fn parse(text: &str) -> Result<Self, PlanError> {
        let bad = |reason: &str| PlanError::BadGrid { input: text.to_string(), reason: reason.to_string() };
        let parts: Vec<&str> = text.trim().split(['x', 'X']).collect();
        if parts.len() != 3 {
            return Err(bad("expected three counts separated by 'x'"));
        }
        let mut dims = [0usize; 3];
        for (d, p) in dims.iter_mut().zip(&parts) {
            *d = p.trim().parse().map_err(|_| bad("each count must be a whole number"))?;
        }
        Self::new(dims).map_err(|e| match e {
            PlanError::BadGrid { reason, .. } => PlanError::BadGrid { input: text.to_string(), reason },
            other => other,
        })
    }

    /// Total number of ranks.
    pub fn num_ranks(&self) -> usize {
        self.dims.iter().product()
    }

    /// The rank at grid coordinates `c` (each below the matching count).
    #[inline]
    pub fn rank_of(&self, c: [usize; 3]) -> usize {
        c[0] + self.dims[0] * (c[1] + self.dims[1] * c[2])
    }

    /// Grid coordinates of `rank`.
    #[inline]
    pub fn coords_of(&self, rank: usize) -> [usize; 3] {
        let [a, b, _] = self.dims;
        [rank % a, (rank / a) % b, rank / (a * b)]
    }

    /// The periodic neighbour of `rank` `delta` steps along `dim`.
    pub fn neighbour(&self, rank: usize, dim: usize, delta: isize) -> usize {
        let mut c = self.coords_of(rank);
        let n = self.dims[dim] as isize;
        c[dim] = (c[dim] as isize + delta).rem_euclid(n) as usize;
        self.rank_of(c)
    }

    /// Dimensions that are decomposed (more than one rank), in communication order x, y, z.
    pub fn decomposed_dims(&self) -> Vec<usize> {
        (0..3).filter(|&d| self.dims[d] > 1).collect()
    }
}

impl FromStr for RankGrid {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, PlanError> {
        Self::parse(s)
    }
}

impl fmt::Display for RankGrid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}", self.dims[0], self.dims[1], self.dims[2])
    }
}

/// The smallest pulse count `np` with `cell_width * np >= cutoff` (at least 1).
pub fn pulses_needed(cell_width: f64, cutoff: f64) -> usize {
    let mut np = ((cutoff / cell_width).ceil() as usize).max(1);
    // ceil() of a rounded quotient can be one off either way; settle it on the product itself.
    while cell_width * (np as f64) < cutoff {
        np += 1;
    }
    while np > 1 && cell_width * ((np - 1) as f64) >= cutoff {
        np -= 1;
    }
    np
}

/// `p` wrapped into `[0, box)` along every dimension, in `f32`. Positions already inside the box
/// come back bit for bit. Every module wraps through this one function, so home-cell assignment,
/// the coordinate reference and the pair search all see the same numbers.
#[inline]
pub fn wrap_position(p: Float3, box_size: [f32; 3]) -> Float3 {
    #[inline]
    fn wrap(x: f32, l: f32) -> f32 {
        if (0.0..l).contains(&x) {
            return x;
        }
        let mut v = x - l * (x / l).floor();
        if v >= l {
            v -= l;
        }
        if v < 0.0 {
            v += l;
        }
        // Rounding can still land on the edge; the origin is the same point of the torus.
        if (0.0..l).contains(&v) { v } else { 0.0 }
    }
    // The common case, a point inside the box, with one branch instead of three.
    if inside(p, box_size) {
        return p;
    }
    Float3::new(wrap(p.x, box_size[0]), wrap(p.y, box_size[1]), wrap(p.z, box_size[2]))
}

/// Whether `p` lies in `[0, box)` along every dimension (false for NaN), without branches.
#[inline]
fn inside(p: Float3, box_size: [f32; 3]) -> bool {
    (p.x >= 0.0) & (p.x < box_size[0]) & (p.y >= 0.0) & (p.y < box_size[1]) & (p.z >= 0.0) & (p.z < box_size[2])
}

/// Every position wrapped into the box in place ([`wrap_position`] of each): a branch-free check
/// first, so that positions already inside the box (most searches of an MD run, which wrap at
/// every search) cost one read.
pub fn wrap_positions(positions: &mut [Float3], box_size: [f32; 3]) {
    if !positions.iter().fold(true, |ok, &p| ok & inside(p, box_size)) {
        positions.iter_mut().for_each(|p| *p = wrap_position(*p, box_size));
    }
}

/// The geometry of a uniform decomposition: grid, box, cutoff and pulses per dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct Decomposition {
    /// The rank grid.
    pub grid: RankGrid,
    /// Box edges (nm), rectangular and periodic.
    pub box_size: [f32; 3],
    /// Interaction cutoff (nm).
    pub cutoff: f32,
    /// Pulses along x, y, z (0 along a dimension with a single rank).
    pub pulses: [usize; 3],
}

impl Decomposition {
    /// Checks the inputs and works out the pulses per dimension.
    ///
    /// Errors: a non-positive cutoff or box edge, a cutoff not below half a box edge (the minimum
    /// image must be unique), or a dimension whose pulse count reaches its rank count.
    pub fn new(grid: RankGrid, box_size: [f32; 3], cutoff: f32) -> Result<Self, PlanError> {
        if !(cutoff.is_finite() && cutoff > 0.0) {
            return Err(PlanError::BadCutoff { cutoff });
        }
        if !box_size.iter().all(|l| l.is_finite() && *l > 0.0) {
            return Err(PlanError::BadBox { box_size });
        }
        let rc = f64::from(cutoff);
        for d in 0..3 {
            let half = f64::from(box_size[d]) / 2.0;
            if rc >= half {
                return Err(PlanError::CutoffTooLarge { cutoff, dim: DIM_NAMES[d], half });
            }
        }
        let mut pulses = [0; 3];
        for d in grid.decomposed_dims() {
            let n = grid.dims[d];
            let cell = f64::from(box_size[d]) / n as f64;
            let np = pulses_needed(cell, rc);
            if np >= n {
                let max_ranks = (1..n).rev().find(|&m| pulses_needed(f64::from(box_size[d]) / m as f64, rc) < m).unwrap_or(1);
                return Err(PlanError::TooManyRanks { dim: DIM_NAMES[d], ranks: n, cell, cutoff, pulses: np, max_ranks });
            }
            pulses[d] = np;
        }
        Ok(Self { grid, box_size, cutoff, pulses })
    }

    /// Cell width along `dim` (nm).
    pub fn cell_width(&self, dim: usize) -> f64 {
        f64::from(self.box_size[dim]) / self.grid.dims[dim] as f64
    }

    /// Cell index along `dim` of a wrapped coordinate `x`: `floor(x n / L)`, clamped to the grid.
    #[inline]
    pub fn cell_index(&self, dim: usize, x: f64) -> usize {
        let n = self.grid.dims[dim];
        let c = x * n as f64 / f64::from(self.box_size[dim]);
        // Truncation is `floor` for c > 0 (and NaN becomes 0 either way); without SSE4.1 `floor`
        // is a library call, and this runs for every atom at every search.
        if c <= 0.0 { 0 } else { (c as usize).min(n - 1) }
    }

    /// The smallest non-negative `f32` whose cell along `dim` is `i` or above (`0 < i < n`):
    /// for a non-negative `f32` coordinate `x`, `cell_index(dim, x) >= i` exactly when
    /// `x >= cell_threshold(dim, i)`, since `cell_index` never decreases as `x` grows and
    /// non-negative floats are ordered as their bits. A comparison with it replaces a division
    /// per atom where `f32` coordinates are placed in cells.
    pub fn cell_threshold(&self, dim: usize, i: usize) -> f32 {
        // Cell 0 at 0, the last cell at infinity.
        let at = |bits: u32| self.cell_index(dim, f64::from(f32::from_bits(bits))) >= i;
        let (mut below, mut above) = (0u32, f32::INFINITY.to_bits());
        while above - below > 1 {
            let mid = below + (above - below) / 2;
            if at(mid) { above = mid } else { below = mid }
        }
        f32::from_bits(above)
    }

    /// Grid coordinates of the cell holding a wrapped position.
    #[inline]
    pub fn cell_of(&self, p: [f64; 3]) -> [usize; 3] {
        [self.cell_index(0, p[0]), self.cell_index(1, p[1]), self.cell_index(2, p[2])]
    }

    /// Lower edge of cell `cell` along `dim` (nm).
    pub fn lower(&self, dim: usize, cell: usize) -> f64 {
        cell as f64 * f64::from(self.box_size[dim]) / self.grid.dims[dim] as f64
    }

    /// Upper edge of cell `cell` along `dim` (nm).
    pub fn upper(&self, dim: usize, cell: usize) -> f64 {
        self.lower(dim, cell + 1)
    }

    /// `(dim, pulse_in_dim)` of every pulse, flattened dim-major in communication order.
    pub fn pulse_layout(&self) -> Vec<(usize, usize)> {
        (0..3).flat_map(|d| (0..self.pulses[d]).map(move |p| (d, p))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_grids() {
        let g = RankGrid::parse("2x3X1").unwrap();
        assert_eq!(g.dims, [2, 3, 1]);
        assert_eq!(g.to_string(), "2x3x1");
        assert_eq!(g.num_ranks(), 6);
        for bad in ["", "2x2", "2x0x1", "axbxc", "2x2x2x2", "-1x1x1"] {
            let e = RankGrid::parse(bad).unwrap_err();
            assert!(matches!(e, PlanError::BadGrid { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("2x2x1"), "message names the form: {e}");
        }
    }

    #[test]
    fn ranks_and_neighbours_wrap() {
        let g = RankGrid::new([3, 2, 2]).unwrap();
        for r in 0..g.num_ranks() {
            assert_eq!(g.rank_of(g.coords_of(r)), r);
        }
        assert_eq!(g.neighbour(0, 0, -1), 2);
        assert_eq!(g.neighbour(2, 0, 1), 0);
        assert_eq!(g.neighbour(0, 2, 1), 6);
        assert_eq!(g.decomposed_dims(), vec![0, 1, 2]);
        assert_eq!(RankGrid::new([1, 4, 1]).unwrap().decomposed_dims(), vec![1]);
    }

    #[test]
    fn pulses_are_the_smallest_count_that_covers_the_cutoff() {
        assert_eq!(pulses_needed(1.0, 1.0), 1);
        assert_eq!(pulses_needed(1.0, 0.3), 1);
        assert_eq!(pulses_needed(1.0, 1.0001), 2);
        assert_eq!(pulses_needed(0.5, 1.2), 3);
        let d = Decomposition::new(RankGrid::new([3, 1, 4]).unwrap(), [3.0, 3.0, 4.0], 1.2).unwrap();
        assert_eq!(d.pulses, [2, 0, 2]);
        assert_eq!(d.pulse_layout(), vec![(0, 0), (0, 1), (2, 0), (2, 1)]);
    }

    #[test]
    fn rejects_bad_geometry_with_a_fix() {
        let g = RankGrid::new([2, 1, 1]).unwrap();
        let e = Decomposition::new(g, [4.0; 3], 2.0).unwrap_err();
        assert!(matches!(e, PlanError::CutoffTooLarge { .. }));
        assert!(e.to_string().contains("below 2.0000 nm"), "{e}");
        assert!(matches!(Decomposition::new(g, [4.0; 3], 0.0), Err(PlanError::BadCutoff { .. })));
        assert!(matches!(Decomposition::new(g, [4.0; 3], f32::NAN), Err(PlanError::BadCutoff { .. })));
        assert!(matches!(Decomposition::new(g, [4.0, -1.0, 4.0], 1.0), Err(PlanError::BadBox { .. })));
    }

    #[test]
    fn wrapping_keeps_inside_points_and_folds_the_rest() {
        let b = [2.0, 3.0, 4.0];
        let p = Float3::new(0.5, 2.999, 0.0);
        assert_eq!(wrap_position(p, b), p);
        let w = wrap_position(Float3::new(-0.5, 3.5, 8.25), b);
        assert_eq!(w, Float3::new(1.5, 0.5, 0.25));
        let tiny = wrap_position(Float3::new(-1e-9, 0.0, 0.0), b);
        assert!((0.0..2.0).contains(&tiny.x));
        // In place, all at once: the same as one by one, with or without a point outside.
        let mut all = vec![p, Float3::new(-0.0, 1.0, 3.999), Float3::new(1.0, 2.0, 3.0)];
        let want: Vec<Float3> = all.iter().map(|&q| wrap_position(q, b)).collect();
        wrap_positions(&mut all, b);
        assert_eq!(
            all.iter().map(|q| [q.x.to_bits(), q.y.to_bits(), q.z.to_bits()]).collect::<Vec<_>>(),
            want.iter().map(|q| [q.x.to_bits(), q.y.to_bits(), q.z.to_bits()]).collect::<Vec<_>>()
        );
        for outside in [Float3::new(-0.5, 3.5, 8.25), Float3::new(2.0, 0.0, 0.0), Float3::new(f32::NAN, 0.0, 0.0)] {
            let mut all = vec![p, outside, Float3::new(1.0, 2.0, 3.0)];
            let want: Vec<Float3> = all.iter().map(|&q| wrap_position(q, b)).collect();
            wrap_positions(&mut all, b);
            assert_eq!(all, want, "{outside:?}");
        }
    }

    #[test]
    fn cells_cover_the_box() {
        let d = Decomposition::new(RankGrid::new([3, 1, 1]).unwrap(), [3.0, 3.0, 3.0], 1.0).unwrap();
        assert_eq!(d.cell_index(0, 0.0), 0);
        assert_eq!(d.cell_index(0, 0.999), 0);
        assert_eq!(d.cell_index(0, 1.0), 1);
        assert_eq!(d.cell_index(0, 2.9999), 2);
        assert_eq!(d.cell_index(1, 2.9999), 0);
        assert_eq!(d.upper(0, 2), 3.0);
    }

    #[test]
    fn cell_thresholds_split_coordinates_as_cell_index_does() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for (dims, edge) in [([2, 1, 1], 5.848_035_3), ([3, 2, 1], 7.0), ([4, 3, 5], 3.3), ([7, 2, 2], 10.123_457)] {
            let d = Decomposition::new(RankGrid::new(dims).unwrap(), [edge; 3], 0.5).unwrap();
            for dim in (0..3).filter(|&e| dims[e] > 1) {
                let t: Vec<f32> = (1..dims[dim]).map(|i| d.cell_threshold(dim, i)).collect();
                let by_threshold = |x: f32| t.iter().filter(|&&e| x >= e).count();
                // Around every threshold, bit by bit, and random coordinates anywhere in the box.
                let near = t.iter().flat_map(|e| (-3i32..=3).map(move |k| f32::from_bits(e.to_bits().wrapping_add_signed(k))));
                let random = (0..2000).map(|_| rng.random_range(0.0..edge));
                for x in near.chain(random).chain([0.0, -0.0, edge, f32::from_bits(edge.to_bits() - 1)]) {
                    assert_eq!(by_threshold(x), d.cell_index(dim, f64::from(x)), "{dims:?} dim {dim} at {x:e}");
                }
            }
        }
    }
}
