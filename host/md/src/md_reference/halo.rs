//! The coordinate and force halo exchanges, simulated pulse by pulse on all ranks in lockstep.

use super::ReferenceError;
use crate::decomp::{HaloPlan, wrap_position};
use crate::system::MolecularSystem;
use kernels_gpu::abi::Float3;

/// What the exchanges move: `Float3` as the GPU does (f32 arithmetic), or `[f64; 3]` for
/// references that must not lose precision.
trait Vector: Copy + Default {
    fn from_f32(v: [f32; 3]) -> Self;
    fn plus(self, o: Self) -> Self;
}

impl Vector for Float3 {
    fn from_f32(v: [f32; 3]) -> Self {
        Float3::new(v[0], v[1], v[2])
    }
    fn plus(self, o: Self) -> Self {
        self + o
    }
}

impl Vector for [f64; 3] {
    fn from_f32(v: [f32; 3]) -> Self {
        v.map(f64::from)
    }
    fn plus(self, o: Self) -> Self {
        [self[0] + o[0], self[1] + o[1], self[2] + o[2]]
    }
}

/// Every rank's local coordinates after the full coordinate halo: home atoms (wrapped into the
/// box) then each pulse's arrivals, with the periodic shift added in `f32` exactly where the
/// kernels add it. Validates the plan against the system first.
pub fn exchange_coordinates(plan: &HaloPlan, system: &MolecularSystem) -> Result<Vec<Vec<Float3>>, ReferenceError> {
    exchange_x(plan, &system.positions)
}

/// [`exchange_coordinates`] in `f64` (the shift added in `f64`), for references that compare at
/// 1e-9.
pub fn exchange_coordinates_f64(plan: &HaloPlan, system: &MolecularSystem) -> Result<Vec<Vec<[f64; 3]>>, ReferenceError> {
    exchange_x(plan, &system.positions)
}

/// Every rank's forces after the full force halo: pulses in reverse order; in each, every rank
/// sends the forces of the atoms it received in that pulse back to `recv_rank`, which adds them,
/// in map order, to the atoms of its index map. Home entries then hold total forces; halo entries
/// keep what they had.
pub fn exchange_forces(plan: &HaloPlan, per_rank_forces: &[Vec<Float3>]) -> Result<Vec<Vec<Float3>>, ReferenceError> {
    exchange_f(plan, per_rank_forces)
}

/// [`exchange_forces`] in `f64`.
pub fn exchange_forces_f64(plan: &HaloPlan, per_rank_forces: &[Vec<[f64; 3]>]) -> Result<Vec<Vec<[f64; 3]>>, ReferenceError> {
    exchange_f(plan, per_rank_forces)
}

fn exchange_x<V: Vector>(plan: &HaloPlan, positions: &[Float3]) -> Result<Vec<Vec<V>>, ReferenceError> {
    plan.validate()?;
    plan.validate_atoms(positions.len())?;
    let mut x: Vec<Vec<V>> = plan
        .ranks
        .iter()
        .map(|r| {
            let mut v = vec![V::default(); r.total_atoms];
            for (slot, &id) in v.iter_mut().zip(&r.global_ids[..r.home_atoms]) {
                let w = wrap_position(positions[id as usize], plan.box_size);
                *slot = V::from_f32([w.x, w.y, w.z]);
            }
            v
        })
        .collect();
    for pulse in 0..plan.num_pulses() {
        // Pack on every rank first, then deliver: all ranks run a pulse at the same time.
        let packed: Vec<Vec<V>> = plan
            .ranks
            .iter()
            .map(|r| {
                let p = &r.pulses[pulse];
                let shift = p.spec.shift.map(|s| V::from_f32([s.x, s.y, s.z]));
                p.spec
                    .index_map
                    .iter()
                    .map(|&i| {
                        let v = x[r.rank][i as usize];
                        shift.map_or(v, |s| v.plus(s))
                    })
                    .collect()
            })
            .collect();
        for (r, buf) in plan.ranks.iter().zip(packed) {
            let to = r.pulses[pulse].spec.send_rank;
            let off = plan.ranks[to].pulses[pulse].spec.atom_offset;
            x[to][off..off + buf.len()].copy_from_slice(&buf);
        }
    }
    Ok(x)
}

