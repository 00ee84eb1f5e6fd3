//! A pulse's selection over a rank's wrapped positions ([`Frame`]), told for most atoms by integer
//! comparisons of their coordinates' bits: the atoms
//! [`select_for_pulse_into`](super::plan::select_for_pulse_into) sends over the same frame, for
//! any input.
//!
//! Why it is the same. Along one decomposed dimension with bounds `lo..hi`, the exact selection
//! ([`sent`]) adds for an atom the term `t = fl(x * x)`, `x = max(lo - v, v - hi, 0)`, with
//! `v = f64(w) + a` (`w` the wrapped `f32` coordinate, `a` the box edge where the atom crossed
//! along the dimension, else 0), all in `f64`. For a fixed `a` and a threshold `T`:
//! - `t < T` exactly when `fl(max(lo - v, 0)^2) < T` and `fl(max(v - hi, 0)^2) < T` (the larger of
//!   two non-negative numbers squared and rounded is the larger of the two rounded squares). As `w`
//!   grows, `v` never falls (rounding is monotone) and `fl(lo - v)` never grows, so the first is
//!   false and then true, the second true and then false: the `w` with `t < T` are an interval
//!   of `f32`s. Over `[+0, box)`, where floats order as their bits, that is an interval of bit
//!   patterns, whose two ends [`Ranges::new`] finds by bisection on the exact arithmetic.
//! - The exact selection sends an atom when its terms, summed from `0.0` in the order of the
//!   dimensions, are below `rc2`. Rounded addition of a non-negative term never makes a sum
//!   smaller, so the sum is at least each term: a term at or above `rc2` (`T = rc2`) is not sent.
//!   Every term but one 0 (`T` the least positive double) is a sum of that one term (adding 0 to
//!   a sum, or a term to 0, leaves it as it is), so `t < rc2` decides the atom (with one dimension,
//!   every atom).
//! - The rest (every term below `rc2` and two or more above 0: atoms near an edge or corner of
//!   the receiver's cell) go the exact way one by one. So does a whole block (64 atoms) whose
//!   atoms did not all cross along the same of the selection's dimensions (the ranges are picked
//!   per block; home atoms crossed nowhere, and atoms received together crossed alike), or with a
//!   coordinate outside `[+0, box)` (`-0.0`, which the exact way treats as `+0.0`, or anything a
//!   wrapped position never is), so that bits are compared only where they order as the floats.

use super::grid::Decomposition;
use super::plan::{RankFrame, SELECT_BLOCK, append_kept, excess2, pulse_bounds, select, sent};
use super::redecompose::Frame;

/// [`select_for_pulse_into`](super::plan::select_for_pulse_into) over a rank's wrapped positions
/// and crossings: the indices (from `first`, the index of the frame's first atom) of the atoms rank
/// `rank` sends in a pulse along `d`, appended to `map`.
#[allow(clippy::too_many_arguments)]
pub(super) fn select_wrapped_into(
    geo: &Decomposition,
    decomposed: &[usize],
    rank: usize,
    d: usize,
    frame: &Frame<'_>,
    first: usize,
    rc2: f64,
    map: &mut Vec<u32>,
) {
    let b = |e: usize| pulse_bounds(geo, rank, d, e);
    // The dimensions as constants (the coordinates' offsets in a position are then known).
    match *decomposed {
        [0] => select_wrapped::<1, 0, 0, 0>(frame, first, [b(0).0], [b(0).1], rc2, map),
        [1] => select_wrapped::<1, 1, 0, 0>(frame, first, [b(1).0], [b(1).1], rc2, map),
        [2] => select_wrapped::<1, 2, 0, 0>(frame, first, [b(2).0], [b(2).1], rc2, map),
        [0, 1] => select_wrapped::<2, 0, 1, 0>(frame, first, [b(0).0, b(1).0], [b(0).1, b(1).1], rc2, map),
        [0, 2] => select_wrapped::<2, 0, 2, 0>(frame, first, [b(0).0, b(2).0], [b(0).1, b(2).1], rc2, map),
        [1, 2] => select_wrapped::<2, 1, 2, 0>(frame, first, [b(1).0, b(2).0], [b(1).1, b(2).1], rc2, map),
        [0, 1, 2] => select_wrapped::<3, 0, 1, 2>(frame, first, [b(0).0, b(1).0, b(2).0], [b(0).1, b(1).1, b(2).1], rc2, map),
        _ => unreachable!("a pulse runs along a decomposed dimension, and the decomposed ones ascend"),
    }
}

