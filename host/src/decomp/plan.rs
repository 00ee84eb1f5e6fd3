//! Building the halo plan: home atoms per rank, then every pulse of every decomposed dimension,
//! simulated on all ranks in lockstep exactly as the exchange will run it.

use super::grid::{Decomposition, wrap_position};
use super::{PlanError, RankGrid};
use crate::exchange::{PulseSpec, RankHalo};
use crate::system::MolecularSystem;
use crate::workers::Workers;
use kernels_gpu::abi::Float3;
use serde::{Deserialize, Serialize};

/// Relative slack on the squared cutoff when selecting atoms to send. It only ever adds atoms a
/// hair beyond the cutoff, so that rounding in the plan's arithmetic can never drop an atom that
/// the pair search (which uses differently ordered arithmetic) finds inside it.
pub const SEND_MARGIN: f64 = 1e-6;

/// The whole halo plan: one [`RankPlan`] per rank, all with the same pulses in the same order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HaloPlan {
    /// The rank grid.
    pub grid: RankGrid,
    /// Box edges (nm).
    pub box_size: [f32; 3],
    /// Interaction cutoff the halo covers (nm).
    pub cutoff: f32,
    /// Per-rank plans, indexed by rank.
    pub ranks: Vec<RankPlan>,
}

/// One rank's local atom layout and pulses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankPlan {
    /// This rank.
    pub rank: usize,
    /// Atoms whose wrapped position lies in this rank's cell; they come first locally, sorted by
    /// global id. Also the dependency offset: map entries at or above it were received earlier.
    pub home_atoms: usize,
    /// Home atoms plus every atom received in any pulse.
    pub total_atoms: usize,
    /// Global atom id of each local atom (`total_atoms` entries).
    pub global_ids: Vec<u32>,
    /// Pulses flattened dim-major (x pulses, then y, then z).
    pub pulses: Vec<PulsePlan>,
}

/// One pulse on one rank: where it sits in the decomposition, and what the exchange moves.
///
/// In `spec`, coordinates go to `send_rank` (one step down along `dim`) and come from `recv_rank`
/// (one step up); forces travel the other way; `index_map` is ascending; `shift` is the box row
/// along `dim` when this rank is first along `dim` (its atoms cross the periodic boundary on the
/// way down), else `None`; received forces are always accumulated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PulsePlan {
    /// Dimension (0 = x, 1 = y, 2 = z).
    pub dim: usize,
    /// Index of this pulse within its dimension.
    pub pulse_in_dim: usize,
    /// The pulse as the exchange consumes it.
    #[serde(flatten)]
    pub spec: PulseSpec,
}

impl PulsePlan {
    /// Atoms sent (coordinates) and received back (forces).
    pub fn send_size(&self) -> usize {
        self.spec.index_map.len()
    }

    /// The periodic shift along `dim` (zero when the pulse does not cross the boundary).
    pub fn shift_along_dim(&self) -> f32 {
        self.spec.shift.map_or(0.0, |s| [s.x, s.y, s.z][self.dim])
    }
}

/// A local atom while the plan is built: its global id and position in this rank's frame.
#[derive(Clone, Copy, Debug)]
struct Local {
    id: u32,
    pos: [f64; 3],
}

/// Working arrays of a plan build, kept by a caller that plans again and again so that their
/// allocations are reused (the plan does not depend on them).
#[derive(Debug, Default)]
pub struct PlanScratch {
    /// Owner rank of every atom.
    owner: Vec<u32>,
    /// Every rank's local atoms while the plan is built.
    local: Vec<Vec<Local>>,
}

