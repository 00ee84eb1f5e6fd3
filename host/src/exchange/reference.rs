//! The exchange's effect computed on the CPU, for any set of [`RankHalo`]s.

use super::spec::RankHalo;
use kernels_gpu::abi::Float3;

/// Every rank's coordinates after the full coordinate halo: `home[r]` (length `home_atoms`)
/// followed by each pulse's received atoms, shifted where the pulse crosses the boundary.
/// Pulses run in order; within a pulse no rank reads what another writes (maps point below the
/// pulse's receive range), so ranks may be processed in any order.
pub fn coordinates(halos: &[RankHalo], home: &[Vec<Float3>]) -> Vec<Vec<Float3>> {
    let mut x: Vec<Vec<Float3>> = halos
        .iter()
        .zip(home)
        .map(|(h, hx)| {
            let mut v = hx[..h.home_atoms].to_vec();
            v.resize(h.total_atoms, Float3::default());
            v
        })
        .collect();
    let pulses = halos.first().map_or(0, |h| h.pulses.len());
    for p in 0..pulses {
        for r in 0..halos.len() {
            let spec = &halos[r].pulses[p];
            let packed = crate::reference::pack(&x[r], &spec.index_map, spec.shift);
            let dst = &mut x[spec.send_rank][spec.peer_atom_offset..spec.peer_atom_offset + packed.len()];
            dst.copy_from_slice(&packed);
        }
    }
    x
}

/// Every rank's forces after the force halo: last pulse first, each rank's forces on the atoms it
/// received in a pulse are added to (or stored into) the sender's atoms through the sender's map.
pub fn forces(halos: &[RankHalo], f: &[Vec<Float3>]) -> Vec<Vec<Float3>> {
    let mut f = f.to_vec();
    let pulses = halos.first().map_or(0, |h| h.pulses.len());
    for p in (0..pulses).rev() {
        for r in 0..halos.len() {
            let spec = &halos[r].pulses[p];
            let owner = spec.recv_rank;
            let halo = f[r][spec.atom_offset..spec.atom_offset + spec.recv_size].to_vec();
            let owner_spec = &halos[owner].pulses[p];
            if owner_spec.accumulate_forces {
                crate::reference::unpack_accumulate(&halo, &owner_spec.index_map, &mut f[owner]);
            } else {
                crate::reference::unpack_store(&halo, &owner_spec.index_map, &mut f[owner]);
            }
        }
    }
    f
}
