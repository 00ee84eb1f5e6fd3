//! What a rank's halo looks like, independent of where it came from (the MD decomposition, a
//! stencil grid, a test): per pulse, whom it sends to, what it sends, where the reply lands.

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
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
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

    /// Where local atom `local` sits in this layout: a home atom, or a slot of one pulse's receive
    /// range (so a wrong value can be named by the pulse that carried it and the rank that sent it).
    pub fn place_of(&self, local: usize) -> AtomPlace {
        let pulse = self.pulses.iter().position(|p| (p.atom_offset..p.atom_offset + p.recv_size).contains(&local));
        let received = pulse.map(|i| ReceivedAt { pulse: i, from: self.pulses[i].recv_rank, slot: local - self.pulses[i].atom_offset });
        AtomPlace { local, received }
    }
}

/// Where one local atom of a rank sits ([`RankHalo::place_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomPlace {
    /// Its local index.
    pub local: usize,
    /// The pulse that delivered it, or `None` for a home atom (or an index past the layout).
    pub received: Option<ReceivedAt>,
}

/// The pulse, sender and slot of a received atom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceivedAt {
    /// The pulse (execution order).
    pub pulse: usize,
    /// The rank that sent it.
    pub from: usize,
    /// Its place in the pulse's receive range (0: the first atom received).
    pub slot: usize,
}

impl std::fmt::Display for AtomPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.received {
            Some(r) => write!(f, "local atom {} (received in pulse {} from rank {}, slot {} of that pulse)", self.local, r.pulse, r.from, r.slot),
            None => write!(f, "local atom {} (a home atom)", self.local),
        }
    }
}

/// The first of `values` (index-map entries, global ids, atom types) at or above `bound`, with
/// its index: one branch-free pass for the largest (the common case finds none), and only then a
/// search for the first.
pub fn first_at_or_above(values: &[u32], bound: usize) -> Option<(usize, u32)> {
    if (values.iter().fold(0, |m, &v| m.max(v)) as usize) < bound {
        return None;
    }
    values.iter().copied().enumerate().find(|&(_, v)| v as usize >= bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_value_at_or_above_a_bound_is_found_with_its_index() {
        assert_eq!(first_at_or_above(&[3, 9, 1, 12, 9], 9), Some((1, 9)));
        assert_eq!(first_at_or_above(&[3, 8, 1], 9), None);
        assert_eq!(first_at_or_above(&[], 0), None);
        assert_eq!(first_at_or_above(&[0], 0), Some((0, 0)));
        assert_eq!(first_at_or_above(&[u32::MAX, 0], 5), Some((0, u32::MAX)));
    }
}