/// Writes into `owner` the rank owning each atom: the cell of its wrapped position (only
/// decomposed dimensions have a cell index other than 0), in `parts` contiguous chunks on
/// `workers`. Errors on the first atom with a non-finite coordinate, whatever the chunking.
fn owners(positions: &[Float3], geo: &Decomposition, workers: &Workers, parts: usize, owner: &mut Vec<u32>) -> Result<(), PlanError> {
    let decomposed = geo.grid.decomposed_dims();
    let chunk = positions.len().div_ceil(parts).max(1);
    let own = |(c, (part, out)): (usize, (&[Float3], &mut [u32]))| -> Result<(), PlanError> {
        let first = c * chunk;
        for (k, (&p, o)) in part.iter().zip(out).enumerate() {
            if !(p.x.is_finite() && p.y.is_finite() && p.z.is_finite()) {
                return Err(PlanError::NonFinitePosition { atom: first + k, position: [p.x, p.y, p.z] });
            }
            let w = wrap_position(p, geo.box_size);
            let w = [w.x, w.y, w.z];
            let mut cell = [0usize; 3];
            for &d in &decomposed {
                cell[d] = geo.cell_index(d, f64::from(w[d]));
            }
            *o = geo.grid.rank_of(cell) as u32;
        }
        Ok(())
    };
    owner.clear();
    owner.resize(positions.len(), 0);
    let work: Vec<_> = positions.chunks(chunk).zip(owner.chunks_mut(chunk)).enumerate().collect();
    // The first chunk's error first: the error a single thread meets.
    workers.map(work, own).into_iter().collect()
}

impl HaloPlan {
    /// The plan as the exchange consumes it, one [`RankHalo`] per rank. Every received force is
    /// added (`accumulate_forces`): the MD step zeroes forces before computing them.
    pub fn rank_halos(&self) -> Vec<RankHalo> {
        self.ranks
            .iter()
            .map(|r| RankHalo { home_atoms: r.home_atoms, total_atoms: r.total_atoms, pulses: r.pulses.iter().map(|p| p.spec.clone()).collect() })
            .collect()
    }

    /// The plan for `system` on `grid` with `cutoff` (nm).
    pub fn build(system: &MolecularSystem, grid: RankGrid, cutoff: f32) -> Result<Self, PlanError> {
        Self::from_positions(&system.positions, system.box_size, grid, cutoff)
    }

    /// The plan for atoms at `positions` (wrapped into the box first) in a periodic box.
    ///
    /// An atom is sent in a pulse when its distance to the receiving rank's cell, over the
    /// dimensions communicated so far, is below the cutoff. Pulse 0 of a dimension scans the home
    /// atoms and everything received along earlier dimensions; pulse `p > 0` scans only what
    /// pulse `p - 1` received. So an atom `k` cells up reaches a rank after exactly `k` hops
    /// along that dimension, once, and only if the rank needs it.
    pub fn from_positions(positions: &[Float3], box_size: [f32; 3], grid: RankGrid, cutoff: f32) -> Result<Self, PlanError> {
        Self::from_positions_with(positions, box_size, grid, cutoff, &Workers::serial(), &mut PlanScratch::default())
    }

    /// [`Self::build`] on `workers`, reusing `scratch` (the same plan for any workers and scratch).
    pub fn build_with(system: &MolecularSystem, grid: RankGrid, cutoff: f32, workers: &Workers, scratch: &mut PlanScratch) -> Result<Self, PlanError> {
        Self::from_positions_with(&system.positions, system.box_size, grid, cutoff, workers, scratch)
    }

