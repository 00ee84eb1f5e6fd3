//! The cross-rank check of the ranks' halos ([`validate`]). The halo description itself
//! ([`RankHalo`], [`PulseSpec`], [`AtomPlace`]) lives in [`crate::desc::halo`] and is re-exported here.

use crate::desc::halo::first_at_or_above;
pub use crate::desc::halo::{AtomPlace, PulseSpec, RankHalo, ReceivedAt};
use crate::error::{HaloError, Result};

/// Checks that the ranks' halos fit together and obey the rules the kernels rely on: equal pulse
/// counts, matching sizes and offsets between the two ends of every pulse, received ranges after
/// the home atoms and disjoint, forces accumulated, and every map entry of pulse `p` a home atom
/// or an atom received in a pulse before `p` (the kernels pack such entries only after those
/// pulses' signals; an atom of pulse `p` itself or later would be sent before it arrived).
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
            if pulse.recv_size > 0 && pulse.atom_offset < h.home_atoms {
                return bad(format!(
                    "rank {r} pulse {p} receives at offset {}, inside its {} home atoms: received atoms go after them",
                    pulse.atom_offset, h.home_atoms
                ));
            }
            if let Some((_, m)) = first_at_or_above(&pulse.index_map, h.total_atoms) {
                return bad(format!("rank {r} pulse {p} map entry {m} is out of range of its {} atoms", h.total_atoms));
            }
            if !pulse.accumulate_forces {
                return bad(format!(
                    "rank {r} pulse {p} has accumulate_forces = false: a stored force would race with other pulses' \
                     atomic adds into the same atom and with the local force kernels; zero the targets and accumulate instead"
                ));
            }
        }
        check_map_sources(r, h)?;
    }
    Ok(())
}

