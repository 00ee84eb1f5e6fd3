//! Random but well-formed halos on a periodic rank grid, shaped like GROMACS's: dimensions in
//! order x, y, z; pulse 0 of a dimension may send any atom present (home atoms and atoms received
//! in earlier dimensions), later pulses mostly forward what the previous pulse received; pulses
//! go to the lower neighbour and come from the upper one; crossing the boundary adds a shift.
//! Used by the GPU tests and benchmarks of the exchange itself, independent of the MD system.

use crate::desc::{PulseSpec, RankHalo};
use kernels_gpu::abi::Float3;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

/// Shape of a synthetic halo.
#[derive(Clone, Copy, Debug)]
pub struct SyntheticShape {
    /// Ranks along x, y, z.
    pub grid: [usize; 3],
    /// Pulses per decomposed dimension (dimensions with one rank have none).
    pub pulses_per_dim: usize,
    /// Home atoms of rank 0 (others get a few more, so sizes differ between ranks).
    pub home_atoms: usize,
    /// Fraction of candidate atoms each pulse sends.
    pub send_fraction: f64,
    /// Box length added by boundary-crossing pulses.
    pub box_len: f32,
}

/// Builds the halos of every rank of `shape`, deterministically from `seed`.
pub fn halos(shape: SyntheticShape, seed: u64) -> Vec<RankHalo> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let [nx, ny, nz] = shape.grid;
    let n = nx * ny * nz;
    let coord = |r: usize| [r % nx, (r / nx) % ny, r / (nx * ny)];
    let index = |c: [usize; 3]| c[0] + nx * (c[1] + ny * c[2]);
    let neighbour = |r: usize, d: usize, up: bool| {
        let mut c = coord(r);
        c[d] = if up { (c[d] + 1) % shape.grid[d] } else { (c[d] + shape.grid[d] - 1) % shape.grid[d] };
        index(c)
    };
    let mut out: Vec<RankHalo> = (0..n)
        .map(|r| {
            let home = shape.home_atoms + 3 * r;
            RankHalo { home_atoms: home, total_atoms: home, pulses: Vec::new() }
        })
        .collect();
    for d in (0..3).filter(|&d| shape.grid[d] > 1) {
        for p in 0..shape.pulses_per_dim {
            // Each rank picks what it sends in this pulse.
            let mut maps = Vec::with_capacity(n);
            for h in &out {
                let candidates: Vec<u32> = if p == 0 {
                    (0..h.total_atoms as u32).collect()
                } else {
                    let prev = h.pulses.last().expect("p > 0 has a previous pulse");
                    let forwarded = prev.atom_offset as u32..(prev.atom_offset + prev.recv_size) as u32;
                    // Mostly forwarded atoms, plus a few independent home atoms.
                    forwarded.chain(0..(h.home_atoms as u32).min(8)).collect()
                };
                let k = (candidates.len() as f64 * shape.send_fraction).round() as usize;
                let mut map: Vec<u32> = candidates.choose_multiple(&mut rng, k).copied().collect();
                if rng.random_bool(0.5) {
                    map.sort_unstable();
                }
                maps.push(map);
            }
            // Then everyone receives from its upper neighbour, appended after its atoms.
            let offsets: Vec<usize> = out.iter().map(|h| h.total_atoms).collect();
            for r in 0..n {
                let to = neighbour(r, d, false);
                let from = neighbour(r, d, true);
                let recv_size = maps[from].len();
                let mut shift = None;
                if coord(r)[d] == 0 {
                    let mut s = [0.0f32; 3];
                    s[d] = shape.box_len;
                    shift = Some(Float3::new(s[0], s[1], s[2]));
                }
                out[r].pulses.push(PulseSpec {
                    send_rank: to,
                    recv_rank: from,
                    index_map: maps[r].clone(),
                    recv_size,
                    atom_offset: offsets[r],
                    peer_atom_offset: offsets[to],
                    shift,
                    accumulate_forces: true,
                });
            }
            for (h, off) in out.iter_mut().zip(&offsets) {
                let recv = h.pulses.last().map_or(0, |p| p.recv_size);
                h.total_atoms = off + recv;
            }
        }
    }
    out
}