    /// [`Self::from_positions`] on `workers`: the atoms are shared out in chunks to find their
    /// owners, and the ranks to select what each pulse sends; `scratch`'s arrays are reused. The
    /// same plan for any number of workers and any scratch.
    pub fn from_positions_with(
        positions: &[Float3], box_size: [f32; 3], grid: RankGrid, cutoff: f32, workers: &Workers, scratch: &mut PlanScratch,
    ) -> Result<Self, PlanError> {
        let geo = Decomposition::new(grid, box_size, cutoff)?;
        if positions.len() > (u32::MAX / 2) as usize {
            return Err(PlanError::TooManyAtoms { atoms: positions.len() });
        }
        let nranks = grid.num_ranks();
        // Threads only pay for themselves with a few thousand atoms each.
        let parts = workers.threads().clamp(1, positions.len().div_ceil(4096).max(1));
        let wrapped = |p: Float3| {
            let w = wrap_position(p, box_size);
            [f64::from(w.x), f64::from(w.y), f64::from(w.z)]
        };
        // Home atoms: every atom's owner (in parallel chunks), then each rank's atoms in id order,
        // in one array per rank (the scratch's, else allocated once with room for a halo).
        let PlanScratch { owner, local } = scratch;
        owners(positions, &geo, workers, parts, owner)?;
        let mut counts = vec![0usize; nranks];
        for &o in owner.iter() {
            counts[o as usize] += 1;
        }
        local.resize_with(nranks, Vec::new);
        for (l, &n) in local.iter_mut().zip(&counts) {
            l.clear();
            l.reserve(n + n / 2);
        }
        for (id, (&p, &o)) in positions.iter().zip(owner.iter()).enumerate() {
            local[o as usize].push(Local { id: id as u32, pos: wrapped(p) });
        }
        let home: Vec<usize> = local.iter().map(Vec::len).collect();
        let mut pulses: Vec<Vec<PulsePlan>> = vec![Vec::new(); nranks];
        let decomposed = grid.decomposed_dims();
        let rc2 = f64::from(cutoff).powi(2) * (1.0 + SEND_MARGIN);

        for d in decomposed.iter().copied() {
            // Pulse 0 of this dimension scans everything present when the dimension starts.
            let dim_start: Vec<usize> = local.iter().map(Vec::len).collect();
            let mut prev: Vec<(usize, usize)> = vec![(0, 0); nranks];
            for p in 0..geo.pulses[d] {
                let offsets: Vec<usize> = local.iter().map(Vec::len).collect();
                let select = |s: usize| -> Vec<u32> {
                    let range = if p == 0 { 0..dim_start[s] } else { prev[s].0..prev[s].0 + prev[s].1 };
                    let c = grid.coords_of(s);
                    // The receiver's cell in this rank's frame: the same cell except one step down along d.
                    let mut lo = [0.0; 3];
                    let mut hi = [0.0; 3];
                    for e in 0..3 {
                        lo[e] = geo.lower(e, c[e]);
                        hi[e] = geo.upper(e, c[e]);
                    }
                    hi[d] = lo[d];
                    lo[d] -= geo.cell_width(d);
                    range
                        .filter(|&k| {
                            let x = local[s][k].pos;
                            let dist2: f64 = decomposed
                                .iter()
                                .map(|&e| {
                                    let excess = (lo[e] - x[e]).max(x[e] - hi[e]).max(0.0);
                                    excess * excess
                                })
                                .sum();
                            dist2 < rc2
                        })
                        .map(|k| k as u32)
                        .collect()
                };
                // Every rank's selection is independent: ranks in parallel on the workers.
                let maps: Vec<Vec<u32>> = workers.map((0..nranks).collect(), select);
                let mut received: Vec<Vec<Local>> = vec![Vec::new(); nranks];
                for (s, map) in maps.iter().enumerate() {
                    let to = grid.neighbour(s, d, -1);
                    let use_shift = grid.coords_of(s)[d] == 0;
                    let mut shift = [0.0f32; 3];
                    if use_shift {
                        shift[d] = box_size[d];
                    }
                    received[to] = map
                        .iter()
                        .map(|&k| {
                            let mut a = local[s][k as usize];
                            a.pos[d] += f64::from(shift[d]);
                            a
                        })
                        .collect();
                    pulses[s].push(PulsePlan {
                        dim: d,
                        pulse_in_dim: p,
                        spec: PulseSpec {
                            send_rank: to,
                            recv_rank: grid.neighbour(s, d, 1),
                            index_map: map.clone(),
                            recv_size: 0,
                            atom_offset: offsets[s],
                            peer_atom_offset: offsets[to],
                            shift: use_shift.then(|| Float3::new(shift[0], shift[1], shift[2])),
                            accumulate_forces: true,
                        },
                    });
                }
                for (r, atoms) in received.into_iter().enumerate() {
                    if let Some(last) = pulses[r].last_mut() {
                        last.spec.recv_size = atoms.len();
                    }
                    prev[r] = (offsets[r], atoms.len());
                    local[r].extend(atoms);
                }
            }
        }

        let ranks = local
            .iter()
            .zip(pulses)
            .enumerate()
            .map(|(rank, (atoms, pulses))| RankPlan {
                rank,
                home_atoms: home[rank],
                total_atoms: atoms.len(),
                global_ids: atoms.iter().map(|a| a.id).collect(),
                pulses,
            })
            .collect();
        Ok(Self { grid, box_size, cutoff, ranks })
    }