/// Per selected dimension and crossing (0: not crossed, 1: crossed), the bits `(start, width)`
/// of the wrapped coordinates whose term is below `rc2` (`near`) and 0 (`inside`): `w` is in
/// when `w.to_bits() - start < width` (wrapping); and the box edge's bits (`top`).
#[derive(Debug, PartialEq)]
pub(super) struct Ranges<const N: usize> {
    pub(super) near: [[(u32, u32); 2]; N],
    pub(super) inside: [[(u32, u32); 2]; N],
    pub(super) top: [u32; N],
}

impl<const N: usize> Ranges<N> {
    /// The ranges of dimensions `dims` with bounds `lo..hi`, box edges `edge` (`f32`s held as
    /// `f64`s), for `rc2`.
    pub(super) fn new(edge: [f64; 3], dims: [usize; N], lo: [f64; N], hi: [f64; N], rc2: f64) -> Self {
        let top = dims.map(|e| (edge[e] as f32).to_bits());
        let range = |i: usize, crossed: usize, below: f64| {
            let add = if crossed == 1 { edge[dims[i]] } else { 0.0 };
            // The terms of the lower and the upper excess alone, as `excess2` makes them.
            let v = |bits: u32| f64::from(f32::from_bits(bits)) + add;
            let start = first(top[i], |b| excess2(v(b), lo[i], f64::INFINITY) < below);
            let end = first(top[i], |b| excess2(v(b), f64::NEG_INFINITY, hi[i]) >= below);
            (start, end.saturating_sub(start))
        };
        let per_crossing = |below: f64| std::array::from_fn(|i| [range(i, 0, below), range(i, 1, below)]);
        Self { near: per_crossing(rc2), inside: per_crossing(f64::from_bits(1)), top }
    }
}

/// The least bit pattern in `0..top` at which `p` (false, then true over the patterns ascending)
/// holds, `top` where none does.
fn first(top: u32, p: impl Fn(u32) -> bool) -> u32 {
    let (mut below, mut at) = (0u32, top);
    // Invariant: `p` is false under `below` and true from `at` on (or `at == top`).
    while below < at {
        let mid = below + (at - below) / 2;
        if p(mid) { at = mid } else { below = mid + 1 }
    }
    at
}

