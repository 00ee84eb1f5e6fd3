//! What a rank's halo looks like, independent of where it came from (the MD decomposition, a
//! stencil grid, a test): per pulse, whom it sends to, what it sends, where the reply lands.

use crate::error::{HaloError, Result};
use kernels_gpu::abi::Float3;

/// One pulse of one rank's halo. Coordinates (the forward direction) go to `send_rank` and come
/// from `recv_rank`; forces (the reverse direction) travel the other way.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PulseSpec {
    /// Rank that receives this pulse's coordinates.
    pub send_rank: usize,
    /// Rank that sends this pulse's coordinates.
    pub recv_rank: usize,
    /// Local indices of the atoms sent (`send_size` = its length).
    pub index_map: Vec<u32>,
    /// Atoms received.
    pub recv_size: usize,
    /// Where the received atoms start in the local arrays.
    pub atom_offset: usize,
    /// `send_rank`'s `atom_offset` for this pulse (where the sent atoms land there).
    pub peer_atom_offset: usize,
    /// Periodic shift added to the packed coordinates, when the pulse crosses the boundary.
    #[serde(with = "shift_as_array")]
    pub shift: Option<Float3>,
    /// Received forces are added to (true) or replace (false) the mapped atoms' forces.
    pub accumulate_forces: bool,
}

/// `shift` as `null` or `[x, y, z]` (`Float3`, shared with the kernels, has no serde).
mod shift_as_array {
    use kernels_gpu::abi::Float3;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(shift: &Option<Float3>, s: S) -> Result<S::Ok, S::Error> {
        shift.map(|v| [v.x, v.y, v.z]).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Float3>, D::Error> {
        Ok(Option::<[f32; 3]>::deserialize(d)?.map(|[x, y, z]| Float3::new(x, y, z)))
    }
}

/// One rank's whole halo: its home atoms and pulses in execution order (dimension-major).
///
/// Two ranks in a ring, each sending its atoms 0 and 3 to the other (they land after its four
/// home atoms):
///
/// ```
/// use halo::exchange::{PulseSpec, RankHalo, reference, spec};
///
/// let halo = |peer| RankHalo {
///     home_atoms: 4,
///     total_atoms: 6,
///     pulses: vec![PulseSpec {
///         send_rank: peer,
///         recv_rank: peer,
///         index_map: vec![0, 3],
///         recv_size: 2,
///         atom_offset: 4,
///         peer_atom_offset: 4,
///         shift: None,
///         accumulate_forces: true,
///     }],
/// };
/// let halos = vec![halo(1), halo(0)];
/// spec::validate(&halos).unwrap();
/// // What the exchange must produce, computed on the CPU:
/// let x = reference::coordinates(&halos, &[vec![1.0f32, 2.0, 3.0, 4.0], vec![5.0, 6.0, 7.0, 8.0]]);
/// assert_eq!(x[0], vec![1.0, 2.0, 3.0, 4.0, 5.0, 8.0]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RankHalo {
    /// Atoms this rank owns; map entries below it are independent of earlier pulses.
    pub home_atoms: usize,
    /// Home atoms plus every received atom.
    pub total_atoms: usize,
    /// Pulses in execution order.
    pub pulses: Vec<PulseSpec>,
}

impl RankHalo {
    /// Largest number of atoms this rank sends in one pulse.
    pub fn max_send(&self) -> usize {
        self.pulses.iter().map(|p| p.index_map.len()).max().unwrap_or(0)
    }

    /// Largest number of atoms this rank receives in one pulse.
    pub fn max_recv(&self) -> usize {
        self.pulses.iter().map(|p| p.recv_size).max().unwrap_or(0)
    }
}

/// Checks that the ranks' halos fit together: equal pulse counts, matching sizes and offsets
/// between the two ends of every pulse, map entries in range, received ranges inside the arrays.
/// Every exchange checks this before it touches a GPU.
pub fn validate(halos: &[RankHalo]) -> Result<()> {
    let bad = |msg: String| Err(HaloError::InvalidInput(format!("inconsistent halo plan: {msg}")));
    let Some(first) = halos.first() else { return bad("no ranks".into()) };
    for (r, h) in halos.iter().enumerate() {
        if h.pulses.len() != first.pulses.len() {
            return bad(format!("rank {r} has {} pulses, rank 0 has {}", h.pulses.len(), first.pulses.len()));
        }
        if h.home_atoms > h.total_atoms {
            return bad(format!("rank {r} has more home atoms ({}) than atoms ({})", h.home_atoms, h.total_atoms));
        }
        for (p, pulse) in h.pulses.iter().enumerate() {
            let (s, rr) = (pulse.send_rank, pulse.recv_rank);
            if s >= halos.len() || rr >= halos.len() {
                return bad(format!("rank {r} pulse {p} names rank {} of {}", s.max(rr), halos.len()));
            }
            let peer = &halos[s].pulses[p];
            if peer.recv_rank != r {
                return bad(format!("rank {r} pulse {p} sends to {s}, which receives from {}", peer.recv_rank));
            }
            if peer.recv_size != pulse.index_map.len() {
                return bad(format!("rank {r} pulse {p} sends {} atoms, rank {s} expects {}", pulse.index_map.len(), peer.recv_size));
            }
            if peer.atom_offset != pulse.peer_atom_offset {
                return bad(format!(
                    "rank {r} pulse {p} writes at offset {} of rank {s}, whose pulse starts at {}",
                    pulse.peer_atom_offset, peer.atom_offset
                ));
            }
            if pulse.atom_offset + pulse.recv_size > h.total_atoms {
                return bad(format!("rank {r} pulse {p} receives past its {} atoms", h.total_atoms));
            }
            if let Some(&m) = pulse.index_map.iter().find(|&&m| m as usize >= h.total_atoms) {
                return bad(format!("rank {r} pulse {p} map entry {m} is out of range of its {} atoms", h.total_atoms));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(n: usize) -> Vec<RankHalo> {
        (0..n)
            .map(|r| RankHalo {
                home_atoms: 4,
                total_atoms: 6,
                pulses: vec![PulseSpec {
                    send_rank: (r + n - 1) % n,
                    recv_rank: (r + 1) % n,
                    index_map: vec![0, 3],
                    recv_size: 2,
                    atom_offset: 4,
                    peer_atom_offset: 4,
                    shift: None,
                    accumulate_forces: true,
                }],
            })
            .collect()
    }

    #[test]
    fn a_consistent_ring_passes() {
        validate(&ring(3)).unwrap();
    }

    #[test]
    fn mismatches_are_named() {
        let mut h = ring(3);
        h[1].pulses[0].recv_size = 3;
        h[1].total_atoms = 7;
        assert!(validate(&h).unwrap_err().to_string().contains("expects 3"));
        let mut h = ring(3);
        h[0].pulses[0].index_map[1] = 9;
        assert!(validate(&h).unwrap_err().to_string().contains("out of range"));
        let mut h = ring(3);
        h[2].pulses[0].peer_atom_offset = 5;
        assert!(validate(&h).unwrap_err().to_string().contains("offset 5"));
        assert!(validate(&[]).is_err());
    }
}