    /// The decomposition geometry this plan was built on.
    pub fn decomposition(&self) -> Result<Decomposition, PlanError> {
        Decomposition::new(self.grid, self.box_size, self.cutoff)
    }

    /// Pulses per rank (the same on every rank of a valid plan).
    pub fn num_pulses(&self) -> usize {
        self.ranks.first().map_or(0, |r| r.pulses.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(xs: &[f32]) -> Vec<Float3> {
        xs.iter().map(|&x| Float3::new(x, 0.5, 0.5)).collect()
    }

    #[test]
    fn one_rank_has_no_pulses() {
        let plan = HaloPlan::from_positions(&line(&[0.1, 2.0, 1.0]), [3.0; 3], RankGrid::new([1, 1, 1]).unwrap(), 1.0).unwrap();
        assert_eq!(plan.ranks.len(), 1);
        let r = &plan.ranks[0];
        assert_eq!((r.home_atoms, r.total_atoms, r.pulses.len()), (3, 3, 0));
        assert_eq!(r.global_ids, vec![0, 1, 2]);
    }

    #[test]
    fn two_pulses_forward_along_a_line() {
        // Three ranks along x, cells of 1 nm, cutoff 1.4 nm: two pulses.
        let xs = [0.2, 0.9, 1.1, 1.6, 2.3, 2.8];
        let plan = HaloPlan::from_positions(&line(&xs), [3.0; 3], RankGrid::new([3, 1, 1]).unwrap(), 1.4).unwrap();
        let r0 = &plan.ranks[0];
        assert_eq!(r0.global_ids[..r0.home_atoms], [0, 1]);
        // Pulse 0: rank 1 sends all its home atoms (cell narrower than the cutoff) down to rank 0.
        assert_eq!((r0.pulses[0].spec.recv_rank, r0.pulses[0].spec.recv_size, r0.pulses[0].spec.atom_offset), (1, 2, 2));
        // Pulse 1: rank 1 forwards the rank-2 atoms it got that lie within 1.4 nm of x = 1 (x < 2.4).
        assert_eq!(r0.pulses[1].spec.recv_size, 1);
        assert_eq!(r0.global_ids, vec![0, 1, 2, 3, 4]);
        // Rank 0 sends to rank 2 across the boundary, with the box added.
        let p0 = &r0.pulses[0].spec;
        assert_eq!((p0.send_rank, p0.shift), (2, Some(Float3::new(3.0, 0.0, 0.0))));
        assert_eq!(p0.peer_atom_offset, plan.ranks[2].pulses[0].spec.atom_offset);
        let r2 = &plan.ranks[2];
        // Rank 2 (cell [2,3)) gets atoms 0 and 1 (x+3 = 3.2, 3.9 < 4.4), then atom 2 (4.1) forwarded.
        assert_eq!(r2.global_ids, vec![4, 5, 0, 1, 2]);
        assert_eq!(plan.num_pulses(), 2);
    }

    #[test]
    fn plans_round_trip_through_json_with_the_shift_as_an_array() {
        let plan = HaloPlan::from_positions(&line(&[0.2, 0.9, 1.1, 1.6, 2.3, 2.8]), [3.0; 3], RankGrid::new([3, 1, 1]).unwrap(), 1.4).unwrap();
        let text = serde_json::to_string(&plan).unwrap();
        assert!(text.contains(r#""shift":[3.0,0.0,0.0]"#) && text.contains(r#""shift":null"#), "{text}");
        assert!(text.contains(r#""dim":0,"pulse_in_dim":0,"send_rank":2"#), "the pulse's fields stay flat: {text}");
        assert_eq!(serde_json::from_str::<HaloPlan>(&text).unwrap(), plan);
        assert_eq!(plan.rank_halos()[0].pulses[0], plan.ranks[0].pulses[0].spec);
    }

    #[test]
    fn corner_atoms_beyond_the_cutoff_are_not_sent() {
        // 2x2x1: an atom near the far corner of the neighbour cell is within the cutoff along x and
        // along y separately but not in distance, so the diagonal neighbour never gets it.
        let pos = vec![Float3::new(2.7, 2.7, 0.5)];
        let plan = HaloPlan::from_positions(&pos, [4.0; 3], RankGrid::new([2, 2, 1]).unwrap(), 0.9).unwrap();
        assert_eq!(plan.ranks[3].home_atoms, 1);
        assert_eq!(plan.ranks[0].total_atoms, 0);
        assert_eq!(plan.ranks[2].total_atoms, 1);
        assert_eq!(plan.ranks[1].total_atoms, 1);
    }

    #[test]
    fn threads_do_not_change_the_plan() {
        let sys = MolecularSystem::generate(20_000, 3).unwrap();
        for dims in [[1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [4, 1, 1], [3, 2, 1]] {
            let g = RankGrid::new(dims).unwrap();
            let one = HaloPlan::build(&sys, g, 1.2).unwrap();
            for t in [2, 3, 8] {
                let w = Workers::new(t).unwrap();
                assert_eq!(HaloPlan::build_with(&sys, g, 1.2, &w, &mut PlanScratch::default()).unwrap(), one, "{dims:?}, {t} threads");
            }
        }
        let mut pos = sys.positions.clone();
        pos[17_000].y = f32::NAN;
        pos[19_000].x = f32::INFINITY;
        let w = Workers::new(4).unwrap();
        let e = HaloPlan::from_positions_with(&pos, sys.box_size, RankGrid::new([2, 1, 1]).unwrap(), 1.2, &w, &mut PlanScratch::default()).unwrap_err();
        assert!(matches!(e, PlanError::NonFinitePosition { atom: 17_000, .. }), "{e}");
    }

    #[test]
    fn a_reused_scratch_gives_the_plan_of_a_fresh_one() {
        // Grids of more and fewer ranks, systems of more and fewer atoms, one after another
        // through one scratch (and an error in between), on one and on several workers.
        let big = MolecularSystem::generate(20_000, 3).unwrap();
        let small = MolecularSystem::generate(3_000, 4).unwrap();
        let mut bad = small.positions.clone();
        bad[5].z = f32::NAN;
        for w in [Workers::serial(), Workers::new(3).unwrap()] {
            let mut scratch = PlanScratch::default();
            for (sys, dims) in [(&big, [2, 2, 2]), (&small, [2, 1, 1]), (&big, [3, 1, 1]), (&small, [1, 1, 1]), (&big, [2, 2, 2])] {
                let g = RankGrid::new(dims).unwrap();
                let got = HaloPlan::build_with(sys, g, 1.2, &w, &mut scratch).unwrap();
                assert_eq!(got, HaloPlan::build(sys, g, 1.2).unwrap(), "{dims:?}");
                let e = HaloPlan::from_positions_with(&bad, small.box_size, g, 1.2, &w, &mut scratch).unwrap_err();
                assert!(matches!(e, PlanError::NonFinitePosition { atom: 5, .. }), "{e}");
            }
        }
    }

    #[test]
    fn bad_positions_are_errors() {
        let pos = vec![Float3::new(f32::NAN, 0.0, 0.0)];
        let e = HaloPlan::from_positions(&pos, [3.0; 3], RankGrid::new([1, 1, 1]).unwrap(), 1.0).unwrap_err();
        assert!(matches!(e, PlanError::NonFinitePosition { atom: 0, .. }));
    }
}