/// Two ranks and one pulse that goes one way only: rank 0 sends `sent` of its `home_atoms` atoms
/// (spread evenly over them, at most all of them) to rank 1, and rank 1's pulse back to rank 0 is
/// empty. The layout where an empty pulse must not be taken for a synchronisation
/// (`credits`).
pub fn one_way_pair(home_atoms: usize, sent: usize) -> Vec<RankHalo> {
    let sent = sent.min(home_atoms);
    let map: Vec<u32> = (0..sent).map(|i| (i * home_atoms / sent.max(1)) as u32).collect();
    let pulse = |send_rank, recv_rank, index_map: Vec<u32>, recv_size| PulseSpec {
        send_rank,
        recv_rank,
        index_map,
        recv_size,
        atom_offset: home_atoms,
        peer_atom_offset: home_atoms,
        shift: None,
        accumulate_forces: true,
    };
    vec![
        RankHalo { home_atoms, total_atoms: home_atoms, pulses: vec![pulse(1, 1, map, 0)] },
        RankHalo { home_atoms, total_atoms: home_atoms + sent, pulses: vec![pulse(0, 0, Vec::new(), sent)] },
    ]
}

/// Random values for the first `len` atoms of each rank, in a box-sized range.
pub fn random_values(halos: &[RankHalo], seed: u64, home_only: bool) -> Vec<Vec<Float3>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    halos
        .iter()
        .map(|h| {
            let len = if home_only { h.home_atoms } else { h.total_atoms };
            (0..len).map(|_| Float3::new(rng.random_range(-5.0..5.0), rng.random_range(-5.0..5.0), rng.random_range(-5.0..5.0))).collect()
        })
        .collect()
}

/// Small validated halos on `grid` with `pulses` pulses per dimension (40 home atoms, half of
/// the candidates sent), for the unit tests of the exchange's planning.
#[cfg(test)]
pub(crate) fn small_halos(grid: [usize; 3], pulses: usize) -> Vec<RankHalo> {
    let h = halos(SyntheticShape { grid, pulses_per_dim: pulses, home_atoms: 40, send_fraction: 0.5, box_len: 3.0 }, 9);
    super::spec::validate(&h).expect("synthetic halos are valid");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::spec::validate;

    #[test]
    fn synthetic_halos_are_consistent() {
        for grid in [[2, 1, 1], [4, 1, 1], [2, 2, 1], [2, 2, 2], [3, 2, 1]] {
            for pulses in 1..=3 {
                let shape = SyntheticShape { grid, pulses_per_dim: pulses, home_atoms: 100, send_fraction: 0.3, box_len: 7.0 };
                let h = halos(shape, 1);
                validate(&h).unwrap();
                let dims = grid.iter().filter(|&&g| g > 1).count();
                assert_eq!(h[0].pulses.len(), dims * pulses);
            }
        }
    }

    #[test]
    fn forwarded_atoms_reach_two_hops() {
        // 4 ranks in a ring, 2 pulses: rank 0 receives rank 1's atoms and, through rank 1, rank 2's.
        let shape = SyntheticShape { grid: [4, 1, 1], pulses_per_dim: 2, home_atoms: 10, send_fraction: 1.0, box_len: 1.0 };
        let h = halos(shape, 3);
        let home = random_values(&h, 4, true);
        let x = crate::exchange::reference::coordinates(&h, &home);
        // Pulse 0 sends everything, so rank 0's first received block is rank 1's home atoms in map order.
        let p0 = &h[1].pulses[0];
        for (i, &m) in p0.index_map.iter().enumerate() {
            assert_eq!(x[0][h[0].pulses[0].atom_offset + i], home[1][m as usize]);
        }
    }
}
