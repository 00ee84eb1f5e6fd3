//! Checking a halo plan before anything trusts it: what the exchange kernels assume about sizes,
//! offsets and index maps, stated once and enforced with a reason per failure.

use super::{HaloPlan, PlanError, RankGrid};

impl HaloPlan {
    /// Checks the plan's structure:
    /// - one entry per rank, in rank order, each with the pulses the grid, box and cutoff imply,
    ///   in the same dim-major order;
    /// - send and receive ranks are the grid neighbours one step down and up, and they name each
    ///   other; the periodic shift is the box row exactly on the first rank along the dimension;
    /// - my send size equals my send rank's receive size, and my `peer_atom_offset` equals its
    ///   `atom_offset`;
    /// - received atoms follow the home atoms and each other without gaps, and the counts add up
    ///   to `total_atoms` and `global_ids.len()`;
    /// - pulse 0 of a dimension sends only atoms present before it (`< atom_offset`); pulse
    ///   `p > 0` sends only atoms received in pulse `p - 1`; no map names an atom twice;
    /// - identity: every halo copy is the atom that was sent, i.e. the sender's
    ///   `global_ids[index_map[i]]` equals the receiver's `global_ids[atom_offset + i]`
    ///   ([`PlanError::HaloIdentity`]). Without it, an index-map entry swapped for another
    ///   sendable atom, or a halo atom relabelled, gives a plan that is consistent but wrong.
    ///
    /// It needs every rank's ids: a redecomposition's plan on a process that drives only some
    /// ranks has none of the others' ([`super::RankPlan::global_ids`]) and fails the counts here.
    pub fn validate(&self) -> Result<(), PlanError> {
        // A deserialized grid skips `RankGrid::new`: zero or overflowing counts would divide by
        // zero or overflow below.
        RankGrid::new(self.grid.dims)?;
        let geo = self.decomposition()?;
        let layout = geo.pulse_layout();
        let grid = self.grid;
        if self.ranks.len() != grid.num_ranks() {
            return Err(PlanError::RankCount { found: self.ranks.len(), expected: grid.num_ranks(), grid });
        }
        for (position, r) in self.ranks.iter().enumerate() {
            if r.rank != position {
                return Err(PlanError::RankIndex { position, found: r.rank });
            }
            if r.pulses.len() != layout.len() {
                return Err(PlanError::PulseCount { rank: r.rank, found: r.pulses.len(), expected: layout.len() });
            }
        }
        for r in &self.ranks {
            let rank = r.rank;
            let coords = grid.coords_of(rank);
            let mut end = r.home_atoms;
            for (pulse, (p, &(dim, pid))) in r.pulses.iter().zip(&layout).enumerate() {
                if (p.dim, p.pulse_in_dim) != (dim, pid) {
                    return Err(PlanError::PulseOrder {
                        rank,
                        pulse,
                        found_dim: p.dim,
                        found_pulse: p.pulse_in_dim,
                        expected_dim: dim,
                        expected_pulse: pid,
                    });
                }
                for (role, found, expected) in
                    [("send", p.spec.send_rank, grid.neighbour(rank, dim, -1)), ("receive", p.spec.recv_rank, grid.neighbour(rank, dim, 1))]
                {
                    if found != expected {
                        return Err(PlanError::Neighbour { rank, pulse, role, found, expected });
                    }
                }
                let mut row = [0.0; 3];
                row[dim] = self.box_size[dim];
                let expected = (coords[dim] == 0).then_some(row);
                let found = p.spec.shift.map(|s| [s.x, s.y, s.z]);
                if found != expected {
                    return Err(PlanError::Shift { rank, pulse, shift: found, expected });
                }
                let peer = &self.ranks[p.spec.send_rank].pulses[pulse];
                if peer.spec.recv_rank != rank {
                    return Err(PlanError::NotMutual { rank, pulse, peer: p.spec.send_rank, peer_source: peer.spec.recv_rank });
                }
                if p.send_size() != peer.spec.recv_size {
                    return Err(PlanError::SizeMismatch {
                        rank,
                        pulse,
                        send_size: p.send_size(),
                        peer: p.spec.send_rank,
                        peer_recv_size: peer.spec.recv_size,
                    });
                }
                if p.spec.peer_atom_offset != peer.spec.atom_offset {
                    return Err(PlanError::PeerOffset {
                        rank,
                        pulse,
                        found: p.spec.peer_atom_offset,
                        peer: p.spec.send_rank,
                        expected: peer.spec.atom_offset,
                    });
                }
                if p.spec.atom_offset != end {
                    return Err(PlanError::Offset { rank, pulse, found: p.spec.atom_offset, expected: end });
                }
                // What this pulse may send: everything so far (pulse 0), or pulse p-1's arrivals.
                let (lo, hi) = if pid == 0 {
                    (0, p.spec.atom_offset)
                } else {
                    let before = &r.pulses[pulse - 1];
                    (before.spec.atom_offset, before.spec.atom_offset + before.spec.recv_size)
                };
                for (entry, &index) in p.spec.index_map.iter().enumerate() {
                    let i = index as usize;
                    if i < lo || i >= hi {
                        return Err(PlanError::IndexOutOfRange { rank, pulse, entry, index, lo, hi });
                    }
                }
                // Duplicates by sorting a copy, not by a bitmap of [lo, hi): a corrupted receive
                // size can make that range far larger than memory (found by tests/plan_fuzz.rs).
                let mut sorted = p.spec.index_map.clone();
                sorted.sort_unstable();
                if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
                    return Err(PlanError::DuplicateIndex { rank, pulse, index: w[0] });
                }
                end = end.checked_add(p.spec.recv_size).ok_or(PlanError::TooManyAtoms { atoms: usize::MAX })?;
            }
            if r.total_atoms != end {
                return Err(PlanError::AtomCount { rank, what: "total_atoms", found: r.total_atoms, expected: end });
            }
            if r.global_ids.len() != end {
                return Err(PlanError::AtomCount { rank, what: "global_ids.len()", found: r.global_ids.len(), expected: end });
            }
            if end > u32::MAX as usize {
                return Err(PlanError::TooManyAtoms { atoms: end });
            }
        }
        // Identity last: it indexes both ends of every pulse, which is only safe once every
        // rank's sizes and offsets are known to agree (the loop above checks one rank at a time).
        self.validate_identity()
    }

    /// The identity half of [`HaloPlan::validate`]: for every pulse, the atoms a rank's index map
    /// names are, by global id and in order, the atoms its send rank records at the pulse's
    /// `atom_offset`. Call only on a structurally valid plan; out-of-range slots are still
    /// reported as errors rather than panics.
    fn validate_identity(&self) -> Result<(), PlanError> {
        for r in &self.ranks {
            for (pulse, p) in r.pulses.iter().enumerate() {
                let peer = p.spec.send_rank;
                let Some(landing) = self.ranks.get(peer).and_then(|q| q.pulses.get(pulse)).map(|q| q.spec.atom_offset) else {
                    return Err(PlanError::PulseCount { rank: peer, found: 0, expected: pulse + 1 });
                };
                let received = &self.ranks[peer].global_ids;
                for (entry, &index) in p.spec.index_map.iter().enumerate() {
                    let slot = landing + entry;
                    let (Some(&sent_id), Some(&received_id)) = (r.global_ids.get(index as usize), received.get(slot)) else {
                        return Err(PlanError::AtomCount { rank: peer, what: "global_ids.len()", found: received.len(), expected: slot + 1 });
                    };
                    if sent_id != received_id {
                        return Err(PlanError::HaloIdentity { rank: r.rank, pulse, entry, index, sent_id, peer, slot, received_id });
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks the plan against a system of `num_atoms` atoms: every global id is in range, every
    /// atom is a home atom on exactly one rank, and no rank holds an atom twice. Call after
    /// [`HaloPlan::validate`].
    pub fn validate_atoms(&self, num_atoms: usize) -> Result<(), PlanError> {
        let mut home_count = vec![0usize; num_atoms];
        let mut last_seen = vec![usize::MAX; num_atoms];
        for r in &self.ranks {
            for (local, &id) in r.global_ids.iter().enumerate() {
                let a = id as usize;
                if a >= num_atoms {
                    return Err(PlanError::GlobalId { rank: r.rank, local, id, atoms: num_atoms });
                }
                if std::mem::replace(&mut last_seen[a], r.rank) == r.rank {
                    return Err(PlanError::DuplicateAtom { rank: r.rank, atom: id });
                }
                if local < r.home_atoms {
                    home_count[a] += 1;
                }
            }
        }
        match home_count.iter().position(|&c| c != 1) {
            Some(atom) => Err(PlanError::HomeCount { atom, count: home_count[atom] }),
            None => Ok(()),
        }
    }

    /// The largest local atom count over all ranks: size of every rank's coordinate and force
    /// arrays (symmetric allocations need the same size everywhere).
    pub fn max_atoms(&self) -> usize {
        self.ranks.iter().map(|r| r.total_atoms).max().unwrap_or(0)
    }

    /// The largest send or receive count of any pulse on any rank: size of each pulse's slot in
    /// the unified send and receive buffers.
    pub fn max_pulse_extent(&self) -> usize {
        self.ranks.iter().flat_map(|r| r.pulses.iter().map(|p| p.send_size().max(p.spec.recv_size))).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decomp::RankGrid;
    use crate::system::MolecularSystem;

    fn plan() -> HaloPlan {
        let sys = MolecularSystem::generate(1500, 3).unwrap();
        HaloPlan::build(&sys, RankGrid::new([3, 2, 1]).unwrap(), 1.0).unwrap()
    }

    #[test]
    fn built_plans_are_valid() {
        let p = plan();
        p.validate().unwrap();
        p.validate_atoms(1500).unwrap();
        assert!(p.max_atoms() >= p.ranks.iter().map(|r| r.total_atoms).max().unwrap());
        assert!(p.max_pulse_extent() > 0);
        assert!(matches!(p.validate_atoms(1499), Err(PlanError::GlobalId { .. })));
    }

    #[test]
    fn corruptions_are_named() {
        let mut p = plan();
        let limit = p.ranks[1].pulses[0].spec.atom_offset as u32;
        p.ranks[1].pulses[0].spec.index_map[0] = limit;
        assert!(matches!(p.validate(), Err(PlanError::IndexOutOfRange { rank: 1, pulse: 0, .. })));

        let mut p = plan();
        p.ranks[2].pulses[1].spec.recv_size += 1;
        assert!(matches!(p.validate(), Err(PlanError::SizeMismatch { .. } | PlanError::Offset { .. })), "{:?}", p.validate());

        let mut p = plan();
        p.ranks[0].pulses.pop();
        assert!(matches!(p.validate(), Err(PlanError::PulseCount { rank: 0, .. })));

        let mut p = plan();
        p.ranks[0].pulses[0].spec.peer_atom_offset += 1;
        assert!(matches!(p.validate(), Err(PlanError::PeerOffset { .. })));

        let mut p = plan();
        let m = &mut p.ranks[4].pulses[0].spec.index_map;
        m[1] = m[0];
        assert!(matches!(p.validate(), Err(PlanError::DuplicateIndex { .. })));

        let mut p = plan();
        p.ranks[3].global_ids.push(0);
        assert!(matches!(p.validate(), Err(PlanError::AtomCount { .. })));

        let mut p = plan();
        let shift = &mut p.ranks[5].pulses[0].spec.shift;
        *shift = if shift.is_some() { None } else { Some(kernels_gpu::abi::Float3::new(1.0, 0.0, 0.0)) };
        assert!(matches!(p.validate(), Err(PlanError::Shift { .. })));

        // A home atom swapped with a halo atom: the atom that arrived is no longer the one sent.
        let mut p = plan();
        let home = p.ranks[0].home_atoms;
        p.ranks[0].global_ids.swap(0, home);
        assert!(matches!(p.validate(), Err(PlanError::HaloIdentity { .. })), "{:?}", p.validate());
    }

    /// An index-map entry replaced by another sendable atom that the map does not name yet:
    /// in range, no repeat, sizes unchanged, so only the identity check sees it.
    #[test]
    fn a_map_entry_pointing_at_another_atom_is_caught() {
        let mut p = plan();
        // Pulse 1 (y, first pulse) scans home atoms and x arrivals but sends only some of them.
        let (rank, pulse) = (1, 2);
        let r = &mut p.ranks[rank];
        assert_eq!((r.pulses[pulse].dim, r.pulses[pulse].pulse_in_dim), (1, 0));
        let unmapped = (0..r.pulses[pulse].spec.atom_offset as u32).find(|i| !r.pulses[pulse].spec.index_map.contains(i)).unwrap();
        let sent_id = r.global_ids[unmapped as usize];
        r.pulses[pulse].spec.index_map[0] = unmapped;
        let e = p.validate().unwrap_err();
        let peer = p.ranks[rank].pulses[pulse].spec.send_rank;
        match e {
            PlanError::HaloIdentity { rank: 1, pulse: 2, entry: 0, index, sent_id: s, peer: q, received_id, .. } => {
                assert_eq!((index, s, q), (unmapped, sent_id, peer));
                assert_ne!(received_id, sent_id);
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains(&format!("sends atom {sent_id}")), "{e}");
    }

    /// A halo atom's global id replaced by the id of an atom the rank does not hold: the ids
    /// stay unique and in range (so `validate_atoms` is satisfied), only identity catches it.
    #[test]
    fn a_relabelled_halo_atom_is_caught() {
        let mut p = plan();
        let r = &p.ranks[2];
        let slot = r.home_atoms + 1;
        let other = (0..1500u32).find(|id| !r.global_ids.contains(id)).unwrap();
        let was = r.global_ids[slot];
        p.ranks[2].global_ids[slot] = other;
        match p.validate() {
            Err(PlanError::HaloIdentity { peer: 2, slot: s, sent_id, received_id, .. }) => {
                assert_eq!((s, sent_id, received_id), (slot, was, other));
            }
            other => panic!("{other:?}"),
        }
    }
}
