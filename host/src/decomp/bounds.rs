//! The bounds of a run of positions in one branch-free, vectorized pass: whether every coordinate
//! lies in given bounds, and the lowest and highest coordinate per dimension. The pair search's
//! zone checks run it over each zone's atoms; it is also the reference of the GPU's extent
//! ([`super::GpuExtent`]), which a redecomposition on the GPU makes of the home atoms instead.

use kernels_gpu::abi::Float3;

/// What [`scan`] finds of a run of positions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scan {
    /// Whether every coordinate lies in the bounds (`lo <= v < hi`: false for NaN).
    pub in_range: bool,
    /// The lowest coordinate along each dimension (`inf` without positions).
    pub lo: [f32; 3],
    /// The highest (`-inf` without positions).
    pub hi: [f32; 3],
}

impl Scan {
    /// The scan of no positions.
    pub const EMPTY: Self = Self { in_range: true, lo: [f32::INFINITY; 3], hi: [f32::NEG_INFINITY; 3] };

    /// Whether the bounds along the dimensions of `along` are those of any order of the same
    /// positions, to the bit: no zero bound there (which of `0.0` and `-0.0` a zero bound is
    /// depends on the order, [`scan`]). A pair search's zone checks take a home scan made
    /// elsewhere (on the GPU) only where it is, along the decomposed dimensions.
    pub fn exact_along(&self, along: [bool; 3]) -> bool {
        (0..3).all(|d| !along[d] || (self.lo[d] != 0.0 && self.hi[d] != 0.0))
    }

    /// The scan of two runs one after the other.
    pub fn join(self, other: Self) -> Self {
        Self {
            in_range: self.in_range & other.in_range,
            lo: std::array::from_fn(|d| if other.lo[d] < self.lo[d] { other.lo[d] } else { self.lo[d] }),
            hi: std::array::from_fn(|d| if other.hi[d] > self.hi[d] { other.hi[d] } else { self.hi[d] }),
        }
    }
}

/// Positions per block of [`scan`]: 4 (12 lanes) keeps the three lane arrays in the 16 vector
/// registers of the baseline x86-64 target; 8 spilled them and made the scan 2.2x slower (90,000
/// positions: 43 against 97 µs on the build machine).
const SCAN_BLOCK: usize = 4;

/// Whether every coordinate of `positions` lies in `lo..hi` (per dimension, `lo <= v < hi`), and
/// their lowest and highest coordinates per dimension, in one branch-free pass: four
/// positions at a time, each lane of the block (one coordinate of one position) keeping its own
/// out-of-range word (a `u32`: it vectorizes better than a `bool`), minimum and maximum, so that
/// the compiler vectorizes the loop; the lanes of a dimension are folded at the end. A minimum or
/// maximum is a value of the coordinates (`v < m` selects; NaN never, and with NaN among them
/// `in_range` is false); which of `0.0` and `-0.0` a zero bound is depends on the order.
pub fn scan(positions: &[Float3], lo: [f32; 3], hi: [f32; 3]) -> Scan {
    const LANES: usize = 3 * SCAN_BLOCK;
    let lo_block: [f32; LANES] = std::array::from_fn(|i| lo[i % 3]);
    let hi_block: [f32; LANES] = std::array::from_fn(|i| hi[i % 3]);
    let (mut ok, mut min, mut max) = ([0u32; LANES], [f32::INFINITY; LANES], [f32::NEG_INFINITY; LANES]);
    let coords: &[f32] = bytemuck::cast_slice(positions);
    let blocks = coords.chunks_exact(LANES);
    // The rest is a whole number of positions: its lanes are the same dimensions.
    let rest = blocks.remainder();
    let mut lane = |i: usize, v: f32| {
        ok[i] |= u32::from(!((v >= lo_block[i]) & (v < hi_block[i])));
        min[i] = if v < min[i] { v } else { min[i] };
        max[i] = if v > max[i] { v } else { max[i] };
    };
    for c in blocks {
        // Always a whole block (`chunks_exact`): a fixed length, unrolled and vectorized.
        if let Ok(c) = <&[f32; LANES]>::try_from(c) {
            (0..LANES).for_each(|i| lane(i, c[i]));
        }
    }
    rest.iter().enumerate().for_each(|(i, &v)| lane(i, v));
    let mut s = Scan { in_range: ok.iter().fold(0, |a, &o| a | o) == 0, ..Scan::EMPTY };
    for i in 0..LANES {
        let d = i % 3;
        s.lo[d] = if min[i] < s.lo[d] { min[i] } else { s.lo[d] };
        s.hi[d] = if max[i] > s.hi[d] { max[i] } else { s.hi[d] };
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The scan position by position.
    fn naive(positions: &[Float3], lo: [f32; 3], hi: [f32; 3]) -> Scan {
        let mut s = Scan::EMPTY;
        for p in positions {
            for (d, v) in [p.x, p.y, p.z].into_iter().enumerate() {
                s.in_range &= v >= lo[d] && v < hi[d];
                if v < s.lo[d] {
                    s.lo[d] = v;
                }
                if v > s.hi[d] {
                    s.hi[d] = v;
                }
            }
        }
        s
    }

    fn random(rng: &mut rand_chacha::ChaCha8Rng, n: usize, edge: f32) -> Vec<Float3> {
        (0..n).map(|_| Float3::new(rng.random_range(0.0..edge), rng.random_range(0.0..edge), rng.random_range(0.0..edge))).collect()
    }

    #[test]
    fn the_scan_is_the_position_by_position_scan() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (lo, hi) = ([0.0; 3], [5.0, 6.0, 7.0]);
        for n in [0, 1, 7, 8, 9, 23, 24, 25, 1000, 4095, 4096, 4097, 10_001] {
            let mut p = random(&mut rng, n, 5.0);
            assert_eq!(scan(&p, lo, hi), naive(&p, lo, hi), "{n} positions");
            if n > 0 {
                // One bad coordinate anywhere, in any dimension and of any kind, is seen.
                for (bad, d) in [(f32::NAN, 0), (-1e-7, 1), (7.0, 2), (f32::INFINITY, 0), (f32::NEG_INFINITY, 2)] {
                    let k = rng.random_range(0..n);
                    let keep = p[k];
                    match d {
                        0 => p[k].x = bad,
                        1 => p[k].y = bad,
                        _ => p[k].z = bad,
                    }
                    let s = scan(&p, lo, hi);
                    assert!(!s.in_range, "{n} positions, {bad} at {k} along {d}");
                    if !bad.is_nan() {
                        assert_eq!(s, naive(&p, lo, hi), "{n} positions, {bad} at {k}");
                    }
                    p[k] = keep;
                }
            }
        }
    }
}
