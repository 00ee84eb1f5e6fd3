//! The exchange's effect computed on the CPU, for any set of [`RankHalo`]s.

use crate::desc::RankHalo;
use kernels_gpu::abi::{Float3, HaloElement};

/// Every rank's coordinates after the full coordinate halo: `home[r]` (length `home_atoms`)
/// followed by each pulse's received atoms, shifted where the pulse crosses the boundary.
/// Pulses run in order; within a pulse no rank reads what another writes (maps point below the
/// pulse's receive range), so ranks may be processed in any order.
pub fn coordinates<T: HaloElement>(halos: &[RankHalo], home: &[Vec<T>]) -> Vec<Vec<T>> {
    let mut x: Vec<Vec<T>> = halos
        .iter()
        .zip(home)
        .map(|(h, hx)| {
            let mut v = hx[..h.home_atoms].to_vec();
            v.resize(h.total_atoms, T::default());
            v
        })
        .collect();
    let pulses = halos.first().map_or(0, |h| h.pulses.len());
    for p in 0..pulses {
        for r in 0..halos.len() {
            let spec = &halos[r].pulses[p];
            let packed: Vec<T> = spec
                .index_map
                .iter()
                .map(|&i| match spec.shift {
                    Some(s) => x[r][i as usize].shifted(s),
                    None => x[r][i as usize],
                })
                .collect();
            let dst = &mut x[spec.send_rank][spec.peer_atom_offset..spec.peer_atom_offset + packed.len()];
            dst.copy_from_slice(&packed);
        }
    }
    x
}

/// Every rank's forces after the force halo: last pulse first, each rank's forces on the atoms it
/// received in a pulse are added to (or stored into) the sender's atoms through the sender's map.
pub fn forces<T: HaloElement>(halos: &[RankHalo], f: &[Vec<T>]) -> Vec<Vec<T>> {
    let mut f = f.to_vec();
    let pulses = halos.first().map_or(0, |h| h.pulses.len());
    for p in (0..pulses).rev() {
        for r in 0..halos.len() {
            let spec = &halos[r].pulses[p];
            let owner = spec.recv_rank;
            let halo = f[r][spec.atom_offset..spec.atom_offset + spec.recv_size].to_vec();
            let owner_spec = &halos[owner].pulses[p];
            for (v, &i) in halo.iter().zip(&owner_spec.index_map) {
                let d = &mut f[owner][i as usize];
                *d = if owner_spec.accumulate_forces { d.add(*v) } else { *v };
            }
        }
    }
    f
}

/// How one rank's coordinates after the halo differ from the reference's
/// ([`coordinate_differences`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CoordinateDifferences {
    /// Atoms whose coordinates are not bit-identical to the reference's.
    pub atoms: usize,
    /// The first of them, with where it sits in the rank's halo (pulse and sender).
    pub first: Option<crate::desc::AtomPlace>,
    /// The largest absolute difference of a component (nm; infinite where one side is not a
    /// number; 0 when bit-exact).
    pub max_abs: f64,
}

impl std::fmt::Display for CoordinateDifferences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.first {
            None => write!(f, "coordinates bit-exact"),
            Some(first) => {
                write!(f, "{} atom(s) differ from the reference, the first is {first}; max abs coordinate error {:.3e} nm", self.atoms, self.max_abs)
            }
        }
    }
}

/// Compares one rank's coordinates after the halo (`got`, laid out as `halo`) with the reference
/// `want` bit by bit: how many atoms differ, the first (named by pulse and sender), and the
/// largest error. Only the common length is compared (callers check the lengths).
pub fn coordinate_differences(halo: &RankHalo, got: &[Float3], want: &[Float3]) -> CoordinateDifferences {
    let mut d = CoordinateDifferences::default();
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let Some(e) = atom_difference(*a, *b) else { continue };
        d.atoms += 1;
        d.first.get_or_insert_with(|| halo.place_of(i));
        d.max_abs = d.max_abs.max(e);
    }
    d
}

/// How far the coordinate `got` is from the reference `want`, compared bit for bit (the halo moves
/// bits): `None` when all three components are bit-identical, else the largest absolute difference
/// of a component whose bits differ (0 for a sign of zero; infinite where one side is not a number).
/// The one rule of [`coordinate_differences`] and the MD checks.
pub fn atom_difference(got: Float3, want: Float3) -> Option<f64> {
    let pairs = [(got.x, want.x), (got.y, want.y), (got.z, want.z)];
    let differing = pairs.into_iter().filter(|(u, v)| u.to_bits() != v.to_bits());
    differing.map(|(u, v)| (f64::from(u) - f64::from(v)).abs()).map(|e| if e.is_nan() { f64::INFINITY } else { e }).reduce(f64::max)
}