/// [`select`] over a [`Frame`] by [`Ranges`], block by block, each atom told by its bits alone or
/// (not decided by them) the exact way; the dimensions are `[D0, D1, D2][..N]`.
fn select_wrapped<const N: usize, const D0: usize, const D1: usize, const D2: usize>(
    frame: &Frame<'_>,
    first: usize,
    lo: [f64; N],
    hi: [f64; N],
    rc2: f64,
    map: &mut Vec<u32>,
) {
    let dims: [usize; N] = std::array::from_fn(|i| [D0, D1, D2][i]);
    // A sum of 0 is sent only below a positive `rc2` (never the case, but then the exact way).
    if rc2.is_nan() || rc2 <= 0.0 {
        return select(frame, first, dims, lo, hi, rc2, map);
    }
    let r = Ranges::new(frame.edge, dims, lo, hi, rc2);
    let coords: &[u32] = bytemuck::cast_slice(frame.wrapped);
    let mut buf = [0u32; SELECT_BLOCK];
    for at in (0..frame.len()).step_by(SELECT_BLOCK) {
        let n = SELECT_BLOCK.min(frame.len() - at);
        let (block, crossed) = (&coords[3 * at..3 * (at + n)], &frame.crossed[at..at + n]);
        // The ranges of the block's crossings, where its atoms all crossed along the same of the
        // selection's dimensions (received together, or home atoms, which crossed none).
        let mask = dims.iter().fold(0u8, |m, &e| m | (1 << e));
        let (any, all) = crossed.iter().fold((0u8, u8::MAX), |(any, all), &c| (any | c, all & c));
        let (mut keep, mut unsure, mut outside_box) = ([false; SELECT_BLOCK], [false; SELECT_BLOCK], (any ^ all) & mask != 0);
        let pick = |p: &[[(u32, u32); 2]; N]| -> [(u32, u32); N] { std::array::from_fn(|i| p[i][usize::from((all >> dims[i]) & 1)]) };
        let (near_r, inside_r) = (pick(&r.near), pick(&r.inside));
        for ((keep, unsure), x) in keep.iter_mut().zip(&mut unsure).zip(block.chunks_exact(3)) {
            let (mut near, mut outside) = (true, 0u32);
            for i in 0..N {
                let key = x[dims[i]];
                outside_box |= key >= r.top[i];
                near &= key.wrapping_sub(near_r[i].0) < near_r[i].1;
                outside += u32::from(key.wrapping_sub(inside_r[i].0) >= inside_r[i].1);
            }
            *keep = near & (outside <= 1);
            *unsure = near & (outside > 1);
        }
        if outside_box {
            let part = Frame { wrapped: &frame.wrapped[at..at + n], crossed, edge: frame.edge };
            select(&part, first + at, dims, lo, hi, rc2, map);
            continue;
        }
        if N > 1 && unsure[..n].iter().any(|&u| u) {
            let mut x = [[0.0f64; N]; 1];
            for (k, keep) in keep[..n].iter_mut().enumerate().filter(|&(k, _)| unsure[k]) {
                frame.block(at + k, dims, &mut x);
                *keep = sent(&x[0], lo, hi, rc2);
            }
        }
        append_kept(&keep[..n], (first + at) as u32, &mut buf, map);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decomp::RankGrid;
    use crate::decomp::plan::{select_for_pulse_into, send_range2};
    use kernels_gpu::abi::Float3;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// One dimension's ranges for one crossing, and the exact bounds and shift they stand for.
    struct DimRanges {
        dim: usize,
        near: (u32, u32),
        inside: (u32, u32),
        lo: f64,
        hi: f64,
        add: f64,
    }

    /// Every range of every rank's pulses of `geo` for `rc2`, along every decomposed dimension,
    /// crossed and not.
    fn all_ranges(geo: &Decomposition, rc2: f64) -> Vec<DimRanges> {
        let decomposed = geo.grid.decomposed_dims();
        let edge = geo.box_size.map(f64::from);
        let mut out = vec![];
        for rank in 0..geo.grid.num_ranks() {
            for &d in &decomposed {
                for &e in &decomposed {
                    let (lo, hi) = pulse_bounds(geo, rank, d, e);
                    let r = Ranges::new(edge, [e], [lo], [hi], rc2);
                    for c in 0..2 {
                        let add = if c == 1 { edge[e] } else { 0.0 };
                        out.push(DimRanges { dim: e, near: r.near[0][c], inside: r.inside[0][c], lo, hi, add });
                    }
                }
            }
        }
        out
    }

    /// The bits of every range's ends and their neighbours, per dimension.
    fn range_ends(geo: &Decomposition, rc2: f64) -> Vec<Vec<f32>> {
        let mut ends: Vec<Vec<f32>> = vec![vec![0.0, -0.0, geo.box_size[0].next_down()]; 3];
        ends.iter_mut().enumerate().for_each(|(e, v)| v[2] = geo.box_size[e].next_down());
        for DimRanges { dim: e, near, inside, .. } in all_ranges(geo, rc2) {
            for (start, width) in [near, inside] {
                for b in [start, start + width] {
                    ends[e].extend([b.wrapping_sub(1), b, b + 1].map(f32::from_bits).into_iter().filter(|x| (0.0..geo.box_size[e]).contains(x)));
                }
            }
        }
        ends
    }

    /// A range holds exactly the coordinates whose exact term is below its threshold: at its ends
    /// bit by bit (the atoms exactly at the margin and one bit either side) and at random ones.
    #[test]
    fn ranges_end_where_the_exact_term_crosses_its_threshold() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for (dims, box_size, cutoff) in
            [([2, 1, 1], [7.7f32, 7.7, 7.7], 1.06f32), ([2, 2, 2], [4.3, 3.7, 6.1], 1.1), ([3, 1, 4], [5.1, 4.7, 9.3], 1.0)]
        {
            let geo = Decomposition::new(RankGrid::new(dims).unwrap(), box_size, cutoff).unwrap();
            let rc2 = send_range2(cutoff);
            for DimRanges { dim: e, near, inside, lo, hi, add } in all_ranges(&geo, rc2) {
                let top = box_size[e].to_bits();
                for ((start, width), below) in [(near, rc2), (inside, f64::from_bits(1))] {
                    assert!(start <= top && width <= top - start);
                    let ends = [start, start + width].into_iter().flat_map(|b| (0..5).map(move |k| (b + k).wrapping_sub(2)));
                    for bits in ends.chain((0..200).map(|_| rng.random_range(0..top))).filter(|&b| b < top) {
                        let term = excess2(f64::from(f32::from_bits(bits)) + add, lo, hi);
                        assert_eq!(bits.wrapping_sub(start) < width, term < below, "{dims:?} along {e}: {} ({bits:#x})", f32::from_bits(bits));
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        /// The selection by ranges sends what the exact one sends over the same frame, on any grid,
        /// box and cutoff: coordinates at every range's ends and one bit either side, at 0, -0.0 and
        /// the box's last float, and random; crossings uniform over runs (the ranges' way) and
        /// mixed (the exact way); lengths around the block.
        #[test]
        fn the_selection_by_ranges_is_the_exact_one(
            dims in (1usize..4, 1usize..4, 1usize..4),
            edge in (3.0f32..9.0, 3.0f32..9.0, 3.0f32..9.0),
            cutoff_frac in 0.05f32..0.45,
            len in 0usize..300,
            seed in any::<u64>(),
        ) {
            let box_size = [edge.0, edge.1, edge.2];
            let cutoff = cutoff_frac * box_size.iter().copied().fold(f32::INFINITY, f32::min);
            let Ok(geo) = Decomposition::new(RankGrid::new([dims.0, dims.1, dims.2]).unwrap(), box_size, cutoff) else { return Ok(()) };
            let decomposed = geo.grid.decomposed_dims();
            let rc2 = send_range2(cutoff);
            let ends = range_ends(&geo, rc2);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let wrapped: Vec<Float3> = (0..len)
                .map(|_| {
                    let c: [f32; 3] = std::array::from_fn(|e| {
                        let pick = rng.random_range(0..2 * ends[e].len());
                        ends[e].get(pick).copied().unwrap_or_else(|| rng.random_range(0.0..box_size[e]))
                    });
                    Float3::new(c[0], c[1], c[2])
                })
                .collect();
            let mut crossed = Vec::with_capacity(len);
            while crossed.len() < len {
                let run = rng.random_range(1..100).min(len - crossed.len());
                let c = rng.random_range(0..8u8);
                let mixed = rng.random_range(0..4) == 0;
                crossed.extend((0..run).map(|_| if mixed { rng.random_range(0..8u8) } else { c }));
            }
            let frame = Frame { wrapped: &wrapped, crossed: &crossed, edge: box_size.map(f64::from) };
            for rank in 0..geo.grid.num_ranks() {
                for &d in &decomposed {
                    let (mut want, mut got) = (vec![], vec![3]);
                    select_for_pulse_into(&geo, &decomposed, rank, d, &frame, 7, rc2, &mut want);
                    select_wrapped_into(&geo, &decomposed, rank, d, &frame, 7, rc2, &mut got);
                    prop_assert_eq!(&got[1..], &want[..], "rank {} along {}", rank, d);
                }
            }
        }
    }

    /// Time of the selection over a frame of 22,500 atoms (a PE's share of 45,000 on 2x1x1, and
    /// one of 2x2x2 with halo atoms), exact and by ranges.
    /// `cargo test -p halo --release --lib select_timing -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing: run it in release"]
    fn select_timing() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let box_size = [7.7f32, 7.7, 7.7];
        for dims in [[2, 1, 1], [2, 2, 2]] {
            let grid = RankGrid::new(dims).unwrap();
            let geo = Decomposition::new(grid, box_size, 1.06).unwrap();
            let decomposed = grid.decomposed_dims();
            let n = 45_000 / grid.num_ranks() * 2;
            let wrapped: Vec<_> = (0..n)
                .map(|_| {
                    kernels_gpu::abi::Float3::new(
                        rng.random_range(0.0..box_size[0]),
                        rng.random_range(0.0..box_size[1]),
                        rng.random_range(0.0..box_size[2]),
                    )
                })
                .collect();
            // Home atoms (crossed nowhere), then a quarter received across the boundary along x.
            let crossed: Vec<u8> = (0..n).map(|k| u8::from(4 * k >= 3 * n)).collect();
            let frame = Frame { wrapped: &wrapped, crossed: &crossed, edge: box_size.map(f64::from) };
            let rc2 = send_range2(1.06);
            let time = |f: &mut dyn FnMut(&mut Vec<u32>)| {
                let mut map = Vec::with_capacity(n);
                let mut t: Vec<f64> = (0..200)
                    .map(|_| {
                        map.clear();
                        let t = std::time::Instant::now();
                        f(&mut map);
                        t.elapsed().as_secs_f64() * 1e6
                    })
                    .collect();
                t.sort_by(f64::total_cmp);
                (t[t.len() / 2], map.len())
            };
            for &d in &decomposed {
                let exact = time(&mut |m| select_for_pulse_into(&geo, &decomposed, 1, d, &frame, 0, rc2, m));
                let ranges = time(&mut |m| select_wrapped_into(&geo, &decomposed, 1, d, &frame, 0, rc2, m));
                println!("{dims:?} along {d}, {n} atoms: exact {:.1} us, by ranges {:.1} us ({} sent)", exact.0, ranges.0, ranges.1);
                assert_eq!(exact.1, ranges.1);
            }
        }
    }
}