/// Every map entry of `h`'s pulse `p` must be a home atom or lie in the range a pulse `q < p`
/// receives; received ranges must not overlap.
fn check_map_sources(r: usize, h: &RankHalo) -> Result<()> {
    let bad = |msg: String| Err(HaloError::InvalidInput(format!("inconsistent halo plan: {msg}")));
    // (start, end, pulse) of every nonempty received range, by start.
    let mut ranges: Vec<(usize, usize, usize)> =
        h.pulses.iter().enumerate().filter(|(_, s)| s.recv_size > 0).map(|(q, s)| (s.atom_offset, s.atom_offset + s.recv_size, q)).collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let ((_, end_a, qa), (start_b, _, qb)) = (w[0], w[1]);
        if start_b < end_a {
            let (lo, hi) = (qa.min(qb), qa.max(qb));
            return bad(format!("rank {r} pulse {hi} receives at offset {start_b}, which overlaps pulse {lo}'s received atoms"));
        }
    }
    let arrival = |m: usize| -> Option<usize> {
        let i = ranges.partition_point(|&(start, _, _)| start <= m);
        i.checked_sub(1).map(|i| ranges[i]).filter(|&(_, end, _)| m < end).map(|(_, _, q)| q)
    };
    for (p, pulse) in h.pulses.iter().enumerate() {
        // A map of home atoms only (every first pulse, and every pulse of a 1-D grid) has nothing
        // to look up: one vectorised pass for its largest entry says so.
        if first_at_or_above(&pulse.index_map, h.home_atoms).is_none() {
            continue;
        }
        for (i, &m) in pulse.index_map.iter().enumerate() {
            let m = m as usize;
            if m < h.home_atoms {
                continue;
            }
            match arrival(m) {
                Some(q) if q < p => {}
                Some(q) => {
                    return bad(format!(
                        "rank {r} pulse {p} map entry {i} is atom {m}, which arrives in pulse {q}: a pulse may send only home \
                         atoms (below {}) or atoms received in earlier pulses",
                        h.home_atoms
                    ));
                }
                None => {
                    return bad(format!(
                        "rank {r} pulse {p} map entry {i} is atom {m}, which is neither a home atom (below {}) nor received by any pulse",
                        h.home_atoms
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels_gpu::abi::Float3;

    use crate::testing::ring_halos as ring;

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

    /// Two pulses on a ring of three: pulse 1 may forward what pulse 0 received (atoms 4 and 5).
    fn two_pulse_ring() -> Vec<RankHalo> {
        let mut h = ring(3);
        for rank in h.iter_mut() {
            let mut second = rank.pulses[0].clone();
            second.index_map = vec![1, 4];
            second.atom_offset = 6;
            second.peer_atom_offset = 6;
            rank.pulses.push(second);
            rank.total_atoms = 8;
        }
        h
    }

    #[test]
    fn forwarding_atoms_received_in_earlier_pulses_passes() {
        validate(&two_pulse_ring()).unwrap();
    }

    #[test]
    fn a_pulse_may_not_send_atoms_received_in_the_same_or_a_later_pulse() {
        // Atom 6 arrives in pulse 1 itself: the kernels would send what is there before it lands.
        let mut h = two_pulse_ring();
        h[2].pulses[1].index_map = vec![6, 0];
        let msg = validate(&h).unwrap_err().to_string();
        assert!(msg.contains("rank 2 pulse 1 map entry 0") && msg.contains("atom 6") && msg.contains("pulse 1"), "{msg}");
        // Atom 4 arrives in pulse 0, so pulse 0 may not send it.
        let mut h = two_pulse_ring();
        h[1].pulses[0].index_map = vec![0, 4];
        let msg = validate(&h).unwrap_err().to_string();
        assert!(msg.contains("rank 1 pulse 0 map entry 1") && msg.contains("atom 4"), "{msg}");
    }

    #[test]
    fn a_map_entry_that_no_pulse_fills_is_rejected() {
        // Atom 7 is inside the array but neither a home atom nor received by any pulse.
        let mut h = ring(3);
        for rank in &mut h {
            rank.total_atoms = 8;
        }
        h[0].pulses[0].index_map = vec![7, 0];
        let msg = validate(&h).unwrap_err().to_string();
        assert!(msg.contains("rank 0 pulse 0 map entry 0") && msg.contains("atom 7"), "{msg}");
    }

    #[test]
    fn receive_ranges_may_not_overlap_home_atoms_or_each_other() {
        let mut h = ring(3);
        for rank in &mut h {
            rank.pulses[0].atom_offset = 3;
            rank.pulses[0].peer_atom_offset = 3;
        }
        let msg = validate(&h).unwrap_err().to_string();
        assert!(msg.contains("rank 0 pulse 0") && msg.contains("home atoms"), "{msg}");
        let mut h = two_pulse_ring();
        for rank in &mut h {
            rank.pulses[1].atom_offset = 5;
            rank.pulses[1].peer_atom_offset = 5;
        }
        let msg = validate(&h).unwrap_err().to_string();
        assert!(msg.contains("rank 0 pulse 1") && msg.contains("overlaps pulse 0"), "{msg}");
    }

    #[test]
    fn storing_forces_instead_of_accumulating_is_rejected() {
        // A stored force would race with other pulses' atomic adds and the local force kernels.
        let mut h = ring(3);
        h[1].pulses[0].accumulate_forces = false;
        let msg = validate(&h).unwrap_err().to_string();
        assert!(msg.contains("rank 1 pulse 0") && msg.contains("accumulate_forces"), "{msg}");
    }

    #[test]
    fn places_name_the_pulse_the_sender_and_the_slot() {
        let halos = crate::exchange::synthetic::halos(
            crate::exchange::synthetic::SyntheticShape { grid: [2, 2, 1], pulses_per_dim: 1, home_atoms: 200, send_fraction: 0.35, box_len: 7.7 },
            3,
        );
        let h = &halos[3];
        assert_eq!(h.place_of(0), AtomPlace { local: 0, received: None });
        assert!(h.place_of(0).to_string().contains("a home atom"));
        for (i, p) in h.pulses.iter().enumerate().filter(|(_, p)| p.recv_size > 2) {
            let place = h.place_of(p.atom_offset + 2);
            assert_eq!(place.received, Some(ReceivedAt { pulse: i, from: p.recv_rank, slot: 2 }));
            assert!(place.to_string().contains(&format!("received in pulse {i} from rank {}", p.recv_rank)), "{place}");
        }
        // The reference comparison names the first differing atom by that place.
        let want: Vec<Float3> = (0..h.total_atoms).map(|i| Float3::new(i as f32, 0.5, -1.0)).collect();
        let mut got = want.clone();
        assert_eq!(crate::exchange::reference::coordinate_differences(h, &got, &want).atoms, 0);
        let k = h.pulses[1].atom_offset + 1;
        got[k].y = 2.5;
        got[k + 1].z = f32::NAN;
        let d = crate::exchange::reference::coordinate_differences(h, &got, &want);
        assert_eq!((d.atoms, d.first), (2, Some(h.place_of(k))));
        assert!(d.max_abs.is_infinite(), "a NaN is an infinite error, never a small one");
        got[k + 1] = want[k + 1];
        let d = crate::exchange::reference::coordinate_differences(h, &got, &want);
        assert_eq!(d.max_abs, 2.0);
        assert!(d.to_string().contains("received in pulse 1") && d.to_string().contains("2.000e0"), "{d}");
    }
}