fn exchange_f<V: Vector>(plan: &HaloPlan, forces: &[Vec<V>]) -> Result<Vec<Vec<V>>, ReferenceError> {
    plan.validate()?;
    if forces.len() != plan.ranks.len() {
        return Err(ReferenceError::RankCount { found: forces.len(), expected: plan.ranks.len() });
    }
    for (r, f) in plan.ranks.iter().zip(forces) {
        if f.len() != r.total_atoms {
            return Err(ReferenceError::Length { rank: r.rank, found: f.len(), expected: r.total_atoms });
        }
    }
    let mut f = forces.to_vec();
    for pulse in (0..plan.num_pulses()).rev() {
        let sent: Vec<Vec<V>> = plan
            .ranks
            .iter()
            .map(|r| {
                let p = &r.pulses[pulse];
                f[r.rank][p.spec.atom_offset..p.spec.atom_offset + p.spec.recv_size].to_vec()
            })
            .collect();
        for (r, buf) in plan.ranks.iter().zip(sent) {
            let to = r.pulses[pulse].spec.recv_rank;
            for (v, &i) in buf.iter().zip(&plan.ranks[to].pulses[pulse].spec.index_map) {
                let slot = &mut f[to][i as usize];
                *slot = slot.plus(*v);
            }
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decomp::RankGrid;

    #[test]
    fn coordinates_arrive_shifted_across_the_boundary() {
        let mut sys = MolecularSystem::generate(8, 0).unwrap();
        sys.box_size = [3.0; 3];
        sys.positions = vec![0.2f32, 0.9, 1.1, 1.6, 2.3, 2.8].into_iter().map(|x| Float3::new(x, 0.5, 0.5)).collect();
        let plan = HaloPlan::build(&sys, RankGrid::new([3, 1, 1]).unwrap(), 1.4).unwrap();
        let x = exchange_coordinates(&plan, &sys).unwrap();
        let xs: Vec<f32> = x[2].iter().map(|v| v.x).collect();
        assert_eq!(xs, vec![2.3, 2.8, 0.2 + 3.0, 0.9 + 3.0, 1.1 + 3.0]);
        let x64 = exchange_coordinates_f64(&plan, &sys).unwrap();
        assert!((x64[2][4][0] - 4.1).abs() < 1e-6);
    }

    #[test]
    fn forces_flow_back_to_their_home_atoms() {
        let mut sys = MolecularSystem::generate(8, 0).unwrap();
        sys.box_size = [3.0; 3];
        sys.positions = vec![0.2f32, 0.9, 1.1, 1.6, 2.3, 2.8].into_iter().map(|x| Float3::new(x, 0.5, 0.5)).collect();
        let plan = HaloPlan::build(&sys, RankGrid::new([3, 1, 1]).unwrap(), 1.4).unwrap();
        // A unit force on every local copy: each atom's home ends with 1 + (copies elsewhere).
        let ones: Vec<Vec<[f64; 3]>> = plan.ranks.iter().map(|r| vec![[1.0, 0.0, 0.0]; r.total_atoms]).collect();
        let f = exchange_forces_f64(&plan, &ones).unwrap();
        for r in &plan.ranks {
            for (k, &id) in r.global_ids[..r.home_atoms].iter().enumerate() {
                let copies = plan.ranks.iter().filter(|q| q.global_ids.contains(&id)).count();
                assert_eq!(f[r.rank][k][0], copies as f64, "atom {id}");
            }
        }
        assert!(matches!(exchange_forces_f64(&plan, &ones[..2]), Err(ReferenceError::RankCount { .. })));
    }
}
